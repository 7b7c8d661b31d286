"""A DB-API 2.0 (PEP 249) driver over ``mangonel.Session``: what SQLAlchemy drives.

>>> from mangonel.client import dbapi                                 # doctest: +SKIP
>>> con = dbapi.connect("127.0.0.1:50050")
>>> cur = con.cursor()
>>> cur.execute("SELECT n_name FROM nation WHERE n_regionkey = ?", [1])
>>> cur.fetchall()

Each ``execute`` runs one query as a job on the cluster and reads its whole result
(Arrow) before returning; the fetch methods hand out its rows as Python values, and
``fetch_arrow_table`` the table itself. mangonel runs SELECT (and EXPLAIN) only and
keeps no transactions: ``commit`` and ``rollback`` do nothing, and any other statement
fails with ``ProgrammingError``, as any query the engine refuses.

Parameters (``paramstyle`` ``qmark``: a ``?`` outside string literals, identifiers and
comments for each value of a sequence) are written into the text as SQL literals by
``literal``, since the scheduler takes a query's text alone. ``qmark`` rather than
``pyformat``: SQL written by hand (``pandas.read_sql("... LIKE '%A%'", engine)``) goes
through as written, with no ``%`` to double.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from mangonel import errors, sqltext
from mangonel.client.session import Result, Session
from mangonel.client.status import TableInfo
from mangonel.client.url import ConnectOptionError, ConnectOptions

apilevel = "2.0"
threadsafety = 1  # threads may share the module, not connections
paramstyle = "qmark"


# PEP 249's exception tree.
class Warning(Exception):  # noqa: A001 - the name PEP 249 gives it
    pass


class Error(Exception):
    pass


class InterfaceError(Error):
    pass


class DatabaseError(Error):
    pass


class DataError(DatabaseError):
    pass


class OperationalError(DatabaseError):
    pass


class IntegrityError(DatabaseError):
    pass


class InternalError(DatabaseError):
    pass


class ProgrammingError(DatabaseError):
    pass


class NotSupportedError(DatabaseError):
    pass


def _translate(exc: errors.MangonelError) -> DatabaseError:
    """The PEP 249 error a mangonel error is, with its message (``__cause__``: it)."""
    if isinstance(exc, errors.QueryError):  # the query as written cannot run
        kind: type[DatabaseError] = ProgrammingError
    elif isinstance(exc, errors.InternalError):
        kind = InternalError
    else:  # the cluster, a login, a failed or cancelled job, a timeout
        kind = OperationalError
    return kind(str(exc))


# PEP 249's type objects: a description's type code (the Arrow type's text) equals
# the one its values are.
class _TypeObject:
    def __init__(self, *kinds: str) -> None:
        self.kinds = kinds

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith(self.kinds)

    def __hash__(self) -> int:
        return hash(self.kinds)


STRING = _TypeObject("string", "large_string")
BINARY = _TypeObject("binary", "large_binary", "fixed_size_binary")
NUMBER = _TypeObject("int", "uint", "float", "double", "halffloat", "decimal", "bool")
DATETIME = _TypeObject("date", "time", "timestamp", "duration")
ROWID = _TypeObject()

Date = dt.date
Time = dt.time
Timestamp = dt.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> dt.date:  # noqa: N802 - PEP 249's names
    return dt.date.fromtimestamp(ticks)


def TimeFromTicks(ticks: float) -> dt.time:  # noqa: N802
    return dt.datetime.fromtimestamp(ticks).time()


def TimestampFromTicks(ticks: float) -> dt.datetime:  # noqa: N802
    return dt.datetime.fromtimestamp(ticks)


def literal(value: object) -> str:
    """``value`` as a SQL literal in DuckDB's dialect.

    >>> literal("it's"), literal(None), literal(dt.date(1995, 3, 15))
    ("'it''s'", 'NULL', "DATE '1995-03-15'")

    Raises:
        NotSupportedError: a value of a type with no literal here.
    """
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return f"CAST('{value}' AS DOUBLE)"
    if isinstance(value, decimal.Decimal):
        return f"CAST('{value}' AS DECIMAL)" if not value.is_finite() else str(value)
    if isinstance(value, str):
        return sqltext.literal(value)
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, dt.time):
        return f"TIME '{value.isoformat()}'"
    if isinstance(value, bytes | bytearray | memoryview):
        return "'" + "".join(f"\\x{b:02x}" for b in bytes(value)) + "'::BLOB"
    if isinstance(value, list | tuple):
        return "(" + ", ".join(literal(v) for v in value) + ")"
    raise NotSupportedError(
        f"no SQL literal for a parameter of type {type(value).__name__}: give a str, "
        "number, Decimal, bool, date, datetime, time, bytes or None"
    )


def placeholders(operation: str) -> list[int]:
    """Where the ``?`` placeholders of ``operation`` are: those outside string
    literals, quoted identifiers and comments.

    >>> placeholders("SELECT '?', \"a?\" FROM t WHERE x = ? -- ?")
    [34]
    """
    found: list[int] = []
    i, n = 0, len(operation)
    while i < n:
        c = operation[i]
        if c in "'\"":  # a literal or identifier; a doubled quote stays inside it
            i += 1
            while i < n:
                if operation[i] == c:
                    if i + 1 < n and operation[i + 1] == c:
                        i += 2
                        continue
                    break
                i += 1
        elif operation.startswith("--", i):
            end = operation.find("\n", i)
            i = n if end < 0 else end
        elif operation.startswith("/*", i):
            end = operation.find("*/", i + 2)
            i = n if end < 0 else end + 1
        elif c == "?":
            found.append(i)
        i += 1
    return found


def bind(operation: str, parameters: Sequence[Any] | Mapping[str, Any] | None) -> str:
    """``operation`` with its ``?`` placeholders replaced by ``parameters`` as literals.

    Raises:
        ProgrammingError: the parameters are not a sequence, or their count is not
            the placeholders'.
    """
    if isinstance(parameters, Mapping):
        if not parameters:
            parameters = ()
        else:
            raise ProgrammingError(
                "mangonel's paramstyle is qmark: write ? in the query for each parameter "
                "and give them as a sequence, not a mapping"
            )
    values = list(parameters or ())
    at = placeholders(operation)
    if len(at) != len(values):
        raise ProgrammingError(
            f"the query has {len(at)} ? placeholder(s) and {len(values)} parameter(s) "
            "were given: give one parameter for each ?"
        )
    pieces, start = [], 0
    for position, value in zip(at, values, strict=True):
        pieces += [operation[start:position], literal(value)]
        start = position + 1
    pieces.append(operation[start:])
    return "".join(pieces)


class Connection:
    """A DB-API connection: one ``mangonel.Session``."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.session.close()

    def commit(self) -> None:
        """Nothing to commit: mangonel only reads."""

    def rollback(self) -> None:
        """Nothing to roll back: mangonel only reads."""

    def cursor(self) -> Cursor:
        self._check_open()
        return Cursor(self)

    def tables(self) -> list[TableInfo]:
        """The cluster's registered tables (what the SQLAlchemy dialect reflects)."""
        self._check_open()
        try:
            return self.session.tables()
        except errors.MangonelError as exc:
            raise _translate(exc) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the connection is closed")

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_Description = tuple[str, str, None, None, None, None, bool]


