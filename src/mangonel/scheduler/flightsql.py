"""The scheduler's Arrow Flight SQL endpoint: any Flight SQL client can query mangonel.

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

Who asks: ``FlightSqlAuthMiddleware`` reads ``authorization`` on every call:
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

import base64
import logging
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from mangonel.errors import AuthenticationError, ClusterError, MangonelError
from mangonel.ids import JobId
from mangonel.proto import flightsql_pb2 as sql_pb
from mangonel.proto.batches import fitted
from mangonel.proto.results import ResultView, partition_ticket, result_schema
from mangonel.scheduler import flightsql_meta as meta
from mangonel.scheduler.core import JobNotFoundError, SchedulerCore
from mangonel.scheduler.jobs import JobRecord
from mangonel.scheduler.state_views import ExecutorState, JobState
from mangonel.scheduler.tickets import TicketIssuer
from mangonel.security import tls
from mangonel.security.auth import ANONYMOUS, AUTHORIZATION, OPEN, Authenticator, Principal
from mangonel.security.auth import bearer_token as parse_bearer
from mangonel.security.tls import TlsMaterial
from mangonel.sql.params import bind_parameters, count_parameters
from mangonel.task import PartitionLocation

log = logging.getLogger(__name__)

RESULTS_FROM = ("executors", "scheduler")
"""Where a statement's ``FlightInfo`` sends the client for the result partitions."""

REUSE_CONNECTION = "arrow-flight-reuse-connection://?"
"""Flight's location for "the service that gave you this FlightInfo"."""

_TYPE_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."
# Runs of a query whose result was lost before its FlightInfo was built.
_RESULT_RETRIES = 2
# How often a waiting GetFlightInfo looks whether its client went away.
_CANCEL_POLL_S = 0.1
_FETCH_TIMEOUT_S = 60.0
_AUTH_MIDDLEWARE = "auth"

M = TypeVar("M", bound=Message)


# ------------------------------------------------------------------ errors


def _refused(message: str) -> flight.FlightServerError:
    """A request the server will not do as sent (gRPC UNKNOWN with this message:
    pyarrow gives INVALID_ARGUMENT only with the server's traceback in the text)."""
    return flight.FlightServerError(message)


def _translate(exc: BaseException) -> BaseException:
    """A mangonel error as the Flight error a client should see."""
    translated: BaseException = exc
    if isinstance(exc, flight.FlightError):
        pass
    elif isinstance(exc, AuthenticationError):
        translated = flight.FlightUnauthenticatedError(str(exc))
    elif isinstance(exc, MangonelError):
        translated = _refused(f"{type(exc).__name__}: {exc}")
    return translated


F = TypeVar("F", bound=Callable[..., Any])


def _flight_errors(method: F) -> F:
    """Give every failure of a handler the Flight error a client should see."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            translated = _translate(exc)
            if translated is exc:
                raise
            raise translated from None

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper  # type: ignore[return-value]


# ------------------------------------------------------------ authentication


class FlightSqlAuthMiddleware(flight.ServerMiddleware):  # type: ignore[misc]
    """Who a call comes from, and the token to send back after a login."""

    def __init__(
        self,
        principal: Principal,
        session: str,
        send_token: str | None,
        token: str | None = None,
    ) -> None:
        self.principal = principal
        self.session = session
        self._send_token = send_token
        self.token = token
        """The caller's bearer token (its login's): what proves it the reader of
        its results to an executor, which this server forwards when it reads them."""

    def sending_headers(self) -> dict[str, str]:
        if self._send_token is None:
            return {}
        return {AUTHORIZATION: f"Bearer {self._send_token}"}


class FlightSqlAuthFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Reads ``authorization`` on every call (``Basic`` logs in, ``Bearer`` is checked).

    An authenticator that issues no token (``OPEN``) still gets each login a
    token of its own, so that each client's prepared statements are its own.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator
        self._open_tokens: set[str] = set()
        self._lock = threading.Lock()

    def start_call(
        self, info: flight.CallInfo, headers: dict[str, list[str]]
    ) -> FlightSqlAuthMiddleware:
        values = headers.get(AUTHORIZATION) or headers.get(AUTHORIZATION.title()) or []
        header: str | None = values[0] if values else None
        try:
            if header is not None and header.startswith("Basic "):
                user, password = _basic(header)
                token = self._auth.login(user, password)
                if not token:
                    token = f"open-{secrets.token_hex(16)}"
                    with self._lock:
                        self._open_tokens.add(token)
                return FlightSqlAuthMiddleware(self._principal(token), token, token, token)
            bearer = parse_bearer(header)
            if bearer is not None:
                return FlightSqlAuthMiddleware(self._principal(bearer), bearer, None, bearer)
        except AuthenticationError as exc:
            raise flight.FlightUnauthenticatedError(str(exc)) from None
        if self._auth.required:
            raise flight.FlightUnauthenticatedError(
                "this cluster needs a user: connect with a user name and password "
                "(Basic authentication), or send 'authorization: Bearer <token>'"
            )
        return FlightSqlAuthMiddleware(ANONYMOUS, "", None)

    def _principal(self, token: str) -> Principal:
        with self._lock:
            minted = token in self._open_tokens
        return ANONYMOUS if minted else self._auth.verify(token)


def _basic(header: str) -> tuple[str, str]:
    encoded = header[len("Basic ") :].strip()
    try:
        # Some clients (Go's Flight client) leave the padding out.
        text = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise AuthenticationError("malformed Basic authorization header") from None
    user, sep, password = text.partition(":")
    if not sep:
        raise AuthenticationError("malformed Basic authorization header: no ':'")
    return user, password


class _AcceptHandshake(flight.ServerAuthHandler):  # type: ignore[misc]
    """Lets ``Handshake`` succeed: the middleware did the checking (and answers
    the token in the response headers, where Flight SQL clients read it)."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""


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


