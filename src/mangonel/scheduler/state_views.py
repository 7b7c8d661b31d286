"""Read-only snapshots of the scheduler state, for the status API and the web UI.

Everything here is a frozen dataclass built fresh on each call, so a caller can
keep or send a view without it changing under them and without being able to
change the state machine through it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, StageId
from mangonel.scheduler.events import LossReason


class ExecutorState(enum.Enum):
    """Where an executor is in its life (drawn in ``state_executors``)."""

    CONNECTING = "connecting"
    """Registered; its command stream is not open yet, so it takes no task."""
    ALIVE = "alive"
    """Registered, heartbeating and taking tasks."""
    DRAINING = "draining"
    """Still serving its outputs (and unread results) and finishing its tasks,
    but given no new ones."""
    LOST = "lost"
    """Gone: its tasks were re-queued and the outputs still needed recomputed."""


class JobState(enum.Enum):
    """Where a job is in its life (drawn in ``state_jobs``)."""

    QUEUED = "queued"
    """Submitted; no task launched yet (no free slot, or no executor)."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class ExecutorView:
    """One executor, alive, draining or recently lost."""

    id: ExecutorId
    host: str
    flight_address: str
    slots: int
    state: ExecutorState
    since: float
    """Time of the last state change (registration, drain or loss)."""
    reason: LossReason | None
    """Why it was lost; ``None`` while it is not."""
    detail: str
    running: int
    """Task attempts it is running now (0 once lost)."""
    last_heartbeat: float
    unhealthy: str = ""
    """Why it takes no task now (its work directory is full); ``""`` when it may."""
    excluded_until: float | None = None
    """While it is excluded from new tasks for failing them: until when."""
    exclusion: str = ""
    """Why it is (or last was) excluded; empty if it never was."""
    slowness: float = 1.0
    """Its recent tasks' run times against their stages' medians (moving average)."""
    slow: bool = False
    """Marked slow: equally loaded executors get tasks before it."""
    suspected_since: float | None = None
    """Since when its silence is suspect (no new task until it is heard from);
    ``None`` while it is trusted."""
    quarantined_until: float | None = None
    """While it is quarantined for a flapping link (no new task, its outputs
    still served): until when."""
    quarantine: str = ""
    """Why it is (or last was) quarantined; empty if it never was."""
    lagging_since: float | None = None
    """Since when its command stream is held up (its heartbeats count fewer
    attempts than were launched on it: no new task, its attempts copied);
    ``None`` while its commands get through."""
    streams_moved: int = 0
    """How often its command stream moved to a new connection after its link
    came back (``scheduler.state_streams``)."""
    slow_link_since: float | None = None
    """While it is marked behind a slow link (no new task of any job, its
    outputs still served): since when; ``None`` otherwise."""
    slow_link_until: float | None = None
    """... and until when: then it is tried again."""
    slow_link: str = ""
    """Why it is marked, or was before its trial; empty while its link is trusted."""


@dataclass(frozen=True)
class StageView:
    """Progress and recovery counters of one stage of a job."""

    id: StageId
    label: str
    num_tasks: int
    """Its tasks: the planner's count, or fewer where adaptive execution
    coalesced its partitions (then ``planned_tasks`` is the planner's)."""
    done: int
    running: int
    pending: int
    attempts_launched: int
    tasks_rerun: int
    """Times one of its tasks went back to pending after an attempt that made no
    output: the attempt failed, its executor was lost, or it could not fetch."""
    outputs_recomputed: int
    """Times a finished task's output was lost (with its executor, or its file went
    missing or bad) and had to be made again."""
    rows: int = 0
    """Rows in the outputs of its finished tasks (current attempts only)."""
    bytes: int = 0
    """Bytes of those outputs' files."""
    speculative_running: int = 0
    """Running tasks that also have a speculative copy running."""
    speculated: int = 0
    """Speculative copies launched for its stragglers."""
    speculation_won: int = 0
    """Copies that finished before the attempt they copied (their output was kept)."""
    speculation_lost: int = 0
    """Copies cancelled because the attempt they copied finished first."""
    planned_tasks: int | None = None
    """The planner's task count where adaptive execution ran the stage as fewer
    tasks, each reading a range of partitions; ``None``: it ran as planned."""


@dataclass(frozen=True)
class JobView:
    """One job: its state, timing, error and per-stage progress."""

    id: JobId
    state: JobState
    submitted: float
    finished: float | None
    error: str | None
    """The message of a failed or cancelled job; ``None`` otherwise."""
    stages: tuple[StageView, ...]
    sql: str = ""
    error_type: ErrorType | None = None
    """The error a failed job is blamed on; ``None`` otherwise (and for jobs that
    failed before the type was kept: a plain ``JobFailedError``)."""

    @property
    def tasks_rerun(self) -> int:
        return sum(s.tasks_rerun for s in self.stages)

    @property
    def outputs_recomputed(self) -> int:
        return sum(s.outputs_recomputed for s in self.stages)

    @property
    def speculated(self) -> int:
        return sum(s.speculated for s in self.stages)
