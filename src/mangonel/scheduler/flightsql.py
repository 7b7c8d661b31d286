"""The scheduler's Arrow Flight SQL endpoint: any Flight SQL client can query mangonel.

Over 600 lines because ``FlightSqlService`` is one table of a session's things
(prepared statements, held results, polled queries) under one lock, which every
handler reads and changes; what stands apart lives beside it: ``flightsql_auth``
(who calls), ``flightsql_front`` (the port), ``flightsql_meta`` (the metadata
commands), ``flightsql_results`` (reads from the executors), ``flightsql_wire``
(messages and errors), and ``doors`` (a caller's job, as every front door does it).

Built on ``pyarrow.flight`` (which has no Flight SQL server) with the Flight
SQL messages of ``proto/flightsql.proto``. It calls ``SchedulerCore`` as the
gRPC query service does: submit, watch, cancel, release; it never goes
through gRPC to its own scheduler.

What a statement does::

    GetFlightInfo(CommandStatementQuery | CommandPreparedStatementQuery)
      -> plan and submit the job; wait for it (the client's cancel cancels it)
      -> read the schema of result partition 0 from its executor
      -> FlightInfo: one endpoint per result partition, its ticket a
         ``ResultView`` of the partition's own ticket, its locations the
         executor holding it, then ``arrow-flight-reuse-connection://?``
    DoGet(view ticket) at the executor: the partition, renamed and cast
    DoGet(view ticket) here: the same, fetched from the executor and streamed

With ``results="scheduler"`` the endpoints name no location and every
partition comes through here. Clients that try an endpoint's locations in turn
(the ADBC driver does) fall back to the scheduler on their own when they cannot
reach an executor.

A result lost before it was read (its executor died after the job finished):
while building the ``FlightInfo`` the query simply runs again; after it, the
client's ``DoGet`` gets ``UNAVAILABLE`` saying that the result was lost and
that executing the statement again runs the query again. The partitions a
client read are not mixed with a second run's.

Metadata commands (GetSqlInfo, GetCatalogs, GetDbSchemas, GetTables,
GetTableTypes, GetXdbcTypeInfo, primary / exported / imported keys) answer with
one endpoint whose ticket is the command itself, read here
(``flightsql_meta`` has their schemas and rows).

Who asks (``flightsql_auth``): ``authorization`` is read on every call:
``Basic`` (the handshake) logs in with the ``Authenticator`` and answers
``authorization: Bearer <token>``; ``Bearer`` is verified. A session is the
bearer token (one login), or without one the client's connection; prepared
statements and results belong to the session that made them. A result is read
only by the user who ran it, wherever the ticket is presented: on a cluster
with a secret its tickets name that user, and the executor wants the user's
token with them (``security.tickets``); here the same user, and this server
forwards the caller's token when it reads the partition from the executor.
Results are released when their session closes (``CloseSession``) or the
client cancels them; else after the scheduler's ``--result-ttl``.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf.message import Message

from mangonel import defaults, textfiles
from mangonel.errors import ClusterError, MangonelError, PermissionDeniedError
from mangonel.ids import JobId
from mangonel.proto import flightsql_pb2 as sql_pb
from mangonel.proto.batches import fitted
from mangonel.proto.results import ResultView, partition_ticket, result_schema
from mangonel.scheduler import doors
from mangonel.scheduler import flightsql_meta as meta
from mangonel.scheduler.core import JobNotFoundError, SchedulerCore
from mangonel.scheduler.flightsql_auth import (
    AUTH_MIDDLEWARE,
    AcceptHandshake,
    FlightSqlAuthFactory,
    FlightSqlAuthMiddleware,
)
from mangonel.scheduler.flightsql_front import (
    POLL_ACTION,
    SCHEMA_ACTION,
    FlightSqlFront,
)
from mangonel.scheduler.flightsql_results import READ_ERRORS, ExecutorReads, LostResult
from mangonel.scheduler.flightsql_wire import (
    command_of,
    failure,
    flight_errors,
    invalid,
    not_found,
    pack,
    parse,
    parse_descriptor,
    parse_info,
    poll_descriptor,
    poll_handle,
    status,
    unpack,
    unpack_as,
    unsupported,
)
from mangonel.scheduler.jobs import JobWatch
from mangonel.scheduler.state_views import ExecutorState, JobState
from mangonel.scheduler.tickets import TicketIssuer
from mangonel.security import tls
from mangonel.security.auth import OPEN, Authenticator
from mangonel.security.options import SecurityOptions
from mangonel.security.tls import ServingCertificates, TlsMaterial
from mangonel.sql.ddl import CreateExternalTable, parse_ddl
from mangonel.sql.params import bind_parameters, count_parameters, numbered
from mangonel.sql.writes import is_write
from mangonel.task import PartitionLocation

log = logging.getLogger(__name__)

RESULTS_FROM = ("executors", "scheduler")
"""Where a statement's ``FlightInfo`` sends the client for the result partitions."""

