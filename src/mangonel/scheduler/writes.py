"""Who may write where: the write roots, the warehouse, and the checks at submission.

The scheduler's shell (``scheduler.core``) asks these before it plans a write
statement (``sql.writes``); the commit itself is ``output.commit``, carried out
by the shell when the state machine says ``CommitWrite``.

* ``COPY ... TO`` writes only under a root the scheduler was given
  (``--write-root``, repeatable): the location's real path (symbolic links
  followed, ``..`` resolved) must lie under a root's real path; an ``s3://``
  location must start with an ``s3://`` root. No root: ``COPY`` is refused.
* ``CREATE TABLE AS`` and ``INSERT INTO`` write under the warehouse
  (``--warehouse``), one directory per table, which the scheduler owns.

It also keeps the files a commit retired (``Retirements``) until the jobs that
may read them are done.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from mangonel import output, storage
from mangonel.catalog import Table
from mangonel.errors import (
    ForbiddenStatementError,
    PermissionDeniedError,
    QueryError,
    UnknownTableError,
)
from mangonel.output import CommitMode
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.plan.write import plan_write
from mangonel.sql.writes import WriteKind, WriteStatement
from mangonel.sqltext import identifier, literal
from mangonel.task import WriteFormat

WRITER_HINT = (
    "only admins and writers may write (a users file's admin or writer role, or a cluster "
    "without users); ask an admin for the writer role (`mangonel users add NAME --writer`)"
)


DROPPED = 'SELECT true AS "Success" WHERE false'
"""What ``DROP TABLE`` answers (as DuckDB does: no row, a ``Success`` column)."""
EXISTS = 'SELECT CAST(0 AS BIGINT) AS "Count"'
"""What ``CREATE TABLE IF NOT EXISTS`` of a table there is answers."""


@dataclass(frozen=True)
class WriteSettings:
    """Where this scheduler writes: its warehouse and its write roots."""

    warehouse: str
    write_roots: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeleteRetired:
    """Delete the files ``job``'s commit at ``location`` took out of its manifest
    (``output.delete_retired``): no job that may read them runs any more."""

    location: str
    job: str


class Retirements:
    """Which commits' retired files wait for which jobs to finish.

    A commit that replaces files (``OVERWRITE``, ``CREATE OR REPLACE``, a ``DROP
    TABLE``: ``output.drop``) takes them out of the manifest at once, but a job
    planned before it may be about to read them (its tasks name the files). So
    they stay until every job that was unfinished when the commit landed has
    finished, and every statement then being planned (it may have read the
    catalog before the commit) has finished as the job it became. Jobs submitted
    after the commit are planned on the new manifest and are not waited for.

    >>> r = Retirements()
    >>> r.committed("/out/t", "j2", unfinished={"j1"})
    []
    >>> r.finished("j1")
    [DeleteRetired(location='/out/t', job='j2')]
    >>> r.committed("/out/t", "j3", unfinished={"planning-7"})
    []
    >>> r.became("planning-7", "j4")
    >>> r.finished("planning-7"), r.finished("j4")
    ([], [DeleteRetired(location='/out/t', job='j3')])
    """

    def __init__(self) -> None:
        self._waiting: dict[DeleteRetired, set[str]] = {}

    def committed(self, location: str, job: str, unfinished: Iterable[str]) -> list[DeleteRetired]:
        """``job``'s commit at ``location`` retired files while ``unfinished`` ran;
        the deletion to carry out now, if none of them runs."""
        release = DeleteRetired(location, job)
        readers = set(unfinished) - {job}
        if not readers:
            return [release]
        self._waiting[release] = readers
        return []

    def became(self, planning: str, job: str) -> None:
        """A statement being planned (``planning``, counted among the unfinished so
        that a plan made on the old manifest is waited for) is now ``job``."""
        for readers in self._waiting.values():
            if planning in readers:
                readers.discard(planning)
                readers.add(job)

    def finished(self, job: str) -> list[DeleteRetired]:
        """``job`` ended: the deletions no job holds back any more."""
        ready = []
        for release, readers in list(self._waiting.items()):
            readers.discard(job)
            if not readers:
                del self._waiting[release]
                ready.append(release)
        return ready

    def waiting(self) -> dict[DeleteRetired, frozenset[str]]:
        """The deletions held back, and by which jobs."""
        return {r: frozenset(j) for r, j in self._waiting.items()}


def default_warehouse(state_url: str) -> str:
    """Beside a SQLite state file (``sqlite:///dir/x.db`` -> ``dir/warehouse``); else
    ``~/.local/state/mangonel/warehouse``."""
    if state_url.startswith("sqlite:///"):
        return os.path.join(os.path.dirname(state_url[len("sqlite://") :]), "warehouse")
    return os.path.expanduser("~/.local/state/mangonel/warehouse")


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def allowed_location(location: str, roots: Sequence[str]) -> str:
    """``location`` normalized (``output.normalize``) if it lies under one of ``roots``.

    Raises:
        ForbiddenStatementError: no root is given: this scheduler writes nowhere.
        PermissionDeniedError: the location is outside every root (after ``..``
            and symbolic links are resolved).
    """
    if not roots:
        raise ForbiddenStatementError(
            f"COPY to {location!r} is refused: this scheduler allows no write location; "
            "start it with --write-root DIR (or s3://bucket/prefix), repeatable"
        )
    if storage.is_remote(location):
        uri = storage.parse(location)
        if ".." in uri.key.split("/"):
            raise PermissionDeniedError(f"{location!r}: '..' is not allowed in a location")
        target = output.normalize(location)
        for root in roots:
            if storage.is_remote(root):
                base = root.rstrip("/")
                if target == base or target.startswith(base + "/"):
                    return target
    else:
        target = output.normalize(location)
        real = _real(target)
        for root in roots:
            if storage.is_remote(root):
                continue
            base = _real(root)
            if real == base or real.startswith(base.rstrip("/") + "/"):
                return target
    raise PermissionDeniedError(
        f"COPY to {location!r} is refused: it is outside every write root of this scheduler "
        f"({', '.join(roots)}); write under one of them"
    )


def table_location(warehouse: str, table: str) -> str:
    """Where the warehouse keeps a table's files."""
    return output.normalize(f"{warehouse.rstrip('/')}/{table}")


def insert_query(
    query: str,
    schema: pa.Schema,
    query_columns: Sequence[str],
    table: str,
    by_name: bool = False,
    columns: Sequence[str] = (),
) -> str:
    """``query`` with its columns renamed and cast to ``schema``'s, by position, as
    DuckDB's ``INSERT INTO t SELECT`` does (files of one table share one schema);
    ``by_name`` (``INSERT INTO t BY NAME SELECT``): each of the table's columns takes
    the query's column of its name, in any case, and NULL where the query has none;
    ``columns`` (``INSERT INTO t (b, a) SELECT``): the query's i-th column goes into
    the table's column named i-th there, the others NULL (mangonel keeps no
    defaults).

    Raises:
        QueryError: the query has another number of columns than the table (or the
            column list); by name or in the list, a column the table does not have,
            or one named twice.
    """
    if columns:
        if len(query_columns) != len(columns):
            raise QueryError(
                f"INSERT INTO {table} names {len(columns)} columns ({', '.join(columns)}) "
                f"but the query gives {len(query_columns)}; select one value per named column"
            )
        sources = _by_name(schema, columns, table, listed=True)
    elif by_name:
        sources = _by_name(schema, query_columns, table)
    elif len(query_columns) != len(schema):
        raise QueryError(
            f"table {table} has {len(schema)} columns ({', '.join(schema.names)}) but the query "
            f"gives {len(query_columns)}; select one value per column, in the table's order, "
            "or name them as the table does and write INSERT INTO ... BY NAME"
        )
    else:
        sources = list(range(len(schema)))
    import duckdb

    # A cursor of its own: DuckDB's connections (the module-wide default one too)
    # refuse a call while another thread's is in them, and the scheduler plans
    # statements on several threads at once.
    with duckdb.default_connection().cursor() as con:
        types = con.from_arrow(schema.empty_table()).types
    q = [f'"q{i}"' for i in range(len(query_columns))]
    cols = ", ".join(
        f"{_cast(None if source is None else q[source], str(types[i]), table, name)} "
        f"AS {identifier(name)}"
        for i, (name, source) in enumerate(zip(schema.names, sources, strict=True))
    )
    return f"SELECT {cols} FROM ({query}) AS __insert({', '.join(q)})"


def _cast(value: str | None, type_: str, table: str, column: str) -> str:
    """``value`` (NULL where None) as the table column's type. A column of DuckDB's
    NULL type (a table made from ``SELECT NULL AS n``) takes NULLs only, as in DuckDB,
    which cannot cast a value to it: any other fails the statement, saying why."""
    if type_ != '"NULL"':
        return f"CAST({value or 'NULL'} AS {type_})"
    if value is None:
        return "NULL"
    why = literal(
        f"column {column} of table {table} has no type (it was made from a bare NULL) "
        "and takes only NULL; make the table again with a typed NULL, such as "
        "CAST(NULL AS INTEGER)"
    )
    return f"CASE WHEN {value} IS NULL THEN NULL ELSE error({why}) END"


def _by_name(
    schema: pa.Schema, names: Sequence[str], table: str, listed: bool = False
) -> list[int | None]:
    """For each of the table's columns, the position of the one of its name in
    ``names`` (case aside, as DuckDB's names go), or ``None``: ``names`` are the
    query's columns (BY NAME) or, ``listed``, the statement's column list."""
    whose = "the column list" if listed else "the query"
    how = (
        f"INSERT INTO {table} (...) writes the query's columns into those it names, in order"
        if listed
        else f"INSERT INTO {table} BY NAME takes each of the table's columns from the "
        "query's column of its name"
    )
    positions: dict[str, int] = {}
    for i, column in enumerate(names):
        if column.lower() in positions:
            raise QueryError(f"{whose} names column {column!r} twice; {how}")
        positions[column.lower()] = i
    known = {name.lower() for name in schema.names}
    unknown = [c for c in names if c.lower() not in known]
    if unknown:
        raise QueryError(
            f"table {table} has no column {unknown[0]!r} (its columns: "
            f"{', '.join(schema.names)}); {how}"
        )
    return [positions.get(name.lower()) for name in schema.names]


def plan_statement(
    statement: WriteStatement,
    catalog: Mapping[str, Table],
    owned: frozenset[str],
    settings: WriteSettings,
    planner: PlannerConfig,
    dialect: str | None = None,
) -> DistributedPlan | str:
    """The plan of a ``COPY``, ``CREATE TABLE AS`` or ``INSERT`` after its checks; or,
    for a ``CREATE TABLE IF NOT EXISTS`` of a table there is, the query that answers it.

    ``owned``: the tables the warehouse owns (only those take ``INSERT`` and
    ``CREATE OR REPLACE``).

    Raises:
        PermissionDeniedError, ForbiddenStatementError: ``COPY`` outside the write roots.
        QueryError: (a subclass) the statement cannot run as written.
    """
    name = statement.table
    query, fmt, partition_by, table = statement.query, statement.format, statement.partition_by, ""
    if statement.kind is WriteKind.COPY:
        location = allowed_location(statement.location, settings.write_roots)
        mode = CommitMode.REPLACE if statement.overwrite else CommitMode.CREATE
        if mode is CommitMode.CREATE and output.has_files(location):
            raise QueryError(
                f"{statement.location!r} already holds files; add OVERWRITE to replace "
                "them, or write to another location"
            )
    elif statement.kind is WriteKind.CREATE_TABLE:
        if name in catalog and statement.if_not_exists:
            return EXISTS
        if name in catalog and not statement.overwrite:
            raise QueryError(
                f"table {name!r} exists; use CREATE OR REPLACE TABLE, or DROP TABLE it first"
            )
        if name in catalog and name not in owned:
            raise QueryError(
                f"table {name!r} was registered from files mangonel does not own; "
                "DROP TABLE it first"
            )
        if not name.isidentifier():
            raise QueryError(f"table name {name!r} is not a valid identifier")
        table, location, mode = name, table_location(settings.warehouse, name), CommitMode.REPLACE
        fmt, partition_by = WriteFormat.PARQUET, ()
    elif statement.kind is WriteKind.INSERT:
        existing = catalog.get(name)
        if existing is None:
            raise UnknownTableError(f"there is no table {name!r} to insert into", table=name)
        if name not in owned:
            raise QueryError(
                f"table {name!r} was registered from files; mangonel inserts only into "
                "tables it created (CREATE TABLE ... AS)"
            )
        columns = plan_query(statement.query, catalog, planner, dialect).columns
        query = insert_query(
            statement.query, existing.schema, columns, name, statement.by_name, statement.columns
        )
        table, location, mode = name, output.normalize(existing.location), CommitMode.APPEND
        fmt, partition_by = WriteFormat.PARQUET, ()
    else:
        raise ValueError(f"{statement.kind.value} is not planned")
    return plan_write(
        query,
        catalog,
        planner,
        location=location,
        format=fmt,
        mode=mode,
        partition_by=partition_by,
        table=table,
        dialect=dialect,
        options=statement.options,
        count=not statement.declared,
    )
