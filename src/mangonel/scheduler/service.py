"""The scheduler's gRPC services: ``ExecutorControl`` and ``QueryService``.

Thin servicers over ``SchedulerCore``: they convert messages with
``mangonel.proto.convert`` (the status messages they answer are built in
``service_status``) and map mangonel errors to gRPC status codes. A
mangonel error travels with its class name in the trailing metadata key
``mangonel-error``, so the client re-raises the same type with the same message.

``QueryService`` authenticates every call but ``Authenticate`` (the login)
with the scheduler's ``Authenticator``: the token comes in the metadata
``authorization: Bearer <token>``; a missing, malformed, forged or expired one
is refused with UNAUTHENTICATED (``AuthenticationError``), another user's job
with PERMISSION_DENIED (``PermissionDeniedError`` from ``Principal.check_sees``,
the check every front door shares), and each refusal is logged
here with the caller's address. Users see, watch, read and cancel their own
jobs; admins every job, and only admins register and drop tables. Without
users (``OPEN``) every caller is the anonymous admin, as before. The
``ExecutorControl`` service is the cluster members' own: it is not
user-authenticated (mutual TLS keeps others out).
"""

from __future__ import annotations

import functools
import logging
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar, cast

import grpc

from mangonel import textfiles
from mangonel.errors import (
    AuthenticationError,
    CatalogError,
    InternalError,
    LoginThrottledError,
    MangonelError,
    PermissionDeniedError,
    QueryError,
    SchedulerStoppingError,
    StateStoreError,
    plain_text,
)
from mangonel.ids import ExecutorId, JobId
from mangonel.proto import convert
from mangonel.proto import mangonel_pb2 as pb
from mangonel.proto import mangonel_pb2_grpc as pb_grpc
from mangonel.scheduler import doors
from mangonel.scheduler.breakdown import stage_phases
from mangonel.scheduler.core import ExecutorNotFoundError, JobNotFoundError, SchedulerCore
from mangonel.scheduler.jobs import JobWatch
from mangonel.scheduler.registry import CLOSE
from mangonel.scheduler.service_status import (
    attach_result_files,
    executor_status,
    job_status,
    table_info,
)
from mangonel.scheduler.tickets import TicketIssuer
from mangonel.security import tls, tokens
from mangonel.security.auth import (
    ANONYMOUS,
    AUTHORIZATION,
    OPEN,
    Authenticator,
    Principal,
    bearer_token,
)
from mangonel.security.login_limits import peer_host
from mangonel.security.options import NODE_NAME
from mangonel.task import FileFormat

log = logging.getLogger(__name__)

ERROR_METADATA_KEY = "mangonel-error"
"""Trailing metadata key holding the ``mangonel.errors`` class name of a failure."""

# Progress messages of WatchJob are sent at most this often; the final one at once.
_WATCH_MIN_INTERVAL_S = 0.1
# How often an executor's idle command stream looks whether it should end anyway.
_STREAM_CHECK_S = 1.0

F = TypeVar("F", bound=Callable[..., Any])


