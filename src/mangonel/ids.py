"""Typed identifiers shared by the scheduler, the executors and the planner.

The scheduler and the executor never import each other; they meet in ``plan``,
``proto`` and here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

JobId = NewType("JobId", str)
"""A job: one submitted query. Short random hex, unique per scheduler."""

StageId = NewType("StageId", int)
"""A stage within a job, numbered from 1 in topological order."""

ExecutorId = NewType("ExecutorId", str)
"""An executor process's life: a restarted executor registers with a new id."""


@dataclass(frozen=True, order=True)
class TaskId:
    """One partition of one stage of one job."""

    job: JobId
    stage: StageId
    partition: int

    def __str__(self) -> str:
        return f"{self.job}/s{self.stage}/p{self.partition}"


@dataclass(frozen=True, order=True)
class TaskAttemptId:
    """One attempt at a task; attempts count from 0 and are never reused."""

    task: TaskId
    attempt: int

    def __str__(self) -> str:
        return f"{self.task}/a{self.attempt}"
