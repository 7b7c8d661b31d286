"""The state machine's recovery additions: a lost output (not executor), and drains ending.

Same style as ``test_state_machine.py`` (whose ``Harness`` and plans it reuses):
hand-built events in, exact commands out.
"""

from __future__ import annotations

from test_state_machine import (
    E1,
    E2,
    J1,
    S1,
    S2,
    Harness,
    att,
    finish_maps,
    launches,
    started,
    three_stage_plan,
)

from mangonel.ids import ExecutorId
from mangonel.scheduler.events import (
    DeclareExecutorLost,
    ExecutorDraining,
    JobFailed,
    JobSucceeded,
    Limits,
    LossReason,
    ResultRead,
)
from mangonel.scheduler.state import ExecutorState, JobState
from mangonel.task import FetchFailed, FetchProblem, ReleaseOutputs

# ------------------------------------------------------------- one lost output


def test_output_lost_recomputes_that_map_task_and_keeps_the_executor() -> None:
    h = started(maps=4, reducers=2)
    cmds = finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    assert launches(cmds) == [("e1", "j1/s2/p0/a0"), ("e2", "j1/s2/p1/a0")]
    bad = FetchFailed(E1, S1, 2, "checksum mismatch", FetchProblem.OUTPUT_LOST)
    cmds = h.fail(att(2, 0), E1, bad)
    # Only map task 2 runs again (on the free executor, which is e1 again: it is
    # alive and keeps map 0's output); no executor is declared lost.
    assert launches(cmds) == [("e1", "j1/s1/p2/a1")]
    assert not any(isinstance(c, DeclareExecutorLost) for c in cmds)
    assert [v.state for v in h.state.executors()] == [ExecutorState.ALIVE] * 2
    view = h.state.job(J1)
    assert view is not None
    assert (view.stages[0].outputs_recomputed, view.stages[1].tasks_rerun) == (1, 1)
    # The reader runs again once the output is back, reading the new attempt's file.
    cmds = h.complete(att(1, 2, 1), E1)
    assert launches(cmds) == [("e1", "j1/s2/p0/a1")]


def test_output_lost_about_an_output_already_made_again_changes_nothing() -> None:
    h = started(maps=2, reducers=2)
    finish_maps(h, {0: E1, 1: E2})
    bad = FetchFailed(E2, S1, 1, "gone", FetchProblem.OUTPUT_LOST)
    h.fail(att(2, 0), E1, bad)
    h.complete(att(1, 1, 1), E2)
    # The second reader read the old file too: its report comes after the recompute.
    h.fail(att(2, 1), E2, FetchFailed(E1, S1, 1, "gone", FetchProblem.OUTPUT_LOST))
    view = h.state.job(J1)
    assert view is not None and view.stages[0].outputs_recomputed == 1


def test_an_output_lost_whose_own_inputs_went_with_an_earlier_loss_makes_those_too() -> None:
    # Stage 2 was complete when e3 was lost, so nothing needed the map output e3
    # held and it was not made again. Then the final task finds stage 2's output
    # 0 bad: task 0 of stage 2 must run again, and so must the map output it
    # reads, or stage 2 waits for it for ever with two executors idle (the
    # state's ``job-progress`` invariant found this).
    h = Harness()
    for e in (E1, E2, E3):
        h.register(e, 4)
    h.submit(three_stage_plan(maps=4, reducers=2))
    finish_maps(h, {0: E1, 1: E2, 2: E3, 3: E1})
    h.complete(att(2, 0), E1)
    assert launches(h.complete(att(2, 1), E2)) == [("e1", "j1/s3/p0/a0")]
    assert h.lose(E3) == []
    bad = FetchFailed(E1, S2, 0, "checksum mismatch", FetchProblem.OUTPUT_LOST)
    cmds = h.fail(att(3, 0), E1, bad)
    assert launches(cmds) == [("e1", "j1/s1/p2/a1")]
    view = h.state.job(J1)
    assert view is not None
    assert [(s.done, s.pending, s.outputs_recomputed) for s in view.stages] == [
        (3, 0, 1),
        (1, 1, 1),
        (0, 1, 0),
    ]
    assert launches(h.complete(att(1, 2, 1), E1)) == [("e1", "j1/s2/p0/a1")]
    assert launches(h.complete(att(2, 0, 1), E1)) == [("e1", "j1/s3/p0/a1")]
    assert isinstance(h.complete(att(3, 0, 1), E1)[0], JobSucceeded)


def test_outputs_that_keep_going_bad_use_up_the_task_recomputes() -> None:
    h = Harness(Limits(max_task_recomputes=1))
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.complete(att(1, 0), E1)
    bad = FetchFailed(E1, S1, 0, "checksum mismatch", FetchProblem.OUTPUT_LOST)
    h.fail(att(2, 0), E1, bad)
    h.complete(att(1, 0, 1), E1)
    cmds = h.fail(att(2, 0, 1), E1, bad)
    failed = [c for c in cmds if isinstance(c, JobFailed)]
    assert len(failed) == 1
    assert (
        "the output of task 0 of stage 1 (scan t) of job j1 was lost 2 times (the limit is 1"
        in failed[0].message
    )
    assert "checksum mismatch" in failed[0].message and "executor e1" in failed[0].message


