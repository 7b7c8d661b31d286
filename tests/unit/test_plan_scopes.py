"""Subqueries where the planner once lost track of them: in a SELECT without FROM,
reading a CTE that shadows another of the same name, and in a GROUP BY key.

``SELECT (SELECT max(x) FROM t)`` planned to a task that named ``t`` although no
task reads tables by their names; and a CTE defined in a subquery, shadowing an
outer CTE of the same name, was read as the outer one by a scalar subquery in its
scope (a wrong answer). Each plan runs task by task (``plan_runner``) against
single-process DuckDB on the same data.
"""

from __future__ import annotations

import duckdb
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.planner import PlannerConfig, plan_query

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, split_rows=20_000)

FROM_LESS = {
    "scalar": "SELECT (SELECT MAX(n_nationkey) FROM nation) AS m",
    "in_an_expression": "SELECT 1 + (SELECT MAX(n_nationkey) FROM nation) AS x, 'a' AS s",
    "in_and_exists": (
        "SELECT 3 IN (SELECT n_nationkey FROM nation) AS a, "
        "EXISTS (SELECT 1 FROM region WHERE r_regionkey > 10) AS b"
    ),
    "as_a_derived_table": (
        "SELECT a.m, COUNT(*) AS n FROM (SELECT (SELECT MAX(r_regionkey) FROM region) AS m) AS a "
        "JOIN nation ON n_regionkey = a.m GROUP BY a.m"
    ),
    "over_a_cte": (
        "WITH k AS (SELECT n_nationkey AS v FROM nation) "
        "SELECT a.m FROM (SELECT (SELECT MAX(v) FROM k) AS m) AS a"
    ),
}

SHADOWED = {
    # The inner k (all 25 nations) must be read inside, the outer (2) outside.
    "scalar_in_a_derived_table": """
        WITH k AS (SELECT n_nationkey AS v FROM nation WHERE n_nationkey < 2)
        SELECT a.m, (SELECT MAX(v) FROM k) AS outer_max FROM (
          WITH k AS (SELECT n_nationkey AS v FROM nation)
          SELECT (SELECT MAX(v) FROM k) AS m) AS a""",
    "scalar_beside_the_outer": """
        WITH k AS (SELECT n_nationkey AS v FROM nation WHERE n_nationkey < 2)
        SELECT (SELECT MAX(v) FROM k) AS outer_max,
               (WITH k AS (SELECT n_nationkey AS v FROM nation)
                SELECT (SELECT MAX(v) FROM k)) AS inner_max""",
    "in_list_and_join": """
        WITH k AS (SELECT r_regionkey AS v FROM region WHERE r_regionkey = 0)
        SELECT COUNT(*) AS n, MIN(k.v) AS v FROM (
          WITH k AS (SELECT n_nationkey AS v FROM nation WHERE n_nationkey < 5)
          SELECT s_suppkey FROM supplier WHERE s_nationkey IN (SELECT v FROM k)) AS s, k""",
    "three_deep": """
        WITH k AS (SELECT 1 AS v)
        SELECT a.m, (SELECT MAX(v) FROM k) AS top FROM (
          WITH k AS (SELECT r_regionkey AS v FROM region)
          SELECT b.m FROM (
            WITH k AS (SELECT n_nationkey AS v FROM nation)
            SELECT (SELECT MAX(v) FROM k) AS m) AS b
          WHERE b.m > (SELECT MAX(v) FROM k)) AS a""",
}


@pytest.mark.parametrize("case", sorted(FROM_LESS))
def test_subqueries_without_from(
    case: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = FROM_LESS[case]
    plan = plan_query(sql, catalog, CONFIG)
    assert plan.notes == ()  # planned, not run whole
    # The subquery's table is read through a scan input (its own stage's, or a side
    # scan of the one task that reads it), not by its name, which no task knows.
    assert any(s.scan is not None or s.side_scans for s in plan.stages), plan.stages
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert_same_result(run_plan(plan), expected, ordered=False)


@pytest.mark.parametrize("case", sorted(SHADOWED))
def test_a_shadowing_cte_is_read_in_its_scope(
    case: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = SHADOWED[case]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    plan = plan_query(sql, catalog, CONFIG)
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_subquery_in_a_group_key_is_a_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The GROUP BY key kept the subquery while the select's item had it lifted:
    # the aggregate's task named lineitem ("Table with name lineitem does not exist").
    sql = """
        SELECT q > (SELECT AVG(l_quantity) FROM lineitem) AS big, COUNT(*) AS n
        FROM (SELECT l_quantity AS q FROM lineitem
              UNION ALL SELECT ps_availqty / 200 FROM partsupp) AS u
        GROUP BY q > (SELECT AVG(l_quantity) FROM lineitem)"""
    plan = plan_query(sql, catalog, CONFIG)
    assert plan.notes == ()
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows == 2
    assert_same_result(run_plan(plan), expected, ordered=False)
