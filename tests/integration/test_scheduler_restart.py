"""The scheduler survives its own crash: kill -9 at deterministic points, restart, right answer.

One cluster (2 executors, SQLite state store) for the module. Each test makes
the scheduler kill itself (SIGKILL, no cleanup) at a chosen point of a TPC-H
query with a crash rule (``mangonel.testing.crash``), starts it again on the
same port and state file, and checks that the client, which only called
``session.sql``, gets the answer single-process DuckDB gives, from the same
job: the client reconnected and watched it again, the executors reattached with
the outputs they held, and what was lost was run again.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query

from mangonel.client import retry
from mangonel.client.cluster import LocalCluster
from mangonel.client.session import Result, Session
from mangonel.client.status import ExecutorState, JobState
from mangonel.errors import InternalError, JobFailedError
from mangonel.scheduler.persist import read_snapshot
from mangonel.scheduler.state_stages import Done
from mangonel.scheduler.store.sqlite import SqliteStateStore

pytestmark = pytest.mark.timeout(180)

# Where the scheduler dies, by name (see mangonel.testing.crash for the rule format).
CRASH_POINTS: dict[str, dict[str, Any]] = {
    # The job is planned and durable; no task was sent.
    "after_planning": {"event": "JobSubmitted"},
    # The second task of the job has reported: stages are part done.
    "mid_stage": {"event": "TaskCompleted", "nth": 2},
    # The final stage's tasks were sent to the executors and run.
    "final_stage_running": {
        "event": "*",
        "commands": "LaunchTask",
        "stage": "final",
        "point": "executed",
    },
    # The job succeeded and that is durable, but no client heard of it yet.
    "finished_unread": {"event": "TaskCompleted", "commands": "JobSucceeded"},
}
QUERIES = (3, 9, 18)


def _crash_cluster(
    directory: Path, tpch_tables: dict[str, Path], secure: bool = False
) -> Iterator[LocalCluster]:
    crash_file = directory / "crash.json"
    with LocalCluster(
        executors=2,
        slots=2,
        partitions=4,
        work_dir=directory / "cluster",
        heartbeat_timeout=3.0,
        scheduler_args=("--crash-file", str(crash_file), "--broadcast-bytes", "0"),
        secure=secure,
        # Secured: executors of their own hosts, so shuffles cross over Flight.
        executor_args_for=(lambda i: ["--host-id", f"restart-host-{i}"]) if secure else None,
    ) as c:
        with c.connect() as session:
            for name, path in tpch_tables.items():
                session.register_parquet(name, str(path))
        yield c


@pytest.fixture(scope="module")
def cluster(module_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[LocalCluster]:
    yield from _crash_cluster(module_dir, tpch_tables)


@pytest.fixture(scope="module")
def secure_cluster(module_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[LocalCluster]:
    """The same cluster with TLS on every channel and signed tickets."""
    yield from _crash_cluster(module_dir / "secure", tpch_tables, secure=True)


def crash_file(cluster: LocalCluster) -> Path:
    return cluster.work_dir.parent / "crash.json"


def run_through_crash(
    cluster: LocalCluster, session: Session, sql: str, rule: dict[str, Any]
) -> tuple[Result, float]:
    """Run ``sql`` while the scheduler dies at ``rule``; restart it; the result and down time."""
    crash_file(cluster).write_text(json.dumps([rule]))
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = session.sql(sql)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            outcome["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    scheduler = cluster.scheduler
    assert scheduler is not None
    try:
        code = scheduler.process.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the crash rule {rule} never fired; scheduler log:\n{scheduler.log_tail()}")
    assert code == -signal.SIGKILL, f"the scheduler exited with {code}, not by its crash rule"
    assert "crash rule" in scheduler.log_tail(), scheduler.log_tail()
    crash_file(cluster).write_text("[]")
    down = time.monotonic()
    cluster.restart_scheduler()
    down_s = time.monotonic() - down
    runner.join(120)
    assert not runner.is_alive(), "the query did not finish after the scheduler came back"
    if "error" in outcome:
        raise AssertionError(f"the query failed across the restart: {outcome['error']!r}")
    return outcome["result"], down_s


def wait_for_reattach(cluster: LocalCluster, session: Session, timeout: float = 15.0) -> None:
    expected = {h.id for h in cluster.executors if h.alive()}
    deadline = time.monotonic() + timeout
    while True:
        status = session.status()
        alive = {e.id for e in status.executors if e.state is ExecutorState.ALIVE}
        if alive == expected:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"alive {alive}, expected {expected}: {status.executors}")
        time.sleep(0.05)


def check(result: Result, number: int, reference: duckdb.DuckDBPyConnection) -> None:
    expected = reference.sql(tpch_query(number)).to_arrow_table()
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)


@pytest.mark.parametrize("point", sorted(CRASH_POINTS))
@pytest.mark.parametrize("number", QUERIES)
def test_scheduler_killed_and_restarted_mid_query(
    cluster: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection, point: str, number: int
) -> None:
    with cluster.connect() as session:
        before = {j.job_id for j in session.status().jobs}
        result, _ = run_through_crash(cluster, session, tpch_query(number), CRASH_POINTS[point])
        check(result, number, duckdb_ref)
        # The same job went on: the client did not submit the query again.
        status = session.status()
        new_jobs = [j for j in status.jobs if j.job_id not in before]
        assert [j.job_id for j in new_jobs] == [result.job_id], new_jobs
        assert new_jobs[0].state is JobState.SUCCEEDED
        # Both executors come back under their ids (reattached, not new lives).
        wait_for_reattach(cluster, session)
        if point == "final_stage_running":
            # The final stage's attempts died with the scheduler's view of them.
            assert result.tasks_rerun >= 1, result.stages
        if point == "finished_unread":
            # Nothing ran again: the result was read where it was left.
            assert result.tasks_rerun == 0 and result.outputs_recomputed == 0, result.stages


@pytest.mark.parametrize("point", ["mid_stage", "finished_unread"])
def test_secured_scheduler_killed_and_restarted_mid_query(
    secure_cluster: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection, point: str
) -> None:
    """With security on: executors reattach over mutual TLS, re-run tasks get fresh
    shuffle tickets, and the restarted scheduler signs the result for the session
    that submitted it (its key came back with the job's request id from the store)."""
    number = 3
    with secure_cluster.connect() as session:
        result, _ = run_through_crash(
            secure_cluster, session, tpch_query(number), CRASH_POINTS[point]
        )
        check(result, number, duckdb_ref)
        wait_for_reattach(secure_cluster, session)
    if point == "finished_unread":
        assert result.tasks_rerun == 0 and result.outputs_recomputed == 0, result.stages
    for path in secure_cluster.log_dir.glob("executor-*.log"):
        assert "refused a Flight ticket" not in path.read_text(errors="replace"), path


def new_jobs(session: Session, before: set[str]) -> list[str]:
    return [j.job_id for j in session.status().jobs if j.job_id not in before]


def first_query_across_an_outage(
    cluster: LocalCluster,
    duckdb_ref: duckdb.DuckDBPyConnection,
    stop: Callable[[], None],
    bring_back: Callable[[threading.Thread, dict[str, Any]], None],
) -> list[str]:
    """A session that never reached a scheduler sends its first query once ``stop``
    took the scheduler away; once the session says that it waits, ``bring_back``
    (given the query's thread and outcome) brings it back. The query must run,
    once, distributed, with DuckDB's answer. Returns what the session told."""
    number = 3
    with cluster.connect() as session:
        before = {j.job_id for j in session.status().jobs}
    stop()
    told: list[str] = []
    outcome: dict[str, Any] = {}
    with Session(cluster.address, security=cluster.client_security, on_wait=told.append) as fresh:

        def run() -> None:
            try:
                outcome["result"] = fresh.sql(tpch_query(number))
            except BaseException as exc:  # noqa: BLE001 - reported below
                outcome["error"] = exc

        runner = threading.Thread(target=run)
        runner.start()
        deadline = time.monotonic() + 10
        while not told and runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert told, f"the client did not say it waits: {outcome}"
        bring_back(runner, outcome)
        runner.join(120)
    assert not runner.is_alive(), "the query did not finish after the scheduler came back"
    assert "error" not in outcome, f"the query failed: {outcome['error']!r}"
    result: Result = outcome["result"]
    check(result, number, duckdb_ref)
    assert len(result.stages) > 1, result.stages  # it ran distributed
    with cluster.connect() as session:
        assert new_jobs(session, before) == [result.job_id]
        wait_for_reattach(cluster, session)
    return told


def test_a_query_sent_while_the_scheduler_is_down_waits_for_it_and_runs_once(
    cluster: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """A session that never reached a scheduler, whose query is sent while none
    listens: it says that it waits (connection refused), tries again with growing
    pauses, and once the scheduler is back the query runs, once."""

    def bring_back(runner: threading.Thread, outcome: dict[str, Any]) -> None:
        time.sleep(1.0)  # a few more refused tries: the scheduler comes back later
        cluster.restart_scheduler()

    told = first_query_across_an_outage(cluster, duckdb_ref, cluster.kill_scheduler, bring_back)
    assert told == [
        f"waiting up to 30 s for the scheduler at {cluster.address} (connection refused)"
    ]


def test_a_first_query_to_a_frozen_scheduler_waits_through_its_kill_and_restart(
    cluster: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """A session whose first call meets a frozen scheduler (it takes connections
    and sends nothing) waits for it and says why; killed with that connection in
    its backlog (reset), then restarted, it runs the query, once. Before, the
    session took the frozen handshake, then the reset gRPC repeats until its
    backoff ends, for a setup error and gave up in a fraction of a second."""
    scheduler = cluster.scheduler
    assert scheduler is not None

    def bring_back(runner: threading.Thread, outcome: dict[str, Any]) -> None:
        time.sleep(2 * retry.SETUP_ERROR_S)  # past any give-up on failures in a row
        assert runner.is_alive(), f"the client gave up on a frozen scheduler: {outcome}"
        scheduler.signal(signal.SIGKILL)
        scheduler.process.wait(10)
        cluster.restart_scheduler()

    told = first_query_across_an_outage(
        cluster, duckdb_ref, lambda: cluster.kill_scheduler(sig=signal.SIGSTOP), bring_back
    )
    assert told == [
        f"waiting up to 30 s for the scheduler at {cluster.address} "
        "(it takes connections but does not answer)"
    ]


def test_a_first_submission_lost_to_a_crash_is_sent_again_and_runs_once(
    cluster: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """The scheduler dies having stored the job but before answering the submission,
    the session's first call: the session waits for it (the call failed, then
    connections are refused) and submits again with the same request id, which
    the restarted scheduler read back from its store: the stored job, not another."""
    number = 18
    with cluster.connect() as session:
        before = {j.job_id for j in session.status().jobs}
    with Session(cluster.address, security=cluster.client_security) as fresh:
        result, _ = run_through_crash(
            cluster, fresh, tpch_query(number), CRASH_POINTS["after_planning"]
        )
    check(result, number, duckdb_ref)
    with cluster.connect() as session:
        assert new_jobs(session, before) == [result.job_id]
        wait_for_reattach(cluster, session)


def holders_of_final_inputs(cluster: LocalCluster) -> set[str]:
    """Executors that hold, per the stopped scheduler's store, outputs its final stages read."""
    store = SqliteStateStore(cluster.state.removeprefix("sqlite://"))
    try:
        snap = read_snapshot(store.load(), cluster.state)
    finally:
        store.close()
    holders: set[str] = set()
    for job in snap.jobs:
        if job.progress is None:
            continue
        for upstream in job.plan.plan.final.upstream:
            for task in job.progress.stages[upstream].tasks:
                if isinstance(task.state, Done):
                    holders.add(task.state.executor)
    return holders


def test_outputs_of_an_executor_that_died_while_the_scheduler_was_down_are_made_again(
    cluster: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """An executor (and its disk) lost while the scheduler is down never reattaches:
    the outputs it held are recomputed, and it is lost (when a reader fails to
    reach it, or after the heartbeat timeout)."""
    with cluster.connect() as session:
        crash_file(cluster).write_text(json.dumps([CRASH_POINTS["final_stage_running"]]))
        outcome: dict[str, Any] = {}
        runner = threading.Thread(
            target=lambda: outcome.setdefault("result", session.sql(tpch_query(9)))
        )
        runner.start()
        assert cluster.scheduler is not None
        assert cluster.scheduler.process.wait(60) == -signal.SIGKILL
        # The victim: an executor holding input of the final stage, as the store says.
        holders = holders_of_final_inputs(cluster)
        index = next(i for i, h in enumerate(cluster.executors) if h.id in holders)
        victim_id = cluster.executors[index].id
        cluster.kill_executor(index)
        # On one host its files would still be read by path: take them away too,
        # as a lost machine would.
        shutil.rmtree(cluster.executor_root / str(victim_id))
        crash_file(cluster).write_text("[]")
        cluster.restart_scheduler()
        runner.join(120)
        result = outcome["result"]
        check(result, 9, duckdb_ref)
        assert result.outputs_recomputed >= 1, result.stages
        lost = session.status().executor(victim_id or "")
        assert lost is not None and lost.state is ExecutorState.LOST, lost
        assert lost.reason in ("heartbeat timeout", "fetch failures"), lost
        cluster.add_executor()  # the module's other tests expect two


def test_tables_and_finished_jobs_survive_a_restart(cluster: LocalCluster) -> None:
    with cluster.connect() as session:
        tables = {t.name: t.rows for t in session.tables()}
        jobs = {j.job_id: j.state for j in session.status().jobs}
        cluster.kill_scheduler()
        cluster.restart_scheduler()
        assert {t.name: t.rows for t in session.tables()} == tables
        after = {j.job_id: j.state for j in session.status().jobs}
        assert after == jobs


def run_scheduler_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mangonel", "scheduler", "--port", "0", "--web-port", "-1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_corrupt_state_file_stops_the_scheduler_at_start_with_a_clear_error(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state.db"
    state.write_bytes(b"not a database" * 100)
    done = run_scheduler_cli("--state", f"sqlite://{state}")
    assert done.returncode != 0
    assert "is not a readable SQLite database" in done.stderr, done.stderr
    assert "move it aside" in done.stderr
    assert "listening" not in done.stdout


def test_a_state_file_in_use_by_another_scheduler_is_refused(cluster: LocalCluster) -> None:
    done = run_scheduler_cli("--state", cluster.state)
    assert done.returncode != 0
    assert "is in use by" in done.stderr, done.stderr


def test_an_unreachable_etcd_stops_the_scheduler_at_start_with_a_clear_error() -> None:
    """It waits --state-wait for etcd (saying so once), then gives up, saying why."""
    started = time.monotonic()
    done = run_scheduler_cli("--state", "etcd://127.0.0.1:1", "--state-wait", "2")
    assert done.returncode != 0
    assert time.monotonic() - started >= 2
    assert done.stderr.count("waiting up to 2 s for the state store: ") == 1, done.stderr
    assert "127.0.0.1:1" in done.stderr and "etcd" in done.stderr, done.stderr
    assert "waited 2 s for it (--state-wait)" in done.stderr, done.stderr
    assert "listening" not in done.stdout


def test_a_job_record_that_cannot_be_restored_fails_that_job_and_the_rest_is_served(
    cluster: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """A damaged record (here: a job's head that is not JSON) never keeps the scheduler
    from starting: that job fails with an error that says why, and its client hears
    it; the scheduler serves every other job and the next query."""
    with cluster.connect() as session:
        crash_file(cluster).write_text(json.dumps([CRASH_POINTS["mid_stage"]]))
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = session.sql(tpch_query(9))
            except BaseException as exc:  # noqa: BLE001 - checked below
                outcome["error"] = exc

        runner = threading.Thread(target=run)
        runner.start()
        assert cluster.scheduler is not None
        assert cluster.scheduler.process.wait(60) == -signal.SIGKILL
        store = SqliteStateStore(cluster.state.removeprefix("sqlite://"))
        try:
            assert store.acquire("test", timeout_s=10)
            heads = [k for k in store.load() if k.endswith("/progress")]
            assert len(heads) == 1, heads
            store.commit({heads[0]: '{"id": "damaged'})
        finally:
            store.close()
        crash_file(cluster).write_text("[]")
        cluster.restart_scheduler()
        runner.join(60)
        assert not runner.is_alive()
        error = outcome.get("error")
        assert isinstance(error, JobFailedError) and isinstance(error, InternalError), outcome
        assert "could not restore this job" in str(error), error
        assert "submit the query again" in str(error), error
        check(session.sql(tpch_query(3)), 3, duckdb_ref)
        wait_for_reattach(cluster, session)
