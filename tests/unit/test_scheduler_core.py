"""The scheduler's I/O shell (``SchedulerCore``) around a scripted state machine.

No processes and no network: the fake state machine records the events it gets
and answers with the commands a test queues, so each shell duty is checked alone:
events get increasing ids, commands reach the right queue, answers reach the
RPC, watchers see the state machine's views. The decisions (resume, drains,
results, cancel, timeouts) are the state machine's and tested there
(``test_state_machine*``, ``test_state_restart``, ``test_state_results``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

import pytest

from mangonel.errors import (
    ErrorType,
    JobCancelledError,
    JobFailedError,
    MangonelError,
    StateStoreError,
)
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.plan import planner as planner_module
from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.plan.planner import PlannerConfig
from mangonel.proto import mangonel_pb2 as pb
from mangonel.scheduler import core as core_module
from mangonel.scheduler import service as service_module
from mangonel.scheduler.core import CoreConfig, ExecutorNotFoundError, SchedulerCore
from mangonel.scheduler.events import (
    CancelRequested,
    Command,
    DeclareExecutorLost,
    Event,
    ExecutorConnected,
    ExecutorHeartbeat,
    ExecutorLost,
    ExecutorRegistered,
    ForgetJob,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    LogRejectedFragment,
    LossReason,
    RefuseHeartbeat,
    RefuseStream,
    ResultRead,
    ResumeExecutor,
    TaskCompleted,
    Tick,
)
from mangonel.scheduler.registry import CLOSE, ExecutorEntry
from mangonel.scheduler.state import SchedulerState
from mangonel.scheduler.state_executors import RegistrySnapshot
from mangonel.scheduler.state_jobs import FinishedJob
from mangonel.scheduler.state_revival import StoredRevivals
from mangonel.scheduler.state_stages import TaskRecord
from mangonel.scheduler.state_views import ExecutorState, ExecutorView, JobState, JobView, StageView
from mangonel.scheduler.store import MemoryStateStore
from mangonel.scheduler.tickets import TicketIssuer
from mangonel.security.tickets import TicketSigner
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
    """Records events; answers each with the commands queued in ``next``, and,
    as the real state does, ``ExecutorLost`` of a live executor with
    ``DeclareExecutorLost`` (first) and a heartbeat of a lost or unknown one with
    ``RefuseHeartbeat``.

    Its views are whatever a test puts in ``job_views`` / ``executor_views``
    (an executor that registered is listed as alive unless a test says otherwise).
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.next: list[Command] = []
        self.job_views: dict[JobId, JobView] = {}
        self.executor_views: dict[ExecutorId, ExecutorView] = {}
        self.parallel: int | None = None
        """What ``job_parallel`` answers; None: ``job_slots``."""
        self.touched: list[JobId] | None = None

    def handle(self, event: Event) -> list[Command]:
        self.events.append(event)
        if isinstance(event, ExecutorRegistered):
            self.set_executor(event.executor.id, ExecutorState.ALIVE)
        out, self.next = self.next, []
        if isinstance(event, ExecutorHeartbeat) and not self.is_live(event.executor):
            view = self.executor_views.get(event.executor)
            if view is None or view.state is ExecutorState.LOST:
                out.append(RefuseHeartbeat(event.event_id, event.executor))
        if isinstance(event, ExecutorLost) and self.is_live(event.executor):
            self.set_executor(event.executor, ExecutorState.LOST, event.reason)
            lost = DeclareExecutorLost(event.event_id, event.executor, event.reason, event.detail)
            out.insert(0, lost)
        quiet = isinstance(event, ExecutorHeartbeat | Tick | ExecutorLost) and all(
            isinstance(c, RefuseHeartbeat) for c in out
        )
        named = [c.job for c in out if isinstance(getattr(c, "job", None), str)]
        self.touched = None if quiet else list(dict.fromkeys([*self.job_views, *named]))
        return out

    def is_live(self, executor: ExecutorId) -> bool:
        view = self.executor_views.get(executor)
        return view is not None and view.state in (ExecutorState.ALIVE, ExecutorState.DRAINING)

    def is_current(self, attempt: TaskAttemptId, executor: ExecutorId) -> bool:
        return self.is_live(executor)

    def touched_jobs(self) -> list[JobId] | None:
        return self.touched

    def set_executor(
        self, executor: ExecutorId, state: ExecutorState, reason: LossReason | None = None
    ) -> None:
        self.executor_views[executor] = ExecutorView(
            executor, "h", "h:1", 2, state, 1.0, reason, f"{state.value} detail", 0, 1.0
        )

    def job(self, job_id: JobId) -> JobView | None:
        return self.job_views.get(job_id)

    def executors(self) -> list[ExecutorView]:
        return list(self.executor_views.values())

    def executor(self, executor: ExecutorId) -> ExecutorView | None:
        return self.executor_views.get(executor)

    def job_slots(self) -> int:
        alive = (v for v in self.executor_views.values() if v.state is ExecutorState.ALIVE)
        return sum(v.slots for v in alive)

    def job_parallel(self) -> int:
        return self.parallel if self.parallel is not None else self.job_slots()

    # Persistence: the shell writes what these return to its (in-memory) store.
    def export_finished(self, job_id: JobId) -> FinishedJob | None:
        view = self.job_views.get(job_id)
        return FinishedJob(view) if view is not None and view.state.finished else None

    def unfinished_jobs(self) -> list[JobId]:
        return [j for j, v in self.job_views.items() if not v.state.finished]

    def export_job_head(self, job_id: JobId) -> None:
        return None

    def take_changed_tasks(self, job_id: JobId) -> list[TaskRecord]:
        return []

    def export_executors(self) -> RegistrySnapshot:
        return RegistrySnapshot([], [], 0)

    def export_revivals(self) -> StoredRevivals:
        return StoredRevivals()

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


