"""Arrow record batches cut to fit one gRPC message of any Flight client.

Flight sends each record batch as one gRPC message, and a gRPC client refuses a
message larger than its receive limit: 4 MiB by default in grpc-java (the Flight
SQL JDBC driver) and in gRPC's other implementations, 16 MiB in the ADBC Flight
SQL driver (Go), unlimited only in Arrow's C++ client (``pyarrow.flight``). The
executors write batches of ``executor.runner.BATCH_ROWS`` rows as DuckDB hands them over, up to
18 MiB each for ``SELECT * FROM lineitem``. Every stream a Flight SQL client
reads (a result view at an executor, anything the scheduler's Flight SQL
endpoint sends) goes through ``fitted``, which cuts a batch larger than
``BATCH_BYTES`` into slices of equal rows (zero-copy: a slice shares the
batch's buffers, and the IPC writer sends only the part each slice refers to).
Shuffle reads and the Python client, both ``pyarrow.flight``, get the files'
batches whole.

>>> import pyarrow as pa
>>> batch = pa.record_batch({"x": pa.array(range(1_000_000), pa.int64())})
>>> [b.num_rows for b in fitted([batch])]
[333336, 333336, 333328]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest gRPC message every common client accepts with its default settings."""

BATCH_BYTES = 3 * 1024 * 1024
"""The most Arrow data (``RecordBatch.nbytes``) a batch is sent with. The IPC
message adds its metadata (a few hundred bytes, plus about 100 a column) and
pads each buffer to 8 bytes: a quarter of headroom below ``MAX_MESSAGE_BYTES``
covers thousands of columns."""


def fitted(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches, each one over ``BATCH_BYTES`` cut into slices under it.

    A batch with a view column (``string_view``, ``binary_view``) goes whole: a
    slice of it refers to all of its data buffers, which the IPC writer sends
    with every slice. Streams a Flight SQL client reads have none (a result view
    casts them to plain strings and binaries).
    """
    for batch in batches:
        if _cuttable(batch.schema):
            yield from _cut(batch, batch.nbytes)
        else:
            yield batch


def _cut(batch: pa.RecordBatch, size: int) -> Iterator[pa.RecordBatch]:
    if size <= BATCH_BYTES or batch.num_rows <= 1:
        yield batch
        return
    pieces = -(-size // BATCH_BYTES)
    # Whole bytes of the validity bitmaps: a slice at a multiple of 8 rows refers to
    # them as they are, any other the IPC writer copies shifted (half of the cut's
    # cost on SELECT * FROM lineitem).
    step = -(-batch.num_rows // pieces)
    if step >= 8:
        step = -(-step // 8) * 8
    for start in range(0, batch.num_rows, step):
        piece = batch.slice(start, step)
        # Rows of uneven width (long strings in one part) leave a piece over the
        # size: cut it again.
        yield from _cut(piece, piece.nbytes)


def _cuttable(schema: pa.Schema) -> bool:
    return not any(_has_view(field.type) for field in schema)


def _has_view(kind: pa.DataType) -> bool:
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        return True
    return any(_has_view(kind.field(i).type) for i in range(kind.num_fields))
