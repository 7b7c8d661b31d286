"""Whether the executor can take tasks: its work directory must have room.

A task that met a full disk (``ExecutionProblem.DISK_FULL``: shuffle files or
DuckDB spill) fails and runs again elsewhere; the executor then reports itself
*unhealthy* in its heartbeats, with the reason, and the scheduler places no
task on it until it is healthy again. Its outputs stay served meanwhile: a full
disk does not lose what is already written.

``DiskHealth`` decides, from what the shell tells it (a disk-full failure, the
free space at each heartbeat); it reads no file and no clock itself::

    healthy ──(free < low water)──────────────▶ unhealthy
    healthy ──(a task met a full disk)────────▶ unhealthy
    unhealthy ──(free >= low water, and hold_s
                 passed since the last
                 disk-full failure)───────────▶ healthy

The low water mark is ``min(MIN_FREE_BYTES, MIN_FREE_SHARE of the disk)``: a
disk that has less free is full for a task's purposes. The hold after a
failure matters when the failed task's own files were what filled the disk:
they are deleted at once, the space returns, and without the hold the task
could be placed right back here to fill it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from mangonel.executor.memory import format_size

MIN_FREE_BYTES = 256 * 2**20
"""Free space below which the work directory counts as full (on a big disk)."""
MIN_FREE_SHARE = 0.05
"""... or below this share of the disk, on a disk smaller than 5 GiB."""
HOLD_S = 10.0
"""Seconds an executor stays unhealthy after a task met its full disk."""


@dataclass(frozen=True)
class DiskSpace:
    """The work directory's file system, as ``statvfs`` saw it."""

    path: str
    free: int
    size: int


class DiskHealth:
    """Whether the work directory has room for tasks (see the module docstring).

    Args:
        hold_s: Seconds to stay unhealthy after a disk-full failure.

    >>> health = DiskHealth(hold_s=10)
    >>> health.check(DiskSpace("/w", 10 * 2**30, 100 * 2**30), now=0.0)
    ''
    >>> health.disk_full(now=1.0)
    >>> health.check(DiskSpace("/w", 10 * 2**30, 100 * 2**30), now=5.0)
    'a task found /w full 4 s ago (10.0 GiB free now of 100.0 GiB)'
    >>> health.check(DiskSpace("/w", 10 * 2**30, 100 * 2**30), now=11.0)
    ''
    """

    def __init__(self, hold_s: float = HOLD_S) -> None:
        self.hold_s = hold_s
        self._last_full: float | None = None

    def disk_full(self, now: float) -> None:
        """A task failed because the work directory had no room."""
        self._last_full = now

    def check(self, space: DiskSpace, now: float) -> str:
        """``""`` when the executor may take tasks, else why not (for people)."""
        low = min(MIN_FREE_BYTES, int(space.size * MIN_FREE_SHARE))
        state = f"{format_size(space.free)} free now of {format_size(space.size)}"
        if space.free < low:
            return f"work directory {space.path} is full ({state}; it needs {format_size(low)})"
        if self._last_full is not None and now - self._last_full < self.hold_s:
            return f"a task found {space.path} full {now - self._last_full:.0f} s ago ({state})"
        return ""