def _attempt(job: str) -> TaskAttemptId:
    return TaskAttemptId(TaskId(JobId(job), StageId(1), 0), 0)


def _finished(job: JobId, state: JobState, error: str | None = None) -> JobView:
    return JobView(job, state, 0.0, 5.0, error, ())


def test_event_ids_increase_and_the_state_machine_answers_the_rpcs(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = core.register_executor("h", "127.0.0.1:1", 2, pid=42, cores=8, threads=4)
    (registered,) = state.events
    assert isinstance(registered, ExecutorRegistered) and registered.executor.id == entry.id
    assert (registered.executor.cores, registered.executor.threads) == (8, 4)
    assert (registered.resume, entry.resumed, entry.pid) == (None, False, 42)
    core.executor_connected(entry.id)
    assert state.events[-1] == ExecutorConnected(2, state.events[-1].time, entry.id)
    core.heartbeat(entry.id)
    assert [e.event_id for e in state.events] == [1, 2, 3]
    state.next = [RefuseStream(4, entry.id)]
    with pytest.raises(MangonelError, match="register again"):
        core.executor_connected(entry.id)  # refused by the state machine

    # A resume the state machine accepts: the entry has the old id.
    old = ExecutorId("exec-old")
    state.next = [ResumeExecutor(5, old)]
    again = core.register_executor("h", "h:1", 2, resume=old, held=frozenset({"/p"}))
    assert (again.id, again.resumed) == (old, True)
    event = state.events[-1]
    assert isinstance(event, ExecutorRegistered)
    assert (event.resume, event.held) == (old, frozenset({"/p"}))


def test_queries_are_planned_for_the_slots_a_job_may_hold_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[int, int]] = []

    def plan_query(sql: str, catalog: object, config: PlannerConfig, *rest: object) -> object:
        seen.append((config.slots, config.parallel))
        return PLAN

    monkeypatch.setattr(planner_module, "plan_query", plan_query)
    state = ScriptedState()
    core = SchedulerCore(state, config=CoreConfig(plan_cache=0))
    core.plan("SELECT 1 AS x")
    core.register_executor("h", "127.0.0.1:1", 2)
    core.register_executor("h", "127.0.0.1:2", 2)
    core.plan("SELECT 1 AS x")
    core.submit("SELECT 1 AS x")
    # The host's cores run fewer at full speed (``SchedulerState.job_parallel``).
    state.parallel = 1
    core.plan("SELECT 1 AS x")
    assert seen == [(0, 0), (4, 4), (4, 4), (4, 1)]


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
    state.job_views[record.id] = _finished(record.id, JobState.SUCCEEDED)
    state.next = [JobSucceeded(100, record.id, (loc,))]
    core.report_completed(attempt, entry.id, (out,))
    assert isinstance(state.events[-1], TaskCompleted)
    assert record.state is JobState.SUCCEEDED and record.result == (loc,)
    assert (record.finished, record.error_type) == (5.0, "")

    # Reading the result is an event; what it releases is the state machine's answer.
    state.next = [ReleaseOutputs(101, entry.id, record.id, None)]
    core.release_result(record.id)
    assert state.events[-1] == ResultRead(
        state.events[-1].event_id, state.events[-1].time, record.id
    )
    assert _drain(entry.commands) == [ReleaseOutputs(101, entry.id, record.id, None)]


