"""Memory and disk running out on real executors: the answer is still DuckDB's.

Each test starts its own 3-executor ``TestCluster`` on the chaos data, with one
executor limited (``mangonel.testing.limits``, needs root):

* OOM kill: executor 0 runs in a memory cgroup; a ``hog_memory`` fault takes more
  than its limit when its first stage-1 task starts, so the kernel's OOM killer
  SIGKILLs it mid-query. It is an ordinary loss: the task runs again elsewhere.
  And without a fault: an executor whose DuckDB may take more than its cgroup
  allows (a misconfigured ``--memory``) is killed by the kernel in a big sort,
  and executors that join finish the query.
* Full disk: executor 0's work root is a small tmpfs; a ``fill_disk`` fault fills
  it when its first stage-1 task starts, so that task's shuffle writes meet
  ``ENOSPC`` mid-write. The task fails as ``disk full``, runs elsewhere, no
  half-written file is left, the executor reports itself unhealthy (no task goes
  there) until the ballast is deleted, and then takes tasks again.

Two more need no root: a query out of memory on every attempt fails saying how
much memory it had, and a sort bigger than its slot's memory spills and answers
right (in cgroups too, when there are, without an OOM kill).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from chaos_support import (
    BROADCAST_BYTES,
    GRACE_S,
    HEARTBEAT_TIMEOUT_S,
    PARTITIONS,
    SLOTS,
    SPLIT_ROWS,
    tasks_rerun,
    wait_exit,
    wait_until,
)
from helpers import (
    TPCH_ORDER_BY,
    TPCH_TABLES,
    assert_same_result,
    duckdb_views_sql,
    require_host,
    tpch_query,
)

from mangonel.client.session import Session
from mangonel.errors import JobFailedError
from mangonel.testing.cluster import TestCluster
from mangonel.testing.limits import memory_cgroups_available, small_disks_available

pytestmark = pytest.mark.timeout(120)

QUERY = 3
"""lineitem (9 scan tasks), orders and customer, joined through shuffles."""
MIB = 2**20


@contextlib.contextmanager
def limited_cluster(
    work_dir: Path, data: Path, **limits: Any
) -> Iterator[tuple[TestCluster, Session, duckdb.DuckDBPyConnection]]:
    tables = {t: data / f"{t}.parquet" for t in TPCH_TABLES}
    reference = duckdb.connect()
    for statement in duckdb_views_sql(dict(tables)):
        reference.execute(statement)
    cluster = TestCluster(
        executors=3,
        work_dir=work_dir,
        slots=SLOTS,
        partitions=PARTITIONS,
        broadcast_bytes=BROADCAST_BYTES,
        heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
        no_executor_grace=GRACE_S,
        scheduler_args=("--split-rows", str(SPLIT_ROWS)),
        **limits,
    )
    try:
        cluster.start()
        with cluster.connect() as session:
            for name, path in tables.items():
                session.register_parquet(name, str(path))
            yield cluster, session, reference
    finally:
        cluster.stop()
        reference.close()


def check(session: Session, reference: duckdb.DuckDBPyConnection, number: int) -> Any:
    result = session.sql(tpch_query(number))
    expected = reference.sql(tpch_query(number)).to_arrow_table()
    assert expected.num_rows > 0
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
    return result


def test_executor_killed_by_the_oom_killer_is_an_ordinary_loss(
    work_dir: Path, chaos_data: Path
) -> None:
    require_host(
        None if memory_cgroups_available() else "no writable memory cgroup", "a memory cgroup"
    )
    limit = 400 * MIB
    with limited_cluster(
        work_dir,
        chaos_data,
        executor_memory={0: limit},
        executor_args_for=lambda i: ["--memory", "300MiB"] if i == 0 else [],
    ) as (cluster, session, reference):
        victim = cluster.executors[0]
        victim_id = victim.id
        assert victim_id is not None
        # More than the cgroup allows, taken when its first stage-1 task starts.
        cluster.set_faults(0, [{"action": "hog_memory", "stage": 1, "bytes": 2 * limit}])

        result = check(session, reference, QUERY)

        wait_exit(victim, timeout=10)
        assert victim.process.returncode == -9, f"exit code {victim.process.returncode}"
        assert cluster.oom_kills(0) >= 1, "the kernel's OOM killer did not kill it"
        assert "hog_memory" in victim.log_tail(), victim.log_tail()
        # The query ran distributed, and the task that was running there ran again.
        assert len(result.stages) > 2, result.stages
        assert tasks_rerun(result, stage=1) > 0, result.stages
        lost = [e for e in session.status().executors if e.id == victim_id]
        assert lost and lost[0].state.name == "LOST", lost


def test_full_disk_fails_the_task_elsewhere_and_the_executor_waits_for_space(
    work_dir: Path, chaos_data: Path
) -> None:
    require_host(None if small_disks_available() else "not root", "a tmpfs mounted as a small disk")
    with limited_cluster(work_dir, chaos_data, executor_disks={0: 64 * MIB}) as (
        cluster,
        session,
        reference,
    ):
        victim = cluster.executors[0]
        victim_id = victim.id
        disk = cluster.disk(0)
        cluster.set_faults(0, [{"action": "fill_disk", "stage": 1, "leave": 0}])

        result = check(session, reference, QUERY)

        # Its stage-1 task met the full disk mid-write and ran again elsewhere.
        assert tasks_rerun(result, stage=1) > 0, result.stages
        log = victim.log_tail(20_000)
        assert "failed" in log and "disk full: no space left" in log, log
        assert victim.alive()
        # No half-written shuffle file is left behind, under any name.
        leftovers = [
            os.path.join(d, f) for d, _, files in os.walk(disk.path) for f in files
            if f.endswith(".tmp") and "duckdb_temp" not in f
        ]  # fmt: skip
        assert leftovers == []

        def status() -> Any:
            return next(e for e in session.status().executors if e.id == victim_id)

        assert status().unhealthy, "the full executor did not say it was unhealthy"
        assert "full" in status().unhealthy
        # While it is unhealthy, no task goes there: a query runs on the others.
        done_before = log.count(" done in ")
        check(session, reference, 6)
        assert victim.log_tail(20_000).count(" done in ") == done_before

        cluster.free_up_disk(0)
        wait_until(lambda: status().unhealthy == "", "the executor is healthy again", 30)
        check(session, reference, 6)
        assert victim.log_tail(20_000).count(" done in ") > done_before


def test_out_of_memory_on_every_attempt_fails_the_job_saying_how_much(
    work_dir: Path, chaos_data: Path
) -> None:
    # 200 MiB over 2 slots leaves each DuckDB the 16 MiB floor; a string
    # aggregate cannot spill, and each group's string here is about 30 MB.
    sql = (
        "SELECT l_returnflag, length(string_agg(repeat(l_comment, 40), ',')) AS n "
        "FROM lineitem GROUP BY l_returnflag"
    )
    with limited_cluster(
        work_dir, chaos_data, executor_args=("--memory", "200MiB"), max_task_attempts=2
    ) as (cluster, session, reference):
        with pytest.raises(JobFailedError) as raised:
            session.sql(sql)
        message = str(raised.value)
        assert "failed 2 attempts" in message, message
        assert "out of memory: the task needed more than its slot's share" in message, message
        assert "16.0 MiB of the executor's 200.0 MiB (--memory) over 2 slots" in message
        assert "raise the executors' --memory or lower their --slots" in message
        # The executors are fine: a query that fits still runs.
        check(session, reference, 6)
        assert all(handle.alive() for handle in cluster.executors)


def test_a_sort_bigger_than_its_slots_memory_spills_and_answers_right(
    work_dir: Path, tpch_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # 256 MiB over 2 slots: each DuckDB may hold 28.8 MiB; the sort's input,
    # 600k lineitem rows with their comments, is bigger than that.
    sql = (
        "SELECT l_orderkey, l_linenumber, l_comment FROM lineitem "
        "ORDER BY l_comment, l_orderkey, l_linenumber"
    )
    limits: dict[str, Any] = {"executor_args": ("--memory", "256MiB"), "executors": 2}
    if memory_cgroups_available():
        limits["executor_memory"] = {0: 256 * MIB, 1: 256 * MIB}
    cluster = TestCluster(work_dir=work_dir, slots=2, **limits)
    with cluster:
        with cluster.connect() as session:
            session.register_parquet("lineitem", str(tpch_dir / "lineitem.parquet"))
            result = session.sql(sql)
            expected = duckdb_ref.sql(sql).to_arrow_table()
            assert expected.num_rows > 500_000
            assert_same_result(result.to_arrow(), expected, ordered=True)
        logs = "".join(h.log_tail(200_000) for h in cluster.executors)
        assert "spilled" in logs, "no task spilled: the test proves nothing"
        assert all(h.alive() for h in cluster.executors)
        if cluster.cgroups:
            assert cluster.oom_kills(0) == cluster.oom_kills(1) == 0


def test_an_executor_whose_duckdb_outgrows_its_cgroup_is_killed_and_others_finish(
    work_dir: Path, tpch_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    require_host(
        None if memory_cgroups_available() else "no writable memory cgroup", "a memory cgroup"
    )
    # Misconfigured on purpose: DuckDB may take 2.4 GiB per slot (--memory 8GiB)
    # in a 256 MiB cgroup, and the sort keys alone are about 160 MB. The kernel's
    # OOM killer, not a fault rule, ends the executor mid-task.
    sql = (
        "SELECT l_orderkey, l_linenumber FROM lineitem "
        "ORDER BY repeat(l_comment, 10), l_orderkey, l_linenumber"
    )
    cluster = TestCluster(
        executors=1,
        work_dir=work_dir,
        slots=2,
        executor_memory={0: 256 * MIB},
        executor_args=("--memory", "8GiB"),
    )
    with cluster, cluster.connect() as session:
        session.register_parquet("lineitem", str(tpch_dir / "lineitem.parquet"))
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                result = session.sql(sql)
                outcome["table"], outcome["rerun"] = result.to_arrow(), result.tasks_rerun
            except Exception as exc:  # handed to the test's thread
                outcome["error"] = exc

        # One stage of one task: lineitem at SF 0.1 is one split, and the sort
        # runs with the scan, so the one task's memory is the whole sort's.
        explained = session.explain(sql)
        assert "1 stages" in explained and "1 task(s)" in explained, explained
        query = threading.Thread(target=run)
        query.start()
        victim = cluster.executors[0]
        wait_exit(victim, timeout=60)
        assert victim.process.returncode == -9, f"exit code {victim.process.returncode}"
        assert cluster.oom_kills(0) >= 1, "the kernel's OOM killer did not kill it"
        # Executors outside the cgroup join and finish the query.
        cluster.add_executor()
        cluster.add_executor()
        query.join(90)
        assert not query.is_alive() and "error" not in outcome, outcome
        assert outcome["rerun"] >= 1
        expected = duckdb_ref.sql(sql).to_arrow_table()
        assert_same_result(outcome["table"], expected, ordered=True)
