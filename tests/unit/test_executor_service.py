"""ExecutorService's control loop against an in-memory SchedulerLink."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pyarrow.flight as flight
import pytest

from mangonel.errors import ClusterError
from mangonel.executor.config import ExecutorConfig
from mangonel.executor.failures import TaskFailedError, disk_full
from mangonel.executor.hooks import NoHooks
from mangonel.executor.link import ExecutorCommand, HeartbeatReply, RegisterReply, Registration
from mangonel.executor.main import start_executor, stop_executor
from mangonel.executor.service import INLINE_OUTPUT_BYTES, ExecutorService
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.task import (
    CancelTask,
    ExecutionError,
    ExecutionProblem,
    FragmentRejected,
    LaunchTask,
    LinkSample,
    OutputKind,
    OutputSpec,
    PartitionOutput,
    QueryError,
    ReleaseOutputs,
    TaskFailure,
    TaskSpec,
    TaskTimings,
)
from mangonel.testing.faults import write_rules

SINGLE = OutputSpec(OutputKind.SINGLE)
SLOW_SQL = "SELECT count(*) AS n FROM range(100000000000)"
_END = object()


class FakeStream:
    def __init__(self) -> None:
        self.items: queue.SimpleQueue[object] = queue.SimpleQueue()

    def __iter__(self) -> Iterator[ExecutorCommand]:
        while True:
            item = self.items.get()
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            yield item  # type: ignore[misc]

    def cancel(self) -> None:
        self.items.put(_END)


class FakeLink:
    """Records what the executor says; tests push commands on the current stream."""

    def __init__(self, failures_before_register: int = 0) -> None:
        self.lock = threading.Lock()
        self.registrations: list[Registration] = []
        self.streams: list[FakeStream] = []
        self.heartbeats: list[tuple[ExecutorId, int, float]] = []
        self.health: list[tuple[str, int]] = []
        """(``unhealthy`` of each heartbeat, reports sent before it)."""
        self.reports: list[
            tuple[ExecutorId, TaskAttemptId, tuple[PartitionOutput, ...] | TaskFailure]
        ] = []
        self.files: list[dict[str, bytes]] = []
        """The files each completion report carried, in report order."""
        self.timings: list[TaskTimings | None] = []
        """Where each reported attempt's time went, in report order."""
        self.known = True
        self.link_back = False
        """Set: the next heartbeat's answer says the link came back (once)."""
        self.beats_failing = 0
        """Heartbeats still to fail, each with ``ClusterError`` (a cut link)."""
        self.reopens: list[tuple[str, ...]] = []
        """The jobs each moved stream said it has files of."""
        self.drains: list[ExecutorId] = []
        self.failures_before_register = failures_before_register
        self.closed = False

    def register(self, registration: Registration) -> RegisterReply:
        with self.lock:
            if self.failures_before_register:
                self.failures_before_register -= 1
                raise ClusterError("scheduler not up yet")
            self.registrations.append(registration)
            self.known = True
            return RegisterReply(ExecutorId(f"e{len(self.registrations)}"), 0.05)

    def connect(self, executor: ExecutorId) -> FakeStream:
        stream = FakeStream()
        with self.lock:
            self.streams.append(stream)
        return stream

    def reopen(
        self,
        executor: ExecutorId,
        holding: frozenset[TaskAttemptId],
        finished: frozenset[TaskAttemptId],
        held_jobs: Sequence[str] = (),
    ) -> FakeStream:
        with self.lock:
            self.reopens.append(tuple(held_jobs))
        return self.connect(executor)

    def heartbeat(
        self,
        executor: ExecutorId,
        running_tasks: int,
        unhealthy: str = "",
        links: Sequence[LinkSample] = (),
        probes: Sequence[LinkSample] = (),
    ) -> HeartbeatReply:
        with self.lock:
            if self.beats_failing:
                self.beats_failing -= 1
                raise ClusterError("cannot send a heartbeat to the scheduler: UNAVAILABLE")
            self.heartbeats.append((executor, running_tasks, time.monotonic()))
            self.health.append((unhealthy, len(self.reports)))
            back, self.link_back = self.link_back, False
            return HeartbeatReply(self.known, link_back=back)

    def report_completed(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        outputs: tuple[PartitionOutput, ...],
        elapsed_s: float,
        files: Mapping[str, bytes] | None = None,
        timings: TaskTimings | None = None,
    ) -> None:
        with self.lock:
            self.reports.append((executor, attempt, outputs))
            self.files.append(dict(files or {}))
            self.timings.append(timings)

    def report_failed(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        failure: TaskFailure,
        elapsed_s: float,
        timings: TaskTimings | None = None,
    ) -> None:
        with self.lock:
            self.reports.append((executor, attempt, failure))
            self.timings.append(timings)

    def drain(self, executor: ExecutorId) -> None:
        with self.lock:
            self.drains.append(executor)

    def close(self) -> None:
        self.closed = True

    def send(self, command: object, stream: int = -1) -> None:
        self.streams[stream].items.put(command)


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def attempt(partition: int, n: int = 0, stage: int = 1) -> TaskAttemptId:
    return TaskAttemptId(TaskId(JobId("job1"), StageId(stage), partition), n)


