"""The shell's view of jobs: what watchers see (progress, result, error).

The state machine decides and counts; a ``JobRecord`` holds the latest copy
of the state machine's ``JobView`` of its job (tasks done, running, pending,
re-run, recomputed; rows and bytes of current outputs), which the shell
refreshes after every event, plus what only the shell knows: the SQL text, wall
and per-stage times, the result's locations and whether the client read it, and
every executor that was given a task of the job (their files are released when
the job ends). Each ``JobRecord`` has a condition variable that the watchers of
the job wait on.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field

from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.plan.physical import DistributedPlan
from mangonel.scheduler.state_views import JobView, StageView
from mangonel.task import PartitionLocation


class JobPhase(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self is not JobPhase.RUNNING


@dataclass
class StageTiming:
    """When a stage started and last finished a task (``time.monotonic()``)."""

    first_launch: float | None = None
    last_completion: float | None = None
    done: int = 0
    """Tasks done at the last refresh (to notice completions)."""

    def elapsed(self, now: float, complete: bool) -> float:
        if self.first_launch is None:
            return 0.0
        end = self.last_completion if complete and self.last_completion is not None else now
        return max(0.0, end - self.first_launch)


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
    view: JobView | None = None
    """The state machine's latest view of the job (``None`` before its first event)."""
    timing: dict[StageId, StageTiming] = field(default_factory=dict)
    executors: set[ExecutorId] = field(default_factory=set)
    """Every executor given a task of this job: where its files may be."""
    request_id: str = ""
    """The client's id of the submission (a retried submission finds this job)."""
    version: int = 0
    """Bumped on every change, so watchers know when to send a new status."""
    changed: threading.Condition = field(default_factory=threading.Condition)
    """Guards every field after creation; readers take it to snapshot a record."""

    @classmethod
    def create(cls, job: JobId, sql: str, plan: DistributedPlan, now: float) -> JobRecord:
        rec = cls(job, sql, plan, submitted=now, submitted_wall=time.time())
        for s in plan.stages:
            rec.timing[s.id] = StageTiming()
        return rec

    def elapsed(self, now: float) -> float:
        return (self.finished if self.finished is not None else now) - self.submitted

    def _bump(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    # -- observations ---------------------------------------------------------

    def task_launched(self, executor: ExecutorId, attempt: TaskAttemptId, now: float) -> None:
        with self.changed:
            self.executors.add(executor)
            timing = self.timing.get(attempt.task.stage)
            if timing is not None and timing.first_launch is None:
                timing.first_launch = now

    def update(self, view: JobView | None, now: float) -> None:
        """Take the state machine's latest view; wake watchers if it changed."""
        with self.changed:
            if view is None or view == self.view:
                return
            for stage in view.stages:
                timing = self.timing.get(stage.id)
                if timing is not None and stage.done > timing.done:
                    timing.last_completion = now
                if timing is not None:
                    timing.done = stage.done
            self.view = view
            self._bump()

    def stage_views(self) -> tuple[StageView, ...]:
        """Per-stage numbers; zeros (from the plan) before the first view."""
        with self.changed:
            if self.view is not None:
                return self.view.stages
            return tuple(
                StageView(s.id, s.label, s.num_tasks, 0, 0, s.num_tasks, 0, 0, 0)
                for s in self.plan.stages
            )

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
            self._bump()

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until ``version`` differs from ``seen`` (or timeout); return it."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != seen, timeout=timeout)
            return self.version
