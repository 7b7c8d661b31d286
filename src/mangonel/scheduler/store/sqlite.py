"""The embedded state store: one SQLite file in WAL mode (``sqlite:///path``).

Layout: table ``kv(key, value)`` holds the scheduler's state; table ``meta``
holds the schema version, the *generation* (bumped by every scheduler that
acquires the store) and the owner. Leadership is an exclusive ``flock`` on
``<file>.lock``: the kernel drops it when the process dies, so a restarted
scheduler (even after ``kill -9``) acquires at once, and a second scheduler on
the same file waits or is told who holds it. Every commit checks, inside its
transaction, that the generation is still the one this scheduler set when it
acquired, so a scheduler whose lead was taken over can never write.

Commits are durable once ``commit`` returns (``synchronous=FULL``; WAL keeps
each commit a single append). A file that is not SQLite, fails SQLite's
integrity check or has another schema version is refused at open with a
message that says what to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Mapping

from mangonel.errors import StateStoreError
from mangonel.scheduler.store.base import StateStore

SCHEMA_VERSION = "1"
_POLL_S = 0.1


class SqliteStateStore(StateStore):
    """A ``StateStore`` in one SQLite file.

    Args:
        path: The database file; created (with its directory) when missing.
        url: How the user named it, for messages.
    """

    def __init__(self, path: str, url: str | None = None) -> None:
        super().__init__()
        self.path = os.path.abspath(os.path.expanduser(path))
        self.url = url or f"sqlite://{self.path}"
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self._generation: int | None = None
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StateStoreError(f"cannot open the state store {self.url}: {exc}") from exc
        try:
            self._setup()
        except sqlite3.Error as exc:
            self._db.close()
            raise StateStoreError(
                f"the state store {self.url} is not a readable SQLite database ({exc}); "
                "move it aside to start with an empty state, or point --state elsewhere"
            ) from exc

    def _setup(self) -> None:
        db = self._db
        db.execute("PRAGMA busy_timeout = 5000")
        check = db.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(f"integrity check failed: {check}")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
                db.execute("INSERT INTO meta VALUES ('generation', '0')")
            elif row[0] != SCHEMA_VERSION:
                raise StateStoreError(
                    f"the state store {self.url} has schema version {row[0]}, this mangonel "
                    f"reads version {SCHEMA_VERSION}; use the mangonel that wrote it, or move "
                    "the file aside to start with an empty state"
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # -------------------------------------------------------------- leadership

    def acquire(self, owner: str, timeout_s: float | None = None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(_POLL_S)
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                row = self._db.execute(
                    "SELECT value FROM meta WHERE name = 'generation'"
                ).fetchone()
                generation = int(row[0]) + 1
                self._db.execute(
                    "UPDATE meta SET value = ? WHERE name = 'generation'", (str(generation),)
                )
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('owner', ?)", (owner,))
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                os.close(fd)
                raise StateStoreError(
                    f"cannot take over the state store {self.url}: {exc}"
                ) from exc
            self._lock_fd, self._generation = fd, generation
            self.deposed.clear()
        return True

    def leader(self) -> str | None:
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                with self._lock:
                    row = self._db.execute("SELECT value FROM meta WHERE name = 'owner'").fetchone()
                return row[0] if row is not None else ""
            return None  # nobody holds the lock
        finally:
            os.close(fd)  # also drops a shared lock taken here

    def resign(self) -> None:
        with self._lock:
            self._generation = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # closing drops the flock
                self._lock_fd = None
        self.deposed.set()

    # ------------------------------------------------------------------- data

    def load(self) -> dict[str, str]:
        with self._lock:
            try:
                return dict(self._db.execute("SELECT key, value FROM kv").fetchall())
            except sqlite3.Error as exc:
                raise StateStoreError(f"cannot read the state store {self.url}: {exc}") from exc

    def commit(self, puts: Mapping[str, str], deletes: Collection[str] = ()) -> None:
        with self._lock:
            if self._generation is None:
                raise self._fenced("it does not hold the store (never acquired, or resigned)")
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                row = db.execute("SELECT value FROM meta WHERE name = 'generation'").fetchone()
                if row is None or int(row[0]) != self._generation:
                    db.execute("ROLLBACK")
                    raise self._fenced(
                        f"another scheduler acquired it (generation {row[0] if row else '?'}, "
                        f"this one had {self._generation})"
                    )
                if deletes:
                    db.executemany("DELETE FROM kv WHERE key = ?", [(k,) for k in deletes])
                if puts:
                    db.executemany(
                        "INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", list(puts.items())
                    )
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise StateStoreError(f"cannot write the state store {self.url}: {exc}") from exc

    def close(self) -> None:
        self.resign()
        with self._lock:
            self._db.close()

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # no transaction may be open
            self._db.execute("ROLLBACK")
