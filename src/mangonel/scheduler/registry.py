"""The shell's registry of executors: their info, life-cycle state and command queue.

The state machine decides when an executor is lost; the registry remembers it
for status pages (when and why), and owns each executor's outbound queue: the
Connect stream of that executor drains it. Closing the queue ends the stream.

::

    CONNECTING --Connect--> ALIVE --Drain--> DRAINING
        |                     |                 |
        +---------------------+-----------------+--> LOST (stream broke, heartbeat
                                                          timeout, fetch failures,
                                                          drained)

A drained executor that still serves a result no client has read stays
DRAINING here (``awaiting_results``) although the state machine has let it go;
it moves to LOST, reason "drained", once the result is released.
"""

from __future__ import annotations

import enum
import queue
import time
from dataclasses import dataclass, field

from mangonel.ids import ExecutorId
from mangonel.scheduler.events import LossReason
from mangonel.task import ExecutorInfo


class ExecutorPhase(enum.Enum):
    CONNECTING = "connecting"
    ALIVE = "alive"
    DRAINING = "draining"
    LOST = "lost"


CLOSE = object()
"""Put on a command queue to end the executor's Connect stream."""


@dataclass
class ExecutorEntry:
    """One executor as the shell knows it."""

    info: ExecutorInfo
    pid: int
    work_dir: str
    phase: ExecutorPhase = ExecutorPhase.CONNECTING
    since: float = field(default_factory=time.time)
    """Unix time of the last phase change (for people, so wall-clock time)."""
    reason: LossReason | None = None
    detail: str = ""
    last_heard: float = 0.0
    """Monotonic time of its last heartbeat or report (the shell's clock)."""
    awaiting_results: bool = False
    """Drained, but kept connected until the results it holds are read."""
    restored: bool = False
    """Known from the state store after a scheduler restart, not reconnected yet."""
    resume_held: frozenset[str] | None = None
    """Set when it reattaches after a scheduler restart: the output files it still has."""
    resume_jobs: tuple[str, ...] = ()
    """The jobs it has files of, when it reattaches (those no job needs are released)."""
    commands: queue.SimpleQueue[object] = field(default_factory=queue.SimpleQueue)

    @property
    def id(self) -> ExecutorId:
        return self.info.id

    @property
    def usable(self) -> bool:
        return self.phase in (ExecutorPhase.ALIVE, ExecutorPhase.DRAINING)

    def move(
        self, phase: ExecutorPhase, reason: LossReason | None = None, detail: str = ""
    ) -> None:
        self.phase, self.since, self.reason, self.detail = phase, time.time(), reason, detail
        if phase is ExecutorPhase.LOST:
            self.commands.put(CLOSE)
