"""Gray failures in the pure state machine: stragglers (speculative copies) and
executors excluded for failing tasks.

Same style as ``test_state_machine.py`` (whose ``Harness`` and plans it reuses):
hand-built events at hand-set times in, exact commands out.

The usual start (``straggling``): e1 and e2 with 4 slots each; stage 1's four
tasks run p0, p2 on e1 and p1, p3 on e2 from t=0; p0, p1, p2 finish at t=1 (a
median of 1 s), so p3 is a straggler once it has run more than 1.5 s, and its
copy goes to e1 (the least loaded executor but its own).
"""

from __future__ import annotations

import math

from test_state_machine import (
    E1,
    E2,
    E3,
    J1,
    S1,
    Harness,
    att,
    launches,
    three_stage_plan,
)
from test_state_restart import restarted

from mangonel.scheduler.events import (
    CancelRequested,
    Command,
    JobCancelled,
    JobFailed,
    JobSucceeded,
    Limits,
    SchedulerRecovered,
)
from mangonel.scheduler.state import StageView
from mangonel.task import (
    CancelTask,
    ExecutionError,
    FetchFailed,
    FetchProblem,
    LaunchTask,
    QueryError,
    ReleaseOutputs,
)

# No heartbeats are sent here: silence plays no part, neither the timeout nor
# the failure detector's suspicion.
SPEC = Limits(
    speculation_min_s=1.0, exclusion_failures=0, heartbeat_timeout_s=1000.0, suspect_phi=math.inf
)


def straggling(limits: Limits = SPEC) -> Harness:
    h = Harness(limits)
    h.register(E1, 4)
    h.register(E2, 4)
    h.submit(three_stage_plan(maps=4, reducers=2))
    h.now = 1.0
    for p, executor in ((0, E1), (1, E2), (2, E1)):
        h.complete(att(1, p), executor)
    return h


def copies(commands: list[Command]) -> list[tuple[str, str]]:
    return [
        (c.executor, str(c.task.attempt))
        for c in commands
        if isinstance(c, LaunchTask) and c.speculative
    ]


def stage_view(h: Harness, index: int = 0) -> StageView:
    view = h.state.job(J1)
    assert view is not None
    return view.stages[index]


def reducer_inputs(commands: list[Command]) -> set[str]:
    return {
        loc.path
        for c in commands
        if isinstance(c, LaunchTask) and c.task.attempt.task.stage == 2
        for inp in c.task.inputs
        for loc in inp.locations
    }


# ------------------------------------------------------------------ when to copy


def test_a_straggler_gets_one_copy_on_another_executor_once_past_the_threshold() -> None:
    h = straggling()
    assert h.tick(1.4) == []  # 1.4 s < 1.5 x the 1 s median
    cmds = h.tick(1.6)
    # e1 is the least loaded; never e2, where the attempt it copies runs.
    assert copies(cmds) == [("e1", "j1/s1/p3/a1")]
    assert launches(cmds) == copies(cmds)
    assert h.tick(5.0) == []  # one copy at most
    view = stage_view(h)
    assert view.speculated == 1 and view.speculative_running == 1
    assert view.running == 1  # a task, not two


def test_no_copy_before_the_quantile_of_tasks_is_done() -> None:
    h = Harness(SPEC)
    h.register(E1, 4)
    h.register(E2, 4)
    h.submit(three_stage_plan(maps=4, reducers=2))
    h.now = 1.0
    h.complete(att(1, 0), E1)
    h.complete(att(1, 1), E2)  # 2 of 4 done: under 0.75
    assert h.tick(100.0) == []


def test_no_copy_of_an_attempt_younger_than_the_minimum() -> None:
    h = straggling(Limits(speculation_min_s=5.0, heartbeat_timeout_s=1000.0, suspect_phi=math.inf))
    assert h.tick(4.9) == []
    assert copies(h.tick(5.1)) == [("e1", "j1/s1/p3/a1")]


def test_no_copy_when_speculation_is_off_or_no_other_executor_is_free() -> None:
    h = straggling(Limits(speculation=False, heartbeat_timeout_s=1000.0, suspect_phi=math.inf))
    assert h.tick(100.0) == []
    lone = Harness(SPEC)
    lone.register(E1, 4)
    lone.submit(three_stage_plan(maps=4, reducers=2))
    lone.now = 1.0
    for p in range(3):
        lone.complete(att(1, p), E1)
    assert lone.tick(100.0) == []  # only the straggler's own executor exists


