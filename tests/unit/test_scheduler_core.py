"""The scheduler's I/O shell (``SchedulerCore``) around a scripted state machine.

No processes and no network: the fake state machine records the events it gets
and answers with the commands a test queues, so each shell duty is checked alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mangonel.errors import JobCancelledError, MangonelError
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.plan.physical import DistributedPlan, OutputKind, OutputSpec, Stage
from mangonel.scheduler import core as core_module
from mangonel.scheduler.core import SchedulerCore
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
    LaunchTask,
    LossReason,
    PartitionLocation,
    PartitionOutput,
    ReleaseOutputs,
    TaskCompleted,
    TaskSpec,
)
from mangonel.scheduler.jobs import JobPhase
from mangonel.scheduler.registry import CLOSE, ExecutorPhase

PLAN = DistributedPlan(
    stages=(Stage(StageId(1), "SELECT 1 AS x", OutputSpec(OutputKind.SINGLE), 1, ("x",)),),
    columns=("x",),
)


class ScriptedState:
    """Records events; answers each with whatever ``reply`` returns for it."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.next: list[Command] = []

    def handle(self, event: Event) -> list[Command]:
        self.events.append(event)
        out, self.next = self.next, []
        return out


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> tuple[SchedulerCore, ScriptedState]:
    monkeypatch.setattr(core_module, "plan_query", lambda *args: PLAN)
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
    assert core.running_tasks() == {entry.id: 1}

    out = PartitionOutput(0, "/w/p0", 1, 10, "c")
    loc = PartitionLocation(entry.id, "h", "127.0.0.1:1", StageId(1), 0, 0, "/w/p0", 1, 10, "c")
    state.next = [JobSucceeded(100, record.id, (loc,))]
    core.report_completed(attempt, entry.id, (out,))
    assert isinstance(state.events[-1], TaskCompleted)
    assert record.phase is JobPhase.SUCCEEDED and record.result == (loc,)
    assert record.stages[StageId(1)].rows == 1
    assert core.running_tasks() == {}

    core.release_result(record.id)
    released = _drain(entry.commands)
    assert released == [ReleaseOutputs(released[0].cause, entry.id, record.id, (StageId(1),))]  # type: ignore[attr-defined]
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
