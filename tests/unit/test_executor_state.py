"""The executor's pure state machine (``executor.state``): events in, exact actions out.

No threads, sockets, files or sleeps: each test plays one story of lives and
tasks and compares the actions with what the shell must do.
"""

from __future__ import annotations

from mangonel.executor.events import (
    CancelRequested,
    CancelStream,
    ClaimHome,
    Completed,
    Connect,
    Connected,
    ConnectFailed,
    DeleteLifeDir,
    DeleteOutputs,
    DrainRequested,
    DrainUndelivered,
    Exit,
    Failed,
    HeartbeatRefused,
    HomeClaimed,
    HomeClaimFailed,
    InterruptTask,
    OutputsReleased,
    QueueTask,
    Register,
    Registered,
    RegistrationFailed,
    ReportCompleted,
    ReportFailed,
    ServiceStarted,
    SlotsClosed,
    SlotTaken,
    StartTask,
    Stop,
    Stopped,
    StopRequested,
    StreamEnded,
    TaskFinished,
    TaskLaunched,
    TellDrain,
    Wait,
    WaitEnded,
)
from mangonel.executor.state import (
    BACKOFF_MAX_S,
    BACKOFF_START_S,
    CancelledQueued,
    CancelledRunning,
    ExecutorMachine,
    LifeState,
    Queued,
    Running,
)
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.task import (
    ExecutionError,
    OutputKind,
    OutputSpec,
    PartitionOutput,
    TaskSpec,
)

E1, E2 = ExecutorId("e1"), ExecutorId("e2")
JOB = JobId("job1")


def att(partition: int, stage: int = 1, n: int = 0) -> TaskAttemptId:
    return TaskAttemptId(TaskId(JOB, StageId(stage), partition), n)


def spec(a: TaskAttemptId) -> TaskSpec:
    return TaskSpec(a, "SELECT 1 AS n", OutputSpec(OutputKind.SINGLE), ("n",))


def outputs(a: TaskAttemptId) -> tuple[PartitionOutput, ...]:
    path = f"/w/e1/shuffle/{JOB}/s{a.task.stage}/m{a.task.partition}-a{a.attempt}-p0.arrow"
    return (PartitionOutput(0, path, 1, 10, "c"),)


def serving(executor: ExecutorId = E1) -> ExecutorMachine:
    """A state whose life ``executor`` is registered, housed and connected."""
    state = ExecutorMachine()
    assert state.handle(ServiceStarted()) == [Register(None)]
    assert state.handle(Registered(executor, resumed=False)) == [ClaimHome(executor)]
    assert state.handle(HomeClaimed(executor)) == [Connect(executor)]
    assert state.handle(Connected(executor)) == []
    assert state.serving == executor
    return state


def launch(state: ExecutorMachine, a: TaskAttemptId, executor: ExecutorId = E1) -> None:
    assert state.handle(TaskLaunched(executor, spec(a))) == [QueueTask(executor, spec(a))]


def start(state: ExecutorMachine, a: TaskAttemptId, slot: int, executor: ExecutorId = E1) -> None:
    launch(state, a, executor)
    assert state.handle(SlotTaken(a, slot)) == [StartTask(executor, a, slot)]


# ----------------------------------------------------------- launch and cancel


def test_a_task_runs_and_is_reported() -> None:
    state = serving()
    start(state, att(0), slot=1)
    assert state.task_state(att(0)) == Running(1) and state.running_tasks == 1
    done = state.handle(TaskFinished(att(0), Completed(outputs(att(0))), 0.5))
    assert done == [ReportCompleted(E1, att(0), outputs(att(0)), 0.5)]
    assert state.task_state(att(0)) is None and state.running_tasks == 0


def test_a_failure_is_reported_typed() -> None:
    state = serving()
    start(state, att(0), slot=0)
    failure = ExecutionError("boom")
    assert state.handle(TaskFinished(att(0), Failed(failure), 0.1)) == [
        ReportFailed(E1, att(0), failure, 0.1)
    ]


def test_cancel_before_start_means_the_task_never_starts() -> None:
    state = serving()
    launch(state, att(0))
    assert state.handle(CancelRequested(E1, att(0))) == []  # nothing runs to interrupt
    assert state.task_state(att(0)) == CancelledQueued()
    assert state.handle(SlotTaken(att(0), 0)) == []  # no StartTask
    assert state.task_state(att(0)) is None and state.running_tasks == 0
    assert state.handle(TaskFinished(att(0), Completed(outputs(att(0))))) == []


def test_cancel_while_running_interrupts_its_slot() -> None:
    state = serving()
    start(state, att(0), slot=1)
    assert state.handle(CancelRequested(E1, att(0))) == [InterruptTask(E1, att(0), 1)]
    assert state.task_state(att(0)) == CancelledRunning(1)
    assert state.handle(CancelRequested(E1, att(0))) == []  # interrupted already
    assert state.running_tasks == 1  # the slot is busy until the task stops
    assert state.handle(TaskFinished(att(0), Stopped())) == []  # stopped: nothing reported
    assert state.running_tasks == 0


