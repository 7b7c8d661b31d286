"""Jobs, stages and tasks inside the scheduler's state machine.

Owns the per-job records and the rules that read them: when a stage may run,
which files a task reads (its ``TaskSpec``), which finished outputs were lost
with an executor and must be made again. ``SchedulerState`` drives the
transitions; nothing here emits commands.

A job's life, the only one the scheduler keeps; an unfinished job is a
``JobRecord``, a finished one a ``FinishedJob``, until it is forgotten::

                       first LaunchTask
      JobSubmitted ──▶ QUEUED ─────────▶ RUNNING
                         │                 │ final stage complete
                         │                 ├───────────────────────▶ SUCCEEDED, result unread
                         │ CancelRequested │                              │ ResultRead, or
                         ├──────────────▶ CANCELLED                       │ Limits.result_ttl_s
                         │ query error,    │                              ▼ passed (Tick)
                         │ attempts or     │                         SUCCEEDED, result read
                         │ re-runs used up,│
                         └ no executor ──▶ FAILED
                           (invalid plan: at once)

A finished job whose files are all released (failed, cancelled, or its result
read) is *settled*: beyond ``keep_finished_jobs`` of them, the oldest are
forgotten (``ForgetJob``). A result not read yet keeps its job, and keeps a
draining executor that serves it.

A task's life; each state is its own type holding only that state's data, so a
running task always knows its executor and a done task always has outputs. A
running task may also have a speculative copy (``TaskRecord.speculative``) on
another executor: the first of the two to complete makes it Done, the other is
cancelled; when one of them fails or is lost, the other goes on alone::

              launch (slot free, stage's inputs whole)
    Pending ─────────────────────────────────────────▶ Running(attempt, executor)
      ▲  ▲                                                 │          │
      │  │ attempt failed, executor lost, fetch failed     │          │ TaskCompleted
      │  └─────────────────────────────────────────────────┘          ▼
      │                                               Done(attempt, executor, outputs)
      │         its executor was lost while the output is still needed  │
      └─────────────────────────────────────────────────────────────────┘

A stage's state is derived from its tasks and its inputs, never stored, so it
cannot disagree with them::

                  every upstream stage          every task
                  has its outputs whole         done
        WAITING ───────────────────▶ RUNNABLE ───────────▶ COMPLETE
           ▲                          │    ▲                   │
           │ an upstream output       │    │ one of its own    │
           │ was lost                 │    │ outputs was lost  │
           └──────────────────────────┘    └───────────────────┘

A COMPLETE stage whose upstream loses outputs stays COMPLETE: it no longer needs
them. A stage whose own output and inputs are both lost goes back to WAITING.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.scheduler.state_views import JobState, JobView, StageView
from mangonel.task import InputLocations, InputMode, PartitionLocation, ScanSpec, TaskSpec

# ------------------------------------------------------------------- task states


@dataclass(frozen=True)
class Pending:
    """Waiting for its stage's inputs and a free slot."""


@dataclass(frozen=True)
class Running:
    attempt: TaskAttemptId
    executor: ExecutorId
    started: float = field(default=0.0, compare=False)
    """When it was launched (what speculation measures); not part of its identity."""


@dataclass(frozen=True)
class Done:
    attempt: TaskAttemptId
    executor: ExecutorId
    outputs: tuple[PartitionLocation, ...]
    """Sorted by partition."""
    duration: float = field(default=0.0, compare=False)
    """Launch to report, as the scheduler saw it (what speculation compares with)."""


TaskState = Pending | Running | Done
PENDING = Pending()

LiveCheck = Callable[[ExecutorId], bool]
"""Whether an executor is alive or draining, i.e. still holds its output files."""


