"""The port Flight SQL clients connect to: a gRPC front of the Flight SQL service.

The service (``flightsql.FlightSqlService``) is a ``pyarrow.flight`` server, and
pyarrow lets a Python server say little about a failure: a Flight error travels
as its code with " Detail: Failed" (or the like) appended to the message, any
other exception (``ArrowInvalid`` for INVALID_ARGUMENT, ``KeyError`` for
NOT_FOUND, ``NotImplementedError`` for UNIMPLEMENTED) with the server's Python
traceback pasted into it, and every error of ``GetSchema`` so. Nor can it serve
``PollFlightInfo``: pyarrow 26's server has no such method (its table of
callbacks, ``PyFlightServerVtable``, stops at the methods of Flight 1.0).

So the service listens on a Unix socket in a directory of its own, and this
front, a grpcio server, takes the Flight SQL port and passes every call through
to it as bytes, with its headers both ways, its deadline and its cancel. What it
changes:

* a failed call ends with the status code the service chose (the code it names
  in the error's details, ``STATUS_PREFIX``, else the code pyarrow gave) and the
  message alone (pyarrow's ``x-arrow-status-message-bin`` trailer), in plain text;
* ``GetSchema`` and ``PollFlightInfo`` go to the service as its private actions
  ``POLL_ACTION`` and ``SCHEMA_ACTION``, whose answer is the call's;
* the service learns who is calling from ``PEER_HEADER`` (a client that never
  logged in has its connection for a session), which the front sets on every call.

What passes through costs one more local hop (``BENCHMARKS.md``, "Flight SQL on the
wire"): about 1.6 ms a call, and half again the time of a result read through
the scheduler, whose bytes the front relays once more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from mangonel.errors import plain_text
from mangonel.proto import flightsql_pb2 as sql_pb
from mangonel.security.tls import ServingCertificates

log = logging.getLogger(__name__)

SERVICE = "/arrow.flight.protocol.FlightService/"

PEER_HEADER = "x-mangonel-peer"
"""The client's address as the front sees it (the service sees only the front)."""

STATUS_PREFIX = b"mangonel-status:"
"""How the service names the gRPC status a failure ends with (``INVALID_ARGUMENT``,
``NOT_FOUND``...), in the Flight error's ``extra_info``: pyarrow has no error class
for most codes, and passes ``extra_info`` on as the status details."""

POLL_ACTION = "mangonel.PollFlightInfo"
"""The service's action for PollFlightInfo: body a FlightDescriptor, answer a PollInfo."""
SCHEMA_ACTION = "mangonel.GetSchema"
"""The service's action for GetSchema: body a FlightDescriptor, answer a SchemaResult."""

WORKERS = 256
"""Calls the front serves at once; each holds a thread for as long as it lasts
(a statement for as long as its query runs). Threads start as calls come."""

_KINDS = {
    "Handshake": "stream_stream",
    "ListFlights": "unary_stream",
    "GetFlightInfo": "unary_unary",
    "PollFlightInfo": "unary_unary",
    "GetSchema": "unary_unary",
    "DoGet": "unary_stream",
    "DoPut": "stream_stream",
    "DoExchange": "stream_stream",
    "DoAction": "unary_stream",
    "ListActions": "unary_stream",
}
_AS_ACTION = {"PollFlightInfo": POLL_ACTION, "GetSchema": SCHEMA_ACTION}
_UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
# Headers gRPC sets itself, or that no client may send the service.
_OWN_HEADERS = ("user-agent", "te", "content-type", PEER_HEADER)
_ARROW_MESSAGE = "x-arrow-status-message-bin"
_NO_DEADLINE_S = 1e9


