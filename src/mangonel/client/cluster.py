"""``LocalCluster``: a real scheduler and real executor processes on localhost.

Over 600 lines because it is one thing, a cluster's processes and their files:
each method starts, stops, freezes or waits on them. Its processes' command
lines come from the one options table (``mangonel.options.to_argv``).

>>> with LocalCluster(executors=2) as cluster:                      # doctest: +SKIP
...     with cluster.connect() as session:
...         session.register_parquet("t", "/data/t.parquet")
...         session.sql("SELECT count(*) FROM t").to_pandas()

Every process is started with ``python -m mangonel ...`` on free ports, writes
its stdout and stderr to a log file under ``log_dir`` (``work_dir/logs`` by
default), and is stopped on exit: executors by SIGINT (an immediate stop, no
drain), the scheduler by SIGTERM, then SIGKILL after a bound. A start that
fails stops what it started and raises ``ClusterError`` with the tail of the
failing process's log. On Linux the children also get SIGTERM when the process
that started them dies (``PR_SET_PDEATHSIG``, which each child asks for itself at
start, see ``DIE_WITH_PARENT_ENV``), so a killed test run leaves no orphans.

Layout under ``work_dir``::

    scheduler-<i>.address scheduler i's bound host:port (written once it leads)
    scheduler-<i>.web     the URL of its web UI (with ``web_port``)
    scheduler-<i>.flightsql  the URL of its Flight SQL endpoint (unless ``flight_sql_port=None``)
    scheduler-state.db    the schedulers' SQLite state store (unless ``state`` is given)
    executors/            the work root all executors share (``executor.workdir``:
                          one locked directory per executor life, swept when dead)
    users, cluster-secret the users file and the secret that signs tokens (with ``users``)
    tls/                  with ``secure``, what ``mangonel certs init`` makes: cluster/ (the
                          scheduler's and executors' files) and client/ (the CA alone,
                          all ``connect()`` hands its sessions)
    logs/                 scheduler.log (scheduler-<i>.log with several), executor-<i>.log

Processes can be taken away and added while queries run: ``kill_executor``
(SIGKILL, or SIGTERM to drain), ``freeze_executor``, ``thaw_executor``,
``add_executor``, ``kill_scheduler``, ``restart_scheduler``. Executor *i* is
numbered 0-based in start order (``add_executor`` takes the next) and gets
``--index i``, which names it in its logs; ``executor_args_for(i)`` gives it
options of its own. Fault rules (``set_faults``) are for tests only: the
``TestCluster`` of ``testing/`` adds them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from mangonel import defaults, options
from mangonel.client.session import Session
from mangonel.client.status import ExecutorState
from mangonel.errors import ClusterError, MangonelError
from mangonel.options import Takes
from mangonel.security.options import SECRET_FILE, SecurityOptions, role_dir
from mangonel.storage import StorageOptions

_LOG_TAIL_BYTES = 4000
_POLL_S = 0.02
_live_clusters: weakref.WeakSet[LocalCluster] = weakref.WeakSet()


SCHEDULER_KEYWORDS: Mapping[str, str] = {
    "heartbeat_timeout": "heartbeat_timeout_s",
    "no_executor_grace": "no_executor_grace_s",
    "max_task_attempts": "max_task_attempts",
    "max_task_recomputes": "max_task_recomputes",
    "result_ttl": "result_ttl_s",
    "speculation": "speculation",
    "speculation_min": "speculation_min_s",
    "exclusion_failures": "exclusion_failures",
    "exclusion_time": "exclusion_s",
    "partitions": "partitions",
    "partition_bytes": "partition_bytes",
    "broadcast_bytes": "broadcast_bytes",
    "adaptive": "adaptive",
}
"""``LocalCluster``'s keyword arguments that set an option of ``mangonel scheduler``,
each with the option's ``dest`` (``mangonel.options``): the option says what it
means and what it defaults to; the keyword only passes a value on."""

EXECUTOR_KEYWORDS: Mapping[str, str] = {
    "drain_timeout": "drain_timeout_s",
    "cleanup_interval": "cleanup_interval_s",
}
"""The same for the options of every ``mangonel executor``."""

_HEARTBEAT = options.option(Takes.SCHEDULER, "heartbeat_timeout_s")

DIE_WITH_PARENT_ENV = "MANGONEL_DIE_WITH_PARENT"
"""Set to this process's pid in each child's environment: ``mangonel``'s entry
point then asks Linux to SIGTERM it when this process dies (``cli.main``).