@dataclass
class TaskRecord:
    """One task (partition) of a stage, across all its attempts."""

    id: TaskId
    state: TaskState = PENDING
    attempts_launched: int = 0
    """Also the next attempt number: attempts count from 0 and are never reused."""
    failures: int = 0
    """Attempts that count against ``Limits.max_task_attempts``."""
    failed_on: list[ExecutorId] = field(default_factory=list)
    last_error: str = ""
    reruns: int = 0
    recomputes: int = 0
    speculative: Running | None = None
    """A copy of the running attempt on another executor (speculative execution);
    only while ``state`` is ``Running``. Whichever finishes first is kept, the
    other is cancelled. Dropped, not resumed, after a scheduler restart."""

    def next_attempt(self) -> TaskAttemptId:
        attempt = TaskAttemptId(self.id, self.attempts_launched)
        self.attempts_launched += 1
        return attempt


class StageState(enum.Enum):
    WAITING = "waiting"
    RUNNABLE = "runnable"
    COMPLETE = "complete"


@dataclass
class StageRecord:
    stage: Stage
    tasks: list[TaskRecord]
    reruns: int = 0
    """Times some of its finished outputs were lost and had to be made again."""
    speculated: int = 0
    """Copies of straggling attempts launched (kept in memory only)."""
    speculation_won: int = 0
    """Copies that finished first: their output was kept, the original cancelled."""
    speculation_lost: int = 0
    """Copies cancelled because the original finished first."""

    @property
    def complete(self) -> bool:
        return all(isinstance(t.state, Done) for t in self.tasks)

    def view(self) -> StageView:
        states = [t.state for t in self.tasks]
        return StageView(
            id=self.stage.id,
            label=self.stage.label,
            num_tasks=self.stage.num_tasks,
            done=sum(isinstance(s, Done) for s in states),
            running=sum(isinstance(s, Running) for s in states),
            pending=sum(isinstance(s, Pending) for s in states),
            attempts_launched=sum(t.attempts_launched for t in self.tasks),
            tasks_rerun=sum(t.reruns for t in self.tasks),
            outputs_recomputed=sum(t.recomputes for t in self.tasks),
            rows=sum(o.rows for s in states if isinstance(s, Done) for o in s.outputs),
            bytes=sum(o.bytes for s in states if isinstance(s, Done) for o in s.outputs),
            speculative_running=sum(t.speculative is not None for t in self.tasks),
            speculated=self.speculated,
            speculation_won=self.speculation_won,
            speculation_lost=self.speculation_lost,
        )


# ------------------------------------------------------------------ persistence


@dataclass
class StageProgress:
    """The changing part of a ``StageRecord`` (its ``Stage`` is in the plan)."""

    reruns: int
    tasks: list[TaskRecord]


@dataclass
class JobProgress:
    """The changing part of an unfinished ``JobRecord``, as the store keeps it.

    The plan is stored once, at submission; this is rewritten as tasks move.
    """

    id: JobId
    submitted: float
    state: JobState
    stages: dict[StageId, StageProgress]
    ran_on: tuple[ExecutorId, ...] = ()
    excluded: tuple[ExecutorId, ...] = ()


@dataclass
class FinishedJob:
    """A job after it finished, as long as it is listed (and as the store keeps it)."""

    view: JobView
    """Its last view, with the time it finished and its error."""
    result: tuple[PartitionLocation, ...] = ()
    """The final stage's outputs (succeeded jobs), in partition order."""
    intermediate: tuple[StageId, ...] = ()
    """Its stages but the final one (released when it succeeded)."""
    ran_on: tuple[ExecutorId, ...] = ()
    """Every executor given one of its attempts: where files of it may be."""
    result_read: bool = False

    @property
    def unread(self) -> bool:
        """It succeeded and its result files are still kept for the client."""
        return self.view.state is JobState.SUCCEEDED and not self.result_read

    def holds_result(self, executor: ExecutorId) -> bool:
        return self.unread and any(loc.executor == executor for loc in self.result)


# -------------------------------------------------------------------------- jobs


