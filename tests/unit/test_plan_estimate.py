"""Size estimates from Parquet footers, and the join orders and exchanges they pick."""

from __future__ import annotations

import datetime as dt
import re

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
from helpers import assert_same_result, tpch_query
from plan_runner import run_plan

from mangonel.catalog import ColumnStats, Table, load_table
from mangonel.plan.estimate import Size, join_size, scan_size, selectivity
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import InputMode


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    n = 10_000
    path = tmp_path_factory.mktemp("est") / "t.parquet"
    start = dt.date(2000, 1, 1)
    pq.write_table(
        pa.table(
            {
                "id": pa.array(range(n), pa.int64()),
                "grp": pa.array([i % 20 for i in range(n)], pa.int32()),
                "day": pa.array([start + dt.timedelta(days=i % 1000) for i in range(n)]),
                "kind": pa.array([("red", "green", "blue", "cyan")[i % 4] for i in range(n)]),
            }
        ),
        path,
        row_group_size=2500,
    )
    return load_table("t", str(path))


def _sel(table: Table, cond: str) -> float:
    where = sqlglot.parse_one(f"SELECT 1 FROM t WHERE {cond}", read="duckdb").args["where"]
    return selectivity(where.this, table.stats, table.rows)


def test_footers_give_widths_ranges_and_distinct_counts(table: Table) -> None:
    assert table.stats["id"].width == 8 and table.stats["grp"].width == 4
    assert table.stats["id"].distinct(table.rows) == 10_000
    assert table.stats["grp"].distinct(table.rows) == 20
    assert table.stats["day"].distinct(table.rows) == 1000
    # from the size of the dictionary page: errs low, but the right magnitude
    kinds = table.stats["kind"].distinct(table.rows)
    assert kinds is not None and 1 <= kinds <= 10


def test_a_tables_distinct_counts_are_its_columns_estimates_with_their_nulls(
    table: Table,
) -> None:
    counts = table.distinct_counts
    assert counts["id"] == (10_000, 0) and counts["grp"] == (20, 0) and counts["day"] == (1000, 0)
    assert counts == {
        c: (st.distinct(table.rows), st.nulls)
        for c, st in table.stats.items()
        if st.distinct(table.rows) is not None
    }
    schema = pa.schema([("f", pa.float64())])
    floats = Table("f", "f.parquet", ("f.parquet",), schema, (), {"f": ColumnStats(8.0, 0.5, 2.5)})
    assert floats.distinct_counts == {}  # no estimate for a float column


def test_selectivity_of_ranges_equalities_and_lists(table: Table) -> None:
    # two bounds on one column make one interval: 100 of 999 days, not 0.9 * 0.1
    assert _sel(table, "day >= DATE '2000-03-01' AND day < DATE '2000-06-09'") == pytest.approx(
        0.1, abs=0.01
    )
    assert _sel(table, "grp = 3") == pytest.approx(1 / 20)
    assert _sel(table, "grp IN (1, 2, 3, 4)") == pytest.approx(4 / 20)
    assert _sel(table, "id < 2500") == pytest.approx(0.25, abs=0.01)
    assert _sel(table, "grp = 3 AND id < 5000") == pytest.approx(0.025, abs=0.001)
    assert _sel(table, "grp = 3 OR grp = 4") == pytest.approx(1 - 0.95 * 0.95)
    # what cannot be read keeps a third; nothing is ever below one row
    assert _sel(table, "length(kind) > id") == pytest.approx(1 / 3)
    assert _sel(table, "id < -5") == pytest.approx(1 / 10_000)


def test_a_negated_like_keeps_what_the_like_drops(table: Table) -> None:
    # sqlglot reads ``x NOT LIKE p`` as a LIKE with ``negate`` set, not a NOT over
    # it: TPC-H q13's orders were estimated at a tenth, and then too few to group
    # before their join (``plan.eager``).
    assert _sel(table, "kind LIKE '%e%'") == pytest.approx(0.1)
    assert _sel(table, "kind NOT LIKE '%e%'") == pytest.approx(0.9)
    assert _sel(table, "NOT kind LIKE '%e%'") == pytest.approx(0.9)
    assert _sel(table, "kind ILIKE '%E%'") == pytest.approx(1 / 3)
    assert _sel(table, "kind NOT ILIKE '%E%'") == pytest.approx(2 / 3)


