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
import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mangonel import defaults, storage, textfiles
from mangonel.client import render
from mangonel.client.progress import ProgressBar
from mangonel.client.session import DEFAULT_ADDRESS, Result, Session
from mangonel.client.shell import read_statements, strip_statement
from mangonel.client.status import ExecutorState, ExecutorStatus, JobStatus
from mangonel.errors import MangonelError
from mangonel.security import options as security
from mangonel.security import users_cli
from mangonel.security.login_limits import LoginLimits
from mangonel.task import FileFormat

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("mangonel.cli")

TPCH_TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")


class UsageError(MangonelError):
    """The command line is wrong."""


# ----------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mangonel",
        description="mangonel: a distributed SQL query engine whose queries survive lost "
        "executors. Start a cluster with `mangonel standalone`, register Parquet tables, "
        "and query them with `mangonel sql`.",
    )
    parser.add_argument(
        "--scheduler",
        default=os.environ.get("MANGONEL_SCHEDULER", DEFAULT_ADDRESS),
        metavar="HOST:PORT",
        help="scheduler to talk to (default: $MANGONEL_SCHEDULER or %(default)s)",
    )
    parser.add_argument(
        "--connect-wait",
        type=_seconds,
        default=os.environ.get("MANGONEL_CONNECT_WAIT", f"{defaults.CONNECT_WAIT_S:g}"),
        metavar="SECONDS",
        help=_CONNECT_WAIT_HELP
        + f" (default: $MANGONEL_CONNECT_WAIT or {defaults.CONNECT_WAIT_S:g})",
    )
    parser.add_argument(
        "--user",
        default=os.environ.get("MANGONEL_USER"),
        metavar="NAME",
        help="log in as this user on a scheduler with users (default: $MANGONEL_USER); the "
        "password comes from $MANGONEL_PASSWORD, else a prompt",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("MANGONEL_TOKEN"),
        metavar="TOKEN",
        help="a bearer token instead of --user (default: $MANGONEL_TOKEN; "
        "`mangonel users token` makes one)",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("MANGONEL_LOG_LEVEL", "warning"),
        choices=["debug", "info", "warning", "error"],
        help="log level of this process (default: %(default)s)",
    )
    parser.add_argument(
        "--tls-dir",
        default=os.environ.get("MANGONEL_TLS_DIR"),
        metavar="DIR",
        help="a secured cluster's client files, DIR/client of `mangonel certs init DIR` "
        "(the CA's certificate): talk TLS (default: $MANGONEL_TLS_DIR; none: plaintext)",
    )
    parser.add_argument(
        "--tls-ca",
        default=os.environ.get("MANGONEL_TLS_CA"),
        metavar="FILE",
        help="a secured cluster's CA certificate (ca.pem): talk TLS, trusting only it "
        "(default: $MANGONEL_TLS_CA; overrides --tls-dir)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "scheduler",
        help="run a scheduler",
        description="Run a scheduler in the foreground until SIGTERM or Ctrl-C. SIGHUP "
        "makes it read the users file and its TLS certificate and key again (new "
        "connections get the new certificate; a pair that does not fit is refused and "
        "the one in use stays).",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    p.add_argument(
        "--port",
        type=int,
        default=defaults.SCHEDULER_PORT,
        help="port clients connect to (and executors, without TLS); 0 picks one",
    )
    p.add_argument(
        "--cluster-port",
        type=int,
        default=None,
        metavar="PORT",
        help="with TLS, the port executors register at, over mutual TLS (the cluster's "
        f"node certificate); 0 picks a free one (default {defaults.CLUSTER_PORT}, or a "
        "free one with --port 0)",
    )
    _planner_options(p)
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=defaults.HEARTBEAT_TIMEOUT_S,
        metavar="S",
        help="seconds of silence before an executor is lost; it is suspected, and gets no "
        "new task, after about a fifth of that (default %(default)g)",
    )
    p.add_argument(
        "--isolation-grace",
        type=float,
        default=defaults.ISOLATION_GRACE_S,
        metavar="S",
        help="seconds more that losses for silence wait while most executors are silent at "
        "once, the scheduler's own link being the likely cut (default %(default)g)",
    )
    p.add_argument(
        "--no-executor-grace",
        "--grace",
        dest="grace",
        type=float,
        default=defaults.NO_EXECUTOR_GRACE_S,
        metavar="S",
        help="seconds a job may wait with no executor alive before it fails (default %(default)g)",
    )
    p.add_argument(
        "--max-task-attempts",
        type=int,
        default=defaults.MAX_TASK_ATTEMPTS,
        metavar="N",
        help="failed attempts of one task before its job fails (default %(default)s)",
    )
    p.add_argument(
        "--max-task-recomputes",
        type=int,
        default=defaults.MAX_TASK_RECOMPUTES,
        metavar="N",
        help="times one task's finished output may be lost (with its executor, or a "
        "bad file) and made again before its job fails; per task, so routine losses in "
        "a big cluster never add up to a failure (default %(default)s)",
    )
    p.add_argument(
        "--result-ttl",
        type=float,
        default=defaults.RESULT_TTL_S,
        metavar="S",
        help="seconds an unread result is kept (default %(default)g)",
    )
    _gray_failure_options(p)
    p.add_argument("--address-file", help="write the bound HOST:PORT to this file")
    p.add_argument(
        "--state",
        metavar="URL",
        default=os.environ.get("MANGONEL_STATE"),
        help="where the scheduler keeps its state, so that it survives a crash or restart: "
        "sqlite:///PATH.db (default: $MANGONEL_STATE or "
        "sqlite://~/.local/state/mangonel/scheduler.db), etcd://HOST:PORT[,HOST:PORT][/PREFIX] "
        "(two schedulers on one etcd make a highly available pair: the second waits as the "
        "standby and takes over when the leader dies), or memory:// (nothing is kept)",
    )
    p.add_argument("--crash-file", help=argparse.SUPPRESS)  # crash tests (testing.crash)
    _write_options(p)
    p.add_argument(
        "--standby-timeout",
        type=float,
        default=None,
        metavar="S",
        help="give up after S seconds when another scheduler leads the state store "
        "(default: wait for ever with etcd, 0 with SQLite)",
    )
    _web_options(p)
    p.add_argument("--web-address-file", help="write the web UI's URL to this file")
    _flight_sql_options(p)
    p.add_argument(
        "--flight-sql-address-file", help="write the Flight SQL endpoint's URL to this file"
    )
    storage.add_arguments(p)
    security.add_arguments(p, users=True)

    p = sub.add_parser(
        "executor",
        help="run an executor",
        description="Run an executor "
        "that registers with the scheduler (--scheduler) and runs its tasks.",
    )
    p.add_argument("--slots", type=int, help="tasks run at once (default: CPU cores)")
    p.add_argument("--work-dir", help="shuffle files live here (default: a temp dir)")
    p.add_argument(
        "--memory",
        metavar="SIZE",
        help="the executor's memory budget, e.g. 2GB or 512MiB: the whole process fits in it, "
        "and each slot's DuckDB gets an equal share of 60%% of it (less 160 MiB for the "
        "process), spilling sorts, joins and aggregates past that (default: 80%% of the "
        "host's memory or of the executor's cgroup limit, whichever is lower)",
    )
    p.add_argument(
        "--spill",
        metavar="SIZE",
        help="disk the slots' DuckDBs may spill to, all together, in the work dir "
        "(default: half its free space at start)",
    )
    p.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="deprecated: DuckDB memory limit of each slot (use --memory, the whole "
        "executor's budget); when given, it overrides --memory's share",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="DuckDB threads of each slot (default: --cores over --slots, at least one)",
    )
    p.add_argument(
        "--cores",
        type=int,
        help="cores of its host the tasks may use (default: the host's CPU count; executors "
        "that share a --host-id share them); the scheduler plans scans for the tasks a host "
        "runs at full speed at once, from this and --threads",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface of the Flight server")
    p.add_argument("--port", type=int, default=0, help="Flight server port; 0 picks one")
    p.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="address other executors and clients reach the Flight server at "
        "(default: --host; required when --host is 0.0.0.0 or ::)",
    )
    p.add_argument(
        "--host-id",
        metavar="NAME",
        help="the host this executor reports: executors reporting the same one read each "
        "other's shuffle files from disk, others fetch them over Flight (default: this "
        "machine's hostname)",
    )
    # The same flags as executor.main's (not imported: client commands should
    # not pay for importing the executor).
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=defaults.DRAIN_TIMEOUT_S,
        metavar="S",
        help="on SIGTERM, finish tasks and serve outputs for at most S seconds "
        "(default %(default)g)",
    )
    p.add_argument(
        "--fetch-timeout",
        type=float,
        default=defaults.FETCH_TIMEOUT_S,
        metavar="S",
        help="give up a Flight fetch of a shuffle partition that received nothing for S seconds "
        "(a slow one that keeps receiving goes on) (default %(default)g)",
    )
    p.add_argument(
        "--cleanup-interval",
        type=float,
        default=defaults.CLEANUP_INTERVAL_S,
        metavar="S",
        help="sweep the work dir for dead executors' files every S seconds (default %(default)g)",
    )
    p.add_argument("--faults-file", help="JSON fault-injection rules (tests only)")
    p.add_argument("--index", type=int, help="number in a local cluster (names it in logs)")
    storage.add_arguments(p)
    security.add_arguments(p)

    p = sub.add_parser(
        "standalone",
        help="run a scheduler and executors in one command",
        description="Run a scheduler and N executor processes on this host until Ctrl-C.",
    )
    p.add_argument(
        "--executors",
        type=int,
        default=defaults.LOCAL_EXECUTORS,
        help="executor processes (default %(default)s)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=defaults.SCHEDULER_PORT,
        help="scheduler port (default %(default)s)",
    )
    p.add_argument(
        "--slots",
        type=int,
        help="task slots of each executor (default: the host's cores shared out among them)",
    )
    p.add_argument("--work-dir", help="work directory of the executors and the logs")
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=defaults.LOCAL_HEARTBEAT_TIMEOUT_S,
        metavar="S",
        help="seconds of silence before an executor is lost (default %(default)g)",
    )
    _planner_options(p)
    p.add_argument(
        "--register",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="register a Parquet table once started (repeatable)",
    )
    p.add_argument("--tpch", metavar="DIR", help="register the 8 TPC-H tables of DIR")
    _write_options(p)
    _web_options(p)
    _flight_sql_options(p)
    storage.add_arguments(p)
    p.add_argument(
        "--secure",
        action="store_true",
        help="secure every channel: make a CA, certificates and a cluster secret in "
        "--tls-dir (default: WORK_DIR/tls; kept if it holds them) and start every process "
        "with them; clients then need `--tls-dir DIR/client` and a token",
    )
    p.add_argument(
        "--tls-dir",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="with --secure: where the cluster's files are (made if missing)",
    )

    p = sub.add_parser(
        "sql",
        help="run a query",
        description="Run one query and print "
        "its result. Without QUERY or -f, read stdin, or open an interactive "
        "shell on a terminal (end statements with ';', quit with \\q).",
    )
    p.add_argument("query", nargs="?", help="the SQL text")
    p.add_argument("-f", "--file", help="read the query from this file")
    p.add_argument("--dialect", help="sqlglot dialect of the query (default: duckdb)")
    p.add_argument("--max-rows", type=int, default=render.MAX_ROWS, help="rows to print")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="give up (and cancel the query) after this long, waits for a cut network "
        "included; default: wait as long as the query runs, and for a scheduler that "
        "stops answering, 60 s",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--stages",
        action="store_true",
        help="after the result, print what each stage ran (EXPLAIN ANALYZE-style): tasks "
        "done (and the planned count where adaptive execution ran fewer), rows and bytes "
        "out, time; and where its tasks' time went: launch, setup, fetch, execute, write, "
        "report back (summed over the tasks), the slowest task against the median, bytes "
        "fetched over the network",
    )

    p = sub.add_parser(
        "explain",
        help="show a query's distributed plan",
        description="Print the stages, exchanges and SQL fragments of a query.",
    )
    p.add_argument("query", nargs="?", help="the SQL text")
    p.add_argument("-f", "--file", help="read the query from this file")
    p.add_argument("--dialect", help="sqlglot dialect of the query (default: duckdb)")
    p.add_argument(
        "--picture",
        metavar="FILE",
        help="also draw the stage graph into FILE (.svg; .png needs Graphviz's dot)",
    )
    p.add_argument(
        "--web",
        metavar="URL",
        default=os.environ.get("MANGONEL_WEB"),
        help="the scheduler's web API, for --picture (default: $MANGONEL_WEB or "
        f"http://<scheduler host>:{defaults.WEB_PORT})",
    )

    p = sub.add_parser(
        "register",
        help="register a Parquet, CSV or JSON table",
        description="Register a file, directory, glob or s3:// location of Parquet, CSV or\n"
        "newline-delimited JSON files as a table. A CSV or JSON table's columns are\n"
        "declared with --column, or inferred once from the start of its first file."
        "\n\noptions of a CSV or JSON table (--option KEY=VALUE):\n"
        + "\n".join(f"  {k}: {v}" for k, v in textfiles.OPTIONS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", help="table name")
    p.add_argument("path", help="file, directory, glob or s3:// location (read by the cluster)")
    p.add_argument(
        "--format",
        choices=[f.value for f in FileFormat],
        default=FileFormat.PARQUET.value,
        help="how the files are written (default %(default)s)",
    )
    p.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of a CSV or JSON table, e.g. delimiter='|' or header=false (repeatable)",
    )
    p.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="NAME:TYPE",
        help="a declared column and its DuckDB type, in file order (repeatable), "
        "e.g. --column l_orderkey:BIGINT",
    )

    sub.add_parser("tables", help="list the tables", description="List the registered tables.")
    sub.add_parser(
        "status",
        help="show executors and jobs",
        description="Show the executors (alive, draining, lost: since when and why) and the jobs.",
    )
    p = sub.add_parser(
        "jobs",
        help="list the jobs",
        description="List the jobs: state, progress, time, rows, re-runs and the query.",
    )
    p = sub.add_parser("cancel", help="cancel a job", description="Cancel a running job.")
    p.add_argument("job", help="job id (see `mangonel status`)")

    p = sub.add_parser(
        "demo",
        help="run TPC-H q12 on a fresh local cluster",
        description="Generate TPC-H SF 0.1 (cached), start a local cluster of "
        f"{defaults.LOCAL_EXECUTORS} executors, run TPC-H q12 and show how it ran.",
    )
    p.add_argument(
        "--kill",
        action="store_true",
        help="SIGKILL one executor half-way through q12 and show how the query recovers",
    )
    p.add_argument(
        "--cache-dir",
        default=os.path.expanduser("~/.cache/mangonel/tpch-sf0.1"),
        help="where the TPC-H data is generated (default: %(default)s)",
    )
    p.add_argument("--executors", type=int, default=defaults.LOCAL_EXECUTORS)
    p.add_argument(
        "--secure",
        action="store_true",
        help="run it on a secured cluster: TLS on every channel, signed tickets",
    )

    p = sub.add_parser(
        "certs",
        help="make a secured cluster's CA, certificates and secret",
        description="Make the files that secure a cluster (`certs init DIR`): a new CA, "
        "the certificate of the scheduler(s) and executors and a cluster secret in "
        "DIR/cluster (copy it to the cluster's machines: --tls-dir DIR/cluster), and the "
        "CA's certificate in DIR/client (all a client needs: --tls-dir DIR/client). Keep "
        "DIR/ca-key.pem off every machine once done.",
    )
    certs_sub = p.add_subparsers(dest="certs_command", metavar="ACTION", required=True)
    c = certs_sub.add_parser(
        "init",
        help="make a new CA, the node certificate and a cluster secret in DIR",
        description="Make ca.pem and ca-key.pem in DIR; ca.pem, node.pem, node-key.pem and "
        "cluster-secret in DIR/cluster (the scheduler's and executors'); ca.pem in "
        "DIR/client (the clients'). Keys and secret have mode 0600.",
    )
    c.add_argument("dir", metavar="DIR", help="directory to write (created if missing)")
    c.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name or IP address the scheduler or an executor is reached at "
        "(repeatable); localhost, 127.0.0.1 and ::1 are always included. A peer refuses "
        "a certificate that does not name the host it dialled",
    )
    c.add_argument(
        "--days", type=float, default=365, help="validity of the certificates (default 365)"
    )
    c.add_argument("--force", action="store_true", help="overwrite a CA already in DIR")
    users_cli.add_parser(sub)
    for name, command in sub.choices.items():
        if name not in ("scheduler", "standalone", "demo", "executor", "certs", "users"):
            command.add_argument(
                "--tls-dir",
                default=argparse.SUPPRESS,
                metavar="DIR",
                help="a secured cluster's client files (DIR/client of `mangonel certs "
                "init DIR`): talk TLS",
            )
        if name not in ("scheduler", "standalone", "demo", "users"):
            # Also accepted after the command (`mangonel executor --scheduler ...`).
            command.add_argument(
                "--scheduler",
                default=argparse.SUPPRESS,
                metavar="HOST:PORT",
                help="scheduler to talk to",
            )
        if name not in ("scheduler", "standalone", "demo", "executor", "certs", "users"):
            command.add_argument(
                "--connect-wait",
                type=_seconds,
                default=argparse.SUPPRESS,
                metavar="SECONDS",
                help=_CONNECT_WAIT_HELP,
            )
    return parser


