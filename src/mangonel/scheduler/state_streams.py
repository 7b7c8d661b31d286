"""Moving an executor's command stream to a new connection (``ExecutorStreamReopened``).

Commands pushed down a stream whose connection went through a cut wait for
TCP to send them again, and TCP backs off (0.2 s, 0.4 s, ... doubling), so
they may arrive seconds after the link healed, or never: a keepalive left
unanswered for 20 s breaks the stream, and a broken stream is a lost
executor. An executor knows when its link came back (its heartbeats failed,
then one was answered), and opens a new stream on a new connection then; it
says which attempts it holds and which it finished lately. The rule here:

* only a live executor moves its stream (any other is refused, and registers
  again as after any broken stream); the new stream is the executor's from
  now on (``ExecutorRecord.stream``), and the old one's end is no loss;
* every attempt the scheduler counts as running there that the executor
  neither holds nor finished lately is launched again, with the same attempt
  id (a launch lost in the cut, or still stuck in it: the executor ignores an
  attempt it knows, so a launch that arrives twice runs once); on an executor
  no task may be placed on now (draining, excluded, unhealthy, marked behind a
  slow link), or while an input of its stage is being made again (its spec,
  written anew, would name too few), it goes back to pending instead,
  uncharged (a copy is dropped);
* every attempt the executor holds that the scheduler does not count as
  running there is cancelled (a cancel lost in the cut);
* the files of every job it has files of (``held_jobs``) that ended are
  released (a ``ReleaseOutputs`` lost in the cut), as when an executor
  reattaches after a scheduler restart (``SchedulerState._release_ended``):
  those of a succeeded job whose result is unread keep its final stage until
  the result is read; an unfinished job's stay, released with the job;
* the move is logged (``HealthChange.STREAM_MOVED``), with what was sent again.

A part of ``scheduler.state.SchedulerState`` (its base class), pure like the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mangonel.ids import ExecutorId, JobId, TaskAttemptId
from mangonel.scheduler.events import (
    ExecutorStreamReopened,
    HealthChange,
    LogExecutorHealth,
    RefuseStream,
)
from mangonel.scheduler.state_executors import ExecutorRecord, ExecutorRegistry
from mangonel.scheduler.state_jobs import JobRecord
from mangonel.scheduler.state_recovery import Step
from mangonel.scheduler.state_stages import Running, StageState, TaskRecord
from mangonel.scheduler.state_views import ExecutorState
from mangonel.task import CancelTask, LaunchTask


class Streams:
    """The stream-move rule of ``SchedulerState``; see the module docstring."""

    _executors: ExecutorRegistry
    _jobs: dict[JobId, JobRecord]

    if TYPE_CHECKING:
        # ``SchedulerState``'s, shared with a reattaching executor.
        def _release_ended(
            self, executor: ExecutorId, jobs: tuple[JobId, ...], step: Step
        ) -> None: ...

        # ``state_recovery``'s.
        def _requeue(
            self, task: TaskRecord, executor: ExecutorId, error: str, *, charge: bool
        ) -> bool: ...

        def _cancel_copy(self, task: TaskRecord, step: Step) -> None: ...

    def _stream_reopened(self, event: ExecutorStreamReopened, step: Step) -> None:
        rec = self._executors.live(event.executor)
        if rec is None or rec.awaiting or rec.stream == 0:
            step.commands.append(RefuseStream(step.cause, event.executor))
            return
        self._executors.stream_moved(rec, event.event_id)
        known = event.holding | event.finished
        resent = [a for a in sorted(rec.running, key=str) if a not in known]
        # An executor that no task may be placed on now (draining, excluded,
        # unhealthy, marked behind a slow link) starts nothing new: a launch
        # lost in the cut goes elsewhere (it never ran there: not charged).
        # Its silence is over (it is heard), so a suspicion or a lag is no bar.
        placeable = (
            rec.state is ExecutorState.ALIVE
            and rec.excluded_until is None
            and not rec.unhealthy
            and not rec.marked
        )
        taken_back = 0
        for attempt in resent:
            if placeable and self._runnable(attempt):
                self._launch_again(rec, attempt, step)
            else:
                self._take_back(rec, attempt, step)
                taken_back += 1
        stray = sorted((a for a in event.holding if a not in rec.running), key=str)
        for attempt in stray:
            step.commands.append(CancelTask(step.cause, rec.id, attempt))
        # What its heartbeats counted short so far was the old stream's: its
        # commands get through now (a lag already marked ends with a heartbeat
        # that counts them all).
        if rec.lagging_since is None:
            rec.behind_since = None
        released = len(step.commands)
        self._release_ended(rec.id, event.held_jobs, step)
        released = len(step.commands) - released
        why = (
            f"its link came back after failed heartbeats; the old stream closed, "
            f"{len(resent) - taken_back} launch(es) sent again, {taken_back} taken back, "
            f"{len(stray)} stray attempt(s) cancelled, "
            f"{released} ended job(s)' files released"
        )
        step.commands.append(LogExecutorHealth(step.cause, HealthChange.STREAM_MOVED, rec.id, why))

    def _runnable(self, attempt: TaskAttemptId) -> bool:
        """Whether every input of ``attempt``'s stage is there now. A launch sent
        again is written anew, with the inputs there are: while one is being
        made again (a reader's fetch failed meanwhile), it would name too few,
        and the attempt would read too little (simulation seed 1004598: a wrong
        answer; as for a copy, ``Placement._copyable``)."""
        job = self._jobs.get(attempt.task.job)
        if job is None:
            return False
        live = job.usable(self._executors.is_live)
        return job.stage_state(attempt.task.stage, live) is StageState.RUNNABLE

    def _take_back(self, rec: ExecutorRecord, attempt: TaskAttemptId, step: Step) -> None:
        """``attempt``, recorded running on ``rec`` but never arrived there, ends
        uncharged: its task goes back to pending (or on with a copy elsewhere),
        or, a copy, is dropped; the slot is free."""
        job = self._jobs.get(attempt.task.job)
        task = job.task(attempt.task) if job is not None else None
        if job is None or task is None:
            return
        why = f"its launch was lost in a cut of executor {rec.id}, and cannot be sent again now"
        if isinstance(task.speculative, Running) and task.speculative.attempt == attempt:
            self._cancel_copy(task, step)
        elif isinstance(task.state, Running) and task.state.attempt == attempt:
            self._requeue(task, rec.id, why, charge=False)
            self._executors.stop(rec.id, attempt)
            step.any_job = True  # no command names the job: the store must still see it

    def _launch_again(self, rec: ExecutorRecord, attempt: TaskAttemptId, step: Step) -> None:
        """Launch ``attempt`` on ``rec`` again, as it is recorded running there."""
        job = self._jobs.get(attempt.task.job)
        task = job.task(attempt.task) if job is not None else None
        if job is None or task is None:
            return
        for run, speculative in ((task.state, False), (task.speculative, True)):
            if isinstance(run, Running) and run.attempt == attempt and run.executor == rec.id:
                stage = job.stages[attempt.task.stage].stage
                spec = job.task_spec(stage, attempt)
                step.commands.append(LaunchTask(step.cause, rec.id, spec, speculative=speculative))
                return
