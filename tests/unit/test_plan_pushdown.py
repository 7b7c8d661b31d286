"""Filters pushed below projections, aggregates and joins (``plan.pushdown``).

Each case checks where the filter lands in the bound plan (on the scan, or left
above the node it may not cross) and that the distributed plan, run task by task
(``plan_runner``), answers as single-process DuckDB does.
"""

from __future__ import annotations

import duckdb
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.bind import Binder
from mangonel.plan.logical import Filter, Node, Scan, walk
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.plan.pushdown import push_filters
from mangonel.plan.types import oracle_for
from mangonel.sql.frontend import parse
from mangonel.sql.optimize import _derived_tables_only, optimize_query

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, split_rows=20_000)


def _bound(sql: str, catalog: dict[str, Table]) -> Node:
    parsed = parse(sql, set(catalog))
    oracle = oracle_for({t: catalog[t] for t in parsed.tables})
    schema: dict[str, object] = {t: oracle.table_types(t) for t in sorted(parsed.tables)}
    binder = Binder({t: catalog[t] for t in parsed.tables})
    node, _ = binder.bind(optimize_query(parsed.query, schema, parsed.dialect))
    return push_filters(node, binder.subqueries)


def _scan_filters(node: Node, table: str) -> list[str]:
    return [
        s.filter.sql() if s.filter is not None else ""
        for s in walk(node)
        if isinstance(s, Scan) and s.table == table
    ]