_CONNECT_WAIT_HELP = (
    "how long to wait for a scheduler that refuses connections or whose name does not "
    "resolve (not started yet, restarting, its standby taking over) before giving up, "
    "saying so once on stderr; 0: fail at once. A query submitted meanwhile runs once"
)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _web_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--web-port",
        type=int,
        default=None,
        metavar="PORT",
        help="port of the web UI, REST API (/api) and Prometheus metrics (/metrics); "
        f"0 picks a free one, -1 turns it off (default {defaults.WEB_PORT}, or a free one "
        "with --port 0)",
    )


def _flight_sql_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--flight-sql-port",
        type=int,
        default=None,
        metavar="PORT",
        help="port of the Arrow Flight SQL endpoint (ADBC, JDBC and other Flight SQL "
        f"clients); 0 picks a free one, -1 turns it off (default {defaults.FLIGHT_SQL_PORT}, "
        "or a free one with --port 0)",
    )
    p.add_argument(
        "--flight-sql-results",
        choices=["executors", "scheduler"],
        default="executors",
        help="where Flight SQL clients read results: from the executors holding them, in "
        "parallel, with the scheduler as the fallback (executors, the default), or all "
        "through the scheduler (when clients cannot reach the executors)",
    )


def _flight_sql_port(args: argparse.Namespace) -> int | None:
    """The Flight SQL port to ask for, as ``_web_port`` decides the web UI's."""
    if args.flight_sql_port is None:
        return 0 if args.port == 0 else defaults.FLIGHT_SQL_PORT
    return None if args.flight_sql_port < 0 else int(args.flight_sql_port)


