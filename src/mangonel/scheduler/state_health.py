"""Health: what time and the executors' own reports say about them.

On a ``Tick`` (``Health._tick``): exclusions that are over end, the failure
detector's judgement (``state_liveness.judge``) is logged and its losses are
handed to ``state_recovery``; a silent executor that work waits on is
suspected sooner (``state_liveness.hedge``, with what that work costs:
``_waiting_on``); suspected and quarantined executors' needed outputs are made
again early, unless the scheduler takes itself for cut off; executors that
opened no stream in time are written off, unread results expire, and jobs
waiting with no executor alive for ``Limits.no_executor_grace_s`` fail. After
every event, draining executors with nothing left to do are let go
(``_complete_drains``). Failures counted against an executor may exclude it
(``state_gray``); with every executor excluded, waiting jobs fail
(``_fail_if_all_excluded``).

A part of ``scheduler.state.SchedulerState`` (its base class), pure like the rest.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, StageId
from mangonel.scheduler.events import (
    HealthChange,
    Limits,
    LogExecutorHealth,
    LossReason,
)
from mangonel.scheduler.state_executors import (
    ExecutorRegistry,
)
from mangonel.scheduler.state_gray import (
    count_failure,
    excluded_everywhere,
)
from mangonel.scheduler.state_jobs import FinishedJob, JobRecord
from mangonel.scheduler.state_liveness import (
    STREAM_LAG_S,
    Judgement,
    hedge,
    judge,
    late_beats,
    observe_running,
)
from mangonel.scheduler.state_recovery import Loss, Step
from mangonel.scheduler.state_revival import Left
from mangonel.scheduler.state_stages import Running, StageRecord, TaskRecord
from mangonel.scheduler.state_views import (
    JobState,
)

RECENT_RUNS = 32
"""Tasks (the last to finish, any job's) whose run times stand for a stage's
before any task of it is done (``Health._waiting_on``)."""


class Health:
    """The executor-health rules of ``SchedulerState``; see the module docstring."""

    limits: Limits
    _executors: ExecutorRegistry
    _jobs: dict[JobId, JobRecord]
    _recent_runs: deque[float]
    _finished: OrderedDict[JobId, FinishedJob]
    _no_executor_since: float | None
    _set_aside: dict[ExecutorId, Left]

    if TYPE_CHECKING:
        # Other parts': a job's end (``state_lifecycle``), losses and recompute
        # on suspicion (``state_recovery``).
        def _finish(
            self,
            job: JobRecord,
            state: JobState,
            error: str,
            step: Step,
            error_type: ErrorType = ErrorType.JOB_FAILED,
            *,
            committed: bool = False,
        ) -> None: ...

        def _release_result(self, job_id: JobId, step: Step) -> None: ...

        def _lose(self, losses: list[Loss], step: Step) -> None: ...

        def _declare_lost(self, loss: Loss, step: Step) -> None: ...

        def _recompute_suspected(self, step: Step) -> None: ...

        def _move_quarantined(self, step: Step) -> None: ...

    def _tick(self, step: Step) -> None:
        """Time passed: exclusions end, the detector judges silences (suspected,
        quarantined, lost), connecting executors time out, unread results
        expire, and with no executor alive for the grace, waiting jobs fail."""
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
            # Nothing to recover: it never took a task (so no ``_lose``).
            self._declare_lost(Loss(executor, LossReason.CONNECTION_LOST, detail), step)
            self._executors.mark_lost(executor, LossReason.CONNECTION_LOST, detail, step.now)
        if losses:
            self._lose(losses, step)
        for rec in judged.quarantined:
            # Not its again once heard: its outputs are moved for good (below).
            self._set_aside.pop(rec.id, None)
        if not (judged.isolated or judged.isolation_near):
            late = late_beats(self._executors.live_records(), step.now, self.limits)
            if late:
                waiting = self._waiting_on(late)
                for rec in hedge(self._executors, step.now, self.limits, waiting):
                    why = (
                        f"silent for {step.now - rec.last_heartbeat:.1f} s while the others "
                        f"were heard, as long as redoing what waits on it takes (about "
                        f"{waiting[rec.id]:.2f} s)"
                    )
                    if rec.arrivals:
                        why += f"; {rec.arrivals.evidence(step.now, rec.last_heartbeat)}"
                    step.commands.append(
                        LogExecutorHealth(step.cause, HealthChange.HEDGED, rec.id, why)
                    )
            self._recompute_suspected(step)
            self._move_quarantined(step)
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

    def _log_health(self, judged: Judgement, step: Step) -> None:
        """``LogExecutorHealth`` for what ``state_liveness.judge`` changed."""
        cause, now = step.cause, step.now
        for rec in judged.suspected:
            why = f"silent for {now - rec.last_heartbeat:.1f} s"
            change = HealthChange.SUSPECTED
            if rec.id in judged.relapsed:
                change = HealthChange.RELAPSED
                why += (
                    f" while the others were heard, {now - rec.gaps[-1]:.1f} s after a long "
                    "silence ended (a flapping link is likelier cut again than slow)"
                )
            if rec.arrivals:
                why += f"; {rec.arrivals.evidence(now, rec.last_heartbeat)}"
            step.commands.append(LogExecutorHealth(cause, change, rec.id, why))
        for rec in judged.quarantined:
            assert rec.quarantined_until is not None
            why = f"{rec.quarantine}; for {rec.quarantined_until - now:.0f} s"
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

    def _waiting_on(self, executors: set[ExecutorId]) -> dict[ExecutorId, float]:
        """For each of ``executors`` that a job waits on, how long redoing that
        work takes (``state_liveness.hedge``): the longest median run time of the
        stages with an attempt running there, or with an output there that a
        running reader needs. A stage with no task done yet is taken to cost
        what the last ``RECENT_RUNS`` tasks to finish took (their median; a
        cut that meets a query's first wave has nothing else to go by), and
        before any task finished, nothing is known: the detector decides."""
        costs: dict[ExecutorId, float] = {}
        runs = sorted(self._recent_runs)
        prior = runs[len(runs) // 2] if runs else None

        def note(executor: ExecutorId, stage: StageRecord) -> None:
            cost = stage.median_duration() if stage.durations else prior
            if cost is not None:
                costs[executor] = max(costs.get(executor, 0.0), cost)

        for job in self._jobs.values():
            for stage in job.stages.values():
                for task in stage.running_tasks():
                    for run in (task.state, task.speculative):
                        if isinstance(run, Running) and run.executor in executors:
                            note(run.executor, stage)
            needed: set[StageId] | None = None
            for executor in executors:
                if not job.readers_of({executor}):
                    continue
                needed = job.needed_stages() if needed is None else needed
                for sid in needed:
                    if executor in job.stages[sid].done_on:
                        note(executor, job.stages[sid])
        return costs

    def _distrusted(self, executor: ExecutorId) -> bool:
        """Whether ``executor`` is suspected, quarantined or lagging
        (``state_liveness``): its running attempts are copied at once."""
        rec = self._executors.live(executor)
        return rec is not None and (
            rec.suspected_since is not None
            or rec.quarantined_until is not None
            or rec.lagging_since is not None
        )

    def _observe_running(self, executor: ExecutorId, now: float, reported: int, step: Step) -> None:
        """A heartbeat of ``executor`` counted ``reported`` running attempts:
        against those launched on it ``STREAM_LAG_S`` before, whether its
        command stream is held up (``state_liveness.observe_running``)."""
        rec = self._executors.live(executor)
        if rec is None or rec.awaiting:
            return
        old = 0
        for attempt in rec.running:
            job = self._jobs.get(attempt.task.job)
            task = job.task(attempt.task) if job is not None else None
            if task is None:
                continue
            for run in (task.state, task.speculative):
                if (
                    isinstance(run, Running)
                    and run.attempt == attempt
                    and now - run.started >= STREAM_LAG_S
                ):
                    old += 1
        change = observe_running(rec, now, reported, old)
        if change is True:
            why = (
                f"its heartbeats count {reported} running attempt(s) of the {old} launched on "
                f"it {STREAM_LAG_S:g} s or more ago, twice in a row: its command stream is "
                f"held up (a cut link's retries?); no new task, its attempts copied"
            )
            step.commands.append(LogExecutorHealth(step.cause, HealthChange.LAGGING, executor, why))
        elif change is False:
            why = f"its heartbeat counts every attempt launched on it ({reported} running)"
            step.commands.append(
                LogExecutorHealth(step.cause, HealthChange.CAUGHT_UP, executor, why)
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
