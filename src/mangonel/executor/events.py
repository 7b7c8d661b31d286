"""The executor state machine's vocabulary: the events it handles, the actions it returns.

Events (past tense) are what happened: an answer of the scheduler, an order on
the command stream, a task thread's news, a signal. Actions (imperative) are
what ``executor.service`` must do; several answer with the event named in their
docstring. Both name the life (``executor``) and, for a task, the attempt, so
one attempt's story can be read from a log of them. ``executor.state`` says
which event leads to which action.
"""

from __future__ import annotations

from dataclasses import dataclass

from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.task import PartitionOutput, TaskFailure, TaskSpec, TaskTimings

# ---------------------------------------------------------------------- events


@dataclass(frozen=True)
class ServiceStarted:
    """The service is up (Flight server, slots): time to register."""


@dataclass(frozen=True)
class Registered:
    """The scheduler answered a ``Register``: this life's id."""

    executor: ExecutorId
    resumed: bool
    """It took back the life that asked to resume, files and all."""


@dataclass(frozen=True)
class RegistrationFailed:
    """The scheduler could not be reached (or refused); ``Register`` failed."""


@dataclass(frozen=True)
class HomeClaimed:
    """The new life's directory is ours (``ClaimHome`` done)."""

    executor: ExecutorId


@dataclass(frozen=True)
class HomeClaimFailed:
    """``ClaimHome`` failed: the life cannot keep files, so it is given up."""

    executor: ExecutorId


@dataclass(frozen=True)
class Connected:
    """The life's command stream is open."""

    executor: ExecutorId


@dataclass(frozen=True)
class ConnectFailed:
    """``Connect`` could not open the stream."""

    executor: ExecutorId


@dataclass(frozen=True)
class StreamEnded:
    """The life's command stream ended: broken, cancelled here, or closed by the scheduler."""

    executor: ExecutorId


@dataclass(frozen=True)
class WaitEnded:
    """A ``Wait`` is over (or was cut short by a stop)."""


@dataclass(frozen=True)
class TaskLaunched:
    """Order ``LaunchTask`` arrived on the stream of life ``executor``."""

    executor: ExecutorId
    spec: TaskSpec


@dataclass(frozen=True)
class CancelRequested:
    """Order ``CancelTask`` arrived on the stream of life ``executor``."""

    executor: ExecutorId
    attempt: TaskAttemptId


@dataclass(frozen=True)
class OutputsReleased:
    """Order ``ReleaseOutputs`` arrived: ``stages`` of ``job`` (all when ``None``)."""

    executor: ExecutorId
    job: JobId
    stages: tuple[StageId, ...] | None


@dataclass(frozen=True)
class SlotTaken:
    """A task thread holding slot ``slot`` picked up a queued attempt."""

    attempt: TaskAttemptId
    slot: int


@dataclass(frozen=True)
class Completed:
    """The attempt wrote and committed these output files."""

    outputs: tuple[PartitionOutput, ...]


@dataclass(frozen=True)
class Failed:
    """The attempt failed; ``failure`` says why (typed)."""

    failure: TaskFailure


@dataclass(frozen=True)
class Stopped:
    """The attempt stopped because it was cancelled."""


TaskOutcome = Completed | Failed | Stopped


@dataclass(frozen=True)
class TaskFinished:
    """A started attempt ended on its slot; ``elapsed_s`` measured by the shell."""

    attempt: TaskAttemptId
    outcome: TaskOutcome
    elapsed_s: float = 0.0
    timings: TaskTimings | None = None
    """Where its time went (the report carries it)."""


@dataclass(frozen=True)
class DrainRequested:
    """This executor is to leave the cluster gracefully (SIGTERM)."""


@dataclass(frozen=True)
class DrainUndelivered:
    """``TellDrain`` failed: the scheduler cannot be told."""

    executor: ExecutorId


@dataclass(frozen=True)
class StopRequested:
    """Stop now: end the stream, cancel every task, do not register again."""


@dataclass(frozen=True)
class HeartbeatRefused:
    """The scheduler answered a heartbeat of ``executor``: unknown executor."""

    executor: ExecutorId


@dataclass(frozen=True)
class LinkRecovered:
    """A heartbeat of ``executor`` was answered after failed ones: the link to
    the scheduler is back, and its command stream's connection went through the
    failure (what the scheduler pushed on it may wait for TCP's back-off)."""

    executor: ExecutorId