def test_pending_tasks_come_before_copies() -> None:
    # One slot each: stage 1's tasks wait for slots; no copy takes one from them.
    h = Harness(SPEC)
    h.register(E1, 1)
    h.register(E2, 1)
    h.submit(three_stage_plan(maps=5, reducers=2))
    h.now = 1.0
    h.complete(att(1, 0), E1)  # p2 starts on e1
    h.complete(att(1, 1), E2)  # p3 starts on e2
    h.now = 2.0
    h.complete(att(1, 2), E1)  # p4 starts on e1
    assert launches(h.complete(att(1, 3), E2)) == []  # nothing pending left
    # 4 of 5 done, median 1 s; p4 has run 0.5 s, nothing to copy; later it has.
    assert h.tick(2.5) == []
    assert copies(h.tick(3.6)) == [("e2", "j1/s1/p4/a1")]


# ------------------------------------------------------------------ who wins


def test_the_copy_wins_the_original_is_cancelled_and_its_late_output_ignored() -> None:
    h = straggling()
    h.tick(2.0)
    h.now = 2.5
    cmds = h.complete(att(1, 3, 1), E1)
    assert cmds[0] == CancelTask(h.last_id, E2, att(1, 3, 0))
    # The reducers read the copy's file of map 3, and only it.
    paths = reducer_inputs(cmds)
    assert h.loc(att(1, 3, 1), E1, 0).path in paths
    assert not any("s1/p3/a0" in p for p in paths)
    assert h.complete(att(1, 3, 0), E2) == []  # the loser's late report changes nothing
    view = stage_view(h)
    assert (view.speculation_won, view.speculation_lost) == (1, 0)
    assert view.done == 4


def test_the_original_wins_and_the_copy_is_cancelled() -> None:
    h = straggling()
    h.tick(2.0)
    h.now = 2.2
    cmds = h.complete(att(1, 3, 0), E2)
    assert cmds[0] == CancelTask(h.last_id, E1, att(1, 3, 1))
    assert h.loc(att(1, 3, 0), E2, 0).path in reducer_inputs(cmds)
    assert h.complete(att(1, 3, 1), E1) == []
    view = stage_view(h)
    assert (view.speculation_won, view.speculation_lost) == (0, 1)


def test_a_whole_job_with_a_copy_that_won_ends_with_one_result() -> None:
    h = straggling()
    h.tick(2.0)
    h.now = 2.5
    h.complete(att(1, 3, 1), E1)
    h.complete(att(2, 0), E1)
    h.complete(att(2, 1), E2)
    cmds = h.complete(att(3, 0), E1)
    done = [c for c in cmds if isinstance(c, JobSucceeded)]
    assert len(done) == 1 and len(done[0].result) == 1
    # Files go wherever the job ran, the loser's executor included.
    assert {c.executor for c in cmds if isinstance(c, ReleaseOutputs)} == {E1, E2}


def test_a_failed_copy_is_dropped_uncharged_and_the_original_goes_on() -> None:
    h = straggling()
    h.tick(2.0)
    assert h.fail(att(1, 3, 1), E1, ExecutionError("disk full")) == []
    assert stage_view(h).speculative_running == 0
    assert stage_view(h).tasks_rerun == 0
    assert copies(h.tick(3.0)) == [("e1", "j1/s1/p3/a2")]  # may be copied again


def test_a_failed_original_leaves_the_copy_running_in_its_place() -> None:
    h = straggling()
    h.tick(2.0)
    assert launches(h.fail(att(1, 3, 0), E2, ExecutionError("oom"))) == []  # no re-run
    assert launches(h.complete(att(1, 3, 1), E1))[0][1] == "j1/s2/p0/a0"


def test_a_query_error_of_the_copy_fails_the_job_and_stops_the_original() -> None:
    h = straggling()
    h.tick(2.0)
    cmds = h.fail(att(1, 3, 1), E1, QueryError("bad cast"))
    assert CancelTask(h.last_id, E2, att(1, 3, 0)) in cmds
    assert any(isinstance(c, JobFailed) for c in cmds)


def test_a_fetch_failure_of_the_copy_still_recomputes_the_lost_output() -> None:
    h = Harness(SPEC)
    h.register(E1, 4)
    h.register(E2, 4)
    h.register(E3, 4)
    h.submit(three_stage_plan(maps=3, reducers=4))
    h.now = 1.0
    for p, executor in ((0, E1), (1, E2), (2, E3)):
        h.complete(att(1, p), executor)
    h.now = 2.0
    for p, executor in ((0, E1), (1, E2), (2, E3)):
        h.complete(att(2, p), executor)  # stage 2's p3 runs on e1, from t=1
    assert copies(h.tick(3.6)) == [("e2", "j1/s2/p3/a1")]
    lost = FetchFailed(E3, S1, 2, "bad checksum", FetchProblem.OUTPUT_LOST)
    cmds = h.fail(att(2, 3, 1), E2, lost)
    assert launches(cmds) == [("e2", "j1/s1/p2/a1")]  # map 2 made again
    assert stage_view(h, 1).speculative_running == 0