REUSE_CONNECTION = "arrow-flight-reuse-connection://?"
"""Flight's location for "the service that gave you this FlightInfo"."""

_CANCELLED = "cancelled by the Flight SQL client"


# ------------------------------------------------------------------ sessions


@dataclass
class _Prepared:
    sql: str
    parameters: int
    owner: str
    session: str
    rows: list[list[object]] = field(default_factory=list)
    """Bound parameter rows; the statement runs once per row."""


@dataclass
class _Result:
    """A finished job whose result a client may read through this server."""

    job: JobId
    owner: str
    session: str
    schema: pa.Schema
    locations: tuple[PartitionLocation, ...]


@dataclass
class _Poll:
    """A statement a client polls for (PollFlightInfo): one job per bound row."""

    handle: bytes
    session: str
    descriptor: flight.FlightDescriptor
    """The client's: the complete ``FlightInfo`` names it."""
    schema: pa.Schema
    """The result's as DuckDB types it, for the ``FlightInfo`` of a query not done."""
    statements: list[str]
    jobs: list[JobWatch]
    """Each statement's job: the latest run."""
    runs: list[int] = field(default_factory=list)
    results: list[_Result | None] = field(default_factory=list)
    progress: float = 0.0
    """The last progress told: the next is never less."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.runs = self.runs or [1] * len(self.jobs)
        self.results = self.results or [None] * len(self.jobs)


# ------------------------------------------------------------------- server


class FlightSqlServer:
    """The Flight SQL endpoint of a scheduler: the service behind its front; it
    listens once constructed.

    The service (``FlightSqlService``) listens on a Unix socket in a private
    directory of its own; the front (``flightsql_front``) on ``host:port``.

    Args:
        core: The scheduler's core.
        host: Interface to listen on.
        port: Port; 0 picks a free one (``port`` tells).
        authenticator: Checks logins and tokens (``security.auth``); ``OPEN``
            lets everyone in as the anonymous admin.
        results: ``"executors"``: each endpoint names the executor holding the
            partition, then this server; ``"scheduler"``: no location, every
            partition is streamed through here.
        advertise_host: The host clients reach this server at, if not ``host``.
        tls_material: The scheduler's certificate (a secured cluster): this
            endpoint speaks TLS (clients prove who they are by logging in, so
            none is asked for a certificate), and reads results from the
            executors with it.
        tickets: Signs the result locations (a cluster with a secret). Flight
            SQL clients cannot send the session key a ``Session`` proves its
            results with, so these tickets name the user instead (when the
            authenticator has users: without, everyone is the anonymous admin),
            and an executor serves them only with a token of that user.
        serving: The certificate the port presents, following its reloads
            (SIGHUP); ``None``: ``tls_material``'s, for good.

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(
        self,
        core: SchedulerCore,
        host: str = "127.0.0.1",
        port: int = 0,
        authenticator: Authenticator = OPEN,
        results: str = "executors",
        advertise_host: str | None = None,
        tls_material: TlsMaterial | None = None,
        tickets: TicketIssuer | None = None,
        serving: ServingCertificates | None = None,
    ) -> None:
        if results not in RESULTS_FROM:
            raise ValueError(f"results must be one of {RESULTS_FROM}, got {results!r}")
        # Private (mode 0700): the service trusts whoever reaches it to be the front.
        self._dir = tempfile.mkdtemp(prefix="mangonel-flight-sql-")
        socket = os.path.join(self._dir, "service.sock")
        try:
            self.service = FlightSqlService(
                core, f"grpc+unix://{socket}", authenticator, results, tls_material, tickets
            )
            try:
                if serving is None and tls_material is not None:
                    serving = ServingCertificates(SecurityOptions(), tls_material)
                self.front = FlightSqlFront(f"unix:{socket}", host, port, serving)
            except OSError:
                self.service.shutdown()
                raise
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self.port = self.front.port
        self.url = f"{tls.flight_scheme(tls_material)}://{advertise_host or host}:{self.port}"

    def shutdown(self) -> None:
        """Stop serving: the front first (its calls are cancelled), then the service."""
        self.front.stop()
        self.service.shutdown()
        shutil.rmtree(self._dir, ignore_errors=True)


