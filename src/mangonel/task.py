"""The task vocabulary: what the scheduler, the executors, the client and the wire share.

A bottom-layer module (it imports only ``mangonel.ids`` and ``mangonel.errors``):
the scheduler and the executor never import each other, and meet here, in
``proto`` and in ``plan``.

* What a task reads and writes: ``FileSplit`` (part of a Parquet file, or a
  byte range of a CSV or JSON file read as its ``TextFormat`` says),
  ``ScanSpec`` (a table read under a name), ``InputMode`` and ``InputLocations``
  (another stage's output files), ``OutputKind`` / ``OutputSpec`` (how a task
  splits its result), ``TaskSpec`` (one attempt, everything an executor needs).
* What a task leaves: ``PartitionOutput`` (a file it wrote) and, once the
  scheduler knows where, ``PartitionLocation``.
* Why an attempt failed, typed: ``QueryError`` (no retry can help: the query's
  own operations, or a table's object), ``FragmentRejected`` (the planner's SQL),
  ``ExecutionError`` (a retry may help; ``ExecutionProblem`` says whether memory or
  disk ran out); the first and the last name the error the job would end with
  (``errors.ErrorType``),
  ``FetchFailed`` (an upstream output could not be read; ``FetchProblem`` says
  whether its executor or only that file is gone).
* What an executor is: ``ExecutorInfo``; and the orders the scheduler sends it over
  its command stream: ``LaunchTask``, ``CancelTask``, ``ReleaseOutputs``
  (``ExecutorCommand``).
* Where an attempt's time went on its executor, as its report says: ``TaskTimings``.
* What an executor's fetches received from a peer, in its heartbeat: ``LinkSample``.
"""

from __future__ import annotations

import builtins
import enum
from dataclasses import dataclass

from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId

# ----------------------------------------------------------------- what a task reads


class InputMode(enum.Enum):
    """How a stage's tasks read an upstream stage's output."""

    PARTITION = "partition"
    """Task *i* reads partition *i* of every upstream map task."""
    ALL = "all"
    """Every task reads every partition of every upstream map task."""


class OutputKind(enum.Enum):
    """How a task splits its result into output partitions."""

    HASH = "hash"
    SINGLE = "single"


class FileFormat(enum.Enum):
    """How a table's files are written."""

    PARQUET = "parquet"
    CSV = "csv"
    JSON = "json"
    """Newline-delimited JSON: one object a line."""


class Compression(enum.Enum):
    """How a CSV or JSON file is compressed; ``AUTO``: by its name's suffix."""

    AUTO = "auto"
    NONE = "none"
    GZIP = "gzip"
    ZSTD = "zstd"


@dataclass(frozen=True)
class TextFormat:
    """How to read a CSV or newline-delimited JSON file: what the catalog fixed at
    register (``mangonel.textfiles``), the same for every task of every executor.

    ``columns`` are the table's columns and their DuckDB types, declared or
    inferred once from a sample: no task infers anything.
    """

    format: FileFormat
    columns: tuple[tuple[str, str], ...]
    header: bool = True
    delimiter: str = ","
    quote: str = '"'
    escape: str = '"'
    null: str = ""
    compression: Compression = Compression.AUTO
    ignore_errors: bool = False
    """Skip CSV rows and JSON lines that do not parse (a JSON value that does not
    convert reads as NULL); else such a row fails the query, naming its file and line."""
    multiline: bool = False
    """Quoted CSV fields may hold newlines: each file is read whole by one task."""
    dateformat: str = ""
    """CSV: the ``strptime`` format of DATE values (empty: ISO 8601, DuckDB's)."""
    timestampformat: str = ""
    """CSV: the ``strptime`` format of TIMESTAMP values (empty: ISO 8601, DuckDB's)."""


@dataclass(frozen=True)
class FileSplit:
    """Part of one Parquet file: some of its row groups (all when empty).

    Or, where ``text`` is set, part of a CSV or JSON file: the lines that begin
    at a byte in ``[start, stop)`` (``stop`` 0: the whole file), as Hadoop's
    line reader splits text; ``row_groups`` then number the catalog's chunks.

    A file in object storage (``s3://bucket/key``) also carries what the catalog
    saw of it at register, ``object_size`` and ``version`` (its ETag): a task
    that finds another object there fails rather than read rows of a different
    table (``storage.ObjectFile``).
    """

    path: str
    row_groups: tuple[int, ...] = ()
    rows: int = 0
    bytes: int = 0
    object_size: int = 0
    version: str = ""
    start: int = 0
    stop: int = 0
    text: TextFormat | None = None


