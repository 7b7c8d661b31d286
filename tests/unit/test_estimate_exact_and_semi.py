"""Estimates that see what a filter on a tiny table and a semi / anti join really keep.

A tiny table under a filter is counted by the plan-time probe (``plan.tiny``); a
semi join keeps the share of the left side's key values that the right side's
values cover, an anti join the rest (``estimate.semi_kept``). TPC-H SF 0.1 data,
the real probe; every count checked against DuckDB on the same files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query
from plan_runner import run_plan
from sqlglot import exp

from mangonel.catalog import Table
from mangonel.plan import tiny
from mangonel.plan.estimate import ANTI_KEEPS, FILTERED, Estimator, Size, semi_kept
from mangonel.plan.logical import Join, JoinKind, Scan
from mangonel.plan.planner import PlannerConfig, plan_query, warm_up
from mangonel.plan.probe import Probe
from mangonel.plan.tiny import Tiny


@pytest.fixture(scope="module")
def probe() -> Iterator[Probe]:
    p = Probe()
    yield p
    p.close()


def _scan(table: str, columns: list[str], condition: str | None) -> Scan:
    """A scan of ``table`` under ``condition``, its columns qualified by the table."""
    where = None
    if condition is not None:
        where = sqlglot.parse_one(condition, read="duckdb")
        for c in where.find_all(exp.Column):
            c.set("table", exp.to_identifier(table))
    return Scan(table, table, columns, where)


def _count(tpch_dir: Path, table: str, condition: str) -> int:
    sql = f"SELECT count(*) FROM '{tpch_dir / table}.parquet' WHERE {condition}"
    return int(duckdb.sql(sql).fetchall()[0][0])


def test_a_tiny_tables_filter_is_counted_exactly(
    catalog: dict[str, Table], probe: Probe, tpch_dir: Path
) -> None:
    scan = _scan("region", ["r_regionkey", "r_name"], "r_name = 'ASIA'")
    guessed = Estimator(catalog).size(scan)
    counted = Estimator(catalog, exact=Tiny(catalog, probe)).size(scan)
    assert _count(tpch_dir, "region", "r_name = 'ASIA'") == 1
    # the footers' dictionary page takes r_name for about two values of five
    assert guessed.rows > 1.5
    assert counted.rows == 1.0
    # r_regionkey stays unique, one fifth of the table now
    assert counted.unique[("region", "r_regionkey")] == pytest.approx(0.2)
    # an IN list, and a filter that keeps nothing (at least a row, as everywhere)
    scan = _scan("nation", ["n_nationkey", "n_name"], "n_name IN ('FRANCE', 'GERMANY', 'X')")
    assert Estimator(catalog, exact=Tiny(catalog, probe)).size(scan).rows == _count(
        tpch_dir, "nation", "n_name IN ('FRANCE', 'GERMANY', 'X')"
    )
    assert _count(tpch_dir, "nation", "n_name IN ('FRANCE', 'GERMANY', 'X')") == 2
    scan = _scan("nation", ["n_nationkey", "n_name"], "n_name = 'ATLANTIS'")
    assert Estimator(catalog, exact=Tiny(catalog, probe)).size(scan).rows == 1.0


def test_a_count_follows_the_filter_as_it_grows(catalog: dict[str, Table], probe: Probe) -> None:
    scan = _scan("nation", ["n_nationkey", "n_regionkey"], "n_regionkey = 2")
    estimator = Estimator(catalog, exact=Tiny(catalog, probe))
    assert estimator.size(scan).rows == 5.0
    # the binder pushes another condition into the same scan
    scan.filter = exp.and_(scan.filter, sqlglot.parse_one("nation.n_nationkey < 10"))
    assert estimator.size(scan).rows == 2.0  # nations 8 and 9 are in region 2


def test_only_tiny_tables_and_deterministic_filters_are_counted(
    catalog: dict[str, Table], probe: Probe, tpch_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = Tiny(catalog, probe)
    # supplier has 1,000 rows at SF 0.1: counted at the bound, not past it
    scan = _scan("supplier", ["s_suppkey", "s_nationkey"], "s_nationkey = 3")
    assert catalog["supplier"].rows == tiny.EXACT_ROWS
    assert counter.rows(scan, catalog["supplier"]) == _count(
        tpch_dir, "supplier", "s_nationkey = 3"
    )
    monkeypatch.setattr(tiny, "EXACT_ROWS", 999)
    scan = _scan("supplier", ["s_suppkey", "s_nationkey"], "s_nationkey = 4")
    assert Tiny(catalog, probe).rows(scan, catalog["supplier"]) is None
    # random() must not decide a plan (a cached plan would keep the answer)
    scan = _scan("region", ["r_regionkey"], "r_regionkey < random() * 5")
    assert Tiny(catalog, probe).rows(scan, catalog["region"]) is None
    # no filter: the footers' row count is exact already
    assert (
        Tiny(catalog, probe).rows(_scan("region", ["r_regionkey"], None), catalog["region"]) is None
    )


def _key(table: str, column: str) -> tuple[exp.Expr, exp.Expr]:
    return exp.column(column, table=table), exp.column(column, table="r")


def test_a_semi_join_keeps_the_share_of_key_values_the_right_side_covers() -> None:
    left = Size(1_500_000.0, {}, {("c", "k"): 25.0}, {("c", "k"): 25.0})
    # the right side holds each value of its table once: 5 of 25 nations survive
    nations = Size(5.0, {("r", "k"): 0.2}, {("r", "k"): 5.0}, {("r", "k"): 25.0})
    keys = [(exp.column("k", table="c"), exp.column("k", table="r"))]
    assert semi_kept(left, nations, keys) == pytest.approx(0.2)
    assert semi_kept(left, nations, keys, anti=True) == pytest.approx(0.8)
    # not unique: its distinct values over the left's, at most all
    some = Size(100.0, {}, {("r", "k"): 10.0}, {})
    assert semi_kept(left, some, keys) == pytest.approx(0.4)
    many = Size(1e6, {}, {("r", "k"): 1e6}, {})
    assert semi_kept(left, many, keys) == 1.0
    # an anti join that matches every key still keeps its floor: ranges err high
    assert semi_kept(left, many, keys, anti=True) == ANTI_KEEPS
    # a key that is no column: the old guess
    expr = [(exp.func("abs", exp.column("k", table="c")), exp.column("k", table="r"))]
    assert semi_kept(left, some, expr) == FILTERED


def test_a_residual_must_hold_for_some_right_row_of_the_key() -> None:
    left = Size(1000.0, {}, {("l", "k"): 1000.0, ("l", "s"): 50.0}, {})
    right = Size(4000.0, {}, {("r", "k"): 1000.0, ("r", "s"): 100.0}, {})
    keys = [(exp.column("k", table="l"), exp.column("k", table="r"))]
    # another supplier's line of the same order: almost surely among its four
    differs = sqlglot.parse_one("r.s <> l.s")
    assert semi_kept(left, right, keys, residual=differs) == pytest.approx(1.0, abs=1e-6)
    assert semi_kept(left, right, keys, anti=True, residual=differs) == ANTI_KEEPS
    # a condition it cannot read holds a third of the time, for each of four rows
    other = sqlglot.parse_one("r.x > l.y")
    kept = 1 - (2 / 3) ** 4
    assert semi_kept(left, right, keys, residual=other) == pytest.approx(kept)
    assert semi_kept(left, right, keys, anti=True, residual=other) == pytest.approx(1 - kept)


def test_q21s_anti_join_is_estimated_at_a_tenth_not_half(
    catalog: dict[str, Table], probe: Probe, tpch_dir: Path
) -> None:
    # l1 (late line items) anti join l3 (another supplier's late line of the order)
    cond = "l_receiptdate > l_commitdate"
    l1 = _scan("lineitem", ["l_orderkey", "l_suppkey", "l_receiptdate", "l_commitdate"], cond)
    l3 = Scan("lineitem", "l3", list(l1.columns), _scan("lineitem", [], cond).filter)
    assert l3.filter is not None
    for c in l3.filter.find_all(exp.Column):
        c.set("table", exp.to_identifier("l3"))
    anti = Join(
        l1,
        l3,
        JoinKind.ANTI,
        [exp.column("l_orderkey", table="lineitem")],
        [exp.column("l_orderkey", table="l3")],
        sqlglot.parse_one("l3.l_suppkey <> lineitem.l_suppkey"),
    )
    estimator = Estimator(catalog, exact=Tiny(catalog, probe))
    kept = estimator.size(anti).rows / estimator.size(l1).rows
    real = duckdb.sql(
        f"""SELECT avg(CASE WHEN NOT EXISTS (SELECT 1 FROM '{tpch_dir}/lineitem.parquet' l3
            WHERE l3.l_orderkey = l1.l_orderkey AND l3.l_suppkey <> l1.l_suppkey
            AND l3.{cond}) THEN 1 ELSE 0 END)
            FROM '{tpch_dir}/lineitem.parquet' l1 WHERE l1.{cond}"""
    ).fetchall()[0][0]
    assert real < 0.15  # most late line items have another late line in their order
    assert kept == pytest.approx(ANTI_KEEPS)


def test_q05s_lineitem_meets_the_regions_customers_orders_before_its_suppliers(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The year's orders joined with the region's customers (a fifth of them,
    # counted: one region of five) keep a thirty-fifth of lineitem; the region's
    # suppliers a fifth. The pair that makes the bigger cut goes first though
    # neither of its sides cuts lineitem alone (``join_order._order``), and the
    # suppliers meet the rest on both keys (DuckDB's own order).
    plan = plan_query(tpch_query(5), catalog, PlannerConfig(split_rows=100_000))
    (lineitem,) = [s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem"]
    assert lineitem.num_tasks > 1
    # lineitem meets a stage of the orders and customers first, then the suppliers
    assert lineitem.label.startswith("scan lineitem → inner join → scan supplier"), lineitem.label
    (read,) = lineitem.inputs
    (pair,) = [s for s in plan.stages if s.id == read.stage]
    assert pair.label.startswith("scan orders (filtered) → scan customer"), pair.label
    expected = duckdb_ref.sql(tpch_query(5)).to_arrow_table()
    assert expected.num_rows == 5
    assert_same_result(run_plan(plan), expected, ordered=True, order_by=TPCH_ORDER_BY[5])


def test_an_empty_table_is_counted_without_reading_and_the_warm_up_plans() -> None:
    # A table of no files (the scheduler's warm-up plans over one at start) has
    # no rows to read: the probe was asked for them and failed on an empty list.
    empty = Table("t", "", (), pa.schema([("k", pa.int64()), ("v", pa.string())]), ())

    class Unread:
        def count(self, table: Table, columns: list[str], sql: str) -> int | None:
            raise AssertionError("an empty table's rows were read")

    assert Tiny({"t": empty}, Unread()).rows(_scan("t", ["k", "v"], "v = 'a'"), empty) == 0
    plan = plan_query("SELECT k FROM t WHERE v = 'a'", {"t": empty})
    assert plan.columns == ("k",)
    warm_up()  # the scheduler's, over its own empty table