# ------------------------------------------------------------------- server


class FlightSqlServer(flight.FlightServerBase):  # type: ignore[misc]
    """The Flight SQL endpoint of a scheduler; it listens once constructed.

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
    ) -> None:
        if results not in RESULTS_FROM:
            raise ValueError(f"results must be one of {RESULTS_FROM}, got {results!r}")
        server_tls: dict[str, Any] = {}
        if tls_material is not None:
            server_tls["tls_certificates"] = [
                flight.CertKeyPair(tls_material.cert, tls_material.key)
            ]
        super().__init__(
            location=f"{tls.flight_scheme(tls_material)}://{host}:{port}",
            auth_handler=_AcceptHandshake(),
            middleware={_AUTH_MIDDLEWARE: FlightSqlAuthFactory(authenticator)},
            **server_tls,
        )
        self._tls = tls_material
        self._tickets = tickets
        self._bind_user = authenticator.required
        self.core = core
        self.results_from = results
        self.url = f"{tls.flight_scheme(tls_material)}://{advertise_host or host}:{self.port}"
        self._lock = threading.Lock()
        self._prepared: dict[bytes, _Prepared] = {}
        self._results: dict[JobId, _Result] = {}
        self._clients: dict[str, flight.FlightClient] = {}

    # ------------------------------------------------------------ plumbing

    def _who(self, context: flight.ServerCallContext) -> FlightSqlAuthMiddleware:
        mw: FlightSqlAuthMiddleware | None = context.get_middleware(_AUTH_MIDDLEWARE)
        if mw is None:  # every call passes the factory; this is a safety net
            raise flight.FlightUnauthenticatedError("no credentials")
        if not mw.session:
            # No login: the client's connection is its session (the ADBC driver keeps
            # one per database), so one client's CloseSession leaves the others' alone.
            mw.session = f"peer:{context.peer()}"
        return mw

    def _client(self, address: str) -> flight.FlightClient:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = flight.connect(
                    f"{tls.flight_scheme(self._tls)}://{address}",
                    **tls.flight_client_kwargs(self._tls),
                )
                self._clients[address] = client
            return client

    def shutdown(self) -> None:
        super().shutdown()
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()

    # -------------------------------------------------------- Flight methods

    @_flight_errors
    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        who = self._who(context)
        command = _command(descriptor)
        if isinstance(command, sql_pb.CommandStatementQuery):
            return self._execute([command.query], who, context, descriptor)
        if isinstance(command, sql_pb.CommandPreparedStatementQuery):
            prepared = self._prepared_of(command.prepared_statement_handle, who)
            return self._execute(self._bound_statements(prepared), who, context, descriptor)
        table = self._metadata(command)
        endpoint = flight.FlightEndpoint(descriptor.command, [])
        return flight.FlightInfo(table.schema, descriptor, [endpoint], table.num_rows, -1)

    @_flight_errors
    def get_schema(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.SchemaResult:
        self._who(context)
        command = _command(descriptor)
        if isinstance(command, sql_pb.CommandStatementQuery):
            return flight.SchemaResult(self.core.result_schema(_no_params(command.query)))
        if isinstance(command, sql_pb.CommandPreparedStatementQuery):
            prepared = self._prepared_of(command.prepared_statement_handle, self._who(context))
            return flight.SchemaResult(self.core.result_schema(_no_params(prepared.sql)))
        return flight.SchemaResult(self._metadata(command).schema)

    @_flight_errors
    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        who = self._who(context)
        try:
            view = ResultView.decode(ticket.ticket)
        except ValueError as exc:
            raise _refused(f"{exc}; use the tickets of a FlightInfo this server gave") from None
        if view is not None:
            return self._serve_partition(view, who)
        command = _unpack(ticket.ticket, "ticket")
        if isinstance(command, sql_pb.TicketStatementQuery):
            raise _refused(
                "stale or forged ticket: this server gives no TicketStatementQuery tickets; "
                "execute the statement again"
            )
        table = self._metadata(command)
        return flight.GeneratorStream(table.schema, fitted(table.to_batches()))

    @_flight_errors
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        who = self._who(context)
        command = _command(descriptor)
        if isinstance(command, sql_pb.CommandPreparedStatementQuery):
            handle = command.prepared_statement_handle
            prepared = self._prepared_of(handle, who)
            bound = reader.read_all()
            # By position: parameters may share a name (or have none).
            columns = [column.to_pylist() for column in bound.columns]
            values = [list(row) for row in zip(*columns, strict=True)] if columns else []
            for row in values:
                if len(row) != prepared.parameters:
                    raise _refused(
                        f"BindError: the statement takes {prepared.parameters} parameters, "
                        f"{len(row)} were bound"
                    )
            prepared.rows = values
            result = sql_pb.DoPutPreparedStatementResult(prepared_statement_handle=handle)
            writer.write(pa.py_buffer(result.SerializeToString()))
            return
        if isinstance(
            command,
            sql_pb.CommandStatementUpdate | sql_pb.CommandPreparedStatementUpdate,
        ):
            raise _refused(
                "ForbiddenStatementError: mangonel is read-only: it runs SELECT queries over "
                "registered tables; register data with register_parquet"
            )
        raise pa.ArrowNotImplementedError(f"DoPut of {type(command).__name__} is not supported")

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [
            ("CreatePreparedStatement", "prepare a SELECT statement (with ? parameters)"),
            ("ClosePreparedStatement", "close a prepared statement"),
            ("CancelFlightInfo", "cancel a query, or release its result"),
            ("CancelQuery", "cancel a query (the older Flight SQL action)"),
            ("CloseSession", "close prepared statements and release results of a session"),
        ]

    @_flight_errors
    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[bytes]:
        who = self._who(context)
        body = action.body.to_pybytes() if action.body is not None else b""
        kind = action.type
        if kind == "CreatePreparedStatement":
            request = _unpack_as(body, sql_pb.ActionCreatePreparedStatementRequest)
            return [_pack(self._create_prepared(request.query, who))]
        if kind == "ClosePreparedStatement":
            request = _unpack_as(body, sql_pb.ActionClosePreparedStatementRequest)
            self._close_prepared(request.prepared_statement_handle, who)
            return []
        if kind == "CancelFlightInfo":
            info = _parse_info(_parse(body, sql_pb.CancelFlightInfoRequest).info)
            status = self._cancel(info, who)
            return [sql_pb.CancelFlightInfoResult(status=status).SerializeToString()]
        if kind == "CancelQuery":
            request = _unpack_as(body, sql_pb.ActionCancelQueryRequest)
            status = self._cancel(_parse_info(request.info), who)
            return [_pack(sql_pb.ActionCancelQueryResult(result=status))]  # same numbers
        if kind == "CloseSession":
            self._close_session(who)
            closed = sql_pb.CloseSessionResult.Status.CLOSED
            return [sql_pb.CloseSessionResult(status=closed).SerializeToString()]
        raise pa.ArrowNotImplementedError(
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
        results = [self._run(sql, who, context) for sql in statements]
        schema = results[0].schema
        endpoints = []
        for result in results:
            if result.schema != schema:
                raise _refused(
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
        for attempt in range(_RESULT_RETRIES + 1):
            record = self.core.submit(sql, owner=who.principal.user)
            log.info("flight sql: job %s for %s", record.id, who.principal.user)
            self._wait(record, context)
            locations = record.result
            if self._tickets is not None:
                reader = who.principal.user if self._bind_user else ""
                locations = tuple(
                    self._tickets.sign_location(loc, record.id, reader) for loc in locations
                )
            try:
                schema = self._schema_of(record, locations, who)
            except _LostResult as exc:
                if attempt == _RESULT_RETRIES:
                    raise flight.FlightUnavailableError(
                        f"the result of job {record.id} was lost before it could be read "
                        f"({exc}); execute the statement again"
                    ) from None
                log.warning("result of job %s lost (%s); running the query again", record.id, exc)
                continue
            result = _Result(record.id, who.principal.user, who.session, schema, locations)
            self._forget_expired()
            with self._lock:
                self._results[record.id] = result
            return result
        raise AssertionError("unreachable")

    def _wait(self, record: JobRecord, context: flight.ServerCallContext) -> None:
        """Until the job ends; a client that cancels its call (or goes away) cancels it."""
        while True:
            with record.changed:
                record.changed.wait_for(lambda: record.state.finished, timeout=_CANCEL_POLL_S)
                state, error, error_type = record.state, record.error, record.error_type
            if state is JobState.SUCCEEDED:
                return
            if state is JobState.FAILED:
                # Named by the error it is blamed on, as every refusal here is.
                raise _refused(f"{error_type}: {error or f'job {record.id} failed'}")
            if state is JobState.CANCELLED:
                raise flight.FlightCancelledError(error or f"job {record.id} was cancelled")
            if context.is_cancelled():
                log.info("flight sql: the client cancelled job %s", record.id)
                self.core.cancel(record.id, "cancelled by the Flight SQL client")
                raise flight.FlightCancelledError(f"job {record.id} was cancelled")

    def _schema_of(
        self,
        record: JobRecord,
        locations: tuple[PartitionLocation, ...],
        who: FlightSqlAuthMiddleware,
    ) -> pa.Schema:
        if not locations:
            return self.core.result_schema(record.sql)
        first = locations[0]
        try:
            reader = self._client(first.flight_address).do_get(
                flight.Ticket(partition_ticket(first)), _as_reader(who)
            )
            file_schema = reader.schema
            reader.cancel()
        except (flight.FlightError, OSError, pa.ArrowException) as exc:
            raise _LostResult(
                f"executor {first.executor} ({first.flight_address}): {exc}"
            ) from None
        return result_schema(file_schema, record.plan.columns)

    def _endpoint(self, result: _Result, index: int) -> flight.FlightEndpoint:
        loc = result.locations[index]
        view = ResultView(partition_ticket(loc), result.job, index, result.schema)
        if self.results_from == "scheduler":
            return flight.FlightEndpoint(view.encode(), [])
        return flight.FlightEndpoint(
            view.encode(),
            [f"{tls.flight_scheme(self._tls)}://{loc.flight_address}", REUSE_CONNECTION],
        )

    def _serve_partition(
        self, view: ResultView, who: FlightSqlAuthMiddleware
    ) -> flight.FlightDataStream:
        """A result partition streamed from its executor, as the view asks."""
        with self._lock:
            result = self._results.get(JobId(view.job))
        if result is None:
            raise _refused(
                f"stale or forged ticket: no result of job {view.job!r} is held here (it was "
                "released, cancelled or never existed); execute the statement again"
            )
        if who.principal.user != result.owner:
            # The reader only, admin or not: the rule the executors apply to the ticket.
            raise flight.FlightUnauthorizedError(
                f"the result of job {view.job} is another user's: only the user who ran the "
                "query may read it"
            )
        if (
            not 0 <= view.partition < len(result.locations)
            or partition_ticket(result.locations[view.partition]) != view.ticket
        ):
            raise _refused(f"forged ticket: it names no result partition of job {view.job}")
        loc = result.locations[view.partition]
        try:
            reader = self._client(loc.flight_address).do_get(
                flight.Ticket(view.ticket), _as_reader(who)
            )
            reader.schema  # noqa: B018 - fails here, not in the stream, when it is gone
        except (flight.FlightError, OSError, pa.ArrowException) as exc:
            raise self._lost(result, loc, exc) from None

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for chunk in reader:
                    yield _as_view(chunk.data, view, result.schema)
            except (flight.FlightError, OSError, pa.ArrowException) as exc:
                raise self._lost(result, loc, exc) from None

        return flight.GeneratorStream(result.schema, fitted(batches()))

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
        params = pa.schema([pa.field(f"parameter_{i + 1}", pa.null()) for i in range(parameters)])
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
            raise _refused(
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
            raise _refused(
                f"BindError: the statement takes {prepared.parameters} parameters and none "
                "were bound"
            )
        return [bind_parameters(prepared.sql, row) for row in prepared.rows]

    def _close_prepared(self, handle: bytes, who: FlightSqlAuthMiddleware) -> None:
        self._prepared_of(handle, who)
        with self._lock:
            self._prepared.pop(handle, None)

    # ---------------------------------------------------- cancel, sessions

    def _cancel(self, info: flight.FlightInfo, who: FlightSqlAuthMiddleware) -> Any:
        """Cancel the jobs of a FlightInfo (finished ones: release their result)."""
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
            with self._lock:
                result = self._results.get(job)
            if result is not None and not who.principal.may_see(result.owner):
                raise flight.FlightUnauthorizedError(f"job {job} is another user's")
            self._release(job)
        return sql_pb.CANCEL_STATUS_CANCELLED

    def _forget_expired(self) -> None:
        """Drop the results the scheduler forgot (expired after ``--result-ttl``)."""
        with self._lock:
            jobs = list(self._results)
        for job in jobs:
            try:
                self.core.job(job)
            except JobNotFoundError:
                with self._lock:
                    self._results.pop(job, None)

    def _release(self, job: JobId) -> None:
        with self._lock:
            self._results.pop(job, None)
        try:
            if not self.core.cancel(job, "cancelled by the Flight SQL client"):
                self.core.release_result(job)
        except MangonelError as exc:  # forgotten already: nothing is held
            log.debug("releasing job %s: %s", job, exc)

    def _close_session(self, who: FlightSqlAuthMiddleware) -> None:
        with self._lock:
            handles = [h for h, p in self._prepared.items() if p.session == who.session]
            for handle in handles:
                del self._prepared[handle]
            jobs = [j for j, r in self._results.items() if r.session == who.session]
        for job in jobs:
            self._release(job)
        log.info(
            "flight sql: session of %s closed (%d prepared statements, %d results)",
            who.principal.user,
            len(handles),
            len(jobs),
        )

    # -------------------------------------------------------------- metadata

    def _metadata(self, command: Message) -> pa.Table:
        if isinstance(command, sql_pb.CommandGetSqlInfo):
            return meta.sql_info(list(command.info))
        if isinstance(command, sql_pb.CommandGetCatalogs):
            return meta.catalogs()
        if isinstance(command, sql_pb.CommandGetDbSchemas):
            return meta.db_schemas(
                _opt(command, "catalog"), _opt(command, "db_schema_filter_pattern")
            )
        if isinstance(command, sql_pb.CommandGetTables):
            return meta.tables(
                self.core.tables(),
                _opt(command, "catalog"),
                _opt(command, "db_schema_filter_pattern"),
                _opt(command, "table_name_filter_pattern"),
                list(command.table_types),
                command.include_schema,
            )
        if isinstance(command, sql_pb.CommandGetTableTypes):
            return meta.table_types()
        if isinstance(command, sql_pb.CommandGetXdbcTypeInfo):
            return meta.xdbc_type_info(_opt(command, "data_type"))
        if isinstance(command, sql_pb.CommandGetPrimaryKeys):
            return meta.empty(meta.PRIMARY_KEYS_SCHEMA)
        if isinstance(command, sql_pb.CommandGetExportedKeys | sql_pb.CommandGetImportedKeys):
            return meta.empty(meta.KEYS_SCHEMA)
        if isinstance(command, sql_pb.CommandStatementSubstraitPlan):
            raise pa.ArrowNotImplementedError("Substrait plans are not supported; send SQL")
        raise pa.ArrowNotImplementedError(
            f"{type(command).__name__} is not supported by this Flight SQL server"
        )


class _LostResult(Exception):
    """A result partition could not be read from its executor."""


# ---------------------------------------------------------------- messages

_COMMANDS: dict[str, type[Message]] = {
    name: getattr(sql_pb, name)
    for name in (
        "CommandGetSqlInfo",
        "CommandGetXdbcTypeInfo",
        "CommandGetCatalogs",
        "CommandGetDbSchemas",
        "CommandGetTables",
        "CommandGetTableTypes",
        "CommandGetPrimaryKeys",
        "CommandGetExportedKeys",
        "CommandGetImportedKeys",
        "CommandStatementQuery",
        "CommandStatementUpdate",
        "CommandStatementSubstraitPlan",
        "CommandPreparedStatementQuery",
        "CommandPreparedStatementUpdate",
        "TicketStatementQuery",
        "ActionCreatePreparedStatementRequest",
        "ActionClosePreparedStatementRequest",
        "ActionCancelQueryRequest",
    )
}


def _unpack(raw: bytes, what: str) -> Message:
    """The Flight SQL message packed in ``raw`` (a ``google.protobuf.Any``)."""
    packed = any_pb2.Any()
    try:
        packed.ParseFromString(raw)
    except DecodeError:
        raise _refused(f"malformed {what}: not a Flight SQL command (a packed protobuf)") from None
    if not packed.type_url.startswith(_TYPE_PREFIX):
        raise pa.ArrowNotImplementedError(
            f"unknown {what} {packed.type_url or '(no type)'!r}: not a Flight SQL command"
        )
    cls = _COMMANDS.get(packed.type_url[len(_TYPE_PREFIX) :])
    if cls is None:
        raise pa.ArrowNotImplementedError(
            f"{packed.type_url[len(_TYPE_PREFIX) :]} is not supported by this Flight SQL server"
        )
    return _parse(packed.value, cls)


def _unpack_as(raw: bytes, cls: type[M]) -> M:
    message = _unpack(raw, "action body")
    if not isinstance(message, cls):
        raise _refused(f"expected {cls.__name__}, got {type(message).__name__}")
    return message


def _parse(raw: bytes, cls: type[M]) -> M:
    message: M = cls()
    try:
        message.ParseFromString(raw)
    except DecodeError:
        raise _refused(f"malformed {cls.__name__}") from None
    return message


def _pack(message: Message) -> bytes:
    packed = any_pb2.Any()
    packed.Pack(message, type_url_prefix="type.googleapis.com/")
    return bytes(packed.SerializeToString())


def _command(descriptor: flight.FlightDescriptor) -> Message:
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        raise _refused("a Flight SQL request is a command descriptor, not a path")
    return _unpack(descriptor.command, "command")


def _parse_info(raw: bytes) -> flight.FlightInfo:
    try:
        return flight.FlightInfo.deserialize(raw)
    except (pa.ArrowException, ValueError, TypeError):
        raise _refused("malformed FlightInfo in the cancel request") from None


def _opt(message: Message, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


def _no_params(sql: str) -> str:
    """``sql`` with NULL for each parameter, to type its result without values."""
    parameters = count_parameters(sql)
    return bind_parameters(sql, [None] * parameters) if parameters else sql


def _as_reader(who: FlightSqlAuthMiddleware) -> flight.FlightCallOptions:
    """Options of a read from an executor on behalf of ``who``: its token goes along,
    so that the executor serves a result ticket bound to its user."""
    headers = [(AUTHORIZATION.encode(), f"Bearer {who.token}".encode())] if who.token else []
    return flight.FlightCallOptions(timeout=_FETCH_TIMEOUT_S, headers=headers)


def _as_view(batch: pa.RecordBatch, view: ResultView, schema: pa.Schema) -> pa.RecordBatch:
    return ResultView(view.ticket, view.job, view.partition, schema).apply(batch)


def start_flight_sql(
    core: SchedulerCore,
    host: str,
    port: int,
    authenticator: Authenticator = OPEN,
    results: str = "executors",
    tls_material: TlsMaterial | None = None,
    tickets: TicketIssuer | None = None,
) -> FlightSqlServer:
    """Start serving Flight SQL for ``core``; the caller stops it with ``shutdown()``.

    Raises:
        ClusterError: the port cannot be bound.
    """
    try:
        return FlightSqlServer(
            core, host, port, authenticator, results, tls_material=tls_material, tickets=tickets
        )
    except (OSError, pa.ArrowException) as exc:
        raise ClusterError(
            f"cannot serve Flight SQL on {host}:{port} ({exc}); pick another port with "
            "--flight-sql-port, or -1 for none"
        ) from exc
