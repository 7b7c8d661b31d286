"""A writing task's rows, written as Parquet, CSV or JSON files in its staging directory.

The task's fragment runs in its slot's locked database as any other; its Arrow
stream goes to a fresh DuckDB database that does nothing but ``COPY`` it to files
(the slot's database may reach no file: ``databases.lock_down``). That database
runs no SQL of the user's: only the ``COPY`` written here, over the stream, to the
attempt's own staging directory (``output.attempt_staging``). DuckDB's writer
gives DuckDB's file layout: its row groups, hive directories for
``PARTITION_BY``, a new file every ``FILE_SIZE_BYTES``, and the ``COPY``'s own
options (``task.WriteOptions``: compression, row groups, CSV header,
delimiter, quote, escape, NULL text and date formats) passed through as DuckDB
spells them. A staging directory in
object storage is written on local disk first, then uploaded file by file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs

from mangonel import storage
from mangonel.sqltext import identifier, literal
from mangonel.task import SinkSpec, WriteCompression, WriteFormat

FILE_SIZE_BYTES = 256 * 1024 * 1024
"""A task starts a new file past this size, so no file grows without bound."""

_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def copy_sql(sink: SinkSpec, directory: str, exact: tuple[str, ...] = ()) -> str:
    """The ``COPY`` of the relation ``__rows`` into ``directory``; the ``exact``
    columns (128-bit integers) cast to ``DECIMAL(38, 0)`` (``_exact_columns``)."""
    rows = "__rows"
    if exact:
        casts = ", ".join(
            f"CAST({identifier(c)} AS DECIMAL(38, 0)) AS {identifier(c)}" for c in exact
        )
        rows = f"(SELECT * REPLACE ({casts}) FROM __rows)"
    options = [f"FORMAT {sink.format.value}"]
    if sink.partition_by:
        options.append(f"PARTITION_BY ({', '.join(identifier(c) for c in sink.partition_by)})")
    options.append("FILENAME_PATTERN 'data_{i}'")
    options.append(f"FILE_SIZE_BYTES {FILE_SIZE_BYTES}")
    given = sink.options
    if given.compression is not None:
        # DuckDB's word for no compression is 'uncompressed' in Parquet, 'none' in text.
        plain = given.compression is WriteCompression.UNCOMPRESSED
        word = (
            "none" if plain and sink.format is not WriteFormat.PARQUET else given.compression.value
        )
        options.append(f"COMPRESSION {word}")
    if given.row_group_size is not None and sink.format is WriteFormat.PARQUET:
        options.append(f"ROW_GROUP_SIZE {int(given.row_group_size)}")
    if sink.format is WriteFormat.CSV:
        options.append(f"HEADER {'true' if given.header else 'false'}")
        options.append(f"DELIMITER {literal(given.delimiter)}")
        # Only what the statement gave: DuckDB's defaults stay DuckDB's (an empty
        # QUOTE or ESCAPE is not the default but "none").
        for word, text in (
            ("QUOTE", given.quote),
            ("ESCAPE", given.escape),
            ("NULLSTR", given.null),
            ("DATEFORMAT", given.dateformat),
            ("TIMESTAMPFORMAT", given.timestampformat),
        ):
            if text is not None:
                options.append(f"{word} {literal(text)}")
    return f"COPY {rows} TO {literal(directory)} ({', '.join(options)})"


def _exact_columns(schema: pa.Schema) -> tuple[str, ...]:
    """The columns of DuckDB's 128-bit integers (a SUM of integers is one), which
    the rows carry in DuckDB's own types (``executor.arrow_types``). DuckDB's
    Parquet writer makes a DOUBLE of them, which loses digits past 2^53; written as
    ``DECIMAL(38, 0)`` they keep every digit, and read back as a DuckDB table's
    HUGEINT reads (Arrow's ``decimal128(38, 0)``)."""
    return tuple(
        f.name
        for f in schema
        if isinstance(f.type, pa.OpaqueType)
        and f.type.vendor_name == "DuckDB"
        and f.type.type_name in ("hugeint", "uhugeint")
    )


def write_rows(
    stream: pa.RecordBatchReader,
    sink: SinkSpec,
    scratch: str,
    check: Callable[[], None],
    memory_limit: str | None = None,
    threads: int = 1,
    midway: Callable[[], None] | None = None,
) -> int:
    """Write every row of ``stream`` under ``sink.staging``; return how many.

    Args:
        stream: The fragment's rows, its columns in the order of ``sink.columns``.
        sink: Where and how.
        scratch: A local directory for the files of a remote staging directory.
        check: Called before each batch; raises to stop the write (a cancel).
        memory_limit: The writing database's DuckDB ``memory_limit``.
        threads: Its DuckDB threads.
        midway: Called once, when DuckDB asks for more rows after its first batch
            (the file is open, not finished): a test hook's point.
    """
    schema = pa.schema([f.with_name(n) for f, n in zip(stream.schema, sink.columns, strict=True)])

    def batches() -> Iterator[pa.RecordBatch]:
        given = 0
        for batch in stream:
            check()
            if given == 1 and midway is not None:
                midway()
            yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
            given += 1
        if given == 1 and midway is not None:
            midway()

    remote = storage.is_remote(sink.staging)
    local = tempfile.mkdtemp(prefix="sink-", dir=scratch) if remote else sink.staging
    target = os.path.join(local, "files") if remote else local
    if not remote:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        con = duckdb.connect(":memory:", config=_CONFIG)
        try:
            con.execute(f"SET threads = {max(1, int(threads))}")
            con.execute("SET enable_progress_bar = false")
            if memory_limit:
                con.execute("SET memory_limit = ?", [memory_limit])
            con.register("__rows", pa.RecordBatchReader.from_batches(schema, batches()))
            row = con.execute(copy_sql(sink, target, _exact_columns(schema))).fetchone()
        finally:
            con.close()
        rows = int(row[0]) if row else 0
        if remote:
            dest = storage.parse(sink.staging).fs_path
            pafs.copy_files(
                target,
                dest,
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=storage.filesystem(),
            )
        return rows
    finally:
        if remote:
            shutil.rmtree(local, ignore_errors=True)
