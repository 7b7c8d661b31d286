"""The client's gRPC plumbing: channels, and gRPC failures as mangonel errors.

The scheduler sends a mangonel error's class name in the trailing metadata key
``mangonel-error``; ``translate`` re-raises the same class with the same
message, so ``session.sql("SELEC 1")`` raises ``SqlSyntaxError`` here exactly as
the planner raised it on the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import grpc

import mangonel.errors as errors
from mangonel import defaults
from mangonel.errors import ClusterError, MangonelError
from mangonel.security import tls
from mangonel.security.auth import AUTHORIZATION, BEARER
from mangonel.security.tls import TlsMaterial

ERROR_METADATA_KEY = "mangonel-error"  # the scheduler's service.ERROR_METADATA_KEY

MAX_MESSAGE_BYTES = defaults.GRPC_MAX_MESSAGE_BYTES
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A restarted scheduler, or the standby taking over, is found within a
    # second (gRPC's default backoff grows to two minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # A session's own connections: channels with equal options otherwise share
    # one per target, and a new session would inherit another's backoff after
    # a scheduler restart and fail at once instead of connecting.
    ("grpc.use_local_subchannel_pool", 1),
]


# A cut link is given up within 1.5 times this, and a new connection made as
# soon as it heals; kept, the old connection would wait for TCP's next
# retransmission, which backs off to about as long as the cut lasted.
DEFAULT_KEEPALIVE_S = 5.0


def keepalive_options(keepalive_s: float) -> list[tuple[str, int]]:
    """gRPC options that find a silently dead link under a running call.

    A watched job's stream can be quiet for minutes, and a cut link (no reset,
    no error: only silence) would leave it waiting forever: with these, a ping
    goes out every ``keepalive_s`` during a call, and a ping not answered within
    half that (at least 1 s) fails the call with UNAVAILABLE, which the session
    retries. No pings between calls: an idle session costs the server nothing.
    The scheduler accepts pings down to 1 s apart (``scheduler.main``).
    """
    every_ms = max(1000, int(keepalive_s * 1000))
    timeout_ms = max(1000, every_ms // 2)
    return [
        ("grpc.keepalive_time_ms", every_ms),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        # gRPC 1.85 waits for a ping's answer this long, whatever the keepalive
        # timeout says (default 60 s). Measured in the network lab: a server
        # whose socket died during a 4 s cut took the client's ping but never
        # answered it, and the watch stayed silent for 60 s after the heal.
        ("grpc.http2.ping_timeout_ms", timeout_ms),
        ("grpc.keepalive_permit_without_calls", 0),
        # Keep pinging while the server sends nothing (the default stops after 2).
        ("grpc.http2.max_pings_without_data", 0),
    ]


def open_channel(
    address: str, keepalive_s: float = DEFAULT_KEEPALIVE_S, tls_material: TlsMaterial | None = None
) -> grpc.Channel:
    """A channel to ``host:port`` (connects lazily, on the first call); TLS when given."""
    return tls.open_channel(address, tls_material, CHANNEL_OPTIONS + keepalive_options(keepalive_s))


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Sequence[tuple[str, str | bytes]] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _Details(_CallDetails, grpc.ClientCallDetails):  # type: ignore[misc]
    """``grpc.ClientCallDetails`` with fields (gRPC leaves the class abstract)."""


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds ``authorization: Bearer <token>`` to every call that has a token to send.

    Args:
        token: Called before each call: the token now, ``None`` or empty for none
            (an unsecured scheduler, or the login call itself).
    """

    def __init__(self, token: Callable[[str], str | None]) -> None:
        self._token = token

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        token = self._token(details.method)
        if not token:
            return details
        metadata = [*(details.metadata or ()), (AUTHORIZATION, BEARER + token)]
        return _Details(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)


def unreachable(address: str, details: str = "", tls_on: bool | None = None) -> ClusterError:
    """The scheduler did not answer; with ``details`` (gRPC's), say why it may not have."""
    why = f" ({details})" if details else ""
    hint = f"; {tls.describe_failure(details, tls_on)}" if tls_on is not None else ""
    return ClusterError(
        f"cannot reach the scheduler at {address}{why}; is it running? "
        f"start one with `mangonel standalone`{hint}"
    )


def error_name(err: grpc.RpcError) -> str:
    """The ``mangonel.errors`` class a scheduler named in a failed call's trailing
    metadata; ``""`` when none did (the call never reached a scheduler)."""
    if isinstance(err, grpc.Call):
        for key, value in err.trailing_metadata() or ():
            if key == ERROR_METADATA_KEY:
                return value if isinstance(value, str) else value.decode()
    return ""


def translate(err: grpc.RpcError, address: str, tls_on: bool | None = None) -> MangonelError:
    """The mangonel error a failed call stands for.

    Args:
        err: The failed call.
        address: The scheduler called.
        tls_on: Whether the channel spoke TLS, for a hint when it did not get
            through (a plaintext client at a TLS port, a certificate refused);
            ``None``: no hint.
    """
    code = err.code() if isinstance(err, grpc.Call) else None
    details = (err.details() if isinstance(err, grpc.Call) else None) or str(err)
    if code is grpc.StatusCode.UNAVAILABLE:
        return unreachable(address, details if tls_on is not None else "", tls_on)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return ClusterError(f"the scheduler at {address} did not answer in time: {details}")
    name = error_name(err)
    cls = getattr(errors, name, None) if name else None
    if isinstance(cls, type) and issubclass(cls, MangonelError):
        return cls(details)
    if code is grpc.StatusCode.NOT_FOUND:
        return MangonelError(details)
    label = code.name if code is not None else "unknown"
    return MangonelError(f"the scheduler at {address} failed ({label}): {details}")
