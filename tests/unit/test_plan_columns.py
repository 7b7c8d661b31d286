"""Only the columns the plan above reads cross an exchange (``logical.required_columns``)."""

from __future__ import annotations

from helpers import tpch_query
from sqlglot import exp

from mangonel.catalog import Table
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
    assert orders.columns == ("orders.o_orderkey", "orders.o_custkey")


def test_q15_computes_its_revenue_view_once(catalog: dict[str, Table]) -> None:
    # revenue0 (a CTE that aggregates lineitem) is read by the query and by its
    # MAX subquery: one stage computes it, both read its output.
    plan = plan_query(tpch_query(15), catalog, PlannerConfig(split_rows=100_000))
    lineitem = [s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem"]
    assert len(lineitem) == 1
    (aggregate,) = [s for s in plan.stages if lineitem[0].id in s.upstream]
    readers = [s for s in plan.stages if aggregate.id in s.upstream]
    assert len(readers) == 2, [s.label for s in plan.stages]