@dataclass(frozen=True)
class OutputSpec:
    """How each task of a stage partitions what it produces."""

    kind: OutputKind
    partitions: int = 1
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind is OutputKind.SINGLE and (self.partitions != 1 or self.keys):
            raise ValueError("a SINGLE output has one partition and no keys")
        if self.kind is OutputKind.HASH and (self.partitions < 1 or not self.keys):
            raise ValueError("a HASH output needs keys and at least one partition")


@dataclass(frozen=True)
class ScanSpec:
    """A Parquet table a task reads under ``name``: its ``splits``, only ``columns``.

    A task's first scan is its stage's own (its share of the table's row groups);
    the others are tables it scans beside it: a small one whole, or the row groups
    of a join by key range that its own rows may meet (``plan.physical.Stage``).
    """

    name: str
    table: str
    columns: tuple[str, ...]
    splits: tuple[FileSplit, ...]


# ------------------------------------------------------------- what a task leaves


@dataclass(frozen=True)
class ExecutorInfo:
    """What an executor says about itself when it registers."""

    id: ExecutorId
    host: str
    """Host identity: two executors on one host read each other's files by path."""
    flight_address: str
    """``host:port`` of its Arrow Flight server."""
    slots: int
    cores: int = 0
    """The cores its tasks share, as it counts them (its host's); 0: unknown."""
    threads: int = 0
    """DuckDB threads each slot's task uses; 0: unknown."""


@dataclass(frozen=True)
class PartitionOutput:
    """One output partition file written by a finished task attempt."""

    partition: int
    path: str
    """Path on the executor's host; also the Flight ticket (the executor validates it)."""
    rows: int
    bytes: int
    checksum: str


@dataclass(frozen=True)
class PartitionLocation:
    """Where a consumer finds one map output partition."""

    executor: ExecutorId
    host: str
    flight_address: str
    stage: StageId
    map_partition: int
    partition: int
    path: str
    rows: int
    bytes: int
    checksum: str
    ticket: str = ""
    """The signed Flight ticket of the file (``security.tickets``), set on the wire
    only, in a cluster with a secret; empty: the path is the ticket."""

    @property
    def flight_ticket(self) -> builtins.bytes:
        """What a reader presents to the Flight server for this file."""
        return (self.ticket or self.path).encode()


@dataclass(frozen=True)
class InputLocations:
    """A stage input as resolved for one task: the files it must read."""

    name: str
    stage: StageId
    mode: InputMode
    locations: tuple[PartitionLocation, ...]
    columns: tuple[str, ...]
    """The upstream stage's column names (for an empty input: its schema)."""


class WriteFormat(enum.Enum):
    """The file format a write statement produces."""

    PARQUET = "parquet"
    CSV = "csv"
    JSON = "json"

    @property
    def extension(self) -> str:
        return self.value


class WriteCompression(enum.Enum):
    """How a written file is compressed (``COPY ... (COMPRESSION c)``): Parquet takes
    each (per column chunk); CSV and JSON take ``GZIP``, ``ZSTD`` (the whole file,
    ``.gz`` / ``.zst``) and ``UNCOMPRESSED``."""

    UNCOMPRESSED = "uncompressed"
    SNAPPY = "snappy"
    GZIP = "gzip"
    ZSTD = "zstd"


@dataclass(frozen=True)
class WriteOptions:
    """How a ``COPY``'s files are written beyond their format, as DuckDB's ``COPY``
    takes them; the defaults are DuckDB's (Snappy Parquet, plain CSV and JSON, a
    header line, ``,``, ``"`` and ISO dates in CSV, DuckDB's row groups)."""

    compression: WriteCompression | None = None
    """``None``: the format's default."""
    row_group_size: int | None = None
    """Parquet only: rows per row group (``None``: DuckDB's 122,880)."""
    header: bool = True
    """CSV only: a first line naming the columns."""
    delimiter: str = ","
    """CSV only: the one character between values."""
    quote: str | None = None
    """CSV only: the character that quotes a value (``None``: DuckDB's ``"``; empty:
    no value is quoted)."""
    escape: str | None = None
    """CSV only: the character written before a quote inside a quoted value
    (``None``: DuckDB's, the quote itself; empty: none)."""
    null: str | None = None
    """CSV only: the text a NULL is written as (``None``: DuckDB's, nothing)."""
    dateformat: str | None = None
    """CSV only: the ``strftime`` format DATE values are written in (``None``: ISO 8601)."""
    timestampformat: str | None = None
    """CSV only: the ``strftime`` format TIMESTAMP values are written in (``None``: ISO 8601)."""


