"""The shell's attempt history and counters (``scheduler.telemetry``), driven directly.

No processes: these check the bookkeeping the API and /metrics are built on —
which attempt is a first run, a re-run or a recompute, what a lost executor's
running attempts become, what an executor holds, the duration histogram.
"""

from __future__ import annotations

import time

from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.scheduler.events import LossReason
from mangonel.scheduler.telemetry import (
    JOB_SECONDS_BUCKETS,
    AttemptKind,
    AttemptOutcome,
    Telemetry,
)
from mangonel.task import (
    CancelTask,
    ExecutionError,
    FetchFailed,
    InputLocations,
    InputMode,
    LaunchTask,
    OutputKind,
    OutputSpec,
    PartitionLocation,
    PartitionOutput,
    ReleaseOutputs,
    TaskSpec,
    TaskTimings,
)

JOB = JobId("j1")
A, B = ExecutorId("exec-a"), ExecutorId("exec-b")


def attempt(stage: int, partition: int, n: int) -> TaskAttemptId:
    return TaskAttemptId(TaskId(JOB, StageId(stage), partition), n)


def spec(att: TaskAttemptId, input_bytes: int = 0) -> TaskSpec:
    inputs = ()
    if input_bytes:
        loc = PartitionLocation(A, "h", "h:1", StageId(1), 0, 0, "/f", 1, input_bytes, "c")
        inputs = (InputLocations("in", StageId(1), InputMode.PARTITION, (loc,), ("x",)),)
    return TaskSpec(att, "SELECT 1", OutputSpec(OutputKind.SINGLE), ("x",), inputs=inputs)


def output(rows: int, size: int) -> tuple[PartitionOutput, ...]:
    return (PartitionOutput(0, "/f", rows, size, "c"),)


def test_first_rerun_and_recompute_are_told_apart() -> None:
    t = Telemetry()
    t.command_sent(LaunchTask(1, A, spec(attempt(1, 0, 0))), now=0.0)
    t.task_completed(attempt(1, 0, 0), A, output(10, 100), elapsed_s=0.5, now=1.0)
    t.command_sent(LaunchTask(2, A, spec(attempt(2, 0, 0), input_bytes=100)), now=1.0)
    failure = ExecutionError("disk full")
    t.task_failed(attempt(2, 0, 0), A, failure, elapsed_s=None, now=1.25)
    t.command_sent(LaunchTask(3, B, spec(attempt(2, 0, 1), input_bytes=100)), now=2.0)
    # The output of stage 1 was lost: its task runs again.
    t.command_sent(LaunchTask(4, B, spec(attempt(1, 0, 1))), now=2.0)

    records, dropped = t.attempts(JOB)
    assert dropped == 0
    kinds = [(str(r.attempt), r.kind, r.outcome) for r in records]
    assert kinds == [
        ("j1/s1/p0/a0", AttemptKind.FIRST, AttemptOutcome.SUCCEEDED),
        ("j1/s2/p0/a0", AttemptKind.FIRST, AttemptOutcome.FAILED),
        ("j1/s2/p0/a1", AttemptKind.RERUN, AttemptOutcome.RUNNING),
        ("j1/s1/p0/a1", AttemptKind.RECOMPUTE, AttemptOutcome.RUNNING),
    ]
    assert records[0].output_lost and (records[0].rows, records[0].bytes) == (10, 100)
    assert records[0].elapsed_s == 0.5  # the executor's own time
    assert records[1].elapsed_s == 0.25  # the scheduler's, when none was reported
    assert records[1].reason == "execution error: disk full"
    counters = t.counters()
    assert (counters.attempts_launched, counters.task_retries, counters.outputs_recomputed) == (
        4,
        1,
        1,
    )
    # Only completed attempts count their inputs as fetched.
    assert counters.shuffle_bytes_fetched == 0
    assert counters.shuffle_bytes_written == 100


def test_lost_executor_ends_its_running_attempts_and_drops_its_bytes() -> None:
    t = Telemetry()
    t.command_sent(LaunchTask(1, A, spec(attempt(1, 0, 0))), now=0.0)
    t.command_sent(LaunchTask(1, A, spec(attempt(1, 1, 0))), now=0.0)
    t.command_sent(LaunchTask(1, B, spec(attempt(1, 2, 0))), now=0.0)
    t.task_completed(attempt(1, 0, 0), A, output(1, 700), elapsed_s=0.1, now=0.5)
    t.task_completed(attempt(1, 2, 0), B, output(1, 300), elapsed_s=0.1, now=0.5)
    assert t.held_bytes() == {A: 700, B: 300}

    t.executor_lost(A, LossReason.HEARTBEAT_TIMEOUT, "no heartbeat for 10 s", now=2.0)
    records = {str(r.attempt): r for r in t.attempts(JOB)[0]}
    lost = records["j1/s1/p1/a0"]
    assert lost.outcome is AttemptOutcome.LOST and lost.elapsed_s == 2.0
    assert lost.reason == "executor exec-a lost (heartbeat timeout: no heartbeat for 10 s)"
    assert records["j1/s1/p0/a0"].outcome is AttemptOutcome.SUCCEEDED  # it had ended
    assert t.held_bytes() == {B: 300}
    assert t.counters().executors_lost["heartbeat timeout"] == 1

    t.command_sent(ReleaseOutputs(5, B, JOB, (StageId(2),)), now=3.0)
    assert t.held_bytes() == {B: 300}  # another stage's files
    t.command_sent(ReleaseOutputs(6, B, JOB, None), now=3.0)
    assert t.held_bytes() == {}


