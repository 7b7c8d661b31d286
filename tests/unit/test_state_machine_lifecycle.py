"""The decisions the I/O shell used to make, now the state machine's, with exact commands.

Executors resuming their id after a scheduler restart, connecting (or not),
draining while they serve an unread result; results read or expired; jobs
cancelled or forgotten. Same style as ``test_state_machine.py`` (whose
``Harness`` and plans it reuses): hand-built events in, exact commands out, no
threads and no sleeps.
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
    started,
    three_stage_plan,
)
from test_state_restart import held, info, restarted

from mangonel.ids import ExecutorId, JobId
from mangonel.scheduler.events import (
    CancelRequested,
    DeclareExecutorLost,
    ExecutorConnected,
    ExecutorDraining,
    ExecutorHeartbeat,
    ExecutorRegistered,
    ForgetJob,
    HealthChange,
    JobCancelled,
    JobFailed,
    JobSucceeded,
    Limits,
    LogExecutorHealth,
    LossReason,
    RefuseStream,
    ResultRead,
    ResumeExecutor,
    SchedulerRecovered,
    Tick,
)
from mangonel.scheduler.state import ExecutorState, JobState
from mangonel.task import CancelTask, ExecutionError, ExecutorInfo, ReleaseOutputs

FRESH = ExecutorId("fresh")


def fresh(executor: ExecutorId) -> ExecutorInfo:
    """What ``executor``'s process registers with: its host, a fresh id."""
    return ExecutorInfo(FRESH, *(lambda i: (i.host, i.flight_address, i.slots))(info(executor)))


def state_of(h: Harness, executor: ExecutorId) -> ExecutorState | None:
    view = h.state.executor(executor)
    return view.state if view is not None else None


def succeeded_on_e1() -> Harness:
    """j1 (one task a stage) ran on e1 alone and succeeded; its result is unread."""
    h = Harness()
    h.register(E1, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.complete(att(1, 0), E1)
    h.complete(att(2, 0), E1)
    assert isinstance(h.complete(att(3, 0), E1)[0], JobSucceeded)
    return h


# ------------------------------------------------------------------- connecting


def test_a_registered_executor_takes_tasks_only_once_its_stream_opens() -> None:
    h = Harness()
    h.submit(three_stage_plan(maps=1))
    assert h.send(ExecutorRegistered, info(E1)) == []
    assert state_of(h, E1) is ExecutorState.CONNECTING
    assert launches(h.send(ExecutorConnected, E1)) == [("e1", "j1/s1/p0/a0")]
    assert state_of(h, E1) is ExecutorState.ALIVE
    assert h.send(ExecutorConnected, E1) == [RefuseStream(h.last_id, E1)]  # a second stream
    assert h.send(ExecutorConnected, E2) == [RefuseStream(h.last_id, E2)]  # unknown


def test_a_registration_that_never_connects_is_written_off_after_the_connect_timeout() -> None:
    h = Harness(Limits(connect_timeout_s=60.0))
    h.send(ExecutorRegistered, info(E1))
    h.now = 30.0
    h.send(ExecutorHeartbeat, E1)  # it is heard from: the timeout starts again
    assert h.tick(89.0) == []
    assert h.tick(91.0) == [DeclareExecutorLost(h.last_id, E1, LossReason.CONNECTION_LOST)]
    view = h.state.executor(E1)
    assert view is not None and view.state is ExecutorState.LOST
    assert view.detail == "registered but opened no command stream in 60 s"
    assert h.send(ExecutorConnected, E1) == [RefuseStream(h.last_id, E1)]


# ---------------------------------------------------------------------- resume


def test_an_awaited_executor_resumes_its_id_with_the_outputs_it_held() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    r = restarted(h)
    r.send(SchedulerRecovered)
    # e2 kept map 3's file but lost map 1's while the scheduler was down.
    kept = held(h, E2, att(1, 3))
    assert r.send(ExecutorRegistered, fresh(E2), E2, kept, (J1,)) == [ResumeExecutor(r.last_id, E2)]
    assert r.state.executor(FRESH) is None  # the fresh id was not used
    assert r.state.awaits(E2)  # no task before its stream opens
    # Back with map 3's file: only map 1 is made again, on e2 itself.
    assert launches(r.send(ExecutorConnected, E2)) == [("e2", "j1/s1/p1/a1")]
    assert not r.state.awaits(E2)
    view = r.state.job(J1)
    assert view is not None and view.stages[0].outputs_recomputed == 1


def test_a_resume_that_is_not_awaited_is_a_new_executor_under_the_fresh_id() -> None:
    h = started()
    h.lose(E2)
    r = restarted(h)
    r.send(SchedulerRecovered)
    # Logged as a false loss; after a restart nothing it left is known (``state_revival``).
    why = "lost (connection lost) but alive; it registers anew, its files deleted"
    assert r.send(ExecutorRegistered, fresh(E2), E2, frozenset(), (J1,)) == [
        LogExecutorHealth(r.last_id, HealthChange.CAME_BACK, E2, why)
    ]
    assert state_of(r, E2) is ExecutorState.LOST
    assert state_of(r, FRESH) is ExecutorState.CONNECTING
    assert r.send(ExecutorConnected, E2) == [RefuseStream(r.last_id, E2)]
    # The fresh executor takes the tasks that were running when the scheduler died.
    assert {e for e, _ in launches(r.send(ExecutorConnected, FRESH))} == {"fresh"}
    assert state_of(r, FRESH) is ExecutorState.ALIVE
    # Without a restart nobody is awaited: a resume is a new executor too.
    h2 = Harness()
    h2.register(E1)
    assert h2.send(ExecutorRegistered, fresh(E1), E1, frozenset(), ()) == []
    assert state_of(h2, FRESH) is ExecutorState.CONNECTING


def test_a_resumed_executor_releases_the_files_of_jobs_that_ended_while_it_was_away() -> None:
    h = Harness()
    h.register(E1, 2)
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=2, reducers=1))  # map 0 on e1, map 1 on e2
    h.submit(three_stage_plan(maps=2, reducers=1), J2)  # the same spread
    finish_maps(h, {0: E1, 1: E2})
    r = restarted(h)
    r.send(SchedulerRecovered)
    r.send(ExecutorRegistered, fresh(E1), E1, held(h, E1, att(1, 0)), (J1, J2))
    r.send(ExecutorConnected, E1)
    # While e2 is away: j1 succeeds on e1 (its result unread), j2 is cancelled.
    r.complete(att(2, 0, 1), E1)
    assert isinstance(r.complete(att(3, 0), E1)[0], JobSucceeded)
    assert any(isinstance(c, JobCancelled) for c in r.send(CancelRequested, J2))
    gone = JobId("forgotten")
    paths = held(h, E2, att(1, 1))
    r.send(ExecutorRegistered, fresh(E2), E2, paths, (J1, J2, gone))
    assert r.send(ExecutorConnected, E2) == [
        ReleaseOutputs(r.last_id, E2, J1, (S1, S2)),  # the result's stage stays
        ReleaseOutputs(r.last_id, E2, J2, None),
        ReleaseOutputs(r.last_id, E2, gone, None),
    ]
    # Reading j1's result releases it on e2 too (a stray final attempt may be there).
    assert r.send(ResultRead, J1) == [
        ReleaseOutputs(r.last_id, E1, J1, None),
        ReleaseOutputs(r.last_id, E2, J1, None),
    ]


