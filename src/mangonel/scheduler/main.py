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
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from mangonel import defaults, options, pauses, storage
from mangonel.errors import ClusterError, StateStoreError, StoreFencedError
from mangonel.plan.planner import PlannerConfig, warm_up
from mangonel.proto import mangonel_pb2_grpc as pb_grpc
from mangonel.scheduler.core import CoreConfig, SchedulerCore
from mangonel.scheduler.events import Limits
from mangonel.scheduler.service import ExecutorControlServicer, QueryServiceServicer
from mangonel.scheduler.store import open_store
from mangonel.scheduler.tickets import TicketIssuer
from mangonel.scheduler.writes import default_warehouse
from mangonel.security import UsersAuthenticator, authenticator_for, tls
from mangonel.security.login_limits import LoginLimits
from mangonel.security.options import SecurityOptions
from mangonel.security.tickets import TicketSigner

if TYPE_CHECKING:
    from mangonel.scheduler.flightsql import FlightSqlServer
    from mangonel.web.server import WebServer

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = defaults.GRPC_MAX_MESSAGE_BYTES
KEEPALIVE_TIMEOUT_MS = 20_000
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Executors' Connect streams are idle for long stretches: keep them open and
    # let a dead peer be found by keepalive pings rather than never.
    # The answer may take 20 s: a ping lost in a cut the scheduler rides out
    # (``state_liveness``: most executors silent at once) must not break every
    # stream and throw the executors' outputs away; a dead executor is found by
    # its heartbeats' silence in seconds anyway.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    # gRPC 1.85 waits this long for a ping's answer, whatever the keepalive
    # timeout (default 60 s): see ``client.rpc.keepalive_options``.
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    # Clients ping under a watched job's quiet stream (``client.rpc``, as often
    # as every second): a server that allowed fewer would close their connection
    # for "too many pings".
    ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
]


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings of a scheduler process.

    Attributes:
        host: Interface to listen on.
        port: Port to listen on (clients; and executors, without TLS); 0 picks a free one.
        cluster_port: With TLS, the port executors register at (mutual TLS: a
            member's certificate); 0 picks a free one. Without TLS there is no
            certificate to ask for, and ``port`` serves executors too.
        partitions: The most output partitions of a hash exchange.
        partition_bytes: One partition per this many estimated bytes of an
            exchange; 0: always ``partitions``.
        broadcast_bytes: Join sides estimated above this size are never broadcast;
            below it, the planner broadcasts a side when that moves fewer bytes.
        split_rows: Rows (about) read by one scan task; None sizes splits from the
            bytes of the columns a scan reads (``split_bytes`` a task).
        split_bytes: Bytes of scanned columns (in memory) a scan task reads, about.
        inline_scan_bytes: A small broadcast table is scanned by each task that
            joins it when its columns' bytes times those tasks are at most this.
        fuse_bytes: A stage of one task is planned inside its one reader's task
            while the two scan at most this many bytes of tables
            (``PlannerConfig.fuse_bytes``); 0: no bound.
        spread_bytes: Where hosts run several tasks at full speed at once, a scan
            is spread over them while each task reads at least this many bytes
            (``PlannerConfig.spread_bytes``).
        recompute_bytes: A stage of one task that reads only tables is computed
            again by each task that reads it while the copies beyond the first
            scan at most this many bytes (``PlannerConfig.recompute_bytes``); 0: never.
        plan_cache: Plans of recent queries kept for the same SQL sent again; 0: none.
        adaptive: Run a hash exchange's reader stage as fewer tasks when the real
            sizes of its partitions are small (``scheduler.adaptive``).
        adaptive_partition_bytes: Bytes of input a coalesced reader task reads, about.
        adaptive_min_partition_bytes: And at least, even where slots are left idle.
        heartbeat_timeout_s: An executor silent this long is lost.
        no_executor_grace_s: A job with no executor for this long fails.
        isolation_grace_s: Losses for silence wait this much longer while most
            executors are silent at once (``scheduler.state_liveness``).
        max_task_attempts: Attempts of one task before its job fails.
        max_task_recomputes: Times one task's output may be lost and made again
            before its job fails.
        result_ttl_s: Results no client released are deleted after this long.
        speculation: Copy straggling task attempts onto other executors; the
            first to finish wins (``speculation_*``: when an attempt straggles).
        speculation_quantile: Fraction of a stage's tasks done before any is copied.
        speculation_multiplier: A straggler ran this many times its stage's median.
        speculation_min_s: And at least this long.
        slow_link_ratio: With speculation, a job stops reading an executor its
            readers get under 1/ratio of the others' rate from, when remaking its
            outputs elsewhere is sooner (``state_links``); 0: never.
        slow_link_backoff_s: An executor marked behind a slow link gets no new
            task for this long, doubled for each mark in a row
            (``state_link_marks``).
        exclusion_failures: Distinct tasks failing on one executor within
            ``exclusion_window_s`` that exclude it for ``exclusion_s``; 0: never.
        exclusion_window_s: Seconds over which those failures are counted.
        exclusion_s: Seconds an excluded executor gets no new task.
        max_job_share: The most of the slots one job may hold (1: no cap).
        address_file: Where to write the bound ``host:port`` once serving.
        max_workers: gRPC threads; every executor stream and job watcher holds one.
        web_port: Port of the web UI, REST API and /metrics (``mangonel.web``);
            0 picks a free one, ``None`` serves none.
        web_address_file: Where to write the web UI's URL once serving.
        state: Where the scheduler's state is kept (``scheduler.store.open_store``):
            ``sqlite:///path.db`` (the default: ``default_state_url()``),
            ``etcd://host:port[/prefix]`` (a highly available pair: a second
            scheduler on the same etcd waits as a standby and takes over when the
            leader dies), or ``memory://`` (nothing survives a restart).
        state_wait_s: How long to wait, at start, for a store that no server of
            answers (``open_store``); 0: fail at once.
        standby_timeout_s: How long to wait for the lead of a store another
            scheduler holds; ``None`` waits forever (a standby). A SQLite store
            held by another scheduler is an error after this long.
        crash_file: Crash tests only: rules that make the scheduler kill itself
            at chosen points (``mangonel.testing.crash``).
        storage: How to reach object storage for ``s3://`` tables (endpoint,
            region, addressing, timeouts, retries); the AWS environment decides
            what it leaves out. Credentials are never part of it.
        security: TLS files, the cluster secret and the users file (``--tls-dir``...).
            With TLS (which needs the cluster secret) ``port`` serves clients
            over TLS without client certificates, ``cluster_port`` executors over
            mutual TLS, and the web UI HTTPS; with a secret, Flight tickets are
            signed; with TLS or a users file every client must log in or bring a
            token (``mangonel.security.authenticator_for``).
        login_limits: How many failed password logins lock a user name or a
            client address, and for how long (``security.login_limits``).
        shuffle_ticket_ttl_s: Validity of a signed shuffle ticket.
        flight_sql_port: Port of the Arrow Flight SQL endpoint
            (``scheduler.flightsql``); 0 picks a free one, ``None`` serves none.
        flight_sql_address_file: Where to write its ``grpc://host:port`` URL.
        flight_sql_results: Where its clients read results: ``executors`` (each
            result partition where it is, the scheduler as the fallback) or
            ``scheduler`` (every partition through the scheduler).
        warehouse: Where ``CREATE TABLE AS`` writes its tables
            (``scheduler.writes.default_warehouse`` when ``None``).
        write_roots: Locations ``COPY ... TO`` may write under; none: ``COPY`` is refused.
    """

    host: str = defaults.LISTEN_HOST
    port: int = defaults.SCHEDULER_PORT
    cluster_port: int = 0
    partitions: int = defaults.PARTITIONS
    partition_bytes: int = defaults.PARTITION_BYTES
    broadcast_bytes: int = defaults.BROADCAST_BYTES
    split_rows: int | None = None
    split_bytes: int = defaults.SPLIT_BYTES
    inline_scan_bytes: int = defaults.INLINE_SCAN_BYTES
    fuse_bytes: int = defaults.FUSE_BYTES
    spread_bytes: int = defaults.SPREAD_BYTES
    recompute_bytes: int = defaults.RECOMPUTE_BYTES
    plan_cache: int = defaults.PLAN_CACHE
    adaptive: bool = defaults.ADAPTIVE
    adaptive_partition_bytes: int = defaults.ADAPTIVE_PARTITION_BYTES
    adaptive_min_partition_bytes: int = defaults.ADAPTIVE_MIN_PARTITION_BYTES
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S
    no_executor_grace_s: float = defaults.NO_EXECUTOR_GRACE_S
    isolation_grace_s: float = defaults.ISOLATION_GRACE_S
    max_task_attempts: int = defaults.MAX_TASK_ATTEMPTS
    max_task_recomputes: int = defaults.MAX_TASK_RECOMPUTES
    result_ttl_s: float = defaults.RESULT_TTL_S
    speculation: bool = defaults.SPECULATION
    speculation_quantile: float = defaults.SPECULATION_QUANTILE
    speculation_multiplier: float = defaults.SPECULATION_MULTIPLIER
    speculation_min_s: float = defaults.SPECULATION_MIN_S
    slow_link_ratio: float = defaults.SLOW_LINK_RATIO
    slow_link_backoff_s: float = defaults.SLOW_LINK_BACKOFF_S
    exclusion_failures: int = defaults.EXCLUSION_FAILURES
    exclusion_window_s: float = defaults.EXCLUSION_WINDOW_S
    exclusion_s: float = defaults.EXCLUSION_S
    max_job_share: float = defaults.MAX_JOB_SHARE
    address_file: str | None = None
    max_workers: int = 128
    web_port: int | None = None
    web_address_file: str | None = None
    state: str | None = None
    state_wait_s: float = defaults.STATE_WAIT_S
    standby_timeout_s: float | None = None
    crash_file: str | None = None
    storage: storage.StorageOptions = field(default_factory=storage.StorageOptions)
    security: SecurityOptions = field(default_factory=SecurityOptions)
    login_limits: LoginLimits = field(default_factory=LoginLimits)
    shuffle_ticket_ttl_s: float = defaults.SHUFFLE_TICKET_TTL_S
    flight_sql_port: int | None = None
    flight_sql_address_file: str | None = None
    flight_sql_results: str = "executors"
    warehouse: str | None = None
    write_roots: tuple[str, ...] = ()

    def core_config(self) -> CoreConfig:
        """The settings of the shell and of what it holds: the planner's and the state
        machine's fields have the names of this config's (``options.Group``).

        Raises:
            ValueError: a limit is out of range (``Limits.__post_init__``).
        """
        return CoreConfig(
            warehouse=self.warehouse or default_warehouse(self.state or default_state_url()),
            write_roots=self.write_roots,
            planner=PlannerConfig(**self._group(options.Group.PLANNER)),
            limits=Limits(**self._group(options.Group.LIMITS)),
            **self._group(options.Group.CORE),
        )

    def _group(self, group: options.Group) -> dict[str, Any]:
        """This config's settings of ``group``, by field name."""
        return {
            o.dest: getattr(self, o.dest)
            for o in options.options_of(options.Takes.SCHEDULER)
            if o.group is group
        }


