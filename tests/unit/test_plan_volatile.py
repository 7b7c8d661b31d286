"""What draws random values is drawn once, however the plan is split.

A subquery, CTE or derived table that calls ``random()`` gives other rows each
time it runs. DuckDB runs it once per query: a sample ``ORDER BY random() LIMIT
10`` joined with ``lineitem`` is ten parts, a CTE read twice is one draw, a
filter ``random() < 0.5`` on ``orders`` keeps or drops an order with all of its
line items. The planner computes such a part of the plan in one task and lets
the others read its output: not in each task that joins it (a small table is
scanned by every task that joins it, a cheap producer computed again by each
reader), not in two stages because two subqueries read the same, not merged
into the query above it by sqlglot's rules, not copied into a semi-join
reduction's filter. Each plan runs task by task (``plan_runner``), and what
it returns is checked against single-process DuckDB: the keys drawn are as many
as the query asks for at most, and every row of theirs is there.
"""

from __future__ import annotations

from dataclasses import replace

import duckdb
import pyarrow as pa
import pytest
from helpers import assert_same_result
from plan_runner import run_plan
from sqlglot import exp

from mangonel.catalog import Table
from mangonel.plan.distribute.reductions import Reductions
from mangonel.plan.distribute.shared import SharedNodes
from mangonel.plan.distribute.stages import StageBuilder
from mangonel.plan.estimate import Estimator
from mangonel.plan.logical import Aggregate, Filter, Join, JoinKind, Scan, volatile, walk
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import InputMode

BASE = PlannerConfig(partitions=3, partition_bytes=0, split_rows=150_000)
CONFIGS = {
    # A small table is scanned by every task that joins it.
    "inline": BASE,
    # Not for its size alone: a one-task producer is computed again by each reader.
    "recompute": replace(BASE, inline_scan_bytes=0),
}

SAMPLE = "SELECT p_partkey FROM part WHERE p_size = 3 ORDER BY random() LIMIT 10"


def _keys(table: pa.Table, column: str) -> list[int]:
    return sorted(set(table.column(column).to_pylist()))


