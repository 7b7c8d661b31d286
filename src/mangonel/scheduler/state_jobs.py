"""Jobs inside the scheduler's state machine.

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

A job's stages and their tasks are ``state_stages``'s records.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.output import attempt_staging
from mangonel.plan.physical import DistributedPlan, Stage, WriteTarget
from mangonel.scheduler.adaptive import coalescible
from mangonel.scheduler.invariants import StateInvariantError
from mangonel.scheduler.state_stages import (
    Done,
    LiveCheck,
    Running,
    StageRecord,
    StageState,
    TaskRecord,
)
from mangonel.scheduler.state_views import JobState, JobView
from mangonel.task import (
    InputLocations,
    InputMode,
    PartitionLocation,
    ScanSpec,
    SinkSpec,
    TaskSpec,
)

# ------------------------------------------------------------------ persistence


@dataclass
class StageProgress:
    """The changing part of a ``StageRecord`` (its ``Stage`` is in the plan)."""

    reruns: int
    tasks: list[TaskRecord]
    bounds: tuple[int, ...] = ()
    """``StageRecord.bounds``: the stage's tasks when adaptive execution coalesced it."""


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
    commit: dict[int, int] | None = None
    """A write statement's job being committed: the winning attempt of each task
    of its writing stage (``JobRecord.commit``)."""


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
    write: WriteTarget | None = None
    """A write statement's target, however it ended: where the files of a writing
    attempt that ends after the job are removed (``Lifecycle._late_write``), and,
    after a restart, a failed or cancelled one's staged files again
    (``Recovery._recovered``)."""

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
    changed: set[TaskId] = field(default_factory=set)
    """Tasks changed since the store was last given them (``take_changed``)."""
    commit: dict[int, int] | None = None
    """A write statement's job whose tasks are all done, being committed: task
    partition -> the attempt of the writing stage whose files win. Set once, when
    the last task finishes; from then on nothing the job's tasks do changes it,
    and the job launches nothing: only the commit's outcome ends it."""
    store_misses: int = field(default=0, compare=False)
    """Attempts of its tasks (copies included) that failed because the object
    store did not answer, since the last attempt of the job that finished. Each
    such attempt already retried the store for its whole budget, so the store's
    silence is charged to the job once, not to each task
    (``Limits.max_task_attempts`` of them in a row end the job). Memory only: a
    scheduler restart starts the count again."""
    scan_files: tuple[str, ...] = field(init=False)
    """The files its tasks' scan databases may read (``job_files``, ``TaskSpec.job_files``)."""
    _ran_on_sorted: tuple[ExecutorId, ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for rec in self.stages.values():
            rec.changed = self.changed
        self.changed.clear()  # as created or restored: the store has them
        self.scan_files = job_files(self.plan)

    def ran_on_sorted(self) -> tuple[ExecutorId, ...]:
        """``ran_on`` in order, sorted again only when it grew.

        ``ran_on`` only grows (an attempt's files stay until the job ends), so
        one of the same size is the same set. The store's head asks on every
        task event, and sorting a job's 1,000 executors each time cost more than
        the event itself.
        """
        if len(self._ran_on_sorted) != len(self.ran_on):
            self._ran_on_sorted = tuple(sorted(self.ran_on))
        return self._ran_on_sorted

    @classmethod
    def create(cls, job: JobId, plan: DistributedPlan, now: float) -> JobRecord:
        stages = {
            s.id: StageRecord(
                s,
                [TaskRecord.fresh(TaskId(job, s.id, p)) for p in range(s.num_tasks)],
                adaptable=coalescible(s, plan),
            )
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
        job.commit = dict(progress.commit) if progress.commit is not None else None
        for sid, stored in progress.stages.items():
            rec = job.stages.get(sid)
            if rec is not None and stored.bounds:
                rec.coalesce(job.id, stored.bounds)
            if rec is None or len(stored.tasks) != len(rec.tasks):
                raise ValueError(
                    f"stored progress of stage {sid} does not match job {job.id}'s plan"
                )
            rec.reruns = stored.reruns
            rec.adopt(stored.tasks)
            # Decided again only if none of its tasks ever launched: what it
            # decided before then was never seen by anything.
            rec.adaptable = rec.adaptable and not rec.totals["attempts_launched"]
        job.changed.clear()
        return job

    def progress(self) -> JobProgress:
        """What the store keeps of this job besides its plan."""
        return JobProgress(
            id=self.id,
            submitted=self.submitted,
            state=self.state,
            stages={
                sid: StageProgress(rec.reruns, rec.tasks, rec.bounds)
                for sid, rec in self.stages.items()
            },
            ran_on=self.ran_on_sorted(),
            excluded=tuple(sorted(self.excluded)),
            commit=dict(self.commit) if self.commit is not None else None,
        )

    def head(self) -> JobProgress:
        """``progress()`` without its tasks: the store keeps each task under its own key."""
        return JobProgress(
            id=self.id,
            submitted=self.submitted,
            state=self.state,
            stages={
                sid: StageProgress(rec.reruns, [], rec.bounds) for sid, rec in self.stages.items()
            },
            ran_on=self.ran_on_sorted(),
            excluded=tuple(sorted(self.excluded)),
            commit=dict(self.commit) if self.commit is not None else None,
        )

    def take_changed(self) -> list[TaskRecord]:
        """The tasks changed since the last call (in no particular order)."""
        changed = [t for t in map(self.task, self.changed) if t is not None]
        self.changed.clear()
        return changed

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
        return [
            t
            for rec in self.stages.values()
            if rec.running
            and any(e in self.stages[u].done_on for u in rec.stage.upstream for e in executors)
            for t in rec.running_tasks()
        ]

    def task(self, task: TaskId) -> TaskRecord | None:
        rec = self.stages.get(task.stage)
        if rec is None or not 0 <= task.partition < len(rec.tasks):
            return None
        return rec.tasks[task.partition]

    def tasks(self) -> list[TaskRecord]:
        return [t for s in self.stages.values() for t in s.tasks]

    def running_tasks(self) -> list[TaskRecord]:
        """Running tasks, stage by stage in plan order, each in partition order."""
        return [t for s in self.stages.values() for t in s.running_tasks()]

    def stage_state(self, stage: StageId, is_live: LiveCheck) -> StageState:
        rec = self.stages[stage]
        if rec.complete:
            return StageState.COMPLETE
        upstream = rec.stage.upstream
        # Completeness first: it is a count, while wholeness asks about every
        # executor holding an output.
        if all(self.stages[u].complete for u in upstream) and all(
            self.outputs_whole(u, is_live) for u in upstream
        ):
            return StageState.RUNNABLE
        return StageState.WAITING

    def outputs_whole(self, stage: StageId, is_live: LiveCheck) -> bool:
        """Every task of ``stage`` is done and its executor still holds the output."""
        rec = self.stages[stage]
        return rec.complete and all(is_live(e) for e in rec.done_on)

    def holders(self, stages: tuple[StageId, ...] | None) -> set[ExecutorId]:
        """Executors holding finished outputs of the given stages (all when ``None``)."""
        return {
            e for sid, rec in self.stages.items() if stages is None or sid in stages
            for e in rec.done_on
        }  # fmt: skip

    def needed_stages(self) -> set[StageId]:
        """The stages whose finished outputs the job still needs: the final
        stage's until the job succeeds, any other's while a stage that reads it
        is not complete."""
        needed = {self.plan.final.id}
        for rec in self.stages.values():
            if not rec.complete:
                needed.update(rec.stage.upstream)
        return needed

    def needed_outputs(self, is_live: LiveCheck) -> dict[ExecutorId, int]:
        """Executor -> how many finished outputs the job still needs it holds."""
        counts: dict[ExecutorId, int] = {}
        for sid in self.needed_stages():
            for executor, held in self.stages[sid].done_on.items():
                if is_live(executor):
                    counts[executor] = counts.get(executor, 0) + len(held)
        return counts

    def needs_outputs_of(self, executor: ExecutorId) -> bool:
        """Whether a finished output on ``executor`` is still needed by this job
        (``needed_stages``)."""
        return any(executor in self.stages[sid].done_on for sid in self.needed_stages())

    def recomputed_up_to(self, executor: ExecutorId, limit: int) -> bool:
        """Whether an output on ``executor`` that the job still needs belongs to
        a task recomputed ``limit`` times already (one more would end the job)."""
        return any(
            task.recomputes >= limit
            for sid in self.needed_stages()
            for task in self.stages[sid].done_tasks_on(executor)
        )

    def validate(
        self, is_live: LiveCheck, max_task_attempts: int, max_task_recomputes: int
    ) -> None:
        """Check the job's invariants (docs/architecture.md, "Invariants of the
        state"): ``job-shape``, ``job-state``, ``job-ran-on``, ``task-limits``,
        ``needed-outputs-held``, ``job-progress``, the part of ``running-placed``
        the job knows (no attempt on an executor it excludes), and each stage's
        own (``StageRecord.validate``). ``is_live``: alive or draining."""
        plan = self.plan
        if (
            [(sid, rec.stage) for sid, rec in self.stages.items()]
            != [(s.id, s) for s in plan.stages]
            or any(rec.changed is not self.changed for rec in self.stages.values())
            or set(self._ran_on_sorted) - self.ran_on
            or (len(self._ran_on_sorted) == len(self.ran_on)
                and self._ran_on_sorted != tuple(sorted(self.ran_on)))
            or self.scan_files != job_files(plan)
        ):  # fmt: skip
            raise StateInvariantError(
                "job-shape", f"job {self.id}: its stages or caches are not its plan's"
            )
        launched = 0
        for rec in self.stages.values():
            rec.validate(self.id)  # so its counts can be trusted below
            launched += rec.totals["attempts_launched"]
            worst = max(rec.tasks, key=lambda t: t.failures, default=None)
            if worst is not None and worst.failures and worst.failures >= max_task_attempts:
                raise StateInvariantError(
                    "task-limits",
                    f"task {worst.id} of an unfinished job failed {worst.failures} attempts "
                    f"(the limit is {max_task_attempts})",
                )
            worst = max(rec.tasks, key=lambda t: t.recomputes, default=None)
            if worst is not None and worst.recomputes > max_task_recomputes:
                raise StateInvariantError(
                    "task-limits",
                    f"task {worst.id} of an unfinished job was recomputed {worst.recomputes} "
                    f"times (the limit is {max_task_recomputes})",
                )
            if not self.ran_on.issuperset(rec.done_on):
                raise StateInvariantError(
                    "job-ran-on", f"stage {rec.stage.id}: outputs on executors not in ran_on"
                )
            for task in rec.running_tasks():
                for run in (task.state, task.speculative):
                    if isinstance(run, Running) and run.executor not in self.ran_on:
                        raise StateInvariantError(
                            "job-ran-on", f"task {task.id}: {run} not on an executor in ran_on"
                        )
                    if isinstance(run, Running) and run.executor in self.excluded:
                        raise StateInvariantError(
                            "running-placed",
                            f"task {task.id}: {run} on an executor job {self.id} excludes",
                        )
        if self.state not in (JobState.QUEUED, JobState.RUNNING) or (
            (self.state is JobState.RUNNING) != (launched > 0)
        ):
            raise StateInvariantError(
                "job-state", f"job {self.id} is {self.state.name} with {launched} launches"
            )
        if self.commit is not None:
            # Being committed: its tasks no longer matter, only its winners do.
            write = plan.write
            if write is None or set(self.commit) != set(range(len(self.stages[write.stage].tasks))):
                raise StateInvariantError(
                    "job-commit",
                    f"job {self.id} commits winners {self.commit} that are not "
                    "one attempt for each task of its writing stage",
                )
            return
        usable = self.usable(is_live)
        if not any(
            not rec.complete and self.stage_state(sid, usable) is StageState.RUNNABLE
            for sid, rec in self.stages.items()
        ):
            states = {sid: self.stage_state(sid, usable).name for sid in self.stages}
            raise StateInvariantError(
                "job-progress", f"job {self.id} has no runnable stage left: {states}"
            )
        for sid in sorted(self.needed_stages()):
            gone = sorted(e for e in self.stages[sid].done_on if not usable(e))
            if gone:
                raise StateInvariantError(
                    "needed-outputs-held",
                    f"job {self.id} needs outputs of stage {sid} that executor(s) "
                    f"{', '.join(gone)} held, lost or excluded by the job, and does not "
                    f"make them again",
                )

    def view(
        self,
        finished: float | None = None,
        error: str | None = None,
        error_type: ErrorType | None = None,
    ) -> JobView:
        return JobView(
            id=self.id,
            state=self.state,
            submitted=self.submitted,
            finished=finished,
            error=error,
            stages=tuple(s.view() for s in self.stages.values()),
            sql=self.plan.sql,
            error_type=error_type,
        )

    def partition_bytes(self, stage: Stage) -> list[int]:
        """Bytes of each partition ``stage``'s tasks read from their partitioned
        inputs, over every map task (its upstream stages must be complete)."""
        sizes = [0] * stage.num_tasks
        for i in stage.inputs:
            if i.mode is not InputMode.PARTITION:
                continue
            for t in self.stages[i.stage].tasks:
                if isinstance(t.state, Done):
                    for loc in t.state.outputs:
                        if 0 <= loc.partition < len(sizes):
                            sizes[loc.partition] += loc.bytes
        return sizes

    def task_spec(self, stage: Stage, attempt: TaskAttemptId) -> TaskSpec:
        """What one attempt reads and writes (see ``plan.physical``): with
        ``InputMode.PARTITION``, the partitions its stage's ``partitions_of``
        gives (partition *i* for task *i* unless adaptive execution coalesced
        the stage)."""
        partition = attempt.task.partition
        partitions = self.stages[stage.id].partitions_of(partition)
        inputs = tuple(
            InputLocations(
                name=i.name,
                stage=i.stage,
                mode=i.mode,
                locations=self._input_locations(i.stage, i.mode, partitions),
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
            job_files=self.scan_files,
            result=stage.id == self.plan.final.id,
            sink=self._sink(stage, attempt),
            whole_query=stage.whole_query,
        )

    def _sink(self, stage: Stage, attempt: TaskAttemptId) -> SinkSpec | None:
        """Where an attempt of a write statement's writing stage puts its rows."""
        write = self.plan.write
        if write is None or stage.id != write.stage:
            return None
        staging = attempt_staging(
            write.location, str(self.id), attempt.task.partition, attempt.attempt
        )
        return SinkSpec(
            write.location,
            write.format,
            staging,
            write.columns,
            write.partition_by,
            write.options,
        )

    def _input_locations(
        self, upstream: StageId, mode: InputMode, partitions: range
    ) -> tuple[PartitionLocation, ...]:
        locations: list[PartitionLocation] = []
        for t in self.stages[upstream].tasks:
            # Only called for a RUNNABLE stage, whose upstream tasks are all done.
            if isinstance(t.state, Done):
                locations.extend(
                    loc
                    for loc in t.state.outputs
                    if mode is InputMode.ALL or loc.partition in partitions
                )
        return tuple(sorted(locations, key=lambda loc: (loc.map_partition, loc.partition)))

    def result(self) -> tuple[PartitionLocation, ...]:
        """The final stage's outputs, in partition order."""
        final = self.plan.final
        return self._input_locations(final.id, InputMode.ALL, range(0))


def job_files(plan: DistributedPlan) -> tuple[str, ...]:
    """The files a task's scan database may read, sorted: those of every table in the
    catalog ``plan`` was planned against (``DistributedPlan.readable_files``) and
    those it scans itself, in any stage and task.

    Tables whose rows its user may read anyway. Keyed by them, one database per slot
    serves every scan task of every query over the catalog (a TPC-DS query scans up
    to 10 tables, and a fresh database's first Parquet read costs about twice the
    page faults of a later one).
    """
    files: set[str] = set(plan.readable_files)
    for stage in plan.stages:
        scans = (stage.scan,) if stage.scan is not None else ()
        for scan in scans + stage.side_scans:
            files.update(split.path for group in scan.task_splits for split in group)
    return tuple(sorted(files))


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
