"""Tables the scheduler keeps but cannot read now, and the thread that tries again.

A table's entry in the state store outlives what its files' store does for a
moment: a restarted scheduler whose object store is away, or a mount not there
yet, finds the entry and cannot read the footers; a write whose commit took
effect may fail to read its new files' footers. Such a table is not dropped (a
store away for a minute would cost the catalog every table in it, and a table
the warehouse owns could not even be created again: its location holds a
manifest). It stays in the store, out of the planner's catalog, here: a query
naming it fails saying what could not be read and since when, and a thread reads
it again every ``defaults.UNREADABLE_TABLE_RETRY_S``; once it can, the table is
back in the catalog. ``DROP TABLE`` forgets it, and registering the name again
replaces it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping

from mangonel import defaults
from mangonel.catalog import Table
from mangonel.errors import CatalogError, MangonelError, UnknownTableError
from mangonel.scheduler.restore import UnreadableTable, load_stored
from mangonel.scheduler.store.base import CatalogStore

log = logging.getLogger(__name__)


class UnreadableTables:
    """The tables kept but not readable now, by name.

    Args:
        lock: The core's lock, held by every change here: a table read again must
            not come back into the catalog after a ``DROP`` or a new ``register``.
        catalog: Where a table read again goes.
        stop: Set when the scheduler stops (the thread ends).
        every_s: How often the thread tries each table again.
    """

    def __init__(
        self,
        lock: threading.RLock,
        catalog: CatalogStore,
        stop: threading.Event,
        every_s: float = defaults.UNREADABLE_TABLE_RETRY_S,
    ) -> None:
        self._lock = lock
        self._catalog = catalog
        self._stop = stop
        self._every_s = every_s
        self._tables: dict[str, UnreadableTable] = {}
        self._thread: threading.Thread | None = None

    def add(self, name: str, entry: UnreadableTable) -> None:
        """Keep ``name`` out of the catalog until it can be read."""
        with self._lock:
            self._tables[name] = entry
            self._catalog.drop(name)

    def add_all(self, entries: Mapping[str, UnreadableTable]) -> None:
        for name, entry in entries.items():
            self.add(name, entry)

    def forget(self, name: str) -> UnreadableTable | None:
        """No longer try ``name`` (dropped, or registered again): what was kept."""
        with self._lock:
            return self._tables.pop(name, None)

    def get(self, name: str) -> UnreadableTable | None:
        with self._lock:
            return self._tables.get(name)

    def entries(self) -> list[tuple[str, UnreadableTable]]:
        """(name, what is kept), by name."""
        with self._lock:
            return sorted(self._tables.items())

    def refuse(self, name: str, doing: str) -> None:
        """Raise the error of an unreadable table that a statement names.

        Raises:
            CatalogError: ``name`` is kept here.
        """
        entry = self.get(name)
        if entry is not None:
            raise CatalogError(self._message(name, entry, doing))

    @contextlib.contextmanager
    def explained(self, doing: str = "read") -> Iterator[None]:
        """An unknown table that is one of these becomes an error that says so."""
        try:
            yield
        except UnknownTableError as exc:
            entry = self.get(exc.table) if exc.table else None
            if entry is None:
                raise
            raise CatalogError(self._message(exc.table or "", entry, doing)) from None

    def _message(self, name: str, entry: UnreadableTable, doing: str) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(entry.since))
        return (
            f"table {name!r} cannot be {doing} now: its files at {entry.stored.path} could "
            f"not be read (since {since} UTC): {entry.error}. The scheduler keeps it and "
            f"reads it again every {self._every_s:g} s; try again once its storage is "
            "back, or DROP TABLE it to forget it"
        )

    # ---------------------------------------------------------------- the thread

    def start(self) -> None:
        """Try the tables again on a thread of their own until the scheduler stops."""
        self._thread = threading.Thread(target=self._loop, name="unreadable-tables", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self.try_again()
            except Exception:  # the thread outlives a bug in one try
                log.exception("reading the unreadable tables again failed")

    def try_again(self) -> list[str]:
        """Read each kept table once; return the names now back in the catalog."""
        with self._lock:
            waiting = dict(self._tables)
        back = []
        for name, entry in sorted(waiting.items()):
            try:
                table = load_stored(name, entry.stored)
            except MangonelError as exc:
                with self._lock:
                    if self._tables.get(name) is entry:
                        entry.error = str(exc)
                continue
            if self._put_back(name, entry, table):
                back.append(name)
                log.info(
                    "table %s can be read again: %d files, %d rows", name, len(table.files),
                    table.rows,
                )  # fmt: skip
        return back

    def _put_back(self, name: str, entry: UnreadableTable, table: Table) -> bool:
        with self._lock:
            if self._tables.get(name) is not entry:
                return False  # dropped or registered again meanwhile
            del self._tables[name]
            self._catalog.put(table)
            return True


__all__ = ["UnreadableTables"]