def launch(a: TaskAttemptId, sql: str = "SELECT 42 AS n", result: bool = False) -> LaunchTask:
    return LaunchTask(0, ExecutorId("e?"), TaskSpec(a, sql, SINGLE, ("n",), result=result))


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[tuple[ExecutorService, FakeLink]]:
    link = FakeLink()
    config = ExecutorConfig(
        host_id="h1",
        slots=2,
        threads=1,
        memory_limit="256MB",
        work_dir=str(tmp_path / "work"),
        heartbeat_interval_s=0.05,
    )
    service, thread = start_executor(config, link)
    wait_for(lambda: bool(link.streams))
    yield service, link
    stop_executor(service, thread)
    assert not thread.is_alive() and link.closed


def test_registers_runs_reports_and_serves(cluster: tuple[ExecutorService, FakeLink]) -> None:
    service, link = cluster
    reg = link.registrations[0]
    assert (reg.host, reg.slots, reg.pid) == ("h1", 2, os.getpid())
    # The scheduler counts the tasks its host runs at full speed by these.
    assert (reg.cores, reg.threads) == (os.cpu_count(), 1)
    link.send(launch(attempt(0)))
    wait_for(lambda: len(link.reports) == 1)
    executor, att, result = link.reports[0]
    assert executor == "e1" and att == attempt(0)
    assert isinstance(result, tuple) and result[0].rows == 1
    client = flight.FlightClient(f"grpc://{reg.flight_address}")
    table = client.do_get(flight.Ticket(result[0].path.encode())).read_all()
    client.close()
    assert table.column("n").to_pylist() == [42]


def test_reports_say_where_the_time_went(cluster: tuple[ExecutorService, FakeLink]) -> None:
    _, link = cluster
    before = time.time()
    # About 0.1 s of DuckDB's work on one thread (a count of a range alone is a
    # few ms, which a loaded machine's stall in the setup outlasted).
    link.send(launch(attempt(0), "SELECT sum(hash(range) % 7) AS n FROM range(20000000)"))
    link.send(launch(attempt(1), "SELECT nope"))
    wait_for(lambda: len(link.reports) == 2)
    after = time.time()
    for t in link.timings:
        assert t is not None
        assert before <= t.received_at <= t.started_at <= t.ended_at <= after
        phases = (t.setup_s, t.fetch_s, t.execute_s, t.write_s, t.cleanup_s)
        assert all(p >= 0 for p in phases)
        # One after the other on the slot's thread: never more than its time there.
        assert sum(phases) <= t.run_s + 1e-6
        assert t.fetched_local_bytes == t.fetched_remote_bytes == 0  # it read no stage
    done = link.timings[[r[1] for r in link.reports].index(attempt(0))]
    assert done is not None and done.execute_s > 0 and done.write_s > 0
    assert done.execute_s > done.setup_s  # hashing 20M rows is DuckDB's work
    assert done.other_s < 0.5 * done.run_s


