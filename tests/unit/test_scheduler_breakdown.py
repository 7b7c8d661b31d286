"""Where a job's time went (``scheduler.breakdown``), from attempt records made by hand.

No processes: each attempt's launch, report and executor timings are given, and the
sums per stage and per slot are checked against what they must be, including that
a job's categories add up to its slots times its window.
"""

from __future__ import annotations

import doctest

import pytest

from mangonel.executor import phases as phases_module
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.scheduler import breakdown
from mangonel.scheduler.breakdown import PHASES, job_breakdown, split_attempt, stage_phases
from mangonel.scheduler.telemetry import AttemptKind, AttemptOutcome, AttemptRecord
from mangonel.task import TaskTimings

A, B = ExecutorId("a"), ExecutorId("b")
T0 = 1_000.0
"""The job's creation, Unix time."""


def record(
    stage: int,
    partition: int,
    executor: ExecutorId,
    launched: float,
    started: float,
    ended: float,
    reported: float,
    outcome: AttemptOutcome = AttemptOutcome.SUCCEEDED,
    execute_share: float = 0.8,
    attempt: int = 0,
    fetched: tuple[int, int] = (0, 0),
) -> AttemptRecord:
    """An attempt: launched, started on its slot, ended there, reported (all
    offsets from ``T0``); its slot time is ``execute_share`` execute, the rest
    split evenly between setup and write."""
    run = ended - started
    rest = run * (1 - execute_share) / 2
    timings = TaskTimings(
        received_at=T0 + started,
        started_at=T0 + started,
        ended_at=T0 + ended,
        setup_s=rest,
        execute_s=run * execute_share,
        write_s=rest,
        fetched_local_bytes=fetched[0],
        fetched_remote_bytes=fetched[1],
    )
    return AttemptRecord(
        attempt=TaskAttemptId(TaskId(JobId("j"), StageId(stage), partition), attempt),
        executor=executor,
        kind=AttemptKind.FIRST,
        launched=launched,
        launched_wall=T0 + launched,
        outcome=outcome,
        elapsed_s=run,
        timings=timings,
        reported_wall=T0 + reported,
    )


def test_the_modules_examples_hold() -> None:
    for module in (breakdown, phases_module):
        assert doctest.testmod(module).failed == 0


def test_an_attempts_span_is_launch_its_slots_phases_and_report() -> None:
    r = record(1, 0, A, launched=0.0, started=0.1, ended=1.1, reported=1.15)
    parts = split_attempt(r, T0 + 1.15)
    assert list(parts) == list(PHASES)
    assert parts["launch"] == pytest.approx(0.1)
    assert parts["execute"] == pytest.approx(0.8)
    assert parts["setup"] == parts["write"] == pytest.approx(0.1)
    assert parts["report"] == pytest.approx(0.05)
    assert sum(parts.values()) == pytest.approx(1.15)


def test_without_timings_the_whole_span_is_other() -> None:
    r = record(1, 0, A, 0.0, 0.1, 1.1, 1.15)
    r.timings = None
    parts = split_attempt(r, T0 + 1.15)
    assert parts == dict.fromkeys(PHASES, 0.0) | {"other": pytest.approx(1.15)}