class FlightSqlFront:
    """The front of a Flight SQL service; it listens once constructed.

    Args:
        service: gRPC target of the service (``unix:/path``).
        host: Interface to listen on.
        port: Port; 0 picks a free one (``port`` tells).
        serving: Serve TLS with this certificate (and the ones it reloads); clients
            prove who they are by logging in, so none is asked for a certificate.

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(
        self, service: str, host: str, port: int, serving: ServingCertificates | None = None
    ) -> None:
        self._channel = grpc.insecure_channel(service, options=_UNLIMITED)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="flight-sql"),
            handlers=[_Handler(self._channel)],
            options=_UNLIMITED,
        )
        address = f"{host}:{port}"
        try:
            if serving is None:
                bound = self._server.add_insecure_port(address)
            else:
                credentials = serving.grpc_credentials(require_client_auth=False)
                bound = self._server.add_secure_port(address, credentials)
        except RuntimeError as exc:  # grpcio raises this where it cannot bind
            raise OSError(f"cannot listen on {address}: {exc}") from None
        if not bound:
            raise OSError(f"cannot listen on {address}")
        self.port: int = bound
        self._server.start()

    def stop(self) -> None:
        """Stop listening; calls in flight are cancelled."""
        self._server.stop(grace=None).wait()
        self._channel.close()


class _Handler(grpc.GenericRpcHandler):
    """Every Flight method, passed through to the service."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._channel = channel

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = details.method  # type: ignore[attr-defined]
        name = method.removeprefix(SERVICE)
        kind = _KINDS.get(name) if method.startswith(SERVICE) else None
        if kind is None:
            return None  # gRPC answers UNIMPLEMENTED
        if name in _AS_ACTION:
            return grpc.unary_unary_rpc_method_handler(self._as_action(_AS_ACTION[name]))
        if kind == "unary_unary":
            return grpc.unary_unary_rpc_method_handler(self._unary(method))
        if kind == "unary_stream":
            return grpc.unary_stream_rpc_method_handler(self._unary_stream(method))
        return grpc.stream_stream_rpc_method_handler(self._stream_stream(method))

    def _unary(self, method: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        call = self._channel.unary_unary(method)

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            future = call.future(request, metadata=_headers(context), timeout=_left(context))
            context.add_callback(future.cancel)
            try:
                response: bytes = future.result()
            except grpc.RpcError as err:
                _fail(context, err)
            except grpc.FutureCancelledError:
                context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")
            context.send_initial_metadata(_passed(future.initial_metadata()))
            return response

        return handle

    def _unary_stream(
        self, method: str
    ) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        call = self._channel.unary_stream(method)

        def handle(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            responses = call(request, metadata=_headers(context), timeout=_left(context))
            yield from _relay(responses, context)

        return handle

    def _stream_stream(
        self, method: str
    ) -> Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[bytes]]:
        call = self._channel.stream_stream(method)

        def handle(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            responses = call(requests, metadata=_headers(context), timeout=_left(context))
            yield from _relay(responses, context)

        return handle

    def _as_action(self, action: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        """The method as a call of the service's ``action``: its one result's body."""
        call = self._channel.unary_stream(SERVICE + "DoAction")

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            body = sql_pb.Action(type=action, body=request).SerializeToString()
            answer = call(body, metadata=_headers(context), timeout=_left(context))
            results = list(_relay(answer, context))
            if len(results) != 1:
                context.abort(grpc.StatusCode.INTERNAL, f"{action} answered {len(results)} results")
            return bytes(sql_pb.Result.FromString(results[0]).body)

        return handle


def _relay(responses: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
    """The service's responses to a streaming call, with its headers first; its
    failure as ``_fail`` says; the client's cancel cancels it."""
    context.add_callback(responses.cancel)
    try:
        headers = responses.initial_metadata()
        context.send_initial_metadata(_passed(headers))
        yield from responses
    except grpc.RpcError as err:
        _fail(context, err)


def _fail(context: grpc.ServicerContext, err: grpc.RpcError) -> None:
    """End the call as the service's call ended: its code, its message alone."""
    code: grpc.StatusCode = err.code()  # type: ignore[attr-defined]
    message: str = err.details() or ""  # type: ignore[attr-defined]
    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == _ARROW_MESSAGE:
            message = bytes(value).decode(errors="replace")
        elif key == "grpc-status-details-bin" and bytes(value).startswith(STATUS_PREFIX):
            name = bytes(value)[len(STATUS_PREFIX) :].decode(errors="replace")
            code = getattr(grpc.StatusCode, name, code)
    context.abort(code, plain_text(message))


def _headers(context: grpc.ServicerContext) -> list[tuple[str, Any]]:
    """The client's headers for the service, and who the client is."""
    passed = [
        (key, value)
        for key, value in context.invocation_metadata()
        if not key.startswith((":", "grpc-")) and key not in _OWN_HEADERS
    ]
    passed.append((PEER_HEADER, context.peer()))
    return passed


def _passed(headers: Any) -> list[tuple[str, Any]]:
    """The service's headers for the client (a login's token among them)."""
    return [
        (key, value)
        for key, value in headers or ()
        if not key.startswith((":", "grpc-")) and key not in ("content-type",)
    ]


def _left(context: grpc.ServicerContext) -> float | None:
    """The client's deadline, for the service's call; ``None``: it set none (grpcio
    then says 2**63 ns, which as a timeout would end the call at once)."""
    remaining: float | None = context.time_remaining()
    return remaining if remaining is not None and remaining < _NO_DEADLINE_S else None