def test_cancel_stops_the_copy_too() -> None:
    h = straggling()
    h.tick(2.0)
    cmds = h.send(CancelRequested, J1)
    assert CancelTask(h.last_id, E2, att(1, 3, 0)) in cmds
    assert CancelTask(h.last_id, E1, att(1, 3, 1)) in cmds
    assert any(isinstance(c, JobCancelled) for c in cmds)
    assert h.state.running_attempts(E1) == []


def test_an_executor_beaten_by_a_copy_is_marked_slow_and_gets_ties_last() -> None:
    h = Harness(SPEC)
    h.register(E1, 4)
    h.register(E2, 4)
    h.submit(three_stage_plan(maps=4, reducers=2))  # p0, p2 on e1; p1, p3 on e2
    h.now = 1.0
    for p, executor in ((1, E2), (2, E1), (3, E2)):
        h.complete(att(1, p), executor)
    assert copies(h.tick(2.0)) == [("e2", "j1/s1/p0/a1")]
    h.now = 2.5
    cmds = h.complete(att(1, 0, 1), E2)
    slow = h.state.executor(E1)
    assert slow is not None and slow.slow and slow.slowness == 1.75  # 2.5 s / 1 s, averaged
    # Both idle now: e2 gets the first reducer, though e1 connected first.
    assert launches(cmds) == [("e2", "j1/s2/p0/a0"), ("e1", "j1/s2/p1/a0")]
    h.now = 3.0
    h.complete(att(2, 0), E2)
    cmds = h.complete(att(2, 1), E1)  # as fast as e2's: no longer slow
    assert launches(cmds) == [("e1", "j1/s3/p0/a0")]
    view = h.state.executor(E1)
    assert view is not None and not view.slow


# ------------------------------------------------------------ executors lost


def test_losing_the_copys_executor_drops_the_copy_uncharged() -> None:
    h = straggling()
    h.tick(2.0)
    # e1's outputs are made again on e2; p3's original still runs there.
    assert launches(h.lose(E1)) == [("e2", "j1/s1/p0/a1"), ("e2", "j1/s1/p2/a1")]
    view = stage_view(h)
    assert view.speculative_running == 0 and view.tasks_rerun == 0
    h.complete(att(1, 0, 1), E2)
    h.complete(att(1, 2, 1), E2)
    assert launches(h.complete(att(1, 3, 0), E2))[0][1] == "j1/s2/p0/a0"


def test_losing_the_originals_executor_keeps_the_copy_running_in_its_place() -> None:
    h = straggling()
    h.tick(2.0)
    cmds = h.lose(E2)
    # p1 (done on e2) is made again; p3 is not: its copy on e1 goes on.
    assert launches(cmds) == [("e1", "j1/s1/p1/a1")]
    h.now = 3.0
    h.complete(att(1, 1, 1), E1)
    cmds = h.complete(att(1, 3, 1), E1)
    assert h.loc(att(1, 3, 1), E1, 0).path in reducer_inputs(cmds)


def test_a_winner_lost_after_winning_is_made_again() -> None:
    h = straggling()
    h.tick(2.0)
    h.now = 2.5
    h.complete(att(1, 3, 1), E1)  # the copy won; the reducers start
    cmds = h.lose(E1)
    # e1's outputs, the winner's among them, are made again on e2.
    assert launches(cmds) == [
        ("e2", "j1/s1/p0/a1"),
        ("e2", "j1/s1/p2/a1"),
        ("e2", "j1/s1/p3/a2"),
    ]
    assert h.complete(att(1, 3, 0), E2) == []  # the cancelled loser stays out
    view = stage_view(h)
    assert view.outputs_recomputed == 3


def test_copies_are_not_resumed_after_a_scheduler_restart() -> None:
    h = straggling()
    h.tick(2.0)
    r = restarted(h)
    r.send(SchedulerRecovered)
    view = r.state.job(J1)
    assert view is not None and view.stages[0].speculative_running == 0
    assert view.stages[0].pending == 1


# ------------------------------------------------------------- bad executors

EXCLUDE = Limits(
    speculation=False,
    exclusion_failures=3,
    exclusion_window_s=60.0,
    exclusion_s=30.0,
    heartbeat_timeout_s=1000.0,
    suspect_phi=math.inf,
)


def failing(limits: Limits = EXCLUDE) -> Harness:
    """e1 and e2, 4 slots each; stage 1 has 6 tasks: p0, p2, p4 on e1."""
    h = Harness(limits)
    h.register(E1, 4)
    h.register(E2, 4)
    h.submit(three_stage_plan(maps=6, reducers=2))
    return h


