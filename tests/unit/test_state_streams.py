"""An executor's command stream moved to a new connection (``scheduler.state_streams``)
and the executor's side of it (``executor.state``: ``LinkRecovered``, ``MoveStream``), and how a
lagging executor and its moves are shown (``web.views.executor_model``, ``mangonel status``).

Same style as ``test_state_machine.py``: hand-built events, every invariant
checked after each (``Harness.send``).
"""

from __future__ import annotations

import time

from test_state_liveness import beats_counting, health, two_running
from test_state_machine import (
    E1,
    E2,
    J1,
    J2,
    S1,
    S2,
    Harness,
    att,
    launches,
    started,
    three_stage_plan,
)

from mangonel.client.cli_commands import _why
from mangonel.client.status import executor_from_proto
from mangonel.executor import events as ex
from mangonel.executor.state import REMEMBER_FINISHED, ExecutorMachine
from mangonel.ids import ExecutorId
from mangonel.scheduler.events import (
    Command,
    DeclareExecutorLost,
    ExecutorDraining,
    ExecutorLost,
    ExecutorStreamReopened,
    HealthChange,
    LogExecutorHealth,
    LossReason,
    RefuseStream,
    ResultRead,
)
from mangonel.scheduler.registry import ExecutorListing
from mangonel.scheduler.service_status import executor_status
from mangonel.scheduler.state import JobState
from mangonel.scheduler.state_stages import PENDING
from mangonel.task import (
    CancelTask,
    FetchFailed,
    FetchProblem,
    OutputKind,
    OutputSpec,
    PartitionOutput,
    ReleaseOutputs,
    TaskSpec,
)
from mangonel.web.views import executor_model


def moved(cmds: list[object]) -> list[LogExecutorHealth]:
    return [
        c
        for c in cmds
        if isinstance(c, LogExecutorHealth) and c.change is HealthChange.STREAM_MOVED
    ]


def test_a_moved_stream_gets_again_the_launches_the_executor_never_had() -> None:
    # e2 runs p1 and p3 (as the scheduler counts); the launch of p3 was lost in
    # the cut, and the executor holds an attempt of p5 whose cancel was lost too.
    h = two_running()
    stray = att(1, 5)
    cmds = h.send(ExecutorStreamReopened, E2, frozenset({att(1, 1), stray}), frozenset())
    assert launches(cmds) == [("e2", "j1/s1/p3/a0")]  # the same attempt: it runs once
    assert [(c.executor, str(c.attempt)) for c in cmds if isinstance(c, CancelTask)] == [
        ("e2", "j1/s1/p5/a0")
    ]
    [log] = moved(cmds)
    assert log.executor == E2 and "1 launch(es) sent again" in log.detail
    assert not any(isinstance(c, DeclareExecutorLost | RefuseStream) for c in cmds)
    # Nothing changed hands: e2 still runs both, no attempt was charged.
    assert h.state._executors.live(E2).running == {att(1, 1), att(1, 3)}
    assert h.state._executors.live(E2).streams_moved == 1


def test_a_draining_executor_gets_no_launch_again_its_lost_launch_goes_elsewhere() -> None:
    # e2 drains, then its stream moves: p3's launch never reached it. A draining
    # executor starts nothing new, so p3 goes back to pending, uncharged, and
    # runs on e1 once a slot is free there (found by the simulation, seed 1000058;
    # as on an excluded, unhealthy or slow-link-marked executor: seed 1001733).
    h = two_running()
    h.send(ExecutorDraining, E2)
    cmds = h.send(ExecutorStreamReopened, E2, frozenset({att(1, 1)}), frozenset())
    assert launches(cmds) == [] and len(moved(cmds)) == 1
    assert "0 launch(es) sent again, 1 taken back" in moved(cmds)[0].detail
    assert J1 in h.state.touched_jobs()  # no command names it: the store must see it
    assert h.state._executors.live(E2).running == {att(1, 1)}
    task = h.state._jobs[J1].task(att(1, 3).task)
    assert task is not None and task.failures == 0 and task.state == PENDING
    assert launches(h.complete(att(1, 0), E1)) == [("e1", "j1/s1/p3/a1")]


def test_a_lost_launch_is_not_sent_again_while_an_input_of_its_stage_is_made_again() -> None:
    # Both reducers run, one on each executor; e2's launch was lost in a cut.
    # Meanwhile e1's reducer found map p1's file (on e2) corrupt: p1 is made
    # again. A launch sent again is written anew, with the outputs there are:
    # it would name three of the four maps, and the reducer would read too
    # little (simulation seed 1004598: a job succeeded with a wrong answer).
    # It goes back to pending instead, uncharged, and runs once p1 is back.
    h = started(maps=4, reducers=2, slots=2)
    for p, executor in ((0, E1), (1, E2), (2, E1)):
        h.complete(att(1, p), executor)
    reducers = launches(h.complete(att(1, 3), E2))
    assert sorted(reducers) == [("e1", "j1/s2/p0/a0"), ("e2", "j1/s2/p1/a0")]
    lost = FetchFailed(E2, S1, 1, "checksum mismatch", FetchProblem.OUTPUT_LOST)
    assert launches(h.fail(att(2, 0), E1, lost)) == [("e1", "j1/s1/p1/a1")]
    cmds = h.send(ExecutorStreamReopened, E2, frozenset(), frozenset())
    assert launches(cmds) == [] and len(moved(cmds)) == 1
    task = h.state._jobs[J1].task(att(2, 1).task)
    assert task is not None and task.failures == 0 and task.state == PENDING
    relaunched = launches(h.complete(att(1, 1, 1), E1))
    assert sorted(relaunched) == [("e1", "j1/s2/p0/a1"), ("e2", "j1/s2/p1/a1")]


