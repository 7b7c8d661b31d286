"""Real rows of small tables, read while planning, in a locked-down DuckDB.

The planner otherwise sees only footers and empty tables (``plan.types``). Two rules
need answers from real rows: plan-time pruning (``plan.dynamic_pruning``), the key
range of a small dimension after its filter, and the estimates (``plan.tiny``), how
many rows of a table of a few rows pass its filter. ``Probe`` gives both.

Locked down harder than an executor's scan database: its DuckDB reads no file at
all. pyarrow reads the dimension's columns from the table's own files, as the
catalog lists them (local paths, or objects through ``mangonel.storage`` with the
size and ETag seen at register), and DuckDB gets them as Arrow. External access is
off and the configuration locked before any query's SQL runs, so a filter can reach
no file, no network and no setting; extensions are never installed or loaded.

Cached: each column read, by the identity of the files it came from (a local
file's path, size and modification time; an object's size and ETag at register),
within ``CACHE_BYTES``; and each answer, by that identity and the SQL asked. A
file rewritten in place is read again; an object overwritten since register fails
the query's tasks anyway (``storage.open_object``).

Never fails a plan: a file it cannot read (a scheduler on a host without the
table's path, a store that is down) or SQL DuckDB refuses is logged with the
reason, and the plan goes on without pruning. Object storage is tried once, with
no backoff: planning does not wait the seconds an executor's read would.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime as dt
import io
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from mangonel import storage
from mangonel.catalog import Table
from mangonel.errors import ObjectStoreError
from mangonel.sqltext import identifier

log = logging.getLogger(__name__)

RELATION = "__dimension"
"""The name under which a probe's SQL reads the dimension's rows."""

CACHE_BYTES = 64 * 1024 * 1024
"""Arrow bytes of columns kept between plans: TPC-DS's ``date_dim`` at SF1 is about
0.3 MB a column, and most queries read two or three of its columns."""

ANSWERS_KEPT = 1024
"""Answers kept (a few hundred bytes each)."""

MEMORY_LIMIT = "256MB"
"""DuckDB's memory in the probe: dimensions are at most a few MiB of columns
(``dynamic_pruning.DIMENSION_BYTES``), and a min/max needs next to nothing."""

Key = int | dt.date


FileIdentity = tuple[str, int, str]
"""A file's path, size and version (a local file's modification time, an object's ETag)."""


@dataclass(frozen=True)
class KeyRange:
    """The smallest and largest non-NULL value of a key in a filtered dimension,
    and how many non-NULL keys there are (0: none, and no bounds)."""

    low: Key | None
    high: Key | None
    keys: int
    files: tuple[FileIdentity, ...] = ()
    """The files the answer was read from, as they were (``unchanged``)."""