@dataclass
class JobRecord:
    """An unfinished job. Finished jobs survive only as a ``JobView``."""

    id: JobId
    plan: DistributedPlan
    submitted: float
    stages: dict[StageId, StageRecord]
    """In the plan's (topological) order."""
    state: JobState = JobState.QUEUED
    ran_on: set[ExecutorId] = field(default_factory=set)
    """Every executor given an attempt of it (superseded ones leave files too)."""
    excluded: set[ExecutorId] = field(default_factory=set)
    """Live executors this job no longer uses: one side of a cut between two
    executors that both still heartbeat (see ``SchedulerState``). The job gives
    them no task, and their outputs count as lost to it."""

    @classmethod
    def create(cls, job: JobId, plan: DistributedPlan, now: float) -> JobRecord:
        stages = {
            s.id: StageRecord(s, [TaskRecord(TaskId(job, s.id, p)) for p in range(s.num_tasks)])
            for s in plan.stages
        }
        return cls(id=job, plan=plan, submitted=now, stages=stages)

    @classmethod
    def restore(cls, plan: DistributedPlan, progress: JobProgress) -> JobRecord:
        """The record ``progress`` was taken from (``progress()``), given its plan."""
        job = cls.create(progress.id, plan, progress.submitted)
        job.state = progress.state
        job.ran_on = set(progress.ran_on)
        job.excluded = set(progress.excluded)
        for sid, stored in progress.stages.items():
            rec = job.stages.get(sid)
            if rec is None or len(stored.tasks) != len(rec.tasks):
                raise ValueError(
                    f"stored progress of stage {sid} does not match job {job.id}'s plan"
                )
            rec.reruns, rec.tasks = stored.reruns, stored.tasks
        return job

    def progress(self) -> JobProgress:
        """What the store keeps of this job besides its plan."""
        return JobProgress(
            id=self.id,
            submitted=self.submitted,
            state=self.state,
            stages={sid: StageProgress(rec.reruns, rec.tasks) for sid, rec in self.stages.items()},
            ran_on=tuple(sorted(self.ran_on)),
            excluded=tuple(sorted(self.excluded)),
        )

    def usable(self, is_live: LiveCheck) -> LiveCheck:
        """``is_live`` as this job sees it: an excluded executor holds nothing for it."""
        excluded = self.excluded
        if not excluded:
            return is_live
        return lambda e: e not in excluded and is_live(e)

    def readers_of(self, executors: AbstractSet[ExecutorId]) -> list[TaskRecord]:
        """Running tasks whose inputs include an output held by one of ``executors``.

        A task reads from every task of each upstream stage (a partition of
        each, or all of them), and a running task was launched with the
        current holders of those outputs: any holder lost since cancels it.
        """
        holders = {sid: {t.state.executor for t in rec.tasks if isinstance(t.state, Done)}
                   for sid, rec in self.stages.items()}  # fmt: skip
        return [
            t
            for rec in self.stages.values()
            if any(holders[u] & executors for u in rec.stage.upstream)
            for t in rec.tasks
            if isinstance(t.state, Running)
        ]

    def task(self, task: TaskId) -> TaskRecord | None:
        rec = self.stages.get(task.stage)
        if rec is None or not 0 <= task.partition < len(rec.tasks):
            return None
        return rec.tasks[task.partition]

    def tasks(self) -> list[TaskRecord]:
        return [t for s in self.stages.values() for t in s.tasks]

    def stage_state(self, stage: StageId, is_live: LiveCheck) -> StageState:
        rec = self.stages[stage]
        if rec.complete:
            return StageState.COMPLETE
        if all(self.outputs_whole(u, is_live) for u in rec.stage.upstream):
            return StageState.RUNNABLE
        return StageState.WAITING

    def outputs_whole(self, stage: StageId, is_live: LiveCheck) -> bool:
        """Every task of ``stage`` is done and its executor still holds the output."""
        return all(
            isinstance(t.state, Done) and is_live(t.state.executor)
            for t in self.stages[stage].tasks
        )

    def holders(self, stages: tuple[StageId, ...] | None) -> set[ExecutorId]:
        """Executors holding finished outputs of the given stages (all when ``None``)."""
        return {
            t.state.executor
            for sid, rec in self.stages.items()
            if stages is None or sid in stages
            for t in rec.tasks
            if isinstance(t.state, Done)
        }

    def needed_outputs(self, is_live: LiveCheck) -> dict[ExecutorId, int]:
        """Executor -> how many finished outputs the job still needs it holds."""
        needed = {self.plan.final.id}
        for rec in self.stages.values():
            if not rec.complete:
                needed.update(rec.stage.upstream)
        counts: dict[ExecutorId, int] = {}
        for sid in needed:
            for t in self.stages[sid].tasks:
                if isinstance(t.state, Done) and is_live(t.state.executor):
                    counts[t.state.executor] = counts.get(t.state.executor, 0) + 1
        return counts

    def needs_outputs_of(self, executor: ExecutorId) -> bool:
        """Whether a finished output on ``executor`` is still needed by this job.

        The final stage's outputs are needed until the job succeeds; any other
        stage's while a stage that reads it is not complete.
        """
        needed = {self.plan.final.id}
        for rec in self.stages.values():
            if not rec.complete:
                needed.update(rec.stage.upstream)
        return any(
            isinstance(t.state, Done) and t.state.executor == executor
            for sid in needed
            for t in self.stages[sid].tasks
        )

    def view(self, finished: float | None = None, error: str | None = None) -> JobView:
        return JobView(
            id=self.id,
            state=self.state,
            submitted=self.submitted,
            finished=finished,
            error=error,
            stages=tuple(s.view() for s in self.stages.values()),
            sql=self.plan.sql,
        )

    def task_spec(self, stage: Stage, attempt: TaskAttemptId) -> TaskSpec:
        """What one attempt reads and writes (see ``plan.physical``)."""
        partition = attempt.task.partition
        inputs = tuple(
            InputLocations(
                name=i.name,
                stage=i.stage,
                mode=i.mode,
                locations=self._input_locations(i.stage, i.mode, partition),
                columns=self.stages[i.stage].stage.columns,
            )
            for i in stage.inputs
        )
        scans = (stage.scan,) if stage.scan is not None else ()
        return TaskSpec(
            attempt=attempt,
            sql=stage.sql,
            output=stage.output,
            columns=stage.columns,
            scans=tuple(
                ScanSpec(s.name, s.table, s.columns, s.splits_of(partition))
                for s in scans + stage.side_scans
            ),
            inputs=inputs,
        )

    def _input_locations(
        self, upstream: StageId, mode: InputMode, partition: int
    ) -> tuple[PartitionLocation, ...]:
        locations: list[PartitionLocation] = []
        for t in self.stages[upstream].tasks:
            # Only called for a RUNNABLE stage, whose upstream tasks are all done.
            if isinstance(t.state, Done):
                locations.extend(
                    loc
                    for loc in t.state.outputs
                    if mode is InputMode.ALL or loc.partition == partition
                )
        return tuple(sorted(locations, key=lambda loc: (loc.map_partition, loc.partition)))

    def result(self) -> tuple[PartitionLocation, ...]:
        """The final stage's outputs, in partition order."""
        final = self.plan.final
        return self._input_locations(final.id, InputMode.ALL, 0)


def invalid_plan_reason(plan: DistributedPlan) -> str | None:
    """Why the runtime cannot schedule ``plan``, or ``None`` when it can.

    The planner is ours, so these are internal errors; they are caught here so a
    planner bug fails one job with a message instead of wedging the scheduler.
    """
    if not plan.stages:
        return "the plan has no stages"
    seen: set[StageId] = set()
    for s in plan.stages:
        if s.id in seen:
            return f"stage {s.id} appears twice"
        if s.num_tasks < 0:
            return f"stage {s.id} has a negative task count"
        for u in s.upstream:
            if u not in seen:
                return f"stage {s.id} reads stage {u}, which does not come before it"
        if any(len(side.task_splits) not in (1, s.num_tasks) for side in s.side_scans):
            return f"stage {s.id} has a side scan with neither one group of splits nor one a task"
        if s.scan is not None and len(s.scan.task_splits) != s.num_tasks:
            return (
                f"stage {s.id} has {s.num_tasks} tasks but "
                f"{len(s.scan.task_splits)} groups of scan splits"
            )
        seen.add(s.id)
    if plan.final.num_tasks < 1:
        return "the final stage has no tasks"
    return None