def _cluster_port(args: argparse.Namespace) -> int:
    """The cluster port to ask for, as ``_web_port`` decides the web UI's."""
    if args.cluster_port is None:
        return 0 if args.port == 0 else defaults.CLUSTER_PORT
    return int(args.cluster_port)


def _web_port(args: argparse.Namespace) -> int | None:
    """The web port to ask for; ``None`` for none. With ``--port 0`` (no fixed
    port, as tests ask) the web UI takes a free port too, instead of the default."""
    if args.web_port is None:
        return 0 if args.port == 0 else defaults.WEB_PORT
    return None if args.web_port < 0 else int(args.web_port)


def _planner_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--partitions",
        type=int,
        default=defaults.PARTITIONS,
        help="the most output partitions of a hash exchange (default %(default)s)",
    )
    p.add_argument(
        "--partition-bytes",
        type=int,
        default=defaults.PARTITION_BYTES,
        help="give an exchange one partition per this many estimated bytes, up to "
        f"--partitions (default {_mib(defaults.PARTITION_BYTES)}); 0: every exchange gets "
        "--partitions",
    )
    p.add_argument(
        "--broadcast-bytes",
        type=int,
        default=defaults.BROADCAST_BYTES,
        help="never broadcast a join side estimated above this many bytes; below it "
        "a side is broadcast when that moves fewer bytes than hashing both sides "
        f"(default {_mib(defaults.BROADCAST_BYTES)})",
    )
    p.add_argument(
        "--split-rows",
        type=int,
        default=None,
        help="rows read by one scan task, about (default: sized by --split-bytes)",
    )
    p.add_argument(
        "--split-bytes",
        type=int,
        default=defaults.SPLIT_BYTES,
        help="bytes of the scanned columns (in memory) one scan task reads, about: "
        f"{defaults.MIN_SPLIT_ROWS} to {defaults.MAX_SPLIT_ROWS} rows "
        f"(default {_mib(defaults.SPLIT_BYTES)})",
    )
    p.add_argument(
        "--inline-scan-bytes",
        type=int,
        default=defaults.INLINE_SCAN_BYTES,
        help="scan a small table a join broadcasts in every task of the other side "
        "instead of in a stage of its own, when its columns' bytes times those tasks "
        f"are at most this many (default {_mib(defaults.INLINE_SCAN_BYTES)}); 0: never",
    )
    p.add_argument(
        "--fuse-bytes",
        type=int,
        default=defaults.FUSE_BYTES,
        help="plan a stage of one task inside its one reader's task while the two "
        "together scan at most this many bytes of tables (tables within "
        "--inline-scan-bytes not counted); past it the stage runs apart, on another "
        f"executor at the same time (default {_mib(defaults.FUSE_BYTES)}); 0: no bound",
    )
    p.add_argument(
        "--spread-bytes",
        type=int,
        default=defaults.SPREAD_BYTES,
        help="where the executors' hosts run several tasks at full speed at once "
        "(hosts of their own cores), spread a scan over them while each task reads at "
        f"least this many bytes of its columns (default {_mib(defaults.SPREAD_BYTES)})",
    )
    p.add_argument(
        "--recompute-bytes",
        type=int,
        default=defaults.RECOMPUTE_BYTES,
        help="a stage of one task that reads only tables is computed again by each "
        "task that reads it (a subquery read by several, a side broadcast into a scan's "
        "tasks) while the copies beyond the first scan at most this many bytes of "
        f"tables (default {_mib(defaults.RECOMPUTE_BYTES)}); 0: never",
    )
    p.add_argument(
        "--adaptive",
        action=argparse.BooleanOptionalAction,
        default=defaults.ADAPTIVE,
        help="once a hash exchange's map tasks are done, run its reader stage as fewer "
        "tasks when the partitions' real sizes are small, each task reading a range of "
        f"them of about {_mib(defaults.ADAPTIVE_PARTITION_BYTES)} (at least "
        f"{_mib(defaults.ADAPTIVE_MIN_PARTITION_BYTES)}, and never fewer tasks than slots "
        "above that) (default: %(default)s)",
    )
    p.add_argument(
        "--adaptive-partition-bytes",
        type=int,
        default=defaults.ADAPTIVE_PARTITION_BYTES,
        metavar="B",
        help="bytes of input a coalesced reader task reads, about "
        f"(default {_mib(defaults.ADAPTIVE_PARTITION_BYTES)})",
    )
    p.add_argument(
        "--adaptive-min-partition-bytes",
        type=int,
        default=defaults.ADAPTIVE_MIN_PARTITION_BYTES,
        metavar="B",
        help="coalesced reader tasks read at least this much even where that leaves slots "
        f"idle (default {_mib(defaults.ADAPTIVE_MIN_PARTITION_BYTES)})",
    )
    p.add_argument(
        "--plan-cache",
        type=int,
        default=defaults.PLAN_CACHE,
        help="plans of recent queries kept, so the same SQL sent again is not planned "
        "again until a table is registered or dropped (default %(default)s); 0: plan every "
        "query",
    )