def test_failures_are_reported_typed(cluster: tuple[ExecutorService, FakeLink]) -> None:
    _, link = cluster
    link.send(launch(attempt(0), "SELECT nope"))
    wait_for(lambda: len(link.reports) == 1)
    assert isinstance(link.reports[0][2], FragmentRejected)  # DuckDB's binder refused it
    link.send(launch(attempt(1), "SELECT CAST('x' AS INTEGER) AS n"))
    wait_for(lambda: len(link.reports) == 2)
    assert isinstance(link.reports[1][2], QueryError)  # the data refused the query


def test_cancel_stops_a_running_task_and_frees_its_slot(
    cluster: tuple[ExecutorService, FakeLink],
) -> None:
    service, link = cluster
    for p in range(2):
        link.send(launch(attempt(p), SLOW_SQL))
    wait_for(lambda: service.running_tasks == 2)
    link.send(launch(attempt(2)))  # queued: both slots busy
    link.send(CancelTask(0, ExecutorId("e1"), attempt(2)))
    link.send(CancelTask(0, ExecutorId("e1"), attempt(0)))
    link.send(CancelTask(0, ExecutorId("e1"), attempt(1)))
    wait_for(lambda: service.running_tasks == 0)
    link.send(launch(attempt(3)))
    wait_for(lambda: len(link.reports) == 1)
    assert [r[1] for r in link.reports] == [attempt(3)]  # cancelled tasks report nothing


def test_failing_heartbeats_are_logged_when_they_begin_and_when_they_end(
    cluster: tuple[ExecutorService, FakeLink], caplog: pytest.LogCaptureFixture
) -> None:
    """The executor's side of a cut: one warning when heartbeats begin to fail, one
    line when the scheduler answers them again, with how many failed; not a line
    a beat."""
    _, link = cluster
    caplog.set_level(logging.INFO, logger="mangonel.executor.service")
    with link.lock:
        link.beats_failing = 4
    wait_for(lambda: "heartbeats answered again" in caplog.text)
    warned = [r for r in caplog.records if r.getMessage().startswith("a heartbeat failed")]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING, caplog.text
    assert "cannot send a heartbeat to the scheduler: UNAVAILABLE" in warned[0].getMessage()
    assert "after 4 failed over" in caplog.text, caplog.text
    with link.lock:
        link.beats_failing = 1
    wait_for(lambda: caplog.text.count("heartbeats answered again") == 2)
    assert "after 1 failed over" in caplog.text, caplog.text


def test_heartbeats_continue_while_slots_are_busy(
    cluster: tuple[ExecutorService, FakeLink],
) -> None:
    service, link = cluster
    for p in range(2):
        link.send(launch(attempt(p), SLOW_SQL))
    wait_for(lambda: service.running_tasks == 2)
    start = len(link.heartbeats)
    time.sleep(0.6)
    beats = link.heartbeats[start:]
    assert len(beats) >= 4 and all(b[1] == 2 for b in beats)
    link.send(CancelTask(0, ExecutorId("e1"), attempt(0)))
    link.send(CancelTask(0, ExecutorId("e1"), attempt(1)))


def test_release_deletes_files(cluster: tuple[ExecutorService, FakeLink]) -> None:
    service, link = cluster
    link.send(launch(attempt(0, stage=1)))
    link.send(launch(attempt(0, stage=2)))
    wait_for(lambda: len(link.reports) == 2)
    paths = {r[1].task.stage: r[2][0].path for r in link.reports}  # type: ignore[index]
    link.send(ReleaseOutputs(0, ExecutorId("e1"), JobId("job1"), (StageId(1),)))
    wait_for(lambda: not os.path.exists(paths[1]))
    assert os.path.exists(paths[2])
    link.send(ReleaseOutputs(0, ExecutorId("e1"), JobId("job1")))
    wait_for(lambda: not os.path.exists(paths[2]))


