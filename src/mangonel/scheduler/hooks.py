"""Hooks the shell calls at fixed points of every event, for tests only.

``SchedulerCore`` calls ``hook.check(event, commands, point)`` after an
event's new state is durable (``"persisted"``) and after its commands were
carried out (``"executed"``). Production runs the no-op ``NO_HOOK``; crash
tests wire ``mangonel.testing.crash.CrashPoints`` in at the composition root
(``scheduler.main``), so the scheduler package never imports test code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mangonel.scheduler.events import Command, Event


class EventHook(Protocol):
    """Called by the shell at each point of each persisted event."""

    def check(self, event: Event, commands: Sequence[Command], point: str) -> None: ...


class NoHook:
    """The default: does nothing."""

    def check(self, event: Event, commands: Sequence[Command], point: str) -> None:
        return None


NO_HOOK = NoHook()
