"""The shell's side of each executor: its command queue, and what only the RPCs know.

The executor's life (connecting, alive, draining, lost, and why) is the state
machine's alone (``state_executors`` draws it); the shell reads it from the
state machine's ``ExecutorView``. What is here is I/O: the outbound queue that
the executor's Connect stream drains (``CLOSE`` ends the stream), and the
process id and work directory it registered with, for people.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from mangonel.ids import ExecutorId
from mangonel.scheduler.state_views import ExecutorState, ExecutorView

CLOSE = object()
"""Put on a command queue to end the executor's Connect stream."""


@dataclass
class ExecutorEntry:
    """One executor's stream queue, from its registration until it is forgotten."""

    id: ExecutorId
    pid: int = 0
    work_dir: str = ""
    resumed: bool = False
    """Its registration was answered with its old id (``ResumeExecutor``)."""
    commands: queue.SimpleQueue[object] = field(default_factory=queue.SimpleQueue)
    """The queue its current stream sends from (``Stream``)."""


@dataclass(frozen=True)
class Stream:
    """One Connect stream of an executor: the id the state machine knows it by
    (the ``event_id`` of the event that opened it, ``ExecutorRecord.stream``),
    and the queue it sends from. A stream moved to a new connection gets a new
    queue; the old queue is closed."""

    id: int
    commands: queue.SimpleQueue[object]


def move_queued(source: queue.SimpleQueue[object], target: queue.SimpleQueue[object]) -> None:
    """Move what ``source`` holds now to ``target``, in order."""
    while True:
        try:
            item = source.get_nowait()
        except queue.Empty:
            return
        target.put(item)


@dataclass(frozen=True)
class ExecutorListing:
    """An executor as status pages show it: the state machine's view, and its pid
    (0 for one known only from the store, after a scheduler restart)."""

    view: ExecutorView
    pid: int = 0

    @property
    def id(self) -> ExecutorId:
        return self.view.id

    @property
    def usable(self) -> bool:
        return self.view.state in (ExecutorState.ALIVE, ExecutorState.DRAINING)
