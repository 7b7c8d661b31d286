"""Tables: Parquet files, directories or globs, with the metadata the planner needs.

A ``Table`` is resolved once, when it is registered: its files, Arrow schema,
DuckDB column types, row counts and row groups. The planner splits a scan into
tasks by file and row group from this metadata, and estimates sizes from it.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from mangonel.errors import CatalogError
from mangonel.plan.physical import FileSplit


@dataclass(frozen=True)
class RowGroup:
    path: str
    index: int
    rows: int
    bytes: int
    """Uncompressed size in memory, from the Parquet footer."""


@dataclass(frozen=True)
class Table:
    name: str
    location: str
    """What the user registered: a file, a directory or a glob."""
    files: tuple[str, ...]
    schema: pa.Schema
    row_groups: tuple[RowGroup, ...]

    @property
    def rows(self) -> int:
        return sum(rg.rows for rg in self.row_groups)

    @property
    def bytes(self) -> int:
        return sum(rg.bytes for rg in self.row_groups)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.schema.names)

    def column_bytes(self, columns: tuple[str, ...] | list[str]) -> int:
        """Estimated in-memory bytes of the given columns, whole table."""
        total = max(1, len(self.schema.names))
        # The footer gives per-column sizes, but row groups are summed already;
        # a proportional estimate by column count is enough to pick broadcast sides.
        return self.bytes * max(1, len(columns)) // total

    def splits(self, target_rows: int) -> tuple[tuple[FileSplit, ...], ...]:
        """Group row groups into task splits of at most about ``target_rows`` rows.

        Row groups are never cut: a row group is a task of its own unless it is
        small, when consecutive row groups are merged up to ``target_rows``.
        Returns at least one (possibly empty) split.
        """
        tasks: list[tuple[FileSplit, ...]] = []
        current: list[RowGroup] = []
        rows = 0
        for rg in self.row_groups:
            if current and rows + rg.rows > target_rows:
                tasks.append(_merge(current))
                current, rows = [], 0
            current.append(rg)
            rows += rg.rows
        if current or not tasks:
            tasks.append(_merge(current))
        return tuple(tasks)


def _merge(groups: list[RowGroup]) -> tuple[FileSplit, ...]:
    by_file: dict[str, list[RowGroup]] = {}
    for rg in groups:
        by_file.setdefault(rg.path, []).append(rg)
    return tuple(
        FileSplit(
            path=path,
            row_groups=tuple(rg.index for rg in rgs),
            rows=sum(rg.rows for rg in rgs),
            bytes=sum(rg.bytes for rg in rgs),
        )
        for path, rgs in by_file.items()
    )


def resolve_files(location: str) -> tuple[str, ...]:
    """The Parquet files behind a file, directory or glob, sorted."""
    if any(ch in location for ch in "*?["):
        files = sorted(f for f in glob.glob(location, recursive=True) if os.path.isfile(f))
        if not files:
            raise CatalogError(f"no file matches {location!r}; check the glob pattern")
        return tuple(os.path.abspath(f) for f in files)
    if os.path.isdir(location):
        files = sorted(
            os.path.join(root, f)
            for root, _, names in os.walk(location)
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


def load_table(name: str, location: str) -> Table:
    """Read the footers of every file of a table; raise ``CatalogError`` when unreadable."""
    if not name.isidentifier():
        raise CatalogError(
            f"table name {name!r} is not a valid identifier; use letters, digits and underscores"
        )
    files = resolve_files(location)
    schema: pa.Schema | None = None
    groups: list[RowGroup] = []
    for path in files:
        try:
            meta = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise CatalogError(f"{path!r} is not a readable Parquet file: {exc}") from exc
        file_schema = meta.schema_arrow
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
            groups.append(RowGroup(path, i, rg.num_rows, rg.total_byte_size))
    assert schema is not None  # resolve_files never returns an empty tuple
    return Table(name, location, files, schema, tuple(groups))
