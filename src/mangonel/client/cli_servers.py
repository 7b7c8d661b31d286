"""The server commands of ``mangonel``: ``scheduler``, ``executor`` and ``standalone``.

Their options are the table of ``mangonel.options`` (each declared once, with the
processes that take it); this module adds them to the commands' parsers and turns
the parsed arguments into a ``SchedulerConfig``, an ``ExecutorConfig`` or a
``LocalCluster``. The scheduler, the executor and the cluster are imported only by
the command that starts them: the client commands do not pay for loading them.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from mangonel import defaults, options, storage
from mangonel.client.cli_commands import UsageError
from mangonel.errors import MangonelError
from mangonel.options import Takes
from mangonel.security import options as security
from mangonel.security.login_limits import LoginLimits

TPCH_TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")


# ---------------------------------------------------------------------- parsers


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``scheduler``, ``executor`` and ``standalone`` parsers, their options
    from ``mangonel.options``. ``--scheduler`` of the executor is the global one
    (``client.cli`` adds it after the command too)."""
    p = sub.add_parser(
        "scheduler",
        help="run a scheduler",
        description="Run a scheduler in the foreground until SIGTERM or Ctrl-C. SIGHUP "
        "makes it read the users file and its TLS certificate and key again (new "
        "connections get the new certificate; a pair that does not fit is refused and "
        "the one in use stays).",
    )
    options.add_arguments(p, Takes.SCHEDULER)
    p = sub.add_parser(
        "executor",
        help="run an executor",
        description="Run an executor "
        "that registers with the scheduler (--scheduler) and runs its tasks.",
    )
    options.add_arguments(p, Takes.EXECUTOR, skip=("scheduler",))
    p = sub.add_parser(
        "standalone",
        help="run a scheduler and executors in one command",
        description="Run a scheduler and N executor processes on this host until Ctrl-C.",
    )
    options.add_arguments(p, Takes.STANDALONE)


# ------------------------------------------------------- options decided together


def _web_port(args: argparse.Namespace) -> int | None:
    """The web port to ask for; ``None`` for none. With ``--port 0`` (no fixed
    port, as tests ask) the web UI takes a free port too, instead of the default."""
    return _port_after(args.web_port, args.port, defaults.WEB_PORT)


def _flight_sql_port(args: argparse.Namespace) -> int | None:
    """The Flight SQL port to ask for, as ``_web_port`` decides the web UI's."""
    return _port_after(args.flight_sql_port, args.port, defaults.FLIGHT_SQL_PORT)


def _cluster_port(args: argparse.Namespace) -> int:
    """The cluster port to ask for, as ``_web_port`` decides the web UI's (never off)."""
    if args.cluster_port is None:
        return 0 if args.port == 0 else defaults.CLUSTER_PORT
    return int(args.cluster_port)


def _port_after(given: int | None, port: int, default: int) -> int | None:
    """``given``; when not given, a free one with ``--port 0``, else ``default``; -1: none."""
    if given is None:
        return 0 if port == 0 else default
    return None if given < 0 else int(given)


def _standby_timeout(state: str | None, given: float | None) -> float | None:
    """Wait for the lead for ever on etcd (a standby); on a SQLite file, not at all."""
    if given is not None:
        return given
    return None if state and state.startswith("etcd://") else 0.0


def _login_limits(args: argparse.Namespace) -> LoginLimits:
    try:
        return security.login_limits_from_args(args)
    except ValueError as exc:
        raise UsageError(
            f"{exc} (--login-failures, --login-address-failures, --login-lockout)"
        ) from None


# ---------------------------------------------------------------------- commands


