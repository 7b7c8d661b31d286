"""A type oracle: DuckDB over empty tables with the catalog's schemas.

The planner asks it (a) whether a query binds — DuckDB's own message for an
unknown column or a type error reaches the user — and (b) the types of a
fragment's columns, so that both sides of a join key or set operation are cast
to one type before hashing (DuckDB's ``hash()`` depends on the type).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping

import duckdb
import pyarrow as pa

from mangonel.catalog import Table
from mangonel.errors import BindError


class TypeOracle:
    """Answers type questions over some catalog tables. Thread-safe.

    Tables are added as queries need them (``add``); a name, once added, always
    means the same table (the same files and schema): a table registered again
    differently needs another oracle (``oracle_for`` makes one).
    """

    def __init__(self, catalog: Mapping[str, Table] | None = None) -> None:
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
        self._held: dict[str, _TableKey] = {}
        """Name -> identity of each table registered here."""
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
                # Not ``schema.empty_table()``: pyarrow imports pandas for it
                # (about 40 MB of a scheduler's memory, for nothing).
                self._con.register(name, pa.Table.from_batches([], table.schema))
                self._held[name] = keys[name]

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
