"""A type oracle: DuckDB over empty tables with the catalog's schemas.

The planner asks it (a) whether a query binds — DuckDB's own message for an
unknown column or a type error reaches the user — and (b) the types of a
fragment's columns, so that both sides of a join key or set operation are cast
to one type before hashing (DuckDB's ``hash()`` depends on the type).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

import duckdb
import pyarrow as pa

from mangonel.catalog import Table
from mangonel.errors import BindError


class TypeOracle:
    """Answers type questions for one catalog version. Thread-safe."""

    def __init__(self, catalog: Mapping[str, Table]) -> None:
        # No extension is ever installed or loaded behind our back (``httpfs`` for
        # an s3:// path would be downloaded): mangonel reads object storage itself.
        self._con = duckdb.connect(
            ":memory:",
            config={
                "threads": 1,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            },
        )
        self._lock = threading.Lock()
        self._supertypes: dict[tuple[str, str], str] = {}
        self._tables: dict[str, dict[str, str]] = {}
        for name, table in catalog.items():
            self._con.register(name, table.schema.empty_table())

    def describe(self, sql: str) -> list[tuple[str, str]]:
        """(column name, DuckDB type) of a query's result; BindError if it does not bind."""
        with self._lock:
            try:
                rows = self._con.execute(f"DESCRIBE {sql}").fetchall()
            except duckdb.Error as err:
                raise BindError(_clean(str(err))) from None
        return [(str(r[0]), str(r[1])) for r in rows]

    def arrow_schema(self, sql: str) -> pa.Schema:
        """The Arrow schema DuckDB gives a query's result; BindError if it does not bind."""
        with self._lock:
            try:
                return self._con.sql(sql).limit(0).to_arrow_table().schema
            except duckdb.Error as err:
                raise BindError(_clean(str(err))) from None

    def table_types(self, table: str) -> dict[str, str]:
        """Column -> DuckDB type of a catalog table (asked once per oracle)."""
        types = self._tables.get(table)
        if types is None:
            types = dict(self.describe(f'SELECT * FROM "{table.replace(chr(34), chr(34) * 2)}"'))
            self._tables[table] = types
        return types

    def supertype(self, left: str, right: str) -> str:
        """The type DuckDB compares two types in (e.g. INTEGER, BIGINT -> BIGINT)."""
        if left == right:
            return left
        key = (left, right)
        if key not in self._supertypes:
            sql = (
                f"SELECT CASE WHEN random() < 2 THEN CAST(NULL AS {left}) "
                f"ELSE CAST(NULL AS {right}) END AS t"
            )
            self._supertypes[key] = self.describe(sql)[0][1]
        return self._supertypes[key]

    def close(self) -> None:
        self._con.close()


def _clean(message: str) -> str:
    # DuckDB prefixes e.g. "Binder Error: "; keep its words, they name the problem.
    return message.strip()


_CACHE_SIZE = 4
_cache: OrderedDict[tuple[tuple[str, str, tuple[str, ...], str], ...], TypeOracle] = OrderedDict()
_cache_lock = threading.Lock()


def oracle_for(tables: Mapping[str, Table]) -> TypeOracle:
    """A shared oracle for these tables, made once and reused by later queries.

    Opening DuckDB and registering the tables costs about 20 ms, most of a trivial
    query's planning time. The key holds each table's files and schema, so a table
    registered again with other files or columns gets a new oracle. Callers pass the
    whole catalog, not the tables of one query: each DuckDB database holds about
    4 MiB (the first one in a process about 40 MiB), and one oracle per combination
    of tables made the scheduler 100 MiB bigger after TPC-H's 22 queries.
    """
    key = tuple(
        (name, t.location, t.files, t.schema.to_string(show_schema_metadata=False))
        for name, t in sorted(tables.items())
    )
    with _cache_lock:
        oracle = _cache.get(key)
        if oracle is not None:
            _cache.move_to_end(key)
            return oracle
    oracle = TypeOracle(tables)
    with _cache_lock:
        _cache[key] = oracle
        while len(_cache) > _CACHE_SIZE:
            # Not closed here: a planner thread may still hold it; DuckDB closes
            # the connection when the last reference goes.
            _cache.popitem(last=False)
    return oracle
