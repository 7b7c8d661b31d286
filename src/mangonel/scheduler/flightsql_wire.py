"""Flight SQL as it travels: the commands clients send, the status of each failure,
the descriptors polls are named by.

Commands arrive packed in ``google.protobuf.Any`` (``unpack``); action bodies
and Flight's own messages are bare (``parse``). A query polled for
(``PollFlightInfo``) is named, until it is done, by a descriptor whose command is
``POLL_PREFIX`` and a random handle (``poll_descriptor``).

Every failure ends the call with the gRPC status that says what happened, in
plain text. The service raises a Flight error carrying the code's name in its
``extra_info`` (``status``), which the port's front reads
(``flightsql_front``): pyarrow alone has no error class for most codes. A
mangonel error gets its code from ``code_of``:

==========================  ====================  ===================================
error                       status                a client should
==========================  ====================  ===================================
LoginThrottledError         RESOURCE_EXHAUSTED    wait the seconds it says, then log in
AuthenticationError         UNAUTHENTICATED       log in (again)
PermissionDeniedError       PERMISSION_DENIED     use its own jobs, or ask an admin
JobCancelledError           CANCELLED             run it again if it still wants it
UnknownTableError,          NOT_FOUND             register the table (again)
ObjectNotFoundError
QueryError (the others)     INVALID_ARGUMENT      fix the query
ObjectStoreUnavailable...   UNAVAILABLE           try again later
CatalogError (the others)   FAILED_PRECONDITION   register the table again, fix access
InternalError               INTERNAL              report the bug
QueryTimeoutError           DEADLINE_EXCEEDED     allow more time
ClusterError,               UNAVAILABLE           try again later
StateStoreError
JobFailedError (the rest)   ABORTED               run it again (attempts used up,
                                                  executors lost)
==========================  ====================  ===================================

(The gRPC API differs where its client needs it to: there UNAVAILABLE means the
scheduler cannot be reached, and the client waits for it; ``service.abort``.)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from mangonel.errors import (
    AuthenticationError,
    CatalogError,
    ClusterError,
    InternalError,
    JobCancelledError,
    JobFailedError,
    LoginThrottledError,
    MangonelError,
    ObjectNotFoundError,
    ObjectStoreUnavailableError,
    PermissionDeniedError,
    QueryError,
    QueryTimeoutError,
    StateStoreError,
    UnknownTableError,
    job_failure,
    plain_text,
)
from mangonel.proto import flightsql_pb2 as sql_pb
from mangonel.scheduler.flightsql_front import STATUS_PREFIX

log = logging.getLogger(__name__)

TYPE_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."

M = TypeVar("M", bound=Message)
F = TypeVar("F", bound=Callable[..., Any])

# ------------------------------------------------------------------ statuses

_CODES: tuple[tuple[type[MangonelError], str], ...] = (
    (LoginThrottledError, "RESOURCE_EXHAUSTED"),
    (AuthenticationError, "UNAUTHENTICATED"),
    (PermissionDeniedError, "PERMISSION_DENIED"),
    (JobCancelledError, "CANCELLED"),
    (UnknownTableError, "NOT_FOUND"),
    (ObjectNotFoundError, "NOT_FOUND"),
    (QueryError, "INVALID_ARGUMENT"),
    (ObjectStoreUnavailableError, "UNAVAILABLE"),
    (CatalogError, "FAILED_PRECONDITION"),
    (InternalError, "INTERNAL"),
    (QueryTimeoutError, "DEADLINE_EXCEEDED"),
    (ClusterError, "UNAVAILABLE"),
    (StateStoreError, "UNAVAILABLE"),
    (JobFailedError, "ABORTED"),
)
"""First match wins: a job that failed for a typed reason is both that error and
a ``JobFailedError``, and gets the reason's code."""

_FLIGHT_ERRORS: dict[str, type[flight.FlightError]] = {
    "UNAUTHENTICATED": flight.FlightUnauthenticatedError,
    "PERMISSION_DENIED": flight.FlightUnauthorizedError,
    "CANCELLED": flight.FlightCancelledError,
    "DEADLINE_EXCEEDED": flight.FlightTimedOutError,
    "UNAVAILABLE": flight.FlightUnavailableError,
    "INTERNAL": flight.FlightInternalError,
}
"""The Flight error of a code where pyarrow has one (so that the service's own
status is right too); the other codes travel as ``FlightServerError``."""


def status(code: str, message: str) -> flight.FlightError:
    """The error that ends a call with gRPC status ``code`` (a ``grpc.StatusCode``
    name) and ``message``, as plain text."""
    cls = _FLIGHT_ERRORS.get(code, flight.FlightServerError)
    return cls(plain_text(message), extra_info=STATUS_PREFIX + code.encode())


def invalid(message: str) -> flight.FlightError:
    """A request that cannot be done as sent (INVALID_ARGUMENT)."""
    return status("INVALID_ARGUMENT", message)


def not_found(message: str) -> flight.FlightError:
    """A handle, ticket or table that is not there (NOT_FOUND)."""
    return status("NOT_FOUND", message)


def unsupported(message: str) -> flight.FlightError:
    """A command or action this server does not serve (UNIMPLEMENTED)."""
    return status("UNIMPLEMENTED", message)


