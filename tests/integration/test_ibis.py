"""ibis expressions run on a real 2-executor cluster through the ``mangonel`` ibis backend.

Each TPC-H query here is written once in ibis (``QUERIES``: a function of the tables)
and run twice: on mangonel (``ibis.mangonel``, found by its entry point) and on ibis's
DuckDB backend over the same Parquet files, single-process; the two answers must match.
Each mangonel run must have been distributed: several stages, more tasks than stages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import ibis
import ibis.common.exceptions as com
import ibis.expr.types as ir
import pyarrow as pa
import pytest
from helpers import TPCH_TABLES, assert_same_result
from ibis import _

from mangonel.errors import CatalogError

Tables = dict[str, ir.Table]


def money(column: ir.DecimalValue) -> ir.FloatingValue:
    """A price or rate as a double: ibis 12 types a product of two decimal(15, 2) as
    decimal(15, 2) where DuckDB (and mangonel) compute decimal(18, 4), and its own DuckDB
    backend then fails to cast the answer; arithmetic on doubles has no such gap."""
    return column.cast("float64")


def q01(t: Tables) -> ir.Table:
    li = t["lineitem"]
    return (
        li.filter(li.l_shipdate <= ibis.date("1998-09-02"))
        .group_by(["l_returnflag", "l_linestatus"])
        .agg(
            sum_qty=_.l_quantity.sum(),
            sum_base_price=_.l_extendedprice.sum(),
            sum_disc_price=(money(_.l_extendedprice) * (1 - money(_.l_discount))).sum(),
            sum_charge=(
                money(_.l_extendedprice) * (1 - money(_.l_discount)) * (1 + money(_.l_tax))
            ).sum(),
            # ibis types the mean of a decimal(15, 2) as decimal(15, 2) and casts the
            # engine's answer to it, which fails (on DuckDB too): a double's mean instead.
            avg_qty=_.l_quantity.cast("float64").mean(),
            avg_disc=_.l_discount.cast("float64").mean(),
            count_order=_.count(),
        )
        .order_by(["l_returnflag", "l_linestatus"])
    )


def q03(t: Tables) -> ir.Table:
    c, o, li = t["customer"], t["orders"], t["lineitem"]
    c = c.filter(c.c_mktsegment == "BUILDING")
    o = o.filter(o.o_orderdate < ibis.date("1995-03-15"))
    li = li.filter(li.l_shipdate > ibis.date("1995-03-15"))
    return (
        c.join(o, c.c_custkey == o.o_custkey)
        .join(li, o.o_orderkey == li.l_orderkey)
        .group_by(["l_orderkey", "o_orderdate", "o_shippriority"])
        .agg(revenue=(money(_.l_extendedprice) * (1 - money(_.l_discount))).sum())
        .order_by([ibis.desc("revenue"), "o_orderdate"])
        .limit(10)
    )


def q05(t: Tables) -> ir.Table:
    c, o, li, s, n, r = (
        t[x] for x in ("customer", "orders", "lineitem", "supplier", "nation", "region")
    )
    o = o.filter(
        (o.o_orderdate >= ibis.date("1994-01-01")) & (o.o_orderdate < ibis.date("1995-01-01"))
    )
    r = r.filter(r.r_name == "ASIA")
    return (
        c.join(o, c.c_custkey == o.o_custkey)
        .join(li, o.o_orderkey == li.l_orderkey)
        .join(s, [li.l_suppkey == s.s_suppkey, c.c_nationkey == s.s_nationkey])
        .join(n, s.s_nationkey == n.n_nationkey)
        .join(r, n.n_regionkey == r.r_regionkey)
        .group_by("n_name")
        .agg(revenue=(money(_.l_extendedprice) * (1 - money(_.l_discount))).sum())
        .order_by(ibis.desc("revenue"))
    )


def q06(t: Tables) -> ir.Table:
    li = t["lineitem"]
    return li.filter(
        li.l_shipdate >= ibis.date("1994-01-01"),
        li.l_shipdate < ibis.date("1995-01-01"),
        li.l_discount.between(0.05, 0.07),
        li.l_quantity < 24,
    ).agg(revenue=(money(_.l_extendedprice) * money(_.l_discount)).sum())


def q12(t: Tables) -> ir.Table:
    o, li = t["orders"], t["lineitem"]
    li = li.filter(
        li.l_shipmode.isin(["MAIL", "SHIP"]),
        li.l_commitdate < li.l_receiptdate,
        li.l_shipdate < li.l_commitdate,
        li.l_receiptdate >= ibis.date("1994-01-01"),
        li.l_receiptdate < ibis.date("1995-01-01"),
    )
    urgent = _.o_orderpriority.isin(["1-URGENT", "2-HIGH"])
    return (
        o.join(li, o.o_orderkey == li.l_orderkey)
        .group_by("l_shipmode")
        .agg(
            high_line_count=urgent.ifelse(1, 0).sum(),
            low_line_count=(~urgent).ifelse(1, 0).sum(),
        )
        .order_by("l_shipmode")
    )


def q13(t: Tables) -> ir.Table:
    c, o = t["customer"], t["orders"]
    o = o.filter(~o.o_comment.like("%special%requests%"))
    per_customer = (
        c.left_join(o, c.c_custkey == o.o_custkey)
        .group_by("c_custkey")
        .agg(c_count=_.o_orderkey.count())
    )
    return (
        per_customer.group_by("c_count")
        .agg(custdist=_.count())
        .order_by([ibis.desc("custdist"), ibis.desc("c_count")])
    )


def q18(t: Tables) -> ir.Table:
    c, o, li = t["customer"], t["orders"], t["lineitem"]
    big = li.group_by("l_orderkey").agg(qty=_.l_quantity.sum()).filter(_.qty > 300)
    return (
        c.join(o, c.c_custkey == o.o_custkey)
        .join(li, o.o_orderkey == li.l_orderkey)
        .filter(_.o_orderkey.isin(big.l_orderkey))
        .group_by(["c_name", "c_custkey", "o_orderkey", "o_orderdate", "o_totalprice"])
        .agg(sum_qty=_.l_quantity.sum())
        .order_by([ibis.desc("o_totalprice"), "o_orderdate"])
        .limit(100)
    )


def top_suppliers_by_nation(t: Tables) -> ir.Table:
    """A window function over a join of an aggregate: each nation's three best suppliers."""
    li, s = t["lineitem"], t["supplier"]
    revenue = li.group_by("l_suppkey").agg(
        revenue=(money(_.l_extendedprice) * (1 - money(_.l_discount))).sum()
    )
    ranked = revenue.join(s, revenue.l_suppkey == s.s_suppkey).mutate(
        place=ibis.rank().over(group_by=_.s_nationkey, order_by=ibis.desc(_.revenue))
    )
    return (
        ranked.filter(_.place < 3)
        .select("s_nationkey", "s_name", "revenue", "place")
        .order_by(["s_nationkey", "place", "s_name"])
    )


