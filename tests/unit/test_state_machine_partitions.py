"""Network partitions as the scheduler's pure state machine sees them, exact commands.

Two cases of issue 14 the state machine decides (``SchedulerState``):

* an executor lost (silence, cut off) while tasks on other executors read its
  outputs: those readers are cancelled (``CancelTask``), uncharged, and run
  again once the outputs are made again, instead of waiting out a fetch timeout;
* a fetch that cannot reach a holder that still heartbeats (a cut between two
  executors): one side gives way for the job (excluded from it, its outputs
  made again), no executor is lost; only readers on two executors failing to
  reach one holder make it lost.

Same style as ``test_state_machine.py``, whose ``Harness`` and plans it reuses.
"""

from __future__ import annotations

import math

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
    three_stage_plan,
)

from mangonel.scheduler.events import (
    DeclareExecutorLost,
    ExecutorHeartbeat,
    JobSucceeded,
    Limits,
    LossReason,
)
from mangonel.scheduler.state import ExecutorState
from mangonel.task import CancelTask, ExecutionError, FetchFailed, FetchProblem, ReleaseOutputs


def test_a_lost_executors_readers_are_cancelled_uncharged_and_run_again() -> None:
    # Two attempts per task: were the cancel charged, one more failure would
    # fail the job.
    h = Harness(Limits(max_task_attempts=2, heartbeat_timeout_s=2.0, suspect_phi=math.inf))
    h.register(E1, 1)
    h.register(E2, 1)
    h.submit(three_stage_plan(maps=2, reducers=2))
    cmds = finish_maps(h, {0: E1, 1: E2})
    assert launches(cmds) == [("e1", "j1/s2/p0/a0"), ("e2", "j1/s2/p1/a0")]
    # e2 goes silent while the reducer on e1 fetches map 1 from it.
    h.now = 1.0
    h.send(ExecutorHeartbeat, E1)
    cmds = h.tick(2.5)
    assert cmds == [
        DeclareExecutorLost(h.last_id, E2, LossReason.HEARTBEAT_TIMEOUT),
        CancelTask(h.last_id, E1, att(2, 0)),
        *cmds[2:],
    ]
    # The slot the cancel freed makes map 1 again at once.
    assert launches(cmds) == [("e1", "j1/s1/p1/a1")]
    assert len(cmds) == 3
    assert h.complete(att(2, 0), E1) == []  # stale: it was cancelled
    assert launches(h.complete(att(1, 1, 1), E1)) == [("e1", "j1/s2/p0/a1")]
    assert launches(h.fail(att(2, 0, 1), E1, ExecutionError("oom"))) == [("e1", "j1/s2/p0/a2")]
    view = h.state.job(J1)
    assert view is not None
    assert (view.stages[0].outputs_recomputed, view.stages[1].tasks_rerun) == (1, 3)


def test_a_cut_between_two_live_executors_excludes_one_side_from_the_job() -> None:
    h = Harness()
    h.register(E1, 1)
    h.register(E2, 1)
    h.submit(three_stage_plan(maps=2, reducers=2))
    cmds = finish_maps(h, {0: E1, 1: E2})
    assert launches(cmds) == [("e1", "j1/s2/p0/a0"), ("e2", "j1/s2/p1/a0")]
    # The reader on e1 cannot reach e2, which heartbeats: a cut between the two.
    unreachable = FetchFailed(E2, S1, 1, "timed out", FetchProblem.UNREACHABLE)
    cmds = h.fail(att(2, 0), E1, unreachable)
    # Each holds one needed output: the holder gives way. No executor is lost:
    # e2 stays alive under its id, the job stops using it. Its reader is
    # cancelled (uncharged), map 1 is made again on e1, then both reducers.
    assert cmds == [CancelTask(h.last_id, E2, att(2, 1)), *cmds[1:]]
    assert launches(cmds) == [("e1", "j1/s1/p1/a1")]
    assert len(cmds) == 2
    assert [(v.id, v.state) for v in h.state.executors()] == [
        (E1, ExecutorState.ALIVE),
        (E2, ExecutorState.ALIVE),
    ]
    progress = h.state.export_job(J1)
    assert progress is not None and progress.excluded == (E2,)
    # e2's late report (its fetch from e1 failed too) is stale: nothing changes.
    assert h.fail(att(2, 1), E2, FetchFailed(E1, S1, 0, "timed out")) == []
    assert launches(h.complete(att(1, 1, 1), E1)) == [("e1", "j1/s2/p0/a1")]
    # e2 is free but takes no task of this job; it takes another job's.
    assert launches(h.submit(three_stage_plan(maps=1, reducers=1), J2)) == [("e2", "j2/s1/p0/a0")]
    assert launches(h.complete(att(2, 0, 1), E1)) == [("e1", "j1/s2/p1/a1")]
    assert launches(h.complete(att(2, 1, 1), E1)) == [("e1", "j1/s3/p0/a0")]
    assert h.complete(att(3, 0), E1) == [
        JobSucceeded(h.last_id, J1, (h.loc(att(3, 0), E1, 0),)),
        ReleaseOutputs(h.last_id, E1, J1, (S1, S2)),
        ReleaseOutputs(h.last_id, E2, J1, (S1, S2)),  # its files of the job go too
    ]
    view = h.state.job(J1)
    assert view is not None
    # Neither the failed reader nor the cancelled one was charged an attempt.
    assert [(s.tasks_rerun, s.outputs_recomputed) for s in view.stages][:2] == [(0, 1), (2, 0)]