def code_of(exc: MangonelError) -> str:
    """The gRPC status a mangonel error ends a Flight SQL call with (the table above)."""
    return next((code for cls, code in _CODES if isinstance(exc, cls)), "UNKNOWN")


def translate(exc: Exception) -> flight.FlightError:
    """Any failure of a handler as the Flight error a client should see.

    A mangonel error keeps its class's name in front of its message, the way
    every client shows it (``SqlSyntaxError: ...``); a Flight error goes as it is;
    anything else is a bug here (logged), or pyarrow refusing what a client sent.
    """
    if isinstance(exc, flight.FlightError):
        return exc
    if isinstance(exc, MangonelError):
        return status(code_of(exc), f"{type(exc).__name__}: {exc}")
    if isinstance(exc, pa.ArrowInvalid):
        return invalid(str(exc))
    log.exception("internal error in the Flight SQL server", exc_info=exc)
    return status(
        "INTERNAL",
        f"internal error of the Flight SQL server: {type(exc).__name__}: {exc}; the "
        "scheduler's log has the details",
    )


def flight_errors(method: F) -> F:
    """Give every failure of a handler the status a client should see."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            translated = translate(exc)
            if translated is exc:
                raise
            raise translated from None

    return wrapper  # type: ignore[return-value]


def failure(job: str, error: str, error_type: str) -> flight.FlightError:
    """What a client gets for a job that ended without a result: the status of the
    error it is blamed on (``JobCancelledError``: CANCELLED), the message named by
    it, as every refusal here is."""
    blamed = job_failure(error_type, error)
    return status(code_of(blamed), f"{error_type}: {error or f'job {job} did not finish'}")


# ------------------------------------------------------------------ messages

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


def unpack(raw: bytes, what: str) -> Message:
    """The Flight SQL message packed in ``raw`` (a ``google.protobuf.Any``)."""
    packed = any_pb2.Any()
    try:
        packed.ParseFromString(raw)
    except DecodeError:
        raise invalid(f"malformed {what}: not a Flight SQL command (a packed protobuf)") from None
    if not packed.type_url.startswith(TYPE_PREFIX):
        raise unsupported(
            f"unknown {what} {packed.type_url or '(no type)'!r}: not a Flight SQL command"
        )
    cls = _COMMANDS.get(packed.type_url[len(TYPE_PREFIX) :])
    if cls is None:
        raise unsupported(
            f"{packed.type_url[len(TYPE_PREFIX) :]} is not supported by this Flight SQL server"
        )
    return parse(packed.value, cls)


def unpack_as(raw: bytes, cls: type[M]) -> M:
    """The ``cls`` message packed in an action's body."""
    message = unpack(raw, "action body")
    if not isinstance(message, cls):
        raise invalid(f"expected {cls.__name__}, got {type(message).__name__}")
    return message


def parse(raw: bytes, cls: type[M]) -> M:
    """A bare message (an action body, Flight's own messages)."""
    message: M = cls()
    try:
        message.ParseFromString(raw)
    except DecodeError:
        raise invalid(f"malformed {cls.__name__}") from None
    return message


def pack(message: Message) -> bytes:
    """``message`` packed in ``google.protobuf.Any``, as Flight SQL answers are."""
    packed = any_pb2.Any()
    packed.Pack(message, type_url_prefix="type.googleapis.com/")
    return bytes(packed.SerializeToString())


def command_of(descriptor: flight.FlightDescriptor) -> Message:
    """The Flight SQL command a descriptor carries."""
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        raise invalid("a Flight SQL request is a command descriptor, not a path")
    return unpack(descriptor.command, "command")


def parse_descriptor(raw: bytes) -> flight.FlightDescriptor:
    """A serialized ``FlightDescriptor`` (the body of the front's actions)."""
    try:
        return flight.FlightDescriptor.deserialize(raw)
    except (pa.ArrowException, ValueError, TypeError):
        raise invalid("malformed FlightDescriptor") from None


def parse_info(raw: bytes) -> flight.FlightInfo:
    """A serialized ``FlightInfo`` (in a cancel request)."""
    try:
        return flight.FlightInfo.deserialize(raw)
    except (pa.ArrowException, ValueError, TypeError):
        raise invalid("malformed FlightInfo in the cancel request") from None


def opt(message: Message, name: str) -> Any:
    """An optional field's value, ``None`` when unset."""
    return getattr(message, name) if message.HasField(name) else None


# --------------------------------------------------------------------- polls

POLL_PREFIX = b"mangonel-poll:"
"""The command of the descriptor a PollInfo answers while the query runs."""


def poll_descriptor(handle: bytes) -> flight.FlightDescriptor:
    """The descriptor a PollInfo names its poll by, while the query runs."""
    return flight.FlightDescriptor.for_command(POLL_PREFIX + handle.hex().encode())


def poll_handle(descriptor: flight.FlightDescriptor | None) -> bytes | None:
    """The poll a descriptor names; ``None`` when it names none."""
    if descriptor is None or descriptor.descriptor_type != flight.DescriptorType.CMD:
        return None
    raw = descriptor.command
    if not raw.startswith(POLL_PREFIX):
        return None
    try:
        return bytes.fromhex(raw[len(POLL_PREFIX) :].decode())
    except (ValueError, UnicodeDecodeError):
        raise invalid("malformed poll descriptor: use the one the last PollInfo gave") from None
