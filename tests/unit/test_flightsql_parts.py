"""The pure parts of the Flight SQL endpoint: parameters, metadata rows, result views,
batches cut to fit a message."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from mangonel.errors import BindError
from mangonel.ids import ExecutorId, StageId
from mangonel.proto.batches import BATCH_BYTES, MAX_MESSAGE_BYTES, fitted
from mangonel.proto.results import ResultView, carried_file, result_schema
from mangonel.scheduler import flightsql_meta as meta
from mangonel.scheduler.flightsql_results import READ_ERRORS, ExecutorReads
from mangonel.sql.params import bind_parameters, count_parameters
from mangonel.task import PartitionLocation


def test_positional_parameters_are_numbered_in_reading_order() -> None:
    sql = "WITH c AS (SELECT ? AS a) SELECT ?, a FROM c WHERE a = ? AND b = '?'"
    assert count_parameters(sql) == 3
    assert bind_parameters(sql, [1, "x", None]) == (
        "WITH c AS (SELECT 1 AS a) SELECT 'x', a FROM c WHERE a = NULL AND b = '?'"
    )


def test_a_positional_parameter_cast_with_colons_is_a_parameter() -> None:
    # sqlglot reads ``?::`` as one token (Databricks' try-cast): ``?::VARCHAR``
    # was a syntax error, where DuckDB casts the parameter.
    sql = "SELECT ?::VARCHAR || 'x' AS a, ? + 1 AS b"
    assert count_parameters(sql) == 2
    assert bind_parameters(sql, ["y", 2]) == "SELECT CAST('y' AS TEXT) || 'x' AS a, 2 + 1 AS b"


def test_numbered_parameters_may_repeat() -> None:
    assert count_parameters("SELECT $2 + $1 + $2") == 2
    assert bind_parameters("SELECT $2 + $1 + $2", [1.5, 2]) == "SELECT 2 + 1.5 + 2"


def test_literals_are_typed_and_quoted() -> None:
    sql = bind_parameters(
        "SELECT ?, ?, ?, ?, ?, ?",
        [
            "it's",
            decimal.Decimal("-12.340"),
            dt.date(1995, 3, 15),
            dt.datetime(2020, 1, 2, 3, 4, 5),
            b"\x00\xff",
            float("inf"),
        ],
    )
    assert sql == (
        "SELECT 'it''s', CAST('-12.340' AS DECIMAL(5, 3)), CAST('1995-03-15' AS DATE), "
        "CAST('2020-01-02 03:04:05' AS TIMESTAMP), UNHEX('00ff'), CAST('inf' AS DOUBLE)"
    )


@pytest.mark.parametrize(
    ("sql", "values", "words"),
    [
        ("SELECT ?, ?", [1], "takes 2 parameters, 1 were bound"),
        ("SELECT ?, $1", [1, 2], "mixes"),
        ("SELECT $name", [1], "named parameter"),
        ("SELECT ?", [object()], "cannot be bound"),
    ],
)
def test_bad_bindings_are_refused(sql: str, values: list[object], words: str) -> None:
    with pytest.raises(BindError, match=words):
        bind_parameters(sql, values)


def test_like_patterns() -> None:
    assert meta.like(None) is None
    pattern = meta.like("li_e%")
    assert pattern is not None
    assert pattern.fullmatch("lineitem") and not pattern.fullmatch("xlineitem")
    escaped = meta.like("a\\_b")
    assert escaped is not None
    assert escaped.fullmatch("a_b") and not escaped.fullmatch("axb")


def test_sql_info_has_the_reference_schema_and_real_values() -> None:
    table = meta.sql_info([meta.SERVER_NAME, meta.SERVER_READ_ONLY, 999999, meta.SQL_KEYWORDS])
    assert table.schema == meta.SQL_INFO_SCHEMA
    assert table.to_pylist()[:2] == [
        {"info_name": meta.SERVER_NAME, "value": "mangonel"},
        {"info_name": meta.SERVER_READ_ONLY, "value": False},  # it takes write statements
    ]
    assert table.num_rows == 3  # an unknown code is left out
    everything = meta.sql_info([])
    assert everything.num_rows > 30
    values = {r["info_name"]: r["value"] for r in everything.to_pylist()}
    assert values[meta.SERVER_ARROW_VERSION] == pa.__version__


def test_metadata_tables_have_their_reference_schemas() -> None:
    assert meta.catalogs().schema == meta.CATALOGS_SCHEMA
    assert meta.db_schemas(None, None).to_pylist() == [
        {"catalog_name": "mangonel", "db_schema_name": "public"}
    ]
    assert meta.db_schemas("other", None).num_rows == 0
    assert meta.db_schemas(None, "x%").num_rows == 0
    assert meta.table_types().schema == meta.TABLE_TYPES_SCHEMA
    info = meta.xdbc_type_info(None)
    assert info.schema == meta.XDBC_TYPE_INFO_SCHEMA
    assert info["data_type"].to_pylist() == sorted(info["data_type"].to_pylist())
    assert meta.xdbc_type_info(91)["type_name"].to_pylist() == ["DATE"]
    assert meta.tables([], None, None, None, [], True).schema == meta.TABLES_WITH_SCHEMA_SCHEMA
    assert meta.tables([], None, None, None, [], False).schema == meta.TABLES_SCHEMA


def test_result_view_round_trip_and_apply() -> None:
    file_schema = pa.schema([("c0", pa.string_view()), ("c1", pa.int64()), ("__sort", pa.int32())])
    schema = result_schema(file_schema, ("name", "n"))
    assert schema == pa.schema([("name", pa.string()), ("n", pa.int64())])
    view = ResultView(b"/work/x.arrow", "job1", 2, schema)
    assert ResultView.decode(view.encode()) == view
    assert ResultView.decode(b"/work/x.arrow") is None
    with pytest.raises(ValueError, match="malformed result ticket"):
        ResultView.decode(b"mangonel-result-view:{}")
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["a", None], pa.string_view()), pa.array([1, 2]), pa.array([9, 8], pa.int32())],
        schema=file_schema,
    )
    out = view.apply(batch)
    assert out.schema == schema
    assert out.to_pylist() == [{"name": "a", "n": 1}, {"name": None, "n": 2}]


def test_batches_are_cut_to_fit_one_message_of_any_client() -> None:
    rows = 200_000
    # Uneven rows: the first 1,400 carry 3 KB each, the rest 12 bytes; cut in two
    # halves of equal rows, the first half would still be 5 MB.
    text = pa.array(["x" * 3000] * 1400 + [""] * (rows - 1400))
    batch = pa.record_batch({"k": pa.array(range(rows), pa.int64()), "s": text})
    assert batch.slice(0, rows // 2).nbytes > MAX_MESSAGE_BYTES
    pieces = list(fitted([batch]))
    assert all(pa.ipc.get_record_batch_size(p) <= MAX_MESSAGE_BYTES for p in pieces)
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches([batch]))
    small = batch.slice(0, 10)
    assert list(fitted([small])) == [small]
    nested = pa.record_batch({"n": pa.array([{"a": "y" * 100}] * 50_000)})
    assert len(list(fitted([nested]))) > 1


def test_a_batch_with_views_goes_whole() -> None:
    """Every slice of a view column refers to all of its data buffers: cutting it
    would send them again with each slice."""
    views = pa.array(["y" * 100] * 50_000).cast(pa.string_view())
    batch = pa.record_batch({"v": views})
    assert batch.nbytes > BATCH_BYTES
    assert list(fitted([batch])) == [batch]
    kind = pa.struct([("a", pa.list_(pa.binary_view()))])
    nested = pa.record_batch({"n": pa.array([{"a": [b"y" * 100]}] * 50_000).cast(kind)})
    assert list(fitted([nested])) == [nested]


def _file(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_write_s_count_the_scheduler_holds_needs_no_read_from_its_executor() -> None:
    # The count's file rode with the task's report (``JobWatch.result_files``): an
    # executor that died since (its address answers nothing here) is not asked,
    # and an update answers the count, not -1.
    def loc(path: str, rows: int) -> PartitionLocation:
        return PartitionLocation(
            ExecutorId("e1"), "h", "127.0.0.1:1", StageId(2), 0, 0, path, rows, 0, ""
        )

    counted = _file(pa.table({"Count": pa.array([74816], pa.int64())}))
    reads = ExecutorReads(None)
    assert reads.count((loc("a", 1),), None, {"a": counted}) == 74816
    # A damaged copy, or one of other rows, is read from the executor instead.
    assert carried_file(counted[:-9], 1) is None and carried_file(counted, 2) is None
    with pytest.raises(READ_ERRORS):
        reads.count((loc("a", 1),), None, {"a": counted[:-9]})
    # A file of no row is a table, falsy though it is.
    empty = carried_file(_file(pa.table({"Success": pa.array([], pa.bool_())})), 0)
    assert empty is not None and empty.num_rows == 0
    reads.close()
