"""Only the columns the plan above reads cross an exchange (``logical.required_columns``)."""

from __future__ import annotations

import duckdb
import pytest
from helpers import assert_same_result, tpch_query
from plan_runner import run_plan
from sqlglot import exp

from mangonel.catalog import Table
from mangonel.errors import InternalError, QueryError
from mangonel.plan import planner
from mangonel.plan.distribute import Distributor
from mangonel.plan.logical import (
    Aggregate,
    Filter,
    Join,
    JoinKind,
    Project,
    Scan,
    Sort,
    required_columns,
)
from mangonel.plan.planner import PlannerConfig, plan_query

CTE_READ_BY_THREE_BRANCHES = """
WITH results AS (
    SELECT o_orderpriority, n_name, o_totalprice AS price
    FROM orders, customer, nation
    WHERE o_custkey = c_custkey AND c_nationkey = n_nationkey{filter})
SELECT o_orderpriority, n_name, 0 AS g, AVG(price) AS p
FROM results GROUP BY o_orderpriority, n_name
UNION ALL
SELECT o_orderpriority, NULL, 1, AVG(price) FROM results GROUP BY o_orderpriority
UNION ALL
SELECT NULL, NULL, 2, AVG(price) FROM results"""
"""TPC-DS q27's shape: a CTE that joins and does not aggregate, read by UNION ALL
branches that group by different keys (one of them does not read n_name). Without
a filter it is computed for each reader; with one (q27's), once for all."""


def _c(table: str, name: str) -> exp.Column:
    return exp.column(name, table=table, quoted=True)


def test_each_node_needs_what_its_parents_read() -> None:
    t = Scan("t", "t", ["k", "a", "b", "f"], None)
    u = Scan("u", "u", ["k", "c", "d"], None)
    filtered = Filter(t, exp.GT(this=_c("t", "f"), expression=exp.Literal.number(1)))
    joined = Join(filtered, u, JoinKind.INNER, [_c("t", "k")], [_c("u", "k")])
    agg = Aggregate(joined, "g", [("a", _c("t", "a"))], [("s", exp.Sum(this=_c("u", "c")))])
    top = Sort(Project(agg, "p", [("x", _c("g", "s"))]), [exp.Ordered(this=_c("p", "x"))], 5)
    needs = required_columns(top)
    assert needs[top] == {("p", "x")}
    assert needs[agg] == {("g", "s")}  # the group key is not read above
    assert needs[joined] == {("t", "a"), ("u", "c")}
    assert needs[filtered] == {("t", "a"), ("t", "k")}
    assert needs[t] == {("t", "a"), ("t", "k"), ("t", "f")}
    assert needs[u] == {("u", "c"), ("u", "k")}


def test_a_column_only_a_filter_reads_stays_in_its_stage(catalog: dict[str, Table]) -> None:
    # q13: orders LEFT JOIN ... ON o_comment NOT LIKE ...: o_comment is read by the
    # filter in the orders scan, and must not be shuffled to the join.
    plan = plan_query(tpch_query(13), catalog, PlannerConfig(partitions=2, partition_bytes=0))
    (orders,) = [s for s in plan.stages if s.scan is not None and s.scan.table == "orders"]
    assert "o_comment" in orders.scan.columns
    # It writes the orders counted by customer (``plan.eager``): key and count.
    assert len(orders.columns) == 2
    assert not any("o_comment" in c for c in orders.columns), orders.columns