def test_a_key_unique_on_one_side_keeps_the_other_sides_rows(table: Table) -> None:
    orders = scan_size(table, "o", sqlglot.parse_one("grp = 1", read="duckdb"))
    assert ("o", "id") in orders.unique and ("o", "grp") not in orders.unique
    lines = Size(50_000.0, {}, {("l", "order_id"): 10_000.0})
    key = [(sqlglot.parse_one("l.order_id"), sqlglot.parse_one("o.id"))]
    # 50k lines, of which the 1/20 whose order passed the filter
    assert join_size(lines, orders, key).rows == pytest.approx(2500)
    # no unique side: rows multiply, divided by the larger distinct count
    a = Size(1000.0, {}, {("a", "k"): 25.0})
    b = Size(400.0, {}, {("b", "k"): 25.0})
    ab = [(sqlglot.parse_one("a.k"), sqlglot.parse_one("b.k"))]
    assert join_size(a, b, ab).rows == pytest.approx(1000 * 400 / 25)


def test_a_side_has_no_more_distinct_keys_than_rows() -> None:
    # TPC-DS q72: d1 (one year, 363 days) joined with d2 on d_week_seq keeps 2,544
    # rows of d2, whose d_date_sk had 73,049 distinct values in its scan. Joined
    # with inventory on the date, every inventory row of those weeks matches; taken
    # as 73,049 dates, the join seemed to keep 1/30 of inventory and went first.
    d1 = Size(363.0, {("d1", "d_date_sk"): 0.005}, {("d1", "d_week_seq"): 363.0})
    d2 = Size(
        73049.0,
        {("d2", "d_date_sk"): 1.0},
        {("d2", "d_date_sk"): 73049.0, ("d2", "d_week_seq"): 10436.0},
    )
    weeks = [(sqlglot.parse_one("d1.d_week_seq"), sqlglot.parse_one("d2.d_week_seq"))]
    d1d2 = join_size(d1, d2, weeks)
    assert d1d2.rows == pytest.approx(363 * 7, rel=0.01)
    assert d1d2.distinct[("d2", "d_date_sk")] == d1d2.rows
    inventory = Size(11_745_000.0, {}, {("inventory", "inv_date_sk"): 1821.0})
    dates = [(sqlglot.parse_one("inventory.inv_date_sk"), sqlglot.parse_one("d2.d_date_sk"))]
    assert join_size(inventory, d1d2, dates).rows == pytest.approx(inventory.rows)
    # a side's own distinct bound, from a filter that kept fewer rows, is capped too
    filtered = Size(100.0, {}, {("d2", "d_date_sk"): 73049.0})
    assert join_size(inventory, filtered, dates).rows == pytest.approx(11_745_000 * 100 / 1821)


def test_a_filtered_dimension_keeps_its_share_of_the_keys_a_fact_table_spans() -> None:
    # TPC-DS SF1: inventory's dates span 1,821 of date_dim's 73,049 keys (5 of 200
    # years). d_year = 2001 keeps 1/201 of date_dim, and those 365 days lie within
    # the span: a fifth of inventory matches, not 1/201 (2.3M rows, not 58k).
    inventory = Size(
        11_745_000.0,
        {},
        {("inventory", "inv_date_sk"): 1821.0},
        {("inventory", "inv_date_sk"): 1821.0},
    )
    year = Size(
        73049 / 201,
        {("d", "d_date_sk"): 1 / 201},
        {("d", "d_date_sk"): 73049 / 201},
        {("d", "d_date_sk"): 73049.0},
    )
    dates = [(sqlglot.parse_one("inventory.inv_date_sk"), sqlglot.parse_one("d.d_date_sk"))]
    kept = join_size(inventory, year, dates)
    assert kept.rows == pytest.approx(11_745_000 * (73049 / 201) / 1821)
    # either way round
    flipped = [(b, a) for a, b in dates]
    assert join_size(year, inventory, flipped).rows == pytest.approx(kept.rows)
    # a filter that keeps more days than the span holds keeps every fact row, no more
    decade = Size(3650.0, {("d", "d_date_sk"): 0.05}, {}, {("d", "d_date_sk"): 73049.0})
    assert join_size(inventory, decade, dates).rows == pytest.approx(inventory.rows)
    # TPC-H's keys span their whole dimension (l_orderkey all of o_orderkey): the
    # surviving fraction, as without the rule
    lines = Size(6e6, {}, {("l", "l_orderkey"): 1.5e6}, {("l", "l_orderkey"): 1.5e6})
    orders = Size(
        3e5, {("o", "o_orderkey"): 0.2}, {("o", "o_orderkey"): 3e5}, {("o", "o_orderkey"): 1.5e6}
    )
    keys = [(sqlglot.parse_one("l.l_orderkey"), sqlglot.parse_one("o.o_orderkey"))]
    assert join_size(lines, orders, keys).rows == pytest.approx(6e6 * 0.2)


