"""A task's phase clock: which phase its slot's thread is in, and for how long.

The runner marks each change of phase (``switch``) on the slot's thread; the time
since the last mark goes to the phase being left. The phases therefore never
overlap and add up to the task's time on the slot, less what ran outside any
(``IDLE``: before the first mark, after ``stop``). The executor sends the result
with the task's report (``mangonel.task.TaskTimings``), so the scheduler can say
where each stage's time went.

>>> clock = PhaseClock(now=iter([0.0, 0.5, 2.0, 2.25]).__next__)
>>> clock.switch(Phase.SETUP); clock.switch(Phase.EXECUTE); clock.switch(Phase.WRITE)
>>> clock.stop()
>>> clock.seconds[Phase.SETUP], clock.seconds[Phase.EXECUTE], clock.seconds[Phase.WRITE]
(0.5, 1.5, 0.25)

A clock costs two ``perf_counter`` calls per mark: the runner marks a few times per
task and twice per output batch (128k rows).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from mangonel.task import TaskTimings


class Phase(enum.Enum):
    IDLE = "idle"
    SETUP = "setup"
    FETCH = "fetch"
    EXECUTE = "execute"
    WRITE = "write"
    CLEANUP = "cleanup"


class PhaseClock:
    """Time per phase of one task attempt, and what its reads and writes counted.

    Not thread-safe: the slot's thread alone marks it (the counters below are
    added to by the shuffle reader and writer on that same thread).

    Args:
        now: The clock (seconds); ``time.perf_counter`` by default.
    """

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self.seconds: dict[Phase, float] = dict.fromkeys(Phase, 0.0)
        self._phase = Phase.IDLE
        self._since = 0.0
        self.fetch_remote_s = 0.0
        self.fetched_local_bytes = 0
        self.fetched_remote_bytes = 0
        self.write_io_s = 0.0

    @property
    def phase(self) -> Phase:
        return self._phase

    def switch(self, phase: Phase) -> None:
        """From now on the task is in ``phase``; the time since the last mark goes to
        the phase it leaves."""
        now = self._now()
        if self._phase is not Phase.IDLE:
            self.seconds[self._phase] += now - self._since
        self._phase, self._since = phase, now

    def stop(self) -> None:
        """The task left its last phase."""
        self.switch(Phase.IDLE)

    def timings(self, received_at: float, started_at: float, ended_at: float) -> TaskTimings:
        """What the report carries: the phases, with the attempt's instants (Unix times)."""
        s = self.seconds
        return TaskTimings(
            received_at=received_at,
            started_at=started_at,
            ended_at=ended_at,
            setup_s=s[Phase.SETUP],
            fetch_s=s[Phase.FETCH],
            execute_s=s[Phase.EXECUTE],
            write_s=s[Phase.WRITE],
            cleanup_s=s[Phase.CLEANUP],
            fetch_remote_s=self.fetch_remote_s,
            write_io_s=self.write_io_s,
            fetched_local_bytes=self.fetched_local_bytes,
            fetched_remote_bytes=self.fetched_remote_bytes,
        )