def cmd_scheduler(args: argparse.Namespace) -> int:
    from mangonel.scheduler.main import SchedulerConfig, run_scheduler

    given: dict[str, Any] = options.values(args, Takes.SCHEDULER)
    given.update(
        cluster_port=_cluster_port(args),
        web_port=_web_port(args),
        flight_sql_port=_flight_sql_port(args),
        standby_timeout_s=_standby_timeout(args.state, args.standby_timeout_s),
    )
    config = SchedulerConfig(
        **given,
        storage=storage.options_from_args(args),
        security=security.options_from_args(args, "node"),
        login_limits=_login_limits(args),
    )
    try:
        config.core_config()  # checks the limits (``Limits.__post_init__``)
    except ValueError as exc:  # a setting out of range: one line, no traceback
        raise UsageError(str(exc)) from None
    return run_scheduler(config)


def cmd_executor(args: argparse.Namespace) -> int:
    # Imported here: the executor is its own package, and the client commands
    # should not pay for importing it.
    from mangonel.executor.config import ExecutorConfig
    from mangonel.executor.main import run_executor

    try:
        config = ExecutorConfig.from_args(args)
    except ValueError as exc:  # a setting out of range: one line, no traceback
        raise UsageError(str(exc)) from None
    run_executor(config)
    return 0


def scheduler_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What ``mangonel standalone`` passes on to its scheduler: the options it takes
    that the scheduler takes too (``LocalCluster(scheduler_options=...)``), but for
    the ports, which ``LocalCluster`` has arguments of its own for."""
    own = {"port", "web_port", "flight_sql_port", "flight_sql_results"}
    return {
        o.dest: getattr(args, o.dest)
        for o in options.options_of(Takes.STANDALONE)
        if Takes.SCHEDULER in o.takes and o.dest not in own and getattr(args, o.dest) is not None
    }


def cmd_standalone(args: argparse.Namespace) -> int:
    from mangonel.client.cluster import LocalCluster

    tables = _parse_registrations(args.register, args.tpch)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C too, even where the process was started with SIGINT ignored (a
    # background job of a shell without job control inherits that, and Python
    # then never raises KeyboardInterrupt).
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = LocalCluster(
        executors=args.executors,
        work_dir=args.work_dir,
        slots=args.slots,
        scheduler_port=args.port,
        log_level=args.log_level,
        scheduler_options=scheduler_settings(args),
        web_port=_web_port(args),
        flight_sql_port=_flight_sql_port(args),
        flight_sql_results=args.flight_sql_results,
        storage=storage.options_from_args(args),
        secure=args.secure,
        tls_dir=args.tls_dir if args.secure else None,
    )
    with cluster:
        with cluster.connect() as session:
            for name, path in tables:
                info = session.register_parquet(name, path)
                print(f"registered {name}: {info.rows} rows in {len(info.files)} files")
        print(
            f"mangonel scheduler listening on {cluster.address} with {args.executors} "
            f"executors (logs in {cluster.log_dir}); Ctrl-C to stop",
            flush=True,
        )
        if args.secure:
            print(
                f"secured: clients connect with --tls-dir {cluster.client_tls_dir} and a "
                f"token: export MANGONEL_TOKEN=$(mangonel users token admin --admin "
                f"--cluster-secret-file {cluster.cluster_secret_file})",
                flush=True,
            )
        if cluster.web_port is not None:
            print(f"mangonel web UI at {cluster.web_url}", flush=True)
        if cluster.flight_sql_port is not None:
            print(f"mangonel Flight SQL at {cluster.flight_sql_url}", flush=True)
        try:
            while not stop.wait(0.5):
                if cluster.scheduler is not None and not cluster.scheduler.alive():
                    raise MangonelError(f"the scheduler exited; see {cluster.scheduler.log_path}")
        except KeyboardInterrupt:
            pass
        print("stopping", file=sys.stderr)
    return 0


def _parse_registrations(items: Sequence[str], tpch: str | None) -> list[tuple[str, str]]:
    tables = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--register takes NAME=PATH, got {item!r}")
        tables.append((name, path))
    if tpch:
        tables += [(t, _tpch_path(tpch, t)) for t in TPCH_TABLES]
    return tables


def _tpch_path(directory: str, table: str) -> str:
    single = os.path.join(directory, f"{table}.parquet")
    return single if os.path.exists(single) else os.path.join(directory, table)