def test_an_executor_clock_ahead_of_the_schedulers_still_adds_up() -> None:
    # The slot "started" before the scheduler launched it and "ended" after its
    # report arrived: no negative launch or report, and the phases fit the span.
    r = record(1, 0, A, launched=0.0, started=-0.2, ended=1.3, reported=1.0)
    parts = split_attempt(r, T0 + 1.0)
    assert parts["launch"] == 0.0 and parts["report"] == 0.0
    assert all(v >= 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(1.0)


def test_stage_phases_sum_the_succeeded_attempts_and_see_the_skew() -> None:
    records = [
        record(1, 0, A, 0.0, 0.01, 1.01, 1.02, fetched=(100, 0)),
        record(1, 1, B, 0.0, 0.02, 3.02, 3.04, fetched=(50, 70)),
        record(1, 2, A, 1.02, 1.03, 2.03, 2.05),
        record(1, 3, B, 0.0, 0.01, 0.5, 0.51, AttemptOutcome.FAILED),  # not counted
        record(2, 0, A, 3.04, 3.05, 3.15, 3.16),
    ]
    by_stage = stage_phases(records)
    assert sorted(by_stage) == [1, 2]
    s1 = by_stage[StageId(1)]
    assert (s1.tasks, s1.executors) == (3, 2)
    assert s1.seconds["execute"] == pytest.approx(0.8 * (1 + 3 + 1))
    assert s1.seconds["launch"] == pytest.approx(0.01 + 0.02 + 0.01)
    assert s1.seconds["report"] == pytest.approx(0.01 + 0.02 + 0.02)
    assert (s1.task_median_s, s1.task_max_s) == (pytest.approx(1.0), pytest.approx(3.0))
    assert s1.skew == pytest.approx(3.0)
    assert (s1.fetched_local_bytes, s1.fetched_remote_bytes) == (150, 70)
    assert by_stage[StageId(2)].tasks == 1


def test_every_slot_second_of_the_window_is_accounted_for() -> None:
    # Planning 0.5 s before T0; the first launches at 0.2. Stage 1: a 1 s task on a,
    # a 3 s task on b (a waits at the barrier for 2 s). 0.1 s of nobody running,
    # then stage 2: one 1 s task on a (b idles at the barrier). The job ends at 4.5.
    records = [
        record(1, 0, A, launched=0.2, started=0.3, ended=1.3, reported=1.4),
        record(1, 1, B, launched=0.2, started=0.3, ended=3.3, reported=3.4),
        record(2, 0, A, launched=3.5, started=3.5, ended=4.4, reported=4.5),
    ]
    b = job_breakdown(records, {A: 1, B: 1}, T0, elapsed_s=4.5, planning_s=0.5)
    assert (b.window_s, b.slots) == (pytest.approx(5.0), 2)
    assert sum(b.seconds.values()) == pytest.approx(b.capacity_s) == pytest.approx(10.0)
    s = b.seconds
    assert s["idle_planning"] == pytest.approx(2 * 0.7)
    assert s["idle_barrier"] == pytest.approx(2.0 + 1.0)  # a in stage 1, b in stage 2
    assert s["idle_scheduler"] == pytest.approx(2 * 0.1)
    assert s["wasted"] == 0.0
    assert s["launch"] == pytest.approx(0.1 + 0.1 + 0.0)
    assert s["execute"] == pytest.approx(0.8 * (1 + 3 + 0.9))
    by_executor = {e.executor: e for e in b.executors}
    assert by_executor[A].busy_s == pytest.approx(1.2 + 1.0)
    assert by_executor[B].idle_s["barrier"] == pytest.approx(1.0)
    assert by_executor[A].attempts == 2 and b.attempts_timed == 3
    assert b.ranked()[0][0] == "execute"


def test_failed_attempts_are_wasted_and_an_idle_executor_counts() -> None:
    # One task on a fails and runs again on a; c ran nothing but was there.
    c = ExecutorId("c")
    records = [
        record(1, 0, A, 0.0, 0.0, 1.0, 1.0, AttemptOutcome.FAILED),
        record(1, 0, A, 1.0, 1.0, 2.0, 2.0, attempt=1),
    ]
    b = job_breakdown(records, {A: 1, c: 1}, T0, elapsed_s=2.0)
    assert b.seconds["wasted"] == pytest.approx(1.0)
    assert b.seconds["idle_barrier"] == pytest.approx(2.0)  # c, the whole time
    assert sum(b.seconds.values()) == pytest.approx(b.capacity_s) == pytest.approx(4.0)


def test_an_executor_with_several_slots_idles_only_its_free_ones() -> None:
    records = [record(1, p, A, 0.0, 0.0, 1.0, 1.0) for p in range(3)]
    b = job_breakdown(records, {A: 4}, T0, elapsed_s=1.0)
    assert b.seconds["idle_barrier"] == pytest.approx(1.0)  # one of four slots free
    assert sum(b.seconds.values()) == pytest.approx(4.0)
