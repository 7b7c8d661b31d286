"""Parquet's INTERVAL and UUID columns read as DuckDB reads them (``mangonel.parquet_schema``)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from mangonel.parquet_schema import INTERVAL, arrow_schema, as_read


def _written_by_duckdb(path: Path) -> pa.Table:
    """A file of intervals (NULL, with months, days and milliseconds; Parquet has no
    negative ones) and UUIDs as DuckDB writes it; DuckDB's own reading of it."""
    con = duckdb.connect()
    con.execute(
        f"""COPY (SELECT i AS id,
                CASE WHEN i % 7 = 0 THEN NULL
                     ELSE INTERVAL (i) DAY + INTERVAL (i % 13) MONTH
                          + INTERVAL (i * 1234) MILLISECOND END AS iv,
                md5(i::VARCHAR)::UUID AS u
            FROM range(100) t(i)) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 30)"""
    )
    return con.sql(f"SELECT * FROM read_parquet('{path}') ORDER BY id").to_arrow_table()


def test_an_interval_column_is_an_interval_and_its_values_decode_as_duckdb_reads_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.parquet"
    duck = _written_by_duckdb(path)
    parquet = pq.ParquetFile(path)
    assert parquet.schema_arrow.field("iv").type == pa.binary(12)  # pyarrow's raw bytes
    schema = arrow_schema(parquet)
    assert schema.field("iv").type == INTERVAL
    assert schema.field("u").type == parquet.schema_arrow.field("u").type  # arrow.uuid
    batches = [as_read(b, schema) for b in parquet.iter_batches(batch_size=17)]
    ours = pa.Table.from_batches(batches, schema)
    assert ours.column("iv").to_pylist() == duck.column("iv").to_pylist()
    assert ours.column("iv").null_count == duck.column("iv").null_count > 0
    # Planned over this schema, DuckDB sees the types its own reader gives.
    con = duckdb.connect()
    con.register("planned", schema.empty_table())
    planned = {r[0]: r[1] for r in con.execute("DESCRIBE planned").fetchall()}
    native = {
        r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
    }
    assert planned == native, (planned, native)


def test_a_schema_without_intervals_is_pyarrows_own(tmp_path: Path) -> None:
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", None]}), path)
    parquet = pq.ParquetFile(path)
    assert arrow_schema(parquet).equals(parquet.schema_arrow, check_metadata=True)
    batch = next(parquet.iter_batches())
    assert as_read(batch, arrow_schema(parquet)) is batch
