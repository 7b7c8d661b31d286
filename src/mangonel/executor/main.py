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

from mangonel import options, pauses, storage
from mangonel.executor.config import ExecutorConfig
from mangonel.executor.hooks import NO_HOOKS, TaskHooks
from mangonel.executor.link import GrpcSchedulerLink, SchedulerLink
from mangonel.executor.memory import keep_batch_memory, set_huge_pages
from mangonel.executor.service import ExecutorService
from mangonel.security.tls import TlsMaterial

log = logging.getLogger(__name__)


def start_executor(
    config: ExecutorConfig, link: SchedulerLink | None = None
) -> tuple[ExecutorService, threading.Thread]:
    """Start an executor in this process and return at once.

    It also tunes this process's C allocator for the executor's Arrow batches
    (``memory.keep_batch_memory``) and, unless ``config.huge_pages``, keeps
    transparent huge pages from it (``memory.set_huge_pages``).

    Args:
        config: The executor's settings.
        link: The line to the scheduler; a gRPC one to ``config.scheduler_address``
            when ``None``.

    Returns:
        The service and the thread running its control loop; pass both to
        ``stop_executor``.
    """
    keep_batch_memory()
    set_huge_pages(config.huge_pages)
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
    # The composition root: the one place production code reaches into the
    # testing package, and only for an executor started with --faults-file (a
    # test-only option: ``$MANGONEL_TEST_HOOKS``).
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


def build_parser() -> argparse.ArgumentParser:
    """The executor's parser: the options of ``options.Takes.EXECUTOR`` (with the
    object storage and security ones) and ``--log-level``. ``mangonel executor``
    takes the same."""
    parser = argparse.ArgumentParser(
        prog="python -m mangonel.executor.main",
        description="Run a mangonel executor (the same as `mangonel executor`).",
    )
    options.option(options.Takes.CLIENT, "log_level").add_to(parser, options.Takes.CLIENT)
    # This entry point logs what each task did (info), as it always has; `mangonel
    # executor` takes the global --log-level (warning unless told).
    parser.set_defaults(log_level="info")
    options.add_arguments(parser, options.Takes.EXECUTOR)
    return parser


def parse_args(argv: list[str] | None = None) -> ExecutorConfig:
    """An ``ExecutorConfig`` from command-line flags (``python -m mangonel.executor.main -h``)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return ExecutorConfig.from_args(args)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: parse flags, then ``run_executor``."""
    run_executor(parse_args(argv))


if __name__ == "__main__":
    main()
