"""Executors declared lost that come back alive (``scheduler.state_revival``):
under their id, with the outputs nobody made again meanwhile; every return
counted as a false loss. Commands are compared exactly, as in ``test_state_machine``."""

from __future__ import annotations

from test_state_liveness import run
from test_state_machine import (
    E1,
    E2,
    E3,
    J1,
    J2,
    S1,
    S2,
    Harness,
    att,
    finish_maps,
    launches,
    started,
    three_stage_plan,
)
from test_state_restart import restarted

from mangonel.ids import ExecutorId, TaskAttemptId, TaskId
from mangonel.scheduler.events import (
    Command,
    ExecutorConnected,
    ExecutorHeartbeat,
    ExecutorRegistered,
    HealthChange,
    JobFailed,
    JobSucceeded,
    Limits,
    LogExecutorHealth,
    LossReason,
    ResumeExecutor,
    SchedulerRecovered,
)
from mangonel.scheduler.state import ExecutorState, JobState
from mangonel.scheduler.state_revival import MAX_REVIVALS
from mangonel.task import CancelTask, ExecutionError, ExecutorInfo, LaunchTask, ReleaseOutputs


def held(h: Harness, executor: ExecutorId, *attempts: object) -> frozenset[str]:
    return frozenset(o.path for a in attempts for o in h.outputs(a, executor))  # type: ignore[arg-type]


def come_back(h: Harness, executor: ExecutorId, files: frozenset[str]) -> list[Command]:
    """``executor`` asks to resume its id with ``files``: the registration's commands."""
    n = executor[1:]
    fresh = ExecutorInfo(ExecutorId(f"fresh-{n}"), f"h{n}", f"h{n}:50{n}", 4)
    return h.send(ExecutorRegistered, fresh, executor, files, (J1,))


def came_back(h: Harness, executor: ExecutorId, how: str) -> LogExecutorHealth:
    return LogExecutorHealth(h.last_id, HealthChange.CAME_BACK, executor, how)


def recomputed(h: Harness) -> list[int]:
    view = h.state.job(J1)
    assert view is not None
    return [s.outputs_recomputed for s in view.stages]


def test_the_only_executor_lost_for_silence_comes_back_and_nothing_is_made_again() -> None:
    h = Harness()
    h.register(E1, 4)
    h.submit(three_stage_plan(maps=2, reducers=1))
    launched = finish_maps(h, {0: E1, 1: E1})
    assert launches(launched) == [("e1", "j1/s2/p0/a0")]
    h.now = 20.0
    # Its link was down past the timeout: lost, both outputs needed again, nowhere to run.
    assert launches(h.lose(E1, LossReason.HEARTBEAT_TIMEOUT)) == []
    assert recomputed(h) == [2, 0, 0]
    h.now = 22.0
    files = held(h, E1, att(1, 0), att(1, 1))
    assert come_back(h, E1, files) == [
        came_back(
            h,
            E1,
            "lost (heartbeat timeout) but alive; it goes on under its id with the 4 file(s) "
            "it holds",
        ),
        ResumeExecutor(h.last_id, E1),
    ]
    view = h.state.executor(E1)
    assert view is not None and view.state is ExecutorState.ALIVE
    # Its stream opens: the map outputs are its again, the reducer runs again at once.
    assert launches(h.send(ExecutorConnected, E1)) == [("e1", "j1/s2/p0/a1")]
    assert recomputed(h) == [0, 0, 0]
    reducer_inputs = h.state.job(J1)
    assert reducer_inputs is not None and reducer_inputs.stages[0].done == 2
    assert launches(h.complete(att(2, 0, 1), E1)) == [("e1", "j1/s3/p0/a0")]
    assert h.complete(att(3, 0), E1) == [
        JobSucceeded(h.last_id, J1, (h.loc(att(3, 0), E1, 0),)),
        ReleaseOutputs(h.last_id, E1, J1, (S1, S2)),
    ]


