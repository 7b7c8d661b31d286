"""Default settings, each defined once: the configs, the command line and ``LocalCluster``.

``PlannerConfig``, ``Limits``, ``CoreConfig``, ``SchedulerConfig``,
``ExecutorConfig``, the ``mangonel`` command line and ``LocalCluster`` read their
defaults from here, so that a default changed here changes everywhere. Plain
constants that import nothing: ``mangonel --help`` reads them without loading
the planner, the scheduler or the executor.
"""

from __future__ import annotations

_MIB = 1024 * 1024

# ------------------------------------------------------------------ addresses

LISTEN_HOST = "127.0.0.1"
"""The interface a scheduler and an executor's Flight server listen on unless
told (``--host``): loopback, so that nothing is exposed by default."""

SCHEDULER_PORT = 50050
"""The scheduler's gRPC port (``mangonel scheduler --port``): clients' (and
executors', without TLS)."""

SCHEDULER_ADDRESS = f"127.0.0.1:{SCHEDULER_PORT}"
"""Where clients and executors look for the scheduler unless told."""

CLUSTER_PORT = 50052
"""With TLS, the scheduler's gRPC port for executors (``--cluster-port``): mutual TLS."""

WEB_PORT = 50080
"""The scheduler's web UI, REST API and metrics port (next to gRPC's)."""

FLIGHT_SQL_PORT = 50051
"""The scheduler's Arrow Flight SQL endpoint (``--flight-sql-port``)."""

# -------------------------------------------------------------------- planner

PARTITIONS = 4
"""The most output partitions of a hash exchange."""

PARTITION_BYTES = 64 * _MIB
"""An exchange gets one partition per this many estimated bytes (up to ``PARTITIONS``)."""

BROADCAST_BYTES = 64 * _MIB
"""A join side estimated above this many bytes is never broadcast."""

SPLIT_BYTES = 192 * _MIB
"""Bytes of the scanned columns (in memory) one scan task reads, about (the
number's origin: ``PlannerConfig.split_bytes``)."""

FUSE_BYTES = SPLIT_BYTES
"""The most bytes of tables a task of fused one-task stages scans
(``PlannerConfig.fuse_bytes``): a split's worth."""

MIN_SPLIT_ROWS = 250_000
"""Scan tasks sized by ``SPLIT_BYTES`` read at least this many rows ..."""

SPREAD_BYTES = 32 * _MIB
"""Where hosts run several tasks at full speed at once, a scan of at least this
many bytes of columns a task is spread over them (``PlannerConfig.spread_bytes``).
A floor of 250k rows instead spread TPC-H q02, q11, q16 and q22 at SF1 (tens of
milliseconds on one core) and made them 1.05-1.8x slower on two hosts of one core
than on one (one run, 2026-12-04, ``benchmarks/scaleout.py``); 32 MiB leaves
them whole. 16 MiB also spread scans of 32 to 64 MiB (TPC-H q04's and q18's
``orders``, the one-task scans of 30 TPC-DS plans: 23 of the 99 ran every task on
one host, 34 at 32 MiB): on two hosts of one core, in one A/B run on a quiet machine
(2026-12-05), TPC-H 1.04 and TPC-DS 1.00 of the time, q18 1.21, TPC-DS q11 1.37,
q13 and q23 1.26; it stays 32. 64 MiB left 50 of the 99 TPC-DS plans whole or
with fewer tasks on two hosts, and took 0.99 of the time over the 99 (one A/B run
of 3, 2026-12-06, ``benchmarks/results/*-scaleout-tpcds-sf1-spread64-ab.md``: q09,
q23, q47, q65, q97 0.77-0.87, q36, q59, q63, q96 1.19-1.28); not kept either."""

MAX_SPLIT_ROWS = 4_000_000
"""... and at most this many, so that a task's output stays within a slot's memory."""

INLINE_SCAN_BYTES = 8 * _MIB
"""A small table a join broadcasts is scanned in each task of the other side
when its columns' bytes times those tasks are at most this many."""

