"""CSV and JSON splits at line boundaries, and their options (pure: local files only)."""

from __future__ import annotations

import io
from pathlib import Path

import duckdb
import pytest

from mangonel.catalog import load_table
from mangonel.errors import BadRowError, CatalogError
from mangonel.task import Compression, FileFormat
from mangonel.textfiles import (
    _copy_lines,
    chunks,
    compression_of,
    is_table_file,
    read_splits,
    text_format,
)


def _lines_of(data: bytes, start: int, stop: int) -> list[bytes]:
    out = io.BytesIO()
    _copy_lines(io.BytesIO(data), start, stop, out)
    return out.getvalue().splitlines(keepends=True)


@pytest.mark.parametrize("ending", [b"\n", b""], ids=["newline-at-end", "no-newline-at-end"])
def test_every_split_size_reads_every_line_once(ending: bytes) -> None:
    """Whatever the split points, the splits' lines are the file's lines, once each
    and in order (empty lines too)."""
    lines = [b"a" * n + b"\n" for n in (0, 1, 5, 0, 2, 13, 1, 0, 7)]
    data = b"".join(lines) + b"last" + ending
    expected = data.splitlines(keepends=True)
    for size in range(1, len(data) + 2):
        got: list[bytes] = []
        for start in range(0, len(data), size):
            got += _lines_of(data, start, min(len(data), start + size))
        assert got == expected, f"split size {size}"


def test_a_split_with_no_line_beginning_in_it_reads_nothing() -> None:
    data = b"x" * 50 + b"\n" + b"y\n"
    assert _lines_of(data, 10, 20) == []
    assert _lines_of(data, 0, 10) == [b"x" * 50 + b"\n"]
    assert _lines_of(data, 20, 53) == [b"y\n"]


def test_chunks_cover_the_file_and_compressed_ones_are_whole() -> None:
    fmt, _ = text_format(FileFormat.CSV, {})
    parts = chunks("/d/t.csv", 1000, fmt, 300, 10.0)
    assert [(c.start, c.stop) for c in parts] == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    assert [(c.start, c.stop) for c in chunks("/d/t.csv.gz", 1000, fmt, 300, 10.0)] == [(0, 0)]
    multiline, _ = text_format(FileFormat.CSV, {"multiline": "true"})
    assert [(c.start, c.stop) for c in chunks("/d/t.csv", 1000, multiline, 300, 10.0)] == [(0, 0)]


def test_options_are_checked() -> None:
    fmt, split = text_format(
        FileFormat.CSV, {"DELIM": "|", "header": "false", "split_size": "1000", "null": "NA"}
    )
    assert (fmt.delimiter, fmt.header, fmt.null, split) == ("|", False, "NA", 1000)
    assert compression_of("/d/t.csv.zst", fmt) is Compression.ZSTD
    assert compression_of("/d/t.csv", fmt) is Compression.NONE
    with pytest.raises(CatalogError, match="unknown option 'colour'"):
        text_format(FileFormat.CSV, {"colour": "red"})
    with pytest.raises(CatalogError, match="true or false"):
        text_format(FileFormat.CSV, {"header": "maybe"})
    with pytest.raises(CatalogError, match="split_size"):
        text_format(FileFormat.CSV, {"split_size": "-5"})
    with pytest.raises(CatalogError, match="compression"):
        text_format(FileFormat.JSON, {"compression": "lz4"})
    # What COPY writes, read back: no quote at all, DuckDB's spellings of the date formats.
    plain, _ = text_format(
        FileFormat.CSV,
        {"quote": "", "date_format": "%d/%m/%Y", "timestampformat": "%d/%m/%Y %H:%M"},
    )
    assert (plain.quote, plain.escape) == ("", "")
    assert (plain.dateformat, plain.timestampformat) == ("%d/%m/%Y", "%d/%m/%Y %H:%M")
    with pytest.raises(CatalogError, match="quote must be one single-byte character"):
        text_format(FileFormat.CSV, {"quote": "«"})
    with pytest.raises(CatalogError, match="dateformat '%Q' is not a date format.*%Q"):
        text_format(FileFormat.CSV, {"dateformat": "%Q"})


