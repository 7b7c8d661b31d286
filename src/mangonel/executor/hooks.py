"""Test hooks on a task's path: the ``TaskHooks`` protocol and its no-op default.

``ExecutorService`` calls these at fixed points of every task attempt::

    slot taken ──▶ task_started ──▶ runner.run (writes and commits the files;
      a write statement's writing task calls ``writing`` once DuckDB has its first
      rows and the staged file is open, not finished)
      ──▶ outputs_written ──▶ task_finished(before_report=True)
      ──▶ report to the scheduler ──▶ task_finished(before_report=False)

``outputs_written`` and both ``task_finished`` calls happen only for an attempt
that completed. The slot is free again before the report (another task may
start in it while the report and the last hook run). In production the hooks
do nothing (``NoHooks``); chaos tests give the executor
``testing.faults.FaultInjector``, which kills, freezes or
fails the task, or damages its files, at these points. Only the composition
root (``executor.main``) builds that one; no other executor module imports
the testing package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mangonel.ids import TaskAttemptId
from mangonel.task import PartitionOutput

__all__ = ["NO_HOOKS", "NoHooks", "TaskHooks"]


class TaskHooks(Protocol):
    """Called on the task's own thread; whatever a hook raises is the task's outcome."""

    def task_started(self, attempt: TaskAttemptId) -> None:
        """Before the runner starts; a ``TaskFailedError`` raised here fails the attempt."""
        ...

    def writing(self, attempt: TaskAttemptId) -> None:
        """A writing task is half-way through its staged files (``executor.sink``)."""
        ...

    def outputs_written(self, attempt: TaskAttemptId, outputs: Sequence[PartitionOutput]) -> None:
        """After the attempt committed its files, before it is reported (``OSError`` is logged)."""
        ...

    def task_finished(self, attempt: TaskAttemptId, *, before_report: bool) -> None:
        """Right before and right after the completion is reported."""
        ...


class NoHooks:
    """The production hooks: nothing happens."""

    def task_started(self, attempt: TaskAttemptId) -> None:
        pass

    def writing(self, attempt: TaskAttemptId) -> None:
        pass

    def outputs_written(self, attempt: TaskAttemptId, outputs: Sequence[PartitionOutput]) -> None:
        pass

    def task_finished(self, attempt: TaskAttemptId, *, before_report: bool) -> None:
        pass


NO_HOOKS: TaskHooks = NoHooks()