RECOMPUTE_BYTES = 16 * _MIB
"""A one-task producer that reads only tables is computed again by each task
that reads it, instead of once in a stage of its own, while the copies beyond
the first scan at most this many bytes (``PlannerConfig.recompute_bytes``)."""

PLAN_CACHE = 256
"""Plans of recent queries the scheduler keeps for the same SQL sent again."""

UNREADABLE_TABLE_RETRY_S = 10.0
"""How often the scheduler tries again to read a table it could not read (its
object store away when the scheduler started, a write's new files whose footers
could not be read): until then, queries naming it fail saying why."""

DROP_RETRY_KEEP_S = 3600.0
"""Seconds a restarted scheduler keeps the answer to a ``DROP TABLE`` that took
effect before its job was written (``persist.StoredDrop``) for its client's
retry, and a scheduler the answer to an admin's ``DropTable`` call; a client
keeps trying for ``RECONNECT_S``."""

KEEP_JOBS = 200
"""Finished jobs the scheduler keeps for the status views (the state machine)
and in the attempt history (telemetry)."""

GRPC_MAX_MESSAGE_BYTES = 256 * _MIB
"""The largest gRPC message the scheduler, the executors and the clients send or
take: task specs list every upstream partition location, and big plans exceed
gRPC's default 4 MB."""

# ------------------------------------------------------------------ scheduler

HEARTBEAT_TIMEOUT_S = 10.0
"""Seconds of silence after which the scheduler declares an executor lost."""

SUSPECT_PHI = 8.0
"""The failure detector's phi at which a silent executor is suspected and gets
no new task (Akka's threshold; ``scheduler.detector``): with heartbeats every
0.5 s, about 2.1 s of silence. Infinite: never suspected, only lost."""

ISOLATION_GRACE_S = 30.0
"""Seconds more that losses for silence wait while most executors are silent at
once (the scheduler's own link is the likely cut: ``scheduler.state_liveness``)."""

NO_EXECUTOR_GRACE_S = 30.0
"""Seconds a job may wait with no executor alive before it fails."""

MAX_TASK_ATTEMPTS = 4
"""Failed attempts of one task before its job fails."""

MAX_TASK_RECOMPUTES = 4
"""Times one task's finished output may be lost and made again before its job
fails (per task, not per stage: a loss among many executors takes a few outputs
of every big stage, and is routine; the same output lost again and again is not)."""

UNREACHABLE_WINDOW_S = 300.0
"""Seconds over which the scheduler counts the executors whose fetches from one
holder failed (``FetchProblem.UNREACHABLE``) while the holder still heartbeats:
readers on two executors in this window make the holder lost."""

SPECULATION = True
"""Whether the scheduler runs a copy of a straggling task attempt on another
executor (speculative execution; ``BENCHMARKS.md``, "Stragglers", measured it)."""

SPECULATION_QUANTILE = 0.75
"""Fraction of a stage's tasks that must be done before its stragglers are copied
(Spark's ``spark.speculation.quantile``)."""

SPECULATION_MULTIPLIER = 1.5
"""A running attempt is a straggler once it has run this many times the median
run time of its stage's finished tasks (Spark's ``spark.speculation.multiplier``)."""

SPECULATION_MIN_S = 0.5
"""Nor before it has run this long: tasks this short are never copied (a copy
costs about as much as waiting)."""

SLOW_LINK_RATIO = 3.0
"""With speculation on, a job stops reading an executor whose outputs its readers
get at under ``1 / SLOW_LINK_RATIO`` of the others' rate, when making them
again elsewhere is sooner (``scheduler.state_links``); 0: never."""

SLOW_LINK_BACKOFF_S = 20.0
"""An executor its readers found behind a slow link gets no new task (of any
job) for this long; then it is let back on trial, and the rates measured from
its next fetches decide again: each mark in a row doubles the wait, up to
``SLOW_LINK_BACKOFF_CAP`` times this (``scheduler.state_link_marks``). Long
enough for a few jobs to run without it, short enough that a link that healed
is used again within a query or two."""

