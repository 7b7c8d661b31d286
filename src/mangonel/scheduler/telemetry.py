"""What the shell saw happen, kept for people: task attempts, counters, bytes held.

The state machine keeps only what it needs to decide (current attempts, current
outputs); the web UI and the metrics want the story: every attempt of a task,
where it ran, how long it took and why it failed, and running totals that only
go up (Prometheus counters). ``Telemetry`` is told by ``SchedulerCore`` about
each command it sends and each report it accepts, and keeps:

* a bounded attempt history per job (the last ``keep_jobs`` jobs, at most
  ``keep_attempts`` attempts each): executor, launch time, duration, outcome,
  failure reason, rows and bytes written, and whether the attempt was a first
  run, a re-run after an attempt that made no output, or a recompute of an
  output that was lost; and where its time went, as its report said
  (``TaskTimings``), with when the report arrived (``scheduler.breakdown``
  sums them up per stage and per job);
* counters: attempts launched, ended by outcome, retries, recomputes,
  speculative copies launched, won (their output was kept) and lost (the
  attempt they copied finished first), shuffle bytes written and read,
  executors lost by reason, job durations (histogram), jobs whose plan fell
  back to running the whole query in one task (``DistributedPlan.fallback``);
* shuffle bytes each executor holds on disk: outputs it wrote, until they are
  released or the executor is lost.

It owns a lock of its own: the core calls it with its own lock held, readers
(the web server's threads) call it without.
"""

from __future__ import annotations

import bisect
import enum
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace

from mangonel import defaults
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.scheduler.events import Command, LossReason
from mangonel.task import (
    CancelTask,
    ExecutionError,
    FetchFailed,
    FragmentRejected,
    LaunchTask,
    PartitionOutput,
    QueryError,
    ReleaseOutputs,
    TaskFailure,
    TaskSpec,
    TaskTimings,
)

JOB_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Upper bounds of the job-duration histogram (seconds): from a trivial query
(about 0.1 s) to the TPC-H SF 1 queries of a slow cluster (minutes)."""


class AttemptOutcome(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """The executor reported a failure (query error, execution error, fetch failure)."""
    LOST = "lost"
    """Its executor was lost while it ran."""
    CANCELLED = "cancelled"
    """The scheduler cancelled it (its job ended, or another attempt superseded it)."""


class AttemptKind(enum.Enum):
    FIRST = "first"
    RERUN = "re-run"
    """A previous attempt of the task made no output (failed, lost, cancelled)."""
    RECOMPUTE = "recompute"
    """A previous attempt succeeded but its output was lost and is made again."""
    SPECULATIVE = "speculative"
    """A copy of a straggling attempt that still runs elsewhere; the first of the
    two to finish wins."""


@dataclass
class AttemptRecord:
    """One task attempt as the shell saw it (times: ``launched_wall`` is Unix time)."""

    attempt: TaskAttemptId
    executor: ExecutorId
    kind: AttemptKind
    launched: float
    """The shell's monotonic clock at launch."""
    launched_wall: float
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    elapsed_s: float | None = None
    """Run time reported by the executor; the scheduler's launch-to-end time otherwise."""
    reason: str = ""
    """Why it failed, was lost or cancelled; empty while running or after success."""
    rows: int = 0
    bytes: int = 0
    input_bytes: int = 0
    """Bytes of the shuffle files it was given to read."""
    output_lost: bool = False
    """It succeeded, but its output was lost later and another attempt made it again."""
    timings: TaskTimings | None = None
    """Where its time went on the executor, as its report said (``None``: no report,
    or one without them)."""
    reported_wall: float | None = None
    """Unix time its report (success or failure) reached the scheduler."""


@dataclass
class _JobAttempts:
    attempts: list[AttemptRecord] = field(default_factory=list)
    index: dict[TaskAttemptId, AttemptRecord] = field(default_factory=dict)
    succeeded: dict[TaskId, AttemptRecord] = field(default_factory=dict)
    dropped: int = 0


@dataclass(frozen=True)
class Counters:
    """Totals since the scheduler started; they only go up."""

    attempts_launched: int
    attempts_ended: dict[str, int]
    """Outcome value -> attempts that ended so."""
    task_retries: int
    outputs_recomputed: int
    speculative_launched: int
    speculative_won: int
    """Copies that finished before the attempt they copied: their output was kept."""
    speculative_lost: int
    """Copies cancelled because the attempt they copied finished first."""
    shuffle_bytes_written: int
    shuffle_bytes_fetched: int
    executors_lost: dict[str, int]
    """``LossReason`` value -> executors lost for it."""
    false_losses: int
    """Executors declared lost that came back alive (``HealthChange.CAME_BACK``)."""
    job_seconds_buckets: dict[str, tuple[int, ...]]
    """Job outcome -> cumulative counts per ``JOB_SECONDS_BUCKETS`` bound, then +Inf."""
    job_seconds_sum: dict[str, float]
    plan_fallbacks: int = 0
    """Jobs submitted whose plan runs the whole query in one task (the planner's
    fallback: ``DistributedPlan.fallback``)."""