def test_a_broken_stream_is_reported_once_and_a_lost_executor_is_told_to_register(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = core.register_executor("h", "127.0.0.1:1", 1)
    core.executor_connected(entry.id)
    core.connection_closed(entry.id)
    # The state machine's DeclareExecutorLost is what closes the stream.
    assert CLOSE in _drain(entry.commands)
    core.connection_closed(entry.id)  # the state machine already knows: no answer
    assert _drain(entry.commands) == []
    lost = [e for e in state.events if isinstance(e, ExecutorLost)]
    assert [e.reason for e in lost] == [LossReason.CONNECTION_LOST] * 2
    assert core.telemetry.counters().executors_lost["connection lost"] == 1
    assert core.heartbeat(entry.id) is False  # told to register again
    assert core.heartbeat(ExecutorId("nobody")) is False


def test_declared_lost_closes_the_stream_with_the_state_machines_words(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    entry = core.register_executor("h", "127.0.0.1:1", 1)
    core.executor_connected(entry.id)

    state.set_executor(entry.id, ExecutorState.LOST, LossReason.HEARTBEAT_TIMEOUT)
    state.next = [DeclareExecutorLost(5, entry.id, LossReason.HEARTBEAT_TIMEOUT)]
    core.report_completed(_attempt("j"), entry.id, ())  # reports always reach the state
    assert _drain(entry.commands) == [CLOSE]
    (listing,) = core.executors()
    assert (listing.view.state, listing.view.reason, listing.view.detail) == (
        ExecutorState.LOST,
        LossReason.HEARTBEAT_TIMEOUT,
        "lost detail",
    )
    assert core.telemetry.counters().executors_lost["heartbeat timeout"] == 1
    assert core.heartbeat(entry.id) is False  # a thawed executor is told to register again
    core.connection_closed(entry.id)  # the closed stream must not count as a second loss
    assert core.telemetry.counters().executors_lost["heartbeat timeout"] == 1
    assert core.telemetry.counters().executors_lost["connection lost"] == 0


def test_cancel_and_failure_reach_watchers_with_their_error_type(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    record = core.submit("SELECT 1")
    state.job_views[record.id] = _finished(record.id, JobState.CANCELLED, "cancelled by the user")
    state.next = [JobCancelled(2, record.id, "cancelled by the user")]
    assert core.cancel(record.id) is True
    assert isinstance(state.events[-1], CancelRequested)
    assert record.state is JobState.CANCELLED
    assert (record.error, record.error_type) == ("cancelled by the user", "JobCancelledError")
    assert JobCancelledError.__name__ == record.error_type
    assert core.cancel(record.id) is False  # no JobCancelled in the answer

    other = core.submit("SELECT 1")
    state.job_views[other.id] = _finished(other.id, JobState.FAILED, "task failed 4 times")
    state.next = [JobFailed(7, other.id, "task failed 4 times")]
    entry = core.register_executor("h", "a:1", 1)  # any event lets the scripted state answer
    assert other.state is JobState.FAILED and other.error == "task failed 4 times"
    assert other.error_type == JobFailedError.__name__
    assert not _drain(entry.commands)
    with pytest.raises(MangonelError, match="no job"):
        core.job(JobId("missing"))
    with pytest.raises(MangonelError, match="no job"):
        core.cancel(JobId("missing"))


def test_a_failure_reaches_watchers_with_the_error_it_is_blamed_on(
    shell: tuple[SchedulerCore, ScriptedState], caplog: pytest.LogCaptureFixture
) -> None:
    core, state = shell
    record = core.submit("SELECT 1")
    message = "task ...: s3://b/k was overwritten ..."
    view = _finished(record.id, JobState.FAILED, message)
    state.job_views[record.id] = dataclasses.replace(view, error_type=ErrorType.OBJECT_CHANGED)
    state.next = [JobFailed(7, record.id, message, ErrorType.OBJECT_CHANGED)]
    with caplog.at_level(logging.INFO, logger="mangonel.scheduler.core"):
        core.register_executor("h", "a:1", 1)  # any event lets the scripted state answer
    assert (record.error, record.error_type) == (message, "ObjectChangedError")
    logged = [r for r in caplog.records if f"job {record.id} failed" in r.getMessage()]
    assert [r.levelno for r in logged] == [logging.INFO]
    assert "(ObjectChangedError)" in logged[0].getMessage()
    # An internal error is logged as an error, under the job's id its message names.
    other = core.submit("SELECT 2")
    view = _finished(other.id, JobState.FAILED, "internal error: ...")
    state.job_views[other.id] = dataclasses.replace(view, error_type=ErrorType.INTERNAL)
    state.next = [JobFailed(8, other.id, "internal error: ...", ErrorType.INTERNAL)]
    with caplog.at_level(logging.INFO, logger="mangonel.scheduler.core"):
        core.register_executor("h", "a:2", 1)
    assert other.error_type == "InternalError"
    (internal,) = [r for r in caplog.records if f"job {other.id} failed" in r.getMessage()]
    assert internal.levelno == logging.ERROR


def test_a_rejected_fragment_is_logged_with_its_sql_and_query(
    shell: tuple[SchedulerCore, ScriptedState], caplog: pytest.LogCaptureFixture
) -> None:
    core, state = shell
    record = core.submit("SELECT 1")
    attempt = TaskAttemptId(TaskId(record.id, StageId(1), 0), 0)
    error = 'Binder Error: Referenced table "store" not found!'
    state.job_views[record.id] = _finished(record.id, JobState.FAILED, "internal error: ...")
    state.next = [
        LogRejectedFragment(7, record.id, StageId(1), attempt, error, 'SELECT "store"."s"', "Q"),
        JobFailed(7, record.id, "internal error: ..."),
    ]
    with caplog.at_level(logging.ERROR, logger="mangonel.scheduler.core"):
        core.register_executor("h", "a:1", 1)  # any event lets the scripted state answer
    (logged,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    text = logged.getMessage()
    assert f"job {record.id}: internal error" in text and error in text
    assert 'SELECT "store"."s"' in text and "\nQ" in text
    assert record.state is JobState.FAILED


def test_a_forgotten_job_leaves_the_shell_and_the_store(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, state = shell
    record = core.submit("SELECT 1")
    state.job_views[record.id] = _finished(record.id, JobState.FAILED, "boom")
    state.next = [JobFailed(2, record.id, "boom")]
    core.register_executor("h", "a:1", 1)
    assert any(k.startswith(f"jobs/{record.id}/") for k in core.store.load())
    del state.job_views[record.id]
    state.next = [ForgetJob(3, record.id)]
    core.register_executor("h", "a:1", 1)
    with pytest.raises(MangonelError, match="no job"):
        core.job(record.id)
    assert not any(k.startswith(f"jobs/{record.id}/") for k in core.store.load())


def test_catalog_errors_leave_the_catalog_unchanged(
    shell: tuple[SchedulerCore, ScriptedState], tmp_path: Path
) -> None:
    core, _ = shell
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(MangonelError):
        core.register_table("x", str(tmp_path / "x.parquet"))
    assert core.tables() == []


def _connected(core: SchedulerCore, host: str = "h") -> ExecutorEntry:
    entry = core.register_executor(host, f"{host}:1", 2)
    core.executor_connected(entry.id)
    return entry


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


def test_lost_executors_are_listed_as_long_as_the_state_machine_lists_them() -> None:
    state = ScriptedState()
    core = SchedulerCore(state, CoreConfig())
    entries = [_connected(core, f"h{i}") for i in range(3)]
    del state.executor_views[entries[0].id]  # forgotten by the state machine
    state.set_executor(entries[1].id, ExecutorState.LOST, LossReason.DRAINED)
    state.next = [DeclareExecutorLost(9, entries[1].id, LossReason.DRAINED)]
    core.heartbeat(entries[2].id)
    assert [e.id for e in core.executors()] == [e.id for e in entries[1:]]
    assert [e.usable for e in core.executors()] == [False, True]
    assert not core._executors.get(entries[0].id)  # its queue went with it


class _Call:
    """The servicer context of a watch that stays open (no token: ``OPEN`` needs none)."""

    def is_active(self) -> bool:
        return True

    def invocation_metadata(self) -> tuple[()]:
        return ()


@pytest.mark.parametrize("final_only", [False, True])
def test_a_watch_for_the_final_status_gets_no_progress_in_between(
    shell: tuple[SchedulerCore, ScriptedState], final_only: bool
) -> None:
    core, state = shell
    entry = _connected(core)
    record = core.submit("SELECT 1")
    servicer = service_module.QueryServiceServicer(core)
    watch = servicer.WatchJob(pb.WatchJobRequest(job_id=record.id, final_only=final_only), _Call())
    first = next(watch)
    assert first.state == pb.JOB_STATE_RUNNING
    received: list[pb.JobStatus] = []
    reader = threading.Thread(target=lambda: received.extend(watch), daemon=True)
    reader.start()
    stage = StageView(StageId(1), "s", 1, 0, 1, 0, 1, 0, 0)
    state.job_views[record.id] = JobView(record.id, JobState.RUNNING, 0.0, None, None, (stage,))
    core.heartbeat(entry.id)  # progress: a task runs
    # Past the progress throttle (``_WATCH_MIN_INTERVAL_S``), so a progress message
    # would have gone out before the job ends.
    time.sleep(3 * service_module._WATCH_MIN_INTERVAL_S)
    state.job_views[record.id] = _finished(record.id, JobState.SUCCEEDED)
    state.next = [JobSucceeded(9, record.id, ())]
    core.heartbeat(entry.id)
    reader.join(timeout=10)
    assert not reader.is_alive(), "the watch did not end with the job"
    assert received[-1].state == pb.JOB_STATE_SUCCEEDED
    progress = [m for m in received[:-1] if m.state == pb.JOB_STATE_RUNNING]
    if final_only:
        assert len(received) == 1
    else:  # the same changes, watched with progress: the test above can fail
        assert len(progress) >= 1 and progress[0].stages[0].tasks_running == 1


@pytest.mark.parametrize("tickets", [False, True])
def test_a_small_result_comes_with_the_jobs_end_where_it_needs_no_ticket(
    shell: tuple[SchedulerCore, ScriptedState], tickets: bool
) -> None:
    core, state = shell
    entry = _connected(core)
    record = core.submit("SELECT 1")
    final, lost = (TaskAttemptId(TaskId(record.id, StageId(1), 0), n) for n in (1, 0))
    other_stage = TaskAttemptId(TaskId(record.id, StageId(2), 0), 0)

    def report(attempt: TaskAttemptId, path: str) -> None:
        out = PartitionOutput(0, path, 1, 3, "c")
        core.report_completed(attempt, entry.id, (out,), 0.1, {path: path[-2:].encode() + b"!"})

    report(other_stage, "/w/s2")
    report(lost, "/w/a0")
    assert set(record.result_files) == {"/w/a0"}  # only the final stage's may be the result
    loc = PartitionLocation(entry.id, "h", "127.0.0.1:1", StageId(1), 0, 0, "/w/a1", 1, 3, "c")
    state.job_views[record.id] = _finished(record.id, JobState.SUCCEEDED)
    state.next = [JobSucceeded(9, record.id, (loc,))]
    report(final, "/w/a1")
    assert record.result_files == {"/w/a1": b"a1!"}  # the attempt that lost is dropped

    issuer = TicketIssuer(TicketSigner(b"s" * 64), 60.0, 60.0) if tickets else None
    servicer = service_module.QueryServiceServicer(core, tickets=issuer)
    request = pb.WatchJobRequest(job_id=record.id, final_only=True)
    (status,) = servicer.WatchJob(request, _Call())
    assert status.state == pb.JOB_STATE_SUCCEEDED and [r.path for r in status.result] == ["/w/a1"]
    if tickets:  # bound to the submitting session, which only the Flight read checks
        assert status.result[0].data == b"" and status.result[0].ticket
    else:
        assert status.result[0].data == b"a1!" and not status.result[0].ticket
    # Kept while the result is: through the release of other stages, not past its own
    # (read, or expired unread: the state machine's ReleaseOutputs of the whole job).
    state.next = [ReleaseOutputs(10, entry.id, record.id, (StageId(2),))]
    core.heartbeat(entry.id)
    assert record.result_files == {"/w/a1": b"a1!"}
    state.next = [ReleaseOutputs(11, entry.id, record.id, None)]
    core.heartbeat(entry.id)
    assert record.result_files == {}


def test_after_a_failed_store_write_no_watcher_hears_what_the_store_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's end that the store could not take stays unseen: an event after it (a
    tick) used to copy the state machine's view, SUCCEEDED, into the job's record
    without its result, and a watcher answered the client with an empty result."""
    monkeypatch.setattr(planner_module, "plan_query", lambda *args: PLAN)

    class FailingStore(MemoryStateStore):
        broken = False

        def commit(self, puts: Mapping[str, str], deletes: Collection[str] = ()) -> None:
            if self.broken:
                raise StateStoreError("cannot write the state store: disk full")
            super().commit(puts, deletes)

    store = FailingStore()
    store.acquire("scheduler")
    state = ScriptedState()
    core = SchedulerCore(state, store=store)
    entry = core.register_executor("h", "127.0.0.1:1", 1)
    core.executor_connected(entry.id)
    record = core.submit("SELECT 1")
    attempt = TaskAttemptId(TaskId(record.id, StageId(1), 0), 0)
    out = PartitionOutput(0, "/w/p0", 1, 10, "c")
    loc = PartitionLocation(entry.id, "h", "127.0.0.1:1", StageId(1), 0, 0, "/w/p0", 1, 10, "c")
    state.job_views[record.id] = _finished(record.id, JobState.SUCCEEDED)
    state.next = [JobSucceeded(100, record.id, (loc,))]
    store.broken = True
    with pytest.raises(StateStoreError):
        core.report_completed(attempt, entry.id, (out,))
    with pytest.raises(StateStoreError):
        core._emit(lambda eid, now: Tick(eid, now))
    assert not record.state.finished and record.result == ()
    assert core.fatal is not None


def test_a_slow_commit_to_the_state_store_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every event waits for its commit: a store slower than ``SLOW_COMMIT_S`` (a virtual
    disk's sync, etcd far away) says so in the scheduler's log; a quick one does not."""
    monkeypatch.setattr(planner_module, "plan_query", lambda *args: PLAN)

    class SlowStore(MemoryStateStore):
        delay_s = 0.0

        def commit(self, puts: Mapping[str, str], deletes: Collection[str] = ()) -> None:
            time.sleep(self.delay_s)
            super().commit(puts, deletes)

    store = SlowStore()
    store.acquire("scheduler")
    core = SchedulerCore(ScriptedState(), store=store)
    caplog.set_level(logging.WARNING, logger="mangonel.scheduler.core")
    core.submit("SELECT 1")
    assert not [r for r in caplog.records if "to commit" in r.getMessage()]
    store.delay_s = core_module.SLOW_COMMIT_S + 0.01
    core.submit("SELECT 1")
    (slow,) = [r.getMessage() for r in caplog.records if "to commit" in r.getMessage()]
    assert slow.startswith("the state store took ") and "every event and launch waited" in slow


def test_with_the_real_state_a_closed_stream_is_one_loss_and_the_lost_register_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="mangonel.scheduler.core")
    core = SchedulerCore(SchedulerState())
    entry = core.register_executor("h", "127.0.0.1:1", 1)
    assert core.heartbeat(entry.id) is True  # connecting: its heartbeats count
    core.executor_connected(entry.id)
    core.connection_closed(entry.id)
    core.connection_closed(entry.id)  # the state machine let it go already: no answer
    assert _drain(entry.commands) == [CLOSE]  # its DeclareExecutorLost, carried out once
    assert core.telemetry.counters().executors_lost["connection lost"] == 1
    (listing,) = core.executors()
    assert (listing.view.state, listing.view.reason) == (
        ExecutorState.LOST,
        LossReason.CONNECTION_LOST,
    )
    assert core.heartbeat(entry.id) is False  # RefuseHeartbeat: register again
    assert core.heartbeat(ExecutorId("nobody")) is False
    # Every answer is one the shell knows how to carry out.
    assert "unknown command" not in caplog.text
    assert caplog.text.count(f"executor {entry.id} lost (connection lost)") == 1


def test_a_moved_stream_takes_over_the_queue_and_the_old_streams_end_is_no_loss() -> None:
    # The real state machine behind the shell (``state_streams``).
    core = SchedulerCore(SchedulerState())
    entry = core.register_executor("h", "127.0.0.1:1", 1)
    first = core.executor_connected(entry.id)
    first.commands.put("not sent yet")  # a command the old stream had not taken
    # It names files of a job the scheduler no longer knows (ended): released.
    second = core.executor_reopened(entry.id, frozenset(), frozenset(), ("gone",))
    assert second.id > first.id
    assert _drain(first.commands) == [CLOSE]  # the old stream ends
    assert _drain(second.commands) == [  # moved, in order, then what the move sends
        "not sent yet",
        ReleaseOutputs(second.id, entry.id, JobId("gone"), None),
    ]
    core.connection_closed(entry.id, "its command stream broke", first.id)
    assert core.telemetry.counters().executors_lost["connection lost"] == 0
    assert core.heartbeat(entry.id) is True  # still known, under its id
    core.connection_closed(entry.id, "its command stream broke", second.id)
    assert core.telemetry.counters().executors_lost["connection lost"] == 1
    with pytest.raises(ExecutorNotFoundError, match="register again"):
        core.executor_reopened(entry.id, frozenset(), frozenset())


@dataclasses.dataclass
class _StreamCall:
    """The servicer context of an executor's Connect stream; ``ended``: the RPC had
    ended already when the handler asked for its end callback (a server stopping)."""

    ended: bool = False
    callbacks: list[object] = dataclasses.field(default_factory=list)

    def is_active(self) -> bool:
        return not self.ended

    def add_callback(self, callback: object) -> bool:
        if self.ended:
            return False
        self.callbacks.append(callback)
        return True

    def send_initial_metadata(self, metadata: object) -> None:
        pass

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def _stream_ends(commands: Iterator[object], within_s: float) -> bool:
    ended = threading.Event()
    threading.Thread(target=lambda: (list(commands), ended.set()), daemon=True).start()
    return ended.wait(within_s)


def test_a_command_stream_whose_rpc_ended_before_it_was_watched_ends(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    """The server stopped between the stream's start and its end callback: nothing
    would put CLOSE on its queue, and its thread would hold the process's exit."""
    core, _ = shell
    entry = core.register_executor("h", "h:1", 2)
    servicer = service_module.ExecutorControlServicer(core)
    call = _StreamCall(ended=True)
    request = pb.ConnectRequest(executor_id=entry.id)
    assert _stream_ends(servicer.Connect(request, call), within_s=5)


def test_a_command_stream_opened_as_the_scheduler_stops_ends(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    """``stop`` closed the streams it knew; one opened after it (an executor that
    came back just then) ends too, though its RPC is still open."""
    core, _ = shell
    entry = core.register_executor("h", "h:1", 2)
    core.stop()
    servicer = service_module.ExecutorControlServicer(core)
    call = _StreamCall()
    request = pb.ConnectRequest(executor_id=entry.id)
    _drain(core._executors.get(entry.id).commands)  # the CLOSE ``stop`` queued for it
    assert _stream_ends(servicer.Connect(request, call), within_s=5)
    assert call.callbacks  # the end callback was taken


def test_a_live_command_stream_stays_open_while_idle(
    shell: tuple[SchedulerCore, ScriptedState],
) -> None:
    core, _ = shell
    entry = core.register_executor("h", "h:1", 2)
    servicer = service_module.ExecutorControlServicer(core)
    assert not _stream_ends(
        servicer.Connect(pb.ConnectRequest(executor_id=entry.id), _StreamCall()),
        within_s=2.5 * service_module._STREAM_CHECK_S,
    )


def test_a_submission_the_store_did_not_take_is_no_job_for_its_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler lost the lead of its store while a job was submitted: the job's
    write was refused, and the client, told UNAVAILABLE, sent the submission again.
    The scheduler, still up for a moment, answered the retry with that job from its
    memory; the client then watched it on the scheduler that took over, which had
    never heard of it ("no job ...": the randomized run with a standby, 2026-12-07)."""
    monkeypatch.setattr(planner_module, "plan_query", lambda *args: PLAN)
    store = MemoryStateStore()
    store.acquire("scheduler")
    core = SchedulerCore(ScriptedState(), store=store)
    store.resign()  # another scheduler leads now
    with pytest.raises(StateStoreError, match="resigned"):
        core.submit("SELECT 1", request_id="s.1", owner="ann")
    assert core.jobs() == []
    with pytest.raises(StateStoreError, match="resigned"):
        core.submit("SELECT 1", request_id="s.1", owner="ann")
    assert core.jobs() == []
