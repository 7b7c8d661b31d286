"""The scheduler's I/O shell (``SchedulerCore``) around a scripted state machine.

No processes and no network: the fake state machine records the events it gets
and answers with the commands a test queues, so each shell duty is checked alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mangonel.errors import JobCancelledError, MangonelError
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.plan import planner as planner_module
from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.scheduler import service as service_module
from mangonel.scheduler.core import CoreConfig, SchedulerCore
from mangonel.scheduler.events import (
    Command,
    DeclareExecutorLost,
    Event,
    ExecutorLost,
    ExecutorRegistered,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    LossReason,
    TaskCompleted,
)
from mangonel.scheduler.jobs import JobPhase
from mangonel.scheduler.registry import CLOSE, ExecutorEntry, ExecutorPhase
from mangonel.scheduler.state_executors import RegistrySnapshot
from mangonel.scheduler.state_views import ExecutorState as ExecutorStateView
from mangonel.scheduler.state_views import ExecutorView, JobState, JobView, StageView
from mangonel.task import (
    LaunchTask,
    OutputKind,
    OutputSpec,
    PartitionLocation,
    PartitionOutput,
    ReleaseOutputs,
    TaskSpec,
)

PLAN = DistributedPlan(
    stages=(Stage(StageId(1), "SELECT 1 AS x", OutputSpec(OutputKind.SINGLE), 1, ("x",)),),
    columns=("x",),
)


class ScriptedState:
    """Records events; answers each with the commands queued in ``next``.

    Its views are whatever a test puts in ``job_views`` / ``executor_views``.
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.next: list[Command] = []
        self.job_views: dict[JobId, JobView] = {}
        self.executor_views: list[ExecutorView] = []

    def handle(self, event: Event) -> list[Command]:
        self.events.append(event)
        out, self.next = self.next, []
        return out

    def job(self, job_id: JobId) -> JobView | None:
        return self.job_views.get(job_id)

    def executors(self) -> list[ExecutorView]:
        return list(self.executor_views)

    # Persistence: the shell writes what these return to its (in-memory) store.
    def awaits(self, executor: ExecutorId) -> bool:
        return False

    def unfinished_jobs(self) -> list[JobId]:
        return [j for j, v in self.job_views.items() if not v.state.finished]

    def export_job(self, job_id: JobId) -> None:
        return None

    def export_executors(self) -> RegistrySnapshot:
        return RegistrySnapshot([], [], 0)

    @property
    def no_executor_since(self) -> float | None:
        return None

    def restore(self, *args: object) -> None:
        raise NotImplementedError("a scripted state is never restored")


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> tuple[SchedulerCore, ScriptedState]:
    monkeypatch.setattr(planner_module, "plan_query", lambda *args: PLAN)
    state = ScriptedState()
    return SchedulerCore(state), state


def _drain(queue: object) -> list[object]:
    items = []
    while not queue.empty():  # type: ignore[attr-defined]
        items.append(queue.get())  # type: ignore[attr-defined]
    return items


def _attempt(job: str) -> TaskAttemptId:
    return TaskAttemptId(TaskId(JobId(job), StageId(1), 0), 0)


