"""Tables: Parquet, CSV or JSON files, directories or globs, with the metadata the planner needs.

A CSV or JSON table's row groups are chunks of its files (byte ranges cut by
``textfiles.chunks``, rows estimated), which the planner groups into tasks as it
groups Parquet row groups; its splits carry the table's ``TextFormat``.

A ``Table`` is resolved once, when it is registered: its files, Arrow schema,
DuckDB column types, row counts and row groups. The planner splits a scan into
tasks by file and row group from this metadata, and estimates sizes from it.

A location may also be in object storage (``s3://bucket/key``, a prefix or a
glob; ``mangonel.storage``): its objects are listed, and each footer is read
with ranged GETs (never the whole object). Each object's size and ETag are kept
(``Table.objects``) and travel in every ``FileSplit``, so a task that finds the
object overwritten or deleted fails instead of reading another table's rows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import glob
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq

from mangonel import output, storage, textfiles
from mangonel.errors import CatalogError, ObjectStoreError
from mangonel.parquet_schema import arrow_schema
from mangonel.task import FileFormat, FileSplit, TextFormat

Value = int | float | Decimal | dt.date | dt.datetime | str

Range = tuple[int | dt.date, int | dt.date, bool]
"""A row group's smallest and largest value of a column, and whether it holds NULLs."""


@dataclass(frozen=True)
class RowGroup:
    path: str
    index: int
    rows: int
    bytes: int
    """Uncompressed size in memory, from the Parquet footer."""
    ranges: Mapping[str, Range] = field(default_factory=dict, hash=False, compare=False)
    start: int = 0
    stop: int = 0
    """A CSV or JSON table's chunk: the lines beginning in bytes ``[start, stop)`` of the
    file (``stop`` 0: the whole file); ``rows`` and ``bytes`` are estimates."""
    """Per integer or date column whose footer statistics are exact: its range here
    (the planner joins a table's row groups only with the rows their keys may meet,
    and aggregates in place where tasks' ranges do not overlap; ``plan.distribute``)."""


@dataclass(frozen=True)
class ColumnStats:
    """What the footers tell the planner about one column, for its estimates."""

    width: float
    """Estimated bytes per row in Arrow memory (strings: offsets + average length)."""
    low: Value | None = None
    high: Value | None = None
    """Smallest and largest value over all row groups, when every one has statistics."""
    nulls: int = 0
    dictionary: float | None = None
    """Values in the largest row group's dictionary, estimated from its page size."""

    def distinct(self, rows: int) -> float | None:
        """An estimate of the number of distinct values, where the footers give one:
        integers and dates have at most ``high - low + 1``; dictionary-encoded
        strings about as many as their largest dictionary page holds (compressed,
        so it errs low); others are unknown.
        """
        if self.dictionary is not None:
            return float(max(1, min(rows, self.dictionary)))
        low, high = self.low, self.high
        if isinstance(low, bool) or isinstance(high, bool):
            return 2.0
        if isinstance(low, int) and isinstance(high, int):
            return float(max(1, min(rows, high - low + 1)))
        if isinstance(low, dt.datetime) or isinstance(high, dt.datetime):
            return None
        if isinstance(low, dt.date) and isinstance(high, dt.date):
            return float(max(1, min(rows, (high - low).days + 1)))
        return None