# ---------------------------------------------------------------------- results


def test_reading_a_result_releases_it_on_every_executor_that_ran_the_job() -> None:
    h = Harness()
    h.register(E1, 1)
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=1, reducers=1), J2)  # takes e1's only slot
    assert launches(h.submit(three_stage_plan(maps=1, reducers=1))) == [("e2", "j1/s1/p0/a0")]
    h.complete(att(1, 0), E2)
    assert launches(h.complete(att(2, 0), E2)) == [("e2", "j1/s3/p0/a0")]
    h.send(CancelRequested, J2)  # e1 is free again
    # The final attempt fails on e2 and runs again on e1: e2 keeps its files.
    cmds = h.fail(att(3, 0), E2, ExecutionError("out of memory"))
    assert launches(cmds) == [("e1", "j1/s3/p0/a1")]
    assert h.complete(att(3, 0, 1), E1) == [
        JobSucceeded(h.last_id, J1, (h.loc(att(3, 0, 1), E1, 0),)),
        ReleaseOutputs(h.last_id, E1, J1, (S1, S2)),
        ReleaseOutputs(h.last_id, E2, J1, (S1, S2)),
    ]
    assert h.send(ResultRead, J1) == [
        ReleaseOutputs(h.last_id, E1, J1, None),
        ReleaseOutputs(h.last_id, E2, J1, None),  # the superseded final attempt's files
    ]
    assert h.send(ResultRead, J1) == []  # twice is harmless
    assert h.send(ResultRead, J2) == []  # a cancelled job has no result to read


def test_an_unread_result_expires_on_the_first_tick_after_its_time_to_live() -> None:
    h = Harness(Limits(result_ttl_s=100.0, heartbeat_timeout_s=1e9, suspect_phi=math.inf))
    h.register(E1, 1)
    h.now = 10.0
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.complete(att(1, 0), E1)
    h.complete(att(2, 0), E1)
    h.complete(att(3, 0), E1)  # succeeded at 10.0
    assert h.tick(110.0) == []
    assert h.tick(110.5) == [ReleaseOutputs(h.last_id, E1, J1, None)]
    assert h.tick(500.0) == []
    assert h.send(ResultRead, J1) == []  # the client came too late: nothing left


def test_a_read_result_does_not_expire() -> None:
    h = succeeded_on_e1()
    assert h.send(ResultRead, J1) == [ReleaseOutputs(h.last_id, E1, J1, None)]
    h.send(ExecutorHeartbeat, E1)
    h.now = h.state.limits.result_ttl_s + 1.0
    h.send(ExecutorHeartbeat, E1)
    assert h.tick(h.now) == []


