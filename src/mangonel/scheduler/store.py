"""Where the scheduler keeps its catalog of tables.

The service reaches the catalog only through ``CatalogStore`` so that a durable
store (SQLite, etcd) can replace the in-memory one without touching the shell.
Job records live in ``scheduler.jobs``; they are rebuilt by the state machine's
lineage, not persisted, for now.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from mangonel.catalog import Table


class CatalogStore(Protocol):
    """The registered tables, by name."""

    def put(self, table: Table) -> None:
        """Add or replace a table."""

    def drop(self, name: str) -> bool:
        """Remove a table; return whether it existed."""

    def snapshot(self) -> Mapping[str, Table]:
        """An immutable view of every table, for one planning run."""


class MemoryCatalogStore:
    """A ``CatalogStore`` in a dict: lost when the scheduler stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[str, Table] = {}

    def put(self, table: Table) -> None:
        with self._lock:
            self._tables[table.name] = table

    def drop(self, name: str) -> bool:
        with self._lock:
            return self._tables.pop(name, None) is not None

    def snapshot(self) -> Mapping[str, Table]:
        with self._lock:
            # A copy: planning runs outside the lock while tables may be re-registered.
            return dict(self._tables)
