"""Aggregating subqueries of one source computed in one pass (``sql.merged_aggregates``).

TPC-DS q09 (15 scalar subqueries of ``store_sales``) and q88 (eight one-row
derived tables of it joined with three dimensions) scanned the table once per
subquery. Each shape here, over TPC-H, scans it once, in one task
and in several, and answers as single-process DuckDB does (``plan_runner``).
"""

from __future__ import annotations

import duckdb
import pytest
import sqlglot
from helpers import assert_same_result
from plan_runner import run_plan
from sqlglot import exp

from mangonel.catalog import Table
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.sql.exprs import conjuncts
from mangonel.sql.merged_aggregates import _apart, merge_scalar_aggregates

CONFIGS = {
    "one-task": PlannerConfig(),
    "three-tasks": PlannerConfig(
        partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=20_000
    ),
}

QUERIES = {
    # q09: scalar subqueries, a CASE of them per range.
    "scalar": """
        SELECT
          CASE WHEN (SELECT COUNT(*) FROM lineitem WHERE l_quantity BETWEEN 1 AND 10) > 100000
               THEN (SELECT AVG(l_discount) FROM lineitem WHERE l_quantity BETWEEN 1 AND 10)
               ELSE (SELECT AVG(l_tax) FROM lineitem WHERE l_quantity BETWEEN 1 AND 10) END AS b1,
          CASE WHEN (SELECT COUNT(*) FROM lineitem WHERE l_quantity BETWEEN 11 AND 20) > 1
               THEN (SELECT SUM(l_extendedprice) / COUNT(*) FROM lineitem
                     WHERE l_quantity BETWEEN 11 AND 20)
               ELSE 0 END AS b2,
          (SELECT MAX(l_extendedprice) FROM lineitem WHERE l_quantity > 1000) AS none_kept,
          (SELECT COUNT(*) FROM lineitem WHERE l_quantity > 1000) AS zero
        FROM region WHERE r_regionkey = 1""",
    # One-row derived tables (q28's shape, less its DISTINCT counts).
    "derived": """
        SELECT * FROM
          (SELECT AVG(l_extendedprice) AS b1_lp, COUNT(l_extendedprice) AS b1_cnt,
                  MIN(l_extendedprice) AS b1_min
           FROM lineitem WHERE l_quantity BETWEEN 0 AND 5 AND l_discount > 0.05) AS b1,
          (SELECT AVG(l_extendedprice) AS b2_lp, COUNT(l_extendedprice) AS b2_cnt,
                  MIN(l_extendedprice) AS b2_min
           FROM lineitem WHERE l_quantity BETWEEN 6 AND 10 AND l_discount > 0.05) AS b2""",
    # q88: joins every subquery shares, and one condition of its own each.
    "joined": """
        SELECT * FROM
          (SELECT COUNT(*) AS urgent FROM orders, customer, nation
           WHERE o_custkey = c_custkey AND c_nationkey = n_nationkey AND n_name = 'FRANCE'
             AND o_orderpriority = '1-URGENT') AS s1,
          (SELECT COUNT(*) AS high FROM orders, customer, nation
           WHERE o_custkey = c_custkey AND c_nationkey = n_nationkey AND n_name = 'FRANCE'
             AND o_orderpriority = '2-HIGH') AS s2,
          (SELECT COUNT(*) AS all_orders FROM orders, customer, nation
           WHERE o_custkey = c_custkey AND c_nationkey = n_nationkey
             AND n_name = 'FRANCE') AS s3""",
    # q28: DISTINCT counts, merged only where no row meets two subqueries' own
    # conditions (grouped by bucket, not filtered), an empty bucket among them.
    "distinct": """
        SELECT * FROM
          (SELECT AVG(l_extendedprice) AS b1_lp, COUNT(DISTINCT l_extendedprice) AS b1_cntd
           FROM lineitem
           WHERE l_quantity BETWEEN 0 AND 5 AND (l_discount > 0.05 OR l_tax < 0.02)) AS b1,
          (SELECT AVG(l_extendedprice) AS b2_lp, COUNT(DISTINCT l_extendedprice) AS b2_cntd
           FROM lineitem
           WHERE l_quantity BETWEEN 6 AND 10 AND (l_discount > 0.05 OR l_tax < 0.02)) AS b2,
          (SELECT COUNT(DISTINCT l_suppkey) AS none_cntd FROM lineitem
           WHERE l_quantity > 1000) AS b3""",
}

