"""What the client shows about tables, jobs and the cluster: plain dataclasses.

Built from the scheduler's answers by the ``*_from_proto`` functions here (the
client is a gRPC shell); nothing else in the client API exposes a message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mangonel.proto import mangonel_pb2 as pb


class JobState(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


class ExecutorState(enum.Enum):
    CONNECTING = "connecting"
    ALIVE = "alive"
    DRAINING = "draining"
    LOST = "lost"
    UNKNOWN = "unknown"


_JOB_STATE = {
    pb.JOB_STATE_RUNNING: JobState.RUNNING,
    pb.JOB_STATE_SUCCEEDED: JobState.SUCCEEDED,
    pb.JOB_STATE_FAILED: JobState.FAILED,
    pb.JOB_STATE_CANCELLED: JobState.CANCELLED,
}
_EXECUTOR_STATE = {
    pb.EXECUTOR_STATE_CONNECTING: ExecutorState.CONNECTING,
    pb.EXECUTOR_STATE_ALIVE: ExecutorState.ALIVE,
    pb.EXECUTOR_STATE_DRAINING: ExecutorState.DRAINING,
    pb.EXECUTOR_STATE_LOST: ExecutorState.LOST,
}


@dataclass(frozen=True)
class TableInfo:
    """A registered table: ``columns`` are (name, Arrow type) pairs; ``rows`` and
    ``bytes`` are exact for Parquet, estimated from a sample for CSV and JSON."""

    name: str
    location: str
    columns: tuple[tuple[str, str], ...]
    rows: int
    bytes: int
    files: tuple[str, ...]
    format: str = "parquet"
    """How its files are written: parquet, csv or json."""


@dataclass(frozen=True)
class UnreadableTableInfo:
    """A table the scheduler keeps whose files cannot be read now: queries naming it
    fail saying why until the scheduler, trying every few seconds, reads it again."""

    name: str
    location: str
    error: str
    since: float
    """When its files first could not be read (Unix seconds)."""


PHASES = ("launch", "setup", "fetch", "execute", "write", "cleanup", "other", "report")
"""A task's span, in order, from the scheduler's launch to its report (``StagePhases``)."""


@dataclass(frozen=True)
class StagePhases:
    """Where a stage's succeeded tasks' time went, summed over them (seconds).

    A task's span runs from the scheduler's launch to its report in the scheduler's
    hands: ``launch`` (to a slot starting it), on the slot ``setup`` (scan database,
    inputs registered), ``fetch`` (upstream partitions: over Flight or from this
    host's disk), ``execute`` (DuckDB), ``write`` (its output partitions), ``cleanup``
    and ``other``, then ``report`` (back to the scheduler).
    """

    tasks: int
    executors: int
    seconds: dict[str, float]
    """``PHASES`` -> seconds."""
    task_median_s: float
    task_max_s: float
    fetched_local_bytes: int = 0
    fetched_remote_bytes: int = 0

    @property
    def skew(self) -> float:
        """The slowest task's time on its slot over the median (1: none)."""
        return self.task_max_s / self.task_median_s if self.task_median_s > 0 else 1.0


@dataclass(frozen=True)
class StageStatus:
    stage: int
    label: str
    tasks_total: int
    tasks_done: int
    tasks_running: int
    rows: int
    bytes: int
    elapsed_s: float
    attempts: int
    tasks_pending: int = 0
    tasks_rerun: int = 0
    """Attempts that made no output (failed, cut off, could not fetch) and ran again."""
    outputs_recomputed: int = 0
    """Finished outputs that were lost (with an executor, or a bad file) and made again."""
    tasks_planned: int | None = None
    """The planner's task count where adaptive execution ran the stage as fewer
    tasks (``tasks_total``), each reading a range of hash partitions; ``None``: as planned."""
    phases: StagePhases | None = None
    """Where its tasks' time went; in a finished job's final status (a ``Result``'s
    stages), ``None`` before."""


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: JobState
    sql: str
    columns: tuple[str, ...]
    stages: tuple[StageStatus, ...]
    submitted_at: float
    elapsed_s: float
    error: str
    error_type: str
    tasks_rerun: int = 0
    outputs_recomputed: int = 0
    owner: str = ""
    """The user who submitted it (``anonymous`` on a scheduler without users)."""
    took_effect: bool = False
    """The statement changed something once the job succeeded (a write committed, a
    table dropped): its answer, lost, is never a reason to run it again."""


@dataclass(frozen=True)
class ExecutorStatus:
    id: str
    host: str
    flight_address: str
    slots: int
    pid: int
    state: ExecutorState
    since: float
    """Unix time of the last state change."""
    reason: str
    """Why it left (``"connection lost"``, ``"heartbeat timeout"``, ``"drained"``,
    ...); empty while alive or draining."""
    detail: str
    running_tasks: int
    heartbeat_age_s: float = 0.0
    """Seconds since the scheduler last heard from it (alive or draining)."""
    unhealthy: str = ""
    """Why it takes no task now (its work directory is full); empty when it may."""
    slow_link_since: float | None = None
    """Since when it is marked behind a slow link (no new task of any job until
    ``slow_link_until``, its outputs still served); ``None`` when it is not."""
    slow_link_until: float | None = None
    slow_link: str = ""
    """Why it is marked (or was, while it is tried again); empty while trusted."""
    lagging_since: float | None = None
    """Since when its command stream is held up (its heartbeats count fewer
    attempts than were launched on it): no new task, its running ones copied;
    ``None`` while its commands get through."""


@dataclass(frozen=True)
class ClusterStatus:
    scheduler_address: str
    executors: tuple[ExecutorStatus, ...]
    jobs: tuple[JobStatus, ...]

    def alive_executors(self) -> tuple[ExecutorStatus, ...]:
        return tuple(e for e in self.executors if e.state is ExecutorState.ALIVE)

    def executor(self, executor_id: str) -> ExecutorStatus | None:
        """The executor with this id, in any state, if the scheduler still lists it."""
        return next((e for e in self.executors if e.id == executor_id), None)

    def job(self, job_id: str) -> JobStatus | None:
        """The job with this id, if the scheduler still lists it."""
        return next((j for j in self.jobs if j.job_id == job_id), None)


def table_from_proto(msg: pb.TableInfo) -> TableInfo:
    return TableInfo(
        name=msg.name,
        location=msg.location,
        columns=tuple((c.name, c.type) for c in msg.columns),
        rows=msg.rows,
        bytes=msg.bytes,
        files=tuple(msg.files),
        format=msg.format or "parquet",
    )


def stage_from_proto(msg: pb.StageStatus) -> StageStatus:
    return StageStatus(
        stage=msg.stage,
        label=msg.label,
        tasks_total=msg.tasks_total,
        tasks_done=msg.tasks_done,
        tasks_running=msg.tasks_running,
        rows=msg.rows,
        bytes=msg.bytes,
        elapsed_s=msg.elapsed_s,
        attempts=msg.attempts,
        tasks_pending=msg.tasks_pending,
        tasks_rerun=msg.tasks_rerun,
        outputs_recomputed=msg.outputs_recomputed,
        tasks_planned=msg.tasks_planned or None,
        phases=phases_from_proto(msg.phases) if msg.HasField("phases") else None,
    )


def phases_from_proto(msg: pb.StagePhases) -> StagePhases:
    return StagePhases(
        tasks=msg.tasks,
        executors=msg.executors,
        seconds={name: float(getattr(msg, f"{name}_s")) for name in PHASES},
        task_median_s=msg.task_median_s,
        task_max_s=msg.task_max_s,
        fetched_local_bytes=msg.fetched_local_bytes,
        fetched_remote_bytes=msg.fetched_remote_bytes,
    )


def job_from_proto(msg: pb.JobStatus) -> JobStatus:
    return JobStatus(
        job_id=msg.job_id,
        state=_JOB_STATE.get(msg.state, JobState.UNKNOWN),
        sql=msg.sql,
        columns=tuple(msg.columns),
        stages=tuple(stage_from_proto(s) for s in msg.stages),
        submitted_at=msg.submitted_at,
        elapsed_s=msg.elapsed_s,
        error=msg.error,
        error_type=msg.error_type,
        tasks_rerun=msg.tasks_rerun,
        outputs_recomputed=msg.outputs_recomputed,
        owner=msg.owner,
        took_effect=msg.took_effect,
    )


def executor_from_proto(msg: pb.ExecutorStatus) -> ExecutorStatus:
    return ExecutorStatus(
        id=msg.id,
        host=msg.host,
        flight_address=msg.flight_address,
        slots=msg.slots,
        pid=msg.pid,
        state=_EXECUTOR_STATE.get(msg.state, ExecutorState.UNKNOWN),
        since=msg.since,
        reason=msg.reason,
        detail=msg.detail,
        running_tasks=msg.running_tasks,
        heartbeat_age_s=msg.heartbeat_age_s,
        unhealthy=msg.unhealthy,
        slow_link_since=msg.slow_link_since or None,
        slow_link_until=msg.slow_link_until or None,
        slow_link=msg.slow_link,
        lagging_since=msg.lagging_since or None,
    )


def cluster_from_proto(msg: pb.ClusterStatusResponse) -> ClusterStatus:
    return ClusterStatus(
        scheduler_address=msg.scheduler_address,
        executors=tuple(executor_from_proto(e) for e in msg.executors),
        jobs=tuple(job_from_proto(j) for j in msg.jobs),
    )