def test_a_recompute_still_running_loses_to_the_output_that_came_back() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    h.now = 20.0
    assert launches(h.lose(E1)) == [("e2", "j1/s1/p0/a1"), ("e2", "j1/s1/p2/a1")]
    # p0's recompute finished first; p2's still runs when e1 comes back.
    h.complete(att(1, 0, 1), E2)
    assert recomputed(h) == [2, 0, 0]
    come_back(h, E1, held(h, E1, att(1, 0), att(1, 2)))
    cmds = h.send(ExecutorConnected, E1)
    assert cmds[0] == CancelTask(h.last_id, E2, att(1, 2, 1))
    # The reducer e1 ran at its loss is not charged to it (it came back alive):
    # e1 may run it again, and does.
    assert launches(cmds) == [("e1", "j1/s2/p0/a1"), ("e2", "j1/s2/p1/a1")]
    reducer = cmds[1]
    assert isinstance(reducer, LaunchTask)
    # p0 from its recompute on e2 (it won), p2 from e1's file that came back.
    assert reducer.task.inputs[0].locations == (
        h.loc(att(1, 0, 1), E2, 0),
        h.loc(att(1, 1), E2, 0),
        h.loc(att(1, 2), E1, 0),
        h.loc(att(1, 3), E2, 0),
    )
    assert recomputed(h) == [1, 0, 0]
    # The cancelled recompute's late report changes nothing.
    assert h.complete(att(1, 2, 1), E2) == []


def test_outputs_whose_files_it_no_longer_holds_are_made_again() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    h.now = 20.0
    h.lose(E1)
    come_back(h, E1, held(h, E1, att(1, 2)))  # p0's file is gone
    cmds = h.send(ExecutorConnected, E1)
    assert cmds == [CancelTask(h.last_id, E2, att(1, 2, 1))]
    assert recomputed(h) == [1, 0, 0]
    # p0's recompute goes on and completes the stage; the reducer e1 ran at its
    # loss is not charged to it (it came back alive), and runs there again.
    assert launches(h.complete(att(1, 0, 1), E2)) == [("e1", "j1/s2/p0/a1"), ("e2", "j1/s2/p1/a1")]


def test_an_executor_lost_for_good_reasons_registers_anew() -> None:
    h = started()
    h.now = 20.0
    # Unreachable from its readers: it would come back as unreachable. A false
    # loss all the same (it lived), counted; under a new id.
    h.lose(E1, LossReason.FETCH_FAILURES)
    assert come_back(h, E1, frozenset()) == [
        came_back(h, E1, "lost (fetch failures) but alive; it registers anew, its files deleted")
    ]
    assert h.state.executor(ExecutorId("fresh-1")) is not None
    view = h.state.executor(E1)
    assert view is not None and view.state is ExecutorState.LOST
    # Drained: it was let go; no false loss.
    h.lose(E2, LossReason.DRAINED)
    assert come_back(h, E2, frozenset()) == []
    assert h.state.executor(ExecutorId("fresh-2")) is not None


def test_an_executor_revived_too_often_registers_anew() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    files = held(h, E1, att(1, 0), att(1, 2))
    for n in range(MAX_REVIVALS):
        h.now = 20.0 * (n + 1)
        h.send(ExecutorHeartbeat, E2)
        h.lose(E1)
        assert come_back(h, E1, files)[-1] == ResumeExecutor(h.last_id, E1)
        h.send(ExecutorConnected, E1)
    h.now += 20.0
    h.send(ExecutorHeartbeat, E2)
    h.lose(E1)
    assert come_back(h, E1, files) == [
        came_back(h, E1, "lost (connection lost) but alive; it registers anew, its files deleted")
    ]


def test_an_executor_that_comes_back_after_its_job_did_without_it_registers_anew() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    h.now = 20.0
    h.lose(E1)
    for p in (0, 2):
        h.complete(att(1, p, 1), E2)
    assert come_back(h, E1, held(h, E1, att(1, 0), att(1, 2))) == [
        came_back(
            h,
            E1,
            "lost (connection lost) but alive; nothing it holds is needed any more: it "
            "registers anew, its files deleted",
        )
    ]
    assert h.state.executor(ExecutorId("fresh-1")) is not None
    assert recomputed(h) == [2, 0, 0]


