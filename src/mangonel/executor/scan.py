"""Reading a task's Parquet splits: by DuckDB's own reader where it may, else with pyarrow.

A local split is read by DuckDB's Parquet reader, as SQL in front of the
fragment (``scan_sql``): only the needed columns and the split's row groups, so
the fragment's filters and projections reach the reader. Which DuckDB type each
file's column has is asked once per process (``column_types``), and each file's
footer is kept (``metadata``); ``learn_ahead`` reads both for a job's catalog
files before its tasks need them.

A split in object storage (``s3://``) is read with pyarrow through
``mangonel.storage``, never by DuckDB (whose S3 reader, the ``httpfs``
extension, is not in the wheel; no database here installs or loads
extensions): only the split's row groups and the scan's columns, each column
chunk one ranged GET, after a check that the object is the one registered
(``read_scan``). The runner logs the bytes fetched per task.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from mangonel import storage
from mangonel.errors import ObjectStoreError
from mangonel.executor.databases import NO_EXTENSIONS
from mangonel.parquet_schema import arrow_schema, as_read
from mangonel.sqltext import identifier, literal
from mangonel.task import FileSplit

log = logging.getLogger(__name__)

ROWS_COLUMN = "__mangonel_rows"
"""Stand-in column for a scan of no columns: DuckDB cannot register a table without any."""

SCAN_BATCH_ROWS = 65_536
"""Rows per Arrow batch decoded from Parquet and handed to DuckDB (measured:
64k-row batches scan faster than 128k and 1M ones, which leave the CPU caches)."""


def scan_sql(columns: Sequence[str], splits: Sequence[FileSplit]) -> str | None:
    """DuckDB SQL reading some splits of a table, or ``None`` to read them with pyarrow.

    Each file's rows are chosen by ``file_row_number`` ranges, which DuckDB's
    reader turns into row-group pruning. Columns are cast to the types the
    planner saw (DuckDB over the file's Arrow schema) where DuckDB's own
    reading differs, since hash partitioning depends on the type.
    """
    if not columns or not splits or any(storage.is_remote(s.path) for s in splits):
        return None
    if any(s.text is not None for s in splits):
        return None  # CSV or JSON: byte ranges that ``textfiles`` cuts at lines
    parts = []
    for split in splits:
        path = os.path.realpath(split.path)
        if "file_row_number" in metadata(path).schema.names:
            return None  # the reader's row-number column would be shadowed
        selected = []
        for c in columns:
            planned, native = column_types(path, c)
            expr = identifier(c) if planned == native else f"CAST({identifier(c)} AS {planned})"
            selected.append(f"{expr} AS {identifier(c)}")
        where = " OR ".join(
            f"(file_row_number >= {start} AND file_row_number < {stop})"
            for start, stop in _row_ranges(path, split.row_groups)
        )
        parts.append(
            f"SELECT {', '.join(selected)} FROM read_parquet({literal(path)})"
            + (f" WHERE {where}" if where else "")
        )
    return " UNION ALL ".join(parts)


def read_scan(
    columns: Sequence[str],
    splits: Sequence[FileSplit],
    opened: list[storage.ObjectFile] | None = None,
    once: bool = False,
) -> pa.Table | pa.RecordBatchReader:
    """Some splits of a table: their row groups' needed columns, streamed where ``once``.

    Where DuckDB reads the scan in one pass (``once``: ``runner.read_once``), a stream:
    DuckDB consumes a ``RecordBatchReader`` batch by batch through the Arrow C
    stream (measured at SF1, 750k ``lineitem`` rows: 0.075 s to scan and hash vs
    0.10 s for the same rows read whole first), and a task never holds its decoded
    split in memory. Else a table: a fragment may name a scan more than once (a
    subquery the planner copied, such as TPC-H q20's ``part`` filter, rendered both
    in its ``IN`` and in the semi-join that cuts ``lineitem`` down, reads the same
    scan twice), and a stream, consumed by the first read, fails the second. A local
    split has no such limit: DuckDB's reader reads the file again for each.

    Objects in object storage are opened (and checked against the version the
    catalog saw) here, before the stream starts, so that a changed or missing
    object fails the task with its own typed error; ``opened`` collects them.
    """
    opened = [] if opened is None else opened
    if not columns:
        # count(*) and the like read no column: the row count is in the footers.
        rows = sum(_split_rows(split, opened) for split in splits)
        return pa.table({ROWS_COLUMN: pa.nulls(rows)})
    if not splits:
        return pa.table({c: pa.nulls(0) for c in columns})
    files = [(_parquet_file(split, opened), split) for split in splits]
    schema = _columns_schema(files[0][0], columns)
    stream = pa.RecordBatchReader.from_batches(schema, _split_batches(files, list(columns)))
    return stream if once else stream.read_all()


def _split_batches(
    files: list[tuple[pq.ParquetFile, FileSplit]], columns: list[str]
) -> Iterator[pa.RecordBatch]:
    schema = _columns_schema(files[0][0], columns)
    for parquet, split in files:
        row_groups = list(split.row_groups) or None
        for batch in parquet.iter_batches(SCAN_BATCH_ROWS, row_groups, columns):
            # Files of one table may differ in small ways (nullability, string
            # encoding); the stream has one schema, the first file's.
            yield as_read(batch, schema)


def _columns_schema(parquet: pq.ParquetFile, columns: Sequence[str]) -> pa.Schema:
    """Some columns of a file's schema as mangonel reads it (``parquet_schema``)."""
    whole = arrow_schema(parquet)
    return pa.schema([whole.field(c) for c in columns])


def _parquet_file(split: FileSplit, opened: list[storage.ObjectFile]) -> pq.ParquetFile:
    if not storage.is_remote(split.path):
        return pq.ParquetFile(split.path)
    expected = storage.ObjectVersion(split.object_size, split.version)
    source = storage.open_object(split.path, expected if split.object_size else None)
    opened.append(source)
    try:
        # pre_buffer: the column chunks of a row group that lie close together
        # come in one ranged GET (pyarrow's defaults: holes up to 8 KiB joined).
        return pq.ParquetFile(source, pre_buffer=True)
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, ObjectStoreError):
            raise
        raise ObjectStoreError(
            f"{split.path} is not a readable Parquet file any more: {exc}"
        ) from exc