def test_fetch_failure_names_what_was_lost_and_cancel_ends_an_attempt() -> None:
    t = Telemetry()
    t.command_sent(LaunchTask(1, B, spec(attempt(2, 0, 0))), now=0.0)
    t.command_sent(LaunchTask(1, B, spec(attempt(2, 1, 0))), now=0.0)
    t.task_failed(attempt(2, 0, 0), B, FetchFailed(A, StageId(1), 3, "refused"), None, now=1.0)
    t.command_sent(CancelTask(2, B, attempt(2, 1, 0)), now=1.0)
    first, second = t.attempts(JOB)[0]
    assert first.reason.startswith("fetch failed (unreachable): output of stage 1 map task 3")
    assert "exec-a" in first.reason
    assert second.outcome is AttemptOutcome.CANCELLED
    # A late report of a cancelled attempt changes nothing.
    t.task_completed(attempt(2, 1, 0), B, output(5, 50), elapsed_s=0.1, now=2.0)
    assert t.attempts(JOB)[0][1].outcome is AttemptOutcome.CANCELLED
    assert t.counters().attempts_ended == {"failed": 1, "cancelled": 1}


def test_job_durations_histogram_counts_each_job_once() -> None:
    t = Telemetry()
    t.command_sent(LaunchTask(1, A, spec(attempt(1, 0, 0))), now=0.0)
    t.job_finished(JOB, "failed", 0.3, now=0.3)
    t.job_finished(JOB, "failed", 0.3, now=0.4)  # finished twice: counted once
    t.job_finished(JobId("j2"), "succeeded", 7.0, now=8.0)
    counters = t.counters()
    failed = counters.job_seconds_buckets["failed"]
    assert len(failed) == len(JOB_SECONDS_BUCKETS) + 1
    assert failed[JOB_SECONDS_BUCKETS.index(0.25)] == 0
    assert failed[JOB_SECONDS_BUCKETS.index(0.5)] == 1 == failed[-1]
    assert counters.job_seconds_buckets["succeeded"][JOB_SECONDS_BUCKETS.index(10.0)] == 1
    assert counters.job_seconds_sum == {"failed": 0.3, "succeeded": 7.0}
    # The job ended with an attempt still running: it is counted as cancelled.
    assert t.attempts(JOB)[0][0].outcome is AttemptOutcome.CANCELLED


def test_history_is_bounded() -> None:
    t = Telemetry(keep_jobs=2, keep_attempts=3)
    for n in range(5):
        t.command_sent(LaunchTask(1, A, spec(attempt(1, n, 0))), now=0.0)
    records, dropped = t.attempts(JOB)
    assert (len(records), dropped) == (3, 2)
    for job in ("j2", "j3"):
        att = TaskAttemptId(TaskId(JobId(job), StageId(1), 0), 0)
        t.command_sent(LaunchTask(1, A, spec(att)), now=0.0)
    assert t.attempts(JOB) == ([], 0)  # the oldest job's history went first
    assert t.counters().attempts_launched == 7


def test_speculative_copies_are_counted_launched_won_and_lost() -> None:
    t = Telemetry()
    # p0: the copy on B finishes first; the original on A is cancelled.
    t.command_sent(LaunchTask(1, A, spec(attempt(1, 0, 0))), now=0.0)
    t.command_sent(LaunchTask(2, B, spec(attempt(1, 0, 1)), speculative=True), now=1.0)
    t.task_completed(attempt(1, 0, 1), B, output(10, 100), elapsed_s=0.5, now=1.5)
    t.command_sent(CancelTask(3, A, attempt(1, 0, 0)), now=1.5)
    # p1: the original finishes first; the copy is cancelled.
    t.command_sent(LaunchTask(4, A, spec(attempt(1, 1, 0))), now=0.0)
    t.command_sent(LaunchTask(5, B, spec(attempt(1, 1, 1)), speculative=True), now=1.0)
    t.task_completed(attempt(1, 1, 0), A, output(10, 100), elapsed_s=1.2, now=1.2)
    t.command_sent(CancelTask(6, B, attempt(1, 1, 1)), now=1.2)
    counters = t.counters()
    launched = counters.speculative_launched
    assert (launched, counters.speculative_won, counters.speculative_lost) == (2, 1, 1)
    assert counters.task_retries == 0  # a copy is not a re-run
    records = {(r.attempt.task.partition, r.attempt.attempt): r for r in t.attempts(JOB)[0]}
    assert records[(0, 1)].kind is AttemptKind.SPECULATIVE
    assert records[(0, 0)].reason == "attempt 1 of the task finished first"
    assert records[(1, 1)].outcome is AttemptOutcome.CANCELLED
    assert records[(1, 1)].reason == "attempt 0 of the task finished first"


def test_an_attempt_keeps_the_timings_its_report_carried() -> None:
    t = Telemetry()
    timings = TaskTimings(1.0, 1.5, 2.0, setup_s=0.1, execute_s=0.3)
    t.command_sent(LaunchTask(1, A, spec(attempt(1, 0, 0))), now=0.0)
    t.command_sent(LaunchTask(2, B, spec(attempt(1, 1, 0))), now=0.0)
    before = time.time()
    t.task_completed(attempt(1, 0, 0), A, output(1, 1), 0.5, now=1.0, timings=timings)
    t.task_failed(attempt(1, 1, 0), B, ExecutionError("x"), 0.2, now=1.0, timings=timings)
    records, _ = t.attempts(JOB)
    for r in records:
        assert r.timings == timings
        assert r.reported_wall is not None and before <= r.reported_wall <= time.time()