def test_a_moved_stream_names_the_jobs_it_has_files_of_and_their_release_deletes_them(
    cluster: tuple[ExecutorService, FakeLink],
) -> None:
    # The link comes back after failed heartbeats: the executor moves its
    # stream, naming job1, whose files it has (``state_streams`` releases those
    # of an ended job); the release that comes on the new stream deletes them.
    service, link = cluster
    link.send(launch(attempt(0)))
    wait_for(lambda: len(link.reports) == 1)
    path = link.reports[0][2][0].path  # type: ignore[index]
    link.link_back = True
    wait_for(lambda: len(link.streams) == 2)
    assert link.reopens == [("job1",)]
    link.send(ReleaseOutputs(0, ExecutorId("e1"), JobId("job1")))
    wait_for(lambda: not os.path.exists(path))


def test_a_broken_stream_cancels_tasks_and_registers_again(
    cluster: tuple[ExecutorService, FakeLink],
) -> None:
    service, link = cluster
    link.send(launch(attempt(0), SLOW_SQL))
    wait_for(lambda: service.running_tasks == 1)
    link.send(ClusterError("connection reset"))
    wait_for(lambda: len(link.streams) == 2)
    wait_for(lambda: service.running_tasks == 0)
    assert service.executor_id == "e2"
    link.send(launch(attempt(0, n=1)))
    wait_for(lambda: len(link.reports) == 1)
    assert link.reports[0][:2] == ("e2", attempt(0, n=1))


def test_an_unknown_executor_registers_again(cluster: tuple[ExecutorService, FakeLink]) -> None:
    service, link = cluster
    link.known = False
    wait_for(lambda: len(link.streams) == 2)
    wait_for(lambda: service.executor_id == "e2")


def test_waits_for_the_scheduler_to_come_up(tmp_path: Path) -> None:
    link = FakeLink(failures_before_register=3)
    config = ExecutorConfig(host_id="h1", slots=1, work_dir=str(tmp_path / "w"))
    service, thread = start_executor(config, link)
    try:
        wait_for(lambda: service.registered.is_set())
        assert len(link.registrations) == 1
    finally:
        stop_executor(service, thread)
    assert not os.path.exists(os.path.join(config.work_dir, "spill"))


# ------------------------------------------------------------ lives and files


def life_dirs(service: ExecutorService) -> list[str]:
    """The executor-id directories under the work root (not the spill one)."""
    return sorted(n for n in os.listdir(service.work.root) if not n.startswith("spill-"))


def test_each_life_has_its_own_directory_deleted_when_the_life_ends(
    cluster: tuple[ExecutorService, FakeLink],
) -> None:
    service, link = cluster
    link.send(launch(attempt(0)))
    wait_for(lambda: len(link.reports) == 1)
    first = link.reports[0][2][0].path  # type: ignore[index]
    assert first.startswith(os.path.join(service.work.root, "e1") + os.sep)
    assert life_dirs(service) == ["e1"]
    link.send(launch(attempt(1, stage=2), SLOW_SQL))
    wait_for(lambda: service.running_tasks == 1)
    link.send(ClusterError("connection reset"))  # the scheduler wrote e1 off
    wait_for(lambda: service.executor_id == "e2")
    # Nothing of the first life is trusted: its task stopped, its files went.
    wait_for(lambda: life_dirs(service) == ["e2"])
    assert not os.path.exists(first) and service.running_tasks == 0
    client = flight.FlightClient(f"grpc://{service.flight_address}")
    with pytest.raises(flight.FlightServerError, match="does not name an output"):
        client.do_get(flight.Ticket(first.encode())).read_all()
    client.close()