class SchedulerServer:
    """A running scheduler: its gRPC server, its core and its bound addresses."""

    def __init__(
        self,
        server: grpc.Server,
        core: SchedulerCore,
        address: str,
        cluster_address: str | None = None,
    ) -> None:
        self.server = server
        self.core = core
        self.address = address
        """Where clients connect (and executors, without TLS)."""
        self.cluster_address = cluster_address or address
        """Where executors register: the cluster port with TLS, else ``address``."""
        self.web: WebServer | None = None
        """The web UI's server (``web.url``), when one was asked for."""
        self.flight_sql: FlightSqlServer | None = None
        """The Flight SQL endpoint (``flight_sql.url``), when one was asked for."""
        self.stopping = threading.Event()
        self._stopped = threading.Event()
        self.deposed = threading.Event()
        """Set when it stopped because another scheduler took the lead."""
        self.reloaders: list[Callable[[], None]] = []
        """What ``reload`` calls: each reads a file of the scheduler's again."""

    def reload(self) -> None:
        """Read the users file and the TLS files again (SIGHUP), whether or not
        they look changed."""
        log.info("reloading the users file and the TLS certificate")
        for reload in self.reloaders:
            try:
                reload()
            except Exception:  # one that fails leaves the others, and the old files
                log.exception("reloading failed; what was read before stays in use")

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving: end executor streams, then the server; give up the lead.

        A second call (the main thread after a signal, while the deposed watch
        stops it) returns once the first is done: the process must not exit
        while the server still hands calls to its threads.
        """
        if self.stopping.is_set():
            self._stopped.wait()
            return
        self.stopping.set()
        try:
            if self.web is not None:
                self.web.stop()
            if self.flight_sql is not None:
                self.flight_sql.shutdown()
            self.core.stop()
            self.server.stop(grace).wait(grace + 1)
            self.core.store.close()
        finally:
            self._stopped.set()


def default_state_url() -> str:
    """``sqlite:///$XDG_STATE_HOME/mangonel/scheduler.db`` (``~/.local/state`` by default)."""
    root = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return f"sqlite://{os.path.join(root, 'mangonel', 'scheduler.db')}"


