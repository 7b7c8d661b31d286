"""A write's commit survives the scheduler's crash: before, during, at and after it.

One cluster (2 executors, SQLite state store). Each test makes the scheduler kill
itself (SIGKILL) at one point of a write statement's commit with a crash rule
(``mangonel.testing.crash``), looks at the location while the scheduler is dead to
confirm where the commit stood, starts the scheduler again, and checks that the
client, which only called ``session.sql``, gets the count DuckDB's own ``COPY``
gives, and that the location then holds exactly one copy of the rows (read back
and compared with DuckDB), with nothing staged left.

The points, in the order the commit passes them (``output.commit``):

* ``before``: the state machine named the winning attempts (``CommitWrite``) and
  that is durable; nothing was moved yet.
* ``during``: the commit's intent is written; no file moved, no manifest.
* ``at``: the files are moved and the manifest written; the scheduler has not
  handled ``WriteCommitted``.
* ``after``: the job's success is durable; no client has heard of it.

The points in the middle of the commit are also run with the state in etcd.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from helpers import assert_same_result

from mangonel.client.cluster import LocalCluster
from mangonel.client.session import Result, Session
from mangonel.errors import CatalogError, UnknownTableError
from mangonel.output import INTENT, MANIFEST, STAGING

pytestmark = pytest.mark.timeout(180)

QUERY = (
    "SELECT l_orderkey, l_linenumber, l_extendedprice, l_comment FROM lineitem "
    "WHERE l_orderkey % 8 = 0"
)
"""Six writing tasks (one per scan split), 75k rows: few enough to compare quickly."""


@pytest.fixture(scope="module")
def out_root(module_dir: Path) -> Path:
    root = module_dir / "out"
    root.mkdir()
    return root


@pytest.fixture(scope="module")
def cluster(
    module_dir: Path, out_root: Path, tpch_tables: dict[str, Path]
) -> Iterator[LocalCluster]:
    with LocalCluster(
        executors=2,
        slots=2,
        partitions=4,
        work_dir=module_dir / "cluster",
        heartbeat_timeout=3.0,
        scheduler_args=(
            "--crash-file",
            str(module_dir / "crash.json"),
            "--split-rows",
            "100000",
            "--write-root",
            str(out_root),
            "--warehouse",
            str(module_dir / "warehouse"),
        ),
    ) as c:
        with c.connect() as session:
            session.register_parquet("lineitem", str(tpch_tables["lineitem"]))
        yield c


@pytest.fixture(scope="module")
def session(cluster: LocalCluster) -> Iterator[Session]:
    with cluster.connect() as s:
        yield s


def run_through_crash(
    cluster: LocalCluster,
    session: Session,
    sql: str,
    rule: dict[str, Any],
    while_down: Callable[[], None],
    crash: Path | None = None,
) -> Result:
    """Run ``sql`` while the scheduler dies at ``rule``; call ``while_down``; restart it.

    ``crash``: the scheduler's crash rules file (``crash.json`` beside its work dir).
    """
    result: Result = call_through_crash(cluster, lambda: session.sql(sql), rule, while_down, crash)
    return result


def call_through_crash(
    cluster: LocalCluster,
    call: Callable[[], Any],
    rule: dict[str, Any],
    while_down: Callable[[], None],
    crash: Path | None = None,
) -> Any:
    """``run_through_crash`` of any call of a session's: what it returns."""
    crash = crash or cluster.work_dir.parent / "crash.json"
    crash.write_text(json.dumps([rule]))
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    scheduler = cluster.scheduler
    assert scheduler is not None
    try:
        code = scheduler.process.wait(90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the crash rule {rule} never fired; scheduler log:\n{scheduler.log_tail()}")
    assert code == -signal.SIGKILL, f"the scheduler exited with {code}, not by its crash rule"
    assert "crash rule" in scheduler.log_tail(), scheduler.log_tail()
    crash.write_text("[]")
    while_down()
    cluster.restart_scheduler()
    runner.join(120)
    assert not runner.is_alive(), "the call did not finish after the scheduler came back"
    if "error" in outcome:
        raise AssertionError(f"the call failed across the restart: {outcome['error']!r}")
    return outcome["result"]


def staged_jobs(target: Path) -> list[str]:
    staging = target / STAGING
    return sorted(os.listdir(staging)) if staging.exists() else []


def committed(target: Path) -> list[str]:
    doc = json.loads((target / MANIFEST).read_text())
    return [str(target / f) for f in doc["files"]]


def check_once(target: Path, result: Result, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    """The count is DuckDB's, the location holds the rows once, nothing is staged."""
    expected = duckdb_ref.sql(QUERY).to_arrow_table()
    assert result.to_arrow()["Count"].to_pylist() == [expected.num_rows]
    files = committed(target)
    on_disk = sorted(
        os.path.join(r, f) for r, _, names in os.walk(target) for f in names if f != MANIFEST
    )
    assert on_disk == sorted(files)
    actual = duckdb.connect().sql(f"SELECT * FROM read_parquet({files!r})").to_arrow_table()
    assert_same_result(actual, expected, ordered=False)


# Where the scheduler dies, and what the location holds then.
POINTS: dict[str, tuple[dict[str, Any], Callable[[Path], None]]] = {}


def _before(target: Path) -> None:
    jobs = staged_jobs(target)
    assert len(jobs) == 1, jobs  # the attempts' files, staged
    assert not (target / MANIFEST).exists()
    assert not (target / STAGING / jobs[0] / INTENT).exists()


def _during(target: Path) -> None:
    jobs = staged_jobs(target)
    assert len(jobs) == 1, jobs
    assert (target / STAGING / jobs[0] / INTENT).exists()
    assert not (target / MANIFEST).exists()
    assert not [f for f in os.listdir(target) if f.startswith("part-")]


def _at(target: Path) -> None:
    assert (target / MANIFEST).exists()


POINTS = {
    "before": ({"event": "TaskCompleted", "commands": "CommitWrite"}, _before),
    "during": ({"event": "WriteCommitted", "point": "commit-intent"}, _during),
    "at": ({"event": "WriteCommitted", "point": "committed"}, _at),
    "after": ({"event": "WriteCommitted"}, _at),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_copy_is_committed_exactly_once_across_a_scheduler_crash(
    point: str,
    cluster: LocalCluster,
    session: Session,
    out_root: Path,
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    rule, confirm = POINTS[point]
    target = out_root / point
    sql = f"COPY ({QUERY}) TO '{target}' (FORMAT parquet)"
    result = run_through_crash(cluster, session, sql, rule, lambda: confirm(target))
    check_once(target, result, duckdb_ref)
    status = session.status().job(result.job_id)
    assert status is not None and status.stages[-2].tasks_total == 6


def test_create_table_as_is_registered_after_a_crash_mid_commit(
    cluster: LocalCluster, session: Session, module_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    target = module_dir / "warehouse" / "copied"
    sql = f"CREATE TABLE copied AS {QUERY}"
    rule = {"event": "WriteCommitted", "point": "commit-intent"}
    result = run_through_crash(cluster, session, sql, rule, lambda: _during(target))
    check_once(target, result, duckdb_ref)
    check = "SELECT count(*) AS n, sum(l_extendedprice) AS s FROM "
    actual: pa.Table = session.sql(check + "copied").to_arrow()
    expected = duckdb_ref.sql(check + "lineitem WHERE l_orderkey % 8 = 0").to_arrow_table()
    assert_same_result(actual, expected, ordered=False)


def test_an_overwrite_of_no_row_replaces_the_rows_across_a_crash_mid_commit(
    cluster: LocalCluster, session: Session, out_root: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # PARTITION_BY of no row: every writing task stages no file, the intent moves
    # nothing, and only the manifest can say that the commit took effect. Run again
    # after the crash, the commit once took its empty moves for done and left the
    # old rows there while the statement succeeded (the whole-cluster simulation's
    # seed 3200004 found it).
    target = out_root / "overwritten"
    session.sql(f"COPY ({QUERY}) TO '{target}' (FORMAT parquet)")
    assert len(committed(target)) == 6
    sql = (
        f"COPY ({QUERY} AND l_linenumber < 0) TO '{target}' "
        "(FORMAT parquet, PARTITION_BY (l_linenumber), OVERWRITE)"
    )
    rule = {"event": "WriteCommitted", "point": "commit-intent"}

    def intent_written() -> None:
        jobs = staged_jobs(target)
        assert len(jobs) == 1, jobs
        assert (target / STAGING / jobs[0] / INTENT).exists()
        assert json.loads((target / STAGING / jobs[0] / INTENT).read_text())["moves"] == []
        assert len(committed(target)) == 6  # the old rows, still

    result = run_through_crash(cluster, session, sql, rule, intent_written)
    expected = duckdb_ref.sql(f"SELECT count(*) FROM ({QUERY} AND l_linenumber < 0)").fetchall()
    assert expected == [(0,)]
    assert result.to_arrow()["Count"].to_pylist() == [0]
    assert committed(target) == []
    # The replaced files deleted, no reader planned on them running.
    assert [f for _, _, names in os.walk(target) for f in names if f != MANIFEST] == []


def test_a_write_whose_answer_is_lost_after_its_commit_is_not_run_again(
    cluster: LocalCluster, session: Session, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The scheduler dies once the INSERT's success is durable, and the executors
    # holding its answer (the count) die while it is down: the restarted scheduler
    # has no copy of the answer, and the client cannot read it. The client used to
    # run a statement whose result was lost again, as it does a query: the rows
    # went in twice (``scripts/soak.py --writers`` found it as a DROP TABLE that
    # failed for a table it had dropped itself). Now the answer is NULL, the rows
    # are there once.
    session.sql("CREATE TABLE answered (k BIGINT, v DECIMAL(15, 2))")
    sql = f"INSERT INTO answered SELECT l_orderkey, l_extendedprice FROM ({QUERY})"
    held = len(cluster.executors)

    def executors_die() -> None:
        for index, handle in enumerate(cluster.executors):
            if handle.alive():
                cluster.kill_executor(index)
        for _ in range(held):
            cluster.add_executor(wait=False)

    result = run_through_crash(cluster, session, sql, POINTS["after"][0], executors_die)
    check = "SELECT count(*) AS n, sum(v) AS s FROM answered"
    actual: pa.Table = session.sql(check).to_arrow()
    expected = duckdb_ref.sql(
        f"SELECT count(*) AS n, sum(l_extendedprice) AS s FROM ({QUERY})"
    ).to_arrow_table()
    assert_same_result(actual, expected, ordered=False)
    assert result.answer_lost, result
    assert result.to_arrow()["Count"].to_pylist() == [None]
    status = session.status().job(result.job_id)
    assert status is not None and status.took_effect
    cluster.wait_for_executors(held)


def test_a_drop_whose_job_was_not_written_before_a_crash_answers_its_retry(
    cluster: LocalCluster, session: Session
) -> None:
    # The table is gone and the scheduler dies before the statement's job is in
    # the store: the client tries the submission again (the same request id) on
    # the restarted scheduler, which answers it as done (``persist.StoredDrop``).
    # Before, it dropped again and failed: "there is no table" for a table the
    # client had dropped itself (CI, 2026-12-07: the randomized fault run).
    session.sql("CREATE TABLE doomed AS SELECT 1 AS a")
    rule = {"event": "*", "point": "dropped"}
    result = run_through_crash(cluster, session, "DROP TABLE doomed", rule, lambda: None)
    assert result.to_arrow().column_names == ["Success"] and result.to_arrow().num_rows == 0
    assert "doomed" not in [t.name for t in session.tables()]
    status = session.status().job(result.job_id)
    assert status is not None and status.took_effect
    with pytest.raises(UnknownTableError, match="no table 'doomed' to drop"):
        session.sql("DROP TABLE doomed")


def test_the_admins_drop_call_answered_by_no_one_before_a_crash_is_answered_once_after(
    cluster: LocalCluster, session: Session
) -> None:
    # ``Session.drop_table`` (the admins' ``DropTable`` call, not a statement): the
    # scheduler dies after the drop, before its answer; the client sends the call
    # again to the restarted one, which answers it as done from the drop it kept.
    # Before, the retry failed: "no table" for the table the call had dropped.
    session.sql("CREATE TABLE doomed AS SELECT 1 AS a")
    rule = {"event": "*", "point": "dropped"}
    assert (
        call_through_crash(cluster, lambda: session.drop_table("doomed"), rule, lambda: None)
        is None
    )
    assert "doomed" not in [t.name for t in session.tables()]
    with pytest.raises(CatalogError, match="no table 'doomed'"):
        session.drop_table("doomed")


# ------------------------------------------------------------------------ etcd


@pytest.fixture(scope="module")
def etcd_cluster(
    module_dir: Path, out_root: Path, tpch_tables: dict[str, Path]
) -> Iterator[LocalCluster]:
    from mangonel.testing.etcd import EtcdServer

    with (
        EtcdServer(module_dir / "etcd") as etcd,
        LocalCluster(
            executors=2,
            slots=2,
            partitions=4,
            work_dir=module_dir / "etcd-cluster",
            heartbeat_timeout=3.0,
            state=etcd.url("/mangonel/writes/"),
            scheduler_args=(
                "--crash-file",
                str(module_dir / "etcd-cluster-crash.json"),
                "--split-rows",
                "100000",
                "--write-root",
                str(out_root),
            ),
        ) as c,
    ):
        with c.connect() as session:
            session.register_parquet("lineitem", str(tpch_tables["lineitem"]))
        yield c


def test_copy_is_committed_exactly_once_across_crashes_with_etcd(
    etcd_cluster: LocalCluster, out_root: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    crash = etcd_cluster.work_dir.parent / "etcd-cluster-crash.json"
    with etcd_cluster.connect() as session:
        for point in ("during", "at"):
            rule, confirm = POINTS[point]
            target = out_root / f"etcd-{point}"
            sql = f"COPY ({QUERY}) TO '{target}' (FORMAT parquet)"
            result = run_through_crash(
                etcd_cluster, session, sql, rule, functools.partial(confirm, target), crash
            )
            check_once(target, result, duckdb_ref)
