"""Exchanges and scans sized to whole waves of the cluster's slots, on real processes.

The scheduler plans each query with the slots a job may hold
(``PlannerConfig.slots``); an exchange whose bytes ask for more partitions than
that gets a multiple of it (``plan.distribute.stages.whole_waves``), so its
reader tasks' last wave is full. The query groups SF 0.1's ``lineitem`` (6 scan
tasks at 100k rows) by part: a partial aggregate, then a hash exchange of about
2.5 MB, which ``--partition-bytes`` 1 MiB cuts into 3 partitions by the bytes
alone. On 2 slots that is 4 reader tasks (two waves of two); on 3 slots, 3 (one
wave). Adaptive execution is off so that the planned tasks are the tasks run
(coalescing would merge these small partitions into one).

A scan split by its bytes (``--split-bytes``, not ``--split-rows``) into more
tasks than slots, not whole waves, runs as the next fewer count that is
(``PlannerConfig.scan_split_rows``): SF 0.1's ``lineitem`` at 3 MiB a task is 3
tasks of the 250k-row minimum by the bytes alone, 2 on 2 slots.

The executors here say they have 8 cores and one DuckDB thread a slot
(``--cores``, ``--threads``), so every slot runs at full speed: the tests are
about the slots. The last one is about the cores: two executors of one slot
on one host of two cores, each slot's DuckDB on both, run one task at full
speed, and a scan of more tasks is one wave of one (``PlannerConfig.parallel``);
on two hosts (``--host-id``), two.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from helpers import assert_same_result

from mangonel.catalog import load_table
from mangonel.client.status import StageStatus
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.testing.cluster import TestCluster

SQL = "SELECT l_partkey, sum(l_quantity) AS q, count(*) AS n FROM lineitem GROUP BY l_partkey"
SPLIT_ROWS = 100_000
PARTITION_BYTES = 1 << 20
EVERY_SLOT_AT_FULL_SPEED = ("--cores", "8", "--threads", "1")
pytestmark = pytest.mark.timeout(180)


def _run(
    cluster: TestCluster,
    sql: str,
    tpch_tables: dict[str, Path],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> list[StageStatus]:
    """``sql`` over ``lineitem`` on ``cluster``, its answer checked against DuckDB's;
    its stages in order."""
    with cluster, cluster.connect() as session:
        session.register_parquet("lineitem", str(tpch_tables["lineitem"]))
        result = session.sql(sql)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    assert_same_result(result.to_arrow(), expected, ordered=False)
    return sorted(result.stages, key=lambda s: s.stage)


def test_the_bytes_alone_ask_for_three_partitions(tpch_tables: dict[str, Path]) -> None:
    """The premise of the cluster test below: with the slots unknown, 3."""
    catalog = {"lineitem": load_table("lineitem", str(tpch_tables["lineitem"]))}
    config = PlannerConfig(partition_bytes=PARTITION_BYTES, split_rows=SPLIT_ROWS)
    scan, aggregate = plan_query(SQL, catalog, config).stages
    assert (scan.num_tasks, scan.output.partitions, aggregate.num_tasks) == (6, 3, 3)


@pytest.mark.parametrize(
    ("executors", "slots", "tasks"),
    [(2, 1, 4), (1, 3, 3)],
    ids=["2-slots-two-whole-waves", "3-slots-one-wave"],
)
def test_the_aggregate_runs_whole_waves_of_the_clusters_slots(
    executors: int,
    slots: int,
    tasks: int,
    work_dir: Path,
    tpch_tables: dict[str, Path],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    cluster = TestCluster(
        work_dir=work_dir / "cluster",
        executors=executors,
        slots=slots,
        partition_bytes=PARTITION_BYTES,
        adaptive=False,
        scheduler_args=("--split-rows", str(SPLIT_ROWS)),
        executor_args=EVERY_SLOT_AT_FULL_SPEED,
    )
    scan, aggregate = _run(cluster, SQL, tpch_tables, duckdb_ref)
    assert (scan.tasks_total, scan.tasks_done) == (6, 6), scan
    assert (aggregate.tasks_total, aggregate.tasks_done) == (tasks, tasks), aggregate


SCAN_SQL = (
    "SELECT l_returnflag, l_linestatus, sum(l_quantity) AS q, count(*) AS n "
    "FROM lineitem GROUP BY l_returnflag, l_linestatus"
)
SPLIT_BYTES = 3 << 20


def test_the_bytes_alone_cut_the_scan_into_three_tasks(tpch_tables: dict[str, Path]) -> None:
    """The premise of the cluster test below: with the slots unknown, 3."""
    catalog = {"lineitem": load_table("lineitem", str(tpch_tables["lineitem"]))}
    scan, _ = plan_query(SCAN_SQL, catalog, PlannerConfig(split_bytes=SPLIT_BYTES)).stages
    assert scan.num_tasks == 3


@pytest.mark.parametrize(
    ("executors", "slots", "tasks"),
    [(2, 1, 2), (1, 3, 3)],
    ids=["2-slots-one-wave-of-two", "3-slots-one-wave-of-three"],
)
def test_the_scan_runs_whole_waves_of_the_clusters_slots(
    executors: int,
    slots: int,
    tasks: int,
    work_dir: Path,
    tpch_tables: dict[str, Path],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    cluster = TestCluster(
        work_dir=work_dir / "cluster",
        executors=executors,
        slots=slots,
        scheduler_args=("--split-bytes", str(SPLIT_BYTES)),
        executor_args=EVERY_SLOT_AT_FULL_SPEED,
    )
    scan, final = _run(cluster, SCAN_SQL, tpch_tables, duckdb_ref)
    assert (scan.tasks_total, scan.tasks_done) == (tasks, tasks), scan
    assert final.tasks_total == 1, final


ONE_WAVE_SPLIT_BYTES = 4 << 20
"""3 tasks of the 250k-row minimum by the bytes; the whole scan (600k rows of 26
bytes) within four splits' worth."""