def test_three_tasks_failing_on_one_executor_exclude_it_for_a_while() -> None:
    h = failing()
    # A failed task goes to another executor (not again where it failed).
    assert launches(h.fail(att(1, 0), E1, ExecutionError("I/O error"))) == [("e2", "j1/s1/p0/a1")]
    assert launches(h.fail(att(1, 2), E1, ExecutionError("I/O error"))) == []  # e2 is full
    assert launches(h.fail(att(1, 4), E1, ExecutionError("I/O error"))) == []
    view = h.state.executor(E1)
    assert view is not None and view.excluded_until == 30.0
    assert view.exclusion.startswith("3 tasks failed on it within 60 s")
    assert "I/O error" in view.exclusion
    # Excluded, e1 is idle but gets nothing; p2 waits for e2's next slot.
    assert h.state.running_attempts(E1) == []
    assert launches(h.complete(att(1, 1), E2)) == [("e2", "j1/s1/p2/a1")]
    assert h.tick(29.0) == []
    h.tick(30.5)
    view = h.state.executor(E1)
    assert view is not None and view.excluded_until is None
    assert view.exclusion.startswith("was excluded: 3 tasks failed")
    h.complete(att(1, 3), E2)  # p4 (it failed on e1) goes to e2
    h.complete(att(1, 5), E2)
    h.complete(att(1, 0, 1), E2)
    h.complete(att(1, 2, 1), E2)
    cmds = h.complete(att(1, 4, 1), E2)
    assert launches(cmds)[0] == ("e1", "j1/s2/p0/a0")  # back in use


def test_one_task_failing_again_and_again_is_the_tasks_problem_not_the_executors() -> None:
    h = Harness(EXCLUDE)
    h.register(E1, 4)
    h.submit(three_stage_plan(maps=1, reducers=1))
    for a in range(3):
        h.fail(att(1, 0, a), E1, ExecutionError("out of memory"))
    view = h.state.executor(E1)
    assert view is not None and view.excluded_until is None
    cmds = h.fail(att(1, 0, 3), E1, ExecutionError("out of memory"))
    failed = [c for c in cmds if isinstance(c, JobFailed)]
    assert len(failed) == 1 and "failed 4 attempts" in failed[0].message


def test_query_errors_and_fetch_failures_do_not_count_against_an_executor() -> None:
    h = Harness(EXCLUDE)
    h.register(E1, 4)
    h.register(E2, 4)
    h.submit(three_stage_plan(maps=4, reducers=4))
    for p, executor in ((0, E1), (1, E2), (2, E1), (3, E2)):
        h.complete(att(1, p), executor)
    for p in range(3):
        lost = FetchFailed(E2, S1, 1, "missing", FetchProblem.OUTPUT_LOST)
        h.fail(att(2, p), E1 if p % 2 == 0 else E2, lost)
    view = h.state.executor(E1)
    assert view is not None and view.excluded_until is None
    other = Harness(EXCLUDE)
    other.register(E1, 4)
    other.submit(three_stage_plan(maps=4, reducers=2))
    other.fail(att(1, 0), E1, QueryError("division by zero"))
    view = other.state.executor(E1)
    assert view is not None and view.excluded_until is None


def test_failures_outside_the_window_do_not_add_up() -> None:
    h = failing()
    h.fail(att(1, 0), E1, ExecutionError("I/O error"))
    h.now = 50.0
    h.fail(att(1, 2), E1, ExecutionError("I/O error"))
    h.now = 100.0  # the first failure is more than 60 s old
    h.fail(att(1, 4), E1, ExecutionError("I/O error"))
    view = h.state.executor(E1)
    assert view is not None and view.excluded_until is None


def test_every_executor_excluded_fails_the_job_saying_so() -> None:
    h = failing()
    for p in (0, 2, 4):
        h.fail(att(1, p), E1, ExecutionError("I/O error"))
    # e1 is excluded: three of e2's tasks fail too.
    h.fail(att(1, 1), E2, ExecutionError("I/O error"))
    h.fail(att(1, 3), E2, ExecutionError("I/O error"))
    cmds = h.fail(att(1, 5), E2, ExecutionError("I/O error"))
    failed = [c for c in cmds if isinstance(c, JobFailed)]
    assert len(failed) == 1
    assert failed[0].message.startswith("every executor is excluded for failing tasks (e1: 3 tasks")
    assert "e2: 3 tasks failed on it" in failed[0].message
    assert "--exclusion-time" in failed[0].message


def test_exclusions_are_not_kept_across_a_scheduler_restart() -> None:
    h = failing()
    for p in (0, 2, 4):
        h.fail(att(1, p), E1, ExecutionError("I/O error"))
    r = restarted(h)
    view = r.state.executor(E1)
    assert view is not None and view.excluded_until is None and view.exclusion == ""