@dataclass(frozen=True)
class Table:
    name: str
    location: str
    """What the user registered: a file, a directory or a glob."""
    files: tuple[str, ...]
    schema: pa.Schema
    row_groups: tuple[RowGroup, ...]
    stats: Mapping[str, ColumnStats] = field(default_factory=dict, hash=False, compare=False)
    """Per column, from the footers (see ``ColumnStats``); empty for an unknown column."""
    objects: Mapping[str, storage.ObjectVersion] = field(
        default_factory=dict, hash=False, compare=False
    )
    """Per file in object storage: its size and ETag when the table was registered."""
    text: TextFormat | None = None
    """How to read a CSV or JSON table's files (``None``: Parquet)."""
    options: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    """The options it was registered with, as given (what a restarted scheduler reuses)."""

    @property
    def format(self) -> FileFormat:
        return FileFormat.PARQUET if self.text is None else self.text.format

    @functools.cached_property
    def rows(self) -> int:
        # Cached: the planner's estimates ask thousands of times a query.
        return sum(rg.rows for rg in self.row_groups)

    @functools.cached_property
    def bytes(self) -> int:
        return sum(rg.bytes for rg in self.row_groups)

    @functools.cached_property
    def distinct_counts(self) -> dict[str, tuple[float, int]]:
        """Per column that has an estimate of its distinct values over the whole
        table (``ColumnStats.distinct``): that estimate and its null count.
        Cached: every estimate of a scan of the table asks for all of them."""
        counts: dict[str, tuple[float, int]] = {}
        for name, st in self.stats.items():
            d = st.distinct(self.rows)
            if d is not None:
                counts[name] = (d, st.nulls)
        return counts

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.schema.names)

    def column_bytes(self, columns: tuple[str, ...] | list[str]) -> int:
        """Estimated in-memory bytes of the given columns, whole table."""
        return int(self.rows * self.row_width(columns))

    def row_width(self, columns: tuple[str, ...] | list[str]) -> float:
        """Estimated Arrow bytes per row of the given columns (at least 1)."""
        fallback = self.bytes / max(1, self.rows) / max(1, len(self.schema.names))
        return max(1.0, sum(self.stats[c].width if c in self.stats else fallback for c in columns))

    @functools.cached_property
    def _groups_by_file(self) -> dict[str, list[RowGroup]]:
        by_file: dict[str, list[RowGroup]] = {}
        for rg in self.row_groups:
            by_file.setdefault(rg.path, []).append(rg)
        return by_file

    def groups_of(self, splits: tuple[FileSplit, ...]) -> list[RowGroup]:
        """The row groups some splits read (a split of no row groups reads its whole file)."""
        out: list[RowGroup] = []
        for split in splits:
            groups = self._groups_by_file.get(split.path, [])
            wanted = set(split.row_groups)
            out += [rg for rg in groups if not wanted or rg.index in wanted]
        return out

    def split_of(self, groups: list[RowGroup]) -> tuple[FileSplit, ...]:
        """The splits that read exactly ``groups``."""
        return _merge(groups, self.objects, self.text)

    def splits(self, target_rows: int) -> tuple[tuple[FileSplit, ...], ...]:
        """Group row groups into task splits of about ``target_rows`` rows, evenly.

        The table's rows make ``ceil(rows / target_rows)`` tasks (at most one per
        row group) of consecutive row groups, each row group in the task its middle
        row falls in: the tasks differ by less than a row group (SF1 ``lineitem`` at
        4M rows a task was 4M + 2M, and the query waited for the bigger one).
        Row groups are never cut. Returns at least one (possibly empty) split.
        """
        groups = self.row_groups
        total = sum(rg.rows for rg in groups)
        n = max(1, min(len(groups), -(-total // max(1, target_rows))))
        tasks: list[list[RowGroup]] = [[] for _ in range(n)]
        before = 0
        for rg in groups:
            middle = before + rg.rows / 2
            tasks[min(n - 1, int(middle * n / max(1, total)))].append(rg)
            before += rg.rows
        return tuple(_merge(t, self.objects, self.text) for t in tasks if t) or (
            _merge([], self.objects, self.text),
        )


def _merge(
    groups: list[RowGroup],
    objects: Mapping[str, storage.ObjectVersion],
    text: TextFormat | None = None,
) -> tuple[FileSplit, ...]:
    """One split per file of the groups; for a text table, one per run of adjacent
    chunks of a file (a split reads one byte range)."""
    by_file: dict[tuple[str, int], list[RowGroup]] = {}
    run = 0
    last: RowGroup | None = None
    for rg in groups:
        if text is not None and (last is None or last.path != rg.path or last.stop != rg.start):
            run += 1
        by_file.setdefault((rg.path, run), []).append(rg)
        last = rg
    return tuple(
        FileSplit(
            path=path,
            row_groups=tuple(rg.index for rg in rgs),
            rows=sum(rg.rows for rg in rgs),
            bytes=sum(rg.bytes for rg in rgs),
            object_size=objects[path].size if path in objects else 0,
            version=objects[path].version if path in objects else "",
            start=rgs[0].start,
            stop=rgs[-1].stop,
            text=text,
        )
        for (path, _), rgs in by_file.items()
    )


def resolve_files(location: str, kind: FileFormat = FileFormat.PARQUET) -> tuple[str, ...]:
    """The Parquet (or ``kind``) files behind a file, directory or glob, sorted.

    An ``s3://`` location gives ``s3://`` URIs (``storage.list_objects``).
    """
    committed = _committed_files(location)
    if committed is not None:
        if not committed:
            raise CatalogError(f"{location!r} holds a committed output of no file")
        return committed
    if kind is not FileFormat.PARQUET:
        return _resolve_text_files(location, kind)
    if storage.is_remote(location):
        return _not_staged(storage.list_objects(location))
    if any(ch in location for ch in "*?["):
        files = sorted(f for f in glob.glob(location, recursive=True) if os.path.isfile(f))
        if not files:
            raise CatalogError(f"no file matches {location!r}; check the glob pattern")
        return tuple(os.path.abspath(f) for f in files)
    if os.path.isdir(location):
        files = sorted(
            os.path.join(root, f)
            for root, _, names in _walk(location)
            for f in names
            if f.endswith(".parquet") or f.endswith(".parq")
        )
        if not files:
            raise CatalogError(f"directory {location!r} holds no .parquet file")
        return tuple(os.path.abspath(f) for f in files)
    if os.path.isfile(location):
        return (os.path.abspath(location),)
    raise CatalogError(
        f"{location!r} does not exist; give the path of a Parquet file, "
        "a directory of them, or a glob"
    )


def _committed_files(location: str) -> tuple[str, ...] | None:
    """The files a write's manifest names, where ``location`` is a directory (or an
    object store's prefix) mangonel wrote; ``None`` for anything else (a file, an
    object, a glob, a directory of files no write committed)."""
    if any(ch in location for ch in "*?["):
        return None
    if storage.is_remote(location):
        if storage.is_object(location):
            return None
    elif not os.path.isdir(location):
        return None
    return output.manifest_files(location)


def _walk(location: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk`` that never enters a write's staging directory (``output.STAGING``)."""
    for root, dirs, names in os.walk(location):
        dirs[:] = [d for d in dirs if d != output.STAGING]
        yield root, dirs, names


def _not_staged(uris: tuple[str, ...]) -> tuple[str, ...]:
    """Objects outside any write's staging prefix (``output.STAGING``)."""
    return tuple(u for u in uris if f"/{output.STAGING}/" not in u)


def _resolve_text_files(location: str, kind: FileFormat) -> tuple[str, ...]:
    """The CSV or JSON files behind a file, directory (by suffix) or glob, sorted."""
    what = f"{kind.value} file (" + ", ".join(textfiles.SUFFIXES[kind]) + ", maybe .gz or .zst)"
    if storage.is_remote(location):
        return _not_staged(
            storage.list_objects(
                location, wanted=lambda key: textfiles.is_table_file(key, kind), kind=what
            )
        )
    if os.path.isdir(location):
        files = sorted(
            os.path.join(root, f)
            for root, _, names in _walk(location)
            for f in names
            if textfiles.is_table_file(f, kind)
        )
        if not files:
            raise CatalogError(f"directory {location!r} holds no {what}")
        return tuple(os.path.abspath(f) for f in files)
    if any(ch in location for ch in "*?[") or os.path.isfile(location):
        return resolve_files(location)
    raise CatalogError(
        f"{location!r} does not exist; give the path of a {kind.value} file, "
        "a directory of them, or a glob"
    )


def load_table(
    name: str,
    location: str,
    kind: FileFormat = FileFormat.PARQUET,
    options: Mapping[str, str] | None = None,
    columns: Sequence[tuple[str, str]] = (),
) -> Table:
    """Resolve a table's files and read what the planner needs of them.

    Parquet: every file's footer. CSV and JSON (``mangonel.textfiles``): the
    ``options``, and the ``columns`` (name, DuckDB type) as declared, else inferred
    from the first file's start; each file's size, cut into chunks.

    A table's name is kept in lower case: names are matched without case, as
    DuckDB's are (``MyTable`` and ``mytable`` are one table).

    Raises:
        CatalogError: a missing or unreadable path, a bad name, option or column.
    """
    if not name.isidentifier():
        raise CatalogError(
            f"table name {name!r} is not a valid identifier; use letters, digits and underscores"
        )
    name = name.lower()
    if kind is not FileFormat.PARQUET:
        return _load_text_table(name, location, kind, options or {}, columns)
    if options:
        raise CatalogError(
            f"a Parquet table takes no options (got {', '.join(sorted(options))}); "
            "its files say how they are written"
        )
    if columns:
        raise CatalogError("a Parquet table's columns come from its files; declare none")
    files = resolve_files(location)
    schema: pa.Schema | None = None
    groups: list[RowGroup] = []
    stats: dict[str, _Gathered] = {}
    objects: dict[str, storage.ObjectVersion] = {}
    for path in files:
        try:
            if storage.is_remote(path):
                # The footer only: a ranged GET of its tail (and one more when it is
                # longer than pyarrow's first guess), never the whole object.
                source = storage.open_object(path)
                objects[path] = source.version
                meta = pq.ParquetFile(source)
            else:
                meta = pq.ParquetFile(path)
        except ObjectStoreError:
            raise
        except (pa.ArrowInvalid, OSError) as exc:
            raise CatalogError(f"{path!r} is not a readable Parquet file: {exc}") from exc
        file_schema = arrow_schema(meta)
        if schema is None:
            schema = file_schema
        elif not file_schema.equals(schema, check_metadata=False):
            raise CatalogError(
                f"{path!r} has a different schema from {files[0]!r}; "
                "a table's files must share one schema"
            )
        md = meta.metadata
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            groups.append(RowGroup(path, i, rg.num_rows, rg.total_byte_size, _ranges(rg)))
            _collect(rg, stats)
    assert schema is not None  # resolve_files never returns an empty tuple
    rows = sum(g.rows for g in groups)
    return Table(
        name,
        location,
        files,
        schema,
        tuple(groups),
        {f.name: _column_stats(f.type, stats.get(f.name), rows) for f in schema},
        objects,
    )


def _load_text_table(
    name: str,
    location: str,
    kind: FileFormat,
    options: Mapping[str, str],
    columns: Sequence[tuple[str, str]],
) -> Table:
    fmt, split_bytes = textfiles.text_format(kind, options)
    files = resolve_files(location, kind)
    objects: dict[str, storage.ObjectVersion] = {}
    sizes: dict[str, int] = {}
    for path in files:
        if storage.is_remote(path):
            source = storage.open_object(path)
            objects[path] = source.version
            sizes[path] = source.version.size
            source.close()
        else:
            sizes[path] = os.path.getsize(path)
    first = files[0]
    if not columns:
        columns = textfiles.infer_columns(first, sizes[first], fmt)
    fmt = dataclasses.replace(fmt, columns=tuple((str(n), str(t)) for n, t in columns))
    schema = textfiles.check_columns(fmt.columns)
    per_line = textfiles.line_bytes(first, sizes[first], fmt)
    groups: list[RowGroup] = []
    for path in files:
        for i, c in enumerate(textfiles.chunks(path, sizes[path], fmt, split_bytes, per_line)):
            groups.append(RowGroup(path, i, c.rows, c.bytes, start=c.start, stop=c.stop))
    return Table(name, location, files, schema, tuple(groups), {}, objects, fmt, dict(options))


@dataclass
class _Gathered:
    """One column's footer statistics, summed over the row groups seen so far."""

    size: int = 0
    low: Value | None = None
    high: Value | None = None
    ranged: bool = True
    nulls: int = 0
    dictionary_bytes: int = 0


def _collect(rg: pq.RowGroupMetaData, into: dict[str, _Gathered]) -> None:
    for i in range(rg.num_columns):
        chunk = rg.column(i)
        g = into.setdefault(chunk.path_in_schema, _Gathered())
        g.size += chunk.total_uncompressed_size
        start = chunk.dictionary_page_offset
        if chunk.has_dictionary_page and start is not None and chunk.data_page_offset > start:
            g.dictionary_bytes = max(g.dictionary_bytes, chunk.data_page_offset - start)
        st = chunk.statistics
        if st is None or not st.has_min_max or rg.num_rows == 0:
            g.ranged = g.ranged and rg.num_rows == 0
            continue
        g.nulls += st.null_count or 0
        try:
            g.low = st.min if g.low is None else min(g.low, st.min)
            g.high = st.max if g.high is None else max(g.high, st.max)
        except TypeError:  # values of different kinds in different files
            g.ranged = False


def _ranges(rg: pq.RowGroupMetaData) -> dict[str, Range]:
    """Exact ranges of the row group's integer and date columns (see ``RowGroup.ranges``)."""
    out: dict[str, Range] = {}
    for i in range(rg.num_columns):
        chunk = rg.column(i)
        st = chunk.statistics
        if st is None or not st.has_min_max or st.null_count is None or rg.num_rows == 0:
            continue
        low, high = st.min, st.max
        if type(low) is not type(high) or not isinstance(low, (int, dt.date)):
            continue
        if isinstance(low, (bool, dt.datetime)):
            continue
        out[chunk.path_in_schema] = (low, high, st.null_count > 0)
    return out


def _column_stats(kind: pa.DataType, g: _Gathered | None, rows: int) -> ColumnStats:
    if g is None:
        return ColumnStats(8.0)
    strings = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    binaries = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
    if any(test(kind) for test in strings + binaries):
        # Dictionary-encoded strings are small in the file: the min and max lengths
        # say more about the average length in memory.
        ends = [len(v) for v in (g.low, g.high) if isinstance(v, (str, bytes))]
        width = 4.0 + max(g.size / max(1, rows), sum(ends) / max(1, len(ends)))
        if g.dictionary_bytes:
            # A page header of about 16 bytes, then each value with its 4-byte length.
            dictionary = max(1.0, (g.dictionary_bytes - 16) / width)
            return ColumnStats(width, g.low, g.high, g.nulls, dictionary)
    else:
        try:
            width = float(max(1, kind.bit_width // 8))
        except ValueError:  # not of fixed width (lists, structs, ...)
            width = g.size / max(1, rows)
    if not g.ranged:
        return ColumnStats(width, nulls=g.nulls)
    return ColumnStats(width, g.low, g.high, g.nulls)