# ------------------------------------------------ losses that add up, per task

E3, E4 = ExecutorId("e3"), ExecutorId("e4")


def _lose_two_holders_of_different_outputs() -> Harness:
    """Map 0 is lost with e1 and made again on e4, then map 1 with e2, also
    made again on e4: two losses of the stage's outputs, one per task."""
    h = Harness(Limits(max_task_recomputes=1))
    for e in (E1, E2, E3):
        h.register(e, 1)
    assert launches(h.submit(three_stage_plan(maps=3, reducers=1))) == [
        ("e1", "j1/s1/p0/a0"),
        ("e2", "j1/s1/p1/a0"),
        ("e3", "j1/s1/p2/a0"),
    ]
    h.complete(att(1, 0), E1)
    h.lose(E1)
    assert launches(h.register(E4, 1)) == [("e4", "j1/s1/p0/a1")]
    h.complete(att(1, 0, 1), E4)
    h.complete(att(1, 1), E2)
    assert launches(h.lose(E2)) == [("e4", "j1/s1/p1/a1")]
    h.complete(att(1, 1, 1), E4)
    return h


def test_losses_that_take_different_outputs_of_a_stage_do_not_add_up() -> None:
    # Among many executors every loss takes a few outputs of every big stage:
    # the bound is per task, so two losses under a limit of one are routine.
    h = _lose_two_holders_of_different_outputs()
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.RUNNING
    assert view.stages[0].outputs_recomputed == 2
    assert launches(h.complete(att(1, 2), E3)) == [("e3", "j1/s2/p0/a0")]
    assert launches(h.complete(att(2, 0), E3)) == [("e3", "j1/s3/p0/a0")]
    assert any(isinstance(c, JobSucceeded) for c in h.complete(att(3, 0), E3))


def test_a_task_whose_output_is_lost_past_the_limit_fails_the_job() -> None:
    h = _lose_two_holders_of_different_outputs()
    # e4 holds maps 0 and 1, both made once again already.
    cmds = h.lose(E4)
    failed = [c for c in cmds if isinstance(c, JobFailed)]
    assert len(failed) == 1
    assert failed[0].message.startswith(
        "the output of task 0 of stage 1 (scan t) of job j1 was lost 2 times "
        "(the limit is 1; last with executor(s) e4). Executors keep being lost"
    )
    assert "raise max_task_recomputes" in failed[0].message


# --------------------------------------------------------------------- drains


def test_an_idle_draining_executor_holding_nothing_is_let_go_at_once() -> None:
    h = Harness()
    h.register(E1, 1)
    h.register(E2, 1)
    cmds = h.send(ExecutorDraining, E2)
    assert cmds == [DeclareExecutorLost(h.last_id, E2, LossReason.DRAINED)]
    lost = [v for v in h.state.executors() if v.id == E2][0]
    assert (lost.state, lost.reason) == (ExecutorState.LOST, LossReason.DRAINED)
    assert "no job needs its outputs" in lost.detail


def test_a_draining_executor_is_let_go_once_nobody_needs_its_outputs() -> None:
    h = Harness()
    h.register(E1, 2)
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=2, reducers=1))  # map 0 on e1, map 1 on e2
    assert h.send(ExecutorDraining, E1) == []  # it runs map 0
    # Its task is done, but its output is needed by stage 2: it stays.
    assert not any(isinstance(c, DeclareExecutorLost) for c in h.complete(att(1, 0), E1))
    assert launches(h.complete(att(1, 1), E2)) == [("e2", "j1/s2/p0/a0")]
    # Stage 2 read it and is complete: e1 holds nothing needed any more.
    cmds = h.complete(att(2, 0), E2)
    assert DeclareExecutorLost(h.last_id, E1, LossReason.DRAINED) in cmds
    assert launches(cmds) == [("e2", "j1/s3/p0/a0")]
    view = h.state.job(J1)
    assert view is not None and view.outputs_recomputed == 0  # it was needed by no one
    assert h.complete(att(3, 0), E2) == [
        JobSucceeded(h.last_id, J1, (h.loc(att(3, 0), E2, 0),)),
        ReleaseOutputs(h.last_id, E2, J1, (S1, S2)),
    ]


def test_a_draining_executor_holding_the_final_output_stays_until_it_is_read() -> None:
    h = Harness()
    h.register(E1, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.complete(att(1, 0), E1)
    h.complete(att(2, 0), E1)
    assert h.send(ExecutorDraining, E1) == []  # it runs the final task
    cmds = h.complete(att(3, 0), E1)
    # It serves the result: its stream stays open until the client read it.
    assert isinstance(cmds[0], JobSucceeded)
    assert not any(isinstance(c, DeclareExecutorLost) for c in cmds)
    assert h.send(ResultRead, J1) == [
        ReleaseOutputs(h.last_id, E1, J1, None),
        DeclareExecutorLost(h.last_id, E1, LossReason.DRAINED),
    ]