def _mib(size: int) -> str:
    """``64 MiB`` for 64 * 1024 * 1024: byte defaults read better in help than ``%(default)s``."""
    return f"{size / (1024 * 1024):g} MiB"


# ---------------------------------------------------------------------- commands


def _gray_failure_options(p: argparse.ArgumentParser) -> None:
    """Stragglers (speculative execution) and executors that keep failing (exclusion)."""
    p.add_argument(
        "--speculation",
        action=argparse.BooleanOptionalAction,
        default=defaults.SPECULATION,
        help="run a copy of a straggling task on another executor; the first to finish "
        "wins (default: %(default)s)",
    )
    p.add_argument(
        "--speculation-quantile",
        type=float,
        default=defaults.SPECULATION_QUANTILE,
        metavar="Q",
        help="fraction of a stage's tasks done before its stragglers are copied "
        "(default %(default)g)",
    )
    p.add_argument(
        "--speculation-multiplier",
        type=float,
        default=defaults.SPECULATION_MULTIPLIER,
        metavar="M",
        help="a straggler has run M times the median of its stage's done tasks "
        "(default %(default)g)",
    )
    p.add_argument(
        "--speculation-min",
        type=float,
        default=defaults.SPECULATION_MIN_S,
        metavar="S",
        help="and at least S seconds: shorter tasks are never copied (default %(default)g)",
    )
    p.add_argument(
        "--exclusion-failures",
        type=int,
        default=defaults.EXCLUSION_FAILURES,
        metavar="N",
        help="distinct tasks failing on one executor (execution errors) within the window "
        "that exclude it from new tasks; 0: never (default %(default)s)",
    )
    p.add_argument(
        "--exclusion-window",
        type=float,
        default=defaults.EXCLUSION_WINDOW_S,
        metavar="S",
        help="seconds over which an executor's failed tasks are counted (default %(default)g)",
    )
    p.add_argument(
        "--exclusion-time",
        type=float,
        default=defaults.EXCLUSION_S,
        metavar="S",
        help="seconds an excluded executor gets no new task (default %(default)g)",
    )
    p.add_argument(
        "--max-job-share",
        type=float,
        default=defaults.MAX_JOB_SHARE,
        metavar="F",
        help="the most of the slots one job may hold, 0 < F <= 1: below 1 a job alone "
        "leaves slots idle for jobs that arrive later (default %(default)g: no cap)",
    )


