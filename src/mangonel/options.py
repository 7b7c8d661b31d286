"""Every command-line option of the mangonel processes, declared once.

``OPTIONS`` is the one table: each ``Option`` has a flag, the config field it
fills (``dest``), a type, a default, a help text and the processes that take
it (``Takes``). From it are built:

* the parsers of ``mangonel scheduler``, ``mangonel executor`` (also
  ``python -m mangonel.executor.main``) and ``mangonel standalone``, and the
  client's global options (``add_arguments``);
* the keyword arguments of ``SchedulerConfig`` and ``ExecutorConfig``
  (``values``: an option's ``dest`` is its config field), and the planner's and
  the state machine's settings inside ``SchedulerConfig.core_config`` (``Group``);
* the command lines ``LocalCluster`` starts its processes with (``to_argv``).

The security options (``security.options.add_arguments``) and the object
storage options (``storage.add_arguments``) are declared once in their own
modules, beside the dataclasses they fill; ``add_arguments`` adds them too.

Test-only hooks (``Option.test_only``: a fault-rules file, crash points) are
taken only when ``$MANGONEL_TEST_HOOKS`` is ``1`` (``TEST_HOOKS_ENV``), and never
shown by ``--help``: a production command line refuses them.

The module is long because the table is: some sixty declarations of five to ten
lines each; the code that reads it is under two hundred lines. Splitting the
table by process would put an option that two processes take in two places.

Plain code over ``defaults``, ``storage`` and ``security.options``: ``mangonel
--help`` reads this without loading the planner, the scheduler or the executor.
"""

from __future__ import annotations

import argparse
import enum
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mangonel import defaults, storage
from mangonel.security import options as security

TEST_HOOKS_ENV = "MANGONEL_TEST_HOOKS"
"""Set to ``1`` (the test suite and the test clusters do) for the processes to
take the test-only options; unset, a command line that gives one is an error."""


class Takes(enum.Flag):
    """The processes (commands) that take an option."""

    SCHEDULER = enum.auto()
    """``mangonel scheduler``."""
    EXECUTOR = enum.auto()
    """``mangonel executor`` and ``python -m mangonel.executor.main``."""
    STANDALONE = enum.auto()
    """``mangonel standalone`` (a scheduler and executors: ``LocalCluster``)."""
    CLIENT = enum.auto()
    """``mangonel``'s global options, before (and for most, after) any command."""


class Group(enum.Enum):
    """Which settings object inside the scheduler's config an option fills."""

    SERVER = "server"
    """``SchedulerConfig`` itself (or ``ExecutorConfig``; or no config at all)."""
    PLANNER = "planner"
    """``plan.planner.PlannerConfig``: the fields of the same names."""
    LIMITS = "limits"
    """``scheduler.events.Limits``: the state machine's timeouts, retries and policies."""
    CORE = "core"
    """``scheduler.core.CoreConfig``: the shell around the state machine."""


