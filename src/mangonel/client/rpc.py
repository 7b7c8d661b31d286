"""The client's gRPC plumbing: channels, and gRPC failures as mangonel errors.

The scheduler sends a mangonel error's class name in the trailing metadata key
``mangonel-error``; ``translate`` re-raises the same class with the same
message, so ``session.sql("SELEC 1")`` raises ``SqlSyntaxError`` here exactly as
the planner raised it on the scheduler.
"""

from __future__ import annotations

import grpc

import mangonel.errors as errors
from mangonel.errors import ClusterError, MangonelError

ERROR_METADATA_KEY = "mangonel-error"  # the scheduler's service.ERROR_METADATA_KEY

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
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


def open_channel(address: str) -> grpc.Channel:
    """A channel to ``host:port`` (connects lazily, on the first call)."""
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


def unreachable(address: str) -> ClusterError:
    return ClusterError(
        f"cannot reach the scheduler at {address}; is it running? "
        "start one with `mangonel standalone`"
    )


def translate(err: grpc.RpcError, address: str) -> MangonelError:
    """The mangonel error a failed call stands for."""
    code = err.code() if isinstance(err, grpc.Call) else None
    details = (err.details() if isinstance(err, grpc.Call) else None) or str(err)
    if code is grpc.StatusCode.UNAVAILABLE:
        return unreachable(address)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return ClusterError(f"the scheduler at {address} did not answer in time: {details}")
    name = ""
    if isinstance(err, grpc.Call):
        for key, value in err.trailing_metadata() or ():
            if key == ERROR_METADATA_KEY:
                name = value if isinstance(value, str) else value.decode()
    cls = getattr(errors, name, None) if name else None
    if isinstance(cls, type) and issubclass(cls, MangonelError):
        return cls(details)
    if code is grpc.StatusCode.NOT_FOUND:
        return MangonelError(details)
    label = code.name if code is not None else "unknown"
    return MangonelError(f"the scheduler at {address} failed ({label}): {details}")
