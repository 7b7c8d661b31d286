"""Watching how much a slot's running task spills: a thread that looks at its files.

DuckDB spills to the slot's ``temp_directory`` (and its scan databases'
directories under it), capped by the slot's part of the spill budget, and
deletes its files when the query ends; the runner logs how much each task
spilled at most (``SpillWatch``).
"""

from __future__ import annotations

import os
import threading


class SpillWatch:
    """How much the running task of a slot spilled at most: the slot's spill files,
    looked at while it runs.

    DuckDB writes and deletes its temporary files inside a query (a hash
    aggregate's spilled partitions are gone before its first row comes out), so
    they are looked at on a thread every ``_SPILL_POLL_S``, not after. The thread
    is the slot's, for its whole life, and sleeps between tasks: one started and
    joined per task cost a tiny task (a final sort of a few rows, 8 to 16 ms in
    all) 0.3 to 1.5 ms to start it and 0.7 to 4.4 ms to join it, whenever the
    other slot's thread held the GIL (TPC-H SF1, issue 19).

    ``start`` and ``stop`` bracket one task, on the slot's thread. A look that
    began during one task never counts for the next (``_task`` names the task).
    """

    def __init__(self, spill_dir: str) -> None:
        self._dir = spill_dir
        self._cond = threading.Condition()
        """Guards the fields below and wakes the thread when a task starts."""
        self._task = 0
        """How many tasks have started: which one the thread's look belongs to."""
        self._active = False
        self._idle = True
        """The thread waits for a task (only then does ``start`` wake it)."""
        self._closed = False
        self._peak = 0
        self._thread = threading.Thread(target=self._watch, name="spill-watch", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """A task starts: watch from now, from zero."""
        with self._cond:
            self._task += 1
            self._active = True
            self._peak = 0
            if self._idle:
                self._cond.notify()

    def stop(self) -> int:
        """The task ended: the most bytes seen while it ran, its files now included."""
        now = spill_bytes(self._dir)
        with self._cond:
            self._active = False
            return max(self._peak, now)

    @property
    def peak(self) -> int:
        """The most bytes seen so far in the running (or last) task."""
        with self._cond:
            return self._peak

    def close(self) -> None:
        """End the thread (the slot closes); it does not wait for it."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._active:
                    self._idle = True
                    self._cond.wait()
                    self._idle = False
                    continue
                task = self._task
                self._cond.wait(_SPILL_POLL_S)
                if self._closed or not self._active or self._task != task:
                    continue
                self._cond.release()
                try:
                    size = spill_bytes(self._dir)
                finally:
                    self._cond.acquire()
                if self._active and self._task == task:
                    self._peak = max(self._peak, size)


_SPILL_POLL_S = 0.05
"""A spill that lasts less than this may go unseen (and costs little)."""


def spill_bytes(spill_dir: str) -> int:
    """Bytes in DuckDB's temporary files under a slot's spill directory (its scan
    databases' directories included)."""
    total = 0
    try:
        with os.scandir(spill_dir) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    total += spill_bytes(entry.path)
                elif entry.name.endswith(".tmp"):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
    except OSError:  # a file DuckDB deleted meanwhile
        pass
    return total