def shipped_by_year_with_change(t: Tables) -> ir.Table:
    """``lag`` and a running sum over the years: windows without a partition."""
    li = t["lineitem"]
    yearly = li.group_by(year=li.l_shipdate.year()).agg(quantity=_.l_quantity.sum())
    return yearly.mutate(
        previous=_.quantity.lag().over(ibis.window(order_by="year")),
        running=_.quantity.sum().over(ibis.cumulative_window(order_by="year")),
    ).order_by("year")


QUERIES: dict[str, tuple[Callable[[Tables], ir.Table], tuple[str, ...]]] = {
    "q01": (q01, ("l_returnflag", "l_linestatus")),
    "q03": (q03, ("revenue", "o_orderdate")),
    "q05": (q05, ("revenue",)),
    "q06": (q06, ()),
    "q12": (q12, ("l_shipmode",)),
    "q13": (q13, ("custdist", "c_count")),
    "q18": (q18, ("o_totalprice", "o_orderdate")),
    "top_suppliers_by_nation": (top_suppliers_by_nation, ("s_nationkey", "place", "s_name")),
    "shipped_by_year_with_change": (shipped_by_year_with_change, ("year",)),
}
"""Name -> (the query in ibis, its ORDER BY's output columns: rows tied on them may come
in any order)."""


@pytest.fixture(scope="module")
def con(cluster: Any, session: Any) -> Iterator[Any]:
    """The ibis backend on the module's cluster (``session`` registered the tables)."""
    backend = ibis.mangonel.connect(cluster.address)
    yield backend
    backend.disconnect()


@pytest.fixture(scope="module")
def ref(tpch_tables: dict[str, Path]) -> Iterator[Any]:
    """ibis on single-process DuckDB over the same Parquet files."""
    backend = ibis.duckdb.connect()
    for name, path in tpch_tables.items():
        backend.read_parquet(path, table_name=name)
    yield backend
    backend.disconnect()


def tables(backend: Any) -> Tables:
    return {name: backend.table(name) for name in TPCH_TABLES}