def _write_options(p: argparse.ArgumentParser) -> None:
    """Where the write statements may write (the scheduler's, and standalone's)."""
    p.add_argument(
        "--warehouse",
        metavar="DIR|s3://BUCKET/PREFIX",
        default=None,
        help="where CREATE TABLE AS writes its tables, one directory each (default: a "
        "'warehouse' directory beside a SQLite --state, else ~/.local/state/mangonel/warehouse)",
    )
    p.add_argument(
        "--write-root",
        dest="write_roots",
        action="append",
        default=[],
        metavar="DIR|s3://BUCKET/PREFIX",
        help="COPY ... TO may write under this location (repeatable); without one, COPY is "
        "refused. Symbolic links and '..' are resolved before the check",
    )


def _write_args(args: argparse.Namespace) -> tuple[str, ...]:
    """``_write_options`` as a scheduler's arguments."""
    roots = tuple(x for root in args.write_roots for x in ("--write-root", root))
    return roots + (("--warehouse", args.warehouse) if args.warehouse else ())


def cmd_scheduler(args: argparse.Namespace) -> int:
    from mangonel.scheduler.main import SchedulerConfig, run_scheduler

    config = SchedulerConfig(
        host=args.host,
        port=args.port,
        cluster_port=_cluster_port(args),
        partitions=args.partitions,
        partition_bytes=args.partition_bytes,
        broadcast_bytes=args.broadcast_bytes,
        split_rows=args.split_rows,
        split_bytes=args.split_bytes,
        inline_scan_bytes=args.inline_scan_bytes,
        fuse_bytes=args.fuse_bytes,
        spread_bytes=args.spread_bytes,
        recompute_bytes=args.recompute_bytes,
        plan_cache=args.plan_cache,
        heartbeat_timeout_s=args.heartbeat_timeout,
        no_executor_grace_s=args.grace,
        isolation_grace_s=args.isolation_grace,
        max_task_attempts=args.max_task_attempts,
        max_task_recomputes=args.max_task_recomputes,
        result_ttl_s=args.result_ttl,
        adaptive=args.adaptive,
        adaptive_partition_bytes=args.adaptive_partition_bytes,
        adaptive_min_partition_bytes=args.adaptive_min_partition_bytes,
        speculation=args.speculation,
        speculation_quantile=args.speculation_quantile,
        speculation_multiplier=args.speculation_multiplier,
        speculation_min_s=args.speculation_min,
        exclusion_failures=args.exclusion_failures,
        exclusion_window_s=args.exclusion_window,
        exclusion_s=args.exclusion_time,
        max_job_share=args.max_job_share,
        address_file=args.address_file,
        web_port=_web_port(args),
        web_address_file=args.web_address_file,
        flight_sql_port=_flight_sql_port(args),
        flight_sql_address_file=args.flight_sql_address_file,
        flight_sql_results=args.flight_sql_results,
        state=args.state,
        crash_file=args.crash_file,
        warehouse=args.warehouse,
        write_roots=tuple(args.write_roots),
        standby_timeout_s=_standby_timeout(args.state, args.standby_timeout),
        storage=storage.options_from_args(args),
        security=security.options_from_args(args, "node"),
        login_limits=_login_limits(args),
    )
    try:
        config.core_config()  # checks the limits (``Limits.__post_init__``)
    except ValueError as exc:  # a setting out of range: one line, no traceback
        raise UsageError(str(exc)) from None
    return run_scheduler(config)