@pytest.mark.parametrize(
    ("hosts", "tasks", "stages"),
    [(1, 1, 1), (2, 2, 2)],
    ids=["one-host-one-task", "two-hosts-two-tasks"],
)
def test_a_scan_is_one_wave_of_the_tasks_the_hosts_run_at_full_speed(
    hosts: int,
    tasks: int,
    stages: int,
    work_dir: Path,
    tpch_tables: dict[str, Path],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    cluster = TestCluster(
        work_dir=work_dir / "cluster",
        executors=2,
        slots=1,
        scheduler_args=("--split-bytes", str(ONE_WAVE_SPLIT_BYTES)),
        executor_args=("--cores", "2", "--threads", "2"),
        executor_args_for=lambda i: ("--host-id", f"host-{i % hosts}"),
    )
    ran = _run(cluster, SCAN_SQL, tpch_tables, duckdb_ref)
    assert (ran[0].tasks_total, ran[0].tasks_done) == (tasks, tasks), ran
    # One task aggregates its rows itself (no fusion bound where one task at a
    # time runs at full speed); two hand their partial rows to a final task.
    assert len(ran) == stages and ran[-1].tasks_total == 1, ran


SPREAD_SQL = (
    "SELECT c_count, count(*) AS custdist FROM (SELECT c_custkey, count(o_orderkey) AS c_count "
    "FROM customer LEFT OUTER JOIN orders ON c_custkey = o_custkey "
    "AND o_comment NOT LIKE '%special%requests%' GROUP BY c_custkey) AS c_orders "
    "GROUP BY c_count ORDER BY custdist DESC, c_count DESC"
)
"""TPC-H q13: SF 0.1's ``orders`` (150k rows in two row groups) is one split by
the bytes, and the whole query one task, wherever the hosts run one task at once."""
SPREAD_BYTES = 1 << 20
"""``--spread-bytes`` scaled down to SF 0.1 (32 MiB by default)."""


def test_on_hosts_of_one_core_each_a_scan_of_one_split_is_spread_over_them(
    work_dir: Path,
    tpch_tables: dict[str, Path],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    catalog = {t: load_table(t, str(tpch_tables[t])) for t in ("customer", "orders")}
    one_host = PlannerConfig(slots=2, parallel=1, spread_bytes=SPREAD_BYTES)
    assert [s.num_tasks for s in plan_query(SPREAD_SQL, catalog, one_host).stages] == [1]
    cluster = TestCluster(
        work_dir=work_dir / "cluster",
        executors=2,
        slots=1,
        scheduler_args=("--spread-bytes", str(SPREAD_BYTES)),
        executor_args=("--cores", "1", "--threads", "1"),
        executor_args_for=lambda i: ("--host-id", f"host-{i}"),
    )
    with cluster, cluster.connect() as session:
        for table in ("customer", "orders"):
            session.register_parquet(table, str(tpch_tables[table]))
        result = session.sql(SPREAD_SQL)
    assert_same_result(result.to_arrow(), duckdb_ref.sql(SPREAD_SQL).to_arrow_table(), ordered=True)
    spread = [s for s in result.stages if s.tasks_total == 2]
    assert spread, result.stages
    # Each of the two tasks ran on a host of its own.
    assert all(s.phases is not None and s.phases.executors == 2 for s in spread), spread
