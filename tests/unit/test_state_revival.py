"""Executors declared lost that come back alive (``scheduler.state_revival``):
under their id, with the outputs nobody made again meanwhile; every return
counted as a false loss. Commands are compared exactly, as in ``test_state_machine``."""

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
    Command,
    ExecutorConnected,
    ExecutorHeartbeat,
    ExecutorRegistered,
    HealthChange,
    JobSucceeded,
    LogExecutorHealth,
    LossReason,
    ResumeExecutor,
)
from mangonel.scheduler.state import ExecutorState
from mangonel.scheduler.state_revival import MAX_REVIVALS
from mangonel.task import CancelTask, ExecutorInfo, LaunchTask, ReleaseOutputs


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
    # The reducer e1 ran at its loss was charged to it: it goes elsewhere.
    assert launches(cmds) == [("e2", "j1/s2/p0/a1"), ("e1", "j1/s2/p1/a1")]
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
    # p0's recompute goes on and completes the stage.
    assert launches(h.complete(att(1, 0, 1), E2)) == [("e2", "j1/s2/p0/a1"), ("e1", "j1/s2/p1/a1")]


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