class Cursor:
    """A DB-API cursor: ``execute`` runs the query; the fetch methods read its rows."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self.result: Result | None = None
        """The last query's ``mangonel.Result``: its job id, stages and timings."""
        self._rows: Iterator[tuple[Any, ...]] = iter(())
        self._closed = False

    @property
    def description(self) -> list[_Description] | None:
        if self.result is None:
            return None
        return [
            (name, str(field.type), None, None, None, None, True)
            for name, field in zip(self.result.columns, self.result.table.schema, strict=True)
        ]

    @property
    def rowcount(self) -> int:
        return -1 if self.result is None else self.result.num_rows

    def execute(
        self, operation: str, parameters: Mapping[str, Any] | Sequence[Any] | None = None
    ) -> Cursor:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        self.connection._check_open()
        text = bind(operation, parameters)
        try:
            self.result = self.connection.session.sql(text)
        except errors.MangonelError as exc:
            self.result = None
            raise _translate(exc) from exc
        self._rows = _rows(self.result.table)
        return self

    def executemany(
        self, operation: str, seq_of_parameters: Sequence[Mapping[str, Any] | Sequence[Any]]
    ) -> None:
        raise NotSupportedError("mangonel runs queries, not repeated statements: use execute")

    def fetchone(self) -> tuple[Any, ...] | None:
        self._check_result()
        return next(self._rows, None)

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        self._check_result()
        count = self.arraysize if size is None else size
        return [row for _, row in zip(range(count), self._rows, strict=False)]

    def fetchall(self) -> list[tuple[Any, ...]]:
        self._check_result()
        return list(self._rows)

    def fetch_arrow_table(self) -> pa.Table:
        """The whole result as Arrow (the rows not fetched yet and those fetched)."""
        self._check_result()
        assert self.result is not None
        return self.result.table

    def close(self) -> None:
        self._closed = True
        self._rows = iter(())

    def setinputsizes(self, sizes: object) -> None:
        pass

    def setoutputsize(self, size: object, column: object = None) -> None:
        pass

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        self._check_result()
        return self._rows

    def _check_result(self) -> None:
        if self.result is None:
            raise ProgrammingError("no query has run on this cursor: call execute first")


def _rows(table: pa.Table) -> Iterator[tuple[Any, ...]]:
    for batch in table.to_batches(max_chunksize=10_000):
        columns = [column.to_pylist() for column in batch.columns]
        yield from zip(*columns, strict=True)


def connect(
    address: str | None = None,
    *,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    tls_ca: str | None = None,
    tls_dir: str | None = None,
    timeout_s: float | None = None,
    query_timeout_s: float | None = None,
) -> Connection:
    """A connection to the cluster whose scheduler is at ``address`` (``host:port``).

    The options are ``mangonel.connect``'s (see ``client.url``); the session connects
    on its first call.
    """
    options = {
        "user": user,
        "password": password,
        "token": token,
        "tls_ca": tls_ca,
        "tls_dir": tls_dir,
        "timeout_s": timeout_s,
        "query_timeout_s": query_timeout_s,
    }
    try:
        session = ConnectOptions.from_mapping(address or "", options).connect()
    except (ConnectOptionError, ValueError, errors.MangonelError) as exc:
        raise InterfaceError(str(exc)) from exc
    return Connection(session)