def describe_failure(failure: TaskFailure) -> str:
    """A one-line reason for a failed attempt, naming what failed."""
    if isinstance(failure, FetchFailed):
        return (
            f"fetch failed ({failure.problem.value}): output of stage {failure.stage} "
            f"map task {failure.map_partition} on {failure.executor}: {failure.message}"
        )
    if isinstance(failure, QueryError):
        return f"query error: {failure.message}"
    if isinstance(failure, FragmentRejected):
        return f"internal error, DuckDB refused the stage's SQL: {failure.message}"
    if isinstance(failure, ExecutionError):
        return f"execution error: {failure.message}"
    return str(failure)


class Telemetry:
    """Attempt history, counters and bytes held; see the module docstring.

    Args:
        keep_jobs: Jobs whose attempt history is kept (the oldest go first).
        keep_attempts: Attempts kept per job; later ones are counted, not kept.
    """

    def __init__(self, keep_jobs: int = defaults.KEEP_JOBS, keep_attempts: int = 5000) -> None:
        self.keep_jobs = keep_jobs
        self.keep_attempts = keep_attempts
        self._lock = threading.Lock()
        self._jobs: OrderedDict[JobId, _JobAttempts] = OrderedDict()
        self._launched = 0
        self._ended: Counter[str] = Counter()
        self._retries = 0
        self._recomputed = 0
        self._speculated = 0
        self._speculation_won = 0
        self._speculation_lost = 0
        self._written = 0
        self._fetched = 0
        self._lost: Counter[str] = Counter({r.value: 0 for r in LossReason})
        self._false_losses = 0
        self._job_buckets: dict[str, list[int]] = {}
        self._job_sum: dict[str, float] = {}
        self._jobs_finished: set[JobId] = set()
        self._fallbacks = 0
        self._held: dict[tuple[ExecutorId, JobId, StageId], int] = {}

    # ------------------------------------------------------------ observations

    def command_sent(self, command: Command, now: float) -> None:
        """A command went onto an executor's queue."""
        if isinstance(command, LaunchTask):
            self.task_launched(command.executor, command.task, now, command.speculative)
        elif isinstance(command, CancelTask):
            self.task_cancelled(command.attempt, now)
        elif isinstance(command, ReleaseOutputs):
            self.outputs_released(command.executor, command.job, command.stages)

    def _job(self, job: JobId) -> _JobAttempts:
        entry = self._jobs.get(job)
        if entry is None:
            entry = self._jobs[job] = _JobAttempts()
            while len(self._jobs) > self.keep_jobs:
                old, _ = self._jobs.popitem(last=False)
                self._jobs_finished.discard(old)
        return entry

    def task_launched(
        self, executor: ExecutorId, spec: TaskSpec, now: float, speculative: bool = False
    ) -> None:
        attempt = spec.attempt
        with self._lock:
            job = self._job(attempt.task.job)
            earlier = None if speculative else job.succeeded.pop(attempt.task, None)
            if speculative:
                kind = AttemptKind.SPECULATIVE
                self._speculated += 1
            elif earlier is not None:
                kind = AttemptKind.RECOMPUTE
                earlier.output_lost = True
                self._recomputed += 1
            elif attempt.attempt > 0:
                kind = AttemptKind.RERUN
                self._retries += 1
            else:
                kind = AttemptKind.FIRST
            self._launched += 1
            record = AttemptRecord(
                attempt=attempt,
                executor=executor,
                kind=kind,
                launched=now,
                launched_wall=time.time(),
                input_bytes=sum(loc.bytes for inp in spec.inputs for loc in inp.locations),
            )
            job.index[attempt] = record
            if len(job.attempts) < self.keep_attempts:
                job.attempts.append(record)
            else:
                job.dropped += 1

    def _end(
        self,
        attempt: TaskAttemptId,
        outcome: AttemptOutcome,
        now: float,
        elapsed_s: float | None,
        reason: str = "",
    ) -> AttemptRecord | None:
        job = self._jobs.get(attempt.task.job)
        record = job.index.get(attempt) if job is not None else None
        if record is None or record.outcome is not AttemptOutcome.RUNNING:
            return None
        record.outcome = outcome
        record.elapsed_s = elapsed_s if elapsed_s else max(0.0, now - record.launched)
        record.reason = reason
        self._ended[outcome.value] += 1
        return record

    def task_completed(
        self,
        attempt: TaskAttemptId,
        executor: ExecutorId,
        outputs: tuple[PartitionOutput, ...],
        elapsed_s: float | None,
        now: float,
        timings: TaskTimings | None = None,
    ) -> None:
        written = sum(o.bytes for o in outputs)
        reported = time.time()
        with self._lock:
            self._written += written
            key = (executor, attempt.task.job, attempt.task.stage)
            self._held[key] = self._held.get(key, 0) + written
            record = self._end(attempt, AttemptOutcome.SUCCEEDED, now, elapsed_s)
            if record is not None:
                record.timings, record.reported_wall = timings, reported
                if record.kind is AttemptKind.SPECULATIVE:
                    self._speculation_won += 1
                record.rows = sum(o.rows for o in outputs)
                record.bytes = written
                self._fetched += record.input_bytes
                self._jobs[attempt.task.job].succeeded[attempt.task] = record

    def task_failed(
        self,
        attempt: TaskAttemptId,
        executor: ExecutorId,
        failure: TaskFailure,
        elapsed_s: float | None,
        now: float,
        timings: TaskTimings | None = None,
    ) -> None:
        reported = time.time()
        with self._lock:
            why = describe_failure(failure)
            record = self._end(attempt, AttemptOutcome.FAILED, now, elapsed_s, why)
            if record is not None:
                record.timings, record.reported_wall = timings, reported

    def task_cancelled(self, attempt: TaskAttemptId, now: float) -> None:
        with self._lock:
            job = self._jobs.get(attempt.task.job)
            winner = job.succeeded.get(attempt.task) if job is not None else None
            # The scheduler cancels the other of two racing attempts as soon as
            # one of them completed (speculative execution).
            beaten = winner is not None and winner.attempt != attempt
            reason = "cancelled by the scheduler"
            if winner is not None and beaten:
                reason = f"attempt {winner.attempt.attempt} of the task finished first"
            record = self._end(attempt, AttemptOutcome.CANCELLED, now, None, reason)
            if record is not None and beaten and record.kind is AttemptKind.SPECULATIVE:
                self._speculation_lost += 1

    def outputs_released(
        self, executor: ExecutorId, job: JobId, stages: tuple[StageId, ...] | None
    ) -> None:
        with self._lock:
            for key in [k for k in self._held if k[0] == executor and k[1] == job]:
                if stages is None or key[2] in stages:
                    del self._held[key]

    def false_loss(self) -> None:
        """An executor declared lost came back alive."""
        with self._lock:
            self._false_losses += 1

    def executor_lost(
        self, executor: ExecutorId, reason: LossReason, detail: str, now: float
    ) -> None:
        with self._lock:
            self._lost[reason.value] += 1
            for key in [k for k in self._held if k[0] == executor]:
                del self._held[key]
            why = f"executor {executor} lost ({reason.value}{': ' + detail if detail else ''})"
            for job in self._jobs.values():
                for record in job.attempts:
                    if record.executor == executor and record.outcome is AttemptOutcome.RUNNING:
                        self._end(record.attempt, AttemptOutcome.LOST, now, None, why)

    def job_submitted(self, fallback: str | None) -> None:
        """A job was submitted; ``fallback``: why its plan runs whole in one task, if it does."""
        with self._lock:
            if fallback is not None:
                self._fallbacks += 1

    def job_finished(self, job: JobId, outcome: str, seconds: float, now: float) -> None:
        """A job ended (``outcome``: succeeded, failed, cancelled); counted once per job."""
        with self._lock:
            if job in self._jobs_finished:
                return
            entry = self._job(job)
            self._jobs_finished.add(job)
            buckets = self._job_buckets.setdefault(outcome, [0] * (len(JOB_SECONDS_BUCKETS) + 1))
            buckets[bisect.bisect_left(JOB_SECONDS_BUCKETS, seconds)] += 1
            self._job_sum[outcome] = self._job_sum.get(outcome, 0.0) + seconds
            for record in entry.attempts:
                if record.outcome is AttemptOutcome.RUNNING:
                    self._end(
                        record.attempt, AttemptOutcome.CANCELLED, now, None, f"the job {outcome}"
                    )

    # ----------------------------------------------------------------- readers

    def attempts(self, job: JobId) -> tuple[list[AttemptRecord], int]:
        """Copies of the job's kept attempts, in launch order, and how many were not kept."""
        with self._lock:
            entry = self._jobs.get(job)
            if entry is None:
                return [], 0
            return [replace(r) for r in entry.attempts], entry.dropped

    def held_bytes(self) -> dict[ExecutorId, int]:
        """Shuffle bytes each executor holds on disk (written, not yet released)."""
        with self._lock:
            held: Counter[ExecutorId] = Counter()
            for (executor, _, _), size in self._held.items():
                held[executor] += size
            return dict(held)

    def counters(self) -> Counters:
        with self._lock:
            cumulative: dict[str, tuple[int, ...]] = {}
            for outcome, counts in self._job_buckets.items():
                running, total = [], 0
                for c in counts:
                    total += c
                    running.append(total)
                cumulative[outcome] = tuple(running)
            return Counters(
                attempts_launched=self._launched,
                attempts_ended=dict(self._ended),
                task_retries=self._retries,
                outputs_recomputed=self._recomputed,
                speculative_launched=self._speculated,
                speculative_won=self._speculation_won,
                speculative_lost=self._speculation_lost,
                shuffle_bytes_written=self._written,
                shuffle_bytes_fetched=self._fetched,
                executors_lost=dict(self._lost),
                false_losses=self._false_losses,
                job_seconds_buckets=cumulative,
                job_seconds_sum=dict(self._job_sum),
                plan_fallbacks=self._fallbacks,
            )
