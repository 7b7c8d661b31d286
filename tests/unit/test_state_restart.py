"""The state machine across a scheduler restart: stored, restored, executors reattach.

What the shell writes after an event (``export_*``) is encoded to JSON as the
store keeps it (``scheduler.persist``), decoded into a fresh state machine
(``restore``), and ``SchedulerRecovered`` / ``reattach`` (``ExecutorRegistered``
with ``resume``, then ``ExecutorConnected``) take it on.
Commands are compared exactly, as in ``test_state_machine``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from test_state_machine import (
    E1,
    E2,
    E3,
    J1,
    S1,
    Harness,
    att,
    finish_maps,
    launches,
    started,
    three_stage_plan,
)

from mangonel.scheduler.events import (
    Command,
    DeclareExecutorLost,
    ExecutorConnected,
    ExecutorHeartbeat,
    ExecutorRegistered,
    HealthChange,
    JobSucceeded,
    Limits,
    LogExecutorHealth,
    LossReason,
    ResumeExecutor,
    SchedulerRecovered,
    Tick,
)
from mangonel.scheduler.persist import StateWriter, decode, encode
from mangonel.scheduler.state import ExecutorState, JobState, SchedulerState
from mangonel.scheduler.state_executors import RegistrySnapshot
from mangonel.scheduler.state_jobs import FinishedJob, JobProgress, JobRecord
from mangonel.scheduler.state_revival import StoredRevivals
from mangonel.scheduler.store import MemoryStateStore
from mangonel.task import ExecutorInfo, FetchFailed, ReleaseOutputs


def restarted(h: Harness) -> Harness:
    """A new state machine from what ``h``'s state machine stored, JSON and all."""
    old = h.state
    jobs = [
        JobRecord.restore(h.plans[j], decode(encode(old.export_job(j)), JobProgress))
        for j in old.unfinished_jobs()
    ]
    finished = [
        decode(encode(old.export_finished(v.id)), FinishedJob)
        for v in old.jobs()
        if v.state.finished
    ]
    new = Harness()
    new.plans = h.plans
    new.now, new.last_id = h.now, h.last_id
    new.state = SchedulerState(old.limits)
    executors = decode(encode(old.export_executors()), RegistrySnapshot)
    revivals = decode(encode(old.export_revivals()), StoredRevivals)
    new.state.restore(executors, jobs, finished, old.no_executor_since, revivals)
    return new


def info(executor: str) -> ExecutorInfo:
    n = executor[1:]
    return ExecutorInfo(executor, f"h{n}", f"h{n}:50{n}", 4)  # type: ignore[arg-type]


def reattach(
    h: Harness, executor: str, held: frozenset[str], held_jobs: tuple[str, ...] = ()
) -> list[Command]:
    """``executor`` asks to resume its id under a fresh one; when that is accepted,
    its stream opens: the commands of that connection (else of the registration)."""
    same = info(executor)
    fresh = ExecutorInfo(f"fresh-{executor}", same.host, same.flight_address, same.slots)  # type: ignore[arg-type]
    cmds = h.send(ExecutorRegistered, fresh, executor, held, held_jobs)
    if cmds != [ResumeExecutor(h.last_id, executor)]:  # type: ignore[arg-type]
        return cmds
    return h.send(ExecutorConnected, executor)


def held(h: Harness, executor: str, *attempts: object) -> frozenset[str]:
    return frozenset(
        o.path
        for a in attempts
        for o in h.outputs(a, executor)  # type: ignore[arg-type]
    )


def test_a_restored_state_is_the_stored_one() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1})
    r = restarted(h)
    assert r.state.job(J1) == h.state.job(J1)
    assert r.state.executors() == [
        v.__class__(**{**v.__dict__, "last_heartbeat": 0.0, "running": 0})
        for v in h.state.executors()
    ]


def test_after_a_restart_running_attempts_are_pending_and_nothing_launches_until_reattach() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2})
    r = restarted(h)
    r.now = 5.0
    # p2 and p3 of stage 1 were running: given up on, but not charged as failures.
    assert r.send(SchedulerRecovered) == []
    view = r.state.job(J1)
    assert view is not None
    assert (view.stages[0].done, view.stages[0].running, view.stages[0].pending) == (2, 0, 2)
    assert view.stages[0].tasks_rerun == 2
    assert all(v.running == 0 for v in r.state.executors())
    assert r.state.awaits(E1) and r.state.awaits(E2)
    # e1 is back with all it held: p2 and p3 run on it under new attempt numbers.
    cmds = reattach(r, E1, held(h, E1, att(1, 0)))
    assert launches(cmds) == [("e1", "j1/s1/p2/a1"), ("e1", "j1/s1/p3/a1")]
    assert not r.state.awaits(E1)


def test_a_reattached_executor_without_an_output_makes_it_again() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    r = restarted(h)
    r.send(SchedulerRecovered)
    # e2 lost the file of map task 1 while the scheduler was down.
    cmds = reattach(r, E2, held(h, E2, att(1, 3)))
    assert launches(cmds) == [("e2", "j1/s1/p1/a1")]
    view = r.state.job(J1)
    assert view is not None and view.stages[0].outputs_recomputed == 1