def _split_rows(split: FileSplit, opened: list[storage.ObjectFile]) -> int:
    footer = _parquet_file(split, opened).metadata
    groups = split.row_groups or range(footer.num_row_groups)
    return sum(footer.row_group(g).num_rows for g in groups)


def _row_ranges(path: str, row_groups: Sequence[int]) -> list[tuple[int, int]]:
    """``file_row_number`` ranges [start, stop) of some row groups (none: all)."""
    footer = metadata(path)
    if not row_groups or len(set(row_groups)) == footer.num_row_groups:
        return []  # the whole file
    starts = [0]
    for g in range(footer.num_row_groups):
        starts.append(starts[-1] + footer.row_group(g).num_rows)
    ranges: list[tuple[int, int]] = []
    for g in sorted(row_groups):
        start, stop = starts[g], starts[g + 1]
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], stop)
        else:
            ranges.append((start, stop))
    return ranges


_TYPES: OrderedDict[tuple[str, int, int, str], tuple[str, str]] = OrderedDict()
"""(file, mtime, size, column) -> (DuckDB type over Arrow, read natively), for every slot;
the oldest files' answers are dropped past ``_TYPES_KEPT`` (a long-lived executor sees
new files, and rewritten ones under new keys)."""
_TYPES_KEPT = 65_536
_TYPES_LOCK = threading.Lock()
_TYPES_ASKED: set[tuple[str, int, int]] = set()
"""The files whose types ``_TYPES`` got (maybe dropped since: then asked again)."""
_probe: duckdb.DuckDBPyConnection | None = None
"""The database that answers ``column_types`` (under ``_TYPES_LOCK``); opened once."""


def column_types(path: str, column: str) -> tuple[str, str]:
    """A column's DuckDB type as the planner saw it (over the file's Arrow schema) and as
    DuckDB's Parquet reader reads it, asked once per file in the process.

    Asking took about 20 ms a file in each slot, most of it opening a database for
    the question: a short query's first task paid it for every table it scans
    (TPC-DS q21: 4 tables, 180 ms). The answers are the same for every slot, and
    one database asks them all. It runs no user SQL, so it needs no lock-down.
    """
    return _file_types(path, column)[column]