class FlightSqlService(flight.FlightServerBase):  # type: ignore[misc]
    """The Flight SQL service, behind the front (``FlightSqlServer``).

    Args:
        core: The scheduler's core.
        location: Where it listens (the front's Unix socket).
        authenticator, results, tls_material, tickets: As ``FlightSqlServer``'s;
            ``tls_material`` reads results from the executors.
    """

    def __init__(
        self,
        core: SchedulerCore,
        location: str,
        authenticator: Authenticator = OPEN,
        results: str = "executors",
        tls_material: TlsMaterial | None = None,
        tickets: TicketIssuer | None = None,
    ) -> None:
        super().__init__(
            location=location,
            auth_handler=AcceptHandshake(),
            middleware={AUTH_MIDDLEWARE: FlightSqlAuthFactory(authenticator)},
        )
        self._tickets = tickets
        self._bind_user = authenticator.required
        self.core = core
        self.results_from = results
        self._lock = threading.Lock()
        self._prepared: dict[bytes, _Prepared] = {}
        self._results: dict[JobId, _Result] = {}
        self._polls: dict[bytes, _Poll] = {}
        self._reads = ExecutorReads(tls_material)

    # ------------------------------------------------------------ plumbing

    def _who(self, context: flight.ServerCallContext) -> FlightSqlAuthMiddleware:
        mw: FlightSqlAuthMiddleware | None = context.get_middleware(AUTH_MIDDLEWARE)
        if mw is None:  # every call passes the factory; this is a safety net
            raise flight.FlightUnauthenticatedError("no credentials")
        if not mw.session:
            # No login: the client's connection is its session (the ADBC driver keeps
            # one per database), so one client's CloseSession leaves the others' alone.
            mw.session = f"peer:{mw.peer or context.peer()}"
        return mw

    def shutdown(self) -> None:
        super().shutdown()
        self._reads.close()

    # -------------------------------------------------------- Flight methods

    @flight_errors
    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        who = self._who(context)
        command = command_of(descriptor)
        if isinstance(command, sql_pb.CommandStatementQuery):
            return self._execute([command.query], who, context, descriptor)
        if isinstance(command, sql_pb.CommandPreparedStatementQuery):
            prepared = self._prepared_of(command.prepared_statement_handle, who)
            return self._execute(self._bound_statements(prepared), who, context, descriptor)
        return self._metadata_info(command, descriptor)

    @flight_errors
    def get_schema(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.SchemaResult:
        # The front sends GetSchema as SCHEMA_ACTION: pyarrow passes no error of
        # get_schema on as a Flight error (its code, its message alone).
        return self._schema(descriptor, self._who(context))

    def _schema(
        self, descriptor: flight.FlightDescriptor, who: FlightSqlAuthMiddleware
    ) -> flight.SchemaResult:
        command = command_of(descriptor)
        if isinstance(command, sql_pb.CommandStatementQuery):
            return flight.SchemaResult(self.core.result_schema(_no_params(command.query)))
        if isinstance(command, sql_pb.CommandPreparedStatementQuery):
            prepared = self._prepared_of(command.prepared_statement_handle, who)
            return flight.SchemaResult(self.core.result_schema(_no_params(prepared.sql)))
        return flight.SchemaResult(meta.answer(command, self.core.tables()).schema)

    @flight_errors
    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        who = self._who(context)
        try:
            view = ResultView.decode(ticket.ticket)
        except ValueError as exc:
            raise invalid(f"{exc}; use the tickets of a FlightInfo this server gave") from None
        if view is not None:
            return self._serve_partition(view, who)
        command = unpack(ticket.ticket, "ticket")
        if isinstance(command, sql_pb.TicketStatementQuery):
            raise not_found(
                "stale or forged ticket: this server gives no TicketStatementQuery tickets; "
                "execute the statement again"
            )
        table = meta.answer(command, self.core.tables())
        return flight.GeneratorStream(table.schema, fitted(table.to_batches()))

    @flight_errors
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        who = self._who(context)
        command = command_of(descriptor)
        if isinstance(command, sql_pb.CommandPreparedStatementQuery):
            handle = command.prepared_statement_handle
            prepared = self._prepared_of(handle, who)
            bound = reader.read_all()
            # By position: parameters may share a name (or have none).
            columns = [column.to_pylist() for column in bound.columns]
            values = [list(row) for row in zip(*columns, strict=True)] if columns else []
            for row in values:
                if len(row) != prepared.parameters:
                    raise invalid(
                        f"BindError: the statement takes {prepared.parameters} parameters, "
                        f"{len(row)} were bound"
                    )
            prepared.rows = values
            result = sql_pb.DoPutPreparedStatementResult(prepared_statement_handle=handle)
            writer.write(pa.py_buffer(result.SerializeToString()))
            return
        if isinstance(command, sql_pb.CommandStatementUpdate):
            ddl = parse_ddl(command.query)
            if ddl is not None:
                self._register_external(ddl, who)
                result = sql_pb.DoPutUpdateResult(record_count=0)
                writer.write(pa.py_buffer(result.SerializeToString()))
                return
            if not is_write(command.query):
                raise invalid(
                    "ForbiddenStatementError: an update is one of COPY ... TO, CREATE TABLE "
                    "... AS SELECT, INSERT INTO ... SELECT/VALUES, DROP TABLE and CREATE "
                    "EXTERNAL TABLE; run queries with Execute"
                )
            record = self._submit(command.query, who)
            self._wait(record, context)
            count = self._rows_written(record, who)
            result = sql_pb.DoPutUpdateResult(record_count=count)
            writer.write(pa.py_buffer(result.SerializeToString()))
            return
        if isinstance(command, sql_pb.CommandPreparedStatementUpdate):
            raise invalid(
                "ForbiddenStatementError: prepared updates are not supported; send the write "
                "statement itself (COPY ... TO, CREATE TABLE ... AS SELECT, INSERT INTO ... SELECT)"
            )
        raise unsupported(f"DoPut of {type(command).__name__} is not supported")

    def _register_external(self, ddl: CreateExternalTable, who: FlightSqlAuthMiddleware) -> None:
        """``CREATE EXTERNAL TABLE`` as gRPC's ``RegisterTable``: an admin's, durable."""
        who.principal.require_admin("register tables")
        if ddl.if_not_exists and any(t.name == ddl.name for t in self.core.tables()):
            return
        kind = textfiles.file_format(ddl.format)
        table = self.core.register_table(
            ddl.name, ddl.location, kind, dict(ddl.options), list(ddl.columns)
        )
        log.info("flight sql: %s registered %s (%s)", who.principal.user, table.name, ddl.location)

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [
            ("CreatePreparedStatement", "prepare a SELECT statement (with ? parameters)"),
            ("ClosePreparedStatement", "close a prepared statement"),
            ("CancelFlightInfo", "cancel a query, or release its result"),
            ("CancelQuery", "cancel a query (the older Flight SQL action)"),
            ("CloseSession", "close prepared statements and release results of a session"),
        ]

    @flight_errors
    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[bytes]:
        who = self._who(context)
        body = action.body.to_pybytes() if action.body is not None else b""
        kind = action.type
        if kind == "CreatePreparedStatement":
            request = unpack_as(body, sql_pb.ActionCreatePreparedStatementRequest)
            return [pack(self._create_prepared(request.query, who))]
        if kind == "ClosePreparedStatement":
            request = unpack_as(body, sql_pb.ActionClosePreparedStatementRequest)
            self._close_prepared(request.prepared_statement_handle, who)
            return []
        if kind == "CancelFlightInfo":
            info = parse_info(parse(body, sql_pb.CancelFlightInfoRequest).info)
            outcome = self._cancel(info, who)
            return [sql_pb.CancelFlightInfoResult(status=outcome).SerializeToString()]
        if kind == "CancelQuery":
            request = unpack_as(body, sql_pb.ActionCancelQueryRequest)
            outcome = self._cancel(parse_info(request.info), who)
            return [pack(sql_pb.ActionCancelQueryResult(result=outcome))]  # same numbers
        if kind == "CloseSession":
            self._close_session(who)
            closed = sql_pb.CloseSessionResult.Status.CLOSED
            return [sql_pb.CloseSessionResult(status=closed).SerializeToString()]
        if kind == POLL_ACTION:
            return [self._poll(parse_descriptor(body), who).SerializeToString()]
        if kind == SCHEMA_ACTION:
            return [self._schema(parse_descriptor(body), who).serialize()]
        raise unsupported(
            f"action {kind!r} is not supported: mangonel has no transactions, savepoints or "
            "Substrait plans; ListActions lists what it does"
        )

    # ---------------------------------------------------------- statements

    def _execute(
        self,
        statements: list[str],
        who: FlightSqlAuthMiddleware,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
    ) -> flight.FlightInfo:
        """Run each statement (one per bound parameter row) and list their results."""
        return self._info([self._run(sql, who, context) for sql in statements], descriptor)

    def _info(
        self, results: list[_Result], descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        """The ``FlightInfo`` of the statements' results, one after the other."""
        schema = results[0].schema
        endpoints = []
        for result in results:
            if result.schema != schema:
                raise invalid(
                    "the parameter rows give results of different types "
                    f"({result.schema} vs {schema}); bind one row at a time"
                )
            endpoints += [self._endpoint(result, i) for i in range(len(result.locations))]
        rows = sum(loc.rows for r in results for loc in r.locations)
        size = sum(loc.bytes for r in results for loc in r.locations)
        return flight.FlightInfo(schema, descriptor, endpoints, rows, size, ordered=True)

    def _run(
        self, sql: str, who: FlightSqlAuthMiddleware, context: flight.ServerCallContext
    ) -> _Result:
        """Submit, wait, and learn the result's schema; run again while the
        result is lost before that."""
        for attempt in range(defaults.RESULT_RETRIES + 1):
            record = self._submit(sql, who)
            self._wait(record, context)
            result = self._finish(record, who, last=attempt == defaults.RESULT_RETRIES)
            if result is not None:
                return result
        raise AssertionError("unreachable")

    def _submit(self, sql: str, who: FlightSqlAuthMiddleware) -> JobWatch:
        record = doors.submit(self.core, who.principal, sql)
        log.info("flight sql: job %s for %s", record.id, who.principal.user)
        return record

    def _finish(self, record: JobWatch, who: FlightSqlAuthMiddleware, last: bool) -> _Result | None:
        """The result of a job that succeeded, held for the client; ``None`` when it
        was lost before its schema could be read (run the query again), unless this
        was the ``last`` run."""
        locations = record.result
        if self._tickets is not None:
            reader = who.principal.user if self._bind_user else ""
            locations = tuple(
                self._tickets.sign_location(loc, record.id, reader) for loc in locations
            )
        try:
            schema = self._schema_of(record, locations, who)
        except LostResult as exc:
            if last:
                raise status(
                    "UNAVAILABLE",
                    f"the result of job {record.id} was lost before it could be read ({exc}); "
                    "execute the statement again",
                ) from None
            log.warning("result of job %s lost (%s); running the query again", record.id, exc)
            return None
        result = _Result(record.id, who.principal.user, who.session, schema, locations)
        self._forget_expired()
        with self._lock:
            self._results[record.id] = result
        return result

    def _rows_written(self, record: JobWatch, who: FlightSqlAuthMiddleware) -> int:
        """A write statement's answer (its ``Count`` rows), from the scheduler's
        copy of it or read from where it is; the result is then released."""
        with record.changed:
            held = dict(record.result_files)
        try:
            count = self._reads.count(record.result, who.token, held)
        except READ_ERRORS as exc:
            log.warning("job %s: its count could not be read (%s)", record.id, exc)
            count = -1
        self.core.release_result(record.id)
        return count

    def _wait(self, record: JobWatch, context: flight.ServerCallContext) -> None:
        """Until the job ends; a client that cancels its call (or goes away) cancels it."""
        end = doors.wait_end(self.core, record, context.is_cancelled, _CANCELLED)
        if end is None:
            raise flight.FlightCancelledError(f"job {record.id} was cancelled")
        if end.state is not JobState.SUCCEEDED:
            raise failure(record.id, end.error, end.error_type)

    def _schema_of(
        self,
        record: JobWatch,
        locations: tuple[PartitionLocation, ...],
        who: FlightSqlAuthMiddleware,
    ) -> pa.Schema:
        if not locations:
            return self.core.result_schema(record.sql)
        file_schema = self._reads.file_schema(locations[0], who.token)
        return result_schema(file_schema, record.plan.columns)

    def _endpoint(self, result: _Result, index: int) -> flight.FlightEndpoint:
        loc = result.locations[index]
        view = ResultView(partition_ticket(loc), result.job, index, result.schema)
        if self.results_from == "scheduler":
            return flight.FlightEndpoint(view.encode(), [])
        return flight.FlightEndpoint(
            view.encode(),
            [self._reads.url(loc.flight_address), REUSE_CONNECTION],
        )

    def _serve_partition(
        self, view: ResultView, who: FlightSqlAuthMiddleware
    ) -> flight.FlightDataStream:
        """A result partition streamed from its executor, as the view asks."""
        with self._lock:
            result = self._results.get(JobId(view.job))
        if result is None:
            raise not_found(
                f"stale or forged ticket: no result of job {view.job!r} is held here (it was "
                "released, cancelled or never existed); execute the statement again"
            )
        try:
            who.principal.check_reads(view.job, result.owner)
        except PermissionDeniedError as exc:
            raise flight.FlightUnauthorizedError(str(exc)) from None
        if (
            not 0 <= view.partition < len(result.locations)
            or partition_ticket(result.locations[view.partition]) != view.ticket
        ):
            raise invalid(f"forged ticket: it names no result partition of job {view.job}")
        loc = result.locations[view.partition]
        return self._reads.stream(
            view, loc, result.schema, who.token, lambda exc: self._lost(result, loc, exc)
        )

    def _lost(
        self, result: _Result, loc: PartitionLocation, exc: BaseException
    ) -> flight.FlightUnavailableError:
        lost = any(
            e.view.id == loc.executor and e.view.state is ExecutorState.LOST
            for e in self.core.executors()
        ) or not any(e.view.id == loc.executor for e in self.core.executors())
        why = "was lost" if lost else "cannot be reached from the scheduler"
        return flight.FlightUnavailableError(
            f"result partition {loc.partition} of job {result.job} is unavailable: executor "
            f"{loc.executor} ({loc.flight_address}) {why} before it was read ({exc}); "
            "execute the statement again: the query runs again"
        )

    # -------------------------------------------------- prepared statements

    def _create_prepared(
        self, sql: str, who: FlightSqlAuthMiddleware
    ) -> sql_pb.ActionCreatePreparedStatementResult:
        parameters = count_parameters(sql)
        # Refuses what the planner refuses (not a SELECT, unknown table, bad column).
        schema = self.core.result_schema(_no_params(sql))
        handle = secrets.token_bytes(16)
        with self._lock:
            self._prepared[handle] = _Prepared(sql, parameters, who.principal.user, who.session)
        # Each parameter typed where the query tells (``l_quantity < ?``), else null.
        kinds = self.core.parameter_types(numbered(sql), parameters) if parameters else []
        params = pa.schema(
            [pa.field(f"parameter_{i + 1}", kind or pa.null()) for i, kind in enumerate(kinds)]
        )
        return sql_pb.ActionCreatePreparedStatementResult(
            prepared_statement_handle=handle,
            dataset_schema=schema.serialize().to_pybytes(),
            parameter_schema=params.serialize().to_pybytes(),
            is_update=False,
        )

    def _prepared_of(self, handle: bytes, who: FlightSqlAuthMiddleware) -> _Prepared:
        with self._lock:
            prepared = self._prepared.get(handle)
        if prepared is None:
            raise not_found(
                "unknown prepared statement handle (closed, or made by a scheduler that "
                "restarted since); prepare the statement again"
            )
        if prepared.session != who.session:
            raise flight.FlightUnauthorizedError(
                "this prepared statement belongs to another session; prepare it in yours"
            )
        return prepared

    def _bound_statements(self, prepared: _Prepared) -> list[str]:
        if prepared.parameters == 0:
            return [prepared.sql]
        if not prepared.rows:
            raise invalid(
                f"BindError: the statement takes {prepared.parameters} parameters and none "
                "were bound"
            )
        return [bind_parameters(prepared.sql, row) for row in prepared.rows]

    def _close_prepared(self, handle: bytes, who: FlightSqlAuthMiddleware) -> None:
        self._prepared_of(handle, who)
        with self._lock:
            self._prepared.pop(handle, None)

    # ----------------------------------------------------------- polling

    def _poll(self, descriptor: flight.FlightDescriptor, who: FlightSqlAuthMiddleware) -> Any:
        """PollFlightInfo: a statement's jobs started, then where they stand.

        The first call (the client's descriptor) submits the jobs and answers at
        once; each later one (the descriptor it answered, naming this poll) says
        how far they got, and the last the complete ``FlightInfo``. A failed job
        fails the call, as ``GetFlightInfo`` would have.
        """
        handle = poll_handle(descriptor)
        if handle is not None:
            return self._advance(self._poll_of(handle, who), who)
        command = command_of(descriptor)
        if isinstance(command, sql_pb.CommandStatementQuery):
            statements = [command.query]
        elif isinstance(command, sql_pb.CommandPreparedStatementQuery):
            prepared = self._prepared_of(command.prepared_statement_handle, who)
            statements = self._bound_statements(prepared)
        else:
            info = self._metadata_info(command, descriptor)
            return sql_pb.PollInfo(info=info.serialize(), progress=1.0)
        schema = self.core.result_schema(statements[0])
        jobs = [self._submit(sql, who) for sql in statements]
        poll = _Poll(secrets.token_bytes(16), who.session, descriptor, schema, statements, jobs)
        with self._lock:
            self._polls[poll.handle] = poll
        return self._advance(poll, who)

    def _advance(self, poll: _Poll, who: FlightSqlAuthMiddleware) -> Any:
        """Where a poll's jobs stand: each finished one's result held (run again if
        it was lost before its schema could be read), and the complete
        ``FlightInfo`` once every one has its result."""
        with poll.lock:  # one poll call at a time moves it on
            done = total = 0
            for i, record in enumerate(poll.jobs):
                if poll.results[i] is not None:
                    continue
                end = record.outcome()
                views = record.stage_views()
                if end.state is JobState.SUCCEEDED:
                    last = poll.runs[i] > defaults.RESULT_RETRIES
                    poll.results[i] = self._finish(record, who, last)
                    if poll.results[i] is None:
                        poll.jobs[i] = self._submit(poll.statements[i], who)
                        poll.runs[i] += 1
                elif end.state.finished:
                    self._drop_poll(poll)
                    raise failure(record.id, end.error, end.error_type)
                done += sum(v.done for v in views)
                total += sum(v.num_tasks for v in views)
            results = [r for r in poll.results if r is not None]
            if len(results) == len(poll.results):
                with self._lock:
                    self._polls.pop(poll.handle, None)
                info = self._info(results, poll.descriptor)
                return sql_pb.PollInfo(info=info.serialize(), progress=1.0)
            # Finished statements count whole, a running job by its tasks done; never
            # backwards (a stage planned late adds tasks, a lost result a run).
            finished = len(results) / len(poll.results)
            running = done / total / len(poll.results) if total else 0.0
            poll.progress = max(poll.progress, min(finished + running, 0.99))
            progress = poll.progress
        again = poll_descriptor(poll.handle)
        partial = flight.FlightInfo(poll.schema, again, [], -1, -1)
        return sql_pb.PollInfo(
            info=partial.serialize(), flight_descriptor=again.serialize(), progress=progress
        )

    def _poll_of(self, handle: bytes, who: FlightSqlAuthMiddleware) -> _Poll:
        with self._lock:
            poll = self._polls.get(handle)
        if poll is None:
            raise not_found(
                "unknown query to poll: it finished and was answered, was cancelled, or the "
                "scheduler restarted since; execute the statement again"
            )
        if poll.session != who.session:
            raise flight.FlightUnauthorizedError(
                "this query belongs to another session; execute the statement in yours"
            )
        return poll

    def _drop_poll(self, poll: _Poll) -> None:
        """Forget a poll, and cancel its jobs (release the results they hold)."""
        with self._lock:
            self._polls.pop(poll.handle, None)
        for record in poll.jobs:
            self._release(record.id)

    # ---------------------------------------------------- cancel, sessions

    def _cancel(self, info: flight.FlightInfo, who: FlightSqlAuthMiddleware) -> Any:
        """Cancel the jobs of a FlightInfo (finished ones: release their result)."""
        handle = poll_handle(info.descriptor)
        if handle is not None:  # a PollInfo's FlightInfo, the query not done
            poll = self._poll_of(handle, who)
            self._drop_poll(poll)
            return sql_pb.CANCEL_STATUS_CANCELLED
        jobs = []
        for endpoint in info.endpoints:
            try:
                view = ResultView.decode(endpoint.ticket.ticket)
            except ValueError:
                view = None
            if view is not None and JobId(view.job) not in jobs:
                jobs.append(JobId(view.job))
        if not jobs:
            return sql_pb.CANCEL_STATUS_NOT_CANCELLABLE
        for job in jobs:
            try:
                doors.job_of(self.core, who.principal, job)
            except JobNotFoundError:
                pass  # forgotten: nothing is held, releasing it is harmless
            except PermissionDeniedError as exc:
                raise flight.FlightUnauthorizedError(str(exc)) from None
            self._release(job)
        return sql_pb.CANCEL_STATUS_CANCELLED

    def _forget_expired(self) -> None:
        """Drop the results the scheduler forgot (expired after ``--result-ttl``)."""
        with self._lock:
            jobs = list(self._results)
            polls = list(self._polls.values())
        for job in jobs:
            try:
                self.core.job(job)
            except JobNotFoundError:
                with self._lock:
                    self._results.pop(job, None)
        for poll in polls:  # abandoned by their clients
            try:
                for record in poll.jobs:
                    self.core.job(record.id)
            except JobNotFoundError:
                self._drop_poll(poll)

    def _release(self, job: JobId) -> None:
        with self._lock:
            self._results.pop(job, None)
        try:
            if not self.core.cancel(job, _CANCELLED):
                self.core.release_result(job)
        except MangonelError as exc:  # forgotten already: nothing is held
            log.debug("releasing job %s: %s", job, exc)

    def _close_session(self, who: FlightSqlAuthMiddleware) -> None:
        with self._lock:
            handles = [h for h, p in self._prepared.items() if p.session == who.session]
            for handle in handles:
                del self._prepared[handle]
            jobs = [j for j, r in self._results.items() if r.session == who.session]
            polls = [p for p in self._polls.values() if p.session == who.session]
        for job in jobs:
            self._release(job)
        for poll in polls:
            self._drop_poll(poll)
        log.info(
            "flight sql: session of %s closed (%d prepared statements, %d results)",
            who.principal.user,
            len(handles),
            len(jobs),
        )

    # -------------------------------------------------------------- metadata

    def _metadata_info(
        self, command: Message, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        """A metadata command's ``FlightInfo``: one endpoint, the command its ticket."""
        table = meta.answer(command, self.core.tables())
        endpoint = flight.FlightEndpoint(descriptor.command, [])
        return flight.FlightInfo(table.schema, descriptor, [endpoint], table.num_rows, -1)


def _no_params(sql: str) -> str:
    """``sql`` with NULL for each parameter, to type its result without values."""
    parameters = count_parameters(sql)
    return bind_parameters(sql, [None] * parameters) if parameters else sql


def start_flight_sql(
    core: SchedulerCore,
    host: str,
    port: int,
    authenticator: Authenticator = OPEN,
    results: str = "executors",
    tls_material: TlsMaterial | None = None,
    tickets: TicketIssuer | None = None,
    serving: ServingCertificates | None = None,
) -> FlightSqlServer:
    """Start serving Flight SQL for ``core``; the caller stops it with ``shutdown()``.

    Raises:
        ClusterError: the port cannot be bound.
    """
    try:
        return FlightSqlServer(
            core,
            host,
            port,
            authenticator,
            results,
            tls_material=tls_material,
            tickets=tickets,
            serving=serving,
        )
    except (OSError, pa.ArrowException) as exc:
        raise ClusterError(
            f"cannot serve Flight SQL on {host}:{port} ({exc}); pick another port with "
            "--flight-sql-port, or -1 for none"
        ) from exc
