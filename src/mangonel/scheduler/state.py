"""The scheduler's pure state machine: jobs, stages, tasks and executors.

``SchedulerState`` holds everything the scheduler knows and changes only through
``handle(event) -> list[Command]`` (the model is dask's worker state machine).
No sockets, threads, clock or database: time arrives on the events, and the I/O
shell (``scheduler.core``) carries the commands out. Every command carries
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
* a false loss: a lost executor asking to ``resume`` its id is logged
  (``HealthChange.CAME_BACK``) and, when ``state_revival`` finds outputs it
  holds still needed and not made again, revived under its id the same way;
  when its stream opens those outputs are its again (a recompute still running
  is cancelled).
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
  their result read) that ended ``keep_finished_s`` ago or more, the oldest are
  forgotten: ``ForgetJob``.
* slow links: heartbeats carry what each executor's fetches received from each
  peer, and its link probes (``LinkRates``; the peers to probe are the answer
  to a heartbeat, ``state_probes``); on a ``Tick``, a job reading a producer so slow that
  making its outputs again elsewhere finishes sooner stops using it
  (``state_links``, with ``Limits.speculation``), and the producer is marked
  for the cluster: no job places a new task on it until its back-off ends,
  then it is tried again (``state_link_marks``); probes alone may mark it
  before a job reads over it, and decide its trial.
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

This module is the dispatcher (``handle``), the views, the self-check, the
store's exports, and the task reports and executor arrivals it routes; the
rules live in its parts, one module each, each its base class:

* ``state_recovery.Recovery``: how a lost executor (or any lost output, or a
  restart) is handled, top to bottom;
* ``state_lifecycle.Lifecycle``: a job's start, end and forgetting; commits;
* ``state_placement.Placement``: which task runs where; stragglers' copies;
* ``state_health.Health``: timeouts, drains, exclusions on a ``Tick``;
* ``state_links.LinkRelief``: slow links, on a ``Tick``;
* ``state_link_marks.LinkMarks``: the cluster's memory of slow links, on a ``Tick``.

Why it is still over 600 lines: about 120 of them are this docstring, the one
place that says what every event does.

The life cycles of executors, jobs, tasks and stages are drawn in
``state_executors``, ``state_jobs`` and ``state_stages``; what holds between any two events is
listed in docs/architecture.md ("Invariants of the state") and checked by
``validate``.
"""

from __future__ import annotations

import operator
from collections import OrderedDict, deque
from dataclasses import replace

from mangonel import defaults
from mangonel.errors import ErrorType, then
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.scheduler.detector import silence_for_phi
from mangonel.scheduler.events import (
    AbortWrite,
    CancelRequested,
    Command,
    CommitWrite,
    Event,
    ExecutorConnected,
    ExecutorDraining,
    ExecutorHeartbeat,
    ExecutorLost,
    ExecutorRegistered,
    ExecutorStreamReopened,
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
    observe_speed,
)
from mangonel.scheduler.state_health import RECENT_RUNS, Health
from mangonel.scheduler.state_jobs import FinishedJob, JobProgress, JobRecord
from mangonel.scheduler.state_lifecycle import Lifecycle
from mangonel.scheduler.state_link_marks import LinkMarks
from mangonel.scheduler.state_links import LinkRates, LinkRelief
from mangonel.scheduler.state_placement import Placement
from mangonel.scheduler.state_probes import probe_targets
from mangonel.scheduler.state_recovery import Loss, Recovery, Step, is_running
from mangonel.scheduler.state_revival import Left, Revivals, StoredRevivals
from mangonel.scheduler.state_stages import PENDING, Done, Running, TaskRecord
from mangonel.scheduler.state_streams import Streams
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
    ProbeTarget,
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