def start_scheduler(config: SchedulerConfig) -> SchedulerServer:
    """Take the lead of the state store, recover its jobs, bind, serve; return at once.

    With a store another scheduler leads, this waits as a standby (up to
    ``config.standby_timeout_s``) and starts serving only once it leads.

    Raises:
        ClusterError: the address cannot be bound (e.g. the port is taken).
        StateStoreError: the store cannot be opened or read (no server of it
            answered for ``state_wait_s``), or another scheduler kept it for
            longer than ``standby_timeout_s``.
    """
    from mangonel.scheduler.state import SchedulerState  # the state machine's module

    pauses.watch()
    storage.configure(config.storage)  # before recover(): it reads s3:// footers again
    # Read the security files first: a typo in a path fails here, before the store is taken.
    config.security.check_member("scheduler")
    material = tls.TlsMaterial.load(config.security)
    # What the scheduler's ports present, read again on SIGHUP.
    serving = None if material is None else tls.ServingCertificates(config.security, material)
    secret = config.security.cluster_secret()
    tickets = (
        None
        if secret is None
        else TicketIssuer(TicketSigner(secret), config.shuffle_ticket_ttl_s, config.result_ttl_s)
    )
    authenticator = authenticator_for(config.security, config.login_limits)
    url = config.state or default_state_url()
    store = open_store(url, config.state_wait_s, on_wait=lambda line: log.warning("%s", line))
    owner = f"{config.host}:{config.port} (pid {os.getpid()})"
    leader = store.leader()
    if leader is not None:
        log.info("the state store %s is led by %s: waiting as the standby", url, leader)
        print(f"mangonel scheduler waiting as the standby of {leader}", flush=True)
    if not store.acquire(owner, config.standby_timeout_s):
        leader = store.leader() or "another scheduler"
        store.close()
        raise StateStoreError(
            f"the state store {url} is in use by {leader}; stop that scheduler first, or give "
            "this one its own --state"
        )
    core_config = config.core_config()
    state = SchedulerState(core_config.limits, keep_finished_jobs=core_config.keep_jobs)
    core = SchedulerCore(state, core_config, store=store)
    if config.crash_file:
        # This is the composition root: test hooks are wired in here, and the
        # test code imported only when a crash-rules file was asked for.
        from mangonel.testing.crash import CrashPoints

        core.hook = CrashPoints(config.crash_file, core.final_stage)
    try:
        unfinished = core.recover()
    except BaseException:
        store.close()
        raise
    if unfinished:
        log.info("recovered %d unfinished jobs from %s", unfinished, url)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="rpc"),
        options=GRPC_OPTIONS,
        maximum_concurrent_rpcs=None,
    )
    # One server, two ports with TLS: gRPC's Python server either demands a
    # certificate of every caller of a port or asks none for one. The client port
    # asks none (clients prove who they are with a token); the cluster port demands
    # one, so that the executor service can see a member's (``_admit``), which no
    # caller of the client port can show.
    try:
        if material is None:
            port = server.add_insecure_port(f"{config.host}:{config.port}")
            cluster_address = None
        else:
            port = server.add_secure_port(
                f"{config.host}:{config.port}", serving.grpc_credentials(require_client_auth=False)
            )
            cluster_port = _bind_cluster_port(server, config, serving)
            cluster_address = f"{config.host}:{cluster_port}"
    except RuntimeError as exc:
        store.close()
        raise ClusterError(
            f"cannot listen on {config.host}:{config.port} ({exc}); is another scheduler "
            "running there? pick another port with --port (and --cluster-port)"
        ) from exc
    address = f"{config.host}:{port}"
    # The generated registration functions carry no annotations.
    pb_grpc.add_ExecutorControlServicer_to_server(  # type: ignore[no-untyped-call]
        ExecutorControlServicer(
            core, tickets, members_only=material is not None, cluster_address=cluster_address
        ),
        server,
    )
    pb_grpc.add_QueryServiceServicer_to_server(  # type: ignore[no-untyped-call]
        QueryServiceServicer(core, address, tickets, authenticator), server
    )
    server.start()
    core.start()
    # Not a daemon: DuckDB still running on a daemon thread while the interpreter
    # shuts down aborts the process; a scheduler stopped meanwhile waits for it.
    threading.Thread(target=_warm_up, name="warm-up").start()
    if cluster_address is None:
        log.info("scheduler listening on %s (plaintext: clients and executors)", address)
    else:
        log.info(
            "scheduler listening on %s (clients: TLS, a user's token) and %s (executors: "
            "mutual TLS, the cluster's node certificate)",
            address,
            cluster_address,
        )
    tls.warn_if_exposed(log, "scheduler", config.host, config.security)
    if config.address_file:
        _write_atomically(config.address_file, address)
    running = SchedulerServer(server, core, address, cluster_address)
    if isinstance(authenticator, UsersAuthenticator):
        running.reloaders.append(authenticator.reload)
    if serving is not None:
        running.reloaders.append(serving.reload)
    _stop_when_deposed(running)
    if config.web_port is not None:
        from mangonel.web.server import start_web_server  # only schedulers with a UI pay for it

        try:
            running.web = start_web_server(
                core,
                config.host,
                config.web_port,
                address,
                security=config.security,
                authenticator=authenticator,
            )
        except ClusterError:
            running.stop()
            raise
        if serving is not None:
            serving.on_reload(running.web.reload_tls)
        if config.web_address_file:
            _write_atomically(config.web_address_file, running.web.url)
    if config.flight_sql_port is not None:
        # Imported here: a scheduler without the endpoint does not pay for it.
        from mangonel.scheduler.flightsql import start_flight_sql

        try:
            running.flight_sql = start_flight_sql(
                core,
                config.host,
                config.flight_sql_port,
                authenticator=authenticator,
                results=config.flight_sql_results,
                tls_material=material,
                tickets=tickets,
                serving=serving,
            )
        except ClusterError:
            running.stop()
            raise
        log.info("Flight SQL at %s", running.flight_sql.url)
        if config.flight_sql_address_file:
            _write_atomically(config.flight_sql_address_file, running.flight_sql.url)
    return running


