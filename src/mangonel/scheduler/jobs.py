"""The shell's view of jobs: what watchers see (progress, result, error).

The state machine decides; this module only records what the shell observed on
the way in (reports) and out (commands), so that ``WatchJob`` and
``ClusterStatus`` can show per-stage progress without the state machine having
to expose its internals. Each ``JobRecord`` has a condition variable that the
watchers of the job wait on.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field

from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.plan.physical import DistributedPlan
from mangonel.scheduler.events import PartitionLocation, PartitionOutput


class JobPhase(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self is not JobPhase.RUNNING


@dataclass
class StageProgress:
    """Counters of one stage, from launches and reports seen by the shell."""

    stage: StageId
    label: str
    tasks_total: int
    attempts: int = 0
    running: set[TaskAttemptId] = field(default_factory=set)
    done: dict[int, tuple[int, int]] = field(default_factory=dict)
    """partition -> (rows, bytes) of its latest completed attempt."""
    first_launch: float | None = None
    last_completion: float | None = None

    @property
    def rows(self) -> int:
        return sum(r for r, _ in self.done.values())

    @property
    def bytes(self) -> int:
        return sum(b for _, b in self.done.values())

    def elapsed(self, now: float) -> float:
        if self.first_launch is None:
            return 0.0
        end = self.last_completion if len(self.done) >= self.tasks_total else now
        return max(0.0, (end or now) - self.first_launch)


@dataclass
class JobRecord:
    """One submitted job as the shell tracks it (times are ``time.monotonic()``)."""

    id: JobId
    sql: str
    plan: DistributedPlan
    submitted: float
    submitted_wall: float
    phase: JobPhase = JobPhase.RUNNING
    finished: float | None = None
    error: str = ""
    error_type: str = ""
    result: tuple[PartitionLocation, ...] = ()
    result_released: bool = False
    stages: dict[StageId, StageProgress] = field(default_factory=dict)
    version: int = 0
    """Bumped on every change, so watchers know when to send a new status."""
    changed: threading.Condition = field(default_factory=threading.Condition)
    """Guards every field after creation; readers take it to snapshot a record."""

    @classmethod
    def create(cls, job: JobId, sql: str, plan: DistributedPlan, now: float) -> JobRecord:
        rec = cls(job, sql, plan, submitted=now, submitted_wall=time.time())
        for s in plan.stages:
            rec.stages[s.id] = StageProgress(s.id, s.label, s.num_tasks)
        return rec

    def elapsed(self, now: float) -> float:
        return (self.finished if self.finished is not None else now) - self.submitted

    def _bump(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    # -- observations ---------------------------------------------------------

    def task_launched(self, attempt: TaskAttemptId, now: float) -> None:
        with self.changed:
            progress = self.stages.get(attempt.task.stage)
            if progress is None:
                return
            progress.attempts += 1
            progress.running.add(attempt)
            if progress.first_launch is None:
                progress.first_launch = now
            self._bump()

    def task_completed(
        self, attempt: TaskAttemptId, outputs: tuple[PartitionOutput, ...], now: float
    ) -> None:
        with self.changed:
            progress = self.stages.get(attempt.task.stage)
            if progress is None:
                return
            progress.running.discard(attempt)
            progress.done[attempt.task.partition] = (
                sum(o.rows for o in outputs),
                sum(o.bytes for o in outputs),
            )
            progress.last_completion = now
            self._bump()

    def task_ended(self, attempt: TaskAttemptId) -> None:
        """A failed or cancelled attempt: it no longer runs."""
        with self.changed:
            progress = self.stages.get(attempt.task.stage)
            if progress is not None:
                progress.running.discard(attempt)
                self._bump()

    def executor_lost(self, running_on: dict[TaskAttemptId, ExecutorId], lost: ExecutorId) -> None:
        for attempt, executor in running_on.items():
            if executor == lost and attempt.task.job == self.id:
                self.task_ended(attempt)

    def finish(
        self,
        phase: JobPhase,
        now: float,
        result: tuple[PartitionLocation, ...] = (),
        error: str = "",
        error_type: str = "",
    ) -> None:
        with self.changed:
            if self.phase.finished:
                return
            self.phase, self.finished = phase, now
            self.result, self.error, self.error_type = result, error, error_type
            for progress in self.stages.values():
                progress.running.clear()
            self._bump()

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until ``version`` differs from ``seen`` (or timeout); return it."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != seen, timeout=timeout)
            return self.version
