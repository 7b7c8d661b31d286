"""A scheduler killed while several jobs are in flight comes back and finishes all of them.

Two executors of one slot each, three clients submitting TPC-H queries at the same
moment, so jobs wait for slots; the scheduler kills itself (SIGKILL, a crash rule:
``mangonel.testing.crash``) at a moment of the run, and is started again on the
same state store, SQLite or etcd. The moments are those whose stored state once
had no test with real processes: jobs still queued behind others, jobs planned
but not yet launched, stages decided (adaptive execution) with their tasks about
to go out, a cancel written but not carried out, an executor draining. Every
client gets DuckDB's answer from the one job it submitted (the cancelled one
``JobCancelledError``).

``tests/unit/test_restore_every_step.py`` checks every state the store can hold
in the pure state machine; this proves the same of the real processes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query

from mangonel.client.cluster import LocalCluster
from mangonel.client.status import JobState
from mangonel.errors import JobCancelledError
from mangonel.scheduler.persist import read_snapshot
from mangonel.scheduler.state_views import JobState as StoredState
from mangonel.scheduler.store import open_store
from mangonel.testing.etcd import EtcdServer

pytestmark = pytest.mark.timeout(240)

QUERIES = (9, 3, 18)
"""One per client, submitted at once."""

# Where the scheduler dies, by name (see mangonel.testing.crash for the rule format).
MOMENTS: dict[str, dict[str, Any]] = {
    # The third job is durable; at most two have slots: the rest wait, queued.
    "jobs_queued": {"event": "JobSubmitted", "nth": 3},
    # The first tasks are decided and durable, none was sent.
    "before_first_launch": {"event": "*", "commands": "LaunchTask"},
    # Stages finished and the next ones decided (re-sized from the real sizes):
    # durable, their tasks not sent.
    "stages_decided": {"event": "TaskCompleted", "commands": "LaunchTask", "nth": 3},
    # One client's cancel is durable; its tasks were not told to stop.
    "cancel_written": {"event": "CancelRequested"},
    # An executor said it drains; durable, nothing carried out.
    "executor_draining": {"event": "ExecutorDraining"},
}


@pytest.fixture(scope="module")
def etcd(module_dir: Path) -> Iterator[EtcdServer]:
    with EtcdServer(module_dir / "etcd") as server:
        yield server


@pytest.fixture(params=["sqlite", "etcd"])
def busy(
    request: pytest.FixtureRequest, work_dir: Path, tpch_tables: dict[str, Path]
) -> Iterator[LocalCluster]:
    state = None
    if request.param == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd")
        state = server.url(f"/mangonel/{work_dir.name}/")
    with LocalCluster(
        executors=2,
        slots=1,
        work_dir=work_dir / "cluster",
        heartbeat_timeout=3.0,
        state=state,
        # Small splits: at SF 0.1 every table would be one task's worth, and
        # one-task stages run as one, with no stage boundary to crash at.
        scheduler_args=(
            "--crash-file",
            str(work_dir / "crash.json"),
            "--broadcast-bytes",
            "0",
            "--split-rows",
            "100000",
        ),
    ) as cluster:
        with cluster.connect() as session:
            for name, path in tpch_tables.items():
                session.register_parquet(name, str(path))
        yield cluster


def stored_states(cluster: LocalCluster) -> list[StoredState]:
    """The states of the unfinished jobs in the (stopped) scheduler's store."""
    store = open_store(cluster.state)
    try:
        snap = read_snapshot(store.load(), cluster.state)
    finally:
        store.close()
    assert not snap.broken
    return [j.progress.state for j in snap.jobs if j.progress is not None]


def cancel(cluster: LocalCluster, job: str) -> None:
    with cluster.connect() as session:
        session.cancel(job)


@pytest.mark.parametrize("moment", sorted(MOMENTS))
def test_a_scheduler_killed_with_jobs_in_flight_finishes_them_all_after_a_restart(
    busy: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection, moment: str
) -> None:
    crash = busy.work_dir.parent / "crash.json"
    crash.write_text(json.dumps([MOMENTS[moment]]))
    cancelled = 1 if moment == "cancel_written" else None  # the client whose job is cancelled
    outcomes: dict[int, Any] = {}
    jobs: dict[int, str] = {}
    submitted = threading.Semaphore(0)
    canceller: threading.Thread | None = None

    def client(i: int) -> None:
        with busy.connect() as session:
            try:
                jobs[i] = session.submit(tpch_query(QUERIES[i]))
                submitted.release()
                outcomes[i] = session.wait(jobs[i])
            except BaseException as exc:  # noqa: BLE001 - checked below
                outcomes[i] = exc
                submitted.release()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(QUERIES))]
    for t in threads:
        t.start()
    scheduler = busy.scheduler
    assert scheduler is not None
    if moment in ("cancel_written", "executor_draining"):
        for _ in QUERIES:
            assert submitted.acquire(timeout=30)
        if cancelled is not None:
            # The scheduler dies while it handles this call; the session asks
            # again once it is back (here, below), and the job is cancelled by then.
            canceller = threading.Thread(target=cancel, args=(busy, jobs[cancelled]))
            canceller.start()
        else:
            busy.executors[1].signal(signal.SIGTERM)  # drains: finishes its tasks, then exits
    try:
        code = scheduler.process.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the crash rule never fired; scheduler log:\n{scheduler.log_tail()}")
    assert code == -signal.SIGKILL, f"the scheduler exited with {code}, not by its crash rule"
    states = stored_states(busy)
    if moment == "jobs_queued":
        assert StoredState.QUEUED in states, states
    crash.write_text("[]")
    busy.restart_scheduler()
    if canceller is not None:
        canceller.join(60)
        assert not canceller.is_alive(), "the cancel never got an answer"
    for t in threads:
        t.join(150)
        assert not t.is_alive(), "a client still waits after the scheduler came back"
    for i, number in enumerate(QUERIES):
        got = outcomes[i]
        if i == cancelled:
            assert isinstance(got, JobCancelledError), got
            continue
        assert not isinstance(got, BaseException), f"q{number} failed: {got!r}"
        expected = duckdb_ref.sql(tpch_query(number)).to_arrow_table()
        order_by = TPCH_ORDER_BY[number]
        assert_same_result(got.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
    with busy.connect() as session:
        status = session.status()
        # Exactly one job per client: nothing was submitted twice.
        assert sorted(j.job_id for j in status.jobs) == sorted(jobs.values()), status.jobs
        ended = (JobState.SUCCEEDED, JobState.CANCELLED)
        assert all(j.state in ended for j in status.jobs), status.jobs