def _bind_cluster_port(
    server: grpc.Server, config: SchedulerConfig, serving: tls.ServingCertificates
) -> int:
    """Bind the cluster port (mutual TLS); its number."""
    credentials = serving.grpc_credentials(require_client_auth=True)
    try:
        return int(server.add_secure_port(f"{config.host}:{config.cluster_port}", credentials))
    except RuntimeError as exc:
        raise RuntimeError(f"cluster port {config.cluster_port}: {exc}") from exc


def _warm_up() -> None:
    """``planner.warm_up`` while the scheduler waits for its first query; a failure
    only costs that query the time."""
    started = time.monotonic()
    try:
        warm_up()
    except Exception:  # noqa: BLE001 - a warm-up must never stop the scheduler
        log.info("warming up the planner failed; the first query pays for it", exc_info=True)
        return
    finally:
        pauses.settle()  # what the start and the warm-up left stays: out of the collector's way
    log.info("planner warmed up in %.3f s", time.monotonic() - started)


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _stop_when_deposed(running: SchedulerServer) -> None:
    """Stop serving as soon as this scheduler no longer leads its store.

    Another scheduler took over (its lease ran out while this one was frozen or
    cut off) or a write failed: this one's memory can no longer be trusted, so
    it stops at once; clients and executors move to the leader.
    """

    def watch() -> None:
        running.core.store.deposed.wait()
        if running.stopping.is_set():
            return
        why = running.core.store.deposed_why
        log.critical(
            "this scheduler lost the lead of its state store%s; it stops serving",
            f": {why}" if why else "",
        )
        running.deposed.set()
        running.stop(grace=0)

    def fatal(exc: Exception) -> None:
        store = running.core.store
        store.deposed_why = store.deposed_why or f"a write failed: {exc}"
        store.deposed.set()

    running.core.on_fatal = fatal
    threading.Thread(target=watch, name="deposed-watch", daemon=True).start()