class Probe:
    """A locked-down DuckDB over columns of catalog tables. Thread-safe."""

    def __init__(self) -> None:
        started = time.perf_counter()
        self._con = duckdb.connect(
            ":memory:",
            config={
                "threads": 1,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            },
        )
        self._con.execute("SET memory_limit = ?", [MEMORY_LIMIT])
        self._con.execute("SET temp_directory = ''")  # nothing spills: nothing is written
        self._con.execute("SET enable_progress_bar = false")
        # Last: after these two, SQL can reach no file and change no setting.
        self._con.execute("SET enable_external_access = false")
        self._con.execute("SET lock_configuration = true")
        self._lock = threading.Lock()
        self._columns: OrderedDict[tuple[tuple[FileIdentity, ...], str], pa.ChunkedArray] = (
            OrderedDict()
        )
        self._column_bytes = 0
        self._answers: OrderedDict[tuple[object, ...], KeyRange] = OrderedDict()
        self._counts: OrderedDict[tuple[object, ...], int] = OrderedDict()
        self.opened_s = time.perf_counter() - started
        """Seconds opening the database took (for the logs and the benchmark)."""

    def key_range(
        self, table: Table, columns: Sequence[str], sql: str, key: str
    ) -> KeyRange | None:
        """The range of column ``key`` of ``sql``'s result, where ``sql`` reads
        ``columns`` of ``table`` as ``RELATION``; None when it cannot be known (logged).
        """
        started = time.perf_counter()
        try:
            identity = _identity(table)
            answer_key = (identity, tuple(columns), sql, key)
            with self._lock:
                known = self._answers.get(answer_key)
                if known is not None:
                    self._answers.move_to_end(answer_key)
                    return known
            rows = self._read(table, identity, columns)
            read_s = time.perf_counter() - started
            k = identifier(key)
            query = f"SELECT min({k}), max({k}), count({k}) FROM ({sql}) AS t"
            found = self._over(rows, query)[0]
        except (OSError, pa.ArrowException, ObjectStoreError, duckdb.Error) as exc:
            log.warning(
                "plan-time pruning skipped: the key range of table %s could not be read "
                "(%s: %s); the query reads all row groups of the tables it would have pruned",
                table.name,
                type(exc).__name__,
                exc,
            )
            return None
        low, high, count = found
        result = KeyRange(_key(low), _key(high), int(count), identity)
        if count and (result.low is None or result.high is None):
            log.info("plan-time pruning skipped: %s's key is not an integer or a date", table.name)
            return None
        with self._lock:
            self._answers[answer_key] = result
            while len(self._answers) > ANSWERS_KEPT:
                self._answers.popitem(last=False)
        log.info(
            "plan-time pruning: %s's key range %s..%s (%d keys) in %.1f ms (%.1f ms reading)",
            table.name,
            result.low,
            result.high,
            result.keys,
            (time.perf_counter() - started) * 1000,
            read_s * 1000,
        )
        return result

    def count(self, table: Table, columns: Sequence[str], sql: str) -> int | None:
        """The number of rows of ``sql``, where ``sql`` reads ``columns`` of ``table``
        as ``RELATION``; None when it cannot be known (logged). The estimates ask it
        of tiny tables under a filter (``plan.tiny``)."""
        try:
            identity = _identity(table)
            answer_key = ("count", identity, tuple(columns), sql)
            with self._lock:
                known = self._counts.get(answer_key)
                if known is not None:
                    self._counts.move_to_end(answer_key)
                    return known
            rows = self._read(table, identity, columns)
            found = self._over(rows, f"SELECT count(*) FROM ({sql}) AS t")
        except (OSError, pa.ArrowException, ObjectStoreError, duckdb.Error) as exc:
            log.warning(
                "exact estimate skipped: the rows of table %s under its filter could not be "
                "counted (%s: %s); the plan uses the footers' estimate",
                table.name,
                type(exc).__name__,
                exc,
            )
            return None
        result = int(found[0][0])
        with self._lock:
            self._counts[answer_key] = result
            while len(self._counts) > ANSWERS_KEPT:
                self._counts.popitem(last=False)
        return result

    def _read(
        self, table: Table, identity: tuple[FileIdentity, ...], columns: Sequence[str]
    ) -> pa.Table:
        """The table's ``columns``, each from the cache or read from its files."""
        found: dict[str, pa.ChunkedArray] = {}
        with self._lock:
            for c in columns:
                cached = self._columns.get((identity, c))
                if cached is not None:
                    self._columns.move_to_end((identity, c))
                    found[c] = cached
        missing = [c for c in columns if c not in found]
        if missing:
            read = _read_columns(table, missing)
            with self._lock:
                for c in missing:
                    found[c] = read.column(c)
                    if (identity, c) not in self._columns:
                        self._columns[(identity, c)] = found[c]
                        self._column_bytes += found[c].nbytes
                while self._column_bytes > CACHE_BYTES and self._columns:
                    _, old = self._columns.popitem(last=False)
                    self._column_bytes -= old.nbytes
        return pa.table([found[c] for c in columns], names=list(columns))

    def warm_up(self) -> None:
        """Go once through what a first evaluation pays in a process: a Parquet read
        by pyarrow and a query over registered Arrow, on a tiny table in memory
        (nothing is read from disk). The first read of two ``date_dim`` columns in a
        fresh process took a median of 37 ms without this, 12 ms after it (ten
        processes each, on a loaded 2-core host where single runs ranged from 4 to
        510 ms).
        """
        buffer = io.BytesIO()
        # From buffers, not Python values: ``pa.array`` would import pandas.
        keys = pa.Array.from_buffers(pa.int64(), 2, [None, pa.py_buffer(b"\x01" + b"\x00" * 15)])
        pq.write_table(pa.table({"k": keys}), buffer)
        rows = pq.ParquetFile(pa.BufferReader(buffer.getvalue())).read()
        self._over(rows, f"SELECT min(k), max(k), count(k) FROM {RELATION}")

    def _over(self, rows: pa.Table, query: str) -> list[tuple[Any, ...]]:
        """``query``'s rows, with ``rows`` registered as ``RELATION`` meanwhile."""
        with self._lock:
            self._con.register(RELATION, rows)
            try:
                return self._con.execute(query).fetchall()
            finally:
                self._con.unregister(RELATION)

    def close(self) -> None:
        self._con.close()


def _read_columns(table: Table, columns: list[str]) -> pa.Table:
    """Some columns of every file of a table, read by pyarrow (object storage tried once)."""
    options = dataclasses.replace(storage.current_options(), attempts=1)
    parts = []
    for path in table.files:
        if storage.is_remote(path):
            source = storage.open_object(path, table.objects.get(path), options)
            try:
                parts.append(pq.ParquetFile(source).read(columns=columns))
            finally:
                source.close()
        else:
            parts.append(pq.ParquetFile(path).read(columns=columns))
    # Files of one table may differ in small ways (nullability): the first one's schema.
    first = parts[0].schema
    return pa.concat_tables([p if p.schema == first else p.cast(first) for p in parts])


def unchanged(files: Sequence[FileIdentity]) -> bool:
    """True when every local file of ``files`` still has its size and modification
    time (objects are checked by the executors, against the version of register)."""
    for path, size, version in files:
        if storage.is_remote(path):
            continue
        try:
            st = os.stat(path)
        except OSError:
            return False
        if (st.st_size, str(st.st_mtime_ns)) != (size, version):
            return False
    return True


def _identity(table: Table) -> tuple[FileIdentity, ...]:
    out = []
    for path in table.files:
        version = table.objects.get(path)
        if version is not None:
            out.append((path, version.size, version.version))
        else:
            st = os.stat(path)
            out.append((path, st.st_size, str(st.st_mtime_ns)))
    return tuple(out)


def _key(value: object) -> Key | None:
    """An integer or a date as the footers' ranges hold them; None for anything else."""
    if isinstance(value, (bool, dt.datetime)):
        return None
    if isinstance(value, (int, dt.date)):
        return value
    return None


_shared: Probe | None = None
_shared_lock = threading.Lock()


def shared() -> Probe:
    """The process's probe, opened on first use (15 to 25 ms: the scheduler opens it
    as it starts, ``planner.warm_up``, so that no query's planning pays it)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Probe()
            log.info("plan-time probe opened in %.1f ms", _shared.opened_s * 1000)
        return _shared


@atexit.register
def _close_shared() -> None:
    """Closed as the process exits, as the type oracles are (``types._close_cached``):
    DuckDB's bindings report a connection still alive at their teardown as a leak."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None