def test_an_executor_back_without_an_output_whose_inputs_were_lost_makes_those_too() -> None:
    # e3 did not come back after the restart and was lost; it held a map output
    # that nothing needed then (stage 2 was complete). e1 comes back without
    # stage 2's output 0: that task runs again, and so must the map output on e3
    # it reads, or stage 2 waits for it for ever (``job-progress``).
    h = Harness(Limits(heartbeat_timeout_s=10.0))
    for e in (E1, E2, E3):
        h.register(e, 4)
    h.submit(three_stage_plan(maps=4, reducers=2))
    finish_maps(h, {0: E1, 1: E2, 2: E3, 3: E1})
    h.complete(att(2, 0), E1)
    h.complete(att(2, 1), E2)  # the final task runs on e1
    r = restarted(h)
    r.send(SchedulerRecovered)
    r.now = 5.0
    r.send(ExecutorHeartbeat, E1)
    r.send(ExecutorHeartbeat, E2)
    r.now = 12.0
    assert r.send(Tick) == [DeclareExecutorLost(r.last_id, E3, LossReason.HEARTBEAT_TIMEOUT)]
    cmds = reattach(r, E1, held(h, E1, att(1, 0), att(1, 3)))
    assert launches(cmds) == [("e1", "j1/s1/p2/a1")]
    view = r.state.job(J1)
    assert view is not None
    assert [(s.done, s.running, s.pending) for s in view.stages] == [
        (3, 1, 0),
        (1, 0, 1),
        (0, 0, 1),
    ]
    assert reattach(r, E2, held(h, E2, att(1, 1), att(2, 1))) == []
    assert launches(r.complete(att(1, 2, 1), E1)) == [("e1", "j1/s2/p0/a1")]
    assert launches(r.complete(att(2, 0, 1), E1)) == [("e1", "j1/s3/p0/a1")]
    assert isinstance(r.complete(att(3, 0, 1), E1)[0], JobSucceeded)


def test_an_executor_that_does_not_come_back_is_lost_after_the_heartbeat_timeout() -> None:
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    r = restarted(h)
    r.now = 100.0
    r.send(SchedulerRecovered)
    reattach(r, E1, held(h, E1, att(1, 0), att(1, 2)))
    timeout = r.state.limits.heartbeat_timeout_s
    # e1, back but silent since, is suspected; e2, awaited, only times out.
    suspected = LogExecutorHealth(r.last_id + 1, HealthChange.SUSPECTED, E1)
    assert r.tick(100.0 + timeout - 0.5) == [suspected]
    r.send(ExecutorHeartbeat, E1)  # e1 is back and beating; e2 stays silent
    cmds = r.tick(100.0 + timeout + 0.5)
    assert cmds[0] == DeclareExecutorLost(r.last_id, E2, LossReason.HEARTBEAT_TIMEOUT)
    # e2's map outputs are made again on e1; then the reducers run.
    assert launches(cmds) == [("e1", "j1/s1/p1/a1"), ("e1", "j1/s1/p3/a1")]
    lost = next(v for v in r.state.executors() if v.id == E2)
    assert lost.state is ExecutorState.LOST
    assert "did not reconnect" in lost.detail


def test_an_unknown_or_lost_executor_cannot_reattach() -> None:
    h = started()
    h.lose(E2)
    r = restarted(h)
    r.send(SchedulerRecovered)
    assert not r.state.awaits(E2)
    # A false loss all the same, counted; after a restart nothing it left is
    # known, so it registers anew (``state_revival``).
    why = "lost (connection lost) but alive; it registers anew, its files deleted"
    assert reattach(r, E2, frozenset()) == [
        LogExecutorHealth(r.last_id, HealthChange.CAME_BACK, E2, why)  # type: ignore[arg-type]
    ]
    assert next(v for v in r.state.executors() if v.id == E2).state is ExecutorState.LOST


