"""A query's result in Arrow's own types, from a slot that exports DuckDB's losslessly."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from mangonel.executor.arrow_types import PlainTypes


def lossless() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET arrow_lossless_conversion = true")
    con.execute("SET threads = 4")
    return con


def test_a_result_gets_duckdbs_default_types_in_its_order(tmp_path: Path) -> None:
    con, plain = lossless(), PlainTypes(str(tmp_path), None)
    sql = (
        "SELECT x, x::HUGEINT * 1000000000000 AS h, md5(x::VARCHAR)::UUID AS u, "
        "{'s': x::HUGEINT} AS st FROM range(300000) t(x) ORDER BY hash(x)"
    )
    try:
        with con.sql(sql).to_arrow_reader(65536) as stream:
            assert isinstance(stream.schema.field("h").type, pa.BaseExtensionType)
            with plain.of(stream) as out:  # noqa: SIM117 - the check between the two
                got = out.read_all()
        con.execute("SET arrow_lossless_conversion = false")
        expected = con.sql(sql).to_arrow_table()
    finally:
        plain.close()
    assert got.schema == expected.schema
    assert got.schema.field("h").type == pa.decimal128(38, 0)
    assert got.schema.field("u").type == pa.string()
    assert got.equals(expected)  # row for row: one thread keeps an ORDER BY's order


def test_a_result_without_duckdb_only_types_passes_as_it_is(tmp_path: Path) -> None:
    con, plain = lossless(), PlainTypes(str(tmp_path), None)
    with (
        con.sql("SELECT 1 AS a, 'x' AS b").to_arrow_reader(1024) as stream,
        plain.of(stream) as out,
    ):
        assert out is stream
    assert plain._con is None  # no database opened for it
