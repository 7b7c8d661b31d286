"""A write statement meets a full disk or a failing state store; nothing half-written shows.

One cluster (2 executors of 2 slots, TPC-H SF 0.1, scans of 100 000 rows) whose
write root and SQLite state store each lie on a small tmpfs the test mounts
(``mount`` needs root: without it the tests fail, they do not skip).

* The write root fills up while the writing tasks write: the statement fails at
  once with an error that names the location and its file system, every staged
  file goes, no manifest appears, the executors stay healthy, and the next
  statements (a write to the same disk, a query) are served.
* The state store fails in the middle of the commit (the scheduler is frozen by a
  crash rule right after it wrote the commit's intent; the test fills the SQLite
  store's tmpfs, or stops etcd, then lets it go on): the scheduler stops, as it
  must once its store cannot follow its memory. Started again once the store is
  back, it finishes the commit: the client's ``session.sql`` gets DuckDB's count
  and the location holds the rows once. (The etcd case starts a cluster of its own.)
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from helpers import assert_same_result, is_stopped, wait_until

from mangonel.client.cluster import LocalCluster
from mangonel.client.session import Result
from mangonel.errors import JobFailedError, WriteTargetFullError
from mangonel.output import INTENT, MANIFEST, STAGING
from mangonel.testing.cluster import TestCluster
from mangonel.testing.limits import SmallDisk

pytestmark = pytest.mark.timeout(240)

BIG = "SELECT * FROM lineitem WHERE l_orderkey % 2 = 0"
"""300 000 rows of every column, written by six tasks: about 12 MB of Parquet."""
QUERY = (
    "SELECT l_orderkey, l_linenumber, l_extendedprice, l_comment FROM lineitem "
    "WHERE l_orderkey % 8 = 0"
)
"""75 000 rows: about 3 MB of Parquet, six writing tasks."""

CHECK = "SELECT count(*) AS n, sum(l_extendedprice) AS s, min(l_comment) AS c FROM "
"""What the readers of a replaced or dropped table ask (the table's name follows)."""

WRITE_DISK = 2 << 20
STATE_DISK = 16 << 20


def files_under(root: Path) -> list[str]:
    return sorted(os.path.join(r, f) for r, _, names in os.walk(root) for f in names)


@pytest.fixture(scope="module")
def disks(module_dir: Path) -> Iterator[tuple[SmallDisk, SmallDisk]]:
    """The write root's disk and the state store's (``mount``: fails without root)."""
    out = SmallDisk(str(module_dir / "write-disk"), WRITE_DISK)
    try:
        state = SmallDisk(str(module_dir / "state-disk"), STATE_DISK)
        try:
            yield out, state
        finally:
            state.unmount()
    finally:
        out.unmount()


@pytest.fixture(scope="module")
def cluster(
    module_dir: Path, disks: tuple[SmallDisk, SmallDisk], tpch_tables: dict[str, Path]
) -> Iterator[TestCluster]:
    out, state = Path(disks[0].path), Path(disks[1].path)
    with TestCluster(
        executors=2,
        slots=2,
        partitions=4,
        work_dir=module_dir / "cluster",
        heartbeat_timeout=3.0,
        state=f"sqlite://{state / 'state.db'}",
        scheduler_args=(
            "--crash-file",
            str(module_dir / "crash.json"),
            "--split-rows",
            "100000",
            "--write-root",
            str(out),
            "--write-root",
            str(module_dir / "big-out"),
            "--warehouse",
            str(module_dir / "warehouse"),
        ),
    ) as c:
        with c.connect() as session:
            session.register_parquet("lineitem", str(tpch_tables["lineitem"]))
            session.register_parquet("nation", str(tpch_tables["nation"]))
        yield c


def delays(cluster: TestCluster) -> int:
    """How many tasks an injected delay held so far, in every executor's log."""
    return sum(e.log_tail(1 << 20).count("injected fault: delay") for e in cluster.executors)


def held_reader(cluster: TestCluster, sql: str) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``sql`` in a thread of its own, its scan task held 8 s before it reads
    (planned, its files named in its plan); return once it is held: the thread, and
    where its ``result`` (or ``error``) lands."""
    held = delays(cluster)  # a test before held a task too
    cluster.set_faults_all([{"action": "delay", "seconds": 8, "stage": 1, "partition": 0}])
    outcome: dict[str, Any] = {}

    def read() -> None:
        with cluster.connect() as reader:
            try:
                outcome["result"] = reader.sql(sql).to_arrow()
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                outcome["error"] = exc

    runner = threading.Thread(target=read)
    runner.start()
    wait_until(lambda: delays(cluster) > held, "the reader's scan task is held before it reads", 60)
    cluster.set_faults_all([])
    return runner, outcome


def old_rows_then_gone(
    runner: threading.Thread, outcome: dict[str, Any], old_files: list[str], old: pa.Table
) -> None:
    """The held reader ends with the ``old`` rows; then its files are deleted."""
    runner.join(90)
    assert not runner.is_alive()
    assert "error" not in outcome, f"the reader failed: {outcome['error']!r}"
    assert_same_result(outcome["result"], old, ordered=False)
    wait_until(
        lambda: not any(os.path.exists(f) for f in old_files),
        "the files it read are deleted once it is done",
        30,
    )


def read_back(target: Path) -> pa.Table:
    """The rows the location's manifest names, and nothing else lying there."""
    doc = json.loads((target / MANIFEST).read_text())
    files = [str(target / f) for f in doc["files"]]
    assert files_under(target) == sorted([*files, str(target / MANIFEST)])
    return duckdb.connect().sql(f"SELECT * FROM read_parquet({files!r})").to_arrow_table()


def test_a_write_root_that_fills_up_fails_the_statement_and_leaves_nothing(
    cluster: TestCluster,
    disks: tuple[SmallDisk, SmallDisk],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    out = Path(disks[0].path)
    target = out / "big"
    with cluster.connect() as session:
        with pytest.raises(WriteTargetFullError) as failed:
            session.sql(f"COPY ({BIG}) TO '{target}' (FORMAT parquet)")
        message = str(failed.value)
        assert isinstance(failed.value, JobFailedError)
        assert str(target) in message and f"mounted at {out}" in message, message
        assert "free space on that file system" in message, message
        # The fault landed mid-write: DuckDB's writer met the full disk in an executor.
        logs = "".join(e.log_tail(1 << 20) for e in cluster.executors)
        assert "No space left on device" in logs
        # Nothing visible, nothing staged left (cancelled attempts remove theirs as
        # they stop), the disk's space back.
        wait_until(lambda: not files_under(out), "every staged file is removed", 30)
        assert not (target / MANIFEST).exists()
        # The executors blamed the target, not their own disks: both stay healthy.
        executors = session.status().alive_executors()
        assert len(executors) == 2 and not any(e.unhealthy for e in executors), executors

        # The cluster keeps serving: a write that fits, to the same disk, and a query.
        small = out / "nation"
        result = session.sql(f"COPY (SELECT * FROM nation) TO '{small}' (FORMAT parquet)")
        assert result.to_arrow()["Count"].to_pylist() == [25]
        expected = duckdb_ref.sql("SELECT * FROM nation").to_arrow_table()
        assert_same_result(read_back(small), expected, ordered=False)
        check = f"SELECT count(*) AS n, sum(l_extendedprice) AS s FROM ({BIG})"
        assert_same_result(
            session.sql(check).to_arrow(), duckdb_ref.sql(check).to_arrow_table(), ordered=False
        )


def test_a_write_root_that_fills_up_during_the_commit_fails_it_and_leaves_nothing(
    cluster: TestCluster,
    disks: tuple[SmallDisk, SmallDisk],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    out = disks[0]
    target = Path(out.path) / "nation_commit"
    crash = cluster.work_dir.parent / "crash.json"
    crash.write_text(
        json.dumps([{"event": "WriteCommitted", "point": "commit-intent", "action": "freeze"}])
    )
    outcome: dict[str, Any] = {}
    session = cluster.connect()

    def run() -> None:
        try:
            outcome["result"] = session.sql(f"COPY nation TO '{target}' (FORMAT parquet)")
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    scheduler = cluster.scheduler
    assert scheduler is not None
    try:
        wait_until(lambda: is_stopped(scheduler.pid), "the scheduler freezes mid-commit", 90)
        jobs = os.listdir(target / STAGING)  # confirmed: the intent written, nothing moved
        assert len(jobs) == 1 and (target / STAGING / jobs[0] / INTENT).exists(), jobs
        crash.write_text("[]")
        out.fill()  # the moves need no room; the manifest does
    finally:
        crash.write_text("[]")
        os.kill(scheduler.pid, signal.SIGCONT)
    runner.join(60)
    assert not runner.is_alive()
    session.close()
    error = outcome.get("error")
    assert isinstance(error, WriteTargetFullError) and isinstance(error, JobFailedError), outcome
    assert f"could not be committed to {target}" in str(error), error
    assert "free space on that file system" in str(error), error
    assert "No space left on device" in str(error), error
    # The files the commit had moved are removed again, from its intent; no manifest.
    wait_until(
        lambda: files_under(target) == [],
        "the moved and staged files are removed",
        30,
    )
    out.free_up()
    with cluster.connect() as again:  # space back: the same statement now commits
        result = again.sql(f"COPY nation TO '{target}' (FORMAT parquet)")
    assert result.to_arrow()["Count"].to_pylist() == [25]
    expected = duckdb_ref.sql("SELECT * FROM nation").to_arrow_table()
    assert_same_result(read_back(target), expected, ordered=False)


def commit_through_a_store_failure(
    cluster: TestCluster,
    target: Path,
    fail_store: Callable[[], object],
    store_back: Callable[[], object],
    logged: tuple[str, ...],
) -> Result:
    """Run a ``COPY`` to ``target``; freeze the scheduler right after the commit's
    intent is written, ``fail_store``, let it run on and confirm it stopped over the
    store (its log has every one of ``logged``); ``store_back``, start it again, and
    return what the client that only called ``session.sql`` got."""
    crash = cluster.work_dir.parent / "crash.json"
    crash.write_text(
        json.dumps([{"event": "WriteCommitted", "point": "commit-intent", "action": "freeze"}])
    )
    outcome: dict[str, Any] = {}
    session = cluster.connect()

    def run() -> None:
        try:
            outcome["result"] = session.sql(f"COPY ({QUERY}) TO '{target}' (FORMAT parquet)")
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    scheduler = cluster.scheduler
    assert scheduler is not None
    try:
        wait_until(lambda: is_stopped(scheduler.pid), "the scheduler freezes mid-commit", 90)
        # Confirmed mid-commit: the intent is written, nothing moved, no manifest.
        jobs = os.listdir(target / STAGING)
        assert len(jobs) == 1 and (target / STAGING / jobs[0] / INTENT).exists(), jobs
        assert not (target / MANIFEST).exists(), scheduler.log_tail(1 << 16)[-4000:]
        crash.write_text("[]")
        fail_store()
        os.kill(scheduler.pid, signal.SIGCONT)
        # The commit goes on, but its outcome cannot be stored: the scheduler stops.
        code = scheduler.process.wait(60)
        log = scheduler.log_tail(1 << 20)
        assert all(text in log for text in logged), log[-3000:]
        assert code != 0, code
    finally:
        crash.write_text("[]")
        store_back()
        if scheduler.alive():
            os.kill(scheduler.pid, signal.SIGCONT)
    # Its files may be in place (the commit ran to the manifest) but the job's end
    # is not durable; the scheduler started again finishes it, once.
    cluster.restart_scheduler()
    runner.join(120)
    assert not runner.is_alive(), "the COPY did not finish after the store returned"
    session.close()
    if "error" in outcome:
        raise AssertionError(f"the COPY failed across the store's failure: {outcome['error']!r}")
    result: Result = outcome["result"]
    return result


def check_once(target: Path, result: Result, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    expected = duckdb_ref.sql(QUERY).to_arrow_table()
    assert result.to_arrow()["Count"].to_pylist() == [expected.num_rows]
    assert_same_result(read_back(target), expected, ordered=False)
    assert not (target / STAGING).exists()


def test_a_state_store_that_fills_up_mid_commit_commits_once_after_it_returns(
    cluster: TestCluster,
    module_dir: Path,
    disks: tuple[SmallDisk, SmallDisk],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    state = disks[1]
    target = module_dir / "big-out" / "copied"
    result = commit_through_a_store_failure(
        cluster,
        target,
        state.fill,
        state.free_up,
        ("cannot write the state store", "disk is full"),
    )
    check_once(target, result, duckdb_ref)


def test_an_etcd_stopped_mid_commit_commits_once_after_it_returns(
    work_dir: Path, tpch_tables: dict[str, Path], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    from mangonel.testing.etcd import EtcdServer

    out = work_dir / "out"
    with (
        EtcdServer(work_dir / "etcd") as etcd,
        LocalCluster(
            executors=2,
            slots=2,
            partitions=4,
            work_dir=work_dir / "cluster",
            heartbeat_timeout=3.0,
            state=etcd.url("/mangonel/write-faults/"),
            scheduler_args=(
                "--crash-file",
                str(work_dir / "crash.json"),
                "--split-rows",
                "100000",
                "--write-root",
                str(out),
            ),
        ) as cluster,
    ):
        with cluster.connect() as session:
            session.register_parquet("lineitem", str(tpch_tables["lineitem"]))
        result = commit_through_a_store_failure(
            cluster, out / "copied", etcd.stop, etcd.start, ("the scheduler stops",)
        )
        check_once(out / "copied", result, duckdb_ref)


def test_a_replace_keeps_the_old_files_for_a_reader_planned_on_them(
    cluster: TestCluster, module_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    old, new = f"{QUERY} AND l_linenumber < 4", f"{QUERY} AND l_linenumber >= 4"
    location = module_dir / "warehouse" / "replaced"
    with cluster.connect() as session:
        session.sql(f"CREATE TABLE replaced AS {old}")
        old_files = [f for f in files_under(location) if f != str(location / MANIFEST)]
        runner, outcome = held_reader(cluster, CHECK + "replaced")
        session.sql(f"CREATE OR REPLACE TABLE replaced AS {new}")
        # Replaced while the reader was planned on the old files and not done.
        assert runner.is_alive(), "the reader finished before the replace: nothing was proved"
        assert all(os.path.exists(f) for f in old_files)
        old_expected = duckdb_ref.sql(f"{CHECK} ({old})").to_arrow_table()
        old_rows_then_gone(runner, outcome, old_files, old_expected)
        # The table reads the new rows.
        new_expected = duckdb_ref.sql(f"{CHECK} ({new})").to_arrow_table()
        assert_same_result(session.sql(CHECK + "replaced").to_arrow(), new_expected, ordered=False)
        assert_same_result(read_back(location), duckdb_ref.sql(new).to_arrow_table(), ordered=False)


def test_a_drop_keeps_the_files_for_a_reader_planned_on_them(
    cluster: TestCluster, module_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """``DROP TABLE`` of a warehouse table while a query reads it: the name goes at
    once (a new table is made under it while the reader runs), the files once the
    reader is done; the reader gets every old row. Before, the drop deleted the
    files at once and the reader failed."""
    old, new = f"{QUERY} AND l_linenumber < 4", f"{QUERY} AND l_linenumber >= 4"
    location = module_dir / "warehouse" / "dropped"
    with cluster.connect() as session:
        session.sql(f"CREATE TABLE dropped AS {old}")
        old_files = [f for f in files_under(location) if f != str(location / MANIFEST)]
        runner, outcome = held_reader(cluster, CHECK + "dropped")
        session.sql("DROP TABLE dropped")
        assert "dropped" not in {t.name for t in session.tables()}
        assert all(os.path.exists(f) for f in old_files)
        # The name is free at once: a new table is made under it, the reader still held.
        session.sql(f"CREATE TABLE dropped AS {new}")
        assert runner.is_alive(), f"the reader finished before the drop: {outcome}"
        assert all(os.path.exists(f) for f in old_files)
        old_expected = duckdb_ref.sql(f"{CHECK} ({old})").to_arrow_table()
        old_rows_then_gone(runner, outcome, old_files, old_expected)
        new_expected = duckdb_ref.sql(f"{CHECK} ({new})").to_arrow_table()
        assert_same_result(session.sql(CHECK + "dropped").to_arrow(), new_expected, ordered=False)
        assert_same_result(read_back(location), duckdb_ref.sql(new).to_arrow_table(), ordered=False)
        # No reader: the files and the location go before the statement returns.
        session.sql("DROP TABLE dropped")
        assert not location.exists()


def test_files_a_replace_retired_wait_for_their_reader_across_a_scheduler_restart(
    cluster: TestCluster, module_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """A replace commits while a query reads the old files, and the scheduler is
    killed (-9) before the query ends: what waited for the reader died with it. The
    restarted scheduler recovers the query, finds the retired files in its
    warehouse at start, and deletes them only once the query is done, which gets
    the old rows. Before, they stayed until the table's next replace."""
    old, new = f"{QUERY} AND l_linenumber < 3", f"{QUERY} AND l_linenumber >= 3"
    location = module_dir / "warehouse" / "restarted"
    with cluster.connect() as session:
        session.sql(f"CREATE TABLE restarted AS {old}")
        old_files = [f for f in files_under(location) if f != str(location / MANIFEST)]
        runner, outcome = held_reader(cluster, CHECK + "restarted")
        session.sql(f"CREATE OR REPLACE TABLE restarted AS {new}")
    # The restarted scheduler launches the reader's task again as its executor
    # reattaches (attempt 1): held too, or it reads at once and the query is done
    # before the files' fate is looked at (CI, 2026-12-06). The replace's own
    # tasks were attempts 0, and it is committed.
    cluster.set_faults_all(
        [{"action": "delay", "seconds": 10, "stage": 1, "partition": 0, "attempt": 1}]
    )
    try:
        cluster.kill_scheduler()
        cluster.restart_scheduler()
        time.sleep(0.5)  # the restarted scheduler's look through its warehouse is done
        assert runner.is_alive(), f"the reader finished before the restart: {outcome}"
        assert all(os.path.exists(f) for f in old_files), "deleted under the recovered reader"
    finally:
        cluster.set_faults_all([])
    old_expected = duckdb_ref.sql(f"{CHECK} ({old})").to_arrow_table()
    old_rows_then_gone(runner, outcome, old_files, old_expected)
    with cluster.connect() as session:
        new_expected = duckdb_ref.sql(f"{CHECK} ({new})").to_arrow_table()
        assert_same_result(session.sql(CHECK + "restarted").to_arrow(), new_expected, ordered=False)
    assert_same_result(read_back(location), duckdb_ref.sql(new).to_arrow_table(), ordered=False)