SLOW_LINK_BACKOFF_CAP = 8
"""The most a slow-link mark's back-off doubles to: this many times
``SLOW_LINK_BACKOFF_S`` (160 s with the default). A link slow for good costs
one job on trial that often; a link that healed waits at most that long."""

LINK_PROBE_INTERVAL_S = 2.0
"""Seconds between an executor's rounds of link probes: small synthetic Flight
fetches from a few peers (``executor.probes``), whose rates the scheduler judges
links by before a job reads over them (``scheduler.state_link_marks``); 0: no probes."""

LINK_PROBE_BYTES = 256 * 1024
"""Bytes one link probe streams (in ``LINK_PROBE_BATCH_BYTES`` batches): at
20 mbit about 0.1 s, past a rate limiter's burst; on a healthy link a few ms."""

LINK_PROBE_BATCH_BYTES = 16 * 1024
"""Bytes of each batch a probe streams: the first batch's arrival starts the
clock, so a probe's rate leaves out the call's latency."""

LINK_PROBE_PEERS = 2
"""Peers each executor probes per round besides those marked or on trial
(chosen by the scheduler, in turn): bounded cost on a big cluster."""

EXCLUSION_FAILURES = 3
"""Distinct tasks that must fail for execution reasons on one executor within
``EXCLUSION_WINDOW_S`` before it is excluded from new tasks (0: never)."""

EXCLUSION_WINDOW_S = 60.0
"""Seconds over which an executor's failed tasks are counted for its exclusion."""

EXCLUSION_S = 60.0
"""Seconds an excluded executor gets no new task (it still finishes its running
attempts and serves its outputs)."""

MAX_JOB_SHARE = 1.0
"""The most of the cluster's slots one job may hold (1: no cap). Below 1, a job
alone leaves slots idle, so that a job arriving later finds some free at once
even when the first one's tasks are long (tasks are never preempted)."""

ADAPTIVE = True
"""Whether a hash exchange's reader stage runs as fewer tasks when the real
sizes of its partitions turn out small (``scheduler.adaptive``)."""

ADAPTIVE_PARTITION_BYTES = PARTITION_BYTES
"""Bytes of input a coalesced reader task reads, about (the planner's own
partition size, so that a well-estimated exchange keeps its tasks)."""

ADAPTIVE_MIN_PARTITION_BYTES = 4 * _MIB
"""Coalesced reader tasks read at least this much, even where that leaves slots
idle: below it a task's fixed cost outweighs the parallelism it buys."""

RESULT_TTL_S = 600.0
"""Seconds a result no client released is kept before it is deleted."""

RESULT_RETRIES = 2
"""How often a query runs again when its result was lost before it was read (the
executor holding it died after the job finished): ``Session.sql`` and the Flight
SQL statements both keep to it."""

SHUFFLE_TICKET_TTL_S = 24 * 3600.0
"""Seconds a signed shuffle ticket stays valid (a secured cluster): a long query's
consumers must never find their inputs' tickets expired, and a re-run task gets
fresh ones. Result tickets live as long as the result (``RESULT_TTL_S``)."""

CONNECT_TIMEOUT_S = 60.0
"""Seconds a registered executor may take to open its command stream before it is
taken for dead (it died between the two calls)."""

# ------------------------------------------------------------------- executor

DRAIN_TIMEOUT_S = 30.0
"""On SIGTERM an executor finishes its tasks and serves its outputs for at most this long."""

FETCH_TIMEOUT_S = 30.0
"""Longest a Flight fetch of a shuffle partition may go without receiving
anything (an idle gap, not the whole stream): a silent or cut-off peer fails the
fetch after this long, while a large partition on a slow link that keeps
arriving is never failed for being slow. A reader whose input's executor is
declared lost does not wait it out, since the scheduler cancels it."""

CLEANUP_INTERVAL_S = 10.0
"""Seconds between an executor's sweeps of the work root for dead executors' files."""