def test_stop_leaves_nothing_in_the_work_root(tmp_path: Path) -> None:
    link = FakeLink()
    config = ExecutorConfig(host_id="h1", slots=1, threads=1, work_dir=str(tmp_path / "w"))
    service, thread = start_executor(config, link)
    wait_for(lambda: bool(link.streams))
    link.send(launch(attempt(0)))
    wait_for(lambda: len(link.reports) == 1)
    stop_executor(service, thread)
    assert os.listdir(tmp_path / "w") == []


def test_start_sweeps_directories_of_dead_executors(tmp_path: Path) -> None:
    root = tmp_path / "w"
    stale = root / "exec-9-dead"
    (stale / "shuffle").mkdir(parents=True)
    (stale / "owner.lock").write_text("pid 1")  # nobody holds its lock: its owner died
    (stale / "shuffle" / "part-0.arrow").write_text("x")
    link = FakeLink()
    service, thread = start_executor(
        ExecutorConfig(host_id="h1", slots=1, work_dir=str(root)), link
    )
    try:
        assert not stale.exists()
    finally:
        stop_executor(service, thread)


def test_output_of_a_released_job_is_deleted_when_its_task_ends(
    cluster: tuple[ExecutorService, FakeLink],
) -> None:
    service, link = cluster
    # The job ended (and was released) before this late attempt committed.
    link.send(ReleaseOutputs(0, ExecutorId("e1"), JobId("job1")))
    link.send(launch(attempt(0, n=3)))
    wait_for(lambda: len(link.reports) == 1)
    path = link.reports[0][2][0].path  # type: ignore[index]
    wait_for(lambda: not os.path.exists(path))


# --------------------------------------------------------------------- drain


def test_drain_tells_the_scheduler_and_returns_once_let_go(
    cluster: tuple[ExecutorService, FakeLink],
) -> None:
    service, link = cluster
    link.send(launch(attempt(0), SLOW_SQL))
    wait_for(lambda: service.running_tasks == 1)
    service.drain()
    assert link.drains == ["e1"] and service.draining
    # A task launched before the scheduler saw the drain still runs.
    link.send(launch(attempt(1)))
    wait_for(lambda: any(r[1] == attempt(1) for r in link.reports))
    assert not service.finished.is_set()
    link.send(CancelTask(0, ExecutorId("e1"), attempt(0)))
    wait_for(lambda: service.running_tasks == 0)
    link.streams[-1].cancel()  # the scheduler closes the stream: nothing needs us
    wait_for(service.finished.is_set)
    assert len(link.registrations) == 1  # drained: no new life


def test_drain_before_registering_stops_at_once(tmp_path: Path) -> None:
    link = FakeLink(failures_before_register=1000)
    service, thread = start_executor(
        ExecutorConfig(host_id="h1", slots=1, work_dir=str(tmp_path)), link
    )
    service.drain()
    wait_for(service.finished.is_set)
    stop_executor(service, thread)
    assert link.drains == []


# ------------------------------------------------------------- fault hooks