def test_finished_jobs_survive_and_a_job_finishes_after_the_restart() -> None:
    h = Harness()
    h.register(E1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.complete(att(1, 0), E1)
    h.complete(att(2, 0), E1)
    r = restarted(h)
    r.send(SchedulerRecovered)
    paths = held(h, E1, att(1, 0), att(2, 0))
    assert launches(reattach(r, E1, paths)) == [("e1", "j1/s3/p0/a1")]
    assert r.complete(att(3, 0, 1), E1) == [
        JobSucceeded(r.last_id, J1, (r.loc(att(3, 0, 1), E1, 0),)),
        ReleaseOutputs(r.last_id, E1, J1, (1, 2)),  # type: ignore[arg-type]
    ]
    again = restarted(r)
    view = again.state.job(J1)
    assert view is not None and view.state is JobState.SUCCEEDED


def test_a_job_naming_outputs_of_an_executor_stored_as_lost_makes_them_again() -> None:
    """A state change written in several commits can leave the executors' document
    newer than a job's: recovery re-checks every job against the executors."""
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    stale = encode(h.state.export_job(J1))  # the job as stored before the loss was written
    h.lose(E2)
    r = restarted(h)
    r.state = SchedulerState(h.state.limits)
    executors = decode(encode(h.state.export_executors()), RegistrySnapshot)
    job = JobRecord.restore(h.plans[J1], decode(stale, JobProgress))
    r.state.restore(executors, [job], [], h.state.no_executor_since)
    r.send(SchedulerRecovered)
    view = r.state.job(J1)
    assert view is not None
    # e2's two map outputs are pending again, not trusted on a lost executor.
    assert (view.stages[0].done, view.stages[0].pending) == (2, 2)
    assert view.stages[0].outputs_recomputed == 2
    cmds = reattach(r, E1, held(h, E1, att(1, 0), att(1, 2)))
    assert launches(cmds) == [("e1", "j1/s1/p1/a1"), ("e1", "j1/s1/p3/a1")]


class LimitedStore(MemoryStateStore):
    """The in-memory store with etcd-like limits, counting commits."""

    max_ops = 3

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[tuple[list[str], list[str]]] = []

    def commit(self, puts: Mapping[str, str], deletes: Collection[str] = ()) -> None:
        assert len(puts) + len(deletes) <= self.max_ops, (puts, deletes)
        self.commits.append((sorted(puts), sorted(deletes)))
        super().commit(puts, deletes)


def test_a_meta_document_older_than_the_executors_one_does_not_shorten_the_grace() -> None:
    """``executors`` and ``meta`` are written last, and a change split over several
    commits may end between them: the store then says an executor is alive and
    that none has been since long ago. Recovery trusts the executors (the
    ``no-executor-since`` invariant): the grace starts when the last one is lost."""
    h = Harness(Limits(heartbeat_timeout_s=10.0, no_executor_grace_s=30.0))
    h.register(E1)
    h.lose(E1)  # none alive from t=0
    h.now = 100.0
    h.register(E2)
    h.submit(three_stage_plan(maps=1, reducers=1))
    assert h.state.no_executor_since is None
    r = restarted(h)
    r.state = SchedulerState(h.state.limits)
    executors = decode(encode(h.state.export_executors()), RegistrySnapshot)
    jobs = [JobRecord.restore(h.plans[J1], decode(encode(h.state.export_job(J1)), JobProgress))]
    r.state.restore(executors, jobs, [], 0.0)  # ``meta`` as it was before e2 came
    r.now = 101.0
    r.send(SchedulerRecovered)
    r.now = 112.0
    assert r.send(Tick) == [DeclareExecutorLost(r.last_id, E2, LossReason.HEARTBEAT_TIMEOUT)]
    assert r.state.no_executor_since == 112.0
    r.now = 140.0
    assert r.send(Tick) == []  # 28 s without an executor: the job still waits
    view = r.state.job(J1)
    assert view is not None and not view.state.finished


def test_a_change_larger_than_one_commit_is_written_in_several_scheduler_wide_last() -> None:
    store = LimitedStore()
    store.acquire("test")
    writer = StateWriter(store, {})
    writer.commit({"jobs/a/progress": 1, "jobs/b/progress": 2})
    assert len(store.commits) == 1
    puts: dict[str, object] = {f"jobs/{j}/progress": j for j in "cdefg"}
    puts |= {"executors": "E", "meta": "M", "jobs/a/progress": 1}  # a: unchanged, not written
    writer.commit(puts, ["jobs/b/progress"])
    assert store.commits[1:] == [
        (["jobs/c/progress", "jobs/d/progress", "jobs/e/progress"], []),
        (["jobs/f/progress", "jobs/g/progress"], ["jobs/b/progress"]),
        (["executors", "meta"], []),
    ]
    assert store.load() == {k: encode(v) for k, v in puts.items()}


def test_an_executor_not_back_after_a_restart_is_lost_when_a_reader_cannot_reach_it() -> None:
    # Nothing was heard from e2 since the restart: a reader's failure to reach it is
    # taken as its death at once (not a cut between two live executors, for which
    # one side would only give way for the job), so its outputs are made again.
    h = started()
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    r = restarted(h)
    r.send(SchedulerRecovered)
    cmds = reattach(r, E1, held(h, E1, att(1, 0), att(1, 2)))
    assert launches(cmds) == [("e1", "j1/s2/p0/a1"), ("e1", "j1/s2/p1/a1")]
    cmds = r.fail(att(2, 0, 1), E1, FetchFailed(E2, S1, 1, "connection refused"))
    assert cmds[0] == DeclareExecutorLost(r.last_id, E2, LossReason.FETCH_FAILURES)
    # e2's map outputs are made again on e1 (the other reader was reading them too).
    assert ("e1", "j1/s1/p1/a1") in launches(cmds) and ("e1", "j1/s1/p3/a1") in launches(cmds)
    lost = next(v for v in r.state.executors() if v.id == E2)
    assert lost.state is ExecutorState.LOST and "not back since" in lost.detail
