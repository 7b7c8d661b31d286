"""A derived table written out twice, word for word, is computed once.

TPC-DS q65 aggregates a year of ``store_sales`` by store and item twice: once for
each store's average, once for the rows compared with it. ``sql.shared_ctes.
share_repeated_subqueries`` makes such a derived table one CTE that its readers
share, which the planner computes once; only where one evaluation means the same
as several, and only for one that aggregates. Each plan runs task by task
(``plan_runner``) against single-process DuckDB.
"""

from __future__ import annotations

import duckdb
import pytest
import sqlglot
from helpers import assert_same_result
from plan_runner import run_plan
from sqlglot import exp

from mangonel.catalog import Table
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.sql.shared_ctes import share_repeated_subqueries

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=20_000)

# q65's shape over TPC-H: each customer's orders by priority, against the
# customer's average over its priorities.
TWICE = """
    SELECT c_name, sc.o_orderpriority, sc.revenue, sb.ave
    FROM customer,
         (SELECT o_custkey, AVG(revenue) AS ave
          FROM (SELECT o_custkey, o_orderpriority, SUM(o_totalprice) AS revenue
                FROM orders WHERE o_orderdate >= DATE '1995-01-01'
                GROUP BY o_custkey, o_orderpriority) AS sa
          GROUP BY o_custkey) AS sb,
         (SELECT o_custkey, o_orderpriority, SUM(o_totalprice) AS revenue
          FROM orders WHERE o_orderdate >= DATE '1995-01-01'
          GROUP BY o_custkey, o_orderpriority) AS sc
    WHERE sb.o_custkey = sc.o_custkey AND c_custkey = sc.o_custkey
      AND sc.revenue <= 0.5 * sb.ave"""


# q44's shape: two CTEs of one body, the best and the worst ranked of it.
TWO_CTES = """
    WITH v1 AS (SELECT o_custkey AS k, AVG(o_totalprice) AS a FROM orders
                WHERE o_orderstatus = 'F' GROUP BY o_custkey),
         v2 AS (SELECT o_custkey AS k, AVG(o_totalprice) AS a FROM orders
                WHERE o_orderstatus = 'F' GROUP BY o_custkey),
         best AS (SELECT k, RANK() OVER (ORDER BY a DESC, k) AS r FROM v1),
         worst AS (SELECT k, RANK() OVER (ORDER BY a ASC, k) AS r FROM v2)
    SELECT best.r, best.k AS best, worst.k AS worst
    FROM best JOIN worst ON best.r = worst.r WHERE best.r <= 50"""


@pytest.mark.parametrize("config", [PlannerConfig(), CONFIG], ids=["one-task", "three-tasks"])
@pytest.mark.parametrize("sql", [TWICE, TWO_CTES], ids=["derived-tables", "ctes"])
def test_an_aggregate_written_twice_is_computed_once(
    sql: str,
    config: PlannerConfig,
    catalog: dict[str, Table],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    plan = plan_query(sql, catalog, config)
    scans = [s for s in plan.stages if s.scan is not None and s.scan.table == "orders"]
    scans += [s for s in plan.stages for side in s.side_scans if side.table == "orders"]
    assert len(scans) == 1, [s.label for s in plan.stages]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows >= 50
    assert_same_result(run_plan(plan), expected, ordered=False)


def _shared(sql: str) -> exp.Expr:
    return share_repeated_subqueries(sqlglot.parse_one(sql, read="duckdb"))


def test_the_repeated_text_becomes_one_cte_read_under_each_alias() -> None:
    sub = "(SELECT t.k AS k, SUM(t.v) AS s FROM t AS t GROUP BY t.k)"
    out = _shared(f"SELECT a.k, b.s FROM {sub} AS a JOIN {sub} AS b ON a.k = b.k")
    assert out.sql() == (
        'WITH "shared_subquery_1" AS (SELECT t.k AS k, SUM(t.v) AS s FROM t AS t GROUP BY t.k) '
        'SELECT a.k, b.s FROM "shared_subquery_1" AS a JOIN "shared_subquery_1" AS b ON a.k = b.k'
    )


@pytest.mark.parametrize(
    "sub",
    [
        # Each evaluation may keep other rows, or give other values.
        "(SELECT t.k AS k, SUM(t.v) AS s FROM t AS t GROUP BY t.k LIMIT 5)",
        "(SELECT t.k AS k, SUM(t.v) * RANDOM() AS s FROM t AS t GROUP BY t.k)",
        # A column of the outer query (DuckDB reads it as a lateral join).
        "(SELECT t.k AS k, SUM(t.v + u.w) AS s FROM t AS t GROUP BY t.k)",
        # Rows passed through: read again, not kept.
        "(SELECT t.k AS k, t.v AS s FROM t AS t)",
    ],
    ids=["limit", "random", "outer-column", "no-aggregate"],
)
def test_what_may_differ_or_costs_little_is_left_written_twice(sub: str) -> None:
    sql = f"SELECT a.k, b.s FROM u AS u, {sub} AS a JOIN {sub} AS b ON a.k = b.k"
    assert _shared(sql).sql() == sqlglot.parse_one(sql, read="duckdb").sql()


def test_the_cte_goes_after_the_ctes_it_reads_and_before_those_reading_it() -> None:
    sub = "(SELECT x.k AS k, COUNT(*) AS n FROM x AS x GROUP BY x.k)"
    sql = (
        "WITH x AS (SELECT t.k AS k FROM t AS t), "
        f"y AS (SELECT a.k AS k FROM {sub} AS a JOIN {sub} AS b ON a.k = b.k) "
        "SELECT y.k FROM y AS y"
    )
    ctes = [c.alias_or_name for c in _shared(sql).find_all(exp.CTE)]
    assert ctes == ["x", "shared_subquery_1", "y"]


def test_a_cte_equal_to_an_earlier_one_is_read_as_that_one() -> None:
    body = "SELECT t.k AS k, AVG(t.v) AS a FROM t AS t GROUP BY t.k"
    sql = (
        f"WITH v1 AS ({body}), v2 AS ({body}), w AS (SELECT v2.k AS k FROM v2) "
        "SELECT v1.k, w.k, v2.a FROM v1 AS v1 JOIN w AS w ON v1.k = w.k JOIN v2 ON v2.k = w.k"
    )
    out = _shared(sql)
    assert [c.alias_or_name for c in out.find_all(exp.CTE)] == ["v1", "w"]
    # Each reader of v2 reads v1 under v2's name, which its columns use.
    assert {(t.name, t.alias_or_name) for t in out.find_all(exp.Table)} == {
        ("t", "t"),
        ("v1", "v1"),
        ("v1", "v2"),
        ("w", "w"),
    }


def test_equal_ctes_that_may_give_other_rows_stay_two() -> None:
    body = "SELECT t.k AS k FROM t AS t GROUP BY t.k LIMIT 3"
    sql = f"WITH v1 AS ({body}), v2 AS ({body}) SELECT v1.k FROM v1 AS v1, v2 AS v2"
    assert [c.alias_or_name for c in _shared(sql).find_all(exp.CTE)] == ["v1", "v2"]