def test_an_attempt_finished_on_its_way_to_being_reported_is_not_launched_again() -> None:
    h = two_running()
    cmds = h.send(ExecutorStreamReopened, E2, frozenset({att(1, 1)}), frozenset({att(1, 3)}))
    assert launches(cmds) == [] and len(moved(cmds)) == 1
    h.complete(att(1, 3), E2)  # the report arrives after the move: counted once
    assert att(1, 3) not in h.state._executors.live(E2).running


def test_the_old_streams_end_is_no_loss_the_new_ones_is() -> None:
    h = two_running()
    first = h.last_id - 1  # ExecutorConnected of e2 (two_running's last event is the submit)
    assert h.state._executors.live(E2).stream == first
    h.send(ExecutorStreamReopened, E2, frozenset({att(1, 1), att(1, 3)}), frozenset())
    second = h.last_id
    old_end = h.send(ExecutorLost, E2, LossReason.CONNECTION_LOST, "broke", first)
    assert old_end == [] and h.state.executor(E2).reason is None
    new_end = h.send(ExecutorLost, E2, LossReason.CONNECTION_LOST, "broke", second)
    assert [c.executor for c in new_end if isinstance(c, DeclareExecutorLost)] == [E2]
    # And a reopen from the lost executor is refused: it registers again.
    again = h.send(ExecutorStreamReopened, E2, frozenset(), frozenset())
    assert again == [RefuseStream(h.last_id, E2)]


def releases(cmds: list[Command]) -> list[ReleaseOutputs]:
    return [c for c in cmds if isinstance(c, ReleaseOutputs)]


def _j1_succeeded() -> Harness:
    """``started``'s j1 run to success (its final task on e1; e2 ran maps and a
    reducer), the result unread; j2 submitted after it, running."""
    h = started()
    for p, executor in {0: E1, 1: E2, 2: E1, 3: E2}.items():
        h.complete(att(1, p), executor)
    h.complete(att(2, 0), E1)
    h.complete(att(2, 1), E2)
    done = h.complete(att(3, 0), E1)
    assert ReleaseOutputs(h.last_id, E2, J1, (S1, S2)) in done  # to be lost in the cut
    assert h.state.job(J1).state is JobState.SUCCEEDED
    assert launches(h.submit(three_stage_plan(), J2))
    return h


def test_a_moved_stream_releases_the_files_of_a_job_that_ended_in_the_cut() -> None:
    # e2's link is cut while j1 ends and its result is read: both releases of
    # j1 are lost. Its stream moves, naming j1 and the running j2 among its
    # files: j1's are released, j2's are not (released with j2).
    h = _j1_succeeded()
    read = h.send(ResultRead, J1)
    assert ReleaseOutputs(h.last_id, E2, J1, None) in read  # lost too
    holding = frozenset(h.state._executors.live(E2).running)  # j2's, none lost
    cmds = h.send(ExecutorStreamReopened, E2, holding, frozenset(), (J1, J2))
    assert releases(cmds) == [ReleaseOutputs(h.last_id, E2, J1, None)] and not launches(cmds)
    [log] = moved(cmds)
    assert "1 ended job(s)' files released" in log.detail
    # Both jobs' documents are written again, j2's though no command names it:
    # it counts e2 among the executors that ran it (its end reaches e2).
    assert h.state.touched_jobs() == [J1, J2]
    # Nothing named, nothing released.
    assert releases(h.send(ExecutorStreamReopened, E2, frozenset(), frozenset())) == []


def test_a_moved_stream_keeps_the_final_stage_of_an_unread_result() -> None:
    # j1 succeeded, its result not read yet: only the stages before the final
    # one are released (the final one may hold the result); reading it then
    # releases the whole job on e2 too.
    h = _j1_succeeded()
    cmds = h.send(ExecutorStreamReopened, E2, frozenset(), frozenset(), (J1,))
    assert releases(cmds) == [ReleaseOutputs(h.last_id, E2, J1, (S1, S2))]
    read = h.send(ResultRead, J1)
    assert ReleaseOutputs(h.last_id, E2, J1, None) in releases(read)


def test_a_moved_stream_is_counted_in_what_the_store_keeps() -> None:
    # The store's copy of the executors (a cached snapshot) is made again: the
    # move changed the stream and its count (``Harness.send`` validates the
    # cache against the registry).
    h = two_running()
    before = h.state.export_executors()
    h.send(ExecutorStreamReopened, E2, frozenset({att(1, 1), att(1, 3)}), frozenset())
    after = h.state.export_executors()
    assert after is not before
    assert [r.streams_moved for r in after.live if r.id == E2] == [1]