SCANNED = {"scalar": "lineitem", "derived": "lineitem", "joined": "orders", "distinct": "lineitem"}


def _scans(plan: DistributedPlan, table: str) -> int:
    own = sum(s.scan is not None and s.scan.table == table for s in plan.stages)
    return own + sum(side.table == table for s in plan.stages for side in s.side_scans)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(QUERIES))
def test_aggregates_of_one_source_are_computed_in_one_pass(
    name: str, config: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = QUERIES[name]
    plan = plan_query(sql, catalog, CONFIGS[config])
    assert _scans(plan, SCANNED[name]) == 1, [s.label for s in plan.stages]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows == 1
    assert_same_result(run_plan(plan), expected, ordered=False)


def _merged(sql: str) -> exp.Expr:
    return merge_scalar_aggregates(sqlglot.parse_one(sql, read="duckdb"))


def test_the_rows_any_subquery_keeps_are_read_once_each_counted_by_its_own() -> None:
    # A row may meet both conditions (t.a = 1 is t.a < 5): each aggregate filters.
    out = _merged(
        "SELECT (SELECT COUNT(*) FROM t AS t WHERE t.a = 1 AND t.b > 0),"
        " (SELECT SUM(t.c) FROM t AS t WHERE t.a < 5 AND t.b > 0)"
    )
    (cte,) = out.find_all(exp.CTE)
    assert cte.this.sql() == (
        'SELECT COUNT(*) FILTER(WHERE t.a = 1) AS "m0_0", SUM(t.c) FILTER(WHERE t.a < 5) AS "m1_0"'
        " FROM t AS t WHERE t.b > 0 AND ((t.a = 1) OR (t.a < 5))"
    )


def test_conditions_no_row_meets_two_of_are_buckets_of_one_group_by() -> None:
    # DuckDB checks a FILTER per aggregate and row (q09: 0.33 s filtered, 0.10 s
    # grouped): rows go to the bucket their condition names, each aggregate is
    # computed once a bucket, and the buckets' rows are pivoted into the one row
    # (a COUNT of an empty bucket is 0, not NULL).
    out = _merged(
        "SELECT (SELECT COUNT(*) FROM t AS t WHERE t.a = 1 AND t.b > 0),"
        " (SELECT SUM(t.c) + 1 FROM t AS t WHERE t.a = 2 AND t.b > 0)"
    )
    (cte,) = out.find_all(exp.CTE)
    bucket = "CASE WHEN t.a = 1 THEN 0 WHEN t.a = 2 THEN 1 END"
    assert cte.this.sql() == (
        'SELECT COALESCE(MAX("g"."a0") FILTER(WHERE "g"."b" = 0), 0) AS "m0_0",'
        ' MAX("g"."a1") FILTER(WHERE "g"."b" = 1) + 1 AS "m1_0"'
        f' FROM (SELECT {bucket} AS "b", COUNT(*) AS "a0", SUM(t.c) AS "a1" FROM t AS t'
        f' WHERE t.b > 0 AND ((t.a = 1) OR (t.a = 2)) GROUP BY {bucket}) AS "g"'
    )


@pytest.mark.parametrize(
    ("conditions", "apart"),
    [
        (["t.q BETWEEN 1 AND 20", "t.q BETWEEN 21 AND 40"], True),
        (["t.q BETWEEN 1 AND 20", "t.q BETWEEN 20 AND 40"], False),  # both hold 20
        (["t.q < 20", "t.q >= 20"], True),
        (["t.q <= 20", "20 <= t.q"], False),
        (["t.q > -5 AND t.q < 0", "t.q = -5"], True),
        # q88: an hour and its halves.
        (["t.h = 8 AND t.m >= 30", "t.h = 9 AND t.m < 30", "t.h = 9 AND t.m >= 30"], True),
        (["t.h = 8", "t.m = 30"], False),  # no column bounded by both
        (["t.s = 'a'", "t.s = 'b'"], False),  # strings: '1' and '01' may cast alike
        (["t.q = 1", "t.q = 1.0"], False),
    ],
)
def test_conditions_are_apart_only_where_numbers_bound_a_column_to_ranges_that_do_not_meet(
    conditions: list[str], apart: bool
) -> None:
    groups = [conjuncts(sqlglot.parse_one(c, read="duckdb")) for c in conditions]
    assert _apart(groups) is apart


@pytest.mark.parametrize(
    "other",
    [
        "(SELECT COUNT(*) FROM t AS t WHERE t.a = 2 GROUP BY t.b)",  # rows by group
        "(SELECT COUNT(*) FROM t AS t WHERE t.a = 2 LIMIT 1)",
        "(SELECT t.b FROM t AS t WHERE t.a = 2)",  # not an aggregate
        "(SELECT COUNT(*) FROM t AS t WHERE t.a = u.x)",  # a column of the outer query
        "(SELECT COUNT(*) FROM t AS t WHERE t.a = RANDOM())",
        "(SELECT COUNT(*) FROM t AS t JOIN v AS v ON t.a = v.a WHERE t.a = 2)",  # other joins
        # Filtered, slower merged (q28): merged only into buckets (t.a > 0 holds t.a = 1).
        "(SELECT COUNT(DISTINCT t.b) FROM t AS t WHERE t.a > 0)",
    ],
    ids=["grouped", "limit", "no-aggregate", "outer-column", "random", "other-source", "distinct"],
)
def test_a_subquery_that_is_not_one_aggregate_of_the_source_is_left_alone(other: str) -> None:
    sql = f"SELECT (SELECT COUNT(*) FROM t AS t WHERE t.a = 1), {other} FROM u AS u"
    assert _merged(sql).sql() == sqlglot.parse_one(sql, read="duckdb").sql()


@pytest.mark.parametrize("name", ["scalar", "overlapping"])
def test_filtered_aggregates_are_merged_from_partials_of_each_task(
    name: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Each task counts its own rows of each range (``aggregates.split_aggs``), by
    # bucket where the ranges do not meet, so only a row a task and bucket moves,
    # not every row a range keeps.
    sql = OVERLAPPING if name == "overlapping" else QUERIES[name]
    plan = plan_query(sql, catalog, CONFIGS["three-tasks"])
    (scan,) = [s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem"]
    assert scan.num_tasks > 1 and scan.label.endswith("partial aggregate"), scan.label
    assert ("GROUP BY CASE" in scan.sql.upper()) is (name == "scalar")
    assert "FILTER" in scan.sql.upper() or name == "scalar"
    assert_same_result(run_plan(plan), duckdb_ref.sql(sql).to_arrow_table(), ordered=False)


OVERLAPPING = """
    SELECT (SELECT COUNT(*) FROM lineitem WHERE l_quantity BETWEEN 1 AND 10) AS low,
           (SELECT AVG(l_discount) FROM lineitem WHERE l_quantity BETWEEN 5 AND 20) AS mid"""


def test_a_column_outside_the_subquerys_aggregates_is_not_taken_for_one_inside() -> None:
    # The outer query's MAX holds the subquery, not its column t.b.
    sql = (
        "SELECT (SELECT COUNT(*) FROM t AS t WHERE t.a = 1),"
        " MAX((SELECT COUNT(*) + t.b FROM t AS t WHERE t.a = 2)) FROM u AS u"
    )
    assert _merged(sql).sql() == sqlglot.parse_one(sql, read="duckdb").sql()