@dataclass(frozen=True)
class SinkSpec:
    """Where a task of a writing stage puts its rows instead of passing them on.

    The task writes its rows as ``format`` files (hive directories by
    ``partition_by``) under ``staging``, the directory only its attempt writes
    (``output.attempt_staging``), and its own output is one row: how many it wrote.
    """

    target: str
    format: WriteFormat
    staging: str
    columns: tuple[str, ...]
    """The written files' column names (the statement's, not the stage's)."""
    partition_by: tuple[str, ...] = ()
    options: WriteOptions = WriteOptions()


@dataclass(frozen=True)
class TaskSpec:
    """Everything an executor needs to run one task attempt.

    ``scans`` are the Parquet tables it reads (its stage's own scan first, when
    the stage has one), ``inputs`` the upstream stages' files; ``sql`` names both.
    ``job_files`` are the files of every table in the catalog its job was planned
    against (``DistributedPlan.readable_files``) and those its job scans: the
    executor's scan database for the task may read them all (and no other), so one
    database per slot serves every scan task of every job over that catalog
    (``executor.databases.ScanDatabases``). Empty: only the task's own
    files. ``result``: its stage is the job's final one, whose small outputs go
    with the task's report (the client reads them from the job's final status).
    """

    attempt: TaskAttemptId
    sql: str
    output: OutputSpec
    columns: tuple[str, ...]
    scans: tuple[ScanSpec, ...] = ()
    inputs: tuple[InputLocations, ...] = ()
    job_files: tuple[str, ...] = ()
    result: bool = False
    sink: SinkSpec | None = None
    """Set on the tasks of a write statement's writing stage."""
    whole_query: bool = False
    """Its stage runs the user's query whole (``Stage.whole_query``): DuckDB orders
    its joins itself."""


# ------------------------------------------------------------------ failure reasons


@dataclass(frozen=True)
class QueryError:
    """The task failed in a way a retry cannot fix: the job fails at once.

    ``error_type`` says whose fault: ``QUERY``, the query's own operations on the
    data (a conversion, an overflow); or one of the object store's, a table's
    object gone, changed, refused or no longer Parquet (the same object meets
    every attempt).
    """

    message: str
    error_type: ErrorType = ErrorType.QUERY


class ExecutionProblem(enum.Enum):
    """What ran out when a task failed with an ``ExecutionError``."""

    OTHER = "other"
    """An I/O or internal error, an injected fault: nothing more is known."""
    OUT_OF_MEMORY = "out of memory"
    """The task needed more memory than its slot's share of the executor's budget."""
    DISK_FULL = "disk full"
    """The executor's work directory (shuffle files, spill) had no room left; the
    executor takes no task until space returns."""


@dataclass(frozen=True)
class FragmentRejected:
    """DuckDB refused the task's SQL itself (binder, parser, catalog errors).

    That SQL is mangonel's: the planner wrote it, and the user's query bound in
    DuckDB as a whole before it was planned. So it is a bug in mangonel, not in
    the query, and a retry cannot fix it.
    """

    message: str


@dataclass(frozen=True)
class ExecutionError:
    """The task failed for a reason a retry may fix (out of memory, I/O).

    ``error_type``: the error the job ends with if no attempt succeeds
    (``OBJECT_STORE_UNAVAILABLE`` for a store that did not answer; else
    ``JOB_FAILED``).
    """

    message: str
    problem: ExecutionProblem = ExecutionProblem.OTHER
    error_type: ErrorType = ErrorType.JOB_FAILED


class FetchProblem(enum.Enum):
    """What a failed fetch says about the executor that held the output."""

    UNREACHABLE = "unreachable"
    """The executor did not answer (refused, reset, timed out) after a few tries:
    it is taken for lost, and with it every output it held."""
    OUTPUT_LOST = "output lost"
    """The executor answered, but this one output is missing or fails its
    checksum: only that map output is made again; the executor stays."""


