"""A one-task target reads the stages that a join side only filters itself.

TPC-DS q11 reads its ``year_total`` CTE (one stage) four times, each reader keeping
one channel and one year: three of them were stages of their own ("read": a
filter of the CTE's stage, 11 to 38k rows), each a round trip on the query's
path, for the one task of the final join to read back. That task now reads the
CTE's stage and filters it itself (q31: 8 stages to 5).
Each plan runs task by task (``plan_runner``) against single-process DuckDB.
"""

from __future__ import annotations

import duckdb
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.planner import PlannerConfig, plan_query

ONE_TASK = PlannerConfig(split_rows=10_000_000)

SHARED_READ_THRICE = """
    WITH totals AS (
        SELECT o_custkey AS k, EXTRACT(year FROM o_orderdate) AS y, SUM(o_totalprice) AS s
        FROM orders GROUP BY o_custkey, EXTRACT(year FROM o_orderdate))
    SELECT a.k, a.s AS s1995, b.s AS s1996, c.s AS s1997
    FROM totals a JOIN totals b ON a.k = b.k JOIN totals c ON a.k = c.k
    WHERE a.y = 1995 AND b.y = 1996 AND c.y = 1997 AND c.s > b.s AND b.s > a.s"""


def test_filters_of_a_shared_stage_run_in_the_task_that_joins_them(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    plan = plan_query(SHARED_READ_THRICE, catalog, ONE_TASK)
    labels = [s.label for s in plan.stages]
    assert "read" not in labels, labels
    shared = next(s for s in plan.stages if "aggregate" in s.label)
    # Every other stage reads the shared stage itself.
    assert all(shared.id in [i.stage for i in s.inputs] for s in plan.stages[1:]), labels
    expected = duckdb_ref.sql(SHARED_READ_THRICE).to_arrow_table()
    assert expected.num_rows > 10
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_target_of_several_tasks_still_reads_the_filtered_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Each of lineitem's tasks would read the whole shared stage: the filtered
    # side stays a stage of its own, broadcast.
    sql = """
        WITH totals AS (SELECT o_orderkey AS k, o_custkey AS c, SUM(o_totalprice) AS s
                        FROM orders GROUP BY o_orderkey, o_custkey)
        SELECT COUNT(*) AS n, SUM(l_quantity) AS q
        FROM lineitem JOIN totals t ON l_orderkey = t.k
        WHERE t.s > 300000 AND t.c IN (SELECT c FROM totals WHERE s < 1000)"""
    plan = plan_query(sql, catalog, PlannerConfig(split_rows=10_000))
    lineitem = next(s for s in plan.stages if s.scan and s.scan.table == "lineitem")
    assert lineitem.num_tasks > 1
    assert "read" in [s.label for s in plan.stages]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert_same_result(run_plan(plan), expected, ordered=False)
