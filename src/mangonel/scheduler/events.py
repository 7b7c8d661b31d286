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
from dataclasses import dataclass, field

from mangonel import defaults
from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.plan.physical import DistributedPlan, WriteTarget
from mangonel.task import (
    ExecutorCommand,
    ExecutorInfo,
    LinkSample,
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


class HealthChange(enum.Enum):
    """What the failure detector decided about an executor, or about the scheduler's
    own link (``scheduler.state_liveness``)."""

    SUSPECTED = "suspected"
    """Its silence is improbable: no new task; its running attempts are copied."""
    HEDGED = "suspected before the detector (work waits on it)"
    """Silent while the others are heard, for as long as redoing what waits on it
    takes (``state_liveness.hedge``): suspected, as above, before phi says so."""
    RELAPSED = "suspected again soon after a long silence"
    """Silent again for 2.5 beats within ``FLAP_WINDOW_S`` of a long silence,
    while the others are heard (``state_liveness.judge``): suspected, as above,
    before phi says so."""
    TRUSTED = "trusted again"
    """A suspected executor was heard from."""
    QUARANTINED = "quarantined"
    """A flapping link: no new task for a while, its outputs still served."""
    ISOLATED = "isolated"
    """Most executors are silent at once: the scheduler takes itself for cut off."""
    RECONNECTED = "reconnected"
    """The isolation is over: enough executors are heard again."""
    SET_ASIDE = "suspected, its needed outputs made again"
    """Suspected while a trusted executor had a free slot: the outputs jobs need
    that it holds are made again elsewhere; its again if it is trusted first."""
    MOVED = "quarantined, its needed outputs made again"
    """Quarantined while a trusted executor had a slot: the outputs jobs need
    that it holds are made again elsewhere, never its again."""
    LAGGING = "commands held up"
    """Its heartbeats say it runs fewer attempts than were launched on it
    ``STREAM_LAG_S`` before, twice in a row: the command stream is stuck behind
    a cut (TCP's back-off). No new task; its running attempts are copied."""
    CAUGHT_UP = "commands through again"
    """A lagging executor's heartbeat counts every attempt launched on it."""
    SLOW_LINK = "slow link, a job stops reading it"
    """Readers of its outputs get a small share of the others' rate: a job
    makes its outputs again elsewhere and stops using it (``state_links``)."""
    LINK_MARKED = "slow link, no new task of any job for a while"
    """Its readers get a small share of the others' rate from it: no job places
    a task on it until its back-off ends (``state_link_marks``)."""
    LINK_ON_TRIAL = "slow link's back-off over, tried again"
    """Its back-off ended: it takes tasks again, and the rates of its next
    fetches decide whether it is marked again."""
    LINK_HEALED = "link fast again"
    """On trial, its readers found it as fast as the others: trusted, its
    back-off starts from the beginning again."""
    STREAM_MOVED = "command stream moved to a new connection"
    """Its link came back after a failure and it opened a new command stream:
    the old one is closed (not a loss), the launches it may have held sent again
    (``scheduler.state_streams``)."""
    CAME_BACK = "came back after it was lost"
    """A false loss: an executor declared lost asked to resume its id, alive
    (``scheduler.state_revival``); counted (``false_losses_total``)."""


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
class WriteCommitted(Event):
    """The shell committed a write statement's output (``CommitWrite``): it is visible."""

    job: JobId


@dataclass(frozen=True)
class WriteCommitFailed(Event):
    """The shell could not commit a write statement's output; nothing of it is visible."""

    job: JobId
    message: str
    error_type: ErrorType = ErrorType.JOB_FAILED


@dataclass(frozen=True)
class CancelRequested(Event):
    """A client asked to cancel the job; an unfinished job ends as cancelled
    (``JobCancelled``), a finished one is left as it is."""

    job: JobId
    reason: str = "cancelled by the user"


@dataclass(frozen=True)
class ResultRead(Event):
    """The client read the result of a succeeded job: its files may go."""

    job: JobId


@dataclass(frozen=True)
class ExecutorRegistered(Event):
    """An executor asked for an id; it takes tasks once its stream connects.

    ``executor.id`` is a fresh id the shell proposes. An executor whose stream
    broke asks to ``resume`` its old id, with the output files it still has
    (``held``) and the jobs it has files of (``held_jobs``): after a scheduler
    restart, an executor the restored state waits for goes on under the old id
    (answered with ``ResumeExecutor``); any other is a new executor under the
    proposed id.
    """

    executor: ExecutorInfo
    resume: ExecutorId | None = None
    held: frozenset[str] = frozenset()
    held_jobs: tuple[JobId, ...] = ()


@dataclass(frozen=True)
class ExecutorConnected(Event):
    """The executor's command stream opened (answered with ``RefuseStream`` when
    it was not waiting to connect)."""

    executor: ExecutorId


@dataclass(frozen=True)
class ExecutorStreamReopened(Event):
    """A live executor opened a new command stream, on a new connection, because
    its link came back after a failure (its heartbeats failed): its commands on
    the old one may be stuck behind TCP's back-off, or lost with it. The new
    stream replaces the old one (which is closed; its end is no loss,
    ``ExecutorLost.stream``), and what the old one may have held is sent again
    (``scheduler.state_streams``), a ``ReleaseOutputs`` too. Answered with
    ``RefuseStream`` when the executor is not live (it registers again, as
    after any broken stream)."""

    executor: ExecutorId
    holding: frozenset[TaskAttemptId] = frozenset()
    """The attempts it holds, queued or running and not cancelled."""
    finished: frozenset[TaskAttemptId] = frozenset()
    """Attempts it finished lately (their reports may be on their way)."""
    held_jobs: tuple[JobId, ...] = ()
    """The jobs it has shuffle files of (those of an ended job are released)."""


@dataclass(frozen=True)
class ExecutorHeartbeat(Event):
    """A heartbeat; from an executor neither connecting nor live it is answered
    with ``RefuseHeartbeat`` (the shell tells the executor to register again)."""

    executor: ExecutorId
    unhealthy: str = ""
    """Why the executor can take no task now (its work directory is full);
    ``""`` when it can. No task is placed on it until a heartbeat clears it."""
    links: tuple[LinkSample, ...] = ()
    """What its fetches received from each peer since its last heartbeat: the
    peers' outbound link rates (``state_links``)."""
    probes: tuple[LinkSample, ...] = ()
    """Its link probes since its last heartbeat, one sample each
    (``executor.probes``), judged apart from ``links`` (``state_links``)."""
    failed_beats: int = 0
    """Its heartbeats that failed since its last answered one: its link was
    down (a cut), not the executor paused; the gap before this one counts
    toward a flap however short (``ExecutorRegistry.heard_from``)."""
    running: int | None = None
    """The attempts it says it runs (on a slot, cancelled or not); ``None``: not
    said. Fewer than were launched on it a while ago means its command stream
    is held up (``state_liveness.STREAM_LAG_S``)."""


@dataclass(frozen=True)
class ExecutorDraining(Event):
    executor: ExecutorId


@dataclass(frozen=True)
class ExecutorLost(Event):
    """The executor's stream broke (or its process exited). A live executor is
    lost, answered with ``DeclareExecutorLost`` (which closes what is left of the
    stream); one already lost or unknown changes nothing. A draining executor
    whose stream closes is lost as ``DRAINED``: it was on its way out."""

    executor: ExecutorId
    reason: LossReason
    detail: str = ""
    stream: int = 0
    """The stream that broke, by the ``event_id`` of the event that opened it
    (``ExecutorConnected``, ``ExecutorStreamReopened``); 0: not a stream's end.
    The end of a stream a newer one replaced changes nothing."""


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
    """Time passed; lets timeouts fire (heartbeats, connecting executors, results'
    time-to-live, no-executor grace, executors' exclusions) and stragglers be
    copied (speculative execution)."""


@dataclass(frozen=True)
class SchedulerRecovered(Event):
    """The scheduler restarted and reloaded its state from its store.

    Attempts that were running are given up on (their executors learn of the
    restart when their command stream breaks, and stop them): their tasks go
    back to pending without charging an attempt. Every live executor waits to
    reattach (``ExecutorRegistered`` with ``resume``, then ``ExecutorConnected``),
    taking no task, for up to the heartbeat timeout; its outputs count as held
    until then.
    """


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
    error_type: ErrorType = ErrorType.JOB_FAILED
    """The error it is blamed on, which the client raises (``errors.job_failure``)."""


@dataclass(frozen=True)
class CommitWrite(SchedulerCommand):
    """Make a write statement's output visible (``output.commit``): exactly the files
    of attempt ``winners[p]`` of each task ``p`` of its writing stage; answer with
    ``WriteCommitted`` or ``WriteCommitFailed``. Idempotent: sent again after a
    restart that finds the job committing."""

    job: JobId
    target: WriteTarget
    winners: tuple[tuple[int, int], ...]
    """(task partition, attempt), in partition order."""


@dataclass(frozen=True)
class AbortWrite(SchedulerCommand):
    """Remove what a write statement's attempts staged and no commit took: all of a
    failed or cancelled statement's, or what an attempt staged after its
    statement ended (a committed statement's visible files stay)."""

    job: JobId
    target: WriteTarget


@dataclass(frozen=True)
class LogRejectedFragment(SchedulerCommand):
    """Write to the scheduler's log the stage SQL that DuckDB refused in a task
    (``task.FragmentRejected``), with the query it was planned from: what a bug
    report needs, and too long for the error the user sees."""

    job: JobId
    stage: StageId
    attempt: TaskAttemptId
    message: str
    """DuckDB's error."""
    fragment: str
    """The stage's SQL, as the planner wrote it."""
    query: str
    """The user's query."""


@dataclass(frozen=True)
class LogExecutorHealth(SchedulerCommand):
    """Write to the scheduler's log what the failure detector decided: a suspicion,
    the trust back, a quarantine, the scheduler's own isolation and its end.
    Nothing to carry out; the log is how false suspicions are counted."""

    change: HealthChange
    executor: ExecutorId | None
    """``None`` for the scheduler's isolation."""
    detail: str = field(default="", compare=False)


@dataclass(frozen=True)
class JobCancelled(SchedulerCommand):
    job: JobId
    message: str
    """``cancelled by the user``, or ``cancelled: <reason>``."""


@dataclass(frozen=True)
class ForgetJob(SchedulerCommand):
    """A finished job leaves the bounded history: drop its record and stored keys."""

    job: JobId


@dataclass(frozen=True)
class DeclareExecutorLost(SchedulerCommand):
    """The state machine decided an executor is lost (its stream closed, heartbeat
    or connect timeout, drained, fetch failures): close its command stream, which
    ends the process. The one command that closes a stream."""

    executor: ExecutorId
    reason: LossReason
    detail: str = field(default="", compare=False)
    """What the decision rests on (the silence and the detector's evidence),
    for the scheduler's log: a false loss must be countable. Words for people,
    so not part of the command's identity."""


@dataclass(frozen=True)
class ResumeExecutor(SchedulerCommand):
    """Answer the registration: the executor goes on under its old id ``executor``
    (the proposed fresh id is not used)."""

    executor: ExecutorId


@dataclass(frozen=True)
class RefuseStream(SchedulerCommand):
    """The executor was not waiting to connect (a second stream, lost, unknown):
    refuse its stream; it registers again."""

    executor: ExecutorId


@dataclass(frozen=True)
class RefuseHeartbeat(SchedulerCommand):
    """The executor is not known as connecting or live (lost while it was frozen
    or cut off, or unknown since a restart): answer its heartbeat with "register
    again"; it goes on under a new id."""

    executor: ExecutorId


Command = ExecutorCommand | SchedulerCommand
"""Everything ``SchedulerState.handle`` returns; every command has a ``cause``."""


@dataclass(frozen=True)
class Limits:
    """Bounds that keep recovery from looping."""

    max_task_attempts: int = defaults.MAX_TASK_ATTEMPTS
    max_task_recomputes: int = defaults.MAX_TASK_RECOMPUTES
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S
    """Silence after which an executor is lost (it is suspected, and gets no new
    task, much sooner: ``scheduler.state_liveness``)."""
    suspect_phi: float = defaults.SUSPECT_PHI
    """The failure detector's threshold: an executor whose silence reaches this
    phi is suspected and gets no new task (``math.inf``: never)."""
    isolation_grace_s: float = defaults.ISOLATION_GRACE_S
    """How much longer losses for silence wait while most executors are silent
    at once (``scheduler.state_liveness``)."""
    no_executor_grace_s: float = defaults.NO_EXECUTOR_GRACE_S
    connect_timeout_s: float = defaults.CONNECT_TIMEOUT_S
    """An executor that registered but opened no stream in this long died in between."""
    result_ttl_s: float = defaults.RESULT_TTL_S
    """A result no client read is deleted this long after its job succeeded."""
    unreachable_window_s: float = defaults.UNREACHABLE_WINDOW_S
    """Fetch failures of readers on different executors that make a holder which
    still heartbeats lost must fall within this long of each other."""
    speculation: bool = defaults.SPECULATION
    """Copy straggling attempts onto another executor (see ``SchedulerState``)."""
    speculation_quantile: float = defaults.SPECULATION_QUANTILE
    speculation_multiplier: float = defaults.SPECULATION_MULTIPLIER
    speculation_min_s: float = defaults.SPECULATION_MIN_S
    slow_link_ratio: float = defaults.SLOW_LINK_RATIO
    """A producer whose readers get under ``1 / slow_link_ratio`` of the others'
    rate is slow (``state_links``, with ``speculation``); 0: never."""
    slow_link_backoff_s: float = defaults.SLOW_LINK_BACKOFF_S
    """How long an executor marked behind a slow link gets no new task before
    its trial, doubled for each mark in a row up to ``SLOW_LINK_BACKOFF_CAP``
    times (``state_link_marks``)."""
    exclusion_failures: int = defaults.EXCLUSION_FAILURES
    """Distinct tasks failing on one executor (execution errors only) within
    ``exclusion_window_s`` that exclude it from new tasks for ``exclusion_s``;
    0 turns exclusion off."""
    exclusion_window_s: float = defaults.EXCLUSION_WINDOW_S
    exclusion_s: float = defaults.EXCLUSION_S
    max_job_share: float = defaults.MAX_JOB_SHARE
    """The most of the alive executors' slots one job may hold (at least one
    slot); 1: no cap, every slot a job can use (see ``SchedulerState._assign``)."""
    adaptive: bool = defaults.ADAPTIVE
    """Coalesce a hash exchange's small partitions into fewer reader tasks once
    the map side is done (``scheduler.adaptive``)."""
    adaptive_partition_bytes: int = defaults.ADAPTIVE_PARTITION_BYTES
    adaptive_min_partition_bytes: int = defaults.ADAPTIVE_MIN_PARTITION_BYTES

    @property
    def heartbeat_interval_s(self) -> float:
        """How often executors heartbeat: a twentieth of the timeout, between
        0.05 and 0.5 s. The failure detector suspects a regular executor after
        about four intervals of silence, and 1.75 s at least
        (``detector.silence_for_phi``): 2.1 s with the 10 s default."""
        return max(0.05, min(0.5, self.heartbeat_timeout_s / 20))

    def __post_init__(self) -> None:
        if not 0.0 < self.max_job_share <= 1.0:
            raise ValueError(f"max_job_share must be in (0, 1], got {self.max_job_share:g}")
        if not 0.0 < self.speculation_quantile <= 1.0:
            raise ValueError(
                f"speculation_quantile must be in (0, 1], got {self.speculation_quantile:g}"
            )
        if self.speculation_multiplier < 1.0:
            raise ValueError(
                f"speculation_multiplier must be at least 1, got {self.speculation_multiplier:g}"
            )
        if self.slow_link_ratio != 0 and self.slow_link_ratio <= 1:
            raise ValueError(
                f"slow_link_ratio must be over 1, or 0 (never), got {self.slow_link_ratio:g}"
            )
        if self.slow_link_backoff_s <= 0:
            raise ValueError(
                f"slow_link_backoff_s must be over 0, got {self.slow_link_backoff_s:g}"
            )
        if self.speculation_min_s < 0 or self.exclusion_window_s < 0 or self.exclusion_s < 0:
            raise ValueError("speculation_min_s, exclusion_window_s and exclusion_s must be >= 0")
        if self.adaptive_partition_bytes < 1 or self.adaptive_min_partition_bytes < 0:
            raise ValueError(
                "adaptive_partition_bytes must be >= 1 and adaptive_min_partition_bytes >= 0"
            )
        if self.exclusion_failures < 0:
            raise ValueError(f"exclusion_failures must be >= 0, got {self.exclusion_failures}")