def test_a_finish_that_beat_the_cancel_is_still_reported() -> None:
    # The scheduler alone knows whether the attempt still counts; it drops
    # stale reports. An attempt that stopped for the cancel reports nothing.
    state = serving()
    start(state, att(0), slot=0)
    state.handle(CancelRequested(E1, att(0)))
    assert state.handle(TaskFinished(att(0), Completed(outputs(att(0))), 2.0)) == [
        ReportCompleted(E1, att(0), outputs(att(0)), 2.0)
    ]


def test_cancel_of_an_unknown_or_finished_attempt_does_nothing() -> None:
    state = serving()
    assert state.handle(CancelRequested(E1, att(9))) == []
    start(state, att(0), slot=0)
    state.handle(TaskFinished(att(0), Completed(())))
    assert state.handle(CancelRequested(E1, att(0))) == []


def test_a_duplicate_launch_is_ignored() -> None:
    state = serving()
    start(state, att(0), slot=0)
    assert state.handle(TaskLaunched(E1, spec(att(0)))) == []
    assert state.task_state(att(0)) == Running(0)


# ------------------------------------------------------------ release outputs


def test_release_deletes_outputs_and_late_files_of_released_stages() -> None:
    state = serving()
    start(state, att(0, stage=1), slot=0)
    start(state, att(0, stage=2), slot=1)
    assert state.handle(OutputsReleased(E1, JOB, (StageId(1),))) == [
        DeleteOutputs(E1, JOB, (StageId(1),))
    ]
    # Stage 1's attempt committed after the release: its files go when it ends.
    out1 = outputs(att(0, stage=1))
    assert state.handle(TaskFinished(att(0, stage=1), Completed(out1), 1.0)) == [
        ReportCompleted(E1, att(0, stage=1), out1, 1.0),
        DeleteOutputs(E1, JOB, (StageId(1),)),
    ]
    # Stage 2 was not released: its files stay.
    out2 = outputs(att(0, stage=2))
    assert state.handle(TaskFinished(att(0, stage=2), Completed(out2), 1.0)) == [
        ReportCompleted(E1, att(0, stage=2), out2, 1.0)
    ]


def test_a_task_launched_after_its_job_was_released_has_its_files_deleted() -> None:
    state = serving()
    assert state.handle(OutputsReleased(E1, JOB, None)) == [DeleteOutputs(E1, JOB, None)]
    start(state, att(0, stage=3, n=3), slot=0)
    out = outputs(att(0, stage=3, n=3))
    assert state.handle(TaskFinished(att(0, stage=3, n=3), Completed(out), 0.2)) == [
        ReportCompleted(E1, att(0, stage=3, n=3), out, 0.2),
        DeleteOutputs(E1, JOB, (StageId(3),)),
    ]


# -------------------------------------------------------- stream and lives


def test_stream_ended_cancels_every_task_then_asks_to_resume() -> None:
    state = serving()
    start(state, att(0), slot=0)
    launch(state, att(1))
    assert state.handle(StreamEnded(E1)) == [InterruptTask(E1, att(0), 0), Wait(BACKOFF_START_S)]
    assert state.task_state(att(1)) == CancelledQueued()
    assert state.life_state(E1) is LifeState.DETACHED and state.serving is None
    assert state.handle(WaitEnded()) == [Register(E1)]


def test_resume_accepted_keeps_the_life_and_its_files() -> None:
    state = serving()
    start(state, att(0), slot=0)
    state.handle(StreamEnded(E1))
    state.handle(WaitEnded())
    assert state.handle(Registered(E1, resumed=True)) == [Connect(E1)]  # no ClaimHome
    assert state.handle(Connected(E1)) == []
    assert state.serving == E1
    # The cancelled attempt ends: no life ends with it.
    assert state.handle(TaskFinished(att(0), Stopped())) == []
    assert state.life_state(E1) is LifeState.SERVING


def test_resume_refused_deletes_the_old_life_once_its_cancelled_tasks_stopped() -> None:
    state = serving()
    start(state, att(0), slot=0)
    launch(state, att(1))
    state.handle(StreamEnded(E1))
    state.handle(WaitEnded())
    # The scheduler counted e1 as lost: a new life under a new id. The old
    # life's files stay while its interrupted task still runs.
    assert state.handle(Registered(E2, resumed=False)) == [ClaimHome(E2)]
    assert state.life_state(E1) is LifeState.ENDING
    assert state.handle(SlotTaken(att(1), 1)) == []  # cancelled while queued: never starts
    assert state.life_state(E1) is LifeState.ENDING  # att(0) still runs
    assert state.handle(HomeClaimed(E2)) == [Connect(E2)]
    assert state.handle(Connected(E2)) == []
    # Late finish of the old life: reported under e1 (the scheduler drops it),
    # then the old life's directory goes.
    out = outputs(att(0))
    assert state.handle(TaskFinished(att(0), Completed(out), 3.0)) == [
        ReportCompleted(E1, att(0), out, 3.0),
        DeleteLifeDir(E1),
    ]
    assert state.life_state(E1) is None and state.serving == E2


