"""The executor's heartbeats and reports leave a connection that a cut left stuck
(``executor.link``, "After a cut").

A real gRPC server in this process stands for the scheduler; a call it holds
unanswered is what a cut link looks like from the executor (the bytes went out,
nothing comes back). Which connection a call came on is the caller's address as
the server saw it: a new port is a new connection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pytest

from mangonel.errors import ClusterError
from mangonel.executor.link import GrpcSchedulerLink
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.proto import mangonel_pb2 as pb
from mangonel.proto import mangonel_pb2_grpc as pb_grpc

EXECUTOR = ExecutorId("exec-1")
ATTEMPT = TaskAttemptId(TaskId(JobId("j1"), StageId(1), 0), 0)


@dataclass
class _Scheduler(pb_grpc.ExecutorControlServicer):
    """Answers heartbeats and reports, or holds the next ones unanswered."""

    hold_beats: int = 0
    hold_reports: int = 0
    beats: list[str] = field(default_factory=list)
    """The caller's address of each heartbeat, in order."""
    failed: list[int] = field(default_factory=list)
    """What each heartbeat said of the failed ones before it."""
    reports: list[str] = field(default_factory=list)
    streams: list[tuple[str, pb.ConnectRequest]] = field(default_factory=list)
    """The caller's address and request of each Connect."""
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> object:
        with self.lock:
            self.beats.append(context.peer())
            self.failed.append(request.failed_beats)
            hold, self.hold_beats = self.hold_beats > 0, max(0, self.hold_beats - 1)
        if hold:
            self.released.wait(30)
        return pb.HeartbeatResponse()

    def Connect(
        self, request: pb.ConnectRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ExecutorCommand]:
        with self.lock:
            self.streams.append((context.peer(), request))
        if request.executor_id != EXECUTOR:
            context.abort(grpc.StatusCode.NOT_FOUND, "not live; register again")
        context.send_initial_metadata(())  # taken, as the scheduler says it
        self.released.wait(30)
        yield from ()

    def ReportTask(self, request: pb.ReportTaskRequest, context: grpc.ServicerContext) -> object:
        with self.lock:
            self.reports.append(context.peer())
            hold, self.hold_reports = self.hold_reports > 0, max(0, self.hold_reports - 1)
        if hold:
            self.released.wait(30)
        return pb.ReportTaskResponse()


@pytest.fixture
def scheduler() -> Iterator[tuple[_Scheduler, GrpcSchedulerLink]]:
    servicer = _Scheduler()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_ExecutorControlServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    link = GrpcSchedulerLink(f"127.0.0.1:{port}")
    try:
        yield servicer, link
    finally:
        servicer.released.set()
        link.close()
        server.stop(0)


def test_an_unanswered_heartbeat_is_given_up_and_the_next_goes_on_a_new_connection(
    scheduler: tuple[_Scheduler, GrpcSchedulerLink],
) -> None:
    servicer, link = scheduler
    assert link.heartbeat(EXECUTOR, 0).known
    servicer.hold_beats = 1
    with pytest.raises(ClusterError, match="heartbeat"):
        link.heartbeat(EXECUTOR, 0)  # given up at the deadline, not the 10 s RPC timeout
    assert link.heartbeat(EXECUTOR, 0).known
    first, held, after = servicer.beats
    assert held == first, "the held beat went on the connection in use"
    assert after != held, "the beat after a failed one reused the stuck connection"
    assert servicer.failed == [0, 0, 1]  # the scheduler hears that its link was down


def test_a_report_in_flight_when_the_link_is_back_is_sent_again_on_a_new_connection(
    scheduler: tuple[_Scheduler, GrpcSchedulerLink],
) -> None:
    servicer, link = scheduler
    servicer.hold_reports = 1
    delivered = threading.Event()

    def report() -> None:
        link.report_completed(EXECUTOR, ATTEMPT, (), 0.1)
        delivered.set()

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    for _ in range(200):  # until the held report reached the server
        if servicer.reports:
            break
        delivered.wait(0.05)
    assert servicer.reports, "the report never reached the server"
    servicer.hold_beats = 1
    with pytest.raises(ClusterError):
        link.heartbeat(EXECUTOR, 0)  # the cut, as the heartbeats see it
    assert not delivered.is_set()
    assert link.heartbeat(EXECUTOR, 0).known  # the link is back
    assert delivered.wait(10), "the report stayed on the stuck connection"
    reporter.join(10)
    held, again = servicer.reports
    assert again != held, "the report was sent again on the same connection"
    assert not servicer.released.is_set(), "the held call was never answered: it was cancelled"


def test_the_heartbeat_after_failed_ones_says_the_link_is_back_for_that_life_only(
    scheduler: tuple[_Scheduler, GrpcSchedulerLink],
) -> None:
    servicer, link = scheduler
    servicer.hold_beats = 1
    with pytest.raises(ClusterError):
        link.heartbeat(EXECUTOR, 0)
    assert link.heartbeat(EXECUTOR, 0).link_back  # the executor moves its stream
    assert not link.heartbeat(EXECUTOR, 0).link_back
    # Failed beats of one life say nothing of the next one's link.
    servicer.hold_beats = 1
    with pytest.raises(ClusterError):
        link.heartbeat(EXECUTOR, 0)
    assert not link.heartbeat(ExecutorId("exec-2"), 0).link_back
    assert servicer.failed[-1] == 0


def test_a_moved_stream_goes_on_a_new_connection_saying_what_the_executor_holds(
    scheduler: tuple[_Scheduler, GrpcSchedulerLink],
) -> None:
    servicer, link = scheduler
    done = TaskAttemptId(TaskId(JobId("j1"), StageId(1), 1), 0)
    first = link.connect(EXECUTOR)
    arrived = threading.Event()
    for _ in range(200):  # until the first stream reached the server
        if servicer.streams:
            break
        arrived.wait(0.05)
    assert servicer.streams, "the first stream never reached the server"
    # Once taken:
    moved = link.reopen(EXECUTOR, frozenset({ATTEMPT}), frozenset({done}), ("j0", "j1"))
    (old_peer, old), (new_peer, new) = servicer.streams
    assert not old.reopen and new.reopen and new_peer != old_peer
    assert [(a.stage, a.partition) for a in new.holding] == [(1, 0)]
    assert [(a.stage, a.partition) for a in new.finished] == [(1, 1)]
    assert list(new.held_jobs) == ["j0", "j1"]
    moved.cancel()
    first.cancel()
    # A stream the scheduler refuses (the executor is not live) is no move.
    with pytest.raises(ClusterError, match="did not take a new command stream"):
        link.reopen(ExecutorId("exec-9"), frozenset(), frozenset())
