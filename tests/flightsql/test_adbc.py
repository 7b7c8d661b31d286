"""Any Flight SQL client can query mangonel: the real ADBC driver (Go) against a real cluster.

Every answer is compared with single-process DuckDB on the same files. The 22
TPC-H queries run through ``cursor.execute`` + ``fetch_arrow_table``; a query with
several result partitions proves that its ``FlightInfo`` sends the client to the
executors holding them.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from fsql_support import read_endpoints, statement
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query

QUERIES = list(range(1, 23))

# An aggregate without ORDER BY: its final stage runs one task per partition.
PARTITIONED = (
    "SELECT l_orderkey, sum(l_quantity) AS qty, count(*) AS n FROM lineitem GROUP BY l_orderkey"
)


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_tpch_through_adbc_matches_duckdb(
    number: int, adbc: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    with adbc.cursor() as cur:
        cur.execute(sql)
        actual = cur.fetch_arrow_table()
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)


def test_fetchall_gives_python_rows(adbc: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT n_nationkey, n_name, r_name FROM nation JOIN region ON n_regionkey = r_regionkey"
    with adbc.cursor() as cur:
        cur.execute(sql + " ORDER BY n_nationkey")
        rows = cur.fetchall()
        names = [d[0] for d in cur.description]
    assert names == ["n_nationkey", "n_name", "r_name"]
    assert rows == duckdb_ref.sql(sql + " ORDER BY n_nationkey").fetchall()
    assert len(rows) == 25


def test_result_partitions_are_read_from_the_executors(
    fsql_cluster: Any, flight_client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    info = flight_client.get_flight_info(statement(PARTITIONED))
    with fsql_cluster.connect() as session:
        executors = {e.flight_address for e in session.status().executors}
    assert len(info.endpoints) > 1, "the query should have several result partitions"
    for endpoint in info.endpoints:
        uris = [loc.uri.decode() for loc in endpoint.locations]
        # The executor holding the partition first, then this server as the fallback.
        assert uris[0].removeprefix("grpc://") in executors, uris
        assert uris[1] == "arrow-flight-reuse-connection://?", uris
    assert len({e.locations[0].uri for e in info.endpoints}) == len(executors)
    actual = read_endpoints(info, flight_client)
    assert actual.schema == info.schema
    assert info.total_records == actual.num_rows
    expected = duckdb_ref.sql(PARTITIONED).to_arrow_table()
    assert_same_result(actual, expected, ordered=False)
    # The same tickets are served by the scheduler itself (the fallback).
    through_scheduler = pa.concat_tables(
        flight_client.do_get(e.ticket).read_all() for e in info.endpoints
    )
    assert_same_result(through_scheduler, expected, ordered=False)


def test_many_partitions_through_adbc(adbc: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    with adbc.cursor() as cur:
        cur.execute(PARTITIONED)
        actual = cur.fetch_arrow_table()
    assert_same_result(actual, duckdb_ref.sql(PARTITIONED).to_arrow_table(), ordered=False)


def test_parameters(adbc: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    sql = (
        "SELECT l_orderkey, l_linenumber, l_shipmode, l_extendedprice FROM lineitem "
        "WHERE l_orderkey < ? AND l_shipmode = ? AND l_shipdate >= ? AND l_discount <= ? "
        "ORDER BY l_orderkey, l_linenumber"
    )
    params = (5000, "MAIL", dt.date(1995, 1, 1), decimal.Decimal("0.05"))
    expected = duckdb_ref.sql(sql, params=list(params)).to_arrow_table()
    assert expected.num_rows > 0
    with adbc.cursor() as cur:
        cur.execute(sql, params)
        actual = cur.fetch_arrow_table()
    assert_same_result(actual, expected, ordered=True)


def test_prepared_statement_declares_its_parameter_types(
    adbc: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """Each parameter as the column it is compared with (null where nothing tells), so
    that a client can convert its values before binding them."""
    sql = (
        "SELECT ? AS tag, l_orderkey, l_linenumber FROM lineitem WHERE l_quantity < ? "
        "AND l_shipdate >= ? AND l_shipmode = ? ORDER BY l_orderkey, l_linenumber LIMIT ?"
    )
    with adbc.cursor() as cur:
        params = cur.adbc_prepare(sql)
        assert params.types == [
            pa.null(),
            pa.decimal128(15, 2),
            pa.date32(),
            pa.string(),
            pa.int64(),
        ]
        values = ("x", decimal.Decimal("3"), dt.date(1998, 1, 1), "AIR", 10)
        cur.execute(sql, values)
        actual = cur.fetch_arrow_table()
    expected = duckdb_ref.sql(sql, params=list(values)).to_arrow_table()
    assert expected.num_rows == 10
    assert_same_result(actual, expected, ordered=True)


def test_prepared_statement_runs_again_with_new_parameters(
    adbc: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = "SELECT count(*) AS n, sum(o_totalprice) AS total FROM orders WHERE o_custkey = $1"
    with adbc.cursor() as cur:
        cur.adbc_prepare(sql)
        for custkey in (1, 2, 10, 9999999):
            cur.execute(sql, (custkey,))
            actual = cur.fetch_arrow_table()
            expected = duckdb_ref.sql(sql, params=[custkey]).to_arrow_table()
            assert_same_result(actual, expected, ordered=True)


def test_pandas_read_sql(adbc: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    sql = tpch_query(3)
    frame = pd.read_sql(sql, adbc)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert list(frame.columns) == expected.column_names
    assert_same_result(
        pa.Table.from_pandas(frame, preserve_index=False).cast(expected.schema),
        expected,
        ordered=True,
        order_by=TPCH_ORDER_BY[3],
    )


def test_get_objects_lists_catalog_schema_tables_and_columns(
    adbc: Any, tpch_tables: dict[str, Any]
) -> None:
    objects = adbc.adbc_get_objects(depth="all").read_all().to_pylist()
    assert [c["catalog_name"] for c in objects] == ["mangonel"]
    schemas = objects[0]["catalog_db_schemas"]
    assert [s["db_schema_name"] for s in schemas] == ["public"]
    tables = {t["table_name"]: t for t in schemas[0]["db_schema_tables"]}
    assert sorted(tables) == sorted(tpch_tables)
    assert {t["table_type"] for t in tables.values()} == {"TABLE"}
    columns = [c["column_name"] for c in tables["nation"]["table_columns"]]
    assert columns == ["n_nationkey", "n_name", "n_regionkey", "n_comment"]
    only = adbc.adbc_get_objects(depth="tables", table_name_filter="line%").read_all().to_pylist()
    names = [t["table_name"] for t in only[0]["catalog_db_schemas"][0]["db_schema_tables"]]
    assert names == ["lineitem"]


def test_table_schema_and_types(adbc: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    schema = adbc.adbc_get_table_schema("orders")
    expected = duckdb_ref.sql("SELECT * FROM orders LIMIT 0").to_arrow_table().schema
    assert schema.names == expected.names
    for got, want in zip(schema, expected, strict=True):
        assert got.nullable, got
        assert pa.types.is_string(got.type) == (
            pa.types.is_string(want.type) or pa.types.is_string_view(want.type)
        ), (got, want)
    assert adbc.adbc_get_table_types() == ["TABLE"]


def test_get_info_reports_the_server(adbc: Any) -> None:
    info = adbc.adbc_get_info()
    assert info["vendor_name"] == "mangonel"
    assert info["vendor_arrow_version"] == pa.__version__
    assert info["vendor_version"]


def test_empty_result_has_its_schema(adbc: Any) -> None:
    with adbc.cursor() as cur:
        cur.execute("SELECT n_name, n_nationkey FROM nation WHERE n_nationkey < 0")
        table = cur.fetch_arrow_table()
    # Empty is the point: the columns and their types arrive without rows.
    assert table.num_rows == 0
    assert table.column_names == ["n_name", "n_nationkey"]
    assert pa.types.is_integer(table.schema.field("n_nationkey").type)