def _login_limits(args: argparse.Namespace) -> LoginLimits:
    try:
        return security.login_limits_from_args(args)
    except ValueError as exc:
        raise UsageError(
            f"{exc} (--login-failures, --login-address-failures, --login-lockout)"
        ) from None


def _standby_timeout(state: str | None, given: float | None) -> float | None:
    """Wait for the lead for ever on etcd (a standby); on a SQLite file, not at all."""
    if given is not None:
        return given
    return None if state and state.startswith("etcd://") else 0.0


def cmd_executor(args: argparse.Namespace) -> int:
    # Imported here: the executor is its own package, and the client commands
    # should not pay for importing it.
    from mangonel.executor.config import ExecutorConfig
    from mangonel.executor.main import run_executor

    try:
        config = ExecutorConfig(
            scheduler_address=args.scheduler,
            bind_host=args.host,
            advertise_host=args.advertise_host,
            flight_port=args.port,
            memory=args.memory,
            memory_limit=args.memory_limit,
            spill=args.spill,
            threads=args.threads,
            cores=args.cores,
            drain_timeout_s=args.drain_timeout,
            fetch_timeout_s=args.fetch_timeout,
            cleanup_interval_s=args.cleanup_interval,
            faults_file=args.faults_file,
            index=args.index,
            storage=storage.options_from_args(args),
            security=security.options_from_args(args, "node"),
        )
        if args.slots is not None:
            config.slots = args.slots
        if args.work_dir:
            config.work_dir = args.work_dir
        if args.host_id:
            config.host = args.host_id
        config.__post_init__()
    except ValueError as exc:  # a setting out of range: one line, no traceback
        raise UsageError(str(exc)) from None
    run_executor(config)
    return 0