def abort(context: grpc.ServicerContext, exc: BaseException, method: str = "") -> NoReturn:
    """End the RPC with the status code and metadata that ``exc`` maps to.

    A refusal (``SecurityError``) is logged with the caller's address and the
    RPC (``method``): the scheduler's log shows who was turned away and why.
    A ``StateStoreError`` is ``UNAVAILABLE``: a write that failed is fatal, so this
    scheduler stops serving, and the client calls again once the leader (or this
    one, started again) answers. So is a ``SchedulerStoppingError``: the call met
    the scheduler's stop and did nothing.
    """
    if isinstance(exc, AuthenticationError | PermissionDeniedError):
        log.warning("refused %s from %s: %s", method or "a call", context.peer(), exc)
    if isinstance(exc, LoginThrottledError):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    elif isinstance(exc, AuthenticationError):
        code = grpc.StatusCode.UNAUTHENTICATED
    elif isinstance(exc, PermissionDeniedError):
        code = grpc.StatusCode.PERMISSION_DENIED
    elif isinstance(exc, QueryError | CatalogError):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(exc, InternalError):
        log.error("internal error (a bug in mangonel) in %s: %s", method or "a call", exc)
        code = grpc.StatusCode.INTERNAL
    elif isinstance(exc, StateStoreError | SchedulerStoppingError):
        code = grpc.StatusCode.UNAVAILABLE
    elif isinstance(exc, JobNotFoundError | ExecutorNotFoundError):
        code = grpc.StatusCode.NOT_FOUND
    elif isinstance(exc, MangonelError):
        code = grpc.StatusCode.FAILED_PRECONDITION
    elif isinstance(exc, NotImplementedError):
        code = grpc.StatusCode.UNIMPLEMENTED
    else:
        log.exception("internal error in an RPC", exc_info=exc)
        code = grpc.StatusCode.INTERNAL
    if isinstance(exc, MangonelError):
        context.set_trailing_metadata(((ERROR_METADATA_KEY, _error_name(exc)),))
    message = plain_text(str(exc)) or type(exc).__name__
    if code is grpc.StatusCode.INTERNAL:
        message = f"internal scheduler error: {type(exc).__name__}: {message}"
    context.abort(code, message)
    raise AssertionError("unreachable: context.abort raises")


def _error_name(exc: MangonelError) -> str:
    # Errors defined outside mangonel.errors (JobNotFoundError, ...) travel as their
    # nearest public base, so the client can always rebuild them.
    import mangonel.errors as errors

    for cls in type(exc).__mro__:
        if getattr(errors, cls.__name__, None) is cls:
            return str(cls.__name__)
    return "MangonelError"