def test_a_revived_executor_whose_stream_never_opens_is_lost_again_at_the_timeout() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    h.now = 20.0
    h.lose(E1)
    come_back(h, E1, held(h, E1, att(1, 0), att(1, 2)))
    h.now = 20.0 + h.state.limits.heartbeat_timeout_s + 1
    h.send(ExecutorHeartbeat, E2)
    h.tick(h.now)
    view = h.state.executor(E1)
    assert view is not None and view.state is ExecutorState.LOST
    assert "did not reconnect" in view.detail and "came back after it was lost" in view.detail
    # What it left is still noted: back again (with its stream this time), it has it.
    come_back(h, E1, held(h, E1, att(1, 0), att(1, 2)))
    cmds = h.send(ExecutorConnected, E1)
    assert [c for c in cmds if isinstance(c, CancelTask)] == [
        CancelTask(h.last_id, E2, att(1, 0, 1)),
        CancelTask(h.last_id, E2, att(1, 2, 1)),
    ]
    assert recomputed(h) == [0, 0, 0]


# ------------------------------------------------- outputs made again on suspicion


def suspected_holder(slots: int = 2) -> tuple[Harness, list[tuple[float, Command]]]:
    """e1, e2, e3; j1's maps done on one each, its reducer running on e1; e2 falls
    silent at 5 s and is suspected about 2 s later: the commands until 8 s. The
    maps took 3 s, so the detector suspects it before redoing its output would
    have paid (``state_liveness.hedge``)."""
    h = Harness(Limits(heartbeat_timeout_s=10.0))
    for e in (E1, E2, E3):
        h.register(e, slots)
    h.submit(three_stage_plan(maps=3, reducers=1))
    h.now = 3.0
    assert launches(finish_maps(h, {0: E1, 1: E2, 2: E3})) == [("e1", "j1/s2/p0/a0")]
    run(h, 5.0, lambda e, t: True)
    return h, run(h, 8.0, lambda e, t: e != E2 or t < 5.0)


