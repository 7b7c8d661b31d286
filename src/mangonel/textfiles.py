"""CSV and newline-delimited JSON files: their options, schema, splits and reading.

This module owns what is particular to text tables, for the catalog (at
register) and the executor (in a task):

* ``text_format``: the options a user gives (``header``, ``delimiter``,
  ``quote``, ``escape``, ``null``, ``compression``, ``ignore_errors``,
  ``multiline``, ``split_size``), checked, as a ``task.TextFormat``;
* ``infer_columns``: the columns and their DuckDB types, sniffed by DuckDB from
  the first ``SAMPLE_BYTES`` of the first file, once, at register. The catalog
  stores them and every task reads with them (DuckDB's sniffing is off in
  tasks), so every executor sees the same schema, and a restarted scheduler too;
* ``chunks``: a file cut into byte ranges of about ``split_size`` bytes, the
  units the planner groups into tasks (as it groups Parquet row groups). A
  compressed file, or one registered ``multiline``, is one chunk: read whole;
* ``read_splits``: a task's splits as Arrow. A split reads the lines that begin
  at a byte of ``[start, stop)``, as Hadoop's ``LineRecordReader`` (and so
  Spark) splits text: it skips the partial line it starts in, and reads on past
  ``stop`` to the end of the line that crosses it, so every line is read by
  exactly one split. The bytes go to a scratch file that a locked-down DuckDB
  (it may read that directory and the table's files, nothing else) parses with
  the table's columns.

A row DuckDB cannot read fails the task with ``errors.BadRowError``, naming the
file and the line in the file (the split's own line number plus the newlines
before the split, counted only then). With ``ignore_errors`` such rows are
skipped (CSV); a JSON line that does not parse is skipped, and a value that does
not convert to its column's type reads as NULL.

Quoted newlines: a CSV field holding a newline would be cut by a split that
starts inside it, so such files must be registered with ``multiline=true``,
which reads each file whole in one task (Spark refuses to split a multiLine
CSV for the same reason). Register refuses a file whose sample shows a quoted
newline without it.

Why it is over 600 lines: the options, the sniffed schema, the splits at line
boundaries and the reading of a split all apply one set of format rules
(compression, quoting, headers, multiline) that a change to any of them must
keep in step.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import tempfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import duckdb
import pyarrow as pa

from mangonel import storage
from mangonel.errors import BadRowError, CatalogError
from mangonel.sqltext import identifier, literal
from mangonel.task import Compression, FileFormat, FileSplit, TextFormat

SAMPLE_BYTES = 1 << 20
"""Bytes of the first file that DuckDB sniffs the columns' types from (its own
``sample_size`` default, 20 480 rows, is about 2 MB of TPC-H ``lineitem``)."""

DEFAULT_SPLIT_BYTES = 32 << 20
"""Bytes of a chunk: the planner puts whole chunks into tasks (Spark's
``maxPartitionBytes`` is 128 MB; mangonel's tasks read about 1M rows at most)."""

COMPRESSED_RATIO = 5
"""Assumed size of a compressed file's text over its own, for row estimates."""

_BLOCK = 64 * 1024

SUFFIXES: Mapping[FileFormat, tuple[str, ...]] = {
    FileFormat.CSV: (".csv", ".tsv", ".txt"),
    FileFormat.JSON: (".json", ".jsonl", ".ndjson"),
}
_COMPRESSED_SUFFIXES: Mapping[str, Compression] = {
    ".gz": Compression.GZIP,
    ".gzip": Compression.GZIP,
    ".zst": Compression.ZSTD,
    ".zstd": Compression.ZSTD,
}

OPTIONS: Mapping[str, str] = {
    "header": "true/false: the first line of each CSV file names the columns (default true)",
    "delimiter": "the CSV field separator, one character (default ,)",
    "quote": 'the CSV quote character, or empty for none (default ")',
    "escape": "the character that escapes a quote inside quotes, or empty for none "
    "(default: the quote)",
    "null": "the text that reads as NULL in CSV (default: the empty field)",
    "dateformat": "the strptime format of CSV dates, e.g. %d/%m/%Y (default: ISO 8601)",
    "timestampformat": "the strptime format of CSV timestamps, e.g. %d/%m/%Y %H:%M:%S "
    "(default: ISO 8601)",
    "compression": "auto (by suffix: .gz, .zst), none, gzip or zstd (default auto)",
    "ignore_errors": "true: skip CSV rows and JSON lines that do not parse, read JSON "
    "values that do not convert as NULL (default false: such a row fails the query, "
    "naming its file and line)",
    "multiline": "true: quoted CSV fields hold newlines; each file is read whole "
    "by one task (default false)",
    "split_size": f"bytes of text per chunk that tasks are made of (default {DEFAULT_SPLIT_BYTES})",
}
"""Every option of a text table and what it does: the one list that register, the
CLI's help and ``CREATE EXTERNAL TABLE ... OPTIONS`` check against."""

_ALIASES = {
    "delim": "delimiter",
    "sep": "delimiter",
    "nullstr": "null",
    "date_format": "dateformat",
    "timestamp_format": "timestampformat",
    "format_options": "",
}

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


# ---------------------------------------------------------------------- options


def file_format(name: str) -> FileFormat:
    """``parquet``, ``csv`` or ``json`` (any case; ``ndjson`` is JSON).

    Raises:
        CatalogError: another format.
    """
    text = name.strip().lower()
    if text in ("ndjson", "jsonl"):
        return FileFormat.JSON
    try:
        return FileFormat(text)
    except ValueError:
        raise CatalogError(
            f"unknown table format {name!r}; use one of parquet, csv or json"
        ) from None


def text_format(
    kind: FileFormat,
    options: Mapping[str, str],
    columns: Sequence[tuple[str, str]] = (),
) -> tuple[TextFormat, int]:
    """The options a user gave a CSV or JSON table, checked; and its chunk size.

    Raises:
        CatalogError: an unknown option, or a value it cannot take.
    """
    given: dict[str, str] = {}
    for key, value in options.items():
        name = key.strip().lower()
        name = _ALIASES.get(name, name)
        if name not in OPTIONS:
            known = ", ".join(sorted(OPTIONS))
            raise CatalogError(f"unknown option {key!r} of a {kind.value} table; known: {known}")
        given[name] = str(value)
    if "delimiter" in given and len(given["delimiter"]) != 1:
        raise CatalogError(
            f"option delimiter must be one character, got {given['delimiter']!r}; "
            "for a tab write '\\t'"
        )
    for name in ("quote", "escape"):
        if name in given and len(given[name].encode()) > 1:
            raise CatalogError(
                f"option {name} must be one single-byte character, or empty for none, "
                f"got {given[name]!r}"
            )
    for name in ("dateformat", "timestampformat"):
        problem = strftime_problem(given[name]) if name in given else None
        if problem is not None:
            raise CatalogError(
                f"option {name} {given[name]!r} is not a date format DuckDB reads: {problem}; "
                "give one such as %d/%m/%Y"
            )
    try:
        compression = Compression(given.get("compression", "auto").lower())
    except ValueError:
        raise CatalogError(
            f"option compression must be auto, none, gzip or zstd, got {given['compression']!r}"
        ) from None
    split = given.get("split_size", str(DEFAULT_SPLIT_BYTES))
    if not split.isdigit() or int(split) < 1:
        raise CatalogError(f"option split_size must be a positive number of bytes, got {split!r}")
    fmt = TextFormat(
        format=kind,
        columns=tuple(columns),
        header=_flag(given, "header", True),
        delimiter=given.get("delimiter", ","),
        quote=given.get("quote", '"'),
        escape=given.get("escape", given.get("quote", '"')),
        null=given.get("null", ""),
        compression=compression,
        ignore_errors=_flag(given, "ignore_errors", False),
        multiline=_flag(given, "multiline", False),
        dateformat=given.get("dateformat", ""),
        timestampformat=given.get("timestampformat", ""),
    )
    return fmt, int(split)


def strftime_problem(text: str) -> str | None:
    """Why DuckDB's ``strftime`` / ``strptime`` cannot take the format ``text`` (DuckDB's
    own reason, its first line), or ``None`` when it can: the one check of a date
    format, for the CSV a table reads and the CSV a ``COPY`` writes."""
    con = _connect(())
    try:
        con.execute("SELECT strftime(TIMESTAMP '2000-01-02 03:04:05', ?)", [text])
    except duckdb.Error as exc:
        return _first_line(exc).split("Error: ", 1)[-1]
    finally:
        con.close()
    return None


def _flag(given: Mapping[str, str], name: str, default: bool) -> bool:
    value = given.get(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise CatalogError(f"option {name} must be true or false, got {value!r}")


def compression_of(path: str, fmt: TextFormat) -> Compression:
    """A file's compression: the table's option, else its name's suffix."""
    if fmt.compression is not Compression.AUTO:
        return fmt.compression
    for suffix, kind in _COMPRESSED_SUFFIXES.items():
        if path.lower().endswith(suffix):
            return kind
    return Compression.NONE


def is_table_file(path: str, kind: FileFormat) -> bool:
    """Whether a file in a table's directory is one of its files, by its name."""
    name = path.lower()
    for suffix in _COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.endswith(SUFFIXES[kind])


# ----------------------------------------------------------------- the schema


def check_columns(columns: Sequence[tuple[str, str]]) -> pa.Schema:
    """The Arrow schema of declared (or inferred) columns, as DuckDB reads them.

    Raises:
        CatalogError: no columns, a name twice, or a type DuckDB does not know.
    """
    return _schema_of(tuple(columns))


@functools.lru_cache(maxsize=256)
def _schema_of(columns: tuple[tuple[str, str], ...]) -> pa.Schema:
    # Cached: every task of a text table asks, and the answer needs a DuckDB.
    if not columns:
        raise CatalogError("a table needs at least one column")
    seen: set[str] = set()
    for name, _ in columns:
        if name.lower() in seen:
            raise CatalogError(f"column {name!r} is declared twice")
        seen.add(name.lower())
    con = _connect(())
    try:
        select = ", ".join(f"CAST(NULL AS {t}) AS {identifier(n)}" for n, t in columns)
        try:
            return con.sql(f"SELECT {select} LIMIT 0").to_arrow_table().schema
        except duckdb.Error as exc:
            raise CatalogError(f"the declared columns do not parse: {_first_line(exc)}") from exc
    finally:
        con.close()


def infer_columns(path: str, size: int, fmt: TextFormat) -> tuple[tuple[str, str], ...]:
    """The columns and DuckDB types of a CSV or JSON file, sniffed from its start.

    Raises:
        CatalogError: DuckDB cannot read the sample, or (CSV) the sample holds a
            quoted newline and the table is not ``multiline``.
        ObjectStoreError: the object cannot be read.
    """
    compression = compression_of(path, fmt)
    with tempfile.TemporaryDirectory(prefix="mangonel-sniff-") as scratch:
        text = _sample(path, size, compression)
        # The sample is text, but for zstd, which only DuckDB decompresses.
        compression = compression if compression is Compression.ZSTD else Compression.NONE
        zstd = compression is Compression.ZSTD
        sample = os.path.join(scratch, "sample" + _suffix(fmt.format) + (".zst" if zstd else ""))
        with open(sample, "wb") as out:
            out.write(text)
        con = _connect((), scratch)
        try:
            read = _reader(fmt, sample, header=fmt.header, sniff=True, compression=compression)
            try:
                rows = con.sql(f"DESCRIBE SELECT * FROM {read}").fetchall()
            except duckdb.Error as exc:
                raise CatalogError(
                    f"{path!r} cannot be read as {fmt.format.value.upper()}: {_first_line(exc)}; "
                    "check the options (header, delimiter, quote, compression) or declare "
                    "the columns"
                ) from exc
            columns = tuple((str(r[0]), str(r[1])) for r in rows)
            if fmt.format is FileFormat.CSV and not fmt.multiline:
                _refuse_quoted_newlines(con, fmt, sample, columns, path, compression)
        finally:
            con.close()
    return columns


def _refuse_quoted_newlines(
    con: duckdb.DuckDBPyConnection,
    fmt: TextFormat,
    sample: str,
    columns: tuple[tuple[str, str], ...],
    path: str,
    compression: Compression,
) -> None:
    texts = [n for n, t in columns if t == "VARCHAR"]
    if not texts:
        return
    read = _reader(
        fmt, sample, fmt.header, sniff=False, columns=columns, lenient=True, compression=compression
    )
    where = " OR ".join(f"contains({identifier(n)}, chr(10))" for n in texts)
    found = con.sql(f"SELECT count(*) FROM {read} WHERE {where}").fetchall()
    if found[0][0]:
        raise CatalogError(
            f"{path!r} has quoted fields that hold newlines, which a split of the file "
            "could cut in two; register it with the option multiline=true (each file is "
            "then read whole by one task)"
        )


def _sample(path: str, size: int, compression: Compression) -> bytes:
    """The first ``SAMPLE_BYTES`` of a file's text, cut after its last whole line.

    A zstd file is given whole, still compressed (Python has no zstd decoder
    before 3.14): DuckDB decompresses it as it sniffs.
    """
    with _open(path, None) as f:
        if compression is Compression.ZSTD:
            return _read_exactly(f, 0, size)
        want = SAMPLE_BYTES if compression is Compression.NONE else SAMPLE_BYTES // 4
        data = _read_exactly(f, 0, min(size, want))
    complete = len(data) >= size
    if compression is Compression.GZIP:
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            data = inflater.decompress(data)
        except zlib.error as exc:
            raise CatalogError(f"{path!r} is not a readable gzip file: {exc}") from exc
        complete = complete and inflater.eof
    if not complete:
        data = data[: data.rfind(b"\n") + 1] or data
    return data


# --------------------------------------------------------------------- chunks


@dataclass(frozen=True)
class Chunk:
    """A byte range of a file that the planner puts into one task; ``stop`` 0: whole."""

    start: int
    stop: int
    rows: int
    bytes: int


def chunks(
    path: str, size: int, fmt: TextFormat, split_bytes: int, average_line: float
) -> list[Chunk]:
    """A file cut into byte ranges of about ``split_bytes`` (one when it cannot be split).

    ``average_line`` is a line's length in the sample (bytes), for row estimates.
    """
    text_size = size
    whole = fmt.multiline or compression_of(path, fmt) is not Compression.NONE
    if compression_of(path, fmt) is not Compression.NONE:
        text_size = size * COMPRESSED_RATIO
    per_line = max(1.0, average_line)
    if whole or size <= split_bytes:
        return [Chunk(0, 0, max(1, int(text_size / per_line)), text_size)]
    n = -(-size // split_bytes)
    bounds = [size * i // n for i in range(n + 1)]
    return [
        Chunk(a, b, max(1, int((b - a) / per_line)), b - a)
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]


def line_bytes(path: str, size: int, fmt: TextFormat) -> float:
    """The average length of a line of the file's text, from its sample (a guess
    for zstd files, which only DuckDB decompresses)."""
    compression = compression_of(path, fmt)
    if compression is Compression.ZSTD:
        return 100.0
    data = _sample(path, size, compression)
    return len(data) / max(1, data.count(b"\n"))


# -------------------------------------------------------------------- reading


def read_splits(
    splits: Sequence[FileSplit],
    columns: Sequence[str],
    scratch: str,
    opened: list[storage.ObjectFile] | None = None,
    rows_column: str = "__rows",
    memory_bytes: int | None = None,
) -> pa.Table:
    """Some splits of one text table, only ``columns`` (none: a column of NULLs
    named ``rows_column``, one a row, for ``count(*)``), as the catalog's schema
    types them. ``memory_bytes`` bounds the parsing DuckDB (the slot's share).

    Raises:
        BadRowError: a row does not parse (and the table does not ignore errors).
        ObjectStoreError: an object cannot be read, or changed since register.
    """
    opened = [] if opened is None else opened
    fmt = splits[0].text
    assert fmt is not None, "read_splits reads text splits"
    os.makedirs(scratch, exist_ok=True)
    schema = check_columns(fmt.columns)
    wanted = list(columns)
    parts: list[pa.Table] = []
    with tempfile.TemporaryDirectory(prefix="text-", dir=scratch) as work:
        local_whole = [
            os.path.realpath(s.path)
            for s in splits
            if not storage.is_remote(s.path) and s.stop == 0
        ]
        con = _connect(local_whole, work, memory_bytes)
        try:
            for i, split in enumerate(splits):
                parts.append(_read_split(con, split, fmt, wanted, work, i, opened))
        finally:
            con.close()
    if not wanted:
        rows = sum(p.num_rows for p in parts)
        return pa.table({rows_column: pa.nulls(rows)})
    target = pa.schema([schema.field(c) for c in wanted])
    return pa.concat_tables([p.cast(target) for p in parts])


def _read_split(
    con: duckdb.DuckDBPyConnection,
    split: FileSplit,
    fmt: TextFormat,
    columns: list[str],
    work: str,
    index: int,
    opened: list[storage.ObjectFile],
) -> pa.Table:
    compression = compression_of(split.path, fmt)
    begin = 0
    if split.stop == 0 and not storage.is_remote(split.path):
        target = os.path.realpath(split.path)
    else:
        target = os.path.join(work, f"{index}{_suffix(fmt.format)}{_compressed(compression)}")
        with _open(split.path, split, opened) as source, open(target, "wb") as out:
            if split.stop == 0:
                for block in _blocks(source, 0, split.object_size or _size(source)):
                    out.write(block)
            else:
                begin = _copy_lines(source, split.start, split.stop, out)
    header = fmt.header and begin == 0
    read = _reader(
        fmt, target, header=header, sniff=False, columns=fmt.columns, compression=compression
    )
    select = ", ".join(identifier(c) for c in columns) if columns else "NULL AS __rows"
    try:
        return con.sql(f"SELECT {select} FROM {read}").to_arrow_table()
    except duckdb.Error as exc:
        raise _bad_row(exc, split, begin, target, opened) from exc


def _copy_lines(source: BinaryIO, start: int, stop: int, out: BinaryIO) -> int:
    """Copy the lines that begin at a byte of ``[start, stop)``; return where the first begins.

    The first line begins after the first newline at or after ``start - 1`` (at
    0 when ``start`` is 0); the last ends at the first newline at or after
    ``stop - 1`` (or at the end of the file).
    """
    begin = 0 if start == 0 else _next_newline(source, start - 1)
    if begin < 0 or begin >= stop:
        return max(begin, start)
    end = _next_newline(source, stop - 1)
    length = (end if end >= 0 else _size(source)) - begin
    if not _copy_in_kernel(source, begin, length, out):
        for block in _blocks(source, begin, length):
            out.write(block)
    return begin


def _copy_in_kernel(source: BinaryIO, start: int, length: int, out: BinaryIO) -> bool:
    """Copy a local file's bytes without passing them through Python (``copy_file_range``:
    at SF1, 96 MB of ``lineitem.csv`` took 0.39 s read and written in blocks, as long
    as DuckDB then took to parse them). False where it cannot (an object, a pipe)."""
    try:
        src, dst = source.fileno(), out.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return False
    out.flush()
    offset, left = start, length
    try:
        while left > 0:
            done = os.copy_file_range(src, dst, left, offset)
            if done == 0:
                break
            offset += done
            left -= done
    except OSError:
        if offset != start:
            raise  # part of it copied: the caller's block copy would write it twice
        return False
    out.seek(0, os.SEEK_END)
    return True


def _next_newline(source: BinaryIO, at: int) -> int:
    """The position after the first newline at or after ``at``; -1: none (end of file)."""
    source.seek(at)
    pos = at
    while True:
        block = source.read(_BLOCK)
        if not block:
            return -1
        found = block.find(b"\n")
        if found >= 0:
            return pos + found + 1
        pos += len(block)


def _blocks(source: BinaryIO, start: int, length: int) -> Iterator[bytes]:
    source.seek(start)
    left = length
    while left > 0:
        block = source.read(min(left, 8 * 1024 * 1024))
        if not block:
            return
        left -= len(block)
        yield block


def _read_exactly(source: BinaryIO, start: int, length: int) -> bytes:
    return b"".join(_blocks(source, start, length))


def _size(source: BinaryIO) -> int:
    here = source.tell()
    end = source.seek(0, os.SEEK_END)
    source.seek(here)
    return end


_LINE = re.compile(r"\bError on Line:\s*(\d+)|\bin line (\d+)", re.IGNORECASE)
"""Where DuckDB says which line of its file (the split's) is bad: CSV, then JSON."""
_CSV_HEADLINE = re.compile(r"^(\w+ Error: )?CSV Error on Line:\s*\d+\s*$")
_JSON_LINE = re.compile(r",?\s*in line \d+")


def _bad_row(
    exc: duckdb.Error,
    split: FileSplit,
    begin: int,
    scratch_file: str,
    opened: list[storage.ObjectFile],
) -> BadRowError:
    """DuckDB's error over a split as one line naming the file and its line in the file."""
    message = str(exc)
    match = _LINE.search(message)
    where = split.path
    if match:
        line = int(match.group(1) or match.group(2))
        if begin:
            with _open(split.path, split, opened) as source:
                line += sum(block.count(b"\n") for block in _blocks(source, 0, begin))
        where = f"{split.path}, line {line}"
    # DuckDB's first paragraph says what is wrong; it names the scratch file, and its
    # line number counts from the split's start: both are said above instead.
    parts = []
    for text in message.split("\n\n")[0].splitlines():
        if _CSV_HEADLINE.match(text):
            continue  # "CSV Error on Line: N": said above
        text = re.sub(r'\s*in file "[^"]*",?', "", text.replace(scratch_file, split.path))
        text = _JSON_LINE.sub("", text).strip(" :,")
        if text:
            parts.append(text)
    return BadRowError(
        f"a row of {where} cannot be read as the table's columns say: {'; '.join(parts)}; "
        "fix the file, declare other column types, or register the table with "
        "ignore_errors=true to skip such rows"
    )


# ------------------------------------------------------------------- helpers


class _Local:
    """A local file opened for ``_copy_lines`` (a context manager like ``ObjectFile``'s)."""

    def __init__(self, path: str) -> None:
        try:
            self.file: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed by __exit__
        except OSError as exc:
            raise CatalogError(f"{path!r} cannot be read: {exc}") from exc

    def __enter__(self) -> BinaryIO:
        return self.file

    def __exit__(self, *exc: object) -> None:
        self.file.close()


class _Remote:
    """An object opened for reading; closed on exit unless a task closes it with its
    other objects (``owned``: the catalog's reads)."""

    def __init__(self, source: storage.ObjectFile, owned: bool) -> None:
        self.source = source
        self.owned = owned

    def __enter__(self) -> BinaryIO:
        return self.source  # type: ignore[return-value]

    def __exit__(self, *exc: object) -> None:
        if self.owned:
            self.source.close()


def _open(
    path: str, split: FileSplit | None, opened: list[storage.ObjectFile] | None = None
) -> _Local | _Remote:
    if not storage.is_remote(path):
        return _Local(path)
    expected = None
    if split is not None and split.object_size:
        expected = storage.ObjectVersion(split.object_size, split.version)
    source = storage.open_object(path, expected)
    if opened is not None:
        opened.append(source)
    return _Remote(source, owned=opened is None)


def _reader(
    fmt: TextFormat,
    path: str,
    header: bool,
    sniff: bool,
    columns: Sequence[tuple[str, str]] = (),
    lenient: bool = False,
    compression: Compression = Compression.NONE,
) -> str:
    """DuckDB's table function reading ``path`` as ``fmt`` says."""
    args = [literal(path), f"compression = {literal(compression.value)}"]
    if columns:
        spec = ", ".join(f"{literal(n)}: {literal(t)}" for n, t in columns)
        args.append(f"columns = {{{spec}}}")
    ignore = fmt.ignore_errors or lenient
    if fmt.format is FileFormat.JSON:
        if ignore and columns:
            # DuckDB's read_json with ignore_errors keeps a malformed line as a row
            # of NULLs; each line as a JSON value instead, the malformed ones (NULL)
            # dropped, then typed (a value that does not convert is NULL).
            lines = f"read_ndjson_objects({args[0]}, {args[1]}, ignore_errors = true)"
            shape = literal(json.dumps(dict(columns)))
            return (
                f"(SELECT unnest(json_transform(json, {shape})) FROM {lines} "
                "WHERE json IS NOT NULL)"
            )
        args += ["format = 'newline_delimited'"]
        if ignore:
            args.append("ignore_errors = true")
        return f"read_json({', '.join(args)})"
    args += [
        f"header = {str(header).lower()}",
        f"delim = {literal(fmt.delimiter)}",
        f"quote = {literal(fmt.quote)}",
        f"escape = {literal(fmt.escape)}",
        f"nullstr = {literal(fmt.null)}",
    ]
    if fmt.dateformat:
        args.append(f"dateformat = {literal(fmt.dateformat)}")
    if fmt.timestampformat:
        args.append(f"timestampformat = {literal(fmt.timestampformat)}")
    if not sniff:
        args.append("auto_detect = false")
    if ignore:
        args.append("ignore_errors = true")
    return f"read_csv({', '.join(args)})"


def _connect(
    readable: Sequence[str], directory: str | None = None, memory_bytes: int | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB that may read ``readable`` files and ``directory``, and nothing else."""
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    con.execute("SET threads = 2")
    if memory_bytes:
        con.execute("SET memory_limit = ?", [f"{max(1, memory_bytes // 1024)}KiB"])
    con.execute("SET enable_progress_bar = false")
    if readable:
        con.execute("SET allowed_paths = ?", [list(readable)])
    if directory:
        con.execute("SET allowed_directories = ?", [[directory.rstrip("/") + "/"]])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _suffix(kind: FileFormat) -> str:
    return ".csv" if kind is FileFormat.CSV else ".json"


def _compressed(kind: Compression) -> str:
    return {Compression.GZIP: ".gz", Compression.ZSTD: ".zst"}.get(kind, "")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


__all__ = [
    "DEFAULT_SPLIT_BYTES",
    "OPTIONS",
    "Chunk",
    "check_columns",
    "chunks",
    "compression_of",
    "file_format",
    "infer_columns",
    "is_table_file",
    "line_bytes",
    "read_splits",
    "strftime_problem",
    "text_format",
]