def rpc(method: F) -> F:
    """Map any exception a unary method raises to a gRPC status."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Exception as exc:  # every failure must reach the caller as a status
            abort(context, exc, method.__name__)

    return cast(F, wrapper)


# --------------------------------------------------------------------- services


class ExecutorControlServicer(pb_grpc.ExecutorControlServicer):
    """What executors call: register, command stream, heartbeats, reports, drain.

    Args:
        core: The scheduler.
        tickets: Signs the input locations of launched tasks (a cluster with a
            secret); ``None``: the paths go out as they are.
        members_only: (TLS) Every call must come with a cluster member's
            certificate (common name ``mangonel-node``). Only the cluster port
            asks callers for a certificate (and its TLS handshake proved it the
            cluster CA's); a caller of the client port shows none, and is refused.
        cluster_address: The cluster port's address, for the refusal's message.
    """

    def __init__(
        self,
        core: SchedulerCore,
        tickets: TicketIssuer | None = None,
        members_only: bool = False,
        cluster_address: str | None = None,
    ) -> None:
        self.core = core
        self.tickets = tickets
        self.members_only = members_only
        self.cluster_address = cluster_address

    def _admit(self, context: grpc.ServicerContext, what: str) -> None:
        """Refuse a caller that is not a cluster member (see ``members_only``)."""
        if not self.members_only or tls.is_node(context):
            return
        role = tls.peer_role(context)
        log.warning(
            "refused %s from %s: its certificate (%s) is not a cluster member's (%s)",
            what,
            context.peer(),
            role or "none: the client port asks for none",
            NODE_NAME,
        )
        if role is None:
            port = self.cluster_address or "--cluster-port"
            raise PermissionDeniedError(
                f"only a cluster member may {what}, and this port serves clients: executors "
                f"register at the scheduler's cluster port ({port}) with the node files of "
                "`mangonel certs init` (--tls-dir DIR/cluster)"
            )
        raise PermissionDeniedError(
            f"only a cluster member may {what}: this certificate ({role}) is not the cluster's "
            f"node certificate ({NODE_NAME}); start executors with the node files of "
            "`mangonel certs init` (--tls-dir DIR/cluster)"
        )

    @rpc
    def RegisterExecutor(
        self, request: pb.RegisterExecutorRequest, context: grpc.ServicerContext
    ) -> pb.RegisterExecutorResponse:
        self._admit(context, "register as an executor")
        resume = ExecutorId(request.resume_executor_id) if request.resume_executor_id else None
        entry = self.core.register_executor(
            request.host,
            request.flight_address,
            request.slots,
            request.pid,
            request.work_dir,
            resume=resume,
            held=frozenset(request.held_paths),
            held_jobs=tuple(request.held_jobs),
            cores=request.cores,
            threads=request.threads,
        )
        return pb.RegisterExecutorResponse(
            executor_id=entry.id,
            heartbeat_interval_s=self.core.config.heartbeat_interval_s,
            resumed=entry.resumed,
        )

    def Connect(
        self, request: pb.ConnectRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ExecutorCommand]:
        executor = ExecutorId(request.executor_id)
        try:
            self._admit(context, "open an executor's command stream")
            if request.reopen:
                stream = self.core.executor_reopened(
                    executor,
                    frozenset(convert.attempt_from_proto(a) for a in request.holding),
                    frozenset(convert.attempt_from_proto(a) for a in request.finished),
                    tuple(request.held_jobs),
                )
            else:
                stream = self.core.executor_connected(executor)
        except MangonelError as exc:
            abort(context, exc)

        def closed() -> None:
            # Runs when the RPC ends for any reason: the executor died, its network
            # broke, we closed the stream, or a new one replaced it. The core
            # ignores the last two.
            self.core.connection_closed(executor, "its command stream broke", stream.id)
            stream.commands.put(CLOSE)

        if not context.add_callback(closed):
            closed()  # the RPC ended already (the server stopping under it): so does this
            return
        # The executor waits for this before it lets go of its old stream (a
        # reopen): the new one is the executor's from now on.
        context.send_initial_metadata(())
        log.info("executor %s connected%s", executor, " again" if request.reopen else "")
        while True:
            try:
                item = stream.commands.get(timeout=_STREAM_CHECK_S)
            except queue.Empty:
                # Nothing to send. A stream that no CLOSE can reach any more (opened
                # as the scheduler stopped) must not hold its thread, and the
                # process's exit, for ever.
                if context.is_active() and not self.core.stopped:
                    continue
                item = CLOSE
            if item is CLOSE:
                log.info("closing the command stream of executor %s", executor)
                return
            msg = convert.command_to_proto(cast(convert.ExecutorCommandKind, item))
            if self.tickets is not None:
                self.tickets.sign_launch(msg)
            yield msg

    @rpc
    def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.HeartbeatResponse:
        self._admit(context, "send an executor's heartbeat")
        executor = ExecutorId(request.executor_id)
        known = self.core.heartbeat(
            executor,
            request.unhealthy,
            convert.links_from_proto(request),
            convert.probes_from_proto(request),
            request.running_tasks,
            request.failed_beats,
        )
        if not known:
            return pb.HeartbeatResponse(reregister=True)
        targets = self.core.probe_targets(executor)
        return pb.HeartbeatResponse(probe=convert.probe_targets_to_proto(targets))

    @rpc
    def ReportTask(
        self, request: pb.ReportTaskRequest, context: grpc.ServicerContext
    ) -> pb.ReportTaskResponse:
        self._admit(context, "report a task")
        attempt = convert.attempt_from_proto(request.attempt)
        executor = ExecutorId(request.executor_id)
        timings = convert.timings_from_proto(request)
        kind = request.WhichOneof("result")
        if kind == "completed":
            outputs = tuple(
                convert.partition_output_from_proto(o) for o in request.completed.outputs
            )
            files = {o.path: o.data for o in request.completed.outputs if o.data}
            self.core.report_completed(
                attempt, executor, outputs, request.elapsed_s, files, timings
            )
        elif kind == "failed":
            failure = convert.failure_from_proto(request.failed)
            self.core.report_failed(attempt, executor, failure, request.elapsed_s, timings)
        else:
            raise convert.ProtocolError("ReportTask without a result")
        return pb.ReportTaskResponse()

    @rpc
    def Drain(self, request: pb.DrainRequest, context: grpc.ServicerContext) -> pb.DrainResponse:
        self._admit(context, "drain an executor")
        self.core.drain(ExecutorId(request.executor_id))
        return pb.DrainResponse()


class QueryServiceServicer(pb_grpc.QueryServiceServicer):
    """What clients call: login, catalog, explain, jobs, cluster status.

    Args:
        core: The scheduler.
        address: Its gRPC address, as ``ClusterStatus`` reports it.
        tickets: Signs result locations for the submitting session (a cluster
            with a secret).
        authenticator: Checks each call's token (``OPEN``: everyone is admin).
    """

    def __init__(
        self,
        core: SchedulerCore,
        address: str = "",
        tickets: TicketIssuer | None = None,
        authenticator: Authenticator = OPEN,
    ) -> None:
        self.core = core
        self.address = address
        self.tickets = tickets
        self.auth = authenticator

    # ------------------------------------------------------------- who calls

    def _caller(self, context: grpc.ServicerContext) -> Principal:
        """The principal of the call's bearer token.

        Raises:
            AuthenticationError: no token where one is required, or a bad one.
        """
        token = None
        for key, value in context.invocation_metadata() or ():
            if key == AUTHORIZATION:
                token = bearer_token(value if isinstance(value, str) else value.decode())
        if token is None:
            if self.auth.required:
                raise AuthenticationError(
                    "this scheduler lets only known users in: log in with a user name and "
                    "password (`mangonel --user NAME`, connect(user=..., password=...)) or "
                    "give a token (`mangonel --token`, $MANGONEL_TOKEN, connect(token=...))"
                )
            return ANONYMOUS
        return self.auth.verify(token)

    def _job(self, job_id: str, caller: Principal) -> JobWatch:
        """The job, if ``caller`` may see it.

        Raises:
            JobNotFoundError: no such job.
            PermissionDeniedError: another user's job, and the caller is no admin.
        """
        return doors.job_of(self.core, caller, job_id)

    @staticmethod
    def _admin(caller: Principal, what: str) -> None:
        caller.require_admin(what)

    # ----------------------------------------------------------------- calls

    @rpc
    def Authenticate(
        self, request: pb.AuthenticateRequest, context: grpc.ServicerContext
    ) -> pb.AuthenticateResponse:
        token = self.auth.login(request.user, request.password, peer_host(context.peer()))
        who = self.auth.verify(token) if token else ANONYMOUS
        expires = tokens.expires_at(token) if token else None
        log.info("user %r logged in from %s", who.user, context.peer())
        return pb.AuthenticateResponse(
            token=token,
            expires_at=expires or 0.0,
            expires_in_s=max(0.0, expires - time.time()) if expires else 0.0,
            user=who.user,
            admin=who.admin,
        )

    @rpc
    def RegisterTable(
        self, request: pb.RegisterTableRequest, context: grpc.ServicerContext
    ) -> pb.TableInfo:
        self._admin(self._caller(context), "register tables")
        kind = textfiles.file_format(request.format or FileFormat.PARQUET.value)
        columns = [(c.name, c.type) for c in request.columns]
        table = self.core.register_table(
            request.name, request.path, kind, dict(request.options), columns
        )
        return table_info(table)

    @rpc
    def ListTables(
        self, request: pb.ListTablesRequest, context: grpc.ServicerContext
    ) -> pb.ListTablesResponse:
        self._caller(context)
        unreadable = [
            pb.UnreadableTable(name=n, location=u.stored.path, error=u.error, since=u.since)
            for n, u in self.core.unreadable.entries()
        ]
        return pb.ListTablesResponse(
            tables=[table_info(t) for t in self.core.tables()], unreadable=unreadable
        )

    @rpc
    def DropTable(
        self, request: pb.DropTableRequest, context: grpc.ServicerContext
    ) -> pb.DropTableResponse:
        caller = self._caller(context)
        self._admin(caller, "drop tables")
        once = (caller.user, request.request_id) if request.request_id else None
        if not self.core.drop_table_once(request.name, once):
            raise CatalogError(f"no table {request.name!r}; `mangonel tables` lists them")
        return pb.DropTableResponse()

    @rpc
    def Explain(
        self, request: pb.ExplainRequest, context: grpc.ServicerContext
    ) -> pb.ExplainResponse:
        self._caller(context)
        return pb.ExplainResponse(text=self.core.explain(request.sql, request.dialect or None))

    @rpc
    def Submit(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.SubmitResponse:
        caller = self._caller(context)
        record = doors.submit(
            self.core, caller, request.sql, request.dialect or None, request.request_id
        )
        return pb.SubmitResponse(job_id=record.id, columns=list(record.plan.columns))

    def WatchJob(
        self, request: pb.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.JobStatus]:
        try:
            record = self._job(request.job_id, self._caller(context))
        except MangonelError as exc:
            abort(context, exc, "WatchJob")
        seen = -1
        last_sent = 0.0
        while context.is_active():
            with record.changed:
                version = record.version
                finished = record.state.finished
            if request.final_only and seen >= 0 and not finished:
                # A progress message nobody shows: building and sending one cost the
                # scheduler about 0.5 ms of the GIL, often right as a task's report
                # and the next launch went through (issue 19).
                record.wait_finished(timeout=1.0)
                continue
            if version != seen:
                seen = version
                last_sent = time.monotonic()
                phases = None
                if finished:
                    phases = stage_phases(self.core.telemetry.attempts(record.id)[0])
                msg = job_status(record, self.core.now(), finished, phases)
                if finished and self.tickets is not None:
                    self.tickets.sign_result(msg, record.request_id)
                elif finished:
                    # Without tickets anyone who may watch the job may read its result:
                    # its small files come along, and the client skips their Flight
                    # reads. A secured cluster binds a result to the session that
                    # submitted it, which only the Flight read checks.
                    attach_result_files(msg, record)
                yield msg
            if finished:
                return
            record.wait_change(seen, timeout=1.0)
            # Throttle progress, but never hold back the final message.
            pause = _WATCH_MIN_INTERVAL_S - (time.monotonic() - last_sent)
            if pause > 0:
                record.wait_finished(timeout=pause)

    @rpc
    def CancelJob(
        self, request: pb.CancelJobRequest, context: grpc.ServicerContext
    ) -> pb.CancelJobResponse:
        caller = self._caller(context)
        self._job(request.job_id, caller)
        reason = (
            "cancelled by the user"
            if caller.user == ANONYMOUS.user
            else (f"cancelled by {caller.user}")
        )
        return pb.CancelJobResponse(cancelled=self.core.cancel(JobId(request.job_id), reason))

    @rpc
    def ClusterStatus(
        self, request: pb.ClusterStatusRequest, context: grpc.ServicerContext
    ) -> pb.ClusterStatusResponse:
        caller = self._caller(context)
        now = self.core.now()
        return pb.ClusterStatusResponse(
            scheduler_address=self.address,
            executors=[executor_status(e, now, caller.sees_hosts) for e in self.core.executors()],
            jobs=[
                job_status(j, now, with_result=False)
                for j in self.core.jobs()
                if caller.may_see(j.owner)
            ],
        )

    @rpc
    def ReleaseResult(
        self, request: pb.ReleaseResultRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseResultResponse:
        self._job(request.job_id, self._caller(context))
        self.core.release_result(JobId(request.job_id))
        return pb.ReleaseResultResponse()