def _file_types(path: str, column: str | None = None) -> dict[str, tuple[str, str]]:
    """``column_types`` of a file's columns: all of them where they were asked now;
    ``column``'s alone where it was known; none where ``column`` is ``None`` and the
    file was asked before (``learn_ahead``)."""
    global _probe
    st = os.stat(path)
    file = (path, st.st_mtime_ns, st.st_size)
    with _TYPES_LOCK:
        if column is not None:
            known = _TYPES.get((*file, column))
            if known is not None:
                return {column: known}
        elif file in _TYPES_ASKED:
            return {}
        schema = arrow_schema(pq.ParquetFile(path))
        if _probe is None:
            _probe = duckdb.connect(":memory:", config=NO_EXTENSIONS)
        try:
            _probe.register("__arrow", pa.Table.from_batches([], schema))
            planned = _probe.execute("DESCRIBE SELECT * FROM __arrow").fetchall()
            native = _probe.execute(
                f"DESCRIBE SELECT * FROM read_parquet({literal(path)})"
            ).fetchall()
        finally:
            _probe.unregister("__arrow")
        native_types = {str(r[0]): str(r[1]) for r in native}
        answers = {str(r[0]): (str(r[1]), native_types.get(str(r[0]), "")) for r in planned}
        for name, answer in answers.items():
            _TYPES[(*file, name)] = answer
        while len(_TYPES) > _TYPES_KEPT:
            _TYPES.popitem(last=False)
        if len(_TYPES_ASKED) >= _TYPES_KEPT:
            _TYPES_ASKED.clear()
        _TYPES_ASKED.add(file)
        return answers


_METADATA: OrderedDict[tuple[str, float, int], pq.FileMetaData] = OrderedDict()
_METADATA_LOCK = threading.Lock()
_METADATA_KEPT = 64

LEARN_AHEAD_FILES = _METADATA_KEPT // 2
"""The most files of a job's catalog ``learn_ahead`` reads ahead (the footers kept are
``_METADATA_KEPT``: learning more would push out those the tasks use)."""
_LEARNER = ThreadPoolExecutor(1, thread_name_prefix="learn-files")
_LEARN_LOCK = threading.Lock()
_LEARNED: set[str] = set()
"""Files handed to the learner (each once per process)."""


def learn_ahead(paths: Sequence[str]) -> None:
    """Read the footers and column types of a job's catalog files ahead, at low priority.

    A task reading a file for the first time in this process read its footer and
    asked DuckDB its column types first (``metadata``, ``column_types``): 10 to
    18 ms a file (TPC-DS SF1), paid by the first query to scan each table on each
    executor (a query over five new tables: 60 ms). Every task carries its job's
    catalog files (``TaskSpec.job_files``): the first one seen starts a thread of
    the lowest CPU priority that learns them all, on cores the tasks leave idle.
    Where there are more than ``LEARN_AHEAD_FILES``, none is learned ahead.
    """
    if len(paths) > LEARN_AHEAD_FILES:
        return
    with _LEARN_LOCK:
        new = [p for p in paths if p not in _LEARNED]
        _LEARNED.update(new)
    for path in new:
        _LEARNER.submit(_learn, path)


def _learn(path: str) -> None:
    with contextlib.suppress(OSError):
        # This thread only (Linux: a thread's id is a process id to setpriority).
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    try:
        _file_types(path)
        metadata(path)
    except Exception:  # noqa: BLE001 - the task that reads the file will say what is wrong
        log.debug("learning %s ahead failed", path, exc_info=True)


def metadata(path: str) -> pq.FileMetaData:
    """A Parquet file's footer, cached by path, mtime and size (lineitem's takes ~1 ms)."""
    st = os.stat(path)
    key = (path, st.st_mtime, st.st_size)
    with _METADATA_LOCK:
        cached = _METADATA.get(key)
    if cached is None:
        cached = pq.read_metadata(path)
        with _METADATA_LOCK:
            _METADATA[key] = cached
            while len(_METADATA) > _METADATA_KEPT:
                _METADATA.popitem(last=False)
    return cached