@dataclass(frozen=True)
class SlotsClosed:
    """The task threads are shut down: nothing runs, nothing queued will start."""


Event = (
    ServiceStarted
    | Registered
    | RegistrationFailed
    | HomeClaimed
    | HomeClaimFailed
    | Connected
    | ConnectFailed
    | StreamEnded
    | WaitEnded
    | TaskLaunched
    | CancelRequested
    | OutputsReleased
    | SlotTaken
    | TaskFinished
    | DrainRequested
    | DrainUndelivered
    | StopRequested
    | HeartbeatRefused
    | LinkRecovered
    | SlotsClosed
)


# --------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Register:
    """Register with the scheduler; with ``resume``, ask to go on with that life.

    The shell adds the outputs that life still holds (read from its home).
    Answer with ``Registered`` or ``RegistrationFailed``.
    """

    resume: ExecutorId | None


@dataclass(frozen=True)
class ClaimHome:
    """Claim ``<work root>/<executor>``; answer ``HomeClaimed`` / ``HomeClaimFailed``."""

    executor: ExecutorId


@dataclass(frozen=True)
class Connect:
    """Open the life's stream: ``Connected`` or ``ConnectFailed``, then its orders
    (``TaskLaunched``, ``CancelRequested``, ``OutputsReleased``), then ``StreamEnded``."""

    executor: ExecutorId


@dataclass(frozen=True)
class Wait:
    """Back off for ``delay_s`` (cut short by a stop), then ``WaitEnded``."""

    delay_s: float


@dataclass(frozen=True)
class Exit:
    """The control loop returns: stopped, or drained."""


@dataclass(frozen=True)
class CancelStream:
    """End the stream of ``executor`` from this side (``StreamEnded`` follows)."""

    executor: ExecutorId


@dataclass(frozen=True)
class MoveStream:
    """Open a new stream of ``executor`` on a new connection, saying what it
    ``holding`` (queued or running, not cancelled) and ``finished`` lately;
    once the scheduler accepted it, it replaces the old one, which is ended from
    this side (no ``StreamEnded``: the life goes on). When it cannot be opened
    the old one stays."""

    executor: ExecutorId
    holding: frozenset[TaskAttemptId]
    finished: frozenset[TaskAttemptId]


@dataclass(frozen=True)
class QueueTask:
    """Hand the attempt to the task threads; one sends ``SlotTaken`` when it has a slot."""

    executor: ExecutorId
    spec: TaskSpec


@dataclass(frozen=True)
class StartTask:
    """Run the attempt on ``slot`` (the thread that sent ``SlotTaken``), then ``TaskFinished``."""

    executor: ExecutorId
    attempt: TaskAttemptId
    slot: int


@dataclass(frozen=True)
class InterruptTask:
    """Cancel the attempt running on ``slot`` (its runner raises ``TaskCancelledError``)."""

    executor: ExecutorId
    attempt: TaskAttemptId
    slot: int


@dataclass(frozen=True)
class ReportCompleted:
    executor: ExecutorId
    attempt: TaskAttemptId
    outputs: tuple[PartitionOutput, ...]
    elapsed_s: float
    timings: TaskTimings | None = None


@dataclass(frozen=True)
class ReportFailed:
    executor: ExecutorId
    attempt: TaskAttemptId
    failure: TaskFailure
    elapsed_s: float
    timings: TaskTimings | None = None


@dataclass(frozen=True)
class DeleteOutputs:
    """Delete the life's files of ``stages`` of ``job`` (all its stages when ``None``)."""

    executor: ExecutorId
    job: JobId
    stages: tuple[StageId, ...] | None


@dataclass(frozen=True)
class DeleteLifeDir:
    """Delete the life's home and forget its outputs: the life is over."""

    executor: ExecutorId


@dataclass(frozen=True)
class TellDrain:
    """Tell the scheduler that ``executor`` leaves; ``DrainUndelivered`` if it cannot."""

    executor: ExecutorId


@dataclass(frozen=True)
class Stop:
    """Stop the service now (the shell's ``stop()``, which sends ``StopRequested``)."""


Action = (
    Register
    | ClaimHome
    | Connect
    | Wait
    | Exit
    | CancelStream
    | MoveStream
    | QueueTask
    | StartTask
    | InterruptTask
    | ReportCompleted
    | ReportFailed
    | DeleteOutputs
    | DeleteLifeDir
    | TellDrain
    | Stop
)