def seconds(text: str) -> float:
    """A number of seconds, 0 or more (an ``argparse`` type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def mib(size: int) -> str:
    """``64 MiB`` for 64 * 1024 * 1024: byte defaults read better in help than ``%(default)s``."""
    return f"{size / (1024 * 1024):g} MiB"


@dataclass(frozen=True)
class Option:
    """One command-line option: what it is called, fills, defaults to and means.

    Attributes:
        flag: The option, e.g. ``--heartbeat-timeout``.
        dest: The config field it fills (``SchedulerConfig``, ``ExecutorConfig``)
            and its name in the parsed arguments.
        help: Shown by ``--help`` (``%(default)s`` and ``%(default)g`` work).
        takes: The processes that take it.
        type: Turns the text into the value; ``None``: the text itself.
        default: The value when not given.
        defaults_for: Another default for some processes (``mangonel
            standalone``'s shorter heartbeat timeout).
        metavar: The value's name in ``--help``.
        aliases: Other spellings that are still accepted.
        choices: The values allowed.
        switch: A ``--flag/--no-flag`` pair for a boolean.
        flag_only: ``--flag`` alone sets ``True`` (``store_true``).
        repeat: May be given several times; the value is the list.
        env: An environment variable whose value is the default when set.
        test_only: A hook for tests: taken only with ``$MANGONEL_TEST_HOOKS=1``,
            never shown by ``--help``.
        resolved: ``None`` means "decided from other options" (the web UI's port
            follows ``--port 0``), so the config's own default differs.
        group: Which settings object of the scheduler it fills.
        hidden: Not shown by ``--help`` (but taken): kept for old command lines.
        keep_earlier: Given after the command, it overrides the global option of
            the same name; not given, that one's value stays.
    """

    flag: str
    dest: str
    help: str
    takes: Takes
    type: Callable[[str], Any] | None = None
    default: Any = None
    defaults_for: tuple[tuple[Takes, Any], ...] = ()
    metavar: str | None = None
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    switch: bool = False
    flag_only: bool = False
    repeat: bool = False
    env: str | None = None
    test_only: bool = False
    resolved: bool = False
    group: Group = Group.SERVER
    hidden: bool = False
    keep_earlier: bool = False

    def default_for(self, process: Takes) -> Any:
        """The default of this option in ``process``'s parser (before ``env``)."""
        for takes, value in self.defaults_for:
            if process in takes:
                return value
        return self.default

    def add_to(
        self, parser: argparse.ArgumentParser, process: Takes, suppress_default: bool = False
    ) -> None:
        """Add this option to ``parser`` (``process``'s). With ``suppress_default``
        it leaves the value of an earlier parser alone unless given (a global
        option given again after the command)."""
        default = self.default_for(process)
        text = self.help
        if suppress_default:  # no default of its own to show: the earlier parser's applies
            text = re.sub(r"\s*\(default:? .*\)$", "", text)
        if self.env is not None and os.environ.get(self.env) is not None:
            default = os.environ[self.env]
        kwargs: dict[str, Any] = {
            "dest": self.dest,
            "default": argparse.SUPPRESS if suppress_default else default,
            "help": argparse.SUPPRESS if self.test_only or self.hidden else text,
        }
        if self.switch:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif self.flag_only:
            kwargs["action"] = "store_true"
        else:
            if self.repeat:
                kwargs["action"] = "append"
                if not suppress_default:
                    kwargs["default"] = []
            if self.type is not None:
                kwargs["type"] = self.type
            if self.metavar is not None:
                kwargs["metavar"] = self.metavar
            if self.choices is not None:
                kwargs["choices"] = list(self.choices)
        parser.add_argument(self.flag, *self.aliases, **kwargs)


def test_hooks_enabled() -> bool:
    """Whether this process takes the test-only options (``TEST_HOOKS_ENV``)."""
    return os.environ.get(TEST_HOOKS_ENV) == "1"


_S, _E, _A, _C = Takes.SCHEDULER, Takes.EXECUTOR, Takes.STANDALONE, Takes.CLIENT

CONNECT_WAIT_HELP = (
    "how long to wait for a scheduler that refuses connections, does not answer them, or "
    "whose name does not resolve (not started yet, restarting, its standby taking over, "
    "frozen) before giving up, "
    "saying so once on stderr; 0: fail at once. A query submitted meanwhile runs once"
)

OPTIONS: tuple[Option, ...] = (
    # ------------------------------------------------------------------ client
    Option(
        "--scheduler",
        "scheduler",
        "scheduler to talk to, or for an executor to register with (default: "
        "$MANGONEL_SCHEDULER or %(default)s)",
        _C | _E,
        default=defaults.SCHEDULER_ADDRESS,
        metavar="HOST:PORT",
        env="MANGONEL_SCHEDULER",
    ),
    Option(
        "--connect-wait",
        "connect_wait",
        CONNECT_WAIT_HELP + f" (default: $MANGONEL_CONNECT_WAIT or {defaults.CONNECT_WAIT_S:g})",
        _C,
        type=seconds,
        default=defaults.CONNECT_WAIT_S,
        metavar="SECONDS",
        env="MANGONEL_CONNECT_WAIT",
    ),
    Option(
        "--user",
        "user",
        "log in as this user on a scheduler with users (default: $MANGONEL_USER); the "
        "password comes from $MANGONEL_PASSWORD, else a prompt",
        _C,
        metavar="NAME",
        env="MANGONEL_USER",
    ),
    Option(
        "--token",
        "token",
        "a bearer token instead of --user (default: $MANGONEL_TOKEN; "
        "`mangonel users token` makes one)",
        _C,
        metavar="TOKEN",
        env="MANGONEL_TOKEN",
    ),
    Option(
        "--log-level",
        "log_level",
        "log level of this process (default: %(default)s)",
        _C,
        default="warning",
        choices=("debug", "info", "warning", "error"),
        env="MANGONEL_LOG_LEVEL",
    ),
    Option(
        "--tls-dir",
        "tls_dir",
        "a secured cluster's client files, DIR/client of `mangonel certs init DIR` "
        "(the CA's certificate): talk TLS (default: $MANGONEL_TLS_DIR; none: plaintext)",
        _C,
        metavar="DIR",
        env="MANGONEL_TLS_DIR",
    ),
    Option(
        "--tls-ca",
        "tls_ca",
        "a secured cluster's CA certificate (ca.pem): talk TLS, trusting only it "
        "(default: $MANGONEL_TLS_CA; overrides --tls-dir)",
        _C,
        metavar="FILE",
        env="MANGONEL_TLS_CA",
    ),
    # --------------------------------------------------------- scheduler: where
    Option(
        "--host",
        "host",
        "interface to listen on (default %(default)s)",
        _S,
        default=defaults.LISTEN_HOST,
        metavar="HOST",
    ),
    Option(
        "--port",
        "port",
        "the scheduler's port: clients connect to it (and executors, without TLS); 0 picks "
        "one (default %(default)s)",
        _S | _A,
        type=int,
        default=defaults.SCHEDULER_PORT,
        metavar="PORT",
    ),
    Option(
        "--cluster-port",
        "cluster_port",
        "with TLS, the port executors register at, over mutual TLS (the cluster's "
        f"node certificate); 0 picks a free one (default {defaults.CLUSTER_PORT}, or a "
        "free one with --port 0)",
        _S,
        type=int,
        metavar="PORT",
        resolved=True,
    ),
    Option(
        "--address-file",
        "address_file",
        "write the bound HOST:PORT to this file",
        _S,
        metavar="FILE",
    ),
    # ----------------------------------------------------------------- planner
    Option(
        "--partitions",
        "partitions",
        "the most output partitions of a hash exchange (default %(default)s)",
        _S | _A,
        type=int,
        default=defaults.PARTITIONS,
        group=Group.PLANNER,
        metavar="N",
    ),
    Option(
        "--partition-bytes",
        "partition_bytes",
        "give an exchange one partition per this many estimated bytes, up to "
        f"--partitions (default {mib(defaults.PARTITION_BYTES)}); 0: every exchange gets "
        "--partitions",
        _S | _A,
        type=int,
        default=defaults.PARTITION_BYTES,
        group=Group.PLANNER,
        metavar="B",
    ),
    Option(
        "--broadcast-bytes",
        "broadcast_bytes",
        "never broadcast a join side estimated above this many bytes; below it "
        "a side is broadcast when that moves fewer bytes than hashing both sides "
        f"(default {mib(defaults.BROADCAST_BYTES)})",
        _S | _A,
        type=int,
        default=defaults.BROADCAST_BYTES,
        group=Group.PLANNER,
        metavar="B",
    ),
    Option(
        "--split-rows",
        "split_rows",
        "rows read by one scan task, about (default: sized by --split-bytes)",
        _S | _A,
        type=int,
        group=Group.PLANNER,
        metavar="N",
    ),
    Option(
        "--split-bytes",
        "split_bytes",
        "bytes of the scanned columns (in memory) one scan task reads, about: "
        f"{defaults.MIN_SPLIT_ROWS} to {defaults.MAX_SPLIT_ROWS} rows "
        f"(default {mib(defaults.SPLIT_BYTES)})",
        _S | _A,
        type=int,
        default=defaults.SPLIT_BYTES,
        group=Group.PLANNER,
        metavar="B",
    ),
    Option(
        "--inline-scan-bytes",
        "inline_scan_bytes",
        "scan a small table a join broadcasts in every task of the other side "
        "instead of in a stage of its own, when its columns' bytes times those tasks "
        f"are at most this many (default {mib(defaults.INLINE_SCAN_BYTES)}); 0: never",
        _S | _A,
        type=int,
        default=defaults.INLINE_SCAN_BYTES,
        group=Group.PLANNER,
        metavar="B",
    ),
    Option(
        "--fuse-bytes",
        "fuse_bytes",
        "plan a stage of one task inside its one reader's task while the two "
        "together scan at most this many bytes of tables (tables within "
        "--inline-scan-bytes not counted); past it the stage runs apart, on another "
        f"executor at the same time (default {mib(defaults.FUSE_BYTES)}); 0: no bound",
        _S | _A,
        type=int,
        default=defaults.FUSE_BYTES,
        group=Group.PLANNER,
        metavar="B",
    ),
    Option(
        "--spread-bytes",
        "spread_bytes",
        "where the executors' hosts run several tasks at full speed at once "
        "(hosts of their own cores), spread a scan over them while each task reads at "
        f"least this many bytes of its columns (default {mib(defaults.SPREAD_BYTES)})",
        _S | _A,
        type=int,
        default=defaults.SPREAD_BYTES,
        group=Group.PLANNER,
        metavar="B",
    ),
    Option(
        "--recompute-bytes",
        "recompute_bytes",
        "a stage of one task that reads only tables is computed again by each "
        "task that reads it (a subquery read by several, a side broadcast into a scan's "
        "tasks) while the copies beyond the first scan at most this many bytes of "
        f"tables (default {mib(defaults.RECOMPUTE_BYTES)}); 0: never",
        _S | _A,
        type=int,
        default=defaults.RECOMPUTE_BYTES,
        group=Group.PLANNER,
        metavar="B",
    ),
    Option(
        "--adaptive",
        "adaptive",
        "once a hash exchange's map tasks are done, run its reader stage as fewer "
        "tasks when the partitions' real sizes are small, each task reading a range of "
        f"them of about {mib(defaults.ADAPTIVE_PARTITION_BYTES)} (at least "
        f"{mib(defaults.ADAPTIVE_MIN_PARTITION_BYTES)}, and never fewer tasks than slots "
        "above that) (default: %(default)s)",
        _S | _A,
        default=defaults.ADAPTIVE,
        switch=True,
        group=Group.LIMITS,
    ),
    Option(
        "--adaptive-partition-bytes",
        "adaptive_partition_bytes",
        "bytes of input a coalesced reader task reads, about "
        f"(default {mib(defaults.ADAPTIVE_PARTITION_BYTES)})",
        _S | _A,
        type=int,
        default=defaults.ADAPTIVE_PARTITION_BYTES,
        metavar="B",
        group=Group.LIMITS,
    ),
    Option(
        "--adaptive-min-partition-bytes",
        "adaptive_min_partition_bytes",
        "coalesced reader tasks read at least this much even where that leaves slots "
        f"idle (default {mib(defaults.ADAPTIVE_MIN_PARTITION_BYTES)})",
        _S | _A,
        type=int,
        default=defaults.ADAPTIVE_MIN_PARTITION_BYTES,
        metavar="B",
        group=Group.LIMITS,
    ),
    Option(
        "--plan-cache",
        "plan_cache",
        "plans of recent queries kept, so the same SQL sent again is not planned "
        "again until a table is registered or dropped (default %(default)s); 0: plan every "
        "query",
        _S | _A,
        type=int,
        default=defaults.PLAN_CACHE,
        group=Group.CORE,
        metavar="N",
    ),
    # ---------------------------------------------------------------- recovery
    Option(
        "--heartbeat-timeout",
        "heartbeat_timeout_s",
        "seconds of silence before an executor is lost; it is suspected, and gets no "
        "new task, after about a fifth of that (default %(default)g)",
        _S | _A,
        type=float,
        default=defaults.HEARTBEAT_TIMEOUT_S,
        defaults_for=((_A, defaults.LOCAL_HEARTBEAT_TIMEOUT_S),),
        metavar="S",
        group=Group.LIMITS,
    ),
    Option(
        "--isolation-grace",
        "isolation_grace_s",
        "seconds more that losses for silence wait while most executors are silent at "
        "once, the scheduler's own link being the likely cut (default %(default)g)",
        _S,
        type=float,
        default=defaults.ISOLATION_GRACE_S,
        metavar="S",
        group=Group.LIMITS,
    ),
    Option(
        "--no-executor-grace",
        "no_executor_grace_s",
        "seconds a job may wait with no executor alive before it fails (default %(default)g)",
        _S,
        type=float,
        default=defaults.NO_EXECUTOR_GRACE_S,
        metavar="S",
        aliases=("--grace",),
        group=Group.LIMITS,
    ),
    Option(
        "--max-task-attempts",
        "max_task_attempts",
        "failed attempts of one task before its job fails (default %(default)s)",
        _S,
        type=int,
        default=defaults.MAX_TASK_ATTEMPTS,
        metavar="N",
        group=Group.LIMITS,
    ),
    Option(
        "--max-task-recomputes",
        "max_task_recomputes",
        "times one task's finished output may be lost (with its executor, or a "
        "bad file) and made again before its job fails; per task, so routine losses in "
        "a big cluster never add up to a failure (default %(default)s)",
        _S,
        type=int,
        default=defaults.MAX_TASK_RECOMPUTES,
        metavar="N",
        group=Group.LIMITS,
    ),
    Option(
        "--result-ttl",
        "result_ttl_s",
        "seconds an unread result is kept (default %(default)g)",
        _S,
        type=float,
        default=defaults.RESULT_TTL_S,
        metavar="S",
        group=Group.LIMITS,
    ),
    # ------------------------------------------- stragglers, failing executors
    Option(
        "--speculation",
        "speculation",
        "run a copy of a straggling task on another executor; the first to finish "
        "wins (default: %(default)s)",
        _S,
        default=defaults.SPECULATION,
        switch=True,
        group=Group.LIMITS,
    ),
    Option(
        "--speculation-quantile",
        "speculation_quantile",
        "fraction of a stage's tasks done before its stragglers are copied (default %(default)g)",
        _S,
        type=float,
        default=defaults.SPECULATION_QUANTILE,
        metavar="Q",
        group=Group.LIMITS,
    ),
    Option(
        "--speculation-multiplier",
        "speculation_multiplier",
        "a straggler has run M times the median of its stage's done tasks (default %(default)g)",
        _S,
        type=float,
        default=defaults.SPECULATION_MULTIPLIER,
        metavar="M",
        group=Group.LIMITS,
    ),
    Option(
        "--speculation-min",
        "speculation_min_s",
        "and at least S seconds: shorter tasks are never copied (default %(default)g)",
        _S,
        type=float,
        default=defaults.SPECULATION_MIN_S,
        metavar="S",
        group=Group.LIMITS,
    ),
    Option(
        "--slow-link-ratio",
        "slow_link_ratio",
        "with --speculation, a job stops reading an executor whose outputs its readers "
        "get at under 1/R of the others' rate, when making them again elsewhere is "
        "sooner; 0: never (default %(default)g)",
        _S,
        type=float,
        default=defaults.SLOW_LINK_RATIO,
        metavar="R",
        group=Group.LIMITS,
    ),
    Option(
        "--slow-link-backoff",
        "slow_link_backoff_s",
        "seconds an executor found behind a slow link gets no new task of any job; "
        "then it is tried again, and each mark in a row doubles this, up to "
        f"{defaults.SLOW_LINK_BACKOFF_CAP} times (default %(default)g)",
        _S,
        type=float,
        default=defaults.SLOW_LINK_BACKOFF_S,
        metavar="S",
        group=Group.LIMITS,
    ),
    Option(
        "--exclusion-failures",
        "exclusion_failures",
        "distinct tasks failing on one executor (execution errors) within the window "
        "that exclude it from new tasks; 0: never (default %(default)s)",
        _S,
        type=int,
        default=defaults.EXCLUSION_FAILURES,
        metavar="N",
        group=Group.LIMITS,
    ),
    Option(
        "--exclusion-window",
        "exclusion_window_s",
        "seconds over which an executor's failed tasks are counted (default %(default)g)",
        _S,
        type=float,
        default=defaults.EXCLUSION_WINDOW_S,
        metavar="S",
        group=Group.LIMITS,
    ),
    Option(
        "--exclusion-time",
        "exclusion_s",
        "seconds an excluded executor gets no new task (default %(default)g)",
        _S,
        type=float,
        default=defaults.EXCLUSION_S,
        metavar="S",
        group=Group.LIMITS,
    ),
    Option(
        "--max-job-share",
        "max_job_share",
        "the most of the slots one job may hold, 0 < F <= 1: below 1 a job alone "
        "leaves slots idle for jobs that arrive later (default %(default)g: no cap)",
        _S,
        type=float,
        default=defaults.MAX_JOB_SHARE,
        metavar="F",
        group=Group.LIMITS,
    ),
    # ----------------------------------------------------------------- state
    Option(
        "--state",
        "state",
        "where the scheduler keeps its state, so that it survives a crash or restart: "
        "sqlite:///PATH.db (default: $MANGONEL_STATE or "
        "sqlite://~/.local/state/mangonel/scheduler.db), etcd://HOST:PORT[,HOST:PORT][/PREFIX] "
        "(two schedulers on one etcd make a highly available pair: the second waits as the "
        "standby and takes over when the leader dies), or memory:// (nothing is kept)",
        _S,
        metavar="URL",
        env="MANGONEL_STATE",
    ),
    Option(
        "--state-wait",
        "state_wait_s",
        "how long a scheduler starting waits for a state store that does not answer "
        "(etcd refusing connections or timing out, or its name not resolving yet) before "
        "giving up, saying so once on stderr; 0: fail at once (default %(default)g)",
        _S,
        type=seconds,
        default=defaults.STATE_WAIT_S,
        metavar="SECONDS",
    ),
    Option(
        "--standby-timeout",
        "standby_timeout_s",
        "give up after S seconds when another scheduler leads the state store "
        "(default: wait for ever with etcd, 0 with SQLite)",
        _S,
        type=float,
        metavar="S",
        resolved=True,
    ),
    Option(
        "--crash-file",
        "crash_file",
        "crash-point rules that make the scheduler kill itself (mangonel.testing.crash)",
        _S,
        test_only=True,
        metavar="FILE",
    ),
    # ---------------------------------------------------------------- writes
    Option(
        "--warehouse",
        "warehouse",
        "where CREATE TABLE AS writes its tables, one directory each (default: a "
        "'warehouse' directory beside a SQLite --state, else ~/.local/state/mangonel/warehouse)",
        _S | _A,
        metavar="DIR|s3://BUCKET/PREFIX",
    ),
    Option(
        "--write-root",
        "write_roots",
        "COPY ... TO may write under this location (repeatable); without one, COPY is "
        "refused. Symbolic links and '..' are resolved before the check",
        _S | _A,
        metavar="DIR|s3://BUCKET/PREFIX",
        repeat=True,
    ),
    # ------------------------------------------------------- web, Flight SQL
    Option(
        "--web-port",
        "web_port",
        "port of the web UI, REST API (/api) and Prometheus metrics (/metrics); "
        f"0 picks a free one, -1 turns it off (default {defaults.WEB_PORT}, or a free one "
        "with --port 0)",
        _S | _A,
        type=int,
        metavar="PORT",
        resolved=True,
    ),
    Option(
        "--web-address-file",
        "web_address_file",
        "write the web UI's URL to this file",
        _S,
        metavar="FILE",
    ),
    Option(
        "--flight-sql-port",
        "flight_sql_port",
        "port of the Arrow Flight SQL endpoint (ADBC, JDBC and other Flight SQL "
        f"clients); 0 picks a free one, -1 turns it off (default {defaults.FLIGHT_SQL_PORT}, "
        "or a free one with --port 0)",
        _S | _A,
        type=int,
        metavar="PORT",
        resolved=True,
    ),
    Option(
        "--flight-sql-results",
        "flight_sql_results",
        "where Flight SQL clients read results: from the executors holding them, in "
        "parallel, with the scheduler as the fallback (executors, the default), or all "
        "through the scheduler (when clients cannot reach the executors)",
        _S | _A,
        default="executors",
        choices=("executors", "scheduler"),
    ),
    Option(
        "--flight-sql-address-file",
        "flight_sql_address_file",
        "write the Flight SQL endpoint's URL to this file",
        _S,
        metavar="FILE",
    ),
    # ---------------------------------------------------------------- executor
    Option(
        "--slots",
        "slots",
        "task slots of each executor: tasks run at once (default: the host's cores; under "
        "standalone, shared out among its executors)",
        _E | _A,
        type=int,
        metavar="N",
    ),
    Option(
        "--work-dir",
        "work_dir",
        "the work root: shuffle and spill files live here, and with standalone the logs "
        "(default: a directory under the system's temporary directory)",
        _E | _A,
        metavar="DIR",
    ),
    Option(
        "--memory",
        "memory",
        "the executor's memory budget, e.g. 2GB or 512MiB: the whole process fits in it, "
        "and each slot's DuckDB gets an equal share of 60%% of it (less 160 MiB for the "
        "process), spilling sorts, joins and aggregates past that (default: 80%% of the "
        "host's memory or of the executor's cgroup limit, whichever is lower)",
        _E,
        metavar="SIZE",
    ),
    Option(
        "--spill",
        "spill",
        "disk the slots' DuckDBs may spill to, all together, in the work dir "
        "(default: half its free space at start)",
        _E,
        metavar="SIZE",
    ),
    Option(
        "--memory-limit",
        "memory_limit",
        "deprecated: DuckDB memory limit of each slot (use --memory, the whole "
        "executor's budget); when given, it overrides --memory's share",
        _E,
        metavar="SIZE",
    ),
    Option(
        "--threads",
        "threads",
        "DuckDB threads of each slot (default: --cores over --slots, at least one)",
        _E,
        type=int,
        metavar="N",
    ),
    Option(
        "--cores",
        "cores",
        "cores of its host the tasks may use (default: the host's CPU count; executors "
        "that share a --host-id share them); the scheduler plans scans for the tasks a host "
        "runs at full speed at once, from this and --threads",
        _E,
        type=int,
        metavar="N",
    ),
    Option(
        "--huge-pages",
        "huge_pages",
        "let the kernel back the executor's memory with transparent huge pages, as its "
        "THP mode says (default: off for the executor: each fault of a huge page clears "
        "2 MiB, and DuckDB's big aggregates ran slower and less evenly with them)",
        _E,
        flag_only=True,
        default=False,
    ),
    Option(
        "--host",
        "bind_host",
        "interface the executor's Flight server listens on (default %(default)s)",
        _E,
        default=defaults.LISTEN_HOST,
        metavar="HOST",
    ),
    Option(
        "--port",
        "flight_port",
        "the executor's Flight server port; 0 picks one (default %(default)s)",
        _E,
        type=int,
        metavar="PORT",
        default=0,
    ),
    Option(
        "--advertise-host",
        "advertise_host",
        "address other executors and clients reach the Flight server at "
        "(default: --host; required when --host is 0.0.0.0 or ::)",
        _E,
        metavar="HOST",
    ),
    Option(
        "--host-id",
        "host_id",
        "the host this executor reports: executors reporting the same one read each "
        "other's shuffle files from disk, others fetch them over Flight (default: this "
        "machine's hostname)",
        _E,
        metavar="NAME",
    ),
    Option(
        "--drain-timeout",
        "drain_timeout_s",
        "on SIGTERM, finish tasks and serve outputs for at most S seconds (default %(default)g)",
        _E,
        type=float,
        default=defaults.DRAIN_TIMEOUT_S,
        metavar="S",
    ),
    Option(
        "--fetch-timeout",
        "fetch_timeout_s",
        "give up a Flight fetch of a shuffle partition that received nothing for S seconds "
        "(a slow one that keeps receiving goes on) (default %(default)g)",
        _E,
        type=float,
        default=defaults.FETCH_TIMEOUT_S,
        metavar="S",
    ),
    Option(
        "--link-probe-interval",
        "link_probe_interval_s",
        f"every S seconds, time a {defaults.LINK_PROBE_BYTES // 1024} KiB synthetic Flight "
        "fetch from a few peers, one at a time, so the scheduler knows a slow link before "
        "a job reads over it; 0: no probes (default %(default)g)",
        _E,
        type=float,
        default=defaults.LINK_PROBE_INTERVAL_S,
        metavar="S",
    ),
    Option(
        "--cleanup-interval",
        "cleanup_interval_s",
        "sweep the work dir for dead executors' files every S seconds (default %(default)g)",
        _E,
        type=float,
        default=defaults.CLEANUP_INTERVAL_S,
        metavar="S",
    ),
    Option(
        "--index",
        "index",
        "number in a local cluster (names it in logs)",
        _E,
        type=int,
        metavar="N",
    ),
    Option(
        "--faults-file",
        "faults_file",
        "JSON fault-injection rules (mangonel.testing.faults)",
        _E,
        test_only=True,
        metavar="FILE",
    ),
    # -------------------------------------------------------------- standalone
    Option(
        "--executors",
        "executors",
        "executor processes (default %(default)s)",
        _A,
        type=int,
        default=defaults.LOCAL_EXECUTORS,
        metavar="N",
    ),
    Option(
        "--register",
        "register",
        "register a Parquet table once started (repeatable)",
        _A,
        metavar="NAME=PATH",
        repeat=True,
    ),
    Option("--tpch", "tpch", "register the 8 TPC-H tables of DIR", _A, metavar="DIR"),
    Option(
        "--tls-dir",
        "tls_dir",
        "with --secure: where the cluster's files are (made if missing)",
        _A,
        metavar="DIR",
        keep_earlier=True,
    ),
    Option(
        "--secure",
        "secure",
        "secure every channel: make a CA, certificates and a cluster secret in "
        "--tls-dir (default: WORK_DIR/tls; kept if it holds them) and start every process "
        "with them; clients then need `--tls-dir DIR/client` and a token",
        _A,
        default=False,
        flag_only=True,
    ),
)
"""Every option of every mangonel process, each declared once."""


def options_of(process: Takes) -> list[Option]:
    """The options ``process`` takes (test-only ones too), in table order."""
    return [o for o in OPTIONS if process in o.takes]


def option(process: Takes, dest: str) -> Option:
    """The option of ``process`` that fills ``dest``.

    Raises:
        KeyError: ``process`` takes no option for ``dest``.
    """
    for o in OPTIONS:
        if process in o.takes and o.dest == dest:
            return o
    raise KeyError(f"no option of {process.name} fills {dest!r}")


def add_arguments(
    parser: argparse.ArgumentParser,
    process: Takes,
    skip: Iterable[str] = (),
    suppress_defaults: bool = False,
) -> None:
    """Add ``process``'s options to ``parser``: the table's, except those whose
    ``dest`` is in ``skip`` (a parser that has them already) and the test-only
    ones unless ``$MANGONEL_TEST_HOOKS=1``; then, for a server process, the object
    storage options and (but for standalone, which makes its own) the security ones."""
    skipped = set(skip)
    hooks = test_hooks_enabled()
    for o in options_of(process):
        if o.dest in skipped or (o.test_only and not hooks):
            continue
        o.add_to(parser, process, suppress_default=suppress_defaults or o.keep_earlier)
    if process & (Takes.SCHEDULER | Takes.EXECUTOR | Takes.STANDALONE):
        storage.add_arguments(parser)
    if process & (Takes.SCHEDULER | Takes.EXECUTOR):
        security.add_arguments(parser, users=process is Takes.SCHEDULER)


def values(args: argparse.Namespace, process: Takes, group: Group | None = None) -> dict[str, Any]:
    """``process``'s options (of ``group``, if given) as parsed into ``args``:
    ``{dest: value}``, leaving out those not parsed (test-only ones without the
    hooks) and those left at ``None`` (the config's own default applies).
    Repeated options come as tuples."""
    found: dict[str, Any] = {}
    for o in options_of(process):
        if group is not None and o.group is not group:
            continue
        value = getattr(args, o.dest, None)
        if value is None:
            continue
        found[o.dest] = tuple(value) if o.repeat else value
    return found


def to_argv(process: Takes, settings: Mapping[str, Any]) -> list[str]:
    """The command-line options that give ``process`` these settings (``{dest: value}``,
    as ``values`` returns them); ``None`` values are left out.

    >>> to_argv(Takes.SCHEDULER, {"heartbeat_timeout_s": 5.0, "adaptive": False})
    ['--heartbeat-timeout', '5.0', '--no-adaptive']

    Raises:
        KeyError: ``process`` takes no option for one of them.
    """
    argv: list[str] = []
    for dest, value in settings.items():
        o = option(process, dest)
        if value is None:
            continue
        if o.switch:
            argv.append(o.flag if value else "--no-" + o.flag[2:])
        elif o.flag_only:
            if value:
                argv.append(o.flag)
        elif o.repeat:
            for item in value:
                argv += [o.flag, str(item)]
        else:
            argv += [o.flag, str(value)]
    return argv
