"""Big results reach any Flight SQL client with its default settings.

gRPC clients refuse a message over their receive limit: 16 MiB in the ADBC driver,
4 MiB in grpc-java and most others. The executors write batches of up to 18 MiB
(``SELECT * FROM lineitem``); every Flight server of mangonel cuts them to fit 4 MiB.
"""

from __future__ import annotations

import decimal
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
from fsql_support import adbc_connect, statement
from helpers import ensure_tpch

WIDE = "SELECT * FROM lineitem"


def test_every_message_fits_a_4_mib_client(
    fsql_cluster: Any, flight_client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """A client that accepts no message over 4 MiB reads a result of 17 MiB batches
    (TPC-H SF 0.1 ``lineitem``, 600,000 rows of 16 columns), from the executors and
    through the scheduler."""
    small = [("grpc.max_receive_message_length", 4 * 1024 * 1024)]
    info = flight_client.get_flight_info(statement(WIDE))
    assert info.endpoints
    from_executors, through_scheduler = [], []
    with flight.connect(fsql_cluster.flight_sql_url, generic_options=small) as scheduler:
        for endpoint in info.endpoints:
            executor = endpoint.locations[0].uri.decode()
            with flight.connect(executor, generic_options=small) as direct:
                from_executors.append(_read(direct.do_get(endpoint.ticket)))
            through_scheduler.append(_read(scheduler.do_get(endpoint.ticket)))
    # Compared as whole sorted tables: value by value, 600,000 rows took a minute.
    key = [("l_orderkey", "ascending"), ("l_linenumber", "ascending")]
    expected = duckdb_ref.sql(WIDE).to_arrow_table().sort_by(key)
    for tables in (from_executors, through_scheduler):
        actual = pa.concat_tables(tables).sort_by(key)
        assert actual.cast(expected.schema).equals(expected)


def _read(reader: flight.FlightStreamReader) -> pa.Table:
    # Not ``read_all()``: it reports the client's refusal of a message too large (a
    # cancelled call) as a KeyboardInterrupt, which would stop the whole test run.
    return pa.Table.from_batches([chunk.data for chunk in reader], reader.schema)


def test_six_million_rows_through_adbc_with_default_options(fsql_cluster: Any) -> None:
    """``SELECT * FROM lineitem`` at TPC-H SF 1 (6,001,215 rows) read by the ADBC driver
    with no option set, batch by batch; its row count and column sums are DuckDB's."""
    path = ensure_tpch(1) / "lineitem.parquet"
    checks = (
        "count(*) AS n, sum(l_orderkey) AS keys, sum(l_quantity) AS quantity, "
        "sum(length(l_comment)) AS comment_chars"
    )
    expected = duckdb.sql(f"SELECT {checks} FROM '{path}'").fetchall()[0]
    with fsql_cluster.connect() as session:
        session.register_parquet("lineitem_sf1", str(path))
        try:
            with adbc_connect(fsql_cluster.flight_sql_url) as conn, conn.cursor() as cur:
                cur.execute("SELECT * FROM lineitem_sf1")
                rows, keys, quantity, chars = 0, 0, decimal.Decimal(0), 0
                for batch in cur.fetch_record_batch():
                    rows += batch.num_rows
                    keys += pc.sum(batch.column("l_orderkey")).as_py()
                    quantity += pc.sum(batch.column("l_quantity")).as_py()
                    chars += pc.sum(pc.utf8_length(batch.column("l_comment"))).as_py()
        finally:
            session.drop_table("lineitem_sf1")
    assert (rows, keys, quantity, chars) == expected
    assert rows == 6_001_215