def test_a_suspects_needed_outputs_are_made_again_and_its_again_if_it_is_heard() -> None:
    h, cmds = suspected_holder()
    said = [(c.change, c.executor) for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert said == [(HealthChange.SUSPECTED, E2), (HealthChange.SET_ASIDE, E2)]
    # The reducer waits on a silent host: cancelled, uncharged; p1 made again on a
    # trusted executor, before any loss.
    at, _ = next(x for x in cmds if isinstance(x[1], LogExecutorHealth) and x[1].executor == E2)
    assert 5.0 + 1.5 < at < 5.0 + 2.5
    after = [c for t, c in cmds if t >= at]
    assert [c.attempt for c in after if isinstance(c, CancelTask)] == [att(2, 0)]
    launched = [c for c in after if isinstance(c, LaunchTask) and not c.speculative]
    assert [(c.executor, str(c.task.attempt)) for c in launched] == [("e1", "j1/s1/p1/a1")]
    assert recomputed(h) == [1, 0, 0]
    view = h.state.executor(E2)
    assert view is not None and view.state is ExecutorState.ALIVE
    # e2 is heard again before the recompute finished: p1 is its again, the
    # recompute is cancelled, the reducer runs again at once.
    cmds2 = h.send(ExecutorHeartbeat, E2)
    assert CancelTask(h.last_id, E1, att(1, 1, 1)) in cmds2
    reducer = next(c for c in cmds2 if isinstance(c, LaunchTask))
    assert str(reducer.task.attempt) == "j1/s2/p0/a1"
    assert h.loc(att(1, 1), E2, 0) in reducer.task.inputs[0].locations
    assert recomputed(h) == [0, 0, 0]


def test_a_recompute_that_finishes_first_wins_over_the_suspected_copy() -> None:
    h, _ = suspected_holder()
    cmds = h.complete(att(1, 1, 1), E1)
    reducer = next(c for c in cmds if isinstance(c, LaunchTask))
    assert h.loc(att(1, 1, 1), E1, 0) in reducer.task.inputs[0].locations
    # Heard again afterwards: nothing of it is taken back.
    cmds = h.send(ExecutorHeartbeat, E2)
    assert not [c for c in cmds if isinstance(c, CancelTask | LaunchTask)]
    assert recomputed(h) == [1, 0, 0]


def test_no_free_slot_no_recompute_on_suspicion() -> None:
    # One slot each: e1 runs map p0, which reads nothing of e2's; e2 holds p1 and
    # p2 and falls silent. No trusted slot is free, nor held by a reader of e2's.
    h = Harness(Limits(heartbeat_timeout_s=10.0, speculation=False))
    for e in (E1, E2):
        h.register(e, 1)
    assert launches(h.submit(three_stage_plan(maps=3, reducers=1))) == [
        ("e1", "j1/s1/p0/a0"),
        ("e2", "j1/s1/p1/a0"),
    ]
    assert launches(h.complete(att(1, 1), E2)) == [("e2", "j1/s1/p2/a0")]
    assert launches(h.complete(att(1, 2), E2)) == []
    run(h, 5.0, lambda e, t: True, (E1, E2))
    cmds = run(h, 8.0, lambda e, t: e != E2 or t < 5.0, (E1, E2))
    said = [c.change for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert said == [HealthChange.SUSPECTED]
    assert not [c for _, c in cmds if isinstance(c, CancelTask | LaunchTask)]
    assert recomputed(h) == [0, 0, 0]


def test_a_slot_held_by_a_reader_of_the_suspect_is_the_recomputes() -> None:
    # One slot each: the reducer on e1 waits on e2's p1, and e2 falls silent. No
    # slot is free, but the reducer's is the recompute's: cancelled (uncharged),
    # p1 made again on e1 before any loss, the reducer again after it.
    h = Harness(Limits(heartbeat_timeout_s=10.0))
    for e in (E1, E2):
        h.register(e, 1)
    h.submit(three_stage_plan(maps=2, reducers=1))
    h.now = 3.0  # maps of 3 s: the detector suspects e2 first (``suspected_holder``)
    assert launches(finish_maps(h, {0: E1, 1: E2})) == [("e1", "j1/s2/p0/a0")]
    run(h, 5.0, lambda e, t: True, (E1, E2))
    cmds = run(h, 8.0, lambda e, t: e != E2 or t < 5.0, (E1, E2))
    said = [(c.change, c.executor) for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert said == [(HealthChange.SUSPECTED, E2), (HealthChange.SET_ASIDE, E2)]
    assert [(c.executor, c.attempt) for _, c in cmds if isinstance(c, CancelTask)] == [
        (E1, att(2, 0))
    ]
    assert launches([c for _, c in cmds]) == [("e1", "j1/s1/p1/a1")]
    assert recomputed(h) == [1, 0, 0]
    view = h.state.executor(E2)
    assert view is not None and view.state is ExecutorState.ALIVE
    reducer = next(c for c in h.complete(att(1, 1, 1), E1) if isinstance(c, LaunchTask))
    assert str(reducer.task.attempt) == "j1/s2/p0/a1"
    assert h.loc(att(1, 1, 1), E1, 0) in reducer.task.inputs[0].locations


def test_an_output_recomputed_up_to_its_limit_is_not_made_again_on_suspicion() -> None:
    # With no recompute left (the limit 0), making e2's p1 again on suspicion
    # would end a job whose outputs are all still there: nothing is made again,
    # the reducer that reads p1 waits for e2. Found by the simulation (seed
    # 612404 of the batch at 490c55e, ``test_cluster_sim``). The loss that
    # follows when the silence lasts ends the job by the limit's rule.
    h = Harness(Limits(heartbeat_timeout_s=10.0, max_task_recomputes=0))
    for e in (E1, E2, E3):
        h.register(e, 2)
    h.submit(three_stage_plan(maps=3, reducers=1))
    h.now = 3.0  # maps of 3 s: the detector suspects e2 first (``suspected_holder``)
    assert launches(finish_maps(h, {0: E1, 1: E2, 2: E3})) == [("e1", "j1/s2/p0/a0")]
    run(h, 5.0, lambda e, t: True)
    cmds = run(h, 8.0, lambda e, t: e != E2 or t < 5.0)
    said = [(c.change, c.executor) for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert said == [(HealthChange.SUSPECTED, E2)]
    assert not [c for _, c in cmds if isinstance(c, CancelTask)]
    assert not [c for _, c in cmds if isinstance(c, LaunchTask) and not c.speculative]
    assert recomputed(h) == [0, 0, 0]
    cmds = run(h, 16.0, lambda e, t: e != E2)
    failed = [c for _, c in cmds if isinstance(c, JobFailed)]
    assert len(failed) == 1 and "was lost 1 times (the limit is 0" in failed[0].message


def test_a_report_that_ends_a_suspicion_touches_the_jobs_whose_outputs_it_gives_back() -> None:
    # j1 may hold one slot: its outputs on e2, set aside on suspicion, wait pending
    # behind p3 on e1; e2's report of a j2 task gives them back, with no command
    # about j1, yet the store must write j1's tasks again.
    h = Harness(Limits(heartbeat_timeout_s=10.0, max_job_share=0.2, speculation=False))
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=4, reducers=1))
    assert launches(h.submit(three_stage_plan(maps=1, reducers=1), J2)) == [("e2", "j2/s1/p0/a0")]
    finish_maps(h, {0: E2, 1: E2})
    h.register(E1, 2)
    h.register(E3, 2)
    assert launches(h.complete(att(1, 2), E2)) == [("e1", "j1/s1/p3/a0")]
    run(h, 5.0, lambda e, t: True)
    cmds = run(h, 8.0, lambda e, t: e != E2 or t < 5.0)
    said = [(c.change, c.executor) for _, c in cmds if isinstance(c, LogExecutorHealth)]
    # Suspected before the detector would: j2's task there waits, and tasks take no time here.
    assert said == [(HealthChange.HEDGED, E2), (HealthChange.SET_ASIDE, E2)]
    assert recomputed(h) == [3, 0, 0]
    cmds = h.complete(TaskAttemptId(TaskId(J2, S1, 0), 0), E2)
    assert launches(cmds) == [("e2", "j2/s2/p0/a0")]
    assert recomputed(h) == [0, 0, 0]
    assert h.state.touched_jobs() == [J1, J2]


def test_a_task_running_on_an_executor_that_comes_back_is_not_charged_its_loss() -> None:
    """A loss for silence or a broken stream charges the attempts running there
    (a task that kills its executor must not run for ever); an executor that comes
    back alive, revived or not, shows the loss was the link's, and the charges are
    taken back. Without that, a link that drops twice fails a job whose tasks may
    fail twice, though no task ever failed."""
    h = Harness(Limits(max_task_attempts=2))
    h.register(E1, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.now = 20.0
    assert launches(h.lose(E1)) == []  # p0 ran there: charged, and nowhere to run
    # Back alive, holding nothing needed: a new id, and p0's charge taken back.
    fresh = ExecutorId("fresh-1")
    cmds = come_back(h, E1, frozenset())
    assert cmds[0] == came_back(
        h, E1, "lost (connection lost) but alive; it registers anew, its files deleted"
    )
    assert launches(h.send(ExecutorConnected, fresh)) == [("fresh-1", "j1/s1/p0/a1")]
    h.now = 40.0
    h.send(ExecutorHeartbeat, fresh)
    # Lost again while running p0: its second charge would be its last (2 attempts).
    h.lose(fresh)
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.RUNNING, view
    # The second charge stands (fresh-1 never came back), so the limit still
    # holds: a real failure of p0 now is its last.
    assert launches(h.register(E2, 1)) == [("e2", "j1/s1/p0/a2")]
    failed = h.fail(att(1, 0, 2), E2, ExecutionError("out of memory"))
    assert any(isinstance(c, JobFailed) for c in failed), failed


def test_an_executor_lost_before_a_scheduler_restart_is_revived_after_it() -> None:
    # What a lost executor left is kept in the store (``StoredRevivals``): the
    # restarted scheduler revives it as the one that lost it would have.
    h = Harness()
    h.register(E1, 4)
    h.submit(three_stage_plan(maps=2, reducers=1))
    finish_maps(h, {0: E1, 1: E1})
    h.now = 20.0
    h.lose(E1, LossReason.HEARTBEAT_TIMEOUT)
    assert recomputed(h) == [2, 0, 0]
    r = restarted(h)
    r.send(SchedulerRecovered)
    r.now = 22.0
    files = held(r, E1, att(1, 0), att(1, 1))
    assert come_back(r, E1, files) == [
        came_back(
            r,
            E1,
            "lost (heartbeat timeout) but alive; it goes on under its id with the 4 file(s) "
            "it holds",
        ),
        ResumeExecutor(r.last_id, E1),
    ]
    assert launches(r.send(ExecutorConnected, E1)) == [("e1", "j1/s2/p0/a1")]
    assert recomputed(r) == [0, 0, 0]
    # Revived once: the count went through the store too.
    assert r.state.export_revivals().count == {E1: 1}
