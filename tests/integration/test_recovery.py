"""Lost executors never lose a query: one test per recovery mechanism, real processes.

Each test starts its own small ``TestCluster`` (faults change processes, so
clusters are not shared), hits it with a deterministic fault from the
executors' fault rules (``mangonel.testing.faults``) or a signal, and checks
the answer against single-process DuckDB plus what the scheduler says about
what happened (who was lost, why, what ran again).

The query is TPC-H q12 on SF 0.1 with hash joins only (``broadcast_bytes=0``, and
``orders`` in a random order of its rows: ``helpers.shuffled_orders``)::

    stage 1  scan orders, 1 task          ─┐ hash(orderkey), 4 partitions
    stage 2  scan lineitem, 5 tasks       ─┤
    stage 3  join + partial agg, 4 tasks  ◀┘ partition i of every map task
    stage 4  final agg, 4 tasks
    stage 5  sort, 1 task (the result)
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import (
    TPCH_ORDER_BY,
    assert_same_result,
    is_stopped,
    shuffled_orders,
    tpch_query,
    wait_until,
)

import mangonel
from mangonel.client.cluster import ExecutorHandle
from mangonel.client.session import Result, Session
from mangonel.client.status import ExecutorState, ExecutorStatus, JobState
from mangonel.testing.cluster import TestCluster

Q12 = tpch_query(12)
SCAN_LINEITEM = 2
JOIN = 3
pytestmark = pytest.mark.timeout(120)


# ----------------------------------------------------------------------- helpers


@pytest.fixture
def start(
    work_dir: Path, tpch_tables: dict[str, Path]
) -> Iterator[Callable[..., tuple[TestCluster, Session]]]:
    """Start a cluster with the TPC-H tables registered (stopped after the test)."""
    started: list[tuple[TestCluster, Session]] = []

    def make(**kwargs: Any) -> tuple[TestCluster, Session]:
        options: dict[str, Any] = {"executors": 2, "slots": 2, "partitions": 4}
        options.update(broadcast_bytes=0, heartbeat_timeout=2.0, log_level="debug")
        # Six lineitem scan tasks (one per row group at SF 0.1): the tests name tasks
        # by partition number, so the split size must not follow the planner's default.
        options.update(scheduler_args=("--split-rows", "100000"))
        options.update(kwargs)
        cluster = TestCluster(work_dir=work_dir / f"cluster{len(started)}", **options)
        cluster.start()
        session = cluster.connect()
        started.append((cluster, session))
        session.register_parquet("lineitem", str(tpch_tables["lineitem"]))
        orders = shuffled_orders(tpch_tables["orders"], cluster.work_dir)
        session.register_parquet("orders", str(orders))
        return cluster, session

    yield make
    for cluster, session in started:
        session.close()
        cluster.stop()


def check_q12(result: Result, reference: duckdb.DuckDBPyConnection) -> None:
    expected = reference.sql(Q12).to_arrow_table()
    assert_same_result(result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[12])


def status_of(session: Session, executor_id: str | None) -> ExecutorStatus:
    assert executor_id is not None
    entry = session.status().executor(executor_id)
    assert entry is not None, f"executor {executor_id} is not listed"
    return entry


def per_stage(result: Result) -> dict[int, tuple[int, int]]:
    """stage -> (tasks re-run, outputs recomputed)."""
    return {s.stage: (s.tasks_rerun, s.outputs_recomputed) for s in result.stages}


def shuffle_files(cluster: TestCluster) -> list[Path]:
    """Every file under the executors' work root but the owners' lock files."""
    return [p for p in cluster.work_files() if p.name != "owner.lock"]


# ------------------------------------------------------------------- liveness


def test_killed_mid_query_is_lost_at_once_and_its_outputs_made_again(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    cluster, session = start()
    victim = cluster.executors[1]
    victim_id = victim.id
    # After it reported a lineitem scan: it dies holding an output counted on.
    cluster.set_faults(1, [{"action": "kill", "when": "task_finished", "stage": SCAN_LINEITEM}])
    died: list[float] = []
    watcher = threading.Thread(
        target=lambda: (victim.process.wait(60), died.append(time.monotonic()))
    )
    watcher.start()
    result = session.sql(Q12)
    watcher.join(60)
    check_q12(result, duckdb_ref)
    assert victim.process.returncode == -signal.SIGKILL
    wait_until(lambda: status_of(session, victim_id).state is ExecutorState.LOST, "lost")
    lost = status_of(session, victim_id)
    assert lost.reason == "connection lost", lost
    # Its broken stream gives it away: the scheduler's time of loss (wall clock)
    # is within 2 s of the process's death (seen here on the monotonic clock).
    death_wall = time.time() - (time.monotonic() - died[0])
    assert lost.since - death_wall < 2.0, f"lost {lost.since - death_wall:.2f} s after death"
    assert result.outputs_recomputed >= 1, result.stages
    assert cluster.executors[0].alive()


def test_frozen_executor_is_lost_by_heartbeat_timeout_and_thawed_comes_back_as_new(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    cluster, session = start(heartbeat_timeout=2.0)
    frozen = cluster.executors[1]
    old_id = frozen.id
    cluster.set_faults(1, [{"action": "freeze", "when": "task_started"}])  # its first task
    started = time.monotonic()
    result = session.sql(Q12)
    check_q12(result, duckdb_ref)
    # Finished while it was still stopped: nobody waited for it beyond the timeout.
    assert is_stopped(frozen.pid)
    assert time.monotonic() - started < 2.0 + 10.0
    lost = status_of(session, old_id)
    assert (lost.state, lost.reason) == (ExecutorState.LOST, "heartbeat timeout"), lost
    assert "no heartbeat for" in lost.detail
    assert result.tasks_rerun >= 1, result.stages

    cluster.thaw_executor(1)
    wait_until(
        lambda: any(e.pid == frozen.pid for e in session.status().alive_executors()),
        "the thawed executor registered again",
    )
    again = next(e for e in session.status().alive_executors() if e.pid == frozen.pid)
    assert again.id != old_id, "a lost executor must come back under a new id"
    assert status_of(session, old_id).state is ExecutorState.LOST
    # Nothing of its first life is kept: that life's directory is gone.
    assert old_id is not None
    wait_until(lambda: not (cluster.executor_root / old_id).exists(), "the old life's files went")
    healthy = session.sql(Q12)
    check_q12(healthy, duckdb_ref)
    assert healthy.tasks_rerun == healthy.outputs_recomputed == 0


def test_busy_executor_is_never_lost(
    start: Callable[..., tuple[TestCluster, Session]],
) -> None:
    cluster, session = start(executors=1, heartbeat_timeout=1.5)
    only = cluster.executors[0].id
    # Both slots in one long DuckDB join each (three join keys: ~4e10 rows per
    # task), far longer than the timeout.
    job = session.submit(
        "SELECT count(*) AS n FROM lineitem a JOIN lineitem b ON a.l_returnflag = b.l_returnflag"
    )
    wait_until(lambda: status_of(session, only).running_tasks == 2, "both slots are busy")
    busy_since = time.monotonic()
    while time.monotonic() - busy_since < 3.0:
        entry = status_of(session, only)
        # Twice the timeout with both slots busy, and its heartbeats kept coming.
        assert entry.state is ExecutorState.ALIVE, entry
        time.sleep(0.1)
    assert status_of(session, only).running_tasks == 2, "the tasks ended: nothing was tested"
    # Cancelling the job cancels its running tasks: the slots free up.
    assert session.cancel(job)
    with pytest.raises(mangonel.JobCancelledError):
        session.wait(job)
    wait_until(lambda: status_of(session, only).running_tasks == 0, "the tasks stopped")
    assert session.sql("SELECT count(*) AS n FROM orders").num_rows == 1


# --------------------------------------------------------------- shuffle files


@pytest.mark.parametrize("action", ["corrupt", "delete"])
def test_a_bad_shuffle_file_recomputes_exactly_that_map_output(
    action: str,
    start: Callable[..., tuple[TestCluster, Session]],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    # One executor: the rule fires once per process, so the recomputed output
    # cannot be hit again wherever it runs.
    cluster, session = start(executors=1)
    rule = {"action": action, "stage": SCAN_LINEITEM, "map_partition": 0, "partition": 0}
    cluster.set_faults(0, [rule])
    result = session.sql(Q12)
    check_q12(result, duckdb_ref)
    # Only join task 0 reads partition 0 of map output 0: one reader re-run,
    # one output made again, and no executor lost over a bad file.
    assert per_stage(result) == {1: (0, 0), 2: (0, 1), 3: (1, 0), 4: (0, 0), 5: (0, 0)}
    executors = session.status().executors
    assert [e.state for e in executors] == [ExecutorState.ALIVE]


# ---------------------------------------------------------------- task failures


def test_a_failed_task_is_retried(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    cluster, session = start()
    cluster.set_faults_all([{"action": "fail", "stage": SCAN_LINEITEM, "partition": 3}])
    result = session.sql(Q12)
    check_q12(result, duckdb_ref)
    assert per_stage(result)[SCAN_LINEITEM] == (1, 0)
    assert result.tasks_rerun == 1 and result.outputs_recomputed == 0


def test_a_task_failing_every_attempt_fails_the_job_saying_where_and_why(
    start: Callable[..., tuple[TestCluster, Session]],
) -> None:
    cluster, session = start(max_task_attempts=2)
    cluster.set_faults_all(
        [
            {"action": "fail", "stage": SCAN_LINEITEM, "partition": 1, "attempt": 0},
            {"action": "fail", "stage": SCAN_LINEITEM, "partition": 1, "attempt": 1},
        ]
    )
    with pytest.raises(mangonel.JobFailedError) as failure:
        session.sql(Q12)
    message = str(failure.value)
    assert "/s2/p1 failed 2 attempts (the limit is 2)" in message, message
    assert "injected fault: fail stage 2 partition 1 attempt 1" in message, message
    ran_on = [e.id for e in session.status().executors if e.id and e.id in message]
    assert ran_on, f"the message names no executor: {message}"
    (job,) = session.status().jobs
    assert job.state is JobState.FAILED and job.error == message


# ------------------------------------------------------------ no executor left


def test_all_executors_lost_fails_the_job_after_the_grace(
    start: Callable[..., tuple[TestCluster, Session]],
) -> None:
    grace = 3.0
    cluster, session = start(no_executor_grace=grace, heartbeat_timeout=2.0)
    cluster.set_faults_all([{"action": "kill", "when": "task_started"}])
    submitted = time.monotonic()
    with pytest.raises(mangonel.JobFailedError, match="no executor was alive") as failure:
        session.sql(Q12)
    took = time.monotonic() - submitted
    assert "Start an executor" in str(failure.value)
    assert grace - 0.5 <= took <= grace + 2.0 + 3.0, f"failed after {took:.1f} s"
    assert not session.status().alive_executors()


def test_all_executors_lost_then_one_added_within_the_grace(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    cluster, session = start(no_executor_grace=30.0)
    old = list(cluster.executors)
    # Each dies right after reporting its first task: outputs it held are lost.
    cluster.set_faults_all([{"action": "kill", "when": "task_finished"}])
    job = session.submit(Q12)
    for handle in old:
        handle.process.wait(30)
    wait_until(lambda: not session.status().alive_executors(), "no executor is alive")
    newcomer = cluster.add_executor()
    result = session.wait(job)
    check_q12(result, duckdb_ref)
    assert [e.pid for e in session.status().alive_executors()] == [newcomer.pid]
    assert result.outputs_recomputed >= 1, result.stages


# ------------------------------------------------------------------------ drain


def test_sigterm_drains_an_executor_mid_query(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    cluster, session = start(drain_timeout=30.0, heartbeat_timeout=5.0)
    leaving: ExecutorHandle = cluster.executors[1]
    leaving_id = leaving.id
    # Stop it at the start of its first task, send SIGTERM there, let it go on:
    # the signal lands while it runs a task of the query.
    cluster.set_faults(1, [{"action": "freeze", "when": "task_started"}])

    def terminate_when_stopped() -> None:
        wait_until(lambda: is_stopped(leaving.pid), "the executor reached its first task")
        leaving.signal(signal.SIGTERM)
        leaving.signal(signal.SIGCONT)

    terminator = threading.Thread(target=terminate_when_stopped)
    terminator.start()
    result = session.sql(Q12)
    terminator.join(30)
    check_q12(result, duckdb_ref)
    assert cluster.wait_for_exit(1, timeout=20) == 0, leaving.log_tail()
    gone = status_of(session, leaving_id)
    assert (gone.state, gone.reason) == (ExecutorState.LOST, "drained"), gone
    # Graceful: it finished its task and served its output until it was read,
    # so nothing ran again.
    assert result.tasks_rerun == result.outputs_recomputed == 0, result.stages
    assert "draining executor" in leaving.log_tail(20_000)


# ---------------------------------------------------------------------- cleanup


def test_disk_use_returns_to_baseline_after_queries_and_a_dead_executor(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    cluster, session = start(cleanup_interval=0.5)
    # Each executor warms up on a thread at start over a tiny file of its own,
    # deleted when done (``runner.warm_up``): the baseline is taken after that.
    wait_until(
        lambda: all("warmed up in" in e.log_tail(20_000) for e in cluster.executors),
        "the executors warmed up",
    )
    assert shuffle_files(cluster) == []
    for _ in range(2):
        check_q12(session.sql(Q12), duckdb_ref)
    # Intermediate files go when the job ends, the result once the client read it.
    wait_until(lambda: shuffle_files(cluster) == [], "every shuffle file was deleted")

    victim = cluster.executors[1]
    cluster.set_faults(1, [{"action": "kill", "when": "task_finished", "stage": SCAN_LINEITEM}])
    check_q12(session.sql(Q12), duckdb_ref)
    victim.process.wait(30)
    # The dead one left its files; the survivor's sweep finds its lock free and
    # deletes its directories (files first: wait for the directories to go too).
    survivor = cluster.executors[0].id

    def dirs() -> list[str]:
        return sorted(p.name for p in cluster.executor_root.iterdir())

    wait_until(lambda: shuffle_files(cluster) == [], "the dead executor's files were deleted")
    wait_until(lambda: len(dirs()) == 2, "only the survivor's life and spill directories were left")
    assert survivor in dirs(), dirs()  # its life and its spill directory
    table = session.sql("SELECT count(*) AS n FROM orders").to_arrow()
    assert table.column("n").to_pylist() == [150_000]
    wait_until(lambda: shuffle_files(cluster) == [], "the last result was released")
