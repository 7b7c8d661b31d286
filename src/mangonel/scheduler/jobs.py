"""The shell's side of each job: what its watchers wait on.

The job's life (queued, running, succeeded, failed, cancelled; its result and
whether it was read) is the state machine's alone (``state_jobs`` draws it).
A ``JobWatch`` holds a copy of the state machine's latest ``JobView`` of its
job, refreshed by the shell after every event, with the result a
``JobSucceeded`` carried; and what only the shell knows: the SQL text, the
client's request id, the user who submitted it (its owner), wall-clock and
per-stage times. Each record has a
condition variable that the watchers of the job wait on, and a version bumped
on every change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from mangonel.errors import ErrorType, JobCancelledError, plain_text
from mangonel.ids import JobId, StageId, TaskAttemptId
from mangonel.plan.physical import DistributedPlan
from mangonel.scheduler.state_views import JobState, JobView, StageView
from mangonel.security.auth import ANONYMOUS
from mangonel.task import PartitionLocation

RESULT_FILES_BYTES = 1 << 20
"""The most bytes of a job's result files the scheduler keeps to hand out
(``JobWatch.result_files``): each at most the executor's ``INLINE_OUTPUT_BYTES``."""


@dataclass
class StageTiming:
    """When a stage started and last finished a task (the shell's clock)."""

    first_launch: float | None = None
    last_completion: float | None = None
    done: int = 0
    """Tasks done at the last refresh (to notice completions)."""

    def elapsed(self, now: float, complete: bool) -> float:
        if self.first_launch is None:
            return 0.0
        end = self.last_completion if complete and self.last_completion is not None else now
        return max(0.0, end - self.first_launch)


@dataclass(frozen=True)
class JobEnd:
    """How a job stands, read at one instant: its state, and why it failed."""

    state: JobState
    error: str
    """``JobWatch.error``: empty unless it failed or was cancelled."""
    error_type: str
    """``JobWatch.error_type``."""


@dataclass
class JobWatch:
    """One submitted job as its watchers see it."""

    id: JobId
    sql: str
    plan: DistributedPlan
    submitted: float
    submitted_wall: float
    view: JobView | None = None
    """The state machine's latest view of the job (``None`` before its first event)."""
    result: tuple[PartitionLocation, ...] = ()
    """Where the result is, once it succeeded."""
    result_files: dict[str, bytes] = field(default_factory=dict)
    """Small files of the final stage's outputs, by path, as their tasks' reports
    carried them (``keep_result_files``): handed to the client with the job's end,
    which then reads them from there, not over Flight. Memory only; a restarted
    scheduler's clients read their results over Flight."""
    timing: dict[StageId, StageTiming] = field(default_factory=dict)
    planning_s: float = 0.0
    """From the submission's arrival to its plan (or its cached plan) in hand; the
    job's times (``submitted``, ``elapsed``) start after it."""
    request_id: str = ""
    """The client's id of the submission (a retried submission finds this job)."""
    owner: str = ANONYMOUS.user
    """The user who submitted it: only they (and admins) may watch, read or cancel it."""
    version: int = 0
    """Bumped on every change, so watchers know when to send a new status."""
    changed: threading.Condition = field(default_factory=threading.Condition)
    """Guards every field after creation; readers take it to snapshot a record."""

    @classmethod
    def create(cls, job: JobId, sql: str, plan: DistributedPlan, now: float) -> JobWatch:
        rec = cls(job, sql, plan, submitted=now, submitted_wall=time.time())
        for s in plan.stages:
            rec.timing[s.id] = StageTiming()
        return rec

    # -- what the state machine said, as watchers read it ----------------------

    @property
    def state(self) -> JobState:
        return self.view.state if self.view is not None else JobState.QUEUED

    @property
    def finished(self) -> float | None:
        return self.view.finished if self.view is not None else None

    @property
    def error(self) -> str:
        """Why the job failed, as every door sends it (plain text: the task's error
        holds what DuckDB or the store said)."""
        return plain_text(self.view.error or "") if self.view is not None else ""

    @property
    def error_type(self) -> str:
        """The ``mangonel.errors`` class this job's end is blamed on: an
        ``ErrorType`` value, ``JobCancelledError``, or "" (it has not failed).
        A client raises a class that is both it and a ``JobFailedError``."""
        view = self.view
        if view is not None and view.state is JobState.CANCELLED:
            return JobCancelledError.__name__
        if view is not None and view.state is JobState.FAILED:
            return (view.error_type or ErrorType.JOB_FAILED).value
        return ""

    def elapsed(self, now: float) -> float:
        finished = self.finished
        return (finished if finished is not None else now) - self.submitted

    # -- observations ---------------------------------------------------------

    def task_launched(self, attempt: TaskAttemptId, now: float) -> None:
        with self.changed:
            timing = self.timing.get(attempt.task.stage)
            if timing is not None and timing.first_launch is None:
                timing.first_launch = now

    def keep_result_files(self, stage: StageId, files: Mapping[str, bytes]) -> None:
        """Keep what a report of ``stage`` carried if it may be the result: the final
        stage's, up to ``RESULT_FILES_BYTES`` a job (the rest is read over Flight)."""
        with self.changed:
            if stage != self.plan.final.id or self.finished is not None:
                return
            held = sum(len(d) for d in self.result_files.values())
            for path, data in files.items():
                if held + len(data) <= RESULT_FILES_BYTES:
                    self.result_files[path] = data
                    held += len(data)

    def drop_result_files(self) -> None:
        """The result was read (or will never be): its files' copies go."""
        with self.changed:
            self.result_files.clear()

    def update(
        self,
        view: JobView | None,
        now: float,
        result: tuple[PartitionLocation, ...] | None = None,
    ) -> None:
        """Take the state machine's latest view (and result); wake watchers if it changed."""
        with self.changed:
            if view is not None and view.finished is not None and self.result_files:
                # Only the result's own files stay (not those of attempts that lost).
                paths = {loc.path for loc in result or ()}
                self.result_files = {p: d for p, d in self.result_files.items() if p in paths}
            if result is not None and result != self.result:
                self.result = result
            elif view is None or view == self.view:
                return
            if view is not None:
                for stage in view.stages:
                    timing = self.timing.get(stage.id)
                    if timing is not None and stage.done > timing.done:
                        timing.last_completion = now
                    if timing is not None:
                        timing.done = stage.done
                self.view = view
            self.version += 1
            self.changed.notify_all()

    def stage_views(self) -> tuple[StageView, ...]:
        """Per-stage numbers; zeros (from the plan) before the first view."""
        with self.changed:
            if self.view is not None:
                return self.view.stages
            return tuple(
                StageView(s.id, s.label, s.num_tasks, 0, 0, s.num_tasks, 0, 0, 0)
                for s in self.plan.stages
            )

    def outcome(self) -> JobEnd:
        """The state and error read together (a reader between two updates could
        pair a failed state with the error of none)."""
        with self.changed:
            return JobEnd(self.state, self.error, self.error_type)

    def wait_finished(self, timeout: float) -> bool:
        """Block until the job has ended (or ``timeout`` passed); whether it has."""
        with self.changed:
            return self.changed.wait_for(lambda: self.state.finished, timeout=timeout)

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until ``version`` differs from ``seen`` (or timeout); return it."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != seen, timeout=timeout)
            return self.version
