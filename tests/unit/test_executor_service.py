"""ExecutorService's control loop against an in-memory SchedulerLink."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.flight as flight
import pytest

from mangonel.errors import ClusterError
from mangonel.executor.config import ExecutorConfig
from mangonel.executor.link import ExecutorCommand, Registered, Registration
from mangonel.executor.main import start_executor, stop_executor
from mangonel.executor.service import ExecutorService
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.plan.physical import OutputKind, OutputSpec
from mangonel.scheduler.events import (
    CancelTask,
    LaunchTask,
    PartitionOutput,
    QueryError,
    ReleaseOutputs,
    TaskFailure,
    TaskSpec,
)

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
        self.reports: list[
            tuple[ExecutorId, TaskAttemptId, tuple[PartitionOutput, ...] | TaskFailure]
        ] = []
        self.known = True
        self.failures_before_register = failures_before_register
        self.closed = False

    def register(self, registration: Registration) -> Registered:
        with self.lock:
            if self.failures_before_register:
                self.failures_before_register -= 1
                raise ClusterError("scheduler not up yet")
            self.registrations.append(registration)
            self.known = True
            return Registered(ExecutorId(f"e{len(self.registrations)}"), 0.05)

    def connect(self, executor: ExecutorId) -> FakeStream:
        stream = FakeStream()
        with self.lock:
            self.streams.append(stream)
        return stream

    def heartbeat(self, executor: ExecutorId, running_tasks: int) -> bool:
        with self.lock:
            self.heartbeats.append((executor, running_tasks, time.monotonic()))
            return self.known

    def report_completed(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        outputs: tuple[PartitionOutput, ...],
        elapsed_s: float,
    ) -> None:
        with self.lock:
            self.reports.append((executor, attempt, outputs))

    def report_failed(
        self, executor: ExecutorId, attempt: TaskAttemptId, failure: TaskFailure, elapsed_s: float
    ) -> None:
        with self.lock:
            self.reports.append((executor, attempt, failure))

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


def launch(a: TaskAttemptId, sql: str = "SELECT 42 AS n") -> LaunchTask:
    return LaunchTask(0, ExecutorId("e?"), TaskSpec(a, sql, SINGLE, ("n",)))


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[tuple[ExecutorService, FakeLink]]:
    link = FakeLink()
    config = ExecutorConfig(
        host="h1",
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
    link.send(launch(attempt(0)))
    wait_for(lambda: len(link.reports) == 1)
    executor, att, result = link.reports[0]
    assert executor == "e1" and att == attempt(0)
    assert isinstance(result, tuple) and result[0].rows == 1
    client = flight.FlightClient(f"grpc://{reg.flight_address}")
    table = client.do_get(flight.Ticket(result[0].path.encode())).read_all()
    client.close()
    assert table.column("n").to_pylist() == [42]


def test_failures_are_reported_typed(cluster: tuple[ExecutorService, FakeLink]) -> None:
    _, link = cluster
    link.send(launch(attempt(0), "SELECT nope"))
    wait_for(lambda: len(link.reports) == 1)
    assert isinstance(link.reports[0][2], QueryError)


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
    config = ExecutorConfig(host="h1", slots=1, work_dir=str(tmp_path / "w"))
    service, thread = start_executor(config, link)
    try:
        wait_for(lambda: service.registered.is_set())
        assert len(link.registrations) == 1
    finally:
        stop_executor(service, thread)
    assert not os.path.exists(os.path.join(config.work_dir, "spill"))