def test_a_reopen_from_an_unknown_executor_is_refused() -> None:
    h = two_running()
    stranger = ExecutorId("e9")
    assert h.send(ExecutorStreamReopened, stranger, frozenset(), frozenset()) == [
        RefuseStream(h.last_id, stranger)
    ]
    assert h.state.executor(E1).reason is None


# ------------------------------------------------------------ the executor's side


def _spec(partition: int) -> TaskSpec:
    return TaskSpec(att(1, partition), "SELECT 1 AS n", OutputSpec(OutputKind.SINGLE), ("n",))


def _serving(executor: ExecutorId) -> ExecutorMachine:
    state = ExecutorMachine()
    state.handle(ex.ServiceStarted())
    state.handle(ex.Registered(executor, resumed=False))
    state.handle(ex.HomeClaimed(executor))
    state.handle(ex.Connected(executor))
    assert state.serving == executor
    return state


def test_the_executor_moves_its_stream_when_its_link_is_back_and_runs_a_resent_launch_once() -> (
    None
):
    state = _serving(E1)
    for p in (0, 1, 2):
        assert state.handle(ex.TaskLaunched(E1, _spec(p))) == [ex.QueueTask(E1, _spec(p))]
    state.handle(ex.SlotTaken(att(1, 0), 0))
    state.handle(ex.SlotTaken(att(1, 1), 1))
    done = (PartitionOutput(0, "/w/x.arrow", 1, 10, "c"),)
    state.handle(ex.TaskFinished(att(1, 0), ex.Completed(done), 0.1))
    state.handle(ex.CancelRequested(E1, att(1, 2)))  # queued, cancelled: not held
    assert state.handle(ex.LinkRecovered(E1)) == [
        ex.MoveStream(E1, frozenset({att(1, 1)}), frozenset({att(1, 0)}))
    ]
    # Launches sent again on the new stream: the finished one and the running
    # one are not run a second time.
    assert state.handle(ex.TaskLaunched(E1, _spec(0))) == []
    assert state.handle(ex.TaskLaunched(E1, _spec(1))) == []
    # Not serving that life (another life's, or none): no move.
    assert state.handle(ex.LinkRecovered(E2)) == []


def test_the_executor_remembers_a_bounded_number_of_finished_attempts() -> None:
    state = _serving(E1)
    for p in range(REMEMBER_FINISHED + 1):
        state.handle(ex.TaskLaunched(E1, _spec(p)))
        state.handle(ex.SlotTaken(att(1, p), 0))
        state.handle(ex.TaskFinished(att(1, p), ex.Stopped(), 0.0))
    [move] = state.handle(ex.LinkRecovered(E1))
    assert isinstance(move, ex.MoveStream)
    assert len(move.finished) == REMEMBER_FINISHED and att(1, 0) not in move.finished


def _status_why(h: Harness, executor: ExecutorId) -> str:
    """What ``mangonel status`` says of ``executor`` (its "why" column)."""
    listing = ExecutorListing(h.state.executor(executor))
    return _why(executor_from_proto(executor_status(listing, now=h.now)))


def test_a_lagging_executor_is_shown_lagging_and_its_moved_stream_ends_the_lag() -> None:
    # e2's launches of p1 and p3 never arrived (its heartbeats count none):
    # it lags, which the REST model, the UI's table and ``mangonel status``
    # show; its link comes
    # back, its stream moves, both launches go again, and once its heartbeats
    # count them it is caught up, its moves counted.
    h = two_running()
    h.complete(att(1, 0), E1)
    beats_counting(h, 3.0, lambda e, t: 1 if e == E1 else 0)
    lagging = executor_model(ExecutorListing(h.state.executor(E2)), 0, h.now)
    assert lagging.lagging_since is not None and lagging.streams_moved == 0
    since = time.strftime("%H:%M:%S", time.localtime(lagging.lagging_since))
    assert _status_why(h, E2) == (
        f"lagging since {since}: its commands are held up (a cut link's retries?), "
        "no new task, its tasks copied"
    )
    assert "lagging" not in _status_why(h, E1)
    assert executor_model(ExecutorListing(h.state.executor(E1)), 0, h.now).lagging_since is None
    cmds = h.send(ExecutorStreamReopened, E2, frozenset(), frozenset())
    assert sorted(launches(cmds)) == [("e2", "j1/s1/p1/a0"), ("e2", "j1/s1/p3/a0")]
    after = beats_counting(h, 3.5, lambda e, t: 1 if e == E1 else 2)
    assert [e for _, e in health(after, HealthChange.CAUGHT_UP)] == [E2]
    caught_up = executor_model(ExecutorListing(h.state.executor(E2)), 0, h.now)
    assert caught_up.lagging_since is None and caught_up.streams_moved == 1
    assert "lagging" not in _status_why(h, E2)