@dataclass(frozen=True)
class FetchFailed:
    """A task could not read an upstream output: exactly that output is lost."""

    executor: ExecutorId
    stage: StageId
    map_partition: int
    message: str
    problem: FetchProblem = FetchProblem.UNREACHABLE


TaskFailure = QueryError | FragmentRejected | ExecutionError | FetchFailed


# ------------------------------------------------------ orders to one executor


@dataclass(frozen=True)
class ExecutorCommand:
    """An order the scheduler sends one executor over its command stream."""

    cause: int
    """``event_id`` of the scheduler event that produced this order."""
    executor: ExecutorId


@dataclass(frozen=True)
class LaunchTask(ExecutorCommand):
    task: TaskSpec
    speculative: bool = False
    """A copy of a straggling attempt that still runs elsewhere (the executor runs
    it like any other; the scheduler keeps whichever finishes first)."""


@dataclass(frozen=True)
class CancelTask(ExecutorCommand):
    attempt: TaskAttemptId


@dataclass(frozen=True)
class ReleaseOutputs(ExecutorCommand):
    """Shuffle files of a job on this executor are no longer needed.

    ``stages`` names the stages whose files may go; ``None`` means all of the job's.
    On success the final stage's files are kept until the client has read them
    (the shell releases them then, or after a time-to-live).
    """

    job: JobId
    stages: tuple[StageId, ...] | None = None


# ------------------------------------------------- where an attempt's time went


@dataclass(frozen=True)
class TaskTimings:
    """Where one attempt's time went on its executor, sent with its report.

    ``*_at`` are Unix times of the executor's host (``time.time()``): set against
    the scheduler's own (launch, report), they are as exact as the hosts' clocks
    agree, which on one host they do. The ``*_s`` phases are measured on the slot's
    thread with a monotonic clock, one after the other, so they never overlap and
    add up to at most ``ended_at - started_at`` (the rest is ``other_s``):

    * ``setup_s``: the scan database, the scans' SQL, inputs registered in DuckDB;
    * ``fetch_s``: the upstream partitions read before DuckDB starts: over Flight
      (transfer, and spooling to disk; ``fetch_remote_s`` of it) or memory-mapped
      on this host (checksum);
    * ``execute_s``: DuckDB planning the fragment and making its rows (reading
      the registered inputs: an Arrow IPC file on a memory map is read in place);
    * ``write_s``: the rows split into partitions, encoded as Arrow IPC, written and
      renamed into place; ``write_io_s`` of it in the file writes and their CRC;
    * ``cleanup_s``: inputs unregistered, memory handed back.
    """

    received_at: float
    """The ``LaunchTask`` reached the executor."""
    started_at: float
    """A slot began it."""
    ended_at: float
    """It ended on its slot, before its report went out."""
    setup_s: float = 0.0
    fetch_s: float = 0.0
    execute_s: float = 0.0
    write_s: float = 0.0
    cleanup_s: float = 0.0
    fetch_remote_s: float = 0.0
    write_io_s: float = 0.0
    fetched_local_bytes: int = 0
    """Bytes of upstream partitions read from this host's disk."""
    fetched_remote_bytes: int = 0
    """Bytes of upstream partitions fetched from other hosts over Flight."""

    @property
    def run_s(self) -> float:
        """Its time on the slot."""
        return max(0.0, self.ended_at - self.started_at)

    @property
    def other_s(self) -> float:
        """Time on the slot outside the phases (the slot's own bookkeeping)."""
        phases = self.setup_s + self.fetch_s + self.execute_s + self.write_s + self.cleanup_s
        return max(0.0, self.run_s - phases)


@dataclass(frozen=True)
class ProbeTarget:
    """A peer an executor is to probe the link from (``executor.probes``), as the
    scheduler names it in a heartbeat's answer."""

    executor: ExecutorId
    flight_address: str


@dataclass(frozen=True)
class LinkSample:
    """What one executor's Flight fetches received from one peer between two of
    its heartbeats: how fast that peer's outbound link serves it.

    ``busy_s`` counts the seconds during which at least one fetch from ``peer``
    was open (two at once count once), so ``bytes / busy_s`` is the rate this
    reader got from that peer while it was reading from it.
    """

    peer: ExecutorId
    bytes: int
    busy_s: float

    @property
    def rate(self) -> float:
        """Bytes per second while busy; 0 when it was not busy at all."""
        return self.bytes / self.busy_s if self.busy_s > 0 else 0.0