def test_q15_computes_its_revenue_view_once(catalog: dict[str, Table]) -> None:
    # revenue0 (a CTE that aggregates lineitem) is read by the query and by its
    # MAX subquery: one stage computes it, both read its output, where its
    # readers do not compute it again (``recompute_bytes=0``). The subquery is
    # one task read only by the query's one final task, which computes it itself.
    config = PlannerConfig(split_rows=100_000, recompute_bytes=0)
    plan = plan_query(tpch_query(15), catalog, config)
    lineitem = [s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem"]
    assert len(lineitem) == 1
    (aggregate,) = [s for s in plan.stages if lineitem[0].id in s.upstream]
    readers = [s for s in plan.stages if aggregate.id in s.upstream]
    assert readers == [plan.final], [s.label for s in plan.stages]
    assert plan.final.sql.count(f'FROM "s{aggregate.id}"') == 2, plan.final.sql


def test_q15_final_task_computes_the_revenue_view_for_both_readers(
    catalog: dict[str, Table],
) -> None:
    # revenue0's final aggregate (one task over the partial sums of a few thousand
    # suppliers) costs less than a stage between the partial aggregate and the
    # final task: that task computes it for the join and for the MAX subquery,
    # reading the partial sums once.
    plan = plan_query(tpch_query(15), catalog, PlannerConfig(split_rows=100_000))
    (lineitem,) = [s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem"]
    assert lineitem.num_tasks > 1
    assert [s.id for s in plan.stages] == [lineitem.id, plan.final.id]
    assert [i.stage for i in plan.final.inputs] == [lineitem.id]
    assert plan.final.sql.count(f'FROM "s{lineitem.id}"') == 2, plan.final.sql


def test_a_filtered_join_read_by_three_branches_is_computed_once(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q27 (DuckDB's text): the join keeps one region's orders; computed for
    # each of the three readers, it scanned orders three times.
    sql = CTE_READ_BY_THREE_BRANCHES.format(filter=" AND n_regionkey = 1")
    config = PlannerConfig(partitions=3, partition_bytes=0, split_rows=20_000)
    plan = plan_query(sql, catalog, config)
    assert not plan.notes, plan.notes
    orders = [s for s in plan.stages if s.scan is not None and s.scan.table == "orders"]
    assert len(orders) == 1, [s.label for s in plan.stages]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 5
    assert_same_result(run_plan(plan), expected, ordered=False, check_names=False)


def test_a_cte_copy_renders_only_the_columns_its_reader_needs(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # A CTE that joins without a filter is bound again for each reader, so each
    # copy has needs of its own. The branch that groups by o_orderpriority
    # alone does not read n_name: with hash joins only, the nation side's stage
    # dropped it, and the copy's projection still named it ("Referenced table
    # nation not found").
    sql = CTE_READ_BY_THREE_BRANCHES.format(filter="")
    config = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=20_000)
    plan = plan_query(sql, catalog, config)
    assert not plan.notes, plan.notes
    nation = [s for s in plan.stages if s.scan is not None and s.scan.table == "nation"]
    assert len(nation) == 3  # one copy per reader, each hashed to its join
    # the copy that groups by n_name ships it; the others only the join key
    assert sorted(len(s.columns) for s in nation) == [1, 1, 2]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 5
    assert_same_result(run_plan(plan), expected, ordered=False, check_names=False)


def test_a_planner_bug_is_an_internal_error_not_the_users(
    catalog: dict[str, Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Undo the fix above (and the logical plan's pruning of unread columns, which
    # now drops them before the distributor sees them): the copy's projection
    # names a column its stage dropped, and the planner's own type check of that
    # SQL fails. The query binds as a whole, so the user must not be told to fix it.
    monkeypatch.setattr(Distributor, "_needed_items", lambda self, n: n.items)
    monkeypatch.setattr(planner, "prune_columns", lambda root, subqueries: None)
    config = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=20_000)
    with pytest.raises(InternalError, match="bug in mangonel, not in the query") as info:
        plan_query(CTE_READ_BY_THREE_BRANCHES.format(filter=""), catalog, config)
    assert not isinstance(info.value, QueryError)
    assert 'Referenced table "nation" not found' in str(info.value)
    assert "report it" in str(info.value)


def test_a_cte_read_only_by_subqueries_reads_only_the_columns_they_use(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q95's shape: the front end hides uncorrelated subqueries from sqlglot's
    # rules, so its projection pushdown never saw a reader of the CTE, which kept
    # every column of both lineitem copies (16 each) to use two.
    sql = """
        WITH pairs AS (
            SELECT l1.l_orderkey, l1.l_suppkey AS s1, l2.l_suppkey AS s2
            FROM lineitem l1, lineitem l2
            WHERE l1.l_orderkey = l2.l_orderkey AND l1.l_suppkey <> l2.l_suppkey)
        SELECT o_orderpriority, COUNT(*) AS n FROM orders
        WHERE o_orderkey IN (SELECT l_orderkey FROM pairs) AND o_orderstatus = 'F'
        GROUP BY o_orderpriority"""
    plan = plan_query(sql, catalog, PlannerConfig(partitions=3, split_rows=20_000))
    assert not plan.notes, plan.notes
    reads = [
        sorted(s.columns)
        for stage in plan.stages
        for s in ([stage.scan] if stage.scan is not None else []) + list(stage.side_scans)
        if s.table == "lineitem"
    ]
    assert reads and all(r == ["l_orderkey", "l_suppkey"] for r in reads), reads
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 1
    assert_same_result(run_plan(plan), expected, ordered=False)
