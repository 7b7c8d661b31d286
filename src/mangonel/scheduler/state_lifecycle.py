"""Lifecycle: how a job of the scheduler's state machine starts, ends and is
forgotten, and how a write statement's output is committed.

``Lifecycle._finish`` is the one way a job ends, succeeded, failed or
cancelled: its running attempts are stopped, the outcome is reported
(``JobSucceeded`` / ``JobFailed`` / ``JobCancelled``), its files are released
wherever an attempt of it ran (a succeeded job keeps its result's until it is
read or expires: ``_release_result``), and it moves to the bounded history of
finished jobs (``_forget_settled``: ``ForgetJob`` beyond
``keep_finished_jobs`` of those that ended ``keep_finished_s`` ago). A write
statement's job ends only by its commit's outcome (``_commit``,
``_write_committed``, ``_write_commit_failed``).

A part of ``scheduler.state.SchedulerState`` (its base class), pure like the rest.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.scheduler.events import (
    AbortWrite,
    CommitWrite,
    ForgetJob,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    Limits,
    WriteCommitFailed,
    WriteCommitted,
)
from mangonel.scheduler.state_executors import (
    ExecutorRegistry,
)
from mangonel.scheduler.state_jobs import FinishedJob, JobRecord, invalid_plan_reason
from mangonel.scheduler.state_recovery import Step
from mangonel.scheduler.state_stages import PENDING, Done, Running
from mangonel.scheduler.state_views import (
    JobState,
)
from mangonel.task import (
    PartitionLocation,
    ReleaseOutputs,
)

if TYPE_CHECKING:
    from mangonel.scheduler.state_stages import Running


class Lifecycle:
    """The job lifecycle rules of ``SchedulerState``; see the module docstring."""

    limits: Limits
    _executors: ExecutorRegistry
    _jobs: dict[JobId, JobRecord]
    _finished: OrderedDict[JobId, FinishedJob]
    _keep_finished: int
    _keep_finished_s: float

    if TYPE_CHECKING:

        def _stop(self, running: Running, step: Step) -> None: ...

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
            write=job.plan.write,
        )

    def _late_write(
        self, attempt: TaskAttemptId, executor: ExecutorId, wrote: bool, step: Step
    ) -> None:
        """A report of an attempt that is no longer current: files it wrote that no
        job will read are removed.

        ``wrote``: the report names files it wrote. A writing attempt of a write
        statement reported done after the job ended: it staged its files after
        ``AbortWrite`` or the commit removed the job's staging directory (the job
        stopped it while it ran, or its task was done by another copy, and it
        finished before the stop reached it), so they are removed now, by
        ``AbortWrite`` (which keeps what a commit made visible). And an attempt of a
        job that ended may have written its files where no release reaches them:
        the job's ``ReleaseOutputs`` lost in a cut, and the moved stream after it
        naming the jobs the executor had files of before the attempt wrote (the
        whole-cluster simulation, seed 904345: they stayed while the executor
        lived). They go now: the job's, when nothing of it is kept; that stage's,
        when only the result is kept (a stray attempt of the final stage goes with
        the result, its executor among ``ran_on``). A stale report of a job still
        running changes nothing: its files go with the job's.
        """
        job = attempt.task.job
        done = self._finished.get(job)
        target = done.write if done is not None else None
        if target is not None and attempt.task.stage == target.stage:
            step.commands.append(AbortWrite(step.cause, job, target))
        if not wrote or job in self._jobs or not self._executors.is_live(executor):
            return
        if done is None or not done.unread:
            step.commands.append(ReleaseOutputs(step.cause, executor, job, None))
        elif attempt.task.stage in done.intermediate:
            step.commands.append(ReleaseOutputs(step.cause, executor, job, (attempt.task.stage,)))

    def _release_result(self, job_id: JobId, step: Step) -> None:
        """The result was read (or expired): delete what is left of the job."""
        done = self._finished.get(job_id)
        if done is None or not done.unread:
            return
        done.result_read = True
        step.finished.append(job_id)  # stored again, whatever commands follow
        holders = {loc.executor for loc in done.result} | set(done.ran_on)
        for executor in sorted(holders):
            # A lost executor's files went with it.
            if self._executors.is_live(executor):
                # All stages: the intermediate ones went at success, so this is the
                # result plus whatever superseded attempts of the final stage wrote.
                step.commands.append(ReleaseOutputs(step.cause, executor, job_id, None))

    def _forget_settled(self, step: Step) -> None:
        """Keep at most ``keep_finished_jobs`` settled finished jobs of those that
        ended ``keep_finished_s`` ago or more; an unread result keeps its job
        until it is read or expires.

        Never one that ended just now: its end and its forgetting were one write,
        and a scheduler that died before its commands went out came back without
        the job, whose client then asked about a job it did not know.
        """
        if len(self._finished) <= self._keep_finished:
            return
        settled = [j for j, f in self._finished.items() if self._forgettable(f, step.now)]
        for job_id in settled[: max(0, len(settled) - self._keep_finished)]:
            del self._finished[job_id]
            step.commands.append(ForgetJob(step.cause, job_id))

    def _forgettable(self, done: FinishedJob, now: float | None) -> bool:
        """Settled (no unread result), and ended ``keep_finished_s`` before ``now``."""
        ended = done.view.finished
        return (
            not done.unread
            and now is not None
            and ended is not None
            and now - ended >= self._keep_finished_s
        )

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
