"""LocalCluster, the scheduler service and the client API, with real processes.

The module-scoped ``cluster`` and ``session`` fixtures (tests/integration/conftest.py)
start one scheduler and two executors for the whole module.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result, tpch_query

import mangonel
from mangonel.client.status import ExecutorState, JobState


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def test_executors_register_and_run(cluster: Any, session: Any) -> None:
    status = session.status()
    alive = {e.id: e for e in status.alive_executors()}
    assert len(cluster.executors) >= 2
    for handle in cluster.executors[:2]:
        assert handle.alive(), f"executor {handle.index} died; log: {handle.log_tail()}"
        assert handle.id in alive
        assert alive[handle.id].pid == handle.pid
        assert alive[handle.id].flight_address
    assert status.scheduler_address == cluster.address


def test_query_matches_duckdb(session: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    sql = tpch_query(12)
    result = session.sql(sql)
    assert result.columns == ("l_shipmode", "high_line_count", "low_line_count")
    assert_same_result(result.to_arrow(), duckdb_ref.sql(sql).to_arrow_table(), ordered=True)
    assert result.num_rows == 2
    assert len(result.to_pandas()) == 2
    assert result.stages and all(s.tasks_done == s.tasks_total for s in result.stages)


def test_a_client_process_runs_a_query_without_importing_the_planner(
    cluster: Any, session: Any, duckdb_ref: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    # Session.sql asked the planner whether a statement is an EXPLAIN, so a client
    # process's first query imported the planner and sqlglot (0.2 to 0.3 s).
    sql = tpch_query(12)
    code = (
        "import sys, mangonel, pyarrow.parquet as pq\n"
        "s = mangonel.connect(sys.argv[1])\n"
        "pq.write_table(s.sql(sys.argv[2]).to_arrow(), sys.argv[3])\n"
        "print(sorted(m for m in sys.modules if m == 'sqlglot' or m.startswith('mangonel.plan')))\n"
    )
    out = tmp_path / "result.parquet"
    done = subprocess.run(
        [sys.executable, "-c", code, cluster.address, sql, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    assert_same_result(pq.read_table(out), duckdb_ref.sql(sql).to_arrow_table(), ordered=True)


def test_repeated_column_names_are_kept(session: Any) -> None:
    result = session.sql("SELECT n_name, n_name FROM nation ORDER BY n_nationkey LIMIT 3")
    table = result.to_arrow()
    assert table.column_names == ["n_name", "n_name"]
    assert table.column(0).to_pylist() == ["ALGERIA", "ARGENTINA", "BRAZIL"]


def test_register_missing_path_is_a_catalog_error(session: Any, tmp_path: Path) -> None:
    with pytest.raises(mangonel.CatalogError, match="does not exist"):
        session.register_parquet("ghost", str(tmp_path / "nope.parquet"))


def test_register_non_parquet_is_a_catalog_error(session: Any, tmp_path: Path) -> None:
    bogus = tmp_path / "notes.parquet"
    bogus.write_text("this is not parquet")
    with pytest.raises(mangonel.CatalogError, match="not a readable Parquet file"):
        session.register_parquet("bogus", str(bogus))
    # The scheduler keeps serving, and the bad table was not added.
    assert "bogus" not in {t.name for t in session.tables()}
    assert session.sql("SELECT count(*) AS n FROM region").to_arrow().column(0)[0].as_py() == 5


def test_register_and_list_tables(session: Any, tpch_tables: dict[str, Path]) -> None:
    info = session.register_parquet("nation_copy", str(tpch_tables["nation"]))
    assert info.rows == 25
    assert ("n_name", info.columns[1][1]) == info.columns[1]
    assert "nation_copy" in {t.name for t in session.tables()}
    session.drop_table("nation_copy")
    assert "nation_copy" not in {t.name for t in session.tables()}


def test_query_errors_keep_their_type(session: Any) -> None:
    with pytest.raises(mangonel.SqlSyntaxError):
        session.sql("SELEC 1 FROM nation")
    with pytest.raises(mangonel.UnknownTableError, match="no_such_table"):
        session.sql("SELECT * FROM no_such_table")
    with pytest.raises(mangonel.QueryError):
        session.explain("SELECT nope FROM nation")


def test_explain_returns_text(session: Any) -> None:
    text = session.explain(tpch_query(12))
    assert "lineitem" in text and "stage" in text.lower()


def test_explain_statement_returns_the_plan_as_rows(session: Any) -> None:
    plan = session.explain("SELECT count(*) AS n FROM nation")
    result = session.sql("EXPLAIN SELECT count(*) AS n FROM nation").to_arrow()
    assert result.column_names == ["explain"]
    assert result.column("explain").to_pylist() == plan.splitlines()


LONG_QUERY = (
    "SELECT count(*) AS n FROM lineitem a JOIN lineitem b ON a.l_returnflag = b.l_returnflag"
)


def test_cancel_a_running_job(session: Any) -> None:
    # A self-join on a key of three values: ~1e11 rows, minutes on SF 0.1. (One on
    # l_suppkey, ~4e8 rows, takes DuckDB itself 0.4 s: it ended before a 0.5 s timeout.)
    job = session.submit(LONG_QUERY)
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            session.wait(job)
            outcome.append(None)
        except BaseException as exc:  # recorded for the assertion below
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert _wait_until(
        lambda: any(
            s.tasks_running for j in session.status().jobs if j.job_id == job for s in j.stages
        )
    )
    assert session.cancel(job)
    waiter.join(10)
    assert not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], mangonel.JobCancelledError), outcome
    jobs = {j.job_id: j for j in session.status().jobs}
    assert jobs[job].state is JobState.CANCELLED
    assert session.cancel(job) is False
    # Cancelled tasks free their slots: the next query runs.
    assert session.sql("SELECT count(*) AS n FROM region").num_rows == 1


def test_a_query_past_its_timeout_is_cancelled(session: Any) -> None:
    with pytest.raises(mangonel.QueryTimeoutError, match="within its timeout of 0.5 s") as err:
        session.sql(LONG_QUERY, timeout_s=0.5)
    assert "it was cancelled" in str(err.value), err.value
    job = str(err.value).split(":", 1)[0].removeprefix("job ")
    jobs = {j.job_id: j for j in session.status().jobs}
    assert jobs[job].state is JobState.CANCELLED, jobs[job]  # it had not finished
    assert session.sql("SELECT count(*) AS n FROM region").num_rows == 1


def test_unknown_job(session: Any) -> None:
    with pytest.raises(mangonel.MangonelError, match="no job"):
        session.cancel("0000dead")


def test_killed_executor_is_lost_at_once(cluster: Any, session: Any) -> None:
    handle = cluster.add_executor()
    assert handle.id is not None
    cluster.kill_executor(handle.index, signal.SIGKILL)

    def lost() -> bool:
        states = {e.id: e for e in session.status().executors}
        return states[handle.id].state is ExecutorState.LOST

    # The broken Connect stream, not the heartbeat timeout, gives it away.
    assert _wait_until(lost, timeout=3.0)
    entry = {e.id: e for e in session.status().executors}[handle.id]
    assert entry.reason == "connection lost"
    assert session.sql("SELECT count(*) AS n FROM nation").num_rows == 1


def test_unreachable_scheduler_is_a_cluster_error_after_connect_wait_s() -> None:
    told: list[str] = []
    started = time.monotonic()
    with (
        mangonel.connect("127.0.0.1:1", connect_wait_s=1.0, on_wait=told.append) as s,
        pytest.raises(mangonel.ClusterError, match="cannot reach the scheduler at 127.0.0.1:1"),
    ):
        s.tables()
    assert time.monotonic() - started >= 1.0
    assert told == ["waiting up to 1 s for the scheduler at 127.0.0.1:1 (connection refused)"]


def test_cluster_stops_every_process(tmp_path: Path) -> None:
    with mangonel.LocalCluster(executors=1, work_dir=tmp_path / "c") as cluster:
        pids = [cluster.executors[0].pid]
        assert cluster.scheduler is not None
        pids.append(cluster.scheduler.pid)
        cluster.freeze_executor(0)  # a frozen process must be stopped too
    assert all(_pid_gone(pid) for pid in pids)


def test_start_failure_raises_with_log_and_leaves_no_process(tmp_path: Path) -> None:
    cluster = mangonel.LocalCluster(
        executors=1, work_dir=tmp_path / "c", executor_args=("--no-such-flag",)
    )
    with pytest.raises(mangonel.ClusterError, match="no-such-flag"):
        cluster.start()
    assert cluster.scheduler is not None
    assert all(_pid_gone(p.pid) for p in [cluster.scheduler, *cluster.executors])


def test_children_die_with_the_process_that_started_them(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import time
        import mangonel
        cluster = mangonel.LocalCluster(executors=1, work_dir={str(tmp_path / "c")!r}).start()
        print(cluster.scheduler.pid, cluster.executors[0].pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2, "the cluster did not start"
    parent.kill()  # no clean-up code runs: only the kernel's PDEATHSIG can help
    parent.wait(10)

    def exited(pid: int) -> bool:
        # A zombie has exited too (whether init reaps orphans depends on the box).
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return _pid_gone(pid)
        return stat.rsplit(")", 1)[1].split()[0] == "Z"

    assert _wait_until(lambda: all(exited(p) for p in pids), timeout=20)


def test_a_small_result_comes_with_the_jobs_end_and_a_big_one_over_flight(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The final status carries a small result's file (a cluster without tickets),
    # so the client reads nothing over Flight; a result too big to carry still is.
    reads: list[Any] = []
    read = session._flight.read
    monkeypatch.setattr(
        session._flight, "read", lambda *a, **k: reads.append(a[0]) or read(*a, **k)
    )
    small = tpch_query(1)  # four groups, from several stages
    result = session.sql(small)
    assert_same_result(result.to_arrow(), duckdb_ref.sql(small).to_arrow_table(), ordered=True)
    assert len(result.stages) > 1 and result.num_rows == 4
    assert reads == []
    # A result of no row too: an empty Arrow table is falsy, and the client took
    # one carried for one not carried (it read it over Flight, and ran the
    # statement again when that executor had just died: a DROP TABLE failed for
    # the table it had dropped itself, scripts/soak.py --writers).
    empty = "SELECT l_orderkey FROM lineitem WHERE l_orderkey < 0"
    result = session.sql(empty)
    assert_same_result(result.to_arrow(), duckdb_ref.sql(empty).to_arrow_table(), ordered=False)
    assert result.num_rows == 0 and result.to_arrow().column_names == ["l_orderkey"]
    assert reads == []
    big = "SELECT l_orderkey, l_linenumber, l_comment FROM lineitem WHERE l_orderkey < 20000"
    result = session.sql(big)
    assert_same_result(result.to_arrow(), duckdb_ref.sql(big).to_arrow_table(), ordered=False)
    assert result.num_rows > 10_000 and len(reads) >= 1
