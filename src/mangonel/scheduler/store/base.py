"""The ``StateStore`` contract, and the stores that keep nothing durable.

The scheduler's state is a set of keys holding JSON text (the layout is
``scheduler.persist``'s business); a store keeps them durably and writes a
batch of changes atomically. Implementations:

* ``SqliteStateStore`` (``scheduler.store.sqlite``): a SQLite file in WAL mode,
  the embedded default (``sqlite:///path/to/state.db``);
* ``EtcdStateStore`` (``scheduler.store.etcd``): etcd v3, for a highly
  available pair of schedulers (``etcd://host:port[,host:port...][/prefix]``);
* ``MemoryStateStore``: nothing durable (``memory://``), for tests and
  throw-away clusters.

Leadership and fencing are part of the contract, so that two schedulers never
write the same state: a scheduler first ``acquire``s the store (SQLite: an
exclusive lock on the file; etcd: a leader key bound to a lease) and every
``commit`` succeeds only while it still leads. A scheduler that lost the lead
(another one took over after its lease ran out, or it ``resign``ed) gets
``StoreFencedError`` from ``commit`` and must stop serving; ``deposed`` is set
as soon as the store notices.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Collection, Mapping
from typing import Protocol

from mangonel.catalog import Table
from mangonel.errors import StoreFencedError


class StateStore(abc.ABC):
    """Durable keys and values, written in atomic batches by the one leader.

    Keys are ``/``-separated paths without a leading slash (``jobs/ab12/plan``);
    values are text. Every method raises ``StateStoreError`` when the store
    cannot be reached or read, with a message that names the store.
    """

    url: str
    """Where the store is, as given to ``open_store`` (for messages)."""
    max_ops: int | None = None
    """Most puts and deletes one commit may hold (``None``: no limit)."""
    max_bytes: int | None = None
    """Most bytes of keys and values one commit may hold, about (``None``: no limit)."""

    def __init__(self) -> None:
        self.deposed = threading.Event()
        """Set when this scheduler stopped leading (it must stop serving)."""
        self.deposed_why = ""
        """Why, when the store knows (for the scheduler's log)."""

    @abc.abstractmethod
    def acquire(self, owner: str, timeout_s: float | None = None) -> bool:
        """Become the store's only writer; ``owner`` says who (e.g. the address).

        Waits up to ``timeout_s`` (forever with ``None``) while another
        scheduler leads; returns whether this one leads now.
        """

    @abc.abstractmethod
    def leader(self) -> str | None:
        """The ``owner`` of the scheduler that leads now, or ``None``."""

    @abc.abstractmethod
    def resign(self) -> None:
        """Stop leading (another scheduler may take over); commits fail from now on."""

    @abc.abstractmethod
    def load(self) -> dict[str, str]:
        """Every key and its value."""

    @abc.abstractmethod
    def commit(self, puts: Mapping[str, str], deletes: Collection[str] = ()) -> None:
        """Write ``puts`` and delete ``deletes`` (absent keys are fine), all or nothing.

        Raises:
            StoreFencedError: this scheduler does not lead (any more); nothing was written.
            StateStoreError: the store could not be written; nothing was written.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store (and the lead, if held)."""

    def _fenced(self, why: str) -> StoreFencedError:
        self.deposed_why = self.deposed_why or why
        self.deposed.set()
        return StoreFencedError(
            f"this scheduler no longer leads the state store {self.url}: {why}. It stops "
            "serving (status 3); the scheduler that leads now, or this one started again, "
            "has the jobs, and clients and executors given its address follow it."
        )


class MemoryStateStore(StateStore):
    """A ``StateStore`` in a dict: nothing survives the process (``memory://``)."""

    def __init__(self, url: str = "memory://") -> None:
        super().__init__()
        self.url = url
        self._lock = threading.Lock()
        self._data: dict[str, str] = {}
        self._owner: str | None = None
        self._leading = False

    def acquire(self, owner: str, timeout_s: float | None = None) -> bool:
        with self._lock:
            self._owner, self._leading = owner, True
            self.deposed.clear()
            return True

    def leader(self) -> str | None:
        with self._lock:
            return self._owner if self._leading else None

    def resign(self) -> None:
        with self._lock:
            self._leading = False
        self.deposed.set()

    def load(self) -> dict[str, str]:
        with self._lock:
            return dict(self._data)

    def commit(self, puts: Mapping[str, str], deletes: Collection[str] = ()) -> None:
        with self._lock:
            if not self._leading:
                raise self._fenced("it resigned or never acquired the store")
            for key in deletes:
                self._data.pop(key, None)
            self._data.update(puts)

    def close(self) -> None:
        self.resign()


class CatalogStore(Protocol):
    """The registered tables, by name, as the planner reads them."""

    def put(self, table: Table) -> None:
        """Add or replace a table."""

    def drop(self, name: str) -> bool:
        """Remove a table; return whether it existed."""

    def snapshot(self) -> Mapping[str, Table]:
        """An immutable view of every table, for one planning run."""


class MemoryCatalogStore:
    """The tables in a dict; the shell makes them durable through its ``StateStore``."""

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
