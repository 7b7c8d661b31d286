"""Start a scheduler: ``run_scheduler(config)`` serves until SIGTERM or Ctrl-C.

``start_scheduler(config)`` does the same without blocking and returns a
``SchedulerServer`` handle; tests and ``mangonel standalone`` use it. With port
0 a free port is picked: the bound address is printed as
``mangonel scheduler listening on HOST:PORT`` and, with ``address_file``,
written to that file (atomically) for ``LocalCluster`` to read.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc

from mangonel.errors import ClusterError
from mangonel.plan.planner import PlannerConfig
from mangonel.proto import mangonel_pb2_grpc as pb_grpc
from mangonel.scheduler.core import CoreConfig, SchedulerCore
from mangonel.scheduler.events import Limits
from mangonel.scheduler.service import ExecutorControlServicer, QueryServiceServicer

log = logging.getLogger(__name__)

# Task specs list every upstream partition location; big plans exceed gRPC's 4 MB.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Executors' Connect streams are idle for long stretches: keep them open and
    # let a dead peer be found by keepalive pings rather than never.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings of a scheduler process.

    Attributes:
        host: Interface to listen on.
        port: Port to listen on; 0 picks a free one.
        partitions: Output partitions of every hash exchange.
        broadcast_bytes: Join sides estimated below this size are broadcast.
        split_rows: Rows (about) read by one scan task; None sizes splits from each table.
        heartbeat_timeout_s: An executor silent this long is lost.
        no_executor_grace_s: A job with no executor for this long fails.
        max_task_attempts: Attempts of one task before its job fails.
        max_stage_reruns: Re-runs of one stage before its job fails.
        result_ttl_s: Results no client released are deleted after this long.
        address_file: Where to write the bound ``host:port`` once serving.
        max_workers: gRPC threads; every executor stream and job watcher holds one.
    """

    host: str = "127.0.0.1"
    port: int = 50050
    partitions: int = 4
    broadcast_bytes: int = 8 * 1024 * 1024
    split_rows: int | None = None
    heartbeat_timeout_s: float = 10.0
    no_executor_grace_s: float = 30.0
    max_task_attempts: int = 4
    max_stage_reruns: int = 4
    result_ttl_s: float = 600.0
    address_file: str | None = None
    max_workers: int = 128

    def core_config(self) -> CoreConfig:
        return CoreConfig(
            planner=PlannerConfig(
                partitions=self.partitions,
                broadcast_bytes=self.broadcast_bytes,
                split_rows=self.split_rows,
            ),
            limits=Limits(
                max_task_attempts=self.max_task_attempts,
                max_stage_reruns=self.max_stage_reruns,
                heartbeat_timeout_s=self.heartbeat_timeout_s,
                no_executor_grace_s=self.no_executor_grace_s,
            ),
            result_ttl_s=self.result_ttl_s,
        )


class SchedulerServer:
    """A running scheduler: its gRPC server, its core and its bound address."""

    def __init__(self, server: grpc.Server, core: SchedulerCore, address: str) -> None:
        self.server = server
        self.core = core
        self.address = address

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving: end executor streams, then the server."""
        self.core.stop()
        self.server.stop(grace).wait(grace + 1)


def start_scheduler(config: SchedulerConfig) -> SchedulerServer:
    """Bind, start serving and return at once.

    Raises:
        ClusterError: the address cannot be bound (e.g. the port is taken).
    """
    from mangonel.scheduler.state import SchedulerState  # the state machine's module

    core_config = config.core_config()
    core = SchedulerCore(SchedulerState(core_config.limits), core_config)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="rpc"),
        options=GRPC_OPTIONS,
        maximum_concurrent_rpcs=None,
    )
    try:
        port = server.add_insecure_port(f"{config.host}:{config.port}")
    except RuntimeError as exc:
        raise ClusterError(
            f"cannot listen on {config.host}:{config.port} ({exc}); is another scheduler "
            "running there? pick another port with --port"
        ) from exc
    address = f"{config.host}:{port}"
    # The generated registration functions carry no annotations.
    pb_grpc.add_ExecutorControlServicer_to_server(  # type: ignore[no-untyped-call]
        ExecutorControlServicer(core), server
    )
    pb_grpc.add_QueryServiceServicer_to_server(  # type: ignore[no-untyped-call]
        QueryServiceServicer(core, address), server
    )
    server.start()
    core.start()
    log.info("scheduler listening on %s", address)
    if config.address_file:
        tmp = f"{config.address_file}.tmp"
        with open(tmp, "w") as f:
            f.write(address)
        os.replace(tmp, config.address_file)
    return SchedulerServer(server, core, address)


def run_scheduler(config: SchedulerConfig) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly."""
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("signal %d: stopping the scheduler", signum)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    running = start_scheduler(config)
    print(f"mangonel scheduler listening on {running.address}", flush=True)
    try:
        while not done.wait(1.0):
            pass
    finally:
        running.stop()
