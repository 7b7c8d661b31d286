"""A small table filtered by a subquery is scanned by the tasks that join it.

TPC-DS q83 keeps 21 days of ``date_dim`` by a subquery (the dates of three weeks)
and joins them with each channel's returns: that scan read the subquery's stage,
so it was a stage of its own, a stage more in a row before the returns' scan.
Such a table, small enough to be scanned inline, is now scanned by the joining
tasks, which read the subquery's stage themselves.
Each plan runs task by task (``plan_runner``) against single-process DuckDB.
"""

from __future__ import annotations

from dataclasses import replace

import duckdb
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import InputMode

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, split_rows=20_000)

SQL = """
    SELECT c_mktsegment, COUNT(*) AS n, SUM(o_totalprice) AS total
    FROM orders JOIN customer ON o_custkey = c_custkey
    WHERE c_nationkey IN (SELECT n_nationkey FROM nation WHERE n_regionkey = 1)
    GROUP BY c_mktsegment"""


def test_a_table_filtered_by_a_subquery_is_scanned_inline(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    expected = duckdb_ref.sql(SQL).to_arrow_table()
    assert expected.num_rows == 5
    # Where a subquery is not computed again by each task (``recompute_bytes=0``),
    # the tasks read the subquery's stage whole, as the customer scan did.
    plan = plan_query(SQL, catalog, replace(CONFIG, recompute_bytes=0))
    orders = next(s for s in plan.stages if s.scan is not None and s.scan.table == "orders")
    assert orders.num_tasks > 1
    assert [s.table for s in orders.side_scans] == ["customer"]
    subquery = next(s for s in plan.stages if s.label == "subquery")
    assert [(i.stage, i.mode) for i in orders.inputs] == [(subquery.id, InputMode.ALL)]
    assert not any(s.scan is not None and s.scan.table == "customer" for s in plan.stages)
    assert_same_result(run_plan(plan), expected, ordered=False)
    # By default, each task computes it too (25 rows of nation): one stage less
    # before the orders scan, which reads no stage.
    plan = plan_query(SQL, catalog, CONFIG)
    orders = next(s for s in plan.stages if s.scan is not None and s.scan.table == "orders")
    assert orders.num_tasks > 1
    assert [s.table for s in orders.side_scans] == ["customer", "nation"]
    assert not orders.inputs
    assert not any(s.label == "subquery" for s in plan.stages)
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_filtered_table_too_big_for_every_task_keeps_its_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    config = PlannerConfig(partitions=3, split_rows=20_000, inline_scan_bytes=0, recompute_bytes=0)
    plan = plan_query(SQL, catalog, config)
    assert any(s.scan is not None and s.scan.table == "customer" for s in plan.stages)
    assert_same_result(run_plan(plan), duckdb_ref.sql(SQL).to_arrow_table(), ordered=False)