def _lineitem_stage(plan: object) -> object:
    (stage,) = [
        s
        for s in plan.stages  # type: ignore[attr-defined]
        if s.scan is not None and s.scan.table == "lineitem"
    ]
    return stage


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_a_sample_joined_by_several_tasks_is_drawn_once(
    config: PlannerConfig, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = (
        "SELECT l_orderkey, l_linenumber, l_partkey FROM lineitem "
        f"JOIN ({SAMPLE}) p ON l_partkey = p.p_partkey"
    )
    plan = plan_query(sql, catalog, config)
    lineitem = _lineitem_stage(plan)
    assert lineitem.num_tasks > 1  # type: ignore[attr-defined]
    # part is scanned in a stage of its own, which every lineitem task reads.
    assert not lineitem.side_scans  # type: ignore[attr-defined]
    assert [i.mode for i in lineitem.inputs] == [InputMode.ALL]  # type: ignore[attr-defined]
    actual = run_plan(plan)
    keys = _keys(actual, "l_partkey")
    assert 0 < len(keys) <= 10, keys
    # Every line item of the parts drawn, each once.
    expected = duckdb_ref.sql(
        "SELECT l_orderkey, l_linenumber, l_partkey FROM lineitem "
        f"WHERE l_partkey IN {tuple(keys) + (-1,)} "
        "AND l_partkey IN (SELECT p_partkey FROM part WHERE p_size = 3)"
    ).to_arrow_table()
    assert_same_result(actual, expected, ordered=False)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_a_sampling_cte_read_twice_is_one_draw(
    config: PlannerConfig, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = (
        f"WITH s AS ({SAMPLE}) "
        "SELECT 'l' AS side, l_partkey AS k FROM lineitem "
        "WHERE l_partkey IN (SELECT p_partkey FROM s) "
        "UNION ALL SELECT 'ps', ps_partkey FROM partsupp "
        "WHERE ps_partkey IN (SELECT p_partkey FROM s)"
    )
    plan = plan_query(sql, catalog, config)
    parts = [s for s in plan.stages if s.scan is not None and s.scan.table == "part"]
    parts += [s for s in plan.stages if any(x.table == "part" for x in s.side_scans)]
    assert len(parts) == 1, [s.label for s in plan.stages]
    actual = run_plan(plan)
    keys = _keys(actual, "k")
    assert 0 < len(keys) <= 10, keys
    drawn = tuple(keys) + (-1,)
    expected = duckdb_ref.sql(
        f"SELECT 'l' AS side, l_partkey AS k FROM lineitem WHERE l_partkey IN {drawn} "
        f"UNION ALL SELECT 'ps', ps_partkey FROM partsupp WHERE ps_partkey IN {drawn}"
    ).to_arrow_table()
    assert_same_result(actual, expected, ordered=False)


def test_a_cte_that_draws_in_a_subquery_of_its_own_is_one_draw(
    catalog: dict[str, Table],
) -> None:
    # Its draw is in a lifted subquery, not under the CTE's own nodes: the CTE is
    # still one node, computed once for both readers (DuckDB gives a = b).
    sql = (
        "WITH s AS (SELECT p_partkey FROM part "
        "WHERE p_size < (SELECT 1 + floor(random() * 50))) "
        "SELECT (SELECT count(*) FROM s) AS a, (SELECT count(*) FROM s) AS b"
    )
    for _ in range(3):
        (row,) = run_plan(plan_query(sql, catalog, BASE)).to_pylist()
        assert row["a"] == row["b"], row


def test_a_table_sample_samples(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # ``TABLESAMPLE`` on a FROM item was dropped: every row came back. The query
    # now runs whole in one task, where DuckDB samples (10% of 600,572 rows:
    # about 60,057, a standard deviation of 232).
    sql = "SELECT count(*) AS n FROM lineitem TABLESAMPLE BERNOULLI (10 PERCENT)"
    plan = plan_query(sql, catalog, BASE)
    (row,) = run_plan(plan).to_pylist()
    assert 57_000 < row["n"] < 63_000, row
    (reference,) = duckdb_ref.sql(sql).fetchall()
    assert 57_000 < reference[0] < 63_000
    joined = (
        "SELECT count(*) AS n FROM orders JOIN lineitem TABLESAMPLE BERNOULLI (10 PERCENT) "
        "ON o_orderkey = l_orderkey"
    )
    (row,) = run_plan(plan_query(joined, catalog, BASE)).to_pylist()
    assert 57_000 < row["n"] < 63_000, row


def test_the_same_sampling_subquery_twice_is_two_draws(catalog: dict[str, Table]) -> None:
    # Two subqueries of the same text are one stage (``test_plan_same_subquery``),
    # unless they draw: DuckDB draws ``(SELECT random()) = (SELECT random())`` twice.
    # (A CTE that draws, read by two subqueries, is one node: one stage, one draw.)
    one = "(SELECT max(p_partkey) FROM (SELECT p_partkey FROM part ORDER BY random() LIMIT 3))"
    sql = f"SELECT COUNT(*) AS n FROM lineitem WHERE l_partkey = {one} OR l_suppkey = {one}"
    plan = plan_query(sql, catalog, replace(BASE, recompute_bytes=0))
    assert _lineitem_stage(plan).num_tasks > 1  # type: ignore[attr-defined]
    assert sum(s.label == "subquery" for s in plan.stages) == 2, [s.label for s in plan.stages]


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_a_random_filter_in_a_derived_table_keeps_or_drops_each_row_once(
    config: PlannerConfig, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Merged into the join above it (sqlglot's ``merge_subqueries``), the filter
    # drew once per line item: an order's line items kept or dropped one by one.
    sql = (
        "SELECT l_orderkey, COUNT(*) AS n FROM lineitem "
        "JOIN (SELECT o_orderkey FROM orders WHERE random() < 0.5) o ON l_orderkey = o.o_orderkey "
        "GROUP BY l_orderkey"
    )
    plan = plan_query(sql, catalog, config)
    actual = run_plan(plan)
    kept = actual.column("l_orderkey").to_pylist()
    assert 0 < len(kept) < 150_000
    duckdb_ref.register("kept_orders", pa.table({"k": pa.array(kept, pa.int64())}))
    try:
        expected = duckdb_ref.sql(
            "SELECT l_orderkey, COUNT(*) AS n FROM lineitem "
            "WHERE l_orderkey IN (SELECT k FROM kept_orders) GROUP BY l_orderkey"
        ).to_arrow_table()
    finally:
        duckdb_ref.unregister("kept_orders")
    assert_same_result(actual, expected, ordered=False)


def test_a_random_column_read_twice_is_one_draw(catalog: dict[str, Table]) -> None:
    sql = (
        "SELECT COUNT(*) FILTER (WHERE r <> r2) AS differ, COUNT(*) AS n "
        "FROM (SELECT r, r AS r2 FROM (SELECT o_orderkey, random() AS r FROM orders))"
    )
    actual = run_plan(plan_query(sql, catalog, BASE))
    assert actual.to_pylist() == [{"differ": 0, "n": 150_000}]


def test_a_random_condition_is_not_copied_into_a_reduction(catalog: dict[str, Table]) -> None:
    # TPC-H q17's shape, built as the planner sees it: lineitem's average quantity
    # per part, joined with the parts of one brand that a random condition keeps.
    # The aggregate's input is cut by a semi join with those parts
    # (``Reductions.reduce_aggregate_input``), a copy of their filter: a
    # condition that draws would draw again there, so the copy leaves it out.
    lineitem = Scan("lineitem", "lineitem", ["l_partkey", "l_quantity"])
    key = exp.column("l_partkey", table="lineitem", quoted=True)
    agg = Aggregate(
        lineitem,
        "_agg1",
        [("g0", key)],
        [("a0", exp.Avg(this=exp.column("l_quantity", table="lineitem", quoted=True)))],
    )
    brand = exp.EQ(
        this=exp.column("p_brand", table="part", quoted=True),
        expression=exp.Literal.string("Brand#23"),
    )
    draw = exp.LT(
        this=exp.Rand(),
        expression=exp.Div(
            this=exp.column("p_size", table="part", quoted=True), expression=exp.Literal.number(50)
        ),
    )
    part = Filter(Scan("part", "part", ["p_partkey", "p_brand", "p_size"], brand), draw)
    stages = StageBuilder(catalog, 3, None, 0)
    reductions = Reductions(Estimator(catalog), stages, SharedNodes(stages), iter(range(1, 9)), 1)
    reductions.reduce_aggregate_input(
        agg, [exp.column("g0", table="_agg1", quoted=True)],
        part, [exp.column("p_partkey", table="part", quoted=True)],
    )  # fmt: skip
    assert isinstance(agg.child, Join) and agg.child.kind is JoinKind.SEMI
    copied = [n for n in walk(agg.child.right)]
    assert any(isinstance(n, Scan) and n.table == "part" for n in copied)
    # The brand is copied; the draw stays where it was, once.
    assert "Brand#23" in " ".join(
        n.filter.sql() for n in copied if isinstance(n, Scan) and n.filter is not None
    )
    assert not any(volatile(n) for n in copied)
    assert volatile(part)
