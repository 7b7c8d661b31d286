"""Events into and commands out of the scheduler's pure state machine.

Events are facts that happened (past tense); commands are what the I/O shell
must do (imperative). The state machine (``scheduler.state``) consumes events
through one entry point, ``SchedulerState.handle(event) -> list[Command]``; it
owns no sockets, no database and no clock: every event carries its time.

Every event carries an ``event_id`` (assigned by the shell, increasing) and every
command carries the ``cause`` id of the event that produced it, so a task's
story can be rebuilt from the log.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mangonel import defaults
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.plan.physical import DistributedPlan, FileSplit, InputMode, OutputSpec

# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class ExecutorInfo:
    """What an executor says about itself when it registers."""

    id: ExecutorId
    host: str
    """Host identity: two executors on one host read each other's files by path."""
    flight_address: str
    """``host:port`` of its Arrow Flight server."""
    slots: int


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


@dataclass(frozen=True)
class InputLocations:
    """A stage input as resolved for one task: the files it must read."""

    name: str
    stage: StageId
    mode: InputMode
    locations: tuple[PartitionLocation, ...]
    columns: tuple[str, ...]
    """The upstream stage's column names (for an empty input: its schema)."""


@dataclass(frozen=True)
class SideScan:
    """A table (a small one whole, or the row groups of a join by key range) a task
    reads under ``name`` (see ``Stage.side_scans``)."""

    name: str
    table: str
    columns: tuple[str, ...]
    splits: tuple[FileSplit, ...]


@dataclass(frozen=True)
class TaskSpec:
    """Everything an executor needs to run one task attempt."""

    attempt: TaskAttemptId
    sql: str
    output: OutputSpec
    columns: tuple[str, ...]
    scan_name: str | None = None
    scan_table: str | None = None
    scan_columns: tuple[str, ...] = ()
    scan_splits: tuple[FileSplit, ...] = ()
    inputs: tuple[InputLocations, ...] = ()
    side_scans: tuple[SideScan, ...] = ()


# ------------------------------------------------------------------ failure reasons


class LossReason(enum.Enum):
    """Why the scheduler stopped counting on an executor."""

    CONNECTION_LOST = "connection lost"
    HEARTBEAT_TIMEOUT = "heartbeat timeout"
    FETCH_FAILURES = "fetch failures"
    DRAINED = "drained"
    PROCESS_EXITED = "process exited"


@dataclass(frozen=True)
class QueryError:
    """The task's SQL failed in a way a retry cannot fix (bad query, type error)."""

    message: str


@dataclass(frozen=True)
class ExecutionError:
    """The task failed for a reason a retry may fix (out of memory, I/O)."""

    message: str


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


TaskFailure = QueryError | ExecutionError | FetchFailed

# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Event:
    event_id: int
    time: float


@dataclass(frozen=True)
class JobSubmitted(Event):
    job: JobId
    plan: DistributedPlan


@dataclass(frozen=True)
class JobCancelled(Event):
    job: JobId
    reason: str = "cancelled by the user"


@dataclass(frozen=True)
class ExecutorRegistered(Event):
    executor: ExecutorInfo


@dataclass(frozen=True)
class ExecutorHeartbeat(Event):
    executor: ExecutorId


@dataclass(frozen=True)
class ExecutorDraining(Event):
    executor: ExecutorId


@dataclass(frozen=True)
class ExecutorLost(Event):
    executor: ExecutorId
    reason: LossReason
    detail: str = ""


@dataclass(frozen=True)
class TaskCompleted(Event):
    attempt: TaskAttemptId
    executor: ExecutorId
    outputs: tuple[PartitionOutput, ...]


@dataclass(frozen=True)
class TaskFailed(Event):
    attempt: TaskAttemptId
    executor: ExecutorId
    failure: TaskFailure


@dataclass(frozen=True)
class Tick(Event):
    """Time passed; lets timeouts fire (heartbeats, no-executor grace)."""


@dataclass(frozen=True)
class SchedulerRecovered(Event):
    """The scheduler restarted and reloaded its state from its store.

    Attempts that were running are given up on (their executors learn of the
    restart when their command stream breaks, and stop them): their tasks go
    back to pending without charging an attempt. Every live executor waits to
    reattach, taking no task, for up to the heartbeat timeout; its outputs
    count as held until then.
    """


@dataclass(frozen=True)
class ExecutorReattached(Event):
    """A live executor of the scheduler's previous run reconnected under its id.

    ``held`` are the paths of the output files it still has; finished tasks
    whose outputs it no longer has are made again.
    """

    executor: ExecutorInfo
    held: frozenset[str]


# ------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Command:
    cause: int
    """``event_id`` of the event that produced this command."""


@dataclass(frozen=True)
class LaunchTask(Command):
    executor: ExecutorId
    task: TaskSpec


@dataclass(frozen=True)
class CancelTask(Command):
    executor: ExecutorId
    attempt: TaskAttemptId


@dataclass(frozen=True)
class JobSucceeded(Command):
    job: JobId
    result: tuple[PartitionLocation, ...]
    """The final stage's output partitions, in partition order."""


@dataclass(frozen=True)
class JobFailed(Command):
    job: JobId
    message: str
    """Says what failed (which task, executor, why, how many attempts) and what to do."""


@dataclass(frozen=True)
class DeclareExecutorLost(Command):
    """The state machine decided an executor is lost (e.g. heartbeat timeout)."""

    executor: ExecutorId
    reason: LossReason


@dataclass(frozen=True)
class ReleaseOutputs(Command):
    """Shuffle files of a job on this executor are no longer needed.

    ``stages`` names the stages whose files may go; ``None`` means all of the job's.
    On success the final stage's files are kept until the client has read them
    (the shell releases them then, or after a time-to-live).
    """

    executor: ExecutorId
    job: JobId
    stages: tuple[StageId, ...] | None = None


@dataclass(frozen=True)
class Limits:
    """Bounds that keep recovery from looping."""

    max_task_attempts: int = defaults.MAX_TASK_ATTEMPTS
    max_stage_reruns: int = defaults.MAX_STAGE_RERUNS
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S
    no_executor_grace_s: float = defaults.NO_EXECUTOR_GRACE_S