def _check(sql: str, catalog: dict[str, Table], ref: duckdb.DuckDBPyConnection) -> None:
    plan = plan_query(sql, catalog, CONFIG)
    assert plan.notes == ()  # distributed, not run whole
    expected = ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_filter_on_a_group_key_goes_below_the_aggregate(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """
        WITH s AS (SELECT l_suppkey, l_shipmode, SUM(l_quantity) AS q, COUNT(*) AS n
                   FROM lineitem GROUP BY l_suppkey, l_shipmode)
        SELECT l_suppkey, q, n FROM s WHERE l_shipmode = 'AIR' AND n > 5"""
    node = _bound(sql, catalog)
    (scan,) = _scan_filters(node, "lineitem")
    assert "'AIR'" in scan
    # the condition on an aggregate stays above it
    above = [f.condition.sql() for f in walk(node) if isinstance(f, Filter)]
    assert any("> 5" in c for c in above) and not any("AIR" in c for c in above)
    _check(sql, catalog, duckdb_ref)


def test_a_filter_crosses_a_left_join_key_from_the_preserved_side(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q78's shape: two aggregates outer-joined on their keys, filtered on one
    sql = """
        WITH a AS (SELECT o_custkey AS k, o_orderpriority AS p, COUNT(*) AS n
                   FROM orders GROUP BY o_custkey, o_orderpriority),
             b AS (SELECT c_custkey AS k, c_mktsegment AS m, COUNT(*) AS n
                   FROM customer GROUP BY c_custkey, c_mktsegment)
        SELECT a.k, a.p, a.n, b.m FROM a LEFT JOIN b ON a.k = b.k
        WHERE a.k < 300"""
    node = _bound(sql, catalog)
    assert "< 300" in _scan_filters(node, "orders")[0]
    assert "< 300" in _scan_filters(node, "customer")[0]
    _check(sql, catalog, duckdb_ref)


def test_a_filter_on_the_null_padded_side_stays_above_the_left_join(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """
        SELECT c.c_custkey, o.o_orderkey
        FROM customer c LEFT JOIN (SELECT o_custkey, o_orderkey FROM orders
                                   WHERE o_orderpriority = '1-URGENT') o
          ON c.c_custkey = o.o_custkey
        WHERE o.o_custkey IS NULL OR o.o_custkey < 50"""
    node = _bound(sql, catalog)
    assert _scan_filters(node, "customer") == [""]  # a NULL-padded row's test, not a key's
    _check(sql, catalog, duckdb_ref)


def test_inner_join_keys_carry_a_filter_both_ways(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """
        SELECT c_name, o_orderkey FROM orders, customer
        WHERE o_custkey = c_custkey AND c_custkey BETWEEN 10 AND 40"""
    node = _bound(sql, catalog)
    assert "BETWEEN 10 AND 40" in _scan_filters(node, "orders")[0]
    _check(sql, catalog, duckdb_ref)


@pytest.mark.parametrize(
    "sql",
    [
        # a rolled-up row is not a group of the rows under it
        """SELECT * FROM (SELECT n_regionkey, n_name, COUNT(*) AS c FROM nation
                          GROUP BY ROLLUP (n_regionkey, n_name)) t WHERE n_name IS NULL""",
        # a rank counts the rows a filter below it would take away
        """SELECT * FROM (SELECT n_name, n_regionkey,
                                 RANK() OVER (ORDER BY n_nationkey) AS r FROM nation) t
           WHERE n_regionkey = 1""",
        # the first ten, then the filter
        """SELECT * FROM (SELECT n_name, n_regionkey FROM nation ORDER BY n_name LIMIT 10) t
           WHERE n_regionkey = 1""",
    ],
    ids=["rollup", "window", "limit"],
)
def test_a_filter_stays_above_what_it_may_not_cross(
    sql: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    assert _scan_filters(_bound(sql, catalog), "nation") == [""]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    assert_same_result(run_plan(plan_query(sql, catalog, CONFIG)), expected, ordered=False)


def test_a_shared_aggregate_keeps_every_readers_rows(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # the CTE aggregates once for both readers: neither reader's filter may go into it
    sql = """
        WITH s AS (SELECT o_custkey AS k, o_orderstatus AS st, COUNT(*) AS n
                   FROM orders GROUP BY o_custkey, o_orderstatus)
        SELECT x.k, x.n, y.n AS m FROM s x JOIN s y ON x.k = y.k
        WHERE x.st = 'F' AND y.st = 'O'"""
    _check(sql, catalog, duckdb_ref)


def test_derived_tables_alone_take_the_short_rule_path(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q21's shape: nothing nested but derived tables, so the front end skips
    # sqlglot's decorrelating and pushing rules; the binder still pushes the outer
    # filter on a group key to the scan, constant arithmetic inside the derived
    # table is still folded (the estimates read the date), the condition on an
    # aggregate stays above it, and a derived table joined to another still merges.
    sql = """
        SELECT * FROM (SELECT l_suppkey, l_shipmode, SUM(l_quantity) AS q
                       FROM lineitem
                       WHERE l_shipdate < DATE '1995-01-01' + INTERVAL 1 YEAR
                       GROUP BY l_suppkey, l_shipmode) x
                 JOIN (SELECT s_suppkey, s_name FROM supplier) s ON x.l_suppkey = s.s_suppkey
        WHERE x.l_shipmode = 'AIR' AND x.q > 100"""
    assert _derived_tables_only(parse(sql, set(catalog)).query) is True
    node = _bound(sql, catalog)
    (scan,) = _scan_filters(node, "lineitem")
    assert "'AIR'" in scan and "1996-01-01" in scan and "INTERVAL" not in scan
    above = [f.condition.sql() for f in walk(node) if isinstance(f, Filter)]
    assert any("> 100" in c for c in above)
    _check(sql, catalog, duckdb_ref)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT n_name FROM nation", False),
        ("SELECT * FROM (SELECT n_name FROM nation) t", True),
        (
            "SELECT * FROM nation JOIN (SELECT r_regionkey FROM region) r"
            " ON n_regionkey = r_regionkey",
            True,
        ),
        # a subquery expression, a CTE, a set operation and a LATERAL need the full path
        ("SELECT n_name FROM nation WHERE n_regionkey IN (SELECT r_regionkey FROM region)", None),
        ("WITH t AS (SELECT n_name FROM nation) SELECT * FROM t", None),
        ("SELECT * FROM (SELECT n_name FROM nation UNION ALL SELECT r_name FROM region) t", None),
        ("SELECT * FROM (SELECT n_name FROM nation) a, LATERAL (SELECT a.n_name AS m) b", None),
        ("SELECT * FROM (SELECT (SELECT MAX(r_regionkey) FROM region) AS m FROM nation) t", None),
    ],
    ids=["one-select", "derived", "derived-join", "in", "cte", "union", "lateral", "scalar"],
)
def test_which_queries_nest_only_derived_tables(
    sql: str, expected: bool | None, catalog: dict[str, Table]
) -> None:
    assert _derived_tables_only(parse(sql, set(catalog)).query) is expected


def test_a_where_over_one_table_keeps_its_own_and_the_pushed_conditions(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The derived table's WHERE is set aside while sqlglot pushes predicates (it has
    # nowhere to go) and comes back folded, joined with the outer condition pushed
    # into it; the IN subquery sends the query down the full rule path.
    sql = """
        SELECT * FROM (SELECT n_name, n_regionkey, n_nationkey FROM nation
                       WHERE n_nationkey < 20 + 1 OR n_name = 'CHINA') t
        WHERE t.n_regionkey >= 1
          AND t.n_regionkey IN (SELECT r_regionkey FROM region WHERE r_name <> 'ASIA')"""
    assert _derived_tables_only(parse(sql, set(catalog)).query) is None
    (scan,) = _scan_filters(_bound(sql, catalog), "nation")
    assert "< 21" in scan and "'CHINA'" in scan and ">= 1" in scan
    _check(sql, catalog, duckdb_ref)