def test_event_ids_increase_and_registration_waits_for_the_stream(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = core.register_executor("h", "127.0.0.1:1", 2, pid=42)
    assert entry.phase is ExecutorPhase.CONNECTING
    assert state.events == []  # not schedulable before its Connect stream opens
    core.executor_connected(entry.id)
    core.heartbeat(entry.id)
    assert isinstance(state.events[0], ExecutorRegistered)
    assert [e.event_id for e in state.events] == sorted({e.event_id for e in state.events})
    with pytest.raises(MangonelError):
        core.executor_connected(entry.id)  # a second stream is refused


def test_launch_goes_to_the_executor_queue_and_completion_finishes_the_job(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = core.register_executor("h", "127.0.0.1:1", 1)
    core.executor_connected(entry.id)
    record = core.submit("SELECT 1")
    assert isinstance(state.events[-1], JobSubmitted)
    attempt = TaskAttemptId(TaskId(record.id, StageId(1), 0), 0)
    spec = TaskSpec(attempt, "SELECT 1 AS x", OutputSpec(OutputKind.SINGLE), ("x",))
    state.next = [LaunchTask(99, entry.id, spec)]
    core.heartbeat(entry.id)
    assert [c.task.attempt for c in _drain(entry.commands)] == [attempt]  # type: ignore[attr-defined]

    out = PartitionOutput(0, "/w/p0", 1, 10, "c")
    loc = PartitionLocation(entry.id, "h", "127.0.0.1:1", StageId(1), 0, 0, "/w/p0", 1, 10, "c")
    state.next = [JobSucceeded(100, record.id, (loc,))]
    core.report_completed(attempt, entry.id, (out,))
    assert isinstance(state.events[-1], TaskCompleted)
    assert record.phase is JobPhase.SUCCEEDED and record.result == (loc,)
    assert record.executors == {entry.id}

    core.release_result(record.id)
    released = _drain(entry.commands)
    # Everything left of the job goes: the result and any stray attempt's files.
    assert released == [ReleaseOutputs(released[0].cause, entry.id, record.id, None)]  # type: ignore[attr-defined]
    core.release_result(record.id)  # twice is harmless
    assert _drain(entry.commands) == []


def test_broken_stream_loses_the_executor_once(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = core.register_executor("h", "127.0.0.1:1", 1)
    core.executor_connected(entry.id)
    core.connection_closed(entry.id)
    core.connection_closed(entry.id)
    lost = [e for e in state.events if isinstance(e, ExecutorLost)]
    assert len(lost) == 1 and lost[0].reason is LossReason.CONNECTION_LOST
    assert entry.phase is ExecutorPhase.LOST and CLOSE in _drain(entry.commands)
    assert core.heartbeat(entry.id) is False  # told to register again


def test_declared_lost_closes_the_stream_and_late_reports_are_dropped(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = core.register_executor("h", "127.0.0.1:1", 1)
    core.executor_connected(entry.id)
    state.next = [DeclareExecutorLost(5, entry.id, LossReason.HEARTBEAT_TIMEOUT)]
    core.heartbeat(entry.id)
    assert entry.phase is ExecutorPhase.LOST and entry.reason is LossReason.HEARTBEAT_TIMEOUT
    assert _drain(entry.commands) == [CLOSE]
    before = len(state.events)
    core.report_completed(_attempt("j"), entry.id, ())
    core.connection_closed(entry.id)  # the closed stream must not count as a second loss
    assert len(state.events) == before


def test_cancel_and_failure_reach_watchers_with_their_error_type(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    record = core.submit("SELECT 1")
    assert core.cancel(record.id) is True
    assert isinstance(state.events[-1], JobCancelled)
    assert record.phase is JobPhase.CANCELLED
    assert record.error_type == JobCancelledError.__name__
    assert core.cancel(record.id) is False

    other = core.submit("SELECT 1")
    state.next = [JobFailed(7, other.id, "task failed 4 times")]
    assert core.heartbeat(ExecutorId("nobody")) is False  # unknown: no event
    entry = core.register_executor("h", "a:1", 1)
    core.executor_connected(entry.id)  # any event lets the scripted state answer
    assert other.phase is JobPhase.FAILED and other.error == "task failed 4 times"
    with pytest.raises(MangonelError, match="no job"):
        core.job(JobId("missing"))


def test_catalog_errors_leave_the_catalog_unchanged(
    shell: tuple[SchedulerCore, ScriptedState], tmp_path: Path
) -> None:
    core, _ = shell
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(MangonelError):
        core.register_table("x", str(tmp_path / "x.parquet"))
    assert core.tables() == []


# ----------------------------------------------------------- recovery duties


def _connected(core: SchedulerCore, host: str = "h") -> ExecutorEntry:
    entry = core.register_executor(host, f"{host}:1", 2)
    core.executor_connected(entry.id)
    return entry


def _launch(state: ScriptedState, core: SchedulerCore, executor: ExecutorId, job: JobId) -> None:
    attempt = TaskAttemptId(TaskId(job, StageId(1), 0), 0)
    spec = TaskSpec(attempt, "SELECT 1 AS x", OutputSpec(OutputKind.SINGLE), ("x",))
    state.next = [LaunchTask(50, executor, spec)]
    core.heartbeat(executor)


def test_watchers_see_the_state_machines_numbers(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = _connected(core)
    record = core.submit("SELECT 1")
    version = record.version
    stage = StageView(StageId(1), "s", 1, 0, 0, 1, 2, 1, 1, rows=7, bytes=70)
    state.job_views[record.id] = JobView(record.id, JobState.RUNNING, 0.0, None, None, (stage,))
    core.heartbeat(entry.id)  # any event refreshes the view
    assert record.version > version and record.view is not None
    status = service_module.job_status(record, core.now(), with_result=False)
    assert (status.tasks_rerun, status.outputs_recomputed) == (1, 1)
    (s,) = status.stages
    assert (s.tasks_pending, s.attempts, s.tasks_rerun, s.outputs_recomputed) == (1, 2, 1, 1)
    assert (s.rows, s.bytes) == (7, 70)
    version = record.version
    core.heartbeat(entry.id)  # the same view again: watchers are not woken
    assert record.version == version


def test_a_failed_job_is_released_on_every_executor_that_ran_its_tasks(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    e1, e2 = _connected(core, "h1"), _connected(core, "h2")
    record = core.submit("SELECT 1")
    _launch(state, core, e1.id, record.id)
    _launch(state, core, e2.id, record.id)
    _drain(e1.commands), _drain(e2.commands)
    # The state machine releases where current outputs are (e1); e2 ran a
    # superseded attempt whose files only the shell knows of.
    state.next = [JobFailed(60, record.id, "boom"), ReleaseOutputs(60, e1.id, record.id, None)]
    core.heartbeat(e1.id)
    assert _drain(e1.commands) == [ReleaseOutputs(60, e1.id, record.id, None)]
    assert _drain(e2.commands) == [ReleaseOutputs(60, e2.id, record.id, None)]


def test_a_drained_executor_serves_its_unread_result_before_it_is_let_go(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = _connected(core)
    record = core.submit("SELECT 1")
    core.drain(entry.id)
    loc = PartitionLocation(entry.id, "h", "h:1", StageId(1), 0, 0, "/w/p0", 1, 10, "c")
    detail = "it finished its tasks and no job needs its outputs any more"
    state.executor_views = [
        ExecutorView(
            entry.id, "h", "h:1", 2, ExecutorStateView.LOST, 1.0, LossReason.DRAINED, detail, 0, 1.0
        )
    ]
    state.next = [
        JobSucceeded(70, record.id, (loc,)),
        DeclareExecutorLost(70, entry.id, LossReason.DRAINED),
    ]
    core.heartbeat(entry.id)
    assert entry.phase is ExecutorPhase.DRAINING and entry.awaiting_results
    assert CLOSE not in _drain(entry.commands)
    core.release_result(record.id)
    assert entry.phase is ExecutorPhase.LOST and entry.reason is LossReason.DRAINED
    assert entry.detail == detail
    assert CLOSE in _drain(entry.commands)


def test_a_loss_carries_the_state_machines_detail(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = _connected(core)
    detail = "no heartbeat for 2.3 s (the timeout is 2 s)"
    state.executor_views = [
        ExecutorView(
            entry.id,
            "h",
            "h:1",
            2,
            ExecutorStateView.LOST,
            1.0,
            LossReason.HEARTBEAT_TIMEOUT,
            detail,
            0,
            1.0,
        )
    ]
    state.next = [DeclareExecutorLost(80, entry.id, LossReason.HEARTBEAT_TIMEOUT)]
    core.heartbeat(entry.id)
    assert (entry.phase, entry.reason, entry.detail) == (
        ExecutorPhase.LOST,
        LossReason.HEARTBEAT_TIMEOUT,
        detail,
    )
    assert core.heartbeat(entry.id) is False  # a thawed executor is told to register again


def test_lost_executors_are_listed_for_a_while_and_silent_registrations_written_off() -> None:
    now = [0.0]
    state = ScriptedState()
    core = SchedulerCore(state, CoreConfig(keep_lost_executors=2), clock=lambda: now[0])
    entries = [_connected(core, f"h{i}") for i in range(3)]
    for entry in entries:
        core.connection_closed(entry.id)
    assert [e.id for e in core.executors()] == [e.id for e in entries[1:]]
    silent = core.register_executor("h9", "h9:1", 1)  # registered, then died
    now[0] = 61.0
    core._expire_results()
    assert silent.phase is ExecutorPhase.LOST and "opened no command stream" in silent.detail
