"""Start an executor: ``run_executor(config)`` serves until SIGTERM (drain) or SIGINT.

``start_executor(config)`` does the same on a background thread and returns the
``ExecutorService`` (tests, ``mangonel standalone``); ``stop_executor`` ends it.
Once registered, ``run_executor`` prints
``mangonel executor EXECUTOR_ID registered with SCHEDULER, flight HOST:PORT``.

Signals: SIGTERM drains (the executor finishes its tasks and serves its outputs
until the scheduler lets it go, at most ``drain_timeout_s``, then exits 0); a
second SIGTERM, or SIGINT (Ctrl-C), stops it at once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

from mangonel import pauses, storage
from mangonel.executor.config import ExecutorConfig
from mangonel.executor.hooks import NO_HOOKS, TaskHooks
from mangonel.executor.link import GrpcSchedulerLink, SchedulerLink
from mangonel.executor.runner import keep_batch_memory
from mangonel.executor.service import ExecutorService
from mangonel.security import options as security
from mangonel.security.tls import TlsMaterial

log = logging.getLogger(__name__)


def start_executor(
    config: ExecutorConfig, link: SchedulerLink | None = None
) -> tuple[ExecutorService, threading.Thread]:
    """Start an executor in this process and return at once.

    It also tunes this process's C allocator for the executor's Arrow batches
    (``runner.keep_batch_memory``).

    Args:
        config: The executor's settings.
        link: The line to the scheduler; a gRPC one to ``config.scheduler_address``
            when ``None``.

    Returns:
        The service and the thread running its control loop; pass both to
        ``stop_executor``.
    """
    keep_batch_memory()
    pauses.watch()
    storage.configure(config.storage)
    config.security.check_member("executor")
    link = link or GrpcSchedulerLink(
        config.scheduler_address, tls_material=TlsMaterial.load(config.security)
    )
    service = ExecutorService(config, link, task_hooks(config))
    service.start()
    thread = threading.Thread(target=service.serve, name="executor-control", daemon=True)
    thread.start()
    return service, thread


def task_hooks(config: ExecutorConfig) -> TaskHooks:
    """The hooks on every task: fault injection with ``config.faults_file``, else none."""
    if config.faults_file is None:
        return NO_HOOKS
    # The composition root: the one place production code reaches into
    # the testing package, and only for an executor started with --faults-file.
    from mangonel.testing.faults import FaultInjector

    label = str(config.index) if config.index is not None else ""
    return FaultInjector(config.faults_file, label, work_dir=config.work_dir)


def stop_executor(
    service: ExecutorService, thread: threading.Thread, timeout_s: float = 10.0
) -> None:
    """Stop a started executor: its control loop, tasks, Flight server and files."""
    service.stop()
    thread.join(timeout_s)
    service.close()


def run_executor(config: ExecutorConfig) -> None:
    """Run an executor until drained (SIGTERM) or stopped (SIGINT), then stop cleanly."""
    stop_now = threading.Event()
    drain = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        if drain.is_set():
            log.info("second SIGTERM: stopping the executor now")
            stop_now.set()
        else:
            log.info("SIGTERM: draining (at most %g s)", config.drain_timeout_s)
            drain.set()

    def on_int(signum: int, frame: object) -> None:
        log.info("signal %d: stopping the executor now", signum)
        stop_now.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_int)
    service, thread = start_executor(config)
    announced = False
    deadline: float | None = None
    try:
        # The main thread only waits, so signals are handled at once.
        while not stop_now.wait(0.1):
            if not announced and service.registered.is_set():
                announced = True
                print(
                    f"mangonel executor {service.executor_id} registered with "
                    f"{config.scheduler_address}, flight {service.flight_address}",
                    flush=True,
                )
            if drain.is_set() and deadline is None:
                deadline = time.monotonic() + config.drain_timeout_s
                service.drain()
            if service.finished.is_set() or not thread.is_alive():
                break
            if deadline is not None and time.monotonic() > deadline:
                log.warning(
                    "drain bound of %g s passed with %d tasks running: stopping",
                    config.drain_timeout_s,
                    service.running_tasks,
                )
                break
    finally:
        stop_executor(service, thread)


def parse_args(argv: list[str] | None = None) -> ExecutorConfig:
    """An ``ExecutorConfig`` from command-line flags (``python -m mangonel.executor.main -h``)."""
    parser = argparse.ArgumentParser(
        prog="mangonel-executor", description="Run a mangonel executor."
    )
    defaults = ExecutorConfig()
    parser.add_argument("--scheduler", default=defaults.scheduler_address, help="host:port")
    parser.add_argument("--host", default=defaults.host, help="host identity (default: hostname)")
    parser.add_argument("--bind-host", default=defaults.bind_host)
    parser.add_argument("--advertise-host", default=None)
    parser.add_argument("--flight-port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--slots", type=int, default=defaults.slots)
    parser.add_argument(
        "--memory", default=None, metavar="SIZE", help="the executor's memory budget, e.g. 2GB"
    )
    parser.add_argument("--spill", default=None, metavar="SIZE", help="spill budget, all slots")
    parser.add_argument(
        "--memory-limit", default=None, help="deprecated: DuckDB memory_limit per slot"
    )
    parser.add_argument("--threads", type=int, default=None, help="DuckDB threads per slot")
    parser.add_argument(
        "--cores", type=int, default=None, help="cores the tasks may use (default: the host's)"
    )
    parser.add_argument("--work-dir", default=defaults.work_dir, help="work root (shareable)")
    add_recovery_options(parser, defaults)
    storage.add_arguments(parser)
    security.add_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return ExecutorConfig(
        scheduler_address=args.scheduler,
        host=args.host,
        bind_host=args.bind_host,
        advertise_host=args.advertise_host,
        flight_port=args.flight_port,
        slots=args.slots,
        memory=args.memory,
        memory_limit=args.memory_limit,
        spill=args.spill,
        threads=args.threads,
        cores=args.cores,
        work_dir=args.work_dir,
        drain_timeout_s=args.drain_timeout,
        fetch_timeout_s=args.fetch_timeout,
        cleanup_interval_s=args.cleanup_interval,
        faults_file=args.faults_file,
        index=args.index,
        storage=storage.options_from_args(args),
        security=security.options_from_args(args, "node"),
    )


def add_recovery_options(parser: argparse.ArgumentParser, defaults: ExecutorConfig) -> None:
    """The drain, fetch, cleanup and fault-injection flags (shared with ``mangonel executor``)."""
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=defaults.drain_timeout_s,
        metavar="S",
        help="on SIGTERM, finish tasks and serve outputs for at most S seconds "
        "(default %(default)g)",
    )
    parser.add_argument(
        "--fetch-timeout",
        type=float,
        default=defaults.fetch_timeout_s,
        metavar="S",
        help="give up a Flight fetch of a shuffle partition after S seconds (default %(default)g)",
    )
    parser.add_argument(
        "--cleanup-interval",
        type=float,
        default=defaults.cleanup_interval_s,
        metavar="S",
        help="sweep the work root for dead executors' files every S seconds (default %(default)g)",
    )
    parser.add_argument(
        "--faults-file", default=None, help="JSON fault-injection rules (tests only)"
    )
    parser.add_argument(
        "--index", type=int, default=None, help="number in a local cluster (names it in logs)"
    )


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: parse flags, then ``run_executor``."""
    run_executor(parse_args(argv))


if __name__ == "__main__":
    main()
