"""A Parquet file's Arrow schema as mangonel reads it, the same for the catalog, the
planner and the executors.

pyarrow reads a column of Parquet's ``INTERVAL`` type (what DuckDB writes for its
``INTERVAL``: months, days and milliseconds, 12 bytes) as raw 12-byte binaries,
where DuckDB's own reader gives intervals. Planned over pyarrow's schema, such a
column was a ``BLOB`` that the scan cast DuckDB's intervals to, which DuckDB
cannot: a table with one could not be read at all, a table mangonel itself wrote
(``CREATE TABLE t AS SELECT INTERVAL 1 DAY AS d``) included. Here it is an Arrow
``month_day_nano_interval``, which DuckDB reads as ``INTERVAL``; a scan that reads
the file with pyarrow (an object in object storage) converts its values
(``as_read``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

INTERVAL = pa.month_day_nano_interval()

_NANOS_PER_MILLI = 1_000_000


def arrow_schema(parquet: pq.ParquetFile) -> pa.Schema:
    """The file's Arrow schema as pyarrow reads it (a ``UUID`` as the ``arrow.uuid``
    extension, which DuckDB reads as ``UUID``), its top-level ``INTERVAL`` columns
    as intervals."""
    schema = parquet.schema_arrow
    metadata = parquet.metadata
    intervals = _interval_columns(metadata)
    if not intervals:
        return schema
    for i, f in enumerate(schema):
        if f.name in intervals:
            schema = schema.set(i, f.with_type(INTERVAL))
    return schema


def as_read(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` as pyarrow read it, with ``schema``'s types: a column of 12-byte
    binaries where ``schema`` has an interval is decoded; every other one cast."""
    if batch.schema == schema:
        return batch
    columns = []
    for column, f in zip(batch.columns, schema, strict=True):
        if f.type == INTERVAL and column.type != INTERVAL:
            columns.append(_intervals(column))
        else:
            columns.append(column if column.type == f.type else column.cast(f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _interval_columns(metadata: pq.FileMetaData) -> set[str]:
    found = set()
    parquet = metadata.schema
    for i in range(len(parquet)):
        column = parquet.column(i)
        if "." in column.path:
            continue  # inside a nested column: left as pyarrow reads it
        logical = str(column.logical_type.type) if column.logical_type is not None else ""
        if logical == "INTERVAL" or column.converted_type == "INTERVAL":
            found.add(column.path)
    return found


def _intervals(column: pa.Array) -> pa.Array:
    """Parquet's 12-byte intervals (little-endian months, days, milliseconds) as
    Arrow intervals."""
    raw = column.cast(pa.binary(12)) if column.type != pa.binary(12) else column
    valid = raw.is_valid().to_numpy(zero_copy_only=False)
    data = raw.buffers()[1]
    words = np.frombuffer(data, dtype="<u4", count=3 * (raw.offset + len(raw)))
    words = words.reshape(-1, 3)[raw.offset :]
    values = [
        pa.MonthDayNano([int(m), int(d), int(ms) * _NANOS_PER_MILLI]) if ok else None
        for (m, d, ms), ok in zip(words.tolist(), valid, strict=True)
    ]
    return pa.array(values, type=INTERVAL)