@pytest.mark.parametrize("name", list(QUERIES))
def test_ibis_query_matches_ibis_on_duckdb_and_ran_distributed(
    name: str, con: Any, ref: Any
) -> None:
    query, order_by = QUERIES[name]
    expected = query(tables(ref)).to_pyarrow()
    assert expected.num_rows > 0, "an empty reference would prove nothing"
    actual = query(tables(con)).to_pyarrow()
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)
    result = con.last_result
    stages = result.stages
    assert len(stages) > 1, f"{name} ran as one stage: {[s.label for s in stages]}"
    assert sum(s.tasks_total for s in stages) > len(stages), [
        (s.label, s.tasks_total) for s in stages
    ]


def test_to_pandas_and_to_polars_give_the_same_rows(con: Any, ref: Any) -> None:
    import polars as pl

    expected = q12(tables(ref)).to_pandas()
    got_pandas = q12(tables(con)).to_pandas()
    assert got_pandas.columns.tolist() == expected.columns.tolist()
    assert got_pandas.to_dict("records") == expected.to_dict("records")
    got_polars = q12(tables(con)).to_polars()
    assert isinstance(got_polars, pl.DataFrame)
    assert got_polars.to_dicts() == expected.to_dict("records")


def test_scalar_and_column_results(con: Any, ref: Any) -> None:
    li_con, li_ref = con.table("lineitem"), ref.table("lineitem")
    assert li_con.count().execute() == li_ref.count().execute() > 0
    assert li_con.l_quantity.sum().to_pyarrow() == li_ref.l_quantity.sum().to_pyarrow()
    nations = con.table("nation").n_name.to_pyarrow()
    assert isinstance(nations, pa.ChunkedArray)
    assert sorted(nations.to_pylist()) == sorted(
        ref.table("nation").n_name.to_pyarrow().to_pylist()
    )


def test_tables_and_schemas_are_the_clusters(con: Any, ref: Any) -> None:
    assert set(TPCH_TABLES) <= set(con.list_tables())
    assert con.list_tables(like="^line") == ["lineitem"]
    for name in TPCH_TABLES:
        assert con.get_schema(name) == ref.get_schema(name), name
    with pytest.raises(com.TableNotFound):
        con.table("no_such_table")


def test_sql_and_raw_sql_run_on_the_cluster(
    con: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    text = "SELECT n_regionkey, count(*) AS n FROM nation GROUP BY n_regionkey"
    t = con.sql(text)  # its schema from the cluster (a LIMIT 0 query)
    assert t.schema() == ibis.schema({"n_regionkey": "int64", "n": "int64"})
    actual = t.filter(_.n > 0).order_by("n_regionkey").to_pyarrow()
    expected = duckdb_ref.sql(text + " ORDER BY n_regionkey").to_arrow_table()
    assert_same_result(actual, expected, ordered=True)
    assert con.raw_sql("SELECT count(*) AS n FROM region").to_arrow().column("n").to_pylist() == [5]


def test_read_parquet_registers_on_the_cluster_and_drop_table_removes_it(
    con: Any, tpch_tables: dict[str, Path]
) -> None:
    t = con.read_parquet(tpch_tables["region"], table_name="ibis_region")
    assert "ibis_region" in con.list_tables()
    assert sorted(t.r_name.to_pyarrow().to_pylist()) == [
        "AFRICA",
        "AMERICA",
        "ASIA",
        "EUROPE",
        "MIDDLE EAST",
    ]
    con.drop_table("ibis_region")
    assert "ibis_region" not in con.list_tables()
    con.drop_table("ibis_region", force=True)  # gone already: no error
    with pytest.raises(CatalogError, match="no table 'ibis_region'"):
        con.drop_table("ibis_region")


def test_what_the_engine_cannot_hold_is_refused_with_what_to_do(con: Any) -> None:
    with pytest.raises(com.UnsupportedOperationError, match="read_parquet"):
        ibis.memtable({"x": [1, 2]}).pipe(con.execute)
    with pytest.raises(com.UnsupportedOperationError, match="read_parquet"):
        con.create_table("t", pa.table({"x": [1]}))
    li = con.table("lineitem")
    with pytest.raises(com.IbisTypeError, match="cast such columns to float64"):
        (li.l_extendedprice * li.l_discount).sum().to_pyarrow()
    # ... and the connection still serves.
    assert con.table("region").count().execute() == 5


def test_ibis_connect_takes_a_mangonel_url(cluster: Any, session: Any) -> None:
    backend = ibis.connect(f"mangonel://{cluster.address}?timeout_s=30")
    try:
        assert backend.name == "mangonel"
        assert backend.table("nation").count().execute() == 25
    finally:
        backend.disconnect()
