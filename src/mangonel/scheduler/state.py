"""The scheduler's pure state machine: jobs, stages, tasks and executors.

``SchedulerState`` holds everything the scheduler knows and changes only through
``handle(event) -> list[Command]`` (the model is dask's worker state machine).
No sockets, threads, clock or database: time arrives on the events, and the I/O
shell (``scheduler.service``) carries the commands out. Every command carries
``cause=event.event_id``.

>>> from mangonel.scheduler.events import ExecutorConnected, ExecutorInfo, ExecutorRegistered
>>> state = SchedulerState()
>>> state.handle(ExecutorRegistered(1, 0.0, ExecutorInfo("e1", "h", "h:1", 2)))
[]
>>> state.handle(ExecutorConnected(2, 0.0, "e1"))
[]
>>> state.handle(ExecutorConnected(3, 0.0, "e1"))  # a second stream
[RefuseStream(cause=3, executor='e1')]

What each event does, in one place:

* executors: ``ExecutorRegistered`` makes a CONNECTING executor under the
  proposed id, ``ExecutorConnected`` makes it ALIVE (any other stream gets
  ``RefuseStream``); ``ExecutorHeartbeat`` / ``ExecutorDraining`` /
  ``ExecutorLost`` (a draining executor's closed stream is a ``DRAINED`` loss).
  A ``Tick`` judges silence (``state_liveness``): an executor whose silence
  the phi accrual detector finds improbable is suspected (no new task, its
  attempts copied), one that flaps is quarantined, and any live executor
  silent for longer than ``Limits.heartbeat_timeout_s`` (more while
  quarantined, or while most are silent at once: the scheduler's own link) is
  declared lost (``DeclareExecutorLost``, with the evidence), as is any
  connecting one that opened no stream in ``Limits.connect_timeout_s``; each
  change is logged (``LogExecutorHealth``).
* a scheduler restart: ``restore`` loads what the shell stored (``export_job``,
  ``export_finished``, ``export_executors``); ``SchedulerRecovered`` sends the
  attempts that were running back to pending (not charged) and makes every
  live executor wait, taking no task, to reattach or for the heartbeat timeout.
  An ``ExecutorRegistered`` asking to ``resume`` an awaited id is answered with
  ``ResumeExecutor`` (else it is a new executor); the ``ExecutorConnected`` that
  follows reattaches it: finished tasks whose files it no longer ``held`` are
  made again (with their stage's inputs lost meanwhile), and files of its
  ``held_jobs`` that ended while it was away are released (``ReleaseOutputs``;
  a result still unread is kept).
* ``TaskCompleted`` records map outputs; a job whose final stage is done emits
  ``JobSucceeded`` and ``ReleaseOutputs`` for the intermediate files, on every
  live executor that ran an attempt of the job (superseded attempts leave files
  too). The result's files stay until ``ResultRead``, or until a ``Tick`` finds
  it unread for longer than ``Limits.result_ttl_s``; then ``ReleaseOutputs`` of
  the whole job goes to every live executor that ran it.
* ``CancelRequested`` ends an unfinished job: ``CancelTask`` for its running
  attempts, ``JobCancelled``, ``ReleaseOutputs`` wherever it ran. A finished
  job is left as it is (no command).
* ``TaskFailed``: a ``QueryError`` fails the job, typed as the failure says (the
  query's fault, or an object's in the store: ``errors.ErrorType``) and telling
  the user what to do (fix the query only for the query's fault); so does a
  ``FragmentRejected``, as an internal error (the planner's SQL, not the query,
  is wrong), with ``LogRejectedFragment`` before ``JobFailed``; an
  ``ExecutionError`` is retried up to ``Limits.max_task_attempts``, then fails the
  job with the last attempt's error type (a store that did not answer is
  ``OBJECT_STORE_UNAVAILABLE``); a ``FetchFailed`` re-queues the reader without
  charging it an attempt and, by its ``problem``: ``OUTPUT_LOST`` (a missing or
  corrupt file on an executor that still answers) makes only the one map output
  it names again (one of the task's ``Limits.max_task_recomputes``), with
  that task's own inputs if an executor lost earlier held them; ``UNREACHABLE``
  about a live holder is a cut between two executors: one side gives way for the job (it is
  excluded from it, see ``_unreachable_holder``), unless readers on two
  executors failed to reach the holder, which then is lost.
* losing an executor, in one event: its running tasks go back to pending (an
  attempt charged), running tasks elsewhere that read its outputs are cancelled
  (``CancelTask``, not charged), the outputs it held that an unfinished stage still needs go
  back to pending (a re-run of their stage counted; a task whose output is lost
  more than ``Limits.max_task_recomputes`` times fails the job), recursively when
  their own inputs went too.
* with no executor alive for ``Limits.no_executor_grace_s``, a ``Tick`` fails the
  waiting jobs with a message that says so.
* a job that fails (``JobFailed``) releases its files wherever it ran, like a
  cancelled one.
* a draining executor that runs nothing, holds no output an unfinished job
  still needs and serves no unread result is done: ``DeclareExecutorLost`` with
  ``LossReason.DRAINED`` (its loss recomputes nothing, by construction).
* beyond ``keep_finished_jobs`` settled finished jobs (failed, cancelled, or
  their result read), the oldest are forgotten: ``ForgetJob``.
* stragglers: on a ``Tick``, once ``Limits.speculation_quantile`` of a stage's
  tasks are done, an attempt that has run ``speculation_multiplier`` times their
  median (and ``speculation_min_s``) gets one copy on another executor
  (``LaunchTask(speculative=True)``); the first of the two to complete wins, the
  other is cancelled (``_speculate``, ``_task_completed``).
* bad executors: ``Limits.exclusion_failures`` distinct tasks failing on one
  executor (``ExecutionError`` only) within ``exclusion_window_s`` exclude it
  from new tasks for ``exclusion_s`` (a ``Tick`` ends it); with every executor
  excluded, jobs with pending tasks fail saying so (``_count_failure``).
* adaptive execution: a stage that reads hash exchanges, about to launch its
  first task, runs as fewer tasks when its partitions' real sizes are small,
  each task reading a range of them (``_adapt``, ``scheduler.adaptive``).
* after every event, pending tasks of runnable stages go to free slots of alive
  executors that are not excluded, least loaded first (``LaunchTask``); each
  free slot to the job holding the fewest slots, ties to the earliest submitted
  (fair shares, ``_assign``), none beyond ``Limits.max_job_share`` of them; a
  task that failed avoids the executors it failed on while another may take it.

How a lost executor (and any lost output) is handled is ``state_recovery``, the
base class ``Recovery``: one module to read top to bottom.

Why this module is still over 600 lines: it holds the dispatcher and the parts
not split out yet (job lifecycle and results, task reports, assignment and
speculation, the self-check). The next cut is assignment and speculation
(``_assign``, ``_launch_next``, ``_speculate``, about 250 lines) into their own
part, as recovery was.

The life cycles of executors, jobs, tasks and stages are drawn in
``state_executors`` and ``state_jobs``; what holds between any two events is
listed in docs/architecture.md ("Invariants of the state") and checked by
``validate``.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections import OrderedDict
from collections.abc import Generator, Iterator
from dataclasses import replace

from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.scheduler import adaptive
from mangonel.scheduler.detector import silence_for_phi
from mangonel.scheduler.events import (
    AbortWrite,
    CancelRequested,
    Command,
    CommitWrite,
    DeclareExecutorLost,
    Event,
    ExecutorConnected,
    ExecutorDraining,
    ExecutorHeartbeat,
    ExecutorLost,
    ExecutorRegistered,
    ForgetJob,
    HealthChange,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    Limits,
    LogExecutorHealth,
    LogRejectedFragment,
    LossReason,
    RefuseHeartbeat,
    RefuseStream,
    ResultRead,
    ResumeExecutor,
    SchedulerRecovered,
    TaskCompleted,
    TaskFailed,
    Tick,
    WriteCommitFailed,
    WriteCommitted,
)
from mangonel.scheduler.invariants import StateInvariantError
from mangonel.scheduler.state_executors import (
    ExecutorRecord,
    ExecutorRegistry,
    RegistrySnapshot,
    Resume,
)
from mangonel.scheduler.state_gray import (
    count_failure,
    excluded_everywhere,
    observe_speed,
    stragglers,
)
from mangonel.scheduler.state_jobs import (
    PENDING,
    Done,
    FinishedJob,
    JobProgress,
    JobRecord,
    Pending,
    Running,
    StageRecord,
    StageState,
    TaskRecord,
    invalid_plan_reason,
)
from mangonel.scheduler.state_liveness import Judgement, judge
from mangonel.scheduler.state_recovery import Loss, Recovery, Step, is_running
from mangonel.scheduler.state_views import (
    ExecutorState,
    ExecutorView,
    JobState,
    JobView,
    StageView,
)
from mangonel.task import (
    CancelTask,
    ExecutionError,
    FetchFailed,
    FetchProblem,
    FragmentRejected,
    LaunchTask,
    PartitionLocation,
    QueryError,
    ReleaseOutputs,
)

__all__ = [
    "ExecutorState",
    "ExecutorView",
    "JobState",
    "JobView",
    "SchedulerState",
    "StageView",
]


_DEFAULT_LIMITS = Limits()


_BY_PARTITION = operator.attrgetter("partition")
"""A sort key without a Python call for each item."""


def _job_of(item: Event | Command) -> JobId | None:
    """The one job an event or command is about, or ``None`` when it may touch
    any job (an executor's loss, a tick, a restart)."""
    if isinstance(item, TaskCompleted):
        return item.attempt.task.job
    if isinstance(item, TaskFailed):
        # A fetch failure may lose an executor, and with it any job's outputs.
        return None if isinstance(item.failure, FetchFailed) else item.attempt.task.job
    if isinstance(item, LaunchTask):
        return item.task.attempt.task.job
    if isinstance(item, CancelTask):
        return item.attempt.task.job
    if isinstance(
        item,
        JobSubmitted
        | CancelRequested
        | ResultRead
        | WriteCommitted
        | WriteCommitFailed
        | CommitWrite
        | AbortWrite
        | JobSucceeded
        | JobFailed
        | JobCancelled
        | ForgetJob
        | ReleaseOutputs,
    ):
        return item.job
    return None


class SchedulerState(Recovery):
    """All of the scheduler's job, stage, task and executor state.

    Args:
        limits: Bounds on retries, re-runs and timeouts.
        keep_finished_jobs: Finished jobs kept (as views) for the status API.
        keep_lost_executors: Lost executors kept for the status API.
    """

    def __init__(
        self,
        limits: Limits = _DEFAULT_LIMITS,
        *,
        keep_finished_jobs: int = 200,
        keep_lost_executors: int = 100,
    ) -> None:
        self.limits = limits
        self._executors = ExecutorRegistry(
            keep_lost=keep_lost_executors,
            heartbeat_interval_s=limits.heartbeat_interval_s,
            long_gap_s=silence_for_phi(limits.heartbeat_interval_s, limits.suspect_phi),
        )
        self._jobs: dict[JobId, JobRecord] = {}
        self._finished: OrderedDict[JobId, FinishedJob] = OrderedDict()
        """In the order they finished."""
        self._keep_finished = keep_finished_jobs
        self._no_executor_since: float | None = None
        """When the last live executor went away; ``None`` while one is live, or
        before any registered (then a job waits from its submission)."""
        self._unreachable: dict[ExecutorId, dict[ExecutorId, float]] = {}
        """Holder -> reader executor -> when a fetch of that reader from that
        holder last failed ``UNREACHABLE`` while the holder was live."""
        self._touched: list[JobId] | None = None
        """``touched_jobs``: bookkeeping for the shell's writes, not state."""

    # ------------------------------------------------------------------ entry point

    def handle(self, event: Event) -> list[Command]:
        """Apply one event; return the commands the shell must carry out, in order."""
        step = Step(cause=event.event_id, now=event.time)
        match event:
            # Task reports first: nearly every event is one, and a match tries
            # its cases in order.
            case TaskCompleted():
                self._task_completed(event, step)
            case TaskFailed():
                self._task_failed(event, step)
            case JobSubmitted():
                self._job_submitted(event, step)
            case WriteCommitted():
                self._write_committed(event, step)
            case WriteCommitFailed():
                self._write_commit_failed(event, step)
            case CancelRequested():
                job = self._jobs.get(event.job)
                if job is not None:
                    reason = event.reason
                    msg = reason if reason.startswith("cancelled") else f"cancelled: {reason}"
                    self._finish(job, JobState.CANCELLED, msg, step)
            case ResultRead():
                self._release_result(event.job, step)
            case ExecutorRegistered():
                self._registered(event, step)
            case ExecutorConnected():
                self._connected(event, step)
            case ExecutorHeartbeat():
                ex, t = event.executor, event.time
                if not self._executors.listens(ex):
                    step.commands.append(RefuseHeartbeat(step.cause, ex))
                since = self._executors.heard_from(ex, t, event.unhealthy, beat=True)
                if since is not None:
                    why = f"heard from again after {t - since:.1f} s of suspicion"
                    step.commands.append(
                        LogExecutorHealth(step.cause, HealthChange.TRUSTED, ex, why)
                    )
            case ExecutorDraining():
                self._executors.drain(event.executor, event.time)
            case ExecutorLost():
                rec = self._executors.live(event.executor)
                if rec is not None:
                    why = event.reason
                    if rec.state is ExecutorState.DRAINING and why is LossReason.CONNECTION_LOST:
                        why = LossReason.DRAINED  # it was on its way out
                    self._lose([Loss(event.executor, why, event.detail)], step)
            case Tick():
                self._tick(step)
            case SchedulerRecovered():
                self._recovered(step)
            case _:
                raise TypeError(f"not a scheduler event: {event!r}")
        self._assign(step)
        if isinstance(event, Tick) and self.limits.speculation:
            # After ``_assign``: a copy only takes a slot no pending task wanted.
            self._speculate(step)
        self._complete_drains(step)
        self._forget_settled(step)
        self._touched = self._jobs_touched(event, step.commands)
        return step.commands

    def _jobs_touched(self, event: Event, commands: list[Command]) -> list[JobId] | None:
        """What ``touched_jobs`` answers after ``event``."""
        if isinstance(event, ExecutorHeartbeat | Tick | ExecutorLost) and all(
            isinstance(c, RefuseHeartbeat) for c in commands
        ):
            return None  # a heartbeat, a quiet tick, a loss already known
        job = _job_of(event)
        touched = [job] if job is not None else list(self._jobs)
        touched += [j for j in map(_job_of, commands) if j is not None]
        return list(dict.fromkeys(touched))

    # ----------------------------------------------------------------------- views

    def executors(self) -> list[ExecutorView]:
        """Live executors in connection order, then connecting, then recently lost ones."""
        return self._executors.views()

    def executor(self, executor: ExecutorId) -> ExecutorView | None:
        """One executor, connecting, live or recently lost; ``None`` if unknown."""
        return self._executors.view(executor)

    def job(self, job_id: JobId) -> JobView | None:
        """A job's progress, while it runs and for a while after it finishes."""
        job = self._jobs.get(job_id)
        if job is not None:
            return job.view()
        finished = self._finished.get(job_id)
        return finished.view if finished is not None else None

    def jobs(self) -> list[JobView]:
        """Unfinished and recently finished jobs, oldest submission first."""
        views = [f.view for f in self._finished.values()] + [j.view() for j in self._jobs.values()]
        return sorted(views, key=lambda v: v.submitted)

    def outputs_held(self, executor: ExecutorId) -> int:
        """Finished task outputs of unfinished jobs on ``executor``: at most what
        its loss would have to make again."""
        return sum(
            len(rec.done_on.get(executor, ()))
            for job in self._jobs.values()
            for rec in job.stages.values()
        )

    def running_attempts(self, executor: ExecutorId) -> list[TaskAttemptId]:
        """Attempts running on ``executor`` now (empty once it is lost)."""
        return self._executors.running_attempts(executor)

    def is_current(self, attempt: TaskAttemptId, executor: ExecutorId) -> bool:
        """Whether a report of ``attempt`` from ``executor`` counts: the attempt
        (or its speculative copy) runs there now. Any other report is stale and
        ``handle`` ignores it; telemetry counts reports by the same rule."""
        return self._current(attempt, executor) is not None

    def awaits(self, executor: ExecutorId) -> bool:
        """Whether ``executor`` is live but has not reattached since a restart."""
        rec = self._executors.live(executor)
        return rec is not None and rec.awaiting

    # ---------------------------------------------------------------- self-check

    def validate(self) -> None:
        """Check every invariant of the state (docs/architecture.md, "Invariants
        of the state"): each incremental count and index against a fresh pass
        over the state, and each rule that must hold between events.

        For the tests and the simulator, after every event: it costs a pass over
        every job, task and executor, so the shell never calls it.

        Raises:
            StateInvariantError: naming the invariant broken and the ids involved.
        """
        limits = self.limits
        is_live = self._executors.is_live
        running: dict[ExecutorId, set[TaskAttemptId]] = {}
        for job_id, job in self._jobs.items():
            if job_id != job.id or job_id in self._finished:
                raise StateInvariantError("job-state", f"job {job_id} is kept twice, or misnamed")
            job.validate(is_live, limits.max_task_attempts, limits.max_task_recomputes)
            for rec in job.stages.values():
                for task in rec.running_tasks():
                    for run in (task.state, task.speculative):
                        if isinstance(run, Running):
                            running.setdefault(run.executor, set()).add(run.attempt)
        self._executors.validate(running)
        self._validate_assigned()
        for rec in self._executors.draining():
            if not (
                rec.running
                or any(job.needs_outputs_of(rec.id) for job in self._jobs.values())
                or any(f.holds_result(rec.id) for f in self._finished.values())
            ):
                raise StateInvariantError(
                    "drains-finish", f"executor {rec.id} drains with nothing left to do"
                )
        settled = 0
        for job_id, done in self._finished.items():
            view = done.view
            if (
                view.id != job_id
                or not view.state.finished
                or view.finished is None
                or (done.result_read and view.state is not JobState.SUCCEEDED)
            ):
                raise StateInvariantError(
                    "finished-jobs", f"job {job_id} kept as finished is {view.state.name}"
                )
            if done.unread and not {loc.executor for loc in done.result} <= set(done.ran_on):
                raise StateInvariantError(
                    "job-ran-on", f"job {job_id}'s unread result is on executors not in ran_on"
                )
            settled += not done.unread
        if settled > self._keep_finished:
            raise StateInvariantError(
                "finished-jobs", f"{settled} settled jobs kept (at most {self._keep_finished})"
            )
        if self._executors.any_live() and self._no_executor_since is not None:
            raise StateInvariantError(
                "no-executor-since",
                f"no executor alive since {self._no_executor_since}, yet "
                f"{self._executors.live_ids()} are",
            )
        if any(not is_live(holder) for holder in self._unreachable):
            raise StateInvariantError(
                "unreachable-reports",
                f"fetch reports kept about executors no longer alive: {sorted(self._unreachable)}",
            )

    def _validate_assigned(self) -> None:
        """The ``nothing-launchable`` invariant: after an event, no pending task
        of a runnable stage could take a free slot (the rules of ``_assign`` and
        ``_launch_next``, from scratch)."""
        free = self._executors.with_free_slots()
        if not free:
            return
        cap = self._job_slot_cap()
        held = self._executors.slots_held()
        for job in self._jobs.values():
            usable = [r.id for r in free if r.id not in job.excluded]
            if not usable or (cap is not None and held.get(job.id, 0) >= cap):
                continue
            if job.commit is not None:
                continue  # being committed: it launches nothing (``_commit``)
            live = job.usable(self._executors.is_live)
            for sid, rec in job.stages.items():
                if not rec.pending_count or job.stage_state(sid, live) is not StageState.RUNNABLE:
                    continue
                for task in rec.tasks:
                    if not isinstance(task.state, Pending):
                        continue
                    elsewhere = [e for e in usable if e not in task.failed_on]
                    if elsewhere or not self._executors.any_taker(
                        job.excluded | set(task.failed_on)
                    ):
                        raise StateInvariantError(
                            "nothing-launchable",
                            f"task {task.id} is pending in a runnable stage while executor(s) "
                            f"{', '.join(elsewhere or usable)} have a free slot it may take",
                        )

    # ---------------------------------------------------------------- persistence

    def unfinished_jobs(self) -> list[JobId]:
        return list(self._jobs)

    def touched_jobs(self) -> list[JobId] | None:
        """The jobs the last event may have changed, unfinished or finished by
        it or forgotten (what the store writes again, ``scheduler.persist``), in
        order, once each; ``None`` when it changed nothing the store keeps."""
        return self._touched

    def export_job(self, job_id: JobId) -> JobProgress | None:
        """What the store keeps of an unfinished job (``None`` once it finished)."""
        job = self._jobs.get(job_id)
        return job.progress() if job is not None else None

    def export_job_head(self, job_id: JobId) -> JobProgress | None:
        """``export_job`` without the tasks (``None`` once it finished)."""
        job = self._jobs.get(job_id)
        return job.head() if job is not None else None

    def take_changed_tasks(self, job_id: JobId) -> list[TaskRecord]:
        """The tasks of an unfinished job changed since the last call, for the store.

        Bookkeeping of the shell's writes, not state: the state machine's
        behaviour does not depend on it.
        """
        job = self._jobs.get(job_id)
        return job.take_changed() if job is not None else []

    def export_finished(self, job_id: JobId) -> FinishedJob | None:
        """What the store keeps of a finished job (``None`` while it runs or once
        it is forgotten)."""
        return self._finished.get(job_id)

    def export_executors(self) -> RegistrySnapshot:
        return self._executors.snapshot()

    @property
    def no_executor_since(self) -> float | None:
        return self._no_executor_since

    def restore(
        self,
        executors: RegistrySnapshot | None,
        jobs: list[JobRecord],
        finished: list[FinishedJob],
        no_executor_since: float | None,
    ) -> None:
        """Load what ``scheduler.persist`` stored; then handle ``SchedulerRecovered``.

        Only for a fresh state machine, before its first event.
        """
        if self._jobs or self._finished or self._executors.any_live():
            raise RuntimeError("restore() needs a fresh state machine")
        if executors is not None:
            self._executors.restore(executors)
        self._jobs = {job.id: job for job in sorted(jobs, key=lambda j: j.submitted)}
        # All of them: those beyond the bound are forgotten (``ForgetJob``) by
        # the first event, so that the shell drops them from the store too.
        for done in sorted(finished, key=lambda f: f.view.finished or 0.0):
            self._finished[done.view.id] = done
        self._no_executor_since = no_executor_since

    # ---------------------------------------------------------------------- jobs

    def _job_submitted(self, event: JobSubmitted, step: Step) -> None:
        if event.job in self._jobs or event.job in self._finished:
            return  # a duplicate submission must not reset a job's progress
        job = JobRecord.create(event.job, event.plan, event.time)
        self._jobs[job.id] = job
        problem = invalid_plan_reason(event.plan)
        if problem is not None:
            msg = (
                f"internal error: the planner produced a plan the scheduler cannot run "
                f"({problem}). {ErrorType.INTERNAL.advice} (job {job.id})"
            )
            self._finish(job, JobState.FAILED, msg, step, ErrorType.INTERNAL)

    def _finish(
        self,
        job: JobRecord,
        state: JobState,
        error: str,
        step: Step,
        error_type: ErrorType = ErrorType.JOB_FAILED,
        *,
        committed: bool = False,
    ) -> None:
        """End a job: stop its attempts, report it, release its files, forget it.

        ``error_type``: what a failed job is blamed on (the client raises it).
        A write statement's job being committed ends only by its commit's outcome
        (``committed``); a failed or cancelled one has its staged files removed.
        """
        if job.commit is not None and not committed:
            return
        if job.plan.write is not None and state is not JobState.SUCCEEDED:
            step.commands.append(AbortWrite(step.cause, job.id, job.plan.write))
        for task in job.running_tasks():
            if isinstance(task.state, Running):
                # Cancelled attempts free their slot at once: the executor kills
                # them, and whatever they report later is stale and ignored.
                for running in (task.state, task.speculative):
                    if running is not None:
                        self._stop(running, step)
                task.move(PENDING)
                if task.speculative is not None:
                    task.set_copy(None)
        intermediate = tuple(s.id for s in job.plan.stages[:-1])
        result: tuple[PartitionLocation, ...] = ()
        # Files may be wherever an attempt ran, current or superseded.
        holders = job.holders(None) | job.ran_on
        release: tuple[StageId, ...] | None = None
        if state is JobState.SUCCEEDED:
            result = job.result()
            step.commands.append(JobSucceeded(step.cause, job.id, result))
            # The final stage's files stay until the client has read them.
            release = intermediate
            if not intermediate:
                holders = set()
        elif state is JobState.CANCELLED:
            step.commands.append(JobCancelled(step.cause, job.id, error))
        else:
            step.commands.append(JobFailed(step.cause, job.id, error, error_type))
        for executor in sorted(holders):
            if self._executors.is_live(executor):
                step.commands.append(ReleaseOutputs(step.cause, executor, job.id, release))
        job.state = state
        del self._jobs[job.id]
        self._finished[job.id] = FinishedJob(
            view=job.view(
                finished=step.now,
                error=None if state is JobState.SUCCEEDED else error,
                error_type=error_type if state is JobState.FAILED else None,
            ),
            result=result,
            intermediate=intermediate,
            ran_on=job.ran_on_sorted(),
        )

    def _release_result(self, job_id: JobId, step: Step) -> None:
        """The result was read (or expired): delete what is left of the job."""
        done = self._finished.get(job_id)
        if done is None or not done.unread:
            return
        done.result_read = True
        holders = {loc.executor for loc in done.result} | set(done.ran_on)
        for executor in sorted(holders):
            # A lost executor's files went with it.
            if self._executors.is_live(executor):
                # All stages: the intermediate ones went at success, so this is the
                # result plus whatever superseded attempts of the final stage wrote.
                step.commands.append(ReleaseOutputs(step.cause, executor, job_id, None))

    def _forget_settled(self, step: Step) -> None:
        """Keep at most ``keep_finished_jobs`` settled finished jobs; an unread
        result keeps its job until it is read or expires."""
        if len(self._finished) <= self._keep_finished:
            return
        settled = [j for j, f in self._finished.items() if not f.unread]
        for job_id in settled[: max(0, len(settled) - self._keep_finished)]:
            del self._finished[job_id]
            step.commands.append(ForgetJob(step.cause, job_id))

    # ---------------------------------------------------------------------- tasks

    def _current(
        self, attempt: TaskAttemptId, executor: ExecutorId
    ) -> tuple[JobRecord, TaskRecord, ExecutorRecord] | None:
        """The job and task if ``attempt`` is one running on ``executor``: the
        task's attempt or its speculative copy.

        Anything else is a stale report (lost executor, superseded or cancelled
        attempt, the copy that lost the race, finished job) and must not change
        the state.
        """
        rec = self._executors.live(executor)
        if rec is None:
            return None
        job = self._jobs.get(attempt.task.job)
        task = job.task(attempt.task) if job is not None else None
        if job is None or task is None:
            return None
        if not (
            is_running(task.state, attempt, executor)
            or is_running(task.speculative, attempt, executor)
        ):
            return None
        return job, task, rec

    def _task_completed(self, event: TaskCompleted, step: Step) -> None:
        self._executors.heard_from(event.executor, event.time)
        found = self._current(event.attempt, event.executor)
        if found is None:
            return
        job, task, executor = found
        started = task.state.started if isinstance(task.state, Running) else step.now
        copy = task.speculative
        if copy is not None and isinstance(task.state, Running):
            # Two attempts raced: this one won. The other is cancelled, and its
            # report, if it comes anyway, is stale (``_current``): one output per
            # partition is ever visible downstream. Its files, if it wrote any,
            # go with the job's (``ReleaseOutputs`` wherever the job ran).
            stage = job.stages[task.id.stage]
            other = copy
            if copy.attempt == event.attempt:
                other, started = task.state, copy.started
                stage.speculation_won += 1
                beaten = self._executors.live(other.executor)
                if beaten is not None:
                    observe_speed(beaten, stage, step.now - other.started, self.limits)
            else:
                stage.speculation_lost += 1
            task.set_copy(None)
            self._stop(other, step)
        outputs = tuple(
            PartitionLocation(
                executor=event.executor,
                host=executor.info.host,
                flight_address=executor.info.flight_address,
                stage=task.id.stage,
                map_partition=task.id.partition,
                partition=o.partition,
                path=o.path,
                rows=o.rows,
                bytes=o.bytes,
                checksum=o.checksum,
            )
            for o in sorted(event.outputs, key=_BY_PARTITION)
        )
        task.move(
            Done(event.attempt, event.executor, outputs, duration=max(0.0, step.now - started))
        )
        self._executors.stop(event.executor, event.attempt)
        if self.limits.speculation:
            observe_speed(executor, job.stages[task.id.stage], step.now - started, self.limits)
        if job.stages[job.plan.final.id].complete:
            if job.plan.write is not None:
                self._commit(job, step)
            else:
                self._finish(job, JobState.SUCCEEDED, "", step)

    # ------------------------------------------------------------ writing data

    def _commit(self, job: JobRecord, step: Step) -> None:
        """Every task of a write statement is done: name the winning attempt of
        each writing task, once, and have the shell commit their files.

        From here the job launches nothing and no failure, loss or cancel ends
        it (``_finish`` refuses): the commit's outcome alone does, so what a
        reader sees never disagrees with how the job ended.
        """
        write = job.plan.write
        if write is None or job.commit is not None:
            return
        winners: dict[int, int] = {}
        for task in job.stages[write.stage].tasks:
            if not isinstance(task.state, Done):
                msg = (
                    f"internal error: task {task.id} of the writing stage is not done at "
                    f"commit. {ErrorType.INTERNAL.advice} (job {job.id})"
                )
                self._finish(job, JobState.FAILED, msg, step, ErrorType.INTERNAL)
                return
            winners[task.id.partition] = task.state.attempt.attempt
        job.commit = winners
        step.commands.append(CommitWrite(step.cause, job.id, write, tuple(sorted(winners.items()))))

    def _write_committed(self, event: WriteCommitted, step: Step) -> None:
        job = self._jobs.get(event.job)
        if job is None or job.commit is None:
            return
        self._finish(job, JobState.SUCCEEDED, "", step, committed=True)

    def _write_commit_failed(self, event: WriteCommitFailed, step: Step) -> None:
        job = self._jobs.get(event.job)
        if job is None or job.commit is None:
            return
        self._finish(job, JobState.FAILED, event.message, step, event.error_type, committed=True)

    def _task_failed(self, event: TaskFailed, step: Step) -> None:
        self._executors.heard_from(event.executor, event.time)
        found = self._current(event.attempt, event.executor)
        if found is None:
            return
        job, task, _ = found
        self._executors.stop(event.executor, event.attempt)
        failure = event.failure
        # A speculative copy that fails is dropped, uncharged: the attempt it
        # copied still runs. What its failure says about executors still counts.
        is_copy = task.speculative is not None and task.speculative.attempt == event.attempt
        if is_copy:
            task.set_copy(None)
        match failure:
            case QueryError():
                self._cancel_copy(task, step)
                if is_copy and isinstance(task.state, Running):
                    # The same SQL fails everywhere: stop the original too.
                    self._stop(task.state, step)
                task.move(PENDING)
                msg = f"task {event.attempt} failed on executor {event.executor}: {failure.message}"
                advice = failure.error_type.advice
                msg = f"{msg}. {advice}" if advice else msg
                self._finish(job, JobState.FAILED, msg, step, failure.error_type)
            case FragmentRejected():
                task.move(PENDING)
                stage = job.plan.stage(task.id.stage)
                step.commands.append(
                    LogRejectedFragment(
                        step.cause,
                        job.id,
                        stage.id,
                        event.attempt,
                        failure.message,
                        stage.sql,
                        job.plan.sql,
                    )
                )
                msg = (
                    f"internal error: DuckDB refused the SQL that mangonel's planner wrote "
                    f"for stage {stage.id} (task {event.attempt} on executor "
                    f"{event.executor}): {failure.message}. The query itself is valid (it "
                    f"binds in DuckDB as a whole); this is a bug in mangonel, not in the "
                    f"query. Please report it with the query's text and this message; the "
                    f"scheduler's log has the stage's SQL (job {job.id})."
                )
                self._finish(job, JobState.FAILED, msg, step, ErrorType.INTERNAL)
            case ExecutionError():
                self._count_failure(event.executor, task, failure.message, step)
                if is_copy:
                    task.note_error(failure.message, failure.error_type)
                elif self._requeue(
                    task,
                    event.executor,
                    failure.message,
                    charge=True,
                    error_type=failure.error_type,
                ):
                    msg = self._exhausted(task)
                    self._finish(job, JobState.FAILED, msg, step, task.last_error_type)
                else:
                    self._fail_if_unrecoverable(job, step)
                self._fail_if_all_excluded(step, failure.error_type)
            case FetchFailed():
                # Not the reader's fault: re-queue it without charging an attempt.
                # The lost output is charged to its stage as a re-run instead.
                error = (
                    f"could not fetch stage {failure.stage} map partition "
                    f"{failure.map_partition} from executor {failure.executor}: "
                    f"{failure.message}"
                )
                if not is_copy:
                    self._requeue(task, event.executor, error, charge=False)
                if not self._executors.is_live(failure.executor):
                    self._fail_if_unrecoverable(job, step)
                elif failure.executor in job.excluded:
                    pass  # its outputs are being made again elsewhere
                elif failure.problem is FetchProblem.OUTPUT_LOST:
                    # The map stage is incomplete again, so its own inputs are
                    # needed again: any lost with an executor meanwhile are made
                    # again too (``_restore_lost_outputs``).
                    problem = self._output_lost(job, failure) or self._restore_lost_outputs(job)
                    if problem is not None:
                        self._finish(job, JobState.FAILED, problem, step)
                else:
                    self._unreachable_holder(job, event, failure.executor, error, step)

    # ------------------------------------------------------------- restart

    def _registered(self, event: ExecutorRegistered, step: Step) -> None:
        """A new executor, or one the restored state awaits asking to resume its id."""
        if event.resume is not None:
            info = replace(event.executor, id=event.resume)
            offer = Resume(info, event.held, event.held_jobs)
            if self._executors.resume(event.resume, offer):
                step.commands.append(ResumeExecutor(step.cause, event.resume))
                return
        self._executors.register(event.executor, event.time)

    def _connected(self, event: ExecutorConnected, step: Step) -> None:
        if self._executors.connected(event.executor, event.time) is not None:
            self._no_executor_since = None
            return
        back = self._executors.reattached(event.executor, event.time)
        if back is None:
            step.commands.append(RefuseStream(step.cause, event.executor))
            return
        rec, offer = back
        self._reattached(rec, offer.held, step)
        self._release_ended(rec.id, offer.held_jobs, step)

    def _release_ended(self, executor: ExecutorId, jobs: tuple[JobId, ...], step: Step) -> None:
        """Delete a reattached executor's files of jobs that ended while it was away.

        Files of an unfinished job are released with the job; of a succeeded job
        whose result is unread, all but the final stage's (which may hold the
        result or stray attempts' files, released when the result is read).
        """
        for job_id in jobs:
            job = self._jobs.get(job_id)
            if job is not None:
                job.ran_on.add(executor)
                continue
            done = self._finished.get(job_id)
            release: tuple[StageId, ...] | None = None
            if done is not None and done.unread:
                if executor not in done.ran_on:
                    done.ran_on = (*done.ran_on, executor)
                if not done.intermediate:
                    continue
                release = done.intermediate
            step.commands.append(ReleaseOutputs(step.cause, executor, job_id, release))

    # ---------------------------------------------------------------------- time

    def _tick(self, step: Step) -> None:
        for over in self._executors.exclusions_over(step.now):
            over.excluded_until = None
            over.exclusion = f"was excluded: {over.exclusion}" if over.exclusion else ""
        judged = judge(self._executors, step.now, self.limits)
        self._log_health(judged, step)
        losses = []
        for executor, detail in judged.lost:
            losses.append(Loss(executor, LossReason.HEARTBEAT_TIMEOUT, detail))
        connect = self.limits.connect_timeout_s
        for executor in self._executors.connect_timed_out(step.now, connect):
            detail = f"registered but opened no command stream in {connect:g} s"
            step.commands.append(
                DeclareExecutorLost(step.cause, executor, LossReason.CONNECTION_LOST, detail)
            )
            self._executors.mark_lost(executor, LossReason.CONNECTION_LOST, detail, step.now)
        if losses:
            self._lose(losses, step)
        ttl = self.limits.result_ttl_s
        expired = [
            j
            for j, f in self._finished.items()
            if f.unread and f.view.finished is not None and step.now - f.view.finished > ttl
        ]
        for job_id in expired:
            self._release_result(job_id, step)
        if self._executors.any_live():
            return
        grace = self.limits.no_executor_grace_s
        for job in list(self._jobs.values()):
            since = job.submitted
            if self._no_executor_since is not None:
                since = max(since, self._no_executor_since)
            waited = step.now - since
            if waited >= grace:
                msg = (
                    f"no executor was alive for {waited:.0f} s (the limit is {grace:g} s, "
                    f"--no-executor-grace), so job {job.id} could not run. Start an executor "
                    f"pointed at this scheduler, or see why the executors were lost "
                    f"(`mangonel status`: a heartbeat timeout is a frozen or cut-off host)."
                )
                self._finish(job, JobState.FAILED, msg, step)

    # --------------------------------------------------------------------- drain

    def _complete_drains(self, step: Step) -> None:
        """Let go of draining executors that have nothing left to do.

        Nothing left means no running attempt, no finished output that an
        unfinished job still needs (see ``JobRecord.needs_outputs_of``) and no
        result a client has not read yet (closing its stream would end the
        process, and with it the result). Losing such an executor recomputes
        nothing; the shell then closes its stream and the executor exits.
        """
        done = []
        for rec in self._executors.draining():
            if rec.running or any(job.needs_outputs_of(rec.id) for job in self._jobs.values()):
                continue
            if any(f.holds_result(rec.id) for f in self._finished.values()):
                self._executors.set_detail(rec, "drained; it serves results not read yet")
                continue
            done.append(rec.id)
        if done:
            detail = "it finished its tasks and no job needs its outputs any more"
            self._lose([Loss(e, LossReason.DRAINED, detail) for e in done], step)

    # ------------------------------------------------------------------ assignment

    def _assign(self, step: Step) -> None:
        """Hand pending tasks of runnable stages to free slots, fairly between jobs.

        Each free slot goes to the job that holds the fewest slots at that moment
        (its running attempts, speculative copies included), ties to the earliest
        submitted: the fair sharing of Hadoop's fair scheduler and Spark's FAIR
        mode, with one pool and equal weights. Slots are handed out one task at a
        time, so two jobs with work for every slot end up with half each, and a
        job submitted while another holds every slot gets each slot that frees
        until it holds as many (tasks are never preempted). It is
        work-conserving: a job alone takes every slot, and a job that cannot use
        its share (no more runnable tasks, or a free slot only on executors it
        excludes or its tasks failed on) leaves the rest to the others. Within a
        job, stages in plan order and tasks in partition order, each to the least
        loaded executor (``_launch_next``).

        With ``Limits.max_job_share`` below 1, no job holds more than that share
        of the slots (``_job_slot_cap``), which is no longer work-conserving: an
        operator's choice, so that a job arriving finds slots free at once
        however long the running tasks of the others are.
        """
        least = self._executors.least_loaded()
        if least is None:
            return
        cap = self._job_slot_cap()
        # Counting the held slots costs the busy slots; one job alone without a
        # cap takes every slot it can use whatever it holds.
        held = self._executors.slots_held() if len(self._jobs) > 1 or cap is not None else {}
        # (slots held, submission order, job); the order is unique, so the heap
        # never compares the jobs.
        # A job being committed (``_commit``) launches nothing more.
        queue = [
            (held.get(job.id, 0), order, job)
            for order, job in enumerate(self._jobs.values())
            if job.commit is None
        ]
        # A job's walk over its launchable tasks, started when it first comes
        # to the top: a completion frees one slot, and starting a walk for each
        # of ten jobs to launch one task cost a third of the event.
        walks: dict[int, Generator[TaskRecord, None, None]] = {}
        try:
            heapq.heapify(queue)
            while queue:
                count, order, job = queue[0]
                if cap is not None and count >= cap:
                    return  # the job holding the fewest is at the cap: so is every other
                tasks = walks.get(order)
                if tasks is None:
                    tasks = walks[order] = self._pending_runnable(job)
                if self._launch_next(job, tasks, least, step):
                    heapq.heapreplace(queue, (count + 1, order, job))
                else:
                    heapq.heappop(queue)
                    tasks.close()  # nothing more it can launch now
                # Asked once a turn, and handed to the next job's launch: the
                # last free slot taken ends the loop without a look at any job.
                least = self._executors.least_loaded()
                if least is None:
                    return  # no free slot anywhere
        finally:
            # A stage's walk puts the tasks it passed over back in its queue when
            # it is closed; closed here, not whenever the garbage collector gets
            # to it, before the next event walks the stage again.
            for tasks in walks.values():
                tasks.close()

    def job_slots(self) -> int:
        """The slots one job may hold now: the alive executors', at most its
        share of them (``Limits.max_job_share``); 0 with no executor alive. The
        planner sizes exchanges by it (``PlannerConfig.slots``)."""
        alive = self._executors.alive_slots()
        cap = self._job_slot_cap()
        return alive if cap is None or not alive else min(alive, cap)

    def job_parallel(self) -> int:
        """The tasks of one job the alive executors' hosts run at full speed at
        once (``ExecutorRegistry.parallel_slots``), at most ``job_slots``; the
        planner sizes scans by it (``PlannerConfig.parallel``)."""
        return min(self.job_slots(), self._executors.parallel_slots())

    def _job_slot_cap(self) -> int | None:
        """The most slots one job may hold now (``Limits.max_job_share`` of the
        alive executors' slots, at least one); ``None``: no cap."""
        share = self.limits.max_job_share
        if share >= 1.0:
            return None
        # The epsilon keeps 0.29 x 100 slots at 29, not 28 (binary fractions).
        return max(1, math.floor(share * self._executors.alive_slots() + 1e-9))

    def _pending_runnable(self, job: JobRecord) -> Generator[TaskRecord, None, None]:
        """The job's pending tasks of runnable stages, stages in plan order.

        Lazy, so a job with thousands of pending tasks is read only as far as
        the free slots reach. Launching a task changes no stage's state, so
        what was runnable when the walk started stays so until it ends.
        """
        is_live = job.usable(self._executors.is_live)
        for sid, rec in job.stages.items():
            if not rec.pending_count or job.stage_state(sid, is_live) is not StageState.RUNNABLE:
                continue
            if rec.adaptable:
                self._adapt(job, rec)
            yield from rec.pending_tasks()

    def _adapt(self, job: JobRecord, rec: StageRecord) -> None:
        """Decide, once, how many tasks a stage that is about to launch its first
        one runs, from the real sizes of its partitioned inputs
        (``scheduler.adaptive``). Its upstream stages are complete (it is
        runnable) and none of its tasks launched, so no reader has seen its
        task count yet; the decision is kept (``StageRecord.bounds``, stored
        with the job's progress) for as long as the job runs, outputs lost and
        made again included, since the map side writes the same partitions."""
        rec.adaptable = False
        limits = self.limits
        if not limits.adaptive or rec.totals["attempts_launched"]:
            return
        sizes = job.partition_bytes(rec.stage)
        target = adaptive.target_bytes(
            sum(sizes),
            self._executors.alive_slots(),
            limits.adaptive_partition_bytes,
            limits.adaptive_min_partition_bytes,
        )
        bounds = adaptive.coalesce(sizes, target)
        if len(bounds) < len(sizes):
            rec.coalesce(job.id, bounds)

    def _launch_next(
        self,
        job: JobRecord,
        tasks: Iterator[TaskRecord],
        least: ExecutorRecord,
        step: Step,
    ) -> bool:
        """Launch the next of ``tasks`` that may run now; ``False`` when none may
        (no slot the job may use is free, or the tasks left wait for executors
        other than those with a free slot). ``least`` is the least loaded
        executor with a free slot (``ExecutorRegistry.least_loaded()``)."""
        if job.excluded:
            # Looked up before the next task is: with no slot free, the job's
            # pending tasks are not read at all.
            found = self._executors.least_loaded(job.excluded)
            if found is None:
                return False
            least = found
        for task in tasks:
            executor = least
            if executor.id in task.failed_on:
                # Not again where it failed (Spark's one attempt per task and
                # executor), while another executor may run it: it waits for
                # a slot there rather than fail again, and a bad executor
                # that fails at once cannot use up the task's attempts alone.
                avoid = job.excluded | set(task.failed_on)
                elsewhere = self._executors.least_loaded(avoid)
                if elsewhere is None and self._executors.any_taker(avoid):
                    continue
                executor = elsewhere or executor
            eid = executor.id
            attempt = task.next_attempt()
            task.move(Running(attempt, eid, started=step.now))
            job.ran_on.add(eid)
            self._executors.start(eid, attempt)
            job.state = JobState.RUNNING
            stage = job.stages[attempt.task.stage].stage
            step.commands.append(LaunchTask(step.cause, eid, job.task_spec(stage, attempt)))
            return True
        return False

    # ----------------------------------------------------------------- stragglers

    def _speculate(self, step: Step) -> None:
        """Copy straggling attempts onto other executors' free slots (on ``Tick``).

        Which attempts straggle is ``state_gray.stragglers``; each gets one copy
        on the least loaded executor other than its own that the job may use.
        Called after ``_assign``, so pending tasks always come first. The first
        of the two to finish wins (``_task_completed``).
        """
        distrusted = any(
            r.suspected_since is not None or r.quarantined_until is not None
            for r in self._executors.live_records()
        )
        found = stragglers(
            self._jobs.values(),
            self._executors.is_live,
            step.now,
            self.limits,
            self._distrusted if distrusted else None,
        )
        cap = self._job_slot_cap()
        held = self._executors.slots_held() if cap is not None and found else {}
        for s in found:
            if cap is not None and held.get(s.job.id, 0) >= cap:
                continue  # a copy holds a slot too (``_assign``)
            executor = self._executors.least_loaded(s.job.excluded | {s.running.executor})
            if executor is None:
                continue
            attempt = s.task.next_attempt()
            s.task.set_copy(Running(attempt, executor.id, started=step.now))
            s.stage.speculated += 1
            s.job.ran_on.add(executor.id)
            self._executors.start(executor.id, attempt)
            if cap is not None:
                held[s.job.id] = held.get(s.job.id, 0) + 1
            spec = s.job.task_spec(s.stage.stage, attempt)
            step.commands.append(LaunchTask(step.cause, executor.id, spec, speculative=True))

    # --------------------------------------------------------------- bad executors

    def _log_health(self, judged: Judgement, step: Step) -> None:
        """``LogExecutorHealth`` for what ``state_liveness.judge`` changed."""
        cause, now = step.cause, step.now
        for rec in judged.suspected:
            why = f"silent for {now - rec.last_heartbeat:.1f} s" + (
                f"; {rec.arrivals.evidence(now, rec.last_heartbeat)}" if rec.arrivals else ""
            )
            step.commands.append(LogExecutorHealth(cause, HealthChange.SUSPECTED, rec.id, why))
        for rec in judged.quarantined:
            why = f"{rec.quarantine}; until {rec.quarantined_until}"
            step.commands.append(LogExecutorHealth(cause, HealthChange.QUARANTINED, rec.id, why))
        if judged.isolation_began:
            why = (
                "most executors are silent at once: the scheduler's own link is the likely "
                f"cut, so losses for silence wait {self.limits.isolation_grace_s:g} s more"
            )
            step.commands.append(LogExecutorHealth(cause, HealthChange.ISOLATED, None, why))
        if judged.isolation_ended:
            why = "enough executors are heard again"
            step.commands.append(LogExecutorHealth(cause, HealthChange.RECONNECTED, None, why))

    def _distrusted(self, executor: ExecutorId) -> bool:
        """Whether ``executor`` is suspected or quarantined (``state_liveness``):
        its running attempts are copied at once."""
        rec = self._executors.live(executor)
        return rec is not None and (
            rec.suspected_since is not None or rec.quarantined_until is not None
        )

    def _count_failure(self, executor: ExecutorId, task: TaskRecord, why: str, step: Step) -> None:
        """An attempt failed on ``executor`` for an execution reason: count it
        (``state_gray.count_failure`` may exclude the executor)."""
        rec = self._executors.live(executor)
        if rec is not None:
            count_failure(rec, task.id, why, step.now, self.limits)

    def _fail_if_all_excluded(self, step: Step, error_type: ErrorType) -> None:
        """Fail jobs that wait for a slot when every executor is excluded.

        Waiting out the exclusions would only cycle their tasks through the
        same bad executors again. Executors still connecting or awaited after
        a restart count as hope: then nothing fails. The jobs are blamed on
        ``error_type``, that of the failure just counted: the one that excluded
        the last executor, as a rule (a store that does not answer fails the
        tasks of every executor, and so excludes them all).
        """
        why = excluded_everywhere(self._executors.takers())
        if why is None:
            return
        for job in list(self._jobs.values()):
            if not any(rec.pending_count for rec in job.stages.values()):
                continue
            msg = (
                f"every executor is excluded for failing tasks ({why}), so job {job.id} "
                f"cannot run its tasks. Check those executors (logs, disk, memory) or the "
                f"data they read; an exclusion ends after {self.limits.exclusion_s:g} s "
                f"(--exclusion-time), and --exclusion-failures 0 turns exclusion off."
            )
            if error_type.advice:
                msg = f"{msg} {error_type.advice}"
            self._finish(job, JobState.FAILED, msg, step, error_type)