class SchedulerState(Recovery, Lifecycle, Placement, Health, LinkRelief, LinkMarks, Streams):
    """All of the scheduler's job, stage, task and executor state.

    Args:
        limits: Bounds on retries, re-runs and timeouts.
        keep_finished_jobs: Finished jobs kept (as views) for the status API,
            once they ended ``keep_finished_s`` ago or more.
        keep_finished_s: Seconds a finished job is kept, whatever the count:
            its client hears how it ended by asking.
        keep_lost_executors: Lost executors kept for the status API.
    """

    def __init__(
        self,
        limits: Limits = _DEFAULT_LIMITS,
        *,
        keep_finished_jobs: int = defaults.KEEP_JOBS,
        keep_finished_s: float = defaults.KEEP_JOBS_S,
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
        self._keep_finished_s = keep_finished_s
        self._now: float | None = None
        """The time of the last event handled (``None`` before one): for
        ``validate``'s count of the finished jobs old enough to forget."""
        self._no_executor_since: float | None = None
        """When the last live executor went away; ``None`` while one is live, or
        before any registered (then a job waits from its submission)."""
        self._unreachable: dict[ExecutorId, dict[ExecutorId, float]] = {}
        """Holder -> reader executor -> when a fetch of that reader from that
        holder last failed ``UNREACHABLE`` while the holder was live."""
        self._revivals = Revivals()
        """Lost executors that may come back under their id (``state_revival``)."""
        self._set_aside: dict[ExecutorId, Left] = {}
        """Suspected executors whose needed outputs are being made again elsewhere,
        with those outputs: theirs again if they are trusted again first."""
        self._recent_runs: deque[float] = deque(maxlen=RECENT_RUNS)
        """How long the last tasks to finish took, any job's (memory only): what a
        stage with no task done yet is taken to cost (``Health._waiting_on``)."""
        self._touched: list[JobId] | None = None
        """``touched_jobs``: bookkeeping for the shell's writes, not state."""
        self._links = LinkRates()
        """Each executor's outbound rate as its readers measure it (``state_links``)."""

    # ------------------------------------------------------------------ entry point

    def handle(self, event: Event) -> list[Command]:
        """Apply one event; return the commands the shell must carry out, in order."""
        step = Step(cause=event.event_id, now=event.time)
        self._now = event.time
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
                since = self._executors.heard_from(
                    ex, t, event.unhealthy, beat=True, failed=event.failed_beats
                )
                if event.links:
                    self._links.observe(ex, event.links, t)
                if event.probes:
                    self._links.observe_probes(ex, event.probes, t)
                if since is not None:
                    why = f"heard from again after {t - since:.1f} s of suspicion"
                    step.commands.append(
                        LogExecutorHealth(step.cause, HealthChange.TRUSTED, ex, why)
                    )
                    self._trusted_again(ex, step)
                if event.running is not None:
                    self._observe_running(ex, t, event.running, step)
            case ExecutorDraining():
                self._executors.drain(event.executor, event.time)
            case ExecutorStreamReopened():
                self._stream_reopened(event, step)
            case ExecutorLost():
                rec = self._executors.live(event.executor)
                # The end of a stream that a newer one replaced is no loss.
                if rec is not None and event.stream in (0, rec.stream):
                    why = event.reason
                    if rec.state is ExecutorState.DRAINING and why is LossReason.CONNECTION_LOST:
                        why = LossReason.DRAINED  # it was on its way out
                    self._lose([Loss(event.executor, why, event.detail)], step)
            case Tick():
                self._tick(step)
                self._relieve_slow_links(step)
                self._mark_slow_links(step)
            case SchedulerRecovered():
                self._recovered(step)
            case _:
                raise TypeError(f"not a scheduler event: {event!r}")
        self._assign(step)
        if isinstance(event, Tick) and self.limits.speculation:
            # After ``_assign``: a copy only takes a slot no pending task wanted.
            self._speculate(step)
            self._copy_slow_readers(step)
        self._complete_drains(step)
        self._forget_settled(step)
        self._executors.settle_marks()
        self._touched = self._jobs_touched(event, step)
        return step.commands

    def _jobs_touched(self, event: Event, step: Step) -> list[JobId] | None:
        """What ``touched_jobs`` answers after ``event``."""
        commands = step.commands
        if (
            isinstance(event, ExecutorHeartbeat | Tick | ExecutorLost)
            and all(isinstance(c, RefuseHeartbeat) for c in commands)
            and not step.finished
        ):
            return None  # a heartbeat, a quiet tick, a loss already known
        if isinstance(event, ExecutorStreamReopened) and not step.any_job:
            # It changes no job but the ones whose files the executor has, which
            # now count it among those that ran them (``_release_ended``): the
            # launches it sends again were recorded already. (A launch it takes
            # back from an executor that takes no task sets ``any_job``.)
            held = [j for j in event.held_jobs if j in self._jobs or j in self._finished]
            named = (j for j in map(_job_of, commands) if j is not None)
            return list(dict.fromkeys([*held, *step.finished, *named]))
        # A task report that ended a suspicion may have given its executor's
        # outputs back in any job (``_trusted_again``).
        job = None if step.any_job else _job_of(event)
        touched = [job] if job is not None else list(self._jobs)
        # A result that expired on a tick, its holders lost, names no command
        # (the whole-cluster simulation, seed 2602374: the store kept it unread).
        touched += step.finished
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

    def probe_targets(self, executor: ExecutorId, now: float) -> tuple[ProbeTarget, ...]:
        """The peers ``executor`` is to probe the links from (``state_probes``)."""
        return probe_targets(self._executors, executor, now)

    @property
    def slow_link_marks_hold(self) -> bool:
        """Whether executors marked behind a slow link take no new task now
        (``ExecutorRegistry.marks_hold``: some unmarked executor would)."""
        return self._executors.marks_hold

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
            settled += self._forgettable(done, self._now)
        if settled > self._keep_finished:
            raise StateInvariantError(
                "finished-jobs",
                f"{settled} settled jobs that ended {self._keep_finished_s:.0f} s ago or "
                f"more kept (at most {self._keep_finished})",
            )
        if self._executors.any_live() and self._no_executor_since is not None:
            raise StateInvariantError(
                "no-executor-since",
                f"no executor alive since {self._no_executor_since}, yet "
                f"{self._executors.live_ids()} are",
            )
        for executor in self._set_aside:
            rec = self._executors.live(executor)
            if rec is not None and rec.quarantined_until is not None:
                raise StateInvariantError(
                    "executor-health",
                    f"outputs of executor {executor} set aside to be given back, yet it is "
                    "quarantined (its outputs are moved for good)",
                )
        if any(not is_live(holder) for holder in self._unreachable):
            raise StateInvariantError(
                "unreachable-reports",
                f"fetch reports kept about executors no longer alive: {sorted(self._unreachable)}",
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

    def export_revivals(self) -> StoredRevivals:
        """What the store keeps of the lost executors that may come back
        (``state_revival``), the same object until it changes."""
        return self._revivals.export()

    @property
    def no_executor_since(self) -> float | None:
        return self._no_executor_since

    def restore(
        self,
        executors: RegistrySnapshot | None,
        jobs: list[JobRecord],
        finished: list[FinishedJob],
        no_executor_since: float | None,
        revivals: StoredRevivals | None = None,
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
        if revivals is not None:
            registry = self._executors

            def lost(e: ExecutorId) -> bool:
                view = registry.view(e)
                return view is not None and view.state is ExecutorState.LOST

            self._revivals = Revivals.restored(revivals, lost, registry.is_live)

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
        if self._executors.heard_from(event.executor, event.time) is not None:
            self._trusted_again(event.executor, step)
        found = self._current(event.attempt, event.executor)
        if found is None:
            self._late_write(event.attempt, event.executor, bool(event.outputs), step)
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
        duration = max(0.0, step.now - started)
        task.move(Done(event.attempt, event.executor, outputs, duration=duration))
        self._recent_runs.append(duration)
        job.store_misses = 0
        self._executors.stop(event.executor, event.attempt)
        if self.limits.speculation:
            observe_speed(executor, job.stages[task.id.stage], step.now - started, self.limits)
        if job.stages[job.plan.final.id].complete:
            if job.plan.write is not None:
                self._commit(job, step)
            else:
                self._finish(job, JobState.SUCCEEDED, "", step)

    def _task_failed(self, event: TaskFailed, step: Step) -> None:
        if self._executors.heard_from(event.executor, event.time) is not None:
            self._trusted_again(event.executor, step)
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
                msg = then(msg, failure.error_type.advice)
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
                store_down = self._store_missed(job, failure)
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
                if store_down is not None and not job.state.finished:
                    self._finish(job, JobState.FAILED, store_down, step, failure.error_type)
                elif not job.state.finished:
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

    def _store_missed(self, job: JobRecord, failure: ExecutionError) -> str | None:
        """Count an attempt that failed because the object store did not answer;
        the job's error once ``Limits.max_task_attempts`` of its attempts did so
        in a row (``JobRecord.store_misses``), else ``None``.

        A store that stays down fails every task that reads it, each attempt
        after the store's whole retry budget: counted per task, the job waited
        for one task's attempts one after another (2.4 minutes with the
        defaults); counted per job, the attempts running side by side count
        together.
        """
        if failure.error_type is not ErrorType.OBJECT_STORE_UNAVAILABLE:
            return None  # says nothing of the store: only an attempt that finished does
        job.store_misses += 1
        limit = self.limits.max_task_attempts
        if job.store_misses < limit:
            return None
        return (
            f"the object store did not answer {job.store_misses} attempts in a row of the "
            f"job's tasks, each after its retries (the limit is {limit}); last error: "
            f"{failure.message}. {ErrorType.OBJECT_STORE_UNAVAILABLE.advice}"
        )

    # -------------------------------------------------------------- executors

    def _registered(self, event: ExecutorRegistered, step: Step) -> None:
        """A new executor, one the restored state awaits asking to resume its id,
        or a lost one back alive (``_came_back``)."""
        if event.resume is not None:
            info = replace(event.executor, id=event.resume)
            offer = Resume(info, event.held, event.held_jobs)
            if self._executors.resume(event.resume, offer):
                step.commands.append(ResumeExecutor(step.cause, event.resume))
                return
            if self._came_back(event.resume, offer, step):
                return
        self._executors.register(event.executor, event.time)

    def _connected(self, event: ExecutorConnected, step: Step) -> None:
        live = self._executors.connected(event.executor, event.time)
        if live is not None:
            live.stream = event.event_id
            self._no_executor_since = None
            return
        back = self._executors.reattached(event.executor, event.time)
        if back is None:
            step.commands.append(RefuseStream(step.cause, event.executor))
            return
        rec, offer = back
        rec.stream = event.event_id
        left = self._revivals.arrived(rec.id)
        if left is not None:
            self._restore_left(rec.id, left, offer.held, step)
        self._reattached(rec, offer.held, step)
        self._release_ended(rec.id, offer.held_jobs, step)

    def _release_ended(self, executor: ExecutorId, jobs: tuple[JobId, ...], step: Step) -> None:
        """Delete an executor's files of ``jobs`` that ended while it was away
        (reattached after a scheduler restart) or cut off (its stream moved,
        ``state_streams``): their release may never have reached it.

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
