"""Recovery: what the scheduler's state machine undoes and makes again when an
executor is lost, an output goes missing, or the scheduler itself restarts.

Just over 600 lines on purpose: how a loss is handled is meant to be read top to
bottom in one file (the issue that made this module asked for exactly that); its
pure rules of revival are ``state_revival``'s already.

Read top to bottom, this is how a lost executor is handled (``Recovery._lose``,
whatever lost it: a closed stream, a heartbeat timeout, fetch failures, a
drain that finished):

1. ``DeclareExecutorLost`` for it: the shell closes its stream, the one place
   a stream is closed.
2. Its running attempts go back to pending, each charged an attempt
   (``_requeue``; taken back should it come back alive, ``_refund``); a task
   that used up ``Limits.max_task_attempts`` fails its job (``_exhausted``,
   the message). A speculative copy on it is dropped,
   uncharged: the attempt it copied goes on.
3. Running attempts elsewhere that read its outputs are cancelled, uncharged
   (``_cancel_readers``): they would only wait on a fetch that cannot succeed.
4. The outputs it held that an unfinished stage still needs go back to
   pending, recursively for their own inputs (``_restore_lost_outputs``): one
   re-run of their stage, one recompute of each task; a task whose output is
   lost more than ``Limits.max_task_recomputes`` times fails the job
   (``_lost_too_often``: the rule and its message, once).

The same steps, in part, serve the other ways outputs are lost: a missing or
corrupt file on an executor that still answers (``_output_lost``), a cut
between two live executors (``_unreachable_holder``, ``_exclude``), and a
scheduler restart (``_recovered``; ``_reattached`` when an executor comes back
without some of its files). Every attempt stopped is a ``CancelTask`` plus the
slot freed (``_stop``).

Two steps run before a loss or undo one (the rules of which outputs count
again are ``state_revival``'s):

* recompute on suspicion (``_recompute_suspected``, on a ``Tick``): the needed
  outputs of a suspected executor are made again while a trusted executor has
  a slot for them (a free one, or one a reader waiting on it holds), once per
  suspicion, and set aside (``_set_aside``); if it is heard from again first
  they are its again (``_trusted_again``);
* a quarantined executor (a flapping link, ``state_liveness``): the outputs
  jobs need that it holds are made again elsewhere for good, under the same
  bound (``_move_quarantined``);
* a false loss (``_came_back``): a lost executor asking to resume its id is
  logged, the attempts its loss charged are taken back (``_refund``), and,
  while outputs it held are still needed and not made again,
  revived under its id (``ExecutorRegistry.revive``); when its stream opens
  they are its again, a recompute still running cancelled (``_restore_left``).
  ``_lose`` notes what each executor held for this (``Left``, memory only).

``Recovery`` is a part of ``scheduler.state.SchedulerState`` (one of its base
classes, with ``state_lifecycle.Lifecycle``, ``state_placement.Placement`` and
``state_health.Health``, whose ``Tick`` calls ``_recompute_suspected``):
it reads and changes the same jobs and executors, and ends a job through
``Lifecycle._finish``. Pure like the rest: no I/O, the time comes on the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mangonel.errors import ErrorType, then
from mangonel.ids import ExecutorId, JobId, TaskAttemptId
from mangonel.scheduler.events import (
    AbortWrite,
    Command,
    CommitWrite,
    DeclareExecutorLost,
    HealthChange,
    Limits,
    LogExecutorHealth,
    LossReason,
    ResumeExecutor,
    TaskFailed,
)
from mangonel.scheduler.state_executors import ExecutorRecord, ExecutorRegistry, Resume
from mangonel.scheduler.state_jobs import FinishedJob, JobRecord
from mangonel.scheduler.state_revival import Left, Revivals, restore
from mangonel.scheduler.state_stages import PENDING, Done, Running, StageRecord, TaskRecord
from mangonel.scheduler.state_views import ExecutorState, JobState
from mangonel.task import CancelTask, FetchFailed


@dataclass
class Step:
    """The commands one event produces, and the event's id and time."""

    cause: int
    now: float
    commands: list[Command] = field(default_factory=list)
    any_job: bool = False
    """The event changed jobs beyond its own and those its commands name (a
    task report that gave a suspected executor's outputs back): for
    ``SchedulerState.touched_jobs``."""
    finished: list[JobId] = field(default_factory=list)
    """Finished jobs it changed that neither it nor its commands name (a result
    released when it expired, its holders all lost): for ``touched_jobs``."""


