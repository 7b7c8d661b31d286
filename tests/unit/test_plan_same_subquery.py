"""A subquery written several times in one query is planned once.

TPC-DS q83 filters ``date_dim`` in each of its three channels by the same two
nested subqueries (the weeks of three dates, then those weeks' dates): 6 of its
12 stages computed the same rows. Subqueries of the same text over catalog
tables now share one placeholder, so one stage.
Each plan runs task by task (``plan_runner``) against single-process DuckDB.
"""

from __future__ import annotations

import duckdb
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.planner import PlannerConfig, plan_query

# Subqueries of one stage each, read by their readers: not computed again by each
# (``recompute_bytes``, below).
CONFIG = PlannerConfig(partitions=3, partition_bytes=0, split_rows=20_000, recompute_bytes=0)


def _subquery_stages(sql: str, catalog: dict[str, Table]) -> int:
    plan = plan_query(sql, catalog, CONFIG)
    return sum(s.label == "subquery" for s in plan.stages)


def test_the_same_subquery_twice_is_one_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """
        SELECT 'supplier' AS side, COUNT(*) AS n FROM supplier
        WHERE s_nationkey IN (SELECT n_nationkey FROM nation
                              WHERE n_regionkey IN (SELECT r_regionkey FROM region
                                                    WHERE r_name LIKE 'A%'))
        UNION ALL
        SELECT 'customer', COUNT(*) FROM customer
        WHERE c_nationkey IN (SELECT n_nationkey FROM nation
                              WHERE n_regionkey IN (SELECT r_regionkey FROM region
                                                    WHERE r_name LIKE 'A%'))"""
    # The outer subquery once; the one nested in it, read only by the outer
    # one's task, inside that task.
    assert _subquery_stages(sql, catalog) == 1
    plan = plan_query(sql, catalog, CONFIG)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert all(n > 0 for n in expected.column("n").to_pylist())
    assert_same_result(run_plan(plan), expected, ordered=False)
    # Cheap to compute again (nation and region), it is computed by each reader's
    # task (the one task of the union, here), with the one nested in it: planned
    # once, copied, so the nested one is no stage either.
    plan = plan_query(sql, catalog, PlannerConfig(partitions=3, split_rows=20_000))
    assert len(plan.stages) == 1, [s.label for s in plan.stages]
    assert {s.table for s in plan.final.side_scans} == {"customer", "nation", "region"}
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_subqueries_that_differ_are_not_shared(catalog: dict[str, Table]) -> None:
    # Read by the two tasks of orders (a reader of one task computes them itself).
    sql = """
        SELECT COUNT(*) FROM orders
        WHERE o_custkey % 25 IN (SELECT n_nationkey FROM nation WHERE n_regionkey = 1)
          AND o_orderkey % 25 IN (SELECT n_nationkey FROM nation WHERE n_regionkey = 2)"""
    assert _subquery_stages(sql, catalog) == 2


def test_the_same_subquery_of_a_cte_in_two_places_is_one_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q14 reads its cross_items and avg_sales CTEs in a subquery of each
    # channel: the subqueries read the CTE's one stage, and were a stage each
    # (their texts name the CTE, not catalog tables, so the binder keeps them
    # apart). Equal but for their columns' names, they are one stage now. (The
    # subqueries of ``mean``, one task each and read by one task, are computed by
    # their readers: only those of ``big``, hashed into several, are stages.)
    sql = """
        WITH big AS (SELECT o_custkey AS k FROM orders WHERE o_totalprice > 300000
                     GROUP BY o_custkey),
             mean AS (SELECT AVG(o_totalprice) AS m FROM orders)
        SELECT 'supplier' AS side, COUNT(*) AS n FROM supplier
        WHERE s_suppkey IN (SELECT k FROM big) AND s_acctbal * 100 < (SELECT m FROM mean)
        UNION ALL
        SELECT 'customer', COUNT(*) FROM customer
        WHERE c_custkey IN (SELECT k FROM big) AND c_acctbal * 100 < (SELECT m FROM mean)"""
    plan = plan_query(sql, catalog, CONFIG)
    assert _subquery_stages(sql, catalog) == 1, [s.label for s in plan.stages]
    assert [s.id for s in plan.stages] == list(range(1, len(plan.stages) + 1))
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert all(n > 0 for n in expected.column("n").to_pylist())
    assert_same_result(run_plan(plan), expected, ordered=False)