def cmd_standalone(args: argparse.Namespace) -> int:
    from mangonel.client.cluster import LocalCluster

    tables = _parse_registrations(args.register, args.tpch)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cluster = LocalCluster(
        executors=args.executors,
        work_dir=args.work_dir,
        slots=args.slots,
        partitions=args.partitions,
        partition_bytes=args.partition_bytes,
        broadcast_bytes=args.broadcast_bytes,
        adaptive=args.adaptive,
        heartbeat_timeout=args.heartbeat_timeout,
        scheduler_port=args.port,
        log_level=args.log_level,
        scheduler_args=("--split-bytes", str(args.split_bytes))
        + ("--inline-scan-bytes", str(args.inline_scan_bytes))
        + ("--fuse-bytes", str(args.fuse_bytes))
        + ("--spread-bytes", str(args.spread_bytes))
        + ("--recompute-bytes", str(args.recompute_bytes))
        + ("--plan-cache", str(args.plan_cache))
        + ("--adaptive-partition-bytes", str(args.adaptive_partition_bytes))
        + ("--adaptive-min-partition-bytes", str(args.adaptive_min_partition_bytes))
        + (("--split-rows", str(args.split_rows)) if args.split_rows else ())
        + _write_args(args),
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


def _query_text(args: argparse.Namespace) -> str | None:
    if args.query and args.file:
        raise UsageError("give the query as an argument or with -f, not both")
    if args.file:
        try:
            with open(args.file) as f:
                return f.read()
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    if args.query:
        return str(args.query)
    if not sys.stdin.isatty():
        return sys.stdin.read()
    return None


def _client_security(args: argparse.Namespace) -> security.SecurityOptions | None:
    """The TLS a client command speaks: the CA of ``--tls-ca``, else of ``--tls-dir``."""
    tls_ca = getattr(args, "tls_ca", None)
    if tls_ca:
        return security.SecurityOptions(tls_ca=tls_ca)
    tls_dir = getattr(args, "tls_dir", None)
    return security.SecurityOptions.from_tls_dir(tls_dir, "client") if tls_dir else None


def _session(args: argparse.Namespace) -> Session:
    """A session with ``--scheduler`` as ``--user`` (or with ``--token``), if given,
    over TLS under ``--tls-ca`` (or ``--tls-dir``'s CA), waiting ``--connect-wait`` for
    a scheduler that is not there yet (said once on stderr)."""
    given = _client_security(args)
    if args.user:
        password = os.environ.get("MANGONEL_PASSWORD")
        if password is None:
            if not sys.stdin.isatty():
                raise UsageError(
                    f"no password for user {args.user}: set $MANGONEL_PASSWORD, or run on a "
                    "terminal to be asked"
                )
            import getpass

            password = getpass.getpass(f"password for {args.user}: ")
    else:
        password = None
    return Session(
        args.scheduler,
        security=given,
        user=args.user or None,
        password=password,
        token=None if args.user else (args.token or None),
        connect_wait_s=args.connect_wait,
        on_wait=_tell_waiting,
    )


def _tell_waiting(line: str) -> None:
    # Said once, so that a wrong address is not a silent wait.
    print(f"mangonel: {line}; Ctrl-C to stop, --connect-wait to change", file=sys.stderr)


def _print_result(result: Result, max_rows: int, stages: bool = False) -> None:
    print(render.format_table(result.to_arrow(), max_rows))
    noun = "row" if result.num_rows == 1 else "rows"
    print(f"{result.num_rows} {noun} in {result.elapsed_s:.2f} s", file=sys.stderr)
    if stages and result.stages:
        print(render.format_stages(result.stages))
        if any(s.phases is not None for s in result.stages):
            print("\nwhere the tasks' time went (seconds, summed over each stage's tasks):")
            print(render.format_phases(result.stages))


def _run_query(session: Session, query: str, args: argparse.Namespace) -> Result:
    show = sys.stderr.isatty() if args.progress is None else args.progress
    if not show:
        return session.sql(query, args.dialect, timeout_s=args.timeout)
    bar = ProgressBar(sys.stderr)
    try:
        return session.sql(query, args.dialect, on_progress=bar.update, timeout_s=args.timeout)
    finally:
        bar.clear()


def cmd_sql(args: argparse.Namespace) -> int:
    text = _query_text(args)
    with _session(args) as session:
        if text is not None:
            query = strip_statement(text)
            if not query:
                raise UsageError("the query is empty")
            _print_result(_run_query(session, query, args), args.max_rows, args.stages)
            return 0
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
        print(
            f"connected to {args.scheduler}; end statements with ';', quit with \\q",
            file=sys.stderr,
        )
        for statement in read_statements():
            try:
                _print_result(_run_query(session, statement, args), args.max_rows, args.stages)
            except MangonelError as exc:
                print(_one_line(exc), file=sys.stderr)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    text = _query_text(args)
    if text is None or not strip_statement(text):
        raise UsageError('give a query: mangonel explain "SELECT ..." or -f FILE')
    query = strip_statement(text)
    if args.picture:
        _draw_plan(query, args)
        print(f"stage graph written to {args.picture}", file=sys.stderr)
    with _session(args) as session:
        print(session.explain(query, args.dialect))
    return 0


def _web_url(args: argparse.Namespace) -> str:
    if args.web:
        return str(args.web).rstrip("/")
    host = str(args.scheduler).rsplit(":", 1)[0] or "127.0.0.1"
    scheme = "https" if _client_security(args) is not None else "http"
    return f"{scheme}://{host}:{defaults.WEB_PORT}"


def _draw_plan(query: str, args: argparse.Namespace) -> None:
    """Plan the query through the scheduler's REST API and draw its stages."""
    import json
    import urllib.error
    import urllib.request

    from mangonel.web.models import ExplainModel
    from mangonel.web.picture import render as draw

    url = f"{_web_url(args)}/api/explain"
    body = json.dumps({"sql": query, "dialect": args.dialect}).encode()
    headers = {"Content-Type": "application/json"}
    token = args.token
    if args.user:  # the web API takes the token a gRPC login gives
        with _session(args) as session:
            session.log_in()
            token = session.token
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    context = None
    given = _client_security(args)
    if given is not None:  # a secured cluster's web API: HTTPS under the cluster CA
        import ssl

        context = ssl.create_default_context(cafile=given.tls_ca)
    try:
        with urllib.request.urlopen(request, timeout=60, context=context) as response:
            plan = ExplainModel.model_validate_json(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError, KeyError, TypeError):
            detail = json.loads(detail)["detail"]
        raise MangonelError(str(detail)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise MangonelError(
            f"cannot reach the scheduler's web API at {url} ({exc}); --picture needs it: "
            "give its URL with --web or $MANGONEL_WEB"
        ) from None
    draw(plan.stages, args.picture)


def cmd_certs(args: argparse.Namespace) -> int:
    from mangonel.security.certs import CertsExistError, init_cluster

    try:
        written = init_cluster(args.dir, args.host, days=args.days, force=args.force)
    except CertsExistError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write {args.dir}: {exc.strerror}") from None
    print(f"wrote {len(written)} files to {args.dir}:")
    for path in written:
        print(f"  {path}")
    names = ", ".join(["localhost", "127.0.0.1", "::1", *args.host])
    cluster, client = os.path.join(args.dir, "cluster"), os.path.join(args.dir, "client")
    print(
        f"the node certificate names {names}.\n"
        f"  scheduler(s) and executors: copy {cluster} to them, start them with "
        f"--tls-dir {cluster}\n"
        f"  clients: copy {client} (the CA's certificate alone) to them: `mangonel "
        f"--tls-dir {client} --user NAME ...`; they log in with a password or token\n"
        f"  keep {os.path.join(args.dir, 'ca-key.pem')} off every machine: it signs "
        "certificates"
    )
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    with _session(args) as session:
        info = session.register(
            args.name,
            args.path,
            args.format,
            [_pair(c, ":", "--column", "NAME:TYPE") for c in args.column],
            **dict(_pair(o, "=", "--option", "KEY=VALUE") for o in args.option),
        )
    estimated = "" if info.format == FileFormat.PARQUET.value else "about "
    print(
        f"registered {info.name}: {estimated}{info.rows} rows, {len(info.columns)} columns, "
        f"{len(info.files)} files"
    )
    return 0


def _pair(text: str, sep: str, option: str, form: str) -> tuple[str, str]:
    key, found, value = text.partition(sep)
    if not found or not key.strip():
        raise UsageError(f"{option} takes {form}, got {text!r}")
    return key.strip(), value.strip()


def cmd_tables(args: argparse.Namespace) -> int:
    import pyarrow as pa

    with _session(args) as session:
        tables = session.tables()
    if not tables:
        print("no tables; register one with `mangonel register NAME PATH`")
        return 0
    print(
        render.format_table(
            pa.table(
                {
                    "name": [t.name for t in tables],
                    "rows": [t.rows for t in tables],
                    "columns": [len(t.columns) for t in tables],
                    "files": [len(t.files) for t in tables],
                    "location": [t.location for t in tables],
                }
            ),
            max_rows=len(tables),
        )
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import pyarrow as pa

    with _session(args) as session:
        status = session.status()
    now = time.time()
    print(f"scheduler {status.scheduler_address or args.scheduler}")
    ex = status.executors
    print(
        render.format_table(
            pa.table(
                {
                    "executor": [e.id for e in ex],
                    "state": [e.state.value for e in ex],
                    "since": [f"{max(0.0, now - e.since):.0f} s ago" for e in ex],
                    "why": [_why(e) for e in ex],
                    "flight": [e.flight_address for e in ex],
                    "pid": [e.pid for e in ex],
                    "slots": [e.slots for e in ex],
                    "running": [e.running_tasks for e in ex],
                }
            ),
            max_rows=len(ex) or 1,
        )
    )
    jobs = status.jobs
    if jobs:
        print()
        print(
            render.format_table(
                pa.table(
                    {
                        "job": [j.job_id for j in jobs],
                        "state": [j.state.value for j in jobs],
                        "stages done": [
                            f"{sum(s.tasks_done >= s.tasks_total for s in j.stages)}"
                            f"/{len(j.stages)}"
                            for j in jobs
                        ],
                        "time": [f"{j.elapsed_s:.2f} s" for j in jobs],
                        "re-run": [j.tasks_rerun for j in jobs],
                        "recomputed": [j.outputs_recomputed for j in jobs],
                        "query": [" ".join(j.sql.split())[:60] for j in jobs],
                    }
                ),
                max_rows=len(jobs),
            )
        )
    return 0


def _why(e: ExecutorStatus) -> str:
    """Why an executor left (or, while it is alive, how long it has been silent
    or why it takes no task)."""
    if e.state in (ExecutorState.ALIVE, ExecutorState.DRAINING) and e.unhealthy:
        return f"unhealthy: {e.unhealthy}"
    if e.state in (ExecutorState.ALIVE, ExecutorState.DRAINING) and e.heartbeat_age_s >= 2:
        silent = f"silent for {e.heartbeat_age_s:.0f} s"
        return " - ".join(x for x in (silent, e.detail) if x)
    return " - ".join(x for x in (e.reason, e.detail) if x)


def cmd_jobs(args: argparse.Namespace) -> int:
    with _session(args) as session:
        jobs = sorted(session.status().jobs, key=lambda j: j.submitted_at, reverse=True)
    if not jobs:
        print("no jobs; run one with `mangonel sql`")
        return 0
    print(render.format_table(jobs_table(jobs), max_rows=len(jobs)))
    return 0


def jobs_table(jobs: Sequence[JobStatus]) -> pa.Table:
    """The jobs as a table: id, state, progress, time, rows, re-runs, query."""
    import pyarrow as pa

    def progress(j: JobStatus) -> str:
        total = sum(s.tasks_total for s in j.stages)
        done = sum(min(s.tasks_done, s.tasks_total) for s in j.stages)
        return f"{done}/{total} tasks"

    return pa.table(
        {
            "job": [j.job_id for j in jobs],
            "state": [j.state.value for j in jobs],
            "submitted": [time.strftime("%H:%M:%S", time.localtime(j.submitted_at)) for j in jobs],
            "time": [f"{j.elapsed_s:.2f} s" for j in jobs],
            "progress": [progress(j) for j in jobs],
            "rows": [j.stages[-1].rows if j.stages else 0 for j in jobs],
            "re-run": [j.tasks_rerun for j in jobs],
            "recomputed": [j.outputs_recomputed for j in jobs],
            "query": [" ".join(j.sql.split())[:60] for j in jobs],
        }
    )


def cmd_cancel(args: argparse.Namespace) -> int:
    with _session(args) as session:
        cancelled = session.cancel(args.job)
    print(f"job {args.job} cancelled" if cancelled else f"job {args.job} had already finished")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from mangonel.client.demo import run_demo

    return run_demo(
        args.cache_dir, args.executors, args.log_level, kill=args.kill, secure=args.secure
    )


COMMANDS = {
    "scheduler": cmd_scheduler,
    "executor": cmd_executor,
    "standalone": cmd_standalone,
    "sql": cmd_sql,
    "explain": cmd_explain,
    "register": cmd_register,
    "tables": cmd_tables,
    "status": cmd_status,
    "jobs": cmd_jobs,
    "cancel": cmd_cancel,
    "demo": cmd_demo,
    "certs": cmd_certs,
    "users": users_cli.run,
}


def _one_line(exc: BaseException) -> str:
    message = re.sub(r"\s*\n\s*", " ", str(exc)).strip() or type(exc).__name__
    return f"error: {message}"


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
        print(_one_line(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `mangonel sql ... | head`: the reader left; not an error worth a traceback.
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
