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
from mangonel.ids import ExecutorId, JobId, TaskAttemptId
from mangonel.plan.physical import DistributedPlan
from mangonel.task import (
    ExecutorCommand,
    ExecutorInfo,
    PartitionLocation,
    PartitionOutput,
    TaskFailure,
)

# ------------------------------------------------------------------ failure reasons


class LossReason(enum.Enum):
    """Why the scheduler stopped counting on an executor."""

    CONNECTION_LOST = "connection lost"
    HEARTBEAT_TIMEOUT = "heartbeat timeout"
    FETCH_FAILURES = "fetch failures"
    DRAINED = "drained"
    PROCESS_EXITED = "process exited"


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
class SchedulerCommand:
    """A command the shell carries out itself (the orders it sends executors are
    ``task.ExecutorCommand``s: ``LaunchTask``, ``CancelTask``, ``ReleaseOutputs``)."""

    cause: int
    """``event_id`` of the event that produced this command."""


@dataclass(frozen=True)
class JobSucceeded(SchedulerCommand):
    job: JobId
    result: tuple[PartitionLocation, ...]
    """The final stage's output partitions, in partition order."""


@dataclass(frozen=True)
class JobFailed(SchedulerCommand):
    job: JobId
    message: str
    """Says what failed (which task, executor, why, how many attempts) and what to do."""


@dataclass(frozen=True)
class DeclareExecutorLost(SchedulerCommand):
    """The state machine decided an executor is lost (e.g. heartbeat timeout)."""

    executor: ExecutorId
    reason: LossReason


Command = ExecutorCommand | SchedulerCommand
"""Everything ``SchedulerState.handle`` returns; every command has a ``cause``."""


@dataclass(frozen=True)
class Limits:
    """Bounds that keep recovery from looping."""

    max_task_attempts: int = defaults.MAX_TASK_ATTEMPTS
    max_stage_reruns: int = defaults.MAX_STAGE_RERUNS
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S
    no_executor_grace_s: float = defaults.NO_EXECUTOR_GRACE_S
