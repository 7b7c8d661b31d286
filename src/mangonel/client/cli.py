"""The ``mangonel`` command line.

::

    mangonel standalone                  # scheduler + 2 executors, until Ctrl-C
    mangonel register lineitem /data/lineitem.parquet
    mangonel sql "SELECT count(*) FROM lineitem"
    mangonel demo                        # TPC-H q12 on a fresh local cluster
    mangonel certs init /etc/mangonel/tls --host db1.example.com   # a secured cluster's files

Every client command talks to the scheduler given by ``--scheduler`` (default
``$MANGONEL_SCHEDULER`` or ``127.0.0.1:50050``), over TLS trusting the cluster
CA of ``--tls-ca`` or ``--tls-dir`` (default ``$MANGONEL_TLS_CA``,
``$MANGONEL_TLS_DIR``; ``DIR/client`` of ``mangonel certs init DIR`` holds all a
client needs) when given, as the user given by ``--user`` (password from
``$MANGONEL_PASSWORD`` or a prompt) or with the token given by ``--token``
(default ``$MANGONEL_TOKEN``) when the scheduler has users.
A scheduler that refuses connections (not started yet, restarting, its standby
taking over) is waited for up to ``--connect-wait`` seconds (default
``$MANGONEL_CONNECT_WAIT`` or 30), saying so once on stderr.
Errors are printed in one line and exit with code 1, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

from mangonel import options
from mangonel.client import cli_commands, cli_servers
from mangonel.errors import MangonelError
from mangonel.options import Takes
from mangonel.security import users_cli

log = logging.getLogger("mangonel.cli")

UsageError = cli_commands.UsageError

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "scheduler": cli_servers.cmd_scheduler,
    "executor": cli_servers.cmd_executor,
    "standalone": cli_servers.cmd_standalone,
    "sql": cli_commands.cmd_sql,
    "explain": cli_commands.cmd_explain,
    "register": cli_commands.cmd_register,
    "tables": cli_commands.cmd_tables,
    "status": cli_commands.cmd_status,
    "jobs": cli_commands.cmd_jobs,
    "cancel": cli_commands.cmd_cancel,
    "demo": cli_commands.cmd_demo,
    "certs": cli_commands.cmd_certs,
    "users": users_cli.run,
}

_SERVERS = ("scheduler", "standalone", "executor")
"""The commands that start processes: they take no client TLS or connect wait."""


def build_parser() -> argparse.ArgumentParser:
    """``mangonel``'s parser: the global options (``options.Takes.CLIENT``), then
    one subcommand each of ``COMMANDS``."""
    parser = argparse.ArgumentParser(
        prog="mangonel",
        description="mangonel: a distributed SQL query engine whose queries survive lost "
        "executors. Start a cluster with `mangonel standalone`, register Parquet tables, "
        "and query them with `mangonel sql`.",
    )
    options.add_arguments(parser, Takes.CLIENT)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    cli_servers.add_parsers(sub)
    cli_commands.add_parsers(sub)
    users_cli.add_parser(sub)
    _repeat_global_options(sub)
    return parser


def _repeat_global_options(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Accept some global options after the command too (``mangonel sql --scheduler
    ...``): given there, they win; not given, the global value stays."""
    client = {o.dest: o for o in options.options_of(Takes.CLIENT)}
    for name, command in sub.choices.items():
        if name not in (*_SERVERS, "demo", "certs", "users"):
            client["tls_dir"].add_to(command, Takes.CLIENT, suppress_default=True)
            client["connect_wait"].add_to(command, Takes.CLIENT, suppress_default=True)
        if name not in ("scheduler", "standalone", "demo", "users"):
            client["scheduler"].add_to(command, Takes.CLIENT, suppress_default=True)


def _die_with_parent() -> None:
    """Get SIGTERM when the process that started this one dies, if it asked for it.

    ``LocalCluster`` puts its pid in ``MANGONEL_DIE_WITH_PARENT`` (see
    ``client.cluster.DIE_WITH_PARENT_ENV``); Linux only. The variable is taken
    out of the environment, so processes this one starts do not inherit it.
    """
    parent = os.environ.pop("MANGONEL_DIE_WITH_PARENT", "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):
        # The parent died before the request was in place: act on it now.
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mangonel`` command; return its exit code."""
    _die_with_parent()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
    )
    try:
        return COMMANDS[args.command](args)
    except MangonelError as exc:
        print(cli_commands.one_line(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `mangonel sql ... | head`: the reader left; not an error worth a traceback.
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
