"""The executor's line to the scheduler: a ``SchedulerLink`` and its gRPC version.

``ExecutorService`` talks to the scheduler only through the ``SchedulerLink``
protocol, in domain types, so its control loop is tested with an in-memory
fake and runs against the real scheduler through ``GrpcSchedulerLink``, which
is the only executor module that touches the generated protobuf code.

The conversation (``mangonel.proto``'s ``ExecutorControl`` service):
``register`` gives the executor its id; ``connect`` opens the stream on which
the scheduler pushes ``LaunchTask``/``CancelTask``/``ReleaseOutputs`` the moment
it decides them (when the stream breaks, the scheduler counts the executor as
lost, so it must register again under a new id); ``heartbeat`` runs on its own
thread and a connection of its own (bulk messages on the others cannot
delay it); ``report_*`` says how each task attempt ended, on a connection of
their own too; ``drain`` says the executor is leaving (the scheduler then
closes the stream once nothing needs it).

**After a cut.** Bytes a connection sent into a cut link wait for TCP to send
them again, and TCP backs off, doubling its wait each time (0.2 s, 0.4 s, ...,
up to two minutes): after a 6 s cut the next try may come seconds after the
heal (measured on the lab: the heartbeats and a report of every executor
arrived 0.85 s after the heal, in other runs 3 s), and whatever else is sent
on that connection waits behind them. So the heartbeat and report connections
are thrown away rather than waited for (``_Line``): a heartbeat that fails or
is not answered within ``HEARTBEAT_DEADLINE_S`` makes the next one go on a new
connection, which connects the moment the link is back; and the first answered
heartbeat after a failed one (the link is back) moves the reports to a new
connection too, the ones in flight on the old one sent again at once, and has
the executor move its command stream (``reopen``: a new ``Connect`` on a new
connection, which the scheduler takes for the same executor, closing the old
stream without a loss, sending again the launches the executor never had and
the releases of the ended jobs it still has files of; ``scheduler.state_streams``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from mangonel import defaults
from mangonel.errors import ClusterError
from mangonel.ids import ExecutorId, TaskAttemptId
from mangonel.proto import convert
from mangonel.proto import mangonel_pb2 as pb
from mangonel.proto import mangonel_pb2_grpc as pb_grpc
from mangonel.security import tls
from mangonel.task import LinkSample, PartitionOutput, ProbeTarget, TaskFailure, TaskTimings

ExecutorCommand = convert.ExecutorCommandKind
"""``LaunchTask | CancelTask | ReleaseOutputs``."""

_MAX_MESSAGE_BYTES = defaults.GRPC_MAX_MESSAGE_BYTES
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    # The command stream is idle between queries: pings find a dead scheduler
    # (or a cut link) instead of waiting on a silent socket forever.
    # 20 s for the answer, as the scheduler's own (``scheduler.main``): a short
    # cut of the scheduler must not break the stream, which would end this life.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    # gRPC 1.85 waits this long for a ping's answer, whatever the keepalive
    # timeout (default 60 s): see ``client.rpc.keepalive_options``.
    ("grpc.http2.ping_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # A restarted scheduler is found again within a second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

_OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)
"""A channel option: this channel opens its own connection (``GrpcSchedulerLink``)."""

HEARTBEAT_DEADLINE_S = 1.0
"""A heartbeat not answered within this many seconds is given up, and the next
one goes on a new connection: the old one is taken for stuck behind a cut
(TCP's back-off, see the module docstring). Well under the silence that has an
executor suspected (about 2 s, ``scheduler.detector``), so a cut costs the
scheduler at most one beat more than the cut itself; an answer slower than
this on a busy host only costs a new connection (the beat itself arrived)."""


REOPEN_DEADLINE_S = 2.0
"""How long a new command stream may take to be accepted (``reopen``). Its
connection is new, so a link that is back connects at once; one that failed
again (a flapping link) is tried again at the next recovery, the old stream
kept meanwhile."""


@dataclass(frozen=True)
class Registration:
    """What the executor says about itself when it registers."""

    host: str
    flight_address: str
    slots: int
    pid: int
    work_dir: str
    resume: ExecutorId | None = None
    """The life to go on with after the command stream broke (see ``RegisterReply.resumed``)."""
    held_paths: tuple[str, ...] = ()
    """Output files that life still has."""
    held_jobs: tuple[str, ...] = ()
    """Jobs that life has files of."""
    cores: int = 0
    """The cores its tasks share (``ExecutorInfo.cores``)."""
    threads: int = 0
    """DuckDB threads of each slot (``ExecutorInfo.threads``)."""


@dataclass(frozen=True)
class RegisterReply:
    """The scheduler's answer: this life's id and how often to heartbeat."""

    executor: ExecutorId
    heartbeat_interval_s: float
    resumed: bool = False
    """The scheduler (restarted) took the ``resume`` life back, files and all."""


class CommandStream(Protocol):
    """The scheduler's commands to one registered executor, as they come."""

    def __iter__(self) -> Iterator[ExecutorCommand]: ...

    def cancel(self) -> None:
        """End the stream from this side (iteration stops); thread-safe."""
        ...


@dataclass(frozen=True)
class HeartbeatReply:
    """The scheduler's answer to a heartbeat."""

    known: bool
    """False: the scheduler no longer knows the executor; register again."""
    probe: tuple[ProbeTarget, ...] = ()
    """The peers to probe the links from until the next answer (``executor.probes``)."""
    link_back: bool = False
    """The first answered after failed ones: the link came back (``LinkRecovered``)."""


class SchedulerLink(Protocol):
    """Everything an executor says to and hears from the scheduler.

    Every method raises ``ClusterError`` when the scheduler cannot be reached.
    """

    def register(self, registration: Registration) -> RegisterReply: ...

    def connect(self, executor: ExecutorId) -> CommandStream: ...

    def reopen(
        self,
        executor: ExecutorId,
        holding: frozenset[TaskAttemptId],
        finished: frozenset[TaskAttemptId],
        held_jobs: Sequence[str] = (),
    ) -> CommandStream:
        """A new command stream of live ``executor``, on a new connection, once
        the scheduler accepted it (it then closes the old one and sends again
        what the old one may have held); ``holding`` and ``finished``: see
        ``executor.events.MoveStream``; ``held_jobs``: the jobs it has shuffle
        files of (the scheduler releases those of the ended ones, their
        ``ReleaseOutputs`` maybe lost in the cut). Raises ``ClusterError`` when
        refused or not accepted within ``REOPEN_DEADLINE_S``."""
        ...

    def heartbeat(
        self,
        executor: ExecutorId,
        running_tasks: int,
        unhealthy: str = "",
        links: Sequence[LinkSample] = (),
        probes: Sequence[LinkSample] = (),
    ) -> HeartbeatReply:
        """Whether the scheduler still knows ``executor`` (if not: register
        again), and the peers to probe.

        ``unhealthy``: why the executor can take no task now (``""``: it can).
        ``links``: what its fetches received from each peer since the last beat.
        ``probes``: its link probes since the last beat (``executor.probes``).
        """
        ...

    def report_completed(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        outputs: tuple[PartitionOutput, ...],
        elapsed_s: float,
        files: Mapping[str, bytes] | None = None,
        timings: TaskTimings | None = None,
    ) -> None:
        """``files``: the whole files of some outputs, by path, sent along (a small
        result the scheduler hands the client with the job's end); ``timings``:
        where the attempt's time went."""
        ...

    def report_failed(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        failure: TaskFailure,
        elapsed_s: float,
        timings: TaskTimings | None = None,
    ) -> None: ...

    def drain(self, executor: ExecutorId) -> None:
        """Say that ``executor`` leaves: no new tasks; close its stream when done with it."""
        ...

    def close(self) -> None: ...


class _GrpcCommandStream:
    """``CommandStream`` over a Connect call; ``channel``: a connection of its
    own (a moved stream's), closed when the stream is cancelled."""

    def __init__(
        self,
        call: Iterator[pb.ExecutorCommand],
        executor: ExecutorId,
        channel: grpc.Channel | None = None,
    ) -> None:
        self._call = call
        self._executor = executor
        self._channel = channel

    def __iter__(self) -> Iterator[ExecutorCommand]:
        try:
            for msg in self._call:
                yield convert.command_from_proto(msg, self._executor)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                return  # we ended it
            raise ClusterError(f"the scheduler's command stream broke: {_describe(exc)}") from exc
        finally:
            if self._channel is not None:
                self._channel.close()

    def cancel(self) -> None:
        self._call.cancel()  # type: ignore[attr-defined]
        if self._channel is not None:
            self._channel.close()


class GrpcSchedulerLink:
    """``SchedulerLink`` over the scheduler's ``ExecutorControl`` gRPC service.

    Args:
        address: ``host:port`` of the scheduler, or several separated by commas
            (a highly available pair: only the leader listens). Registering
            tries each in turn until one answers; every other call goes to the
            one that took the registration.
        rpc_timeout_s: Limit on each unary call (register, heartbeat, report).
        tls_material: TLS: trust only the cluster CA (a scheduler without a
            certificate it signed, for the address dialled, is refused) and
            present the node certificate; ``None``: plaintext.
    """

    def __init__(
        self,
        address: str,
        rpc_timeout_s: float = 10.0,
        tls_material: tls.TlsMaterial | None = None,
    ) -> None:
        self.addresses = [a.strip() for a in address.split(",") if a.strip()]
        if not self.addresses:
            raise ClusterError(f"no scheduler address in {address!r}")
        self.rpc_timeout_s = rpc_timeout_s
        self._current = 0
        self._tls = tls_material
        self._channels = [
            tls.open_channel(a, tls_material, _CHANNEL_OPTIONS) for a in self.addresses
        ]
        self._stubs = [pb_grpc.ExecutorControlStub(c) for c in self._channels]  # type: ignore[no-untyped-call]
        # Heartbeats on a connection of their own: the command stream carries
        # task specs (megabytes for a big plan) and the reports carry result
        # files, and a heartbeat queued behind them on one HTTP/2 connection
        # would look like silence to the failure detector. A local subchannel
        # pool keeps gRPC from sharing the other channel's connection.
        self._beats = [self._line(a) for a in self.addresses]
        # Reports on a connection of their own as well: one sent into a cut
        # must not hold up the command stream's connection, and it is moved
        # to a new connection when the link is back (module docstring).
        self._reports = [self._line(a) for a in self.addresses]
        self._beats_failed = 0
        """Heartbeats failed since the last answered one (the next one says so)."""
        self._beats_failed_by: ExecutorId | None = None
        """The life whose heartbeats failed (a new life starts from none)."""

    @property
    def address(self) -> str:
        return self.addresses[self._current]

    def _line(self, address: str) -> _Line:
        return _Line(address, self._tls, [*_CHANNEL_OPTIONS, _OWN_CONNECTION])

    @property
    def _stub(self) -> pb_grpc.ExecutorControlStub:
        return self._stubs[self._current]

    def register(self, registration: Registration) -> RegisterReply:
        request = pb.RegisterExecutorRequest(
            host=registration.host,
            flight_address=registration.flight_address,
            slots=registration.slots,
            pid=registration.pid,
            work_dir=registration.work_dir,
            resume_executor_id=registration.resume or "",
            held_paths=list(registration.held_paths),
            held_jobs=list(registration.held_jobs),
            cores=registration.cores,
            threads=registration.threads,
        )
        errors = []
        hint = ""
        for _ in self.addresses:
            try:
                reply = self._stub.RegisterExecutor(request, timeout=self.rpc_timeout_s)
                return RegisterReply(
                    ExecutorId(reply.executor_id), reply.heartbeat_interval_s, reply.resumed
                )
            except grpc.RpcError as exc:
                described = _describe(exc)
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    hint = "; the scheduler refused this executor's certificate"
                elif exc.code() == grpc.StatusCode.UNAVAILABLE:
                    hint = f"; {tls.describe_failure(described, self._tls is not None)}"
                errors.append(f"{self.address}: {described}")
                self._current = (self._current + 1) % len(self.addresses)
        raise ClusterError(
            f"cannot register with a scheduler ({'; '.join(errors)}); is a scheduler running "
            f"there?{hint}"
        )

    def connect(self, executor: ExecutorId) -> CommandStream:
        call = self._stub.Connect(pb.ConnectRequest(executor_id=executor))
        return _GrpcCommandStream(call, executor)

    def reopen(
        self,
        executor: ExecutorId,
        holding: frozenset[TaskAttemptId],
        finished: frozenset[TaskAttemptId],
        held_jobs: Sequence[str] = (),
    ) -> CommandStream:
        request = pb.ConnectRequest(
            executor_id=executor,
            reopen=True,
            holding=[convert.attempt_to_proto(a) for a in sorted(holding, key=str)],
            finished=[convert.attempt_to_proto(a) for a in sorted(finished, key=str)],
            held_jobs=list(held_jobs),
        )
        channel = tls.open_channel(self.address, self._tls, [*_CHANNEL_OPTIONS, _OWN_CONNECTION])
        stub = pb_grpc.ExecutorControlStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Connect(request)
        # The scheduler sends its (empty) initial metadata once it accepted the
        # stream; a refusal ends the call instead. Not accepted in time: given up.
        timer = threading.Timer(REOPEN_DEADLINE_S, call.cancel)
        timer.start()
        try:
            call.initial_metadata()
        finally:
            timer.cancel()
        if call.done():
            channel.close()
            try:
                call.result()
                what = "ended it"
            except grpc.RpcError as exc:
                what = _describe(exc)
            except grpc.FutureCancelledError:
                what = f"no answer within {REOPEN_DEADLINE_S:g} s"
            raise ClusterError(f"the scheduler did not take a new command stream: {what}")
        return _GrpcCommandStream(call, executor, channel)

    def heartbeat(
        self,
        executor: ExecutorId,
        running_tasks: int,
        unhealthy: str = "",
        links: Sequence[LinkSample] = (),
        probes: Sequence[LinkSample] = (),
    ) -> HeartbeatReply:
        if executor != self._beats_failed_by:
            self._beats_failed = 0  # another life's: its link, not this one's
        request = pb.HeartbeatRequest(
            executor_id=executor,
            running_tasks=running_tasks,
            unhealthy=unhealthy,
            links=convert.links_to_proto(links),
            probes=convert.links_to_proto(probes),
            failed_beats=self._beats_failed,
        )
        line = self._beats[self._current]
        stub, _ = line.current()
        try:
            reply = stub.Heartbeat(request, timeout=min(self.rpc_timeout_s, HEARTBEAT_DEADLINE_S))
        except grpc.RpcError as exc:
            line.renew()
            self._beats_failed += 1
            self._beats_failed_by = executor
            raise self._error("send a heartbeat to", exc) from exc
        back = self._beats_failed > 0
        if back:
            # The link is back: reports still in flight went into the cut.
            self._beats_failed = 0
            self._reports[self._current].renew()
        return HeartbeatReply(
            not reply.reregister, convert.probe_targets_from_proto(reply), link_back=back
        )

    def report_completed(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        outputs: tuple[PartitionOutput, ...],
        elapsed_s: float,
        files: Mapping[str, bytes] | None = None,
        timings: TaskTimings | None = None,
    ) -> None:
        completed = pb.TaskCompletedReport(
            outputs=[convert.partition_output_to_proto(o) for o in outputs]
        )
        if files:
            for msg in completed.outputs:
                data = files.get(msg.path)
                if data:
                    msg.data = data
        self._report(
            pb.ReportTaskRequest(
                attempt=convert.attempt_to_proto(attempt),
                executor_id=executor,
                completed=completed,
                elapsed_s=elapsed_s,
                timings=convert.timings_to_proto(timings),
            )
        )

    def report_failed(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        failure: TaskFailure,
        elapsed_s: float,
        timings: TaskTimings | None = None,
    ) -> None:
        self._report(
            pb.ReportTaskRequest(
                attempt=convert.attempt_to_proto(attempt),
                executor_id=executor,
                failed=convert.failure_to_proto(failure),
                elapsed_s=elapsed_s,
                timings=convert.timings_to_proto(timings),
            )
        )

    def drain(self, executor: ExecutorId) -> None:
        try:
            self._stub.Drain(pb.DrainRequest(executor_id=executor), timeout=self.rpc_timeout_s)
        except grpc.RpcError as exc:
            raise self._error("drain with", exc) from exc

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        for line in [*self._beats, *self._reports]:
            line.close()

    def _report(self, request: pb.ReportTaskRequest) -> None:
        line = self._reports[self._current]
        while True:
            stub, generation = line.current()
            try:
                stub.ReportTask(request, timeout=self.rpc_timeout_s)
                return
            except grpc.RpcError as exc:
                if line.current()[1] != generation:
                    continue  # moved to a new connection under it (the link is back): again
                raise self._error("report a task to", exc) from exc

    def _error(self, what: str, exc: grpc.RpcError) -> ClusterError:
        return ClusterError(
            f"cannot {what} the scheduler at {self.address}: {_describe(exc)}; "
            "is the scheduler running there?"
        )


class _Line:
    """A channel to one address that can be swapped for a new one (a new
    connection), the calls in flight on the old one cancelled; thread-safe."""

    def __init__(
        self, address: str, material: tls.TlsMaterial | None, options: list[tuple[str, Any]]
    ) -> None:
        self._open = lambda: tls.open_channel(address, material, options)
        self._lock = threading.Lock()
        self._channel = self._open()
        self._stub = pb_grpc.ExecutorControlStub(self._channel)  # type: ignore[no-untyped-call]
        self._generation = 0
        self._closed = False

    def current(self) -> tuple[pb_grpc.ExecutorControlStub, int]:
        """The stub to call, and the generation of its channel."""
        with self._lock:
            return self._stub, self._generation

    def renew(self) -> None:
        """A new channel from now on; the old one closed (its calls fail, cancelled)."""
        with self._lock:
            if self._closed:
                return
            old = self._channel
            self._channel = self._open()
            self._stub = pb_grpc.ExecutorControlStub(self._channel)  # type: ignore[no-untyped-call]
            self._generation += 1
        old.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channel = self._channel
        channel.close()


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'error'}: {details}"