# ------------------------------------------------------------- object storage
# Tables in S3 or an S3-compatible server (``mangonel.storage``). The endpoint,
# region and credentials come from the standard AWS variables and profiles unless
# the scheduler's or executor's ``--s3-*`` options say otherwise.

S3_CONNECT_TIMEOUT_S = 5.0
"""Seconds to wait for a connection to the object store."""

S3_REQUEST_TIMEOUT_S = 30.0
"""Seconds a request may go without receiving data before it is given up."""

S3_ATTEMPTS = 6
"""Tries of one request that failed for a reason that may pass (refused, reset,
timed out, throttled, 5xx) before the read fails."""

S3_RETRY_BACKOFF_S = 0.2
"""The first wait between tries; it doubles each time (0.2 + 0.4 + ... + 3.2 s:
about 6 s of waiting over ``S3_ATTEMPTS`` tries)."""

S3_RETRY_BACKOFF_MAX_S = 5.0
"""The longest wait between two tries."""

# ------------------------------------------------------------------- security

TOKEN_TTL_S = 12 * 3600.0
"""Seconds a token from a login (user name and password) is valid: a working
day. A session that holds the password logs in again before it runs out."""

MINTED_TOKEN_TTL_S = 30 * 24 * 3600.0
"""Seconds a token made with ``mangonel users token`` (for scripts and BI
tools, which hold no password) is valid unless ``--ttl`` says otherwise."""

LOGIN_USER_FAILURES = 5
"""Failed password logins of one user name within ``LOGIN_WINDOW_S`` after which
its logins are refused for ``LOGIN_LOCKOUT_S``: few enough that guessing a
password of ``users.MIN_PASSWORD_CHARS`` takes years, enough for typos."""

LOGIN_ADDRESS_FAILURES = 20
"""Failed password logins from one client address (any user names) within
``LOGIN_WINDOW_S`` after which its logins are refused for ``LOGIN_LOCKOUT_S``:
higher than a user's, since many people may share an address (a NAT, a BI server)."""

LOGIN_WINDOW_S = 300.0
"""Seconds over which failed logins are counted."""

LOGIN_LOCKOUT_S = 300.0
"""Seconds a user name or address that failed too often is refused."""

STATE_WAIT_S = 60.0
"""Seconds a scheduler starting waits for a state store that no server of answers
(etcd not started yet, or its name not resolving yet in a container just started)
before it gives up: a container's restart is not a crash loop."""

# --------------------------------------------------------------------- client

CONNECT_WAIT_S = 30.0
"""Seconds a client session waits for a scheduler it never reached that refuses
connections (not started yet, restarting, its standby taking over) before the
error: long enough for a scheduler's start or a failover, short enough that a
wrong address fails soon (the command line says that it waits, and for whom)."""

RECONNECT_S = 60.0
"""Seconds a client session keeps trying once a scheduler answered and then none
does (a restart, a failover, a cut link) before the error."""

KEEP_JOBS_S = 2 * RECONNECT_S
"""Seconds a finished job is kept after it ended, however many ended since
(``KEEP_JOBS`` bounds only those older): its client learns how it ended by
asking, and a client cut off by a restart asks again for ``RECONNECT_S``. A job
forgotten in the event that failed it, with the scheduler dying before it said
so, was gone when the client asked the restarted one (the whole-cluster
simulation, seed 6000394: two jobs of four failed at once, two settled jobs kept)."""

# -------------------------------------------------------------- local cluster

LOCAL_EXECUTORS = 2
"""Executor processes of a ``LocalCluster`` (``mangonel standalone``, ``demo``)."""

LOCAL_HEARTBEAT_TIMEOUT_S = 5.0
"""The heartbeat timeout of a ``LocalCluster`` and of ``mangonel standalone``
(shorter than a lone scheduler's ``HEARTBEAT_TIMEOUT_S``)."""

# -------------------------------------------------------------------- catalog

SCHEMA = "main"
"""The one schema the registered tables live in, as SQL tools see it (the SQLAlchemy
dialect lists it; it is DuckDB's default schema): ``main.orders`` is ``orders``."""