Not a ``preexec_fn``: Python code between fork and exec is unsafe in a parent
that runs gRPC threads (about one start in a hundred hung or aborted with
"epoll_wait error: Bad file descriptor" in the child), while without one
``subprocess`` forks and execs in C."""


def child_env() -> dict[str, str]:
    """The environment of a ``mangonel`` child process: this one's, unbuffered
    output (its log is read while it runs), and ``DIE_WITH_PARENT_ENV``."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env[DIE_WITH_PARENT_ENV] = str(os.getpid())
    return env


class ProcessHandle:
    """One child process and its log file."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def log_tail(self, limit: int = _LOG_TAIL_BYTES) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")

    def stop(self, timeout_s: float, sig: int | None = None) -> None:
        """``sig`` (SIGTERM by default; and SIGCONT, in case it is frozen), then
        SIGKILL after ``timeout_s``."""
        if not self.alive():
            return
        self.signal(signal.SIGTERM if sig is None else sig)
        self.signal(signal.SIGCONT)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(5)


class ExecutorHandle(ProcessHandle):
    """An executor process; ``id`` is the id the scheduler gave it once registered.

    ``id`` follows the process: after it re-registers (a thawed executor does,
    under a new id), ``LocalCluster.wait_for_executors`` updates it.
    """

    def __init__(
        self,
        index: int,
        args: list[str],
        log_path: Path,
        env: dict[str, str],
        work_dir: Path,
    ) -> None:
        super().__init__(f"executor-{index}", args, log_path, env)
        self.index = index
        self.work_dir = work_dir
        """The work root it shares with the other executors."""
        self.id: str | None = None


class LocalCluster:
    """A scheduler and ``executors`` executor processes on localhost.

    Args:
        executors: Executor processes to start.
        work_dir: Root of the executors' work directories and the logs; a new
            temporary directory (removed on a clean stop) when ``None``.
        slots: Task slots of each executor (each executor's memory budget, unless
            its options give ``--memory``, is an equal share of the host's, see
            ``executor_memory_share``). ``None``: the host's cores shared out
            among the executors (at least one each), since they all run here; an
            executor alone on its host takes one per core. On two cores, two
            executors of two slots each ran TPC-H SF1 4 % slower than two of one
            (``benchmarks/ab.py``).
        partitions: The most partitions of a hash exchange; the scheduler's
            default when ``None``. Given without ``partition_bytes``, every
            exchange has exactly this many, as tests want: their data is small
            enough for one partition, and must still cross executors.
        partition_bytes: One partition per this many estimated bytes of an
            exchange (``mangonel scheduler --partition-bytes``; 0: always
            ``partitions``); see ``partitions`` for ``None``.
        broadcast_bytes, heartbeat_timeout, no_executor_grace, max_task_attempts,
            max_task_recomputes, result_ttl, speculation, speculation_min,
            exclusion_failures, exclusion_time: The scheduler's options named in
            ``SCHEDULER_KEYWORDS`` (``--broadcast-bytes``, ``--heartbeat-timeout``...),
            whose help (``mangonel scheduler --help``) says what each means;
            ``None`` leaves the option's default, but for ``heartbeat_timeout``,
            which takes the default the table gives a cluster on one host
            (``mangonel standalone``'s).
        drain_timeout, cleanup_interval: The executors' options named in
            ``EXECUTOR_KEYWORDS`` (``--drain-timeout``, ``--cleanup-interval``);
            ``None`` leaves their defaults.
        adaptive: Run a hash exchange's reader stage as fewer tasks when its
            partitions turn out small (``mangonel scheduler --adaptive``). ``None``:
            the scheduler's default (on), except where every exchange has exactly
            ``partitions`` (``partition_bytes`` 0, as with ``partitions`` alone):
            tests that ask for that want their small data to cross executors.
        log_dir: Where the process logs go; ``work_dir/logs`` when ``None``.
        start_timeout: Seconds to wait for the scheduler and every executor.
        stop_timeout: Seconds between SIGTERM and SIGKILL when stopping.
        log_level: Log level of the child processes.
        scheduler_args: Extra command-line options of ``mangonel scheduler``.
        executor_args: Extra command-line options of each ``mangonel executor``.
        executor_args_for: Extra command-line options of executor *i* alone (after
            ``executor_args``), e.g. a file of its own; see ``executor_options``.
        scheduler_port: Port of the scheduler; 0 picks a free one.
        web_port: Port of the scheduler's web UI, REST API and metrics (``web_url``);
            0 picks a free one, ``None`` (the default) serves none.
        state: The schedulers' state store (``mangonel scheduler --state``); a
            SQLite file in ``work_dir`` when ``None``.
        schedulers: Scheduler processes; more than one makes a highly available
            group on one etcd ``state``: the first leads, the others wait as
            standbys; executors and clients are given every address.
        flight_sql_port: Port of the scheduler's Arrow Flight SQL endpoint
            (``flight_sql_url``); 0 (the default) picks a free one, ``None`` serves none.
        flight_sql_results: Where Flight SQL clients read results: ``executors``
            (the default) or ``scheduler`` (``mangonel scheduler --flight-sql-results``).
        storage: Object storage options of the scheduler and every executor
            (``--s3-*``: endpoint, region, addressing, timeouts, retries);
            credentials reach them through the environment (``AWS_*``), which
            the processes inherit.
        secure: Secure every channel: make a CA, certificates and a cluster
            secret in ``tls_dir`` (``mangonel certs init``), give the members'
            files to every process (TLS everywhere, executors on the scheduler's
            cluster port, signed Flight tickets, HTTPS web UI) and only the
            clients' (the CA) to ``connect()``'s sessions (``client_security``),
            which log in as the first admin of ``users``, or without ``users``
            with a token for ``admin`` signed with the secret (``token``).
        tls_dir: The cluster's files when ``secure``: made there unless it holds
            a CA already (a cluster started again keeps its files);
            ``work_dir/tls`` when ``None``.
        scheduler_options: Settings of the scheduler by their field names in
            ``SchedulerConfig`` (``mangonel.options``: ``{"split_rows": 10_000}``);
            they win over the arguments above of the same settings.
        users: Users who may log in, ``{name: (password, admin)}``: the scheduler
            then lets only them in (a users file in ``work_dir``, and a cluster secret there
            too unless ``secure`` brings one). ``connect()`` logs in as the first admin unless given
            other credentials; at least one user must be an admin.
    """

    def __init__(
        self,
        executors: int = defaults.LOCAL_EXECUTORS,
        work_dir: str | os.PathLike[str] | None = None,
        slots: int | None = None,
        partitions: int | None = None,
        broadcast_bytes: int | None = None,
        heartbeat_timeout: float | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 5.0,
        log_level: str = "info",
        scheduler_args: tuple[str, ...] = (),
        executor_args: tuple[str, ...] = (),
        scheduler_port: int = 0,
        no_executor_grace: float | None = None,
        max_task_attempts: int | None = None,
        max_task_recomputes: int | None = None,
        speculation: bool | None = None,
        speculation_min: float | None = None,
        exclusion_failures: int | None = None,
        exclusion_time: float | None = None,
        drain_timeout: float | None = None,
        cleanup_interval: float | None = None,
        result_ttl: float | None = None,
        web_port: int | None = None,
        state: str | None = None,
        schedulers: int = 1,
        partition_bytes: int | None = None,
        adaptive: bool | None = None,
        executor_args_for: Callable[[int], Sequence[str]] | None = None,
        storage: StorageOptions | None = None,
        secure: bool = False,
        tls_dir: str | os.PathLike[str] | None = None,
        users: Mapping[str, tuple[str, bool]] | None = None,
        flight_sql_port: int | None = 0,
        flight_sql_results: str = "executors",
        scheduler_options: Mapping[str, Any] | None = None,
    ) -> None:
        if users is not None and not any(admin for _, admin in users.values()):
            raise ValueError("users needs at least one admin: connect() logs in as one")
        if schedulers < 1:
            raise ValueError(f"schedulers must be at least 1, got {schedulers}")
        if schedulers > 1 and not (state or "").startswith("etcd://"):
            raise ValueError(
                "several schedulers need a shared etcd state store (state='etcd://...')"
            )
        if executors < 0:
            raise ValueError(f"executors must be at least 0, got {executors}")
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="mangonel-cluster-")).resolve()
        self.log_dir = Path(log_dir).resolve() if log_dir else self.work_dir / "logs"
        self.num_executors = executors
        self.slots = slots
        self.partitions = partitions
        if partition_bytes is None and partitions is not None:
            partition_bytes = 0
        self.partition_bytes = partition_bytes
        if adaptive is None and partition_bytes == 0:
            adaptive = False
        self.adaptive = adaptive
        self.broadcast_bytes = broadcast_bytes
        if heartbeat_timeout is None:
            heartbeat_timeout = _HEARTBEAT.default_for(Takes.STANDALONE)
        self.heartbeat_timeout = heartbeat_timeout
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.log_level = log_level
        self.scheduler_args = scheduler_args
        self.executor_args = executor_args
        self.executor_args_for = executor_args_for
        self.storage = storage or StorageOptions()
        self.secure = secure
        self.tls_dir = Path(tls_dir).resolve() if tls_dir else self.work_dir / "tls"
        self.scheduler_port = scheduler_port
        self._cluster_ports: list[int] = []
        self.no_executor_grace = no_executor_grace
        self.max_task_attempts = max_task_attempts
        self.max_task_recomputes = max_task_recomputes
        self.speculation = speculation
        self.speculation_min = speculation_min
        self.exclusion_failures = exclusion_failures
        self.exclusion_time = exclusion_time
        self.drain_timeout = drain_timeout
        self.cleanup_interval = cleanup_interval
        self.result_ttl = result_ttl
        self.web_port = web_port
        self._web_url: str | None = None
        self.flight_sql_port = flight_sql_port
        self.flight_sql_results = flight_sql_results
        self._flight_sql_url: str | None = None
        self.executor_root = self.work_dir / "executors"
        """The work root every executor of this cluster shares."""
        self.state = state or f"sqlite://{self.work_dir / 'scheduler-state.db'}"
        self.num_schedulers = schedulers
        self.schedulers: list[ProcessHandle | None] = [None] * schedulers
        """Scheduler processes by index (restarted ones replace their handle)."""
        self._scheduler_ports: list[int] = []
        self.executors: list[ExecutorHandle] = []
        self._address: str | None = None
        self._lock = threading.Lock()
        self._failed = False
        self.users = dict(users) if users is not None else None
        self.users_file = self.work_dir / "users" if users is not None else None
        self.scheduler_options = dict(scheduler_options or {})
        options.to_argv(Takes.SCHEDULER, self.scheduler_options)  # a wrong name fails here

    @property
    def member_tls_dir(self) -> Path:
        """The scheduler's and executors' files of ``tls_dir`` (its ``cluster/``, or
        ``tls_dir`` itself when it holds a single directory made before the split)."""
        if (self.tls_dir / "ca.pem").exists() and not (self.tls_dir / "cluster").is_dir():
            return self.tls_dir
        return self.tls_dir / "cluster"

    @property
    def client_tls_dir(self) -> Path:
        """All a client of this cluster holds: ``tls_dir``'s ``client/`` (the CA)."""
        return Path(role_dir(str(self.tls_dir), "client"))

    @property
    def cluster_secret_file(self) -> Path | None:
        """The secret that signs tokens and tickets: the members' (``secure``), or one
        of its own for ``users``; ``None`` without either."""
        if self.secure:
            return self.member_tls_dir / SECRET_FILE
        if self.users is not None:
            return self.work_dir / SECRET_FILE
        return None

    @property
    def executor_slots(self) -> int:
        """Task slots each executor of this cluster gets (see ``slots``)."""
        if self.slots is not None:
            return self.slots
        return max(1, (os.cpu_count() or 1) // max(1, self.num_executors))

    def executor_memory_share(self) -> int:
        """``--memory`` of each executor unless its options give one: they all run on
        this host, so they share the default budget of one (``executor.memory``:
        80% of the host's memory or of this process's cgroup limit) equally."""
        from mangonel.executor import memory  # a small module; the executor stays unloaded

        return memory.default_budget() // max(1, self.num_executors)

    # ------------------------------------------------------------------ life cycle

    @property
    def address(self) -> str:
        """``host:port`` of the scheduler (of every scheduler, comma-separated, with several)."""
        if self._address is None:
            raise ClusterError("the cluster is not started; use it as a context manager")
        return self._address

    @property
    def scheduler(self) -> ProcessHandle | None:
        """The first scheduler's process."""
        return self.schedulers[0]

    def scheduler_address(self, index: int) -> str:
        return f"127.0.0.1:{self._scheduler_ports[index]}"

    @property
    def cluster_address(self) -> str:
        """Where executors register: with ``secure``, the schedulers' cluster ports
        (mutual TLS), comma-separated; else ``address``."""
        if not self.secure:
            return self.address
        return ",".join(f"127.0.0.1:{port}" for port in self._cluster_ports)

    @property
    def web_url(self) -> str:
        """``http://host:port`` of the scheduler's web UI (``/api``, ``/metrics``);
        ``https://`` when ``secure`` (its CA: ``client_tls_dir / "ca.pem"``)."""
        if self.web_port is None:
            raise ClusterError("this cluster serves no web UI; start it with web_port=0")
        if self._web_url is None:
            raise ClusterError("the cluster is not started; use it as a context manager")
        return self._web_url

    @property
    def flight_sql_url(self) -> str:
        """``grpc://host:port`` of the scheduler's Arrow Flight SQL endpoint."""
        if self.flight_sql_port is None:
            raise ClusterError("this cluster serves no Flight SQL; start it with flight_sql_port=0")
        if self._flight_sql_url is None:
            raise ClusterError("the cluster is not started; use it as a context manager")
        return self._flight_sql_url

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """Start the scheduler and the executors; wait until all registered."""
        _live_clusters.add(self)
        try:
            self._make_certs()  # before the users: the secret is the TLS directory's
            self._write_users()
            self._start_scheduler()
            for _ in range(self.num_executors):
                self._spawn_executor()
            self.wait_for_executors(self.num_executors, self.start_timeout)
        except BaseException:
            self._failed = True
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process (executors first), never leaving one behind.

        Executors get SIGINT, which stops them at once: a SIGTERM would make
        them drain, which is for leaving a cluster that goes on, not for this.
        """
        stops: list[tuple[ProcessHandle, int]] = [(e, signal.SIGINT) for e in self.executors]
        stops += [(s, signal.SIGTERM) for s in self.schedulers if s is not None]
        for proc, sig in stops:
            proc.signal(sig)
            proc.signal(signal.SIGCONT)
        for proc, sig in stops:
            proc.stop(self.stop_timeout, sig)
        _live_clusters.discard(self)
        if self._own_work_dir and not self._failed:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _env(self) -> dict[str, str]:
        return child_env()

    @property
    def node_security(self) -> SecurityOptions:
        """The scheduler's and executors' files (nothing when not ``secure``)."""
        if not self.secure:
            return SecurityOptions()
        return SecurityOptions.from_tls_dir(str(self.member_tls_dir), "node")

    @property
    def client_security(self) -> SecurityOptions | None:
        """A client's files for ``Session(..., security=...)``, the CA alone; ``None``
        when not ``secure``."""
        if not self.secure:
            return None
        return SecurityOptions.from_tls_dir(str(self.client_tls_dir), "client")

    def _make_certs(self) -> None:
        if not self.secure or (self.tls_dir / "ca.pem").exists():
            return
        # Imported here: only secured clusters pay for loading ``cryptography``.
        from mangonel.security.certs import init_cluster

        init_cluster(str(self.tls_dir))

    def _write_users(self) -> None:
        """The users file and cluster secret of a cluster with ``users`` (once)."""
        secret_file = self.cluster_secret_file
        if self.users is None or self.users_file is None or secret_file is None:
            return
        from mangonel.security.users import add_user

        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not secret_file.exists():
            fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        if not self.users_file.exists():
            for name, (password, admin) in self.users.items():
                add_user(str(self.users_file), name, password, admin=admin)

    def _security_args(self) -> list[str]:
        """The scheduler's options for its users: the file, and the secret when
        ``secure`` does not give one already (``node_security``)."""
        secret_file = self.cluster_secret_file
        if self.users_file is None or secret_file is None:
            return []
        args = ["--users-file", str(self.users_file)]
        if not self.secure:
            args += ["--cluster-secret-file", str(secret_file)]
        return args

    def token(self, user: str, admin: bool = False, ttl_s: float = 3600.0) -> str:
        """A token for ``user`` signed with this cluster's secret (as ``mangonel users
        token`` makes them); for a cluster started with ``users``."""
        secret_file = self.cluster_secret_file
        if secret_file is None:
            raise ClusterError(
                "this cluster has no users and no cluster secret; start it with users={...} "
                "or secure=True"
            )
        from mangonel.security import tokens

        secret = secret_file.read_bytes().strip()
        return tokens.mint(secret, user, admin=admin, ttl_s=ttl_s)

    def _start_scheduler(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._make_certs()
        # Every address is known up front (executors and clients get them all), on
        # ports a restart can bind again (``stable_port``).
        self._scheduler_ports = [
            self.scheduler_port or stable_port() for _ in range(self.num_schedulers)
        ]
        self._cluster_ports = [stable_port() for _ in range(self.num_schedulers)]
        self._launch_scheduler(0, wait=True)
        if self.num_schedulers > 1:
            self._address = ",".join(self.scheduler_address(i) for i in range(self.num_schedulers))
            for index in range(1, self.num_schedulers):
                self._launch_scheduler(index, wait=False)

    def kill_scheduler(self, index: int = 0, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) to scheduler ``index`` and wait for it to exit."""
        proc = self.schedulers[index]
        if proc is None:
            return
        proc.signal(sig)
        if sig != signal.SIGSTOP:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.process.wait(self.stop_timeout)

    def restart_scheduler(self, index: int = 0, wait: bool = True) -> None:
        """Start scheduler ``index`` again, on its port and state store.

        With ``wait``, return once it serves (it leads); a standby of a group
        never serves until the leader dies, so pass ``wait=False`` for one.
        """
        proc = self.schedulers[index]
        if proc is not None and proc.alive():
            raise ClusterError(f"scheduler {index} still runs; kill it first")
        self._launch_scheduler(index, wait=wait)

    def wait_for_leader(self, timeout: float = 30.0, exclude: int | None = None) -> int:
        """Wait until a scheduler (other than ``exclude``) serves; return its index."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for index in range(self.num_schedulers):
                if index == exclude:
                    continue
                if (self.work_dir / f"scheduler-{index}.address").exists():
                    proc = self.schedulers[index]
                    if proc is not None and proc.alive():
                        return index
            time.sleep(_POLL_S)
        raise ClusterError(f"no scheduler took the lead within {timeout:g} s")

    def _launch_scheduler(self, index: int, wait: bool) -> None:
        address_file = self.work_dir / f"scheduler-{index}.address"
        address_file.unlink(missing_ok=True)
        port = self._scheduler_ports[index]
        web_file = self.work_dir / f"scheduler-{index}.web"
        web_file.unlink(missing_ok=True)
        fsql_file = self.work_dir / f"scheduler-{index}.flightsql"
        fsql_file.unlink(missing_ok=True)
        where = {
            "host": "127.0.0.1",
            "port": port,
            "cluster_port": self._cluster_ports[index],
            "address_file": str(address_file),
            "state": self.state,
            "web_port": -1 if self.web_port is None else self.web_port,
            "web_address_file": None if self.web_port is None else str(web_file),
            "flight_sql_port": -1 if self.flight_sql_port is None else self.flight_sql_port,
            "flight_sql_address_file": None if self.flight_sql_port is None else str(fsql_file),
            "flight_sql_results": None if self.flight_sql_port is None else self.flight_sql_results,
        }
        args = [sys.executable, "-m", "mangonel", "--log-level", self.log_level, "scheduler"]
        args += options.to_argv(Takes.SCHEDULER, where | self.scheduler_settings())
        args += self.storage.to_args()
        args += self.node_security.to_args()
        args += self._security_args()
        args += list(self.scheduler_args)
        name = "scheduler" if self.num_schedulers == 1 else f"scheduler-{index}"
        proc = ProcessHandle(name, args, self.log_dir / f"{name}.log", self._env())
        self.schedulers[index] = proc
        if not wait:
            return
        deadline = time.monotonic() + self.start_timeout
        while not address_file.exists():
            self._check_alive(proc)
            if time.monotonic() > deadline:
                raise self._start_error(proc, "did not start listening in time")
            time.sleep(_POLL_S)
        address = address_file.read_text().strip()
        # A restart binds the same port: executors and clients find it again.
        self._scheduler_ports[index] = int(address.rsplit(":", 1)[1])
        if self.num_schedulers == 1:
            self._address = address
        if self.web_port is not None:
            while not web_file.exists():
                self._check_alive(proc)
                if time.monotonic() > deadline:
                    raise self._start_error(proc, "did not start its web UI in time")
                time.sleep(_POLL_S)
            self._web_url = web_file.read_text().strip()
        if self.flight_sql_port is not None:
            while not fsql_file.exists():
                self._check_alive(proc)
                if time.monotonic() > deadline:
                    raise self._start_error(proc, "did not start its Flight SQL endpoint in time")
                time.sleep(_POLL_S)
            self._flight_sql_url = fsql_file.read_text().strip()

    def _spawn_executor(self) -> ExecutorHandle:
        with self._lock:
            index = len(self.executors)
            args = [
                sys.executable, "-m", "mangonel", "--log-level", self.log_level,
                "executor", "--scheduler", self.cluster_address,
            ]  # fmt: skip
            args += options.to_argv(
                Takes.EXECUTOR,
                {
                    "flight_port": 0,
                    "work_dir": str(self.executor_root),
                    "index": index,
                    "slots": self.executor_slots,
                }
                | {dest: getattr(self, kw) for kw, dest in EXECUTOR_KEYWORDS.items()},
            )
            args += self.storage.to_args()
            args += self.node_security.to_args()
            if self.users is not None and not self.secure:
                # The scheduler signs tickets with the users' secret: executors check them.
                args += ["--cluster-secret-file", str(self.cluster_secret_file)]
            own = self.executor_options(index)
            if not {"--memory", "--memory-limit"} & set(own):
                args += ["--memory", str(self.executor_memory_share())]
            args += own
            handle = ExecutorHandle(
                index,
                self.executor_command(index, args),
                self.log_dir / f"executor-{index}.log",
                self._env(),
                self.executor_root,
            )
            self.executors.append(handle)
            return handle

    def scheduler_settings(self) -> dict[str, Any]:
        """The scheduler's settings this cluster gives (``{field: value}``, the names of
        ``SchedulerConfig``): its arguments', then ``scheduler_options``; ``None``
        values are left to the scheduler's defaults (``mangonel.options.to_argv``)."""
        settings = {dest: getattr(self, kw) for kw, dest in SCHEDULER_KEYWORDS.items()}
        settings.update(self.scheduler_options)
        return settings

    def executor_options(self, index: int) -> list[str]:
        """The extra command-line options of executor ``index``: ``executor_args``,
        then ``executor_args_for(index)``. A subclass may add its own (the test
        cluster adds each executor's fault-rules file)."""
        options = list(self.executor_args)
        if self.executor_args_for is not None:
            options += self.executor_args_for(index)
        return options

    def executor_command(self, index: int, args: list[str]) -> list[str]:
        """The command line that starts executor ``index``: ``args`` itself. A
        subclass may wrap it (the test cluster starts some in a memory cgroup)."""
        return args

    def _check_alive(self, proc: ProcessHandle) -> None:
        if not proc.alive():
            raise self._start_error(proc, f"exited with code {proc.process.returncode}")

    def _start_error(self, proc: ProcessHandle, what: str) -> ClusterError:
        tail = proc.log_tail()
        return ClusterError(
            f"{proc.name} (pid {proc.pid}) {what}; its log {proc.log_path} ends with:\n{tail}"
        )

    def wait_for_executors(self, count: int | None = None, timeout: float | None = None) -> None:
        """Wait until ``count`` of our executor processes are registered and alive.

        Raises:
            ClusterError: an executor process exited, or the wait timed out.
        """
        count = len(self.executors) if count is None else count
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        # No waiting inside the session: this loop polls, and looks at the processes
        # between polls (a scheduler that died is an error now, not in 30 s).
        with self.connect(connect_wait_s=0) as session:
            while True:
                if self.scheduler is not None:
                    self._check_alive(self.scheduler)
                registered = self._match_ids(session)
                if registered >= count:
                    return
                for handle in self.executors:
                    if handle.id is None:
                        self._check_alive(handle)
                if time.monotonic() > deadline:
                    waiting = [h for h in self.executors if h.id is None] or self.executors
                    raise self._start_error(
                        waiting[0], f"did not register with the scheduler in {timeout} s"
                    )
                time.sleep(_POLL_S * 5)

    def _match_ids(self, session: Session) -> int:
        """Give our handles the ids of the alive executors with their pids."""
        try:
            status = session.status()
        except MangonelError:
            return 0
        alive = {e.pid: e.id for e in status.executors if e.state is ExecutorState.ALIVE}
        for handle in self.executors:
            if handle.pid in alive:
                handle.id = alive[handle.pid]
        return sum(1 for h in self.executors if h.id is not None and h.pid in alive)

    # ------------------------------------------------------------------- clients

    def connect(
        self,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        connect_wait_s: float = defaults.CONNECT_WAIT_S,
    ) -> Session:
        """A client session with this cluster's scheduler (with the CA alone when secure).

        With ``users`` and no credentials given: logged in as the first admin.
        ``connect_wait_s``: how long the session waits for a scheduler it never
        reached that refuses connections (``Session``).
        """
        if self.users is not None and user is None and token is None:
            user, (password, _) = next((n, u) for n, u in self.users.items() if u[1])
        elif self.secure and user is None and token is None:
            token = self.token("admin", admin=True)  # TLS without users: tokens only
        return Session(
            self.address,
            security=self.client_security,
            user=user,
            password=password,
            token=token,
            connect_wait_s=connect_wait_s,
        )

    # ------------------------------------------------------------------ processes

    def kill_executor(
        self, index: int, sig: int = signal.SIGKILL, wait: bool | None = None
    ) -> None:
        """Send ``sig`` (SIGKILL by default) to executor ``index``.

        Args:
            index: The executor.
            sig: SIGKILL kills it; SIGTERM makes it drain (finish its tasks, serve
                its outputs until the scheduler lets it go, then exit 0); SIGINT
                stops it at once.
            wait: Wait (at most ``stop_timeout``) for the process to exit; by
                default only after SIGKILL, since a drain takes as long as the
                query needs the executor (see ``wait_for_exit``).
        """
        handle = self.executors[index]
        handle.signal(sig)
        if wait is None:
            wait = sig == signal.SIGKILL
        if wait:
            with contextlib.suppress(subprocess.TimeoutExpired):
                handle.process.wait(self.stop_timeout)

    def wait_for_exit(self, index: int, timeout: float) -> int | None:
        """Wait for executor ``index`` to exit; its exit code, or ``None`` if it still runs."""
        try:
            return self.executors[index].process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def freeze_executor(self, index: int) -> None:
        """SIGSTOP executor ``index``: it stays connected but answers nothing."""
        self.executors[index].signal(signal.SIGSTOP)

    def thaw_executor(self, index: int) -> None:
        """SIGCONT a frozen executor."""
        self.executors[index].signal(signal.SIGCONT)

    def work_files(self) -> list[Path]:
        """Every file under the executors' work root (for disk-use checks).

        Executors delete files while this walks: what vanishes meanwhile is
        left out rather than failing the walk.
        """
        found: list[Path] = []
        for directory, _, files in os.walk(self.executor_root):  # ignores errors
            found.extend(Path(directory, name) for name in files)
        return sorted(found)

    def add_executor(self, wait: bool = True) -> ExecutorHandle:
        """Start one more executor; by default wait until it registered."""
        with self.connect(connect_wait_s=0) as session:
            registered = self._match_ids(session)
        handle = self._spawn_executor()
        if wait:
            self.wait_for_executors(registered + 1)
        return handle


def stable_port(host: str = "127.0.0.1") -> int:
    """A free port outside the kernel's ephemeral range, for a server that restarts.

    A port the kernel handed out (bind to port 0) lies in the range it also takes
    the local ports of outgoing connections from: while the server is down, the
    executors and clients reconnecting to it, or any other connection, may be given
    that very port as their own (a client may even connect to itself), and the
    restarted server then fails to bind it ("Address already in use"). Below the
    range no connection is ever given a port by the kernel.
    """
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = list(range(max(1024, low - 12000), low))
    random.SystemRandom().shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # all taken: let the kernel choose
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@atexit.register
def _stop_all() -> None:
    for cluster in list(_live_clusters):
        cluster.stop()