# ----------------------------------------------------------------------- drains


def test_a_drained_executor_keeps_its_stream_until_its_result_is_read() -> None:
    h = succeeded_on_e1()
    h.register(E2, 1)
    assert h.send(ExecutorDraining, E1) == []  # it serves j1's result
    view = h.state.executor(E1)
    assert view is not None and view.state is ExecutorState.DRAINING
    assert view.detail == "drained; it serves results not read yet"
    assert h.send(ExecutorHeartbeat, E1) == []
    assert h.send(ResultRead, J1) == [
        ReleaseOutputs(h.last_id, E1, J1, None),
        DeclareExecutorLost(h.last_id, E1, LossReason.DRAINED),
    ]
    view = h.state.executor(E1)
    assert view is not None and (view.state, view.reason) == (
        ExecutorState.LOST,
        LossReason.DRAINED,
    )


def test_a_drained_executor_is_let_go_when_its_unread_result_expires() -> None:
    h = succeeded_on_e1()
    h.send(ExecutorDraining, E1)
    h.send(ExecutorHeartbeat, E1)
    ttl = h.state.limits.result_ttl_s
    h.now = ttl  # heartbeats keep it alive meanwhile
    h.send(ExecutorHeartbeat, E1)
    assert h.tick(ttl + 1.0) == [
        ReleaseOutputs(h.last_id, E1, J1, None),
        DeclareExecutorLost(h.last_id, E1, LossReason.DRAINED),
    ]


def test_a_draining_executor_whose_stream_closes_is_drained_not_broken() -> None:
    h = succeeded_on_e1()
    h.send(ExecutorDraining, E1)
    assert h.lose(E1) == []
    view = h.state.executor(E1)
    assert view is not None and view.reason is LossReason.DRAINED


# ----------------------------------------------------------------------- cancel


def test_cancel_ends_the_job_as_cancelled_and_a_cancel_after_success_does_nothing() -> None:
    h = started(maps=2, reducers=1)
    h.complete(att(1, 1), E2)
    assert h.send(CancelRequested, J1, "cancelled by the user") == [
        CancelTask(h.last_id, E1, att(1, 0)),
        JobCancelled(h.last_id, J1, "cancelled by the user"),
        ReleaseOutputs(h.last_id, E1, J1, None),
        ReleaseOutputs(h.last_id, E2, J1, None),
    ]
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.CANCELLED
    assert h.send(CancelRequested, J1) == []  # once is enough

    done = succeeded_on_e1()
    assert done.send(CancelRequested, J1) == []
    view = done.state.job(J1)
    assert view is not None and view.state is JobState.SUCCEEDED
    assert done.send(ResultRead, J1) == [ReleaseOutputs(done.last_id, E1, J1, None)]


# ---------------------------------------------------------------------- forget


def test_a_job_is_kept_until_its_client_had_time_to_hear_how_it_ended() -> None:
    """Beyond the bound, a settled job is forgotten only once it ended
    ``keep_finished_s`` ago, never in the event that ended it: a scheduler that
    died before that event's commands went out came back without the job, and its
    client asked about a job the scheduler did not know (whole-cluster simulation,
    seed 6000394)."""
    h = Harness(keep_finished_jobs=1, keep_finished_s=10.0)
    for n in range(1, 4):
        job = JobId(f"j{n}")
        h.now = float(n)
        h.submit(three_stage_plan(maps=1), job)
        assert not any(isinstance(c, ForgetJob) for c in h.send(CancelRequested, job))
    assert [v.id for v in h.state.jobs()] == ["j1", "j2", "j3"]
    h.now = 12.5  # j1 and j2 ended 10 s ago or more, j3 not yet: one of the two is kept
    assert [c for c in h.send(Tick) if isinstance(c, ForgetJob)] == [
        ForgetJob(h.last_id, JobId("j1"))
    ]
    assert [v.id for v in h.state.jobs()] == ["j2", "j3"]


def test_settled_jobs_beyond_the_bound_are_forgotten_but_an_unread_result_is_kept() -> None:
    h = Harness(keep_finished_jobs=1, keep_finished_s=0.0)
    h.register(E3, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.complete(att(1, 0), E3)
    h.complete(att(2, 0), E3)
    h.complete(att(3, 0), E3)  # j1 succeeded, unread
    for n in range(2, 4):
        job = JobId(f"j{n}")
        h.submit(three_stage_plan(maps=1), job)
        cmds = h.send(CancelRequested, job)
        forgets = [c for c in cmds if isinstance(c, ForgetJob)]
        assert forgets == ([ForgetJob(h.last_id, JobId("j2"))] if n == 3 else [])
    assert h.state.job(J1) is not None  # its result is still out there
    cmds = h.send(ResultRead, J1)
    assert cmds == [ReleaseOutputs(h.last_id, E3, J1, None), ForgetJob(h.last_id, J1)]
    assert [v.id for v in h.state.jobs()] == ["j3"]
    assert not any(isinstance(c, JobFailed) for c in cmds)