def test_resume_refused_with_nothing_running_deletes_the_old_life_at_once() -> None:
    state = serving()
    state.handle(StreamEnded(E1))
    state.handle(WaitEnded())
    assert state.handle(Registered(E2, resumed=True)) == [DeleteLifeDir(E1), ClaimHome(E2)]


def test_a_refused_registration_backs_off_and_a_new_order_resets_it() -> None:
    state = ExecutorMachine()
    state.handle(ServiceStarted())
    waits = []
    for _ in range(6):
        [wait] = state.handle(RegistrationFailed())
        assert isinstance(wait, Wait)
        waits.append(wait.delay_s)
        assert state.handle(WaitEnded()) == [Register(None)]
    assert waits == [0.1, 0.2, 0.4, 0.8, BACKOFF_MAX_S, BACKOFF_MAX_S]
    state.handle(Registered(E1, resumed=False))
    state.handle(HomeClaimed(E1))
    state.handle(Connected(E1))
    launch(state, att(0))
    assert state.handle(StreamEnded(E1)) == [Wait(BACKOFF_START_S)]


def test_a_failed_connect_keeps_the_life_and_asks_to_resume_it() -> None:
    state = ExecutorMachine()
    state.handle(ServiceStarted())
    state.handle(Registered(E1, resumed=False))
    state.handle(HomeClaimed(E1))
    assert state.handle(ConnectFailed(E1)) == [Wait(BACKOFF_START_S)]
    assert state.handle(WaitEnded()) == [Register(E1)]


def test_a_life_whose_home_cannot_be_claimed_is_given_up() -> None:
    state = ExecutorMachine()
    state.handle(ServiceStarted())
    state.handle(Registered(E1, resumed=False))
    assert state.handle(HomeClaimFailed(E1)) == [Wait(BACKOFF_START_S)]
    assert state.handle(WaitEnded()) == [Register(None)]  # no life to resume
    assert state.life_state(E1) is None


def test_a_refused_heartbeat_ends_the_current_stream_only() -> None:
    state = serving()
    assert state.handle(HeartbeatRefused(E2)) == []
    assert state.handle(HeartbeatRefused(E1)) == [CancelStream(E1)]


# ---------------------------------------------------------------------- drain


def test_drain_tells_the_scheduler_then_exits_when_the_stream_ends() -> None:
    state = serving()
    start(state, att(0), slot=0)
    assert state.handle(DrainRequested()) == [TellDrain(E1)]
    assert state.draining
    # Orders sent before the scheduler saw the drain still run.
    start(state, att(1), slot=1)
    state.handle(TaskFinished(att(1), Completed(()), 0.0))
    state.handle(CancelRequested(E1, att(0)))
    state.handle(TaskFinished(att(0), Stopped()))
    # The scheduler closes the stream: nothing needs us. No new registration.
    assert state.handle(StreamEnded(E1)) == [DeleteLifeDir(E1), Exit()]


def test_a_drained_life_with_a_running_task_goes_when_the_task_stops() -> None:
    state = serving()
    start(state, att(0), slot=0)
    state.handle(DrainRequested())
    assert state.handle(StreamEnded(E1)) == [InterruptTask(E1, att(0), 0), Exit()]
    assert state.handle(TaskFinished(att(0), Stopped())) == [DeleteLifeDir(E1)]


def test_drain_without_a_stream_or_a_reachable_scheduler_stops_at_once() -> None:
    state = ExecutorMachine()
    state.handle(ServiceStarted())
    assert state.handle(DrainRequested()) == [Stop()]
    assert state.handle(StopRequested()) == []
    assert state.handle(RegistrationFailed()) == [Exit()]  # never registers again
    reachable = serving()
    assert reachable.handle(DrainRequested()) == [TellDrain(E1)]
    assert reachable.handle(DrainUndelivered(E1)) == [Stop()]


# ----------------------------------------------------------------------- stop


def test_stop_cancels_tasks_ends_the_stream_and_exits() -> None:
    state = serving()
    start(state, att(0), slot=0)
    launch(state, att(1))
    assert state.handle(StopRequested()) == [InterruptTask(E1, att(0), 0), CancelStream(E1)]
    assert state.task_state(att(1)) == CancelledQueued()
    assert state.handle(StreamEnded(E1)) == [Exit()]
    assert state.handle(SlotsClosed()) == [DeleteLifeDir(E1)]
    assert state.running_tasks == 0


def test_a_stream_opened_after_stop_is_ended_at_once() -> None:
    state = ExecutorMachine()
    state.handle(ServiceStarted())
    state.handle(Registered(E1, resumed=False))
    state.handle(StopRequested())
    assert state.handle(HomeClaimed(E1)) == [Connect(E1)]
    assert state.handle(Connected(E1)) == [CancelStream(E1)]
    assert state.handle(StreamEnded(E1)) == [Exit()]


def test_a_wait_cut_short_by_stop_exits() -> None:
    state = serving()
    state.handle(StreamEnded(E1))
    state.handle(StopRequested())
    assert state.handle(WaitEnded()) == [Exit()]


def test_queued_tasks_stay_queued_until_they_get_a_slot() -> None:
    state = serving()
    launch(state, att(0))
    assert state.task_state(att(0)) == Queued() and state.running_tasks == 0