def test_table_files_by_suffix() -> None:
    assert is_table_file("a/b.csv.gz", FileFormat.CSV)
    assert is_table_file("b.ndjson", FileFormat.JSON)
    assert not is_table_file("b.json", FileFormat.CSV)
    assert not is_table_file("_SUCCESS", FileFormat.JSON)


def test_a_bad_row_in_a_later_split_is_named_by_its_line_in_the_file(tmp_path: Path) -> None:
    """The split's own line number plus the newlines before it: the line in the file."""
    path = tmp_path / "bad.csv"
    lines = ["k,v"] + [f"{i},{i}" for i in range(2, 3001)]
    lines[2500 - 1] = "25x0,1"  # digits first: nothing in DuckDB's words is taken for a line
    path.write_text("\n".join(lines) + "\n")
    table = load_table("bad", str(path), FileFormat.CSV, {"split_size": "1000"})
    # Inferred from the first MiB, which holds the bad line: k is text.
    assert table.text is not None and table.text.columns == (("k", "VARCHAR"), ("v", "BIGINT"))
    table = load_table(
        "bad", str(path), FileFormat.CSV, {"split_size": "1000"}, [("k", "BIGINT"), ("v", "INT")]
    )
    later = list(table.split_of(list(table.row_groups[5:])))
    assert later[0].start > 0
    words = f"{path}, line 2500 cannot be read .*Original Line: 25x0,1;"
    with pytest.raises(BadRowError, match=words):
        read_splits(later, ["k"], str(tmp_path / "scratch"))
    skipping = load_table(
        "bad",
        str(path),
        FileFormat.CSV,
        {"split_size": "1000", "ignore_errors": "true"},
        [("k", "BIGINT"), ("v", "INT")],
    )
    every = [s for t in skipping.splits(1) for s in t]
    assert len(every) > 5
    read = read_splits(every, ["k"], str(tmp_path / "scratch"))
    assert sorted(read.column("k").to_pylist()) == [i for i in range(2, 3001) if i != 2500]


def test_ignore_errors_skips_malformed_json_lines(tmp_path: Path) -> None:
    """A malformed line is skipped (DuckDB's read_json would keep it as NULLs), a value
    that does not convert reads as NULL, and an empty object is a row of NULLs."""
    path = tmp_path / "t.json"
    path.write_text('{"a":1,"b":"x"}\n{"a":"zz","b":"y"}\n{"a":3,\n{}\n{"a":5}\n')
    columns = [("a", "BIGINT"), ("b", "VARCHAR")]
    failing = load_table("t", str(path), FileFormat.JSON, {}, columns)
    with pytest.raises(BadRowError, match=f"{path}"):
        read_splits(failing.splits(1)[0], ["a", "b"], str(tmp_path / "scratch"))
    skipping = load_table("t", str(path), FileFormat.JSON, {"ignore_errors": "true"}, columns)
    read = read_splits(skipping.splits(1)[0], ["a", "b"], str(tmp_path / "scratch"))
    assert read.to_pylist() == [
        {"a": 1, "b": "x"},
        {"a": None, "b": "y"},
        {"a": None, "b": None},
        {"a": 5, "b": None},
    ]


@pytest.mark.parametrize(
    ("name", "kind", "copy"),
    [
        ("t.csv.zst", FileFormat.CSV, "HEADER, COMPRESSION zstd"),
        ("t.json.gz", FileFormat.JSON, "FORMAT json, COMPRESSION gzip"),
    ],
)
def test_compressed_files_are_one_chunk_and_read_whole(
    tmp_path: Path, name: str, kind: FileFormat, copy: str
) -> None:
    path = tmp_path / name
    duckdb.sql(f"COPY (SELECT i, 'x' || i AS s FROM range(5000) t(i)) TO '{path}' ({copy})")
    table = load_table("t", str(path), kind, {"split_size": "100"})
    assert table.text is not None and table.text.columns == (("i", "BIGINT"), ("s", "VARCHAR"))
    assert [(g.start, g.stop) for g in table.row_groups] == [(0, 0)]
    read = read_splits(table.splits(1)[0], ["i"], str(tmp_path / "scratch"))
    assert sorted(read.column("i").to_pylist()) == list(range(5000))