def is_running(state: object, attempt: TaskAttemptId, executor: ExecutorId) -> bool:
    """``state == Running(attempt, executor)``, without building one: asked of
    every report."""
    return isinstance(state, Running) and state.attempt == attempt and state.executor == executor


def output_of(stage: StageRecord, task: TaskRecord) -> str:
    """``the output of task 3 of stage 1 (scan t) of job j1``, for errors."""
    label = f" ({stage.stage.label})" if stage.stage.label else ""
    return (
        f"the output of task {task.id.partition} of stage {stage.stage.id}{label} "
        f"of job {task.id.job}"
    )


_LEFT_FOR_GOOD = frozenset({LossReason.DRAINED, LossReason.PROCESS_EXITED})
"""Losses that were no guess: an executor lost so that asks to resume is no false loss."""


@dataclass(frozen=True)
class Loss:
    """One executor lost, why, and the evidence (for the log)."""

    executor: ExecutorId
    reason: LossReason
    detail: str


class Recovery:
    """The recovery rules of ``SchedulerState``; see the module docstring."""

    limits: Limits
    _executors: ExecutorRegistry
    _jobs: dict[JobId, JobRecord]
    _finished: dict[JobId, FinishedJob]
    _unreachable: dict[ExecutorId, dict[ExecutorId, float]]
    _no_executor_since: float | None
    _revivals: Revivals
    _set_aside: dict[ExecutorId, Left]

    if TYPE_CHECKING:
        # Another part's (``state_lifecycle.Lifecycle``): the one way a job ends.
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

    def _declare_lost(self, loss: Loss, step: Step) -> None:
        """``DeclareExecutorLost``: the shell closes the executor's stream. Every
        loss is declared here, with what it rests on (for the log)."""
        step.commands.append(
            DeclareExecutorLost(step.cause, loss.executor, loss.reason, loss.detail)
        )

    def _stop(self, running: Running, step: Step) -> None:
        """Stop one attempt: ``CancelTask`` to its executor, and its slot is free
        at once (whatever it reports later is stale and ignored)."""
        step.commands.append(CancelTask(step.cause, running.executor, running.attempt))
        self._executors.stop(running.executor, running.attempt)

    def _lost_too_often(
        self, stage: StageRecord, task: TaskRecord, last: str, advice: str
    ) -> str | None:
        """The job's error when ``task``'s output was lost more than
        ``Limits.max_task_recomputes`` times, else ``None``: the rule that ends
        a job whose outputs keep going, instead of looping. ``last`` says how it
        went last, ``advice`` what to check."""
        limit = self.limits.max_task_recomputes
        if task.recomputes <= limit:
            return None
        return (
            f"{output_of(stage, task)} was lost {task.recomputes} times (the limit is "
            f"{limit}; {last}). {advice}, or raise max_task_recomputes."
        )

    def _lose(self, losses: list[Loss], step: Step) -> None:
        """Recover from executors lost together, in one step: ``DeclareExecutorLost``
        for each (the shell closes its stream), then what their loss undoes."""
        for loss in losses:
            self._declare_lost(loss, step)
        failing: dict[JobId, str] = {}
        for loss in losses:
            # What it holds, before its loss sends any of it back: theirs again
            # should it come back alive (``_came_back``).
            left = Left.of(self._jobs.values(), loss.executor)
            aside = self._set_aside.pop(loss.executor, None)
            if aside is not None:
                left = aside.merged(left)
            self._revivals.note(loss.executor, loss.reason, left)
            running = self._executors.mark_lost(loss.executor, loss.reason, loss.detail, step.now)
            why = f"executor {loss.executor} was lost ({loss.reason.value})"
            if loss.detail:
                why += f": {loss.detail}"
            for attempt in running:
                job = self._jobs.get(attempt.task.job)
                task = job.task(attempt.task) if job is not None else None
                if job is None or task is None:
                    continue
                if is_running(task.speculative, attempt, loss.executor):
                    task.set_copy(None)  # the attempt it copied goes on, uncharged
                    continue
                if not is_running(task.state, attempt, loss.executor):
                    continue
                self._revivals.charge(loss.executor, loss.reason, job.id, task.id)
                if self._requeue(task, loss.executor, why, charge=True):
                    failing.setdefault(job.id, self._exhausted(task))
        if not self._executors.any_live() and self._no_executor_since is None:
            self._no_executor_since = step.now
        gone = {loss.executor for loss in losses}
        for executor in gone:
            self._unreachable.pop(executor, None)
        self._revivals.forget(lambda e: self._executors.view(e) is not None)
        for job in list(self._jobs.values()):
            self._cancel_readers(job, gone, step)
            problem = failing.get(job.id) or self._restore_lost_outputs(job)
            if problem is not None:
                self._finish(job, JobState.FAILED, problem, step)

    def _requeue(
        self,
        task: TaskRecord,
        executor: ExecutorId,
        error: str,
        *,
        charge: bool,
        error_type: ErrorType = ErrorType.JOB_FAILED,
    ) -> bool:
        """A task's running attempt on ``executor`` ended without output: back to
        pending, or, when a speculative copy of it still runs, on with the copy.
        ``error`` and ``error_type`` say why (the job's error should it be the last).

        Returns whether it has now used up ``Limits.max_task_attempts``.
        """
        copy = task.speculative
        task.set_copy(None)
        task.move(copy if copy is not None and copy.executor != executor else PENDING)
        task.ended(executor, error, error_type, charge=charge)
        return charge and task.failures >= self.limits.max_task_attempts

    def _exhausted(self, task: TaskRecord) -> str:
        """The error of a job whose ``task`` used up its attempts (the job's type is
        ``task.last_error_type``)."""
        advice = task.last_error_type.advice or (
            "Check those executors' logs; if the failure is transient, raise max_task_attempts."
        )
        return (
            f"task {task.id} failed {task.failures} attempts (the limit is "
            f"{self.limits.max_task_attempts}) on executor(s) {', '.join(task.failed_on)}; "
            + then(f"last error: {task.last_error}", advice)
        )

    def _cancel_readers(self, job: JobRecord, gone: set[ExecutorId], step: Step) -> None:
        """Cancel the running tasks of ``job`` that read outputs held by ``gone``.

        They would otherwise wait on a fetch from an executor given up on (up to
        the executor's fetch timeout, holding the slot) to fail and be re-run
        anyway. They go back to pending, uncharged, and run again once the
        outputs are made again.
        """
        for task in job.readers_of(gone):
            if isinstance(task.state, Running):
                holders = ", ".join(sorted(gone))
                self._cancel(task, f"an input it read on executor {holders} was lost", step)

    def _cancel(self, task: TaskRecord, why: str, step: Step) -> None:
        """Stop a running attempt (and its copy) that is not at fault: back to
        pending, uncharged."""
        if not isinstance(task.state, Running):
            return
        self._cancel_copy(task, step)
        running = task.state
        self._stop(running, step)
        self._requeue(task, running.executor, why, charge=False)

    def _cancel_copy(self, task: TaskRecord, step: Step) -> None:
        copy = task.speculative
        if copy is not None:
            self._stop(copy, step)
            task.set_copy(None)

    def _restore_lost_outputs(self, job: JobRecord) -> str | None:
        """Send done tasks whose output is gone but still needed back to pending.

        An output is needed when it is the final stage's (the job has not
        succeeded, or it would be gone) or when a stage that reads it is not
        complete. Walking the stages from the last to the first settles each
        stage's completeness before its inputs are looked at, so one pass also
        recomputes inputs of the tasks it just sent back.

        The bound is per task, not per stage: among many executors every loss
        takes a few outputs of every big stage, and a count per stage would
        fail any long job after a handful of routine losses (the simulator's
        jobs of 100,000 tasks on 1,000 executors all failed so); a loss takes
        the same task's output again only when something is wrong with it.
        Every loss that sets the job back either charges a running attempt or
        recomputes some output, so both bounds together end any loop.

        Returns the job's error when a task used up ``Limits.max_task_recomputes``.

        A write statement being committed is left as it is, here and wherever
        outputs are made again (``_make_again``, ``_reattached``): it launches
        nothing more, its winners are chosen, and its final task's output (the
        rows written) names where it was made, which the client reads from the
        status that carried it (a small result comes with its report); sent back
        to pending it named nowhere, and the statement succeeded with no answer
        (the whole-cluster simulation's write statements, seeds 2000053: a loss,
        and 2001164: a quarantine that moved the executor's outputs).
        """
        if job.commit is not None:
            return None
        is_live = job.usable(self._executors.is_live)
        needed = {job.plan.final.id}
        for rec in reversed(job.stages.values()):
            if rec.stage.id in needed:
                gone_from = sorted(e for e in rec.done_on if not is_live(e))
                worst: TaskRecord | None = None
                for executor in gone_from:
                    for t in rec.send_back(executor):
                        if worst is None or t.recomputes > worst.recomputes:
                            worst = t
                if worst is not None:
                    rec.reruns += 1
                    problem = self._lost_too_often(
                        rec,
                        worst,
                        f"last with executor(s) {', '.join(gone_from)}",
                        "Executors keep being lost: check their logs, memory and network",
                    )
                    if problem is not None:
                        return problem
            if not rec.complete:
                needed.update(rec.stage.upstream)
        return None

    def _fail_if_unrecoverable(self, job: JobRecord, step: Step) -> None:
        problem = self._restore_lost_outputs(job)
        if problem is not None:
            self._finish(job, JobState.FAILED, problem, step)

    def _output_lost(self, job: JobRecord, failure: FetchFailed) -> str | None:
        """One map output is gone from an executor that still answers: make it again.

        Only that map task goes back to pending (its executor keeps everything
        else); it counts as one of the task's recomputes, so a file that keeps
        going bad ends the job instead of looping. A failure about an output that
        was already made again elsewhere changes nothing.

        Returns the job's error when the task used up ``Limits.max_task_recomputes``.
        """
        rec = job.stages.get(failure.stage)
        if rec is None or not 0 <= failure.map_partition < len(rec.tasks):
            return None
        task = rec.tasks[failure.map_partition]
        if not isinstance(task.state, Done) or task.state.executor != failure.executor:
            return None
        task.recompute()
        rec.reruns += 1
        return self._lost_too_often(
            rec,
            task,
            f"last: {failure.message}",
            f"Its files keep going missing or bad on executor {failure.executor}: check "
            f"that executor's disk",
        )

    def _unreachable_holder(
        self, job: JobRecord, event: TaskFailed, holder: ExecutorId, error: str, step: Step
    ) -> None:
        """A reader on one live executor could not reach another live executor.

        A holder that has not reattached since the scheduler restarted is lost at
        once (``FETCH_FAILURES``): the scheduler has not heard from it, so nothing
        points to a cut rather than a death. Any other holder still heartbeats,
        so the scheduler hears both: it is a cut between the two, not a lost
        executor. Losing the holder would only make it register again under a
        new id, and the cut would fail the next fetch across it the same way
        (flapping). So:

        * readers on two different executors failed to reach the holder within
          ``Limits.unreachable_window_s``: the holder is what is cut off (or
          its Flight server is broken), and it is lost (``FETCH_FAILURES``);
        * else one side of the cut gives way for this job: the job stops using
          it (``JobRecord.excluded``) and makes its outputs again on the other
          executors, but the executor stays alive under its id and runs other
          jobs' tasks. The side that gives way is the one holding fewer of the
          outputs the job still needs (less to make again); on a tie, the
          holder, the side a reader reported. A job excludes no executor when no
          other would be left for it; then the holder is lost, as before.
        """
        reader = event.executor
        held = self._executors.live(holder)
        if held is not None and held.awaiting:
            # Not heard from since the scheduler restarted: nothing says it is
            # alive, and a reader could not reach it. Lost, as any silent one.
            detail = f"not back since the scheduler restarted; task {event.attempt} {error}"
            self._lose([Loss(holder, LossReason.FETCH_FAILURES, detail)], step)
            return
        window = self.limits.unreachable_window_s
        reports = self._unreachable.setdefault(holder, {})
        reports[reader] = step.now
        readers = sorted(
            r for r, at in reports.items() if step.now - at <= window and self._executors.is_live(r)
        )
        if len(readers) < 2 and reader != holder:
            # Both sides are usable by the job (the reader's attempt was current,
            # the holder is not excluded), so the side left keeps it going.
            needed = job.needed_outputs(job.usable(self._executors.is_live))
            side, other = (
                (reader, holder)
                if needed.get(reader, 0) < needed.get(holder, 0)
                else (holder, reader)
            )
            self._exclude(job, side, f"cut off from executor {other} ({error})", step)
            return
        detail = (
            f"readers on {', '.join(readers)} could not reach it; "
            f"last: task {event.attempt} {error}"
        )
        self._lose([Loss(holder, LossReason.FETCH_FAILURES, detail)], step)

    def _exclude(self, job: JobRecord, executor: ExecutorId, why: str, step: Step) -> None:
        """The job stops using a live executor ``executor``: its attempts and the
        readers of its outputs are cancelled (uncharged), and the outputs it held
        that the job still needs are made again (a recompute of each task)."""
        job.excluded.add(executor)
        for task in job.tasks():
            copy = task.speculative
            if copy is not None and copy.executor == executor:
                self._cancel_copy(task, step)
            if isinstance(task.state, Running) and task.state.executor == executor:
                self._cancel(task, f"executor {executor} was {why}", step)
        self._cancel_readers(job, {executor}, step)
        self._fail_if_unrecoverable(job, step)

    def _recovered(self, step: Step) -> None:
        """The scheduler restarted: nothing runs, every live executor must reattach."""
        why = "the scheduler restarted while it ran"
        for job in self._jobs.values():
            for task in job.tasks():
                # Copies are not resumed: the executors stop them all. Only a task
                # that had one is assigned: an assignment marks the task changed,
                # and a stage that never launched must have no task in the store
                # (adaptive execution may still give it fewer tasks; a key left
                # for a task it no longer has fails the job at the next restart).
                if task.speculative is not None:
                    task.set_copy(None)
                if isinstance(task.state, Running):
                    self._requeue(task, task.state.executor, why, charge=False)
        self._executors.recovered(step.now)
        if self._executors.any_live():
            # ``meta`` may be older than ``executors`` (a change written in
            # several commits ends with them): an executor is alive now.
            self._no_executor_since = None
        elif self._no_executor_since is None:
            self._no_executor_since = step.now
        # A state change written in several commits (store limits) may have
        # left a job naming outputs of an executor already stored as lost.
        for job in list(self._jobs.values()):
            self._fail_if_unrecoverable(job, step)
        for job in self._jobs.values():
            if job.commit is not None and job.plan.write is not None:
                # It may have been done, in part or whole: ``output.commit`` is
                # idempotent, and finishes it.
                winners = tuple(sorted(job.commit.items()))
                step.commands.append(CommitWrite(step.cause, job.id, job.plan.write, winners))
        for done in self._finished.values():
            if done.write is not None and done.view.state is not JobState.SUCCEEDED:
                # Its end was stored before its ``AbortWrite`` was carried out, and
                # the crash may have come between (the whole-cluster simulation's
                # write statements, seed 2000233: a cancel). ``output.abort`` is
                # idempotent.
                step.commands.append(AbortWrite(step.cause, done.view.id, done.write))

    def _reattached(self, rec: ExecutorRecord, held: frozenset[str], step: Step) -> None:
        """An executor is back after a restart: outputs it no longer has are made again."""
        self._no_executor_since = None
        for job in list(self._jobs.values()):
            if job.commit is not None:
                continue  # launches nothing more (``_restore_lost_outputs``)
            problem: str | None = None
            sent_back = False
            for stage in job.stages.values():
                gone = [
                    t
                    for t in stage.done_tasks_on(rec.id)
                    if isinstance(t.state, Done)
                    and any(o.path not in held for o in t.state.outputs)
                ]
                for task in gone:
                    task.recompute()
                if gone:
                    sent_back = True
                    stage.reruns += 1
                    worst = max(gone, key=lambda t: t.recomputes)
                    problem = problem or self._lost_too_often(
                        stage,
                        worst,
                        f"last: executor {rec.id} came back after a scheduler restart without "
                        f"it and {len(gone) - 1} other output(s) of the stage",
                        "Check that executor's disk",
                    )
            if sent_back and problem is None:
                # Stages incomplete again need their inputs again: any lost with
                # an executor meanwhile (one not back after the restart) are
                # made again too.
                problem = self._restore_lost_outputs(job)
            if problem is not None:
                self._finish(job, JobState.FAILED, problem, step)

    # ------------------------------------------------ before a loss, or undoing one

    def _recompute_suspected(self, step: Step) -> None:
        """Make again, before any loss, the needed outputs of a suspected executor.

        While a trusted executor has a slot for it (``_room_to_recompute``: a
        free one, or one a reader of the suspect's outputs holds; the bound: a
        recompute never waits for a slot, nor takes one from a task that could
        go on), each suspected executor's outputs that a job still needs go
        back to pending, once per suspicion, and the running readers of its
        outputs are cancelled (uncharged: they wait on a silent host). The
        outputs are set aside (``_set_aside``): if
        it is trusted again before their recomputes finish, they are its again
        and the recomputes cancelled (``_trusted_again``); a recompute that
        finishes first wins, and the executor's copy goes with the job's files.
        Not while the scheduler takes itself for cut off (the caller,
        ``Health._tick``), nor for an executor silent since before that ended
        (the link heals for them one by one, and its loss waits a timeout more:
        ``state_liveness``), nor for a quarantined executor (``_move_quarantined``
        moves its outputs for good) or one awaiting its reattachment.
        """
        for rec in self._executors.live_records():
            if (
                rec.suspected_since is None
                or rec.quarantined_until is not None
                or rec.awaiting
                or rec.id in self._set_aside
                or self._executors.silent_since_isolation(rec)
                or not self._room_to_recompute(rec.id)
            ):
                continue
            left = Left.of(self._jobs.values(), rec.id)
            sent = self._make_again(rec.id, step)
            if sent:
                self._set_aside[rec.id] = left
                why = f"{sent} output(s) it holds that jobs need are made again elsewhere"
                step.commands.append(
                    LogExecutorHealth(step.cause, HealthChange.SET_ASIDE, rec.id, why)
                )

    def _move_quarantined(self, step: Step) -> None:
        """Make again elsewhere, for good, the needed outputs of a quarantined executor.

        A flapping host's outputs are served only while its link is up: a
        reader that meets a cut waits for the heal, or for its fetch timeout
        and a recompute (measured: q9 5.3x healthy when a reader's fetch
        stalled 4 s). So while a trusted executor has a slot for them (the
        bound of ``_room_to_recompute``), the outputs jobs need that it holds
        go back to pending and their running readers are cancelled
        (uncharged), as on a suspicion, but they are never its again: it gets
        no new task while quarantined, so each output is moved once. Outputs
        set aside for an earlier suspicion are not given back either
        (``Health._tick`` drops them when the quarantine begins). Not while
        the scheduler takes itself for cut off (the caller).
        """
        for rec in self._executors.live_records():
            if rec.quarantined_until is None or rec.awaiting or not self._room_to_recompute(rec.id):
                continue
            sent = self._make_again(rec.id, step)
            if sent:
                why = f"{sent} output(s) it holds that jobs need are made again elsewhere, for good"
                step.commands.append(LogExecutorHealth(step.cause, HealthChange.MOVED, rec.id, why))

    def _make_again(self, executor: ExecutorId, step: Step) -> int:
        """Send the outputs of ``executor`` that jobs need back to pending, their
        running readers cancelled (uncharged); how many were sent back.

        The stages are walked from the last to the first, as a loss walks
        them (``_restore_lost_outputs``): an output sent back makes its stage
        incomplete, and so its inputs needed again, and those on ``executor``
        go back too. (Taken at once, q9's third stage was made again on a
        trusted executor from the second's output on the flapping one, and
        waited for the heal: measured, 1.8 s against 0.34 s healthy.)

        The executor still answers, so this is a choice, never the end of a
        job: a job that needs an output of it whose task has used up its
        recomputes (``Limits.max_task_recomputes``) is left as it is, its
        readers waiting for the executor. Should it then be lost, the loss
        ends the job by the limit's rule (``_restore_lost_outputs``).
        """
        sent = 0
        limit = self.limits.max_task_recomputes
        for job in list(self._jobs.values()):
            if (
                job.commit is not None  # launches nothing more (``_restore_lost_outputs``)
                or executor in job.excluded
                or not job.needs_outputs_of(executor)
                or job.recomputed_up_to(executor, limit)
            ):
                continue
            self._cancel_readers(job, {executor}, step)
            needed = {job.plan.final.id}
            for stage in reversed(job.stages.values()):
                if stage.stage.id in needed and not any(
                    t.recomputes >= limit for t in stage.done_tasks_on(executor)
                ):
                    back = stage.send_back(executor)
                    if back:
                        stage.reruns += 1
                        sent += len(back)
                if not stage.complete:
                    needed.update(stage.stage.upstream)
            self._fail_if_unrecoverable(job, step)
        return sent

    def _room_to_recompute(self, suspect: ExecutorId) -> bool:
        """Whether a trusted executor has a slot for a recompute of ``suspect``'s
        outputs: a free one, or one held by a reader of them (an attempt or its
        copy), which the recompute cancels. Such a reader waits on a silent host
        and needs the recompute itself: when readers hold every trusted slot, as
        when a reduce stage runs, counting free slots only would wait for the loss."""
        if self._executors.least_loaded() is not None:
            return True
        for job in self._jobs.values():
            if suspect in job.excluded or not job.needs_outputs_of(suspect):
                continue
            for task in job.readers_of({suspect}):
                for attempt in (task.state, task.speculative):
                    if not isinstance(attempt, Running):
                        continue
                    holder = self._executors.live(attempt.executor)
                    if holder is not None and holder.takes_tasks:
                        return True
        return False

    def _trusted_again(self, executor: ExecutorId, step: Step) -> None:
        """A suspected executor was heard from: the outputs set aside for its
        suspicion that were not made again yet are its again."""
        left = self._set_aside.pop(executor, None)
        if left is not None:
            step.any_job = True  # whatever event this was, any job may change
            self._restore_left(executor, left, left.paths(), step)

    def _came_back(self, executor: ExecutorId, offer: Resume, step: Step) -> bool:
        """A lost executor asks to resume its id: a false loss, logged; returns
        whether it goes on under that id (``state_revival``)."""
        view = self._executors.view(executor)
        if view is None or view.state is not ExecutorState.LOST or view.reason in _LEFT_FOR_GOOD:
            return False
        lost_for = view.reason.value if view.reason is not None else "?"
        self._refund(executor)
        left = self._revivals.left.get(executor)
        # Worth its id only for outputs nobody made again: otherwise a new life
        # (its old files deleted) is simpler for both sides.
        useful = left is not None and bool(restore(self._jobs, left, offer.held, executor))
        revived = useful and self._revivals.take(executor)
        why = f"lost ({lost_for}) but alive; " + (
            f"it goes on under its id with the {len(offer.held)} file(s) it holds"
            if revived
            else ("nothing it holds is needed any more: " if left is not None else "")
            + "it registers anew, its files deleted"
        )
        step.commands.append(LogExecutorHealth(step.cause, HealthChange.CAME_BACK, executor, why))
        if not revived:
            return False
        self._executors.revive(executor, offer, step.now)
        self._no_executor_since = None
        step.commands.append(ResumeExecutor(step.cause, executor))
        return True

    def _refund(self, executor: ExecutorId) -> None:
        """A lost executor came back alive: the attempts its loss charged to the
        tasks running on it are taken back (a task of a job still running). A
        flapping link otherwise used up a task's attempts, and failed its job,
        for a process that never died."""
        for job_id, tasks in self._revivals.refunds(executor).items():
            job = self._jobs.get(job_id)
            if job is None or job.state.finished:
                continue
            for task_id in tasks:
                task = job.task(task_id)
                if task is not None:
                    task.refunded(executor)

    def _restore_left(
        self, executor: ExecutorId, left: Left, held: frozenset[str], step: Step
    ) -> None:
        """A revived executor's stream opened, or a suspected one was heard from:
        the outputs it left that were not made again meanwhile are its again
        (``state_revival.restore``); a recompute of one still running is
        cancelled, uncharged."""
        for job_id, restored in restore(self._jobs, left, held, executor).items():
            for task in restored.cancel:
                running = task.state
                if isinstance(running, Running):  # ``restore`` cancels only these
                    self._cancel_copy(task, step)
                    self._stop(running, step)
            for task, state in restored.done:
                # Sent back at the loss, counted as a recompute: none was needed.
                task.restored(state)
            self._jobs[job_id].ran_on.add(executor)
