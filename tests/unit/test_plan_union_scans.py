"""A set operation of one-task sides runs both sides in its own task.

TPC-DS q05 unions ``store_sales`` with ``store_returns`` (each one split at SF1)
and then joins 15 days of ``date_dim``: each side in a stage of its own wrote its
rows whole (221 MB for ``store_sales``) for the union's one task to read back.
A side that only scans became a side scan of the task that runs the union; a side
that aggregated kept its own stage, so that the sides ran in parallel. No stage
boundary is cut between one-task stages now (``stages.one_task``): sides that
aggregate run in the union's DuckDB query too, in parallel on its threads.
Each plan runs task by task (``plan_runner``) against single-process DuckDB.
"""

from __future__ import annotations

import duckdb
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan import types
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlannerConfig, plan_query

# Every table one split: each side of a union is one task.
CONFIG = PlannerConfig(split_rows=10_000_000)


def _tables_by_stage(plan: DistributedPlan) -> list[set[str]]:
    return [
        {s.table for s in ([st.scan] if st.scan else []) + list(st.side_scans)}
        for st in plan.stages
    ]


def test_a_union_of_two_scans_runs_in_the_task_that_joins_it(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """
        SELECT n_name, SUM(amount) AS total, COUNT(*) AS n
        FROM (SELECT s_nationkey AS nk, s_acctbal AS amount FROM supplier
              UNION ALL
              SELECT c_nationkey, c_acctbal FROM customer WHERE c_mktsegment = 'BUILDING') u
        JOIN nation ON nk = n_nationkey
        GROUP BY n_name"""
    plan = plan_query(sql, catalog, CONFIG)
    by_stage = _tables_by_stage(plan)
    # One stage reads both tables of the union; none reads either alone.
    assert any({"supplier", "customer"} <= t for t in by_stage), by_stage
    assert not any(t & {"supplier", "customer"} == {"supplier"} for t in by_stage), by_stage
    assert not any(t & {"supplier", "customer"} == {"customer"} for t in by_stage), by_stage
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows == 25
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_side_that_joins_hosts_a_side_that_scans(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The left side only scans, the right one joins: the right side's task runs
    # the union, with the left side's table as its side scan (q05's web channel).
    sql = """
        SELECT kind, COUNT(*) AS n, SUM(k) AS s FROM (
            SELECT 'part' AS kind, p_partkey AS k FROM part WHERE p_size < 10
            EXCEPT
            SELECT 'part', ps_partkey FROM partsupp JOIN supplier ON ps_suppkey = s_suppkey
            WHERE s_acctbal > 9000) x
        GROUP BY kind"""
    plan = plan_query(sql, catalog, CONFIG)
    by_stage = _tables_by_stage(plan)
    assert any({"part", "partsupp"} <= t for t in by_stage), by_stage
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows == 1
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_sides_that_aggregate_run_in_the_task_of_the_union(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """
        SELECT 'lineitem' AS src, l_suppkey AS k, COUNT(*) AS n FROM lineitem GROUP BY l_suppkey
        UNION ALL
        SELECT 'partsupp', ps_suppkey, COUNT(*) FROM partsupp GROUP BY ps_suppkey"""
    plan = plan_query(sql, catalog, CONFIG)
    # Both aggregates and the union in one task: one DuckDB query runs both sides.
    assert _tables_by_stage(plan) == [{"lineitem", "partsupp"}], plan.stages
    assert plan.final.label.endswith("aggregate → setop → result"), plan.final.label
    # Several tasks a side: each aggregate keeps its stages, and the union reads them.
    plan = plan_query(sql, catalog, PlannerConfig(split_rows=100_000))
    by_stage = _tables_by_stage(plan)
    assert not any({"lineitem", "partsupp"} <= t for t in by_stage), by_stage
    assert {"lineitem"} in by_stage and {"partsupp"} in by_stage, by_stage
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_union_in_one_task_is_not_typed(
    catalog: dict[str, Table],
    duckdb_ref: duckdb.DuckDBPyConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The columns of a set operation are typed (DuckDB over empty tables) only to
    # hash them alike on both sides; a union run in one task hashes nothing (q05
    # asked 24 times, 0.28 s of its planning).
    seen: list[str] = []
    describe = types.TypeOracle.describe

    def spy(self: types.TypeOracle, sql: str) -> list[tuple[str, str]]:
        seen.append(sql)
        return describe(self, sql)

    monkeypatch.setattr(types.TypeOracle, "describe", spy)
    sql = """
        SELECT 'nation' AS src, n_regionkey AS k, COUNT(*) AS n FROM nation GROUP BY n_regionkey
        UNION ALL
        SELECT 'supplier', s_nationkey % 5, COUNT(*) FROM supplier GROUP BY s_nationkey % 5"""
    plan = plan_query(sql, catalog, CONFIG)
    assert not [s for s in seen if " AS k0" in s], seen  # the keys are k0, k1, ...
    assert len(plan.stages) == 1  # each side and the union in one task
    assert_same_result(run_plan(plan), duckdb_ref.sql(sql).to_arrow_table(), ordered=False)