def test_the_side_holding_fewer_needed_outputs_gives_way() -> None:
    h = Harness()
    h.register(E1, 1)
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=3, reducers=1))
    cmds = finish_maps(h, {0: E1, 1: E2, 2: E2})
    assert launches(cmds) == [("e1", "j1/s2/p0/a0")]
    # The reader on e1 cannot reach e2; e1 holds one needed output, e2 two:
    # the reader's side gives way, and map 0 is made again on e2.
    cmds = h.fail(att(2, 0), E1, FetchFailed(E2, S1, 1, "timed out"))
    assert launches(cmds) == [("e2", "j1/s1/p0/a1")]
    assert len(cmds) == 1
    progress = h.state.export_job(J1)
    assert progress is not None and progress.excluded == (E1,)
    assert launches(h.complete(att(1, 0, 1), E2)) == [("e2", "j1/s2/p0/a1")]


def test_readers_on_two_executors_failing_to_reach_a_holder_make_it_lost() -> None:
    h = Harness(Limits(unreachable_window_s=60.0))
    for e in (E1, E2, E3):
        h.register(e, 2)
    h.submit(three_stage_plan(maps=3, reducers=1))
    h.submit(three_stage_plan(maps=3, reducers=1), J2)
    for job in (J1, J2):
        for p, e in {0: E1, 1: E2, 2: E3}.items():
            h.complete(att(1, p, job=job), e)
    running = {str(a) for e in (E1, E2, E3) for a in h.state.running_attempts(e)}
    assert running == {"j1/s2/p0/a0", "j2/s2/p0/a0"}
    on = {a.task.job: e for e in (E1, E2, E3) for a in h.state.running_attempts(e)}
    assert (on[J1], on[J2]) == (E1, E2)
    # j1's reader on e1 cannot reach e3: one reader's executor, e3 heartbeats:
    # j1 gives e3 up (it holds as many needed outputs as e1), e3 stays.
    cmds = h.fail(att(2, 0), E1, FetchFailed(E3, S1, 2, "timed out"))
    assert not any(isinstance(c, DeclareExecutorLost) for c in cmds)
    # Within the window, j2's reader on e2 cannot reach e3 either: readers on
    # two executors, so e3 is what is cut off. It is lost.
    h.now = 30.0
    cmds = h.fail(att(2, 0, job=J2), E2, FetchFailed(E3, S1, 2, "timed out"))
    assert cmds[0] == DeclareExecutorLost(h.last_id, E3, LossReason.FETCH_FAILURES)
    lost = h.state.executor(E3)
    assert lost is not None and lost.state is ExecutorState.LOST
    assert "readers on e1, e2 could not reach it" in lost.detail


def test_reports_older_than_the_window_do_not_add_up() -> None:
    h = Harness(Limits(unreachable_window_s=60.0, heartbeat_timeout_s=1000.0))
    for e in (E1, E2, E3):
        h.register(e, 2)
    h.submit(three_stage_plan(maps=3, reducers=1))
    h.submit(three_stage_plan(maps=3, reducers=1), J2)
    for job in (J1, J2):
        for p, e in {0: E1, 1: E2, 2: E3}.items():
            h.complete(att(1, p, job=job), e)
    h.fail(att(2, 0), E1, FetchFailed(E3, S1, 2, "timed out"))
    h.now = 61.0
    cmds = h.fail(att(2, 0, job=J2), E2, FetchFailed(E3, S1, 2, "timed out"))
    assert not any(isinstance(c, DeclareExecutorLost) for c in cmds)
    alive = h.state.executor(E3)
    assert alive is not None and alive.state is ExecutorState.ALIVE
    progress = h.state.export_job(J2)
    assert progress is not None and progress.excluded == (E3,)