def run_scheduler(config: SchedulerConfig) -> int:
    """Serve until SIGTERM or SIGINT, then stop cleanly; return the exit status.

    Returns 0 after a signal, 3 when the scheduler stopped because another one
    took the lead of its state store, while it served or while it recovered (a
    supervisor may start it again: it then waits as the standby).
    """
    done = threading.Event()
    started = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("signal %d: stopping the scheduler", signum)
        done.set()
        if not started.is_set():
            raise SystemExit(0)  # still waiting for the lead: nothing to clean up

    hangup = threading.Event()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The handler only notes it: the reload takes locks the interrupted code may hold.
    signal.signal(signal.SIGHUP, lambda signum, frame: hangup.set())
    try:
        running = start_scheduler(config)
    except StoreFencedError:
        # Deposed while it recovered (frozen past its lease, another took the lead
        # meanwhile): its first write was refused. The same stop as a deposed
        # leader's, said in the log by the core, not an error of this scheduler's.
        return _stopped_deposed()
    started.set()
    print(f"mangonel scheduler listening on {running.address}", flush=True)
    if running.cluster_address != running.address:
        print(f"mangonel scheduler: executors register at {running.cluster_address}", flush=True)
    if running.web is not None:
        print(f"mangonel web UI at {running.web.url}", flush=True)
    if running.flight_sql is not None:
        print(f"mangonel Flight SQL at {running.flight_sql.url}", flush=True)
    try:
        while not done.wait(0.2) and not running.stopping.is_set():
            if hangup.is_set():
                hangup.clear()
                running.reload()
    finally:
        running.stop()
    if running.deposed.is_set():
        return _stopped_deposed()
    return 0


def _stopped_deposed() -> int:
    """Say that this scheduler stopped for having lost the lead; its exit status."""
    # Not "another leads": a lease that ran out (etcd revoked it, a frozen host)
    # leaves the lead to whoever takes it first, this scheduler started again too.
    print(
        "mangonel scheduler stopped: it no longer leads its state store; started "
        "again (status 3), it takes the lead or waits as the standby",
        flush=True,
    )
    return 3