def test_a_scan_records_each_columns_span_before_its_filter(table: Table) -> None:
    # the span is the whole table's, whatever a filter keeps
    size = scan_size(table, "t", sqlglot.parse_one("grp = 1", read="duckdb"))
    assert size.domain[("t", "grp")] == 20 and size.domain[("t", "id")] == 10_000
    assert size.distinct[("t", "id")] == pytest.approx(500)


@pytest.mark.parametrize(
    ("cond", "column", "count"),
    [
        ("grp IN (1, 2, 3)", "grp", 3),
        ("(grp = 3 OR grp = 4) AND id < 5000", "grp", 2),
        ("kind = 'red' AND grp = 1", "kind", 1),
        ("day = DATE '2000-01-05'", "day", 1),
    ],
)
def test_a_filter_to_a_few_values_bounds_the_columns_distinct_count(
    table: Table, cond: str, column: str, count: int
) -> None:
    # an aggregate by such a column over the filtered rows makes that many groups
    # (TPC-DS q04: two of date_dim's 201 years), not the table's count of them
    size = scan_size(table, "t", sqlglot.parse_one(cond, read="duckdb"))
    assert size.distinct[("t", column)] == count
    assert size.domain[("t", column)] > count  # the span stays the table's


@pytest.mark.parametrize(
    "cond", ["grp > 3", "grp = 3 OR id = 4", "grp IN (SELECT 1)", "NOT grp = 3"]
)
def test_other_filters_leave_the_distinct_count_to_the_rows(table: Table, cond: str) -> None:
    size = scan_size(table, "t", sqlglot.parse_one(cond, read="duckdb"))
    assert size.distinct[("t", "grp")] == min(20, size.rows)


def test_q21_meets_the_filtered_nation_before_lineitem_is_shuffled(
    catalog: dict[str, Table],
) -> None:
    plan = plan_query(tpch_query(21), catalog)
    by_id = {s.id: s for s in plan.stages}
    first_lineitem = next(
        s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem"
    )
    # supplier joined with its filtered nation, scanned by the lineitem tasks: only
    # the line items of one nation's suppliers leave the stage
    assert {s.table for s in first_lineitem.side_scans} >= {"supplier", "nation"}
    assert "'SAUDI ARABIA'" in first_lineitem.sql
    # and broadcast from a stage of its own when small tables are not scanned so
    # (into several lineitem tasks: at SF 0.1 the default makes it one, and a side
    # of one task joined by one task is planned inside it, whatever its size),
    # nor computed again by each task
    plan = plan_query(
        tpch_query(21),
        catalog,
        PlannerConfig(inline_scan_bytes=0, split_rows=100_000, recompute_bytes=0),
    )
    by_id = {s.id: s for s in plan.stages}
    first_lineitem = next(
        s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem"
    )
    broadcast = [by_id[i.stage] for i in first_lineitem.inputs if i.mode is InputMode.ALL]
    # (nation's one task planned inside supplier's, the one task that joins it)
    assert any(
        s.label == "scan supplier → scan nation (filtered) → inner join" for s in broadcast
    ), plan.stages


