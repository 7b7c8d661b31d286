"""A type oracle: DuckDB over empty tables with the catalog's schemas.

The planner asks it (a) whether a query binds — DuckDB's own message for an
unknown column or a type error reaches the user — and (b) the types of a
fragment's columns, so that both sides of a join key or set operation are cast
to one type before hashing (DuckDB's ``hash()`` depends on the type). Flight SQL
asks it (c) the types of a prepared statement's parameters, as DuckDB's binder
infers them from where they stand (``l_quantity < ?``: ``l_quantity``'s type).
"""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import duckdb
import pyarrow as pa

from mangonel.catalog import Table
from mangonel.errors import BindError
from mangonel.sqltext import identifier

_CONFIG = {
    "threads": 1,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
"""No extension is ever installed or loaded behind our back (``httpfs`` for an
s3:// path would be downloaded): mangonel reads object storage itself."""


class TypeOracle:
    """Answers type questions over some catalog tables. Thread-safe.

    Tables are added as queries need them (``add``); a name, once added, always
    means the same table (the same files and schema): a table registered again
    differently needs another oracle (``oracle_for`` makes one).
    """

    def __init__(self, catalog: Mapping[str, Table] | None = None) -> None:
        self._con = duckdb.connect(":memory:", config=_CONFIG)
        self._lock = threading.Lock()
        self._supertypes: dict[tuple[str, str, bool], str] = {}
        self._tables: dict[str, dict[str, str]] = {}
        self._held: dict[str, _TableKey] = {}
        """Name -> identity of each table registered here."""
        self._schemas: dict[str, pa.Schema] = {}
        self._bound: duckdb.DuckDBPyConnection | None = None
        """The same empty tables in a database of their own, for ``parameter_types``:
        ``json_serialize_plan`` can fail inside DuckDB, and this one is then opened
        afresh (``_drop_bound``) without touching the one every plan binds over.
        Made on first use."""
        self._bound_tables: set[str] = set()
        self.add(catalog or {})

    def fits(self, keys: Mapping[str, _TableKey]) -> bool:
        """Whether every table of ``keys`` that this oracle holds is the same table."""
        return all(self._held.get(name, key) == key for name, key in keys.items())

    def add(self, tables: Mapping[str, Table], keys: Mapping[str, _TableKey] | None = None) -> None:
        """Register the tables this oracle does not hold yet (empty, with their schemas).

        Raises:
            ValueError: a name it holds stands for another table (see ``fits``).
        """
        keys = keys or {name: _table_key(name, t) for name, t in tables.items()}
        with self._lock:
            for name, table in tables.items():
                held = self._held.get(name)
                if held == keys[name]:
                    continue
                if held is not None:
                    raise ValueError(f"table {name!r} is already another table in this oracle")
                _create_empty(self._con, name, table.schema)
                self._held[name] = keys[name]
                self._schemas[name] = table.schema

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

    def supertype(self, left: str, right: str, *, union: bool = False) -> str:
        """The type DuckDB compares two types in, or with ``union`` the type a set
        operation's column of the two takes.

        A comparison of a string with any other type casts the string to that type
        (``int_col = varchar_col`` compares integers, and fails on a string that is
        not one; an ENUM or a JSON is compared as a string), where a CASE of the two
        would refuse INTEGER and VARCHAR and take VARCHAR over DATE; otherwise both
        take the wider type (INTEGER, BIGINT -> BIGINT), as a CASE does. A UNION of
        INTEGER and VARCHAR is VARCHAR.

        Raises:
            mangonel.errors.BindError: DuckDB has no such type for the two.
        """
        if left == right:
            return left
        if not union and (left == "VARCHAR") != (right == "VARCHAR"):
            other = right if left == "VARCHAR" else left
            # An ENUM or a JSON is compared with a string as a string.
            return "VARCHAR" if other == "JSON" or other.startswith("ENUM(") else other
        key = (left, right, union)
        if key not in self._supertypes:
            if union:
                sql = f"SELECT CAST(NULL AS {left}) AS t UNION ALL SELECT CAST(NULL AS {right})"
            else:
                sql = (
                    f"SELECT CASE WHEN random() < 2 THEN CAST(NULL AS {left}) "
                    f"ELSE CAST(NULL AS {right}) END AS t"
                )
            self._supertypes[key] = self.describe(sql)[0][1]
        return self._supertypes[key]

    def parameter_types(self, sql: str, count: int) -> list[pa.DataType | None]:
        """The Arrow type of each of a query's ``count`` parameters (``$1``, ``$2``...)
        as DuckDB's binder infers it from where it stands; ``None`` where nothing
        tells (``SELECT $1``), or for all of them when the query does not bind.

        DuckDB's Python API cannot prepare a statement without running it; its
        ``json_serialize_plan`` binds one and writes each parameter's type.
        """
        with self._lock:
            con = self._bound_connection()
            try:
                raw = con.execute(
                    "SELECT json_serialize_plan($1, optimize := false)", [sql]
                ).fetchall()[0][0]
            except duckdb.Error:
                self._drop_bound()  # it may be DuckDB's internal error: start afresh
                return [None] * count
            plan = json.loads(raw)
            if plan.get("error"):
                return [None] * count
            found: dict[int, str] = {}
            for node in _walk(plan):
                if node.get("expression_class") == "BOUND_PARAMETER":
                    text = _type_text(node.get("return_type") or {})
                    number = int(node.get("identifier", "0") or 0)
                    if text is not None and number not in found:
                        found[number] = text
            arrow: dict[int, pa.DataType] = {}
            if found:
                columns = ", ".join(f'CAST(NULL AS {t}) AS "{n}"' for n, t in found.items())
                try:
                    schema = con.sql(f"SELECT {columns}").limit(0).to_arrow_table().schema
                except duckdb.Error:
                    return [None] * count
                arrow = {int(f.name): f.type for f in schema}
        return [arrow.get(n) for n in range(1, count + 1)]

    def _bound_connection(self) -> duckdb.DuckDBPyConnection:
        """The connection of empty DuckDB tables, each table held here in it (the
        caller holds the lock)."""
        if self._bound is None:
            self._bound = duckdb.connect(":memory:", config=_CONFIG)
        for name in self._held.keys() - self._bound_tables:
            _create_empty(self._bound, name, self._schemas[name])
            self._bound_tables.add(name)
        return self._bound

    def _drop_bound(self) -> None:
        if self._bound is not None:
            self._bound.close()
        self._bound = None
        self._bound_tables.clear()

    def close(self) -> None:
        self._con.close()
        if self._bound is not None:
            self._bound.close()


def _create_empty(con: duckdb.DuckDBPyConnection, name: str, schema: pa.Schema) -> None:
    """An empty DuckDB table ``name`` of the columns DuckDB reads ``schema`` as.

    A DuckDB table, not the empty Arrow table registered: DuckDB binds a query over
    its own tables in about 0.6 of the time (TPC-DS's 99 DESCRIBEs 152 against 255
    ms), as a scan of a registered Arrow table asks Python for its schema each
    time the query names it. The types are the same either way (both are what
    DuckDB reads the Arrow schema as; a repeated column name becomes ``a_1`` in
    both); a schema DuckDB would make no table of stays registered.
    """
    # Not ``schema.empty_table()``: pyarrow imports pandas for it (about 40 MB of a
    # scheduler's memory, for nothing).
    empty = pa.Table.from_batches([], schema)
    con.register("__mangonel_empty", empty)
    try:
        con.execute(f"CREATE TABLE {identifier(name)} AS SELECT * FROM __mangonel_empty")
    except duckdb.Error:
        con.register(name, empty)
    finally:
        con.unregister("__mangonel_empty")


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in a serialized plan."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


_SCALARS = {
    "BOOLEAN": "BOOLEAN",
    "TINYINT": "TINYINT",
    "SMALLINT": "SMALLINT",
    "INTEGER": "INTEGER",
    "BIGINT": "BIGINT",
    "HUGEINT": "HUGEINT",
    "UTINYINT": "UTINYINT",
    "USMALLINT": "USMALLINT",
    "UINTEGER": "UINTEGER",
    "UBIGINT": "UBIGINT",
    "FLOAT": "FLOAT",
    "DOUBLE": "DOUBLE",
    "VARCHAR": "VARCHAR",
    "BLOB": "BLOB",
    "DATE": "DATE",
    "TIME": "TIME",
    "TIMESTAMP": "TIMESTAMP",
    "TIMESTAMP_SEC": "TIMESTAMP_S",
    "TIMESTAMP_MS": "TIMESTAMP_MS",
    "TIMESTAMP_NS": "TIMESTAMP_NS",
    "TIMESTAMP_TZ": "TIMESTAMPTZ",
    "INTERVAL": "INTERVAL",
}
"""DuckDB's type ids in a serialized plan -> the type's SQL name."""


def _type_text(kind: dict[str, Any]) -> str | None:
    """A serialized DuckDB type as SQL (``DECIMAL(15,2)``, ``VARCHAR[]``); ``None``
    for a type no parameter can be given (UNKNOWN, ANY, NULL) or not written here."""
    name = kind.get("id")
    info = kind.get("type_info") or {}
    if name == "DECIMAL":
        return f"DECIMAL({int(info['width'])},{int(info['scale'])})"
    if name == "LIST":
        child = _type_text(info.get("child_type") or {})
        return f"{child}[]" if child is not None else None
    return _SCALARS.get(str(name))


def _clean(message: str) -> str:
    # DuckDB prefixes e.g. "Binder Error: "; keep its words, they name the problem.
    return message.strip()


_TableKey = tuple[str, str, tuple[str, ...], str]
"""A table's identity for the oracles: name, location, files, schema."""

_CACHE_SIZE = 4
"""Oracles kept: each DuckDB database holds about 4 MiB (the first one in a process
about 40 MiB); a new one is made only when a table is registered again differently."""
_cache: list[TypeOracle] = []
"""Oracles, the most recently used last."""
_cache_lock = threading.Lock()


def _table_key(name: str, table: Table) -> _TableKey:
    return (name, table.location, table.files, table.schema.to_string(show_schema_metadata=False))


def oracle_for(tables: Mapping[str, Table]) -> TypeOracle:
    """A shared oracle that holds these tables, reused by later queries.

    Opening DuckDB costs 15 to 25 ms, and the first questions over newly
    registered tables some more: most of a short query's planning when each set
    of tables had an oracle of its own (TPC-DS SF1, a query's first planning:
    q12 186 ms, q21 453 ms), and one oracle per combination of tables made the
    scheduler 100 MiB bigger after TPC-H's 22 queries. One oracle now serves
    every query whose tables it holds or can add (callers pass a query's tables:
    they are registered as queries need them): a name it holds must stand for
    the same files and schema, so a table registered again differently gets
    another oracle.
    """
    keys = {name: _table_key(name, t) for name, t in tables.items()}
    # Found and added to under one lock: two planners cannot give one name two tables.
    with _cache_lock:
        oracle = next((o for o in reversed(_cache) if o.fits(keys)), None)
        if oracle is not None:
            _cache.remove(oracle)
            _cache.append(oracle)
            oracle.add(tables, keys)
            return oracle
    fresh = TypeOracle()  # outside the lock: the slow part
    fresh.add(tables, keys)
    with _cache_lock:
        _cache.append(fresh)
        # Not closed here: a planner thread may still hold one; DuckDB closes
        # the connection when the last reference goes.
        del _cache[:-_CACHE_SIZE]
    return fresh


@atexit.register
def _close_cached() -> None:
    """Close the cached oracles as the process exits: DuckDB's bindings report every
    object of theirs still alive at their module's teardown as a leak (``nanobind:
    leaked 28 instances!`` and a list of types at the end of every scheduler log),
    and the cache keeps its oracles' connections alive until then."""
    with _cache_lock:
        for oracle in _cache:
            oracle.close()
        _cache.clear()