def test_fault_rules_reach_the_tasks(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    link = FakeLink()
    config = ExecutorConfig(
        host_id="h1",
        slots=1,
        threads=1,
        work_dir=str(tmp_path / "w"),
        faults_file=str(faults),
        index=4,
    )
    service, thread = start_executor(config, link)
    try:
        wait_for(lambda: bool(link.streams))
        write_rules(str(faults), [{"action": "fail", "stage": 1, "partition": 0}])
        link.send(launch(attempt(0)))
        wait_for(lambda: len(link.reports) == 1)
        failure = link.reports[0][2]
        assert isinstance(failure, ExecutionError)
        assert "injected fault" in failure.message and "executor 4" in failure.message
        link.send(launch(attempt(0, n=1)))  # the rule fired: the retry runs
        wait_for(lambda: len(link.reports) == 2)
        assert isinstance(link.reports[1][2], tuple)
    finally:
        stop_executor(service, thread)


class _DiskFullAtStart:
    """Hooks whose task start fails as a full disk does."""

    def task_started(self, attempt: TaskAttemptId) -> None:
        raise TaskFailedError(disk_full("[Errno 28] No space left on device"))

    def outputs_written(self, attempt: TaskAttemptId, outputs: object) -> None:
        pass

    def task_finished(self, attempt: TaskAttemptId, *, before_report: bool) -> None:
        pass


def test_a_disk_full_failure_makes_the_executor_unhealthy_before_it_is_reported(
    tmp_path: Path,
) -> None:
    link = FakeLink()
    config = ExecutorConfig(
        host_id="h1", slots=1, threads=1, work_dir=str(tmp_path / "work"), heartbeat_interval_s=30
    )
    service = ExecutorService(config, link, _DiskFullAtStart())
    service.start()
    thread = threading.Thread(target=service.serve, daemon=True)
    thread.start()
    try:
        wait_for(lambda: bool(link.streams))
        link.send(launch(attempt(0)))
        wait_for(lambda: len(link.reports) == 1)
        failure = link.reports[0][2]
        assert isinstance(failure, ExecutionError)
        assert failure.problem is ExecutionProblem.DISK_FULL
        # A heartbeat saying why went out before the report (none was due: 30 s).
        (unhealthy, reports_before), *_ = link.health
        assert reports_before == 0
        assert "full" in unhealthy
        assert service.unhealthy().startswith("a task found")
    finally:
        stop_executor(service, thread)


class _SlowAnswers(FakeLink):
    """A scheduler that answers the first report only once told to (``answer``)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = threading.Event()
        self.started: list[TaskAttemptId] = []

    def report_completed(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        outputs: tuple[PartitionOutput, ...],
        elapsed_s: float,
        files: Mapping[str, bytes] | None = None,
        timings: TaskTimings | None = None,
    ) -> None:
        super().report_completed(executor, attempt, outputs, elapsed_s, files, timings)
        if len(self.reports) == 1:
            assert self.answer.wait(30), "the test never let the first report's answer come"


class _SeesStarts(NoHooks):
    """Records the attempts that started (the ``task_started`` hook)."""

    def __init__(self, started: list[TaskAttemptId]) -> None:
        self.started = started

    def task_started(self, attempt: TaskAttemptId) -> None:
        self.started.append(attempt)

    def task_finished(self, attempt: TaskAttemptId, *, before_report: bool) -> None:
        pass


def test_a_slot_runs_its_next_task_while_the_last_report_waits_for_its_answer(
    tmp_path: Path,
) -> None:
    # The scheduler launches the next task the moment it has a report, before it
    # answers; one slot, whose only task thread used to wait for that answer.
    link = _SlowAnswers()
    config = ExecutorConfig(host_id="h1", slots=1, threads=1, work_dir=str(tmp_path / "w"))
    service = ExecutorService(config, link, _SeesStarts(link.started))
    service.start()
    thread = threading.Thread(target=service.serve, daemon=True)
    thread.start()
    try:
        wait_for(lambda: bool(link.streams))
        link.send(launch(attempt(0)))
        wait_for(lambda: len(link.reports) == 1)
        link.send(launch(attempt(1)))
        wait_for(lambda: len(link.reports) == 2)
        assert not link.answer.is_set()
        assert link.started == [attempt(0), attempt(1)]
    finally:
        link.answer.set()
        stop_executor(service, thread)


def test_a_small_result_goes_with_its_report(
    cluster: tuple[ExecutorService, FakeLink],
) -> None:
    _, link = cluster
    link.send(launch(attempt(0), result=True))  # one row: the final stage of a small result
    wait_for(lambda: len(link.reports) == 1)
    (output,) = link.reports[0][2]  # type: ignore[misc]
    with open(output.path, "rb") as f:
        assert link.files[0] == {output.path: f.read()}
    big = f"SELECT repeat('x', {INLINE_OUTPUT_BYTES}) AS n"
    link.send(launch(attempt(1), big, result=True))
    spread = TaskSpec(
        attempt(2), "SELECT 42 AS n", OutputSpec(OutputKind.HASH, 2, ("n",)), ("n",), result=True
    )
    link.send(LaunchTask(0, ExecutorId("e?"), spread))
    # Not the job's result (an earlier stage's): its small file stays off the control plane.
    link.send(launch(attempt(3)))
    wait_for(lambda: len(link.reports) == 4)
    by_attempt = {r[1]: (r[2], f) for r, f in zip(link.reports, link.files, strict=True)}
    outputs, files = by_attempt[attempt(1)]
    assert outputs[0].bytes > INLINE_OUTPUT_BYTES and files == {}  # type: ignore[index]
    outputs, files = by_attempt[attempt(2)]
    assert len(outputs) == 2 and files == {}  # type: ignore[arg-type]
    outputs, files = by_attempt[attempt(3)]
    assert len(outputs) == 1 and outputs[0].bytes < INLINE_OUTPUT_BYTES  # type: ignore[index]
    assert files == {}


class _DamagesOutputs(NoHooks):
    """Flips a byte of each output file once it is written (the ``outputs_written``
    hook), as a failing disk would."""

    def outputs_written(self, attempt: TaskAttemptId, outputs: object) -> None:
        for output in outputs:  # type: ignore[attr-defined]
            with open(output.path, "r+b") as f:
                f.seek(output.bytes // 2)
                byte = f.read(1)
                f.seek(output.bytes // 2)
                f.write(bytes([byte[0] ^ 0xFF]))

    def task_finished(self, attempt: TaskAttemptId, *, before_report: bool) -> None:
        pass


def test_a_damaged_result_file_is_not_carried_with_the_report(tmp_path: Path) -> None:
    # The client trusts a carried file; the Flight read checks the checksum and has
    # the query run again. A file whose bytes no longer match stays for that read.
    link = FakeLink()
    config = ExecutorConfig(host_id="h1", slots=1, threads=1, work_dir=str(tmp_path / "w"))
    service = ExecutorService(config, link, _DamagesOutputs())
    service.start()
    thread = threading.Thread(target=service.serve, daemon=True)
    thread.start()
    try:
        wait_for(lambda: bool(link.streams))
        link.send(launch(attempt(0), result=True))
        wait_for(lambda: len(link.reports) == 1)
        (output,) = link.reports[0][2]  # type: ignore[misc]
        assert output.bytes < INLINE_OUTPUT_BYTES
        assert link.files == [{}]
    finally:
        stop_executor(service, thread)


class _CutOffReports(FakeLink):
    """A scheduler that cannot be reached for the first ``failures`` reports."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.tries = 0

    def report_completed(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        outputs: tuple[PartitionOutput, ...],
        elapsed_s: float,
        files: Mapping[str, bytes] | None = None,
        timings: TaskTimings | None = None,
    ) -> None:
        with self.lock:
            self.tries += 1
            if self.tries <= self.failures:
                raise ClusterError("cannot report a task to the scheduler: UNAVAILABLE")
        super().report_completed(executor, attempt, outputs, elapsed_s, files, timings)


def test_a_report_the_scheduler_cannot_take_is_tried_again_while_the_life_goes_on(
    tmp_path: Path,
) -> None:
    # A scheduler cut off for a while keeps this executor (it defers losses when
    # most executors fall silent at once): a report dropped then would leave
    # the task running there forever.
    link = _CutOffReports(failures=2)
    config = ExecutorConfig(host_id="h1", slots=1, threads=1, work_dir=str(tmp_path / "w"))
    service, thread = start_executor(config, link)
    try:
        wait_for(lambda: bool(link.streams))
        link.send(launch(attempt(0)))
        wait_for(lambda: len(link.reports) == 1)
        assert link.tries == 3 and link.reports[0][1] == attempt(0)
        assert len(link.registrations) == 1  # the same life throughout
    finally:
        stop_executor(service, thread)