def test_q5_broadcasts_its_small_sides_instead_of_shuffling_lineitem(
    catalog: dict[str, Table],
) -> None:
    # several lineitem tasks (at SF 0.1 the default makes it one)
    plan = plan_query(tpch_query(5), catalog, PlannerConfig(split_rows=100_000))
    lineitem = next(s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem")
    # every join runs where lineitem is read; only the partial aggregate is hashed
    assert lineitem.label.endswith("inner join → partial aggregate"), lineitem.label
    assert all(i.mode is InputMode.ALL for i in lineitem.inputs)


def test_q17_aggregates_only_the_lineitems_of_the_parts_it_keeps(
    catalog: dict[str, Table],
) -> None:
    # not scanned by each lineitem task, nor computed again by each; the semi join
    # keeps a thousandth of lineitem (the parts of one brand and container), too
    # few rows for a partial aggregate to pay
    config = PlannerConfig(split_rows=100_000, inline_scan_bytes=0, recompute_bytes=0)
    plan = plan_query(tpch_query(17), catalog, config)
    by_id = {s.id: s for s in plan.stages}
    aggregating = [s for s in plan.stages if s.label.startswith("scan lineitem → semi join")]
    assert len(aggregating) == 1, [s.label for s in plan.stages]
    assert any(
        s.label.startswith("aggregate") and s.inputs[0].stage == aggregating[0].id
        for s in plan.stages
    ), [s.label for s in plan.stages]
    (source,) = [by_id[i.stage] for i in aggregating[0].inputs]
    # the filtered parts (brand and container), broadcast into the lineitem scan
    assert source.scan is not None and source.scan.table == "part"
    assert "Brand#23" in source.sql and "MED BOX" in source.sql
    # or scanned by each lineitem task, where part is small enough
    plan = plan_query(tpch_query(17), catalog, PlannerConfig(split_rows=100_000))
    (aggregating,) = [
        s for s in plan.stages if s.label == "scan lineitem → scan part (filtered) → semi join"
    ]
    assert [s.table for s in aggregating.side_scans] == ["part"]
    assert not aggregating.inputs
    assert "Brand#23" in aggregating.sql and "MED BOX" in aggregating.sql


@pytest.mark.parametrize(
    "config",
    [PlannerConfig(split_rows=100_000, recompute_bytes=0), PlannerConfig(split_rows=100_000)],
    ids=["no-recompute", "default"],
)
def test_q20_aggregates_only_the_lineitems_of_the_forest_parts(
    config: PlannerConfig, catalog: dict[str, Table]
) -> None:
    # partsupp is filtered by ``ps_partkey IN (SELECT p_partkey ... 'forest%')`` alone:
    # the line items are reduced by that subquery on their own part key, with no
    # copy of partsupp (a stage more on the query's path at SF1 on two hosts), and
    # the subquery runs once, read by the lineitem tasks and the final task.
    plan = plan_query(tpch_query(20), catalog, config)
    (aggregating,) = [s for s in plan.stages if s.label.endswith("→ partial aggregate")]
    assert aggregating.scan is not None and aggregating.scan.table == "lineitem"
    assert aggregating.num_tasks > 1
    assert not aggregating.side_scans
    assert '"t"."lineitem.l_partkey" IN (' in aggregating.sql
    (subquery,) = [s for s in plan.stages if s.label == "subquery"]
    assert subquery.scan is not None and subquery.scan.table == "part"
    assert "'forest%'" in subquery.sql and "'forest%'" not in aggregating.sql
    assert [(i.stage, i.mode) for i in aggregating.inputs] == [(subquery.id, InputMode.ALL)]
    assert {i.stage for i in plan.final.inputs} == {aggregating.id, subquery.id}
    assert [s.table for s in plan.final.side_scans].count("partsupp") == 1  # scanned once


FOREST_PARTSUPP_TOTALS = """
    SELECT ps_partkey, ps_suppkey, ps_availqty, total
    FROM partsupp
    JOIN (SELECT l_partkey, l_suppkey, SUM(l_quantity) AS total
          FROM lineitem GROUP BY l_partkey, l_suppkey) AS sold
      ON ps_partkey = l_partkey AND ps_suppkey = l_suppkey
    WHERE ps_partkey IN (SELECT p_partkey FROM part WHERE p_name LIKE 'forest%'){more}"""


@pytest.mark.parametrize(
    ("more", "copied"),
    [("", False), (" AND ps_availqty > 5000", True)],
    ids=["key-in-alone", "with-a-filter-of-its-own"],
)
def test_an_aggregate_joined_back_is_reduced_by_the_subquery_on_its_key_alone(
    more: str, copied: bool, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Filtered by ``ps_partkey IN (subquery)`` alone, partsupp gives the line items
    # no keys the subquery does not: they are filtered by it on ``l_partkey``, with
    # no copy of partsupp. With a filter of partsupp's own besides, the copy keeps
    # fewer (part, supplier) pairs, and the line items are semi-joined with it.
    sql = FOREST_PARTSUPP_TOTALS.format(more=more)
    plan = plan_query(sql, catalog, PlannerConfig(split_rows=100_000))
    (aggregating,) = [s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem"]
    assert ("SEMI JOIN" in aggregating.sql) is copied, aggregating.sql
    assert ('"t"."lineitem.l_partkey" IN (' in aggregating.sql) is not copied, aggregating.sql
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 100
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_in_subquery_keeps_as_many_keys_as_the_subquery_has_rows(
    catalog: dict[str, Table],
) -> None:
    from mangonel.plan.estimate import FILTERED, Estimator
    from mangonel.plan.logical import Filter, Scan

    sub = Scan("part", "part", ["p_partkey"], None)
    est = Estimator(catalog, {"__sq1": sub})
    partsupp = Scan("partsupp", "ps", ["ps_partkey"], None)
    cond = sqlglot.parse_one(
        'SELECT 1 FROM ps WHERE "ps"."ps_partkey" IN (SELECT * FROM __sq1)', read="duckdb"
    ).args["where"]
    rows = est.size(partsupp).rows
    # every part: at most the share of an unreadable filter stays
    assert est.size(Filter(partsupp, cond.this)).rows == rows * FILTERED
    sub.filter = sqlglot.parse_one("p_partkey < 100", read="duckdb")
    kept = est.size(Filter(partsupp, cond.this.copy())).rows
    assert kept < rows * FILTERED / 10


def test_q21_reads_only_the_line_items_its_kept_orders_can_match(
    catalog: dict[str, Table],
) -> None:
    # EXISTS (l2) and NOT EXISTS (l3): the kept side (one nation's late line items)
    # is small, so each lineitem scan for l2 / l3 first semi-joins it.
    plan = plan_query(tpch_query(21), catalog, PlannerConfig(split_rows=100_000))
    by_id = {s.id: s for s in plan.stages}
    reducing = [
        s
        for s in plan.stages
        if s.scan is not None and s.scan.table == "lineitem" and s.label.endswith("semi join")
    ]
    assert len(reducing) == 2, [s.label for s in plan.stages]
    for stage in reducing:
        (kept,) = [by_id[i.stage] for i in stage.inputs]
        assert all(i.mode is InputMode.ALL for i in stage.inputs)
        # the kept side is also what the semi / anti join itself reads
        assert any(
            kept.id in s.upstream and "join" in s.label for s in plan.stages if s is not stage
        )


def test_a_small_side_that_cuts_a_big_one_is_joined_first(
    catalog: dict[str, Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    # q5: lineitem can first meet the suppliers of one region (a fifth of them) or
    # the year's orders (whose join keeps fewer rows). Both sides are small at
    # SF 0.1, and the orders go first; at SF10 the orders are 2.3M rows, above
    # REDUCER_ROWS (too many to broadcast), and lineitem must first be cut by the
    # suppliers where it is read: here with the threshold scaled down to match.
    from mangonel.plan import join_order
    from mangonel.plan.bind import Binder
    from mangonel.plan.estimate import Estimator
    from mangonel.plan.logical import Join, Node, Scan, walk
    from mangonel.plan.types import oracle_for
    from mangonel.sql.frontend import parse
    from mangonel.sql.optimize import optimize_query

    def first_partner_of_lineitem() -> set[str]:
        parsed = parse(tpch_query(5), set(catalog), None)
        oracle = oracle_for({t: catalog[t] for t in parsed.tables})
        schema: dict[str, object] = {t: oracle.table_types(t) for t in sorted(parsed.tables)}
        read = {t: catalog[t] for t in parsed.tables}
        binder = Binder(read)
        node, _ = binder.bind(optimize_query(parsed.query, schema, parsed.dialect))
        estimator = Estimator(read, binder.subqueries)
        node = join_order.order_joins(node, binder.subqueries, estimator)

        def tables(n: Node) -> set[str]:
            return {s.table for s in walk(n) if isinstance(s, Scan)}

        joins = [j for j in walk(node) if isinstance(j, Join)]
        first = min((j for j in joins if "lineitem" in tables(j)), key=lambda j: len(tables(j)))
        return tables(first.right) if "lineitem" in tables(first.left) else tables(first.left)

    assert "orders" in first_partner_of_lineitem()
    monkeypatch.setattr(join_order, "REDUCER_ROWS", 5_000)
    partner = first_partner_of_lineitem()
    assert "supplier" in partner and "orders" not in partner, partner


def test_ors_of_equalities_in_normal_form_are_counted_together(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Every (y, m) pair of 200 years and 12 months, 10 rows each: the columns are
    # independent, as the estimate assumes.
    path = tmp_path_factory.mktemp("joint") / "d.parquet"
    n = 24_000
    years = [1900 + i % 200 for i in range(n)]
    months = [1 + (i // 200) % 12 for i in range(n)]
    pq.write_table(pa.table({"y": years, "m": months}), path, row_group_size=6000)
    d = load_table("d", str(path))
    # sqlglot's normal form of TPC-DS q47's ``y = 1999 OR (y = 1998 AND m = 12)
    # OR (y = 2000 AND m = 1)``: four ORs, true together of a year and two months.
    cnf = sqlglot.parse_one(
        "SELECT 1 FROM d WHERE (m = 1 OR m = 12 OR y = 1999) AND (m = 1 OR y = 1998 OR "
        "y = 1999) AND (m = 12 OR y = 1999 OR y = 2000) AND (y IN (1998, 1999, 2000))",
        read="duckdb",
    )
    cond = cnf.args["where"].this
    actual = sum(
        1
        for y, m in zip(years, months, strict=True)
        if y == 1999 or (y == 1998 and m == 12) or (y == 2000 and m == 1)
    )
    assert actual == 140
    assert selectivity(cond, d.stats, d.rows) * n == pytest.approx(actual, rel=0.01)
    # One conjunct at a time, their product says under 2 rows.
    product = 1.0
    for c in cnf.args["where"].this.flatten():
        product *= selectivity(c, d.stats, d.rows)
    assert product * n < 2
    # A range among the ORs: conjuncts multiply as before.
    mixed = (
        sqlglot.parse_one(
            "SELECT 1 FROM d WHERE (m < 3 OR y = 1999) AND (m = 1 OR y = 1998)", read="duckdb"
        )
        .args["where"]
        .this
    )
    parts = [selectivity(c, d.stats, d.rows) for c in mixed.flatten()]
    assert selectivity(mixed, d.stats, d.rows) == pytest.approx(parts[0] * parts[1])


def test_a_full_join_builds_on_its_smaller_side(tmp_path_factory: pytest.TempPathFactory) -> None:
    # DuckDB builds a FULL join's hash table on its right side (the executors keep
    # its build-side rule off): the side written first, here the small one, goes
    # right. NULL and repeated keys on both sides keep rows of each unmatched.
    root = tmp_path_factory.mktemp("full")
    pq.write_table(
        pa.table({"k": [i % 40 if i % 9 else None for i in range(300)], "v": list(range(300))}),
        root / "small.parquet",
    )
    pq.write_table(
        pa.table({"k": [i % 70 if i % 7 else None for i in range(3000)], "w": list(range(3000))}),
        root / "big.parquet",
    )
    catalog = {n: load_table(n, str(root / f"{n}.parquet")) for n in ("small", "big")}
    sql = (
        "SELECT s.k AS sk, b.k AS bk, count(*) AS n, sum(s.v) AS v, sum(b.w) AS w "
        "FROM small s FULL JOIN big b ON s.k = b.k GROUP BY ALL"
    )
    plan = plan_query(sql, catalog)
    (stage,) = plan.stages
    scans = {s.name: s.table for s in [stage.scan, *stage.side_scans] if s is not None}
    built = re.search(r'FULL JOIN.*?FROM "(__scan\d*)"', stage.sql, re.S)
    assert built is not None and scans[built.group(1)] == "small", stage.sql
    con = duckdb.connect()
    for n in ("small", "big"):
        con.execute(f"CREATE VIEW {n} AS SELECT * FROM read_parquet('{root / n}.parquet')")
    expected = con.sql(sql).to_arrow_table()
    assert None in expected.column("sk").to_pylist() and None in expected.column("bk").to_pylist()
    assert_same_result(run_plan(plan), expected, ordered=False)
