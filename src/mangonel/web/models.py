"""The REST API's documents: pydantic models, so that ``/api/openapi.json`` describes them.

Times: ``*_at`` and ``since`` fields are Unix seconds (wall clock), ``*_s``
fields are durations in seconds. Byte counts are bytes.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ExecutorModel(BaseModel):
    """One executor: alive, draining or lost (lost ones are kept for a bounded history)."""

    id: str
    state: str = Field(description="connecting, alive, draining or lost")
    since: float = Field(description="Unix time of its last state change")
    reason: str = Field(
        description="why it left: connection lost, heartbeat timeout, fetch failures, "
        "drained, process exited; empty while alive"
    )
    detail: str = Field(description="the scheduler's words on its state; admins only")
    host: str = Field(description="its host's name; admins only (empty for other users)")
    flight_address: str
    pid: int = Field(description="its process id; admins only (0 for other users)")
    slots: int
    running_tasks: int
    heartbeat_age_s: float = Field(description="seconds since it was last heard from")
    unhealthy: str = Field(
        default="", description="why it takes no task now (its work directory is full)"
    )
    shuffle_bytes_held: int = Field(description="bytes of shuffle files it wrote, not released")
    excluded_until: float | None = Field(
        default=None,
        description="Unix time until which it gets no new task because tasks kept failing "
        "on it; null when it is not excluded",
    )
    exclusion: str = Field(
        default="", description="why it is (or last was) excluded; empty if it never was"
    )
    slow: bool = Field(
        default=False,
        description="its recent tasks took much longer than their stages' medians: equally "
        "loaded executors get tasks before it",
    )
    slowness: float = Field(
        default=1.0, description="moving average of its tasks' run times / their stages' medians"
    )
    suspected_since: float | None = Field(
        default=None,
        description="Unix time since which its silence is suspect (the failure detector): "
        "it gets no new task, and its running ones are copied; null while it is trusted",
    )
    quarantined_until: float | None = Field(
        default=None,
        description="Unix time until which it is quarantined for a flapping link: no new "
        "task, its outputs still served; null when it is not",
    )
    quarantine: str = Field(
        default="", description="why it is (or last was) quarantined; empty if it never was"
    )
    lagging_since: float | None = Field(
        default=None,
        description="Unix time since which its command stream is held up (its heartbeats "
        "count fewer attempts than were launched on it, a cut link's retries): no new task, "
        "its running ones are copied; null while its commands get through",
    )
    streams_moved: int = Field(
        default=0,
        description="how often its command stream moved to a new connection after its link "
        "came back from a failure (each time without losing the executor)",
    )
    slow_link_since: float | None = Field(
        default=None,
        description="Unix time since which it is marked behind a slow link (its readers get "
        "a small share of the others' rate from it): no new task of any job, its outputs "
        "still served; null when it is not",
    )
    slow_link_until: float | None = Field(
        default=None,
        description="Unix time when its slow-link mark's back-off ends and it is tried again",
    )
    slow_link: str = Field(
        default="",
        description="why it is marked behind a slow link (or was, while on trial); empty "
        "while its link is trusted",
    )


class JobSummary(BaseModel):
    """One job as listed: state, SQL, duration, rows, progress, recovery counters."""

    id: str
    owner: str = Field(description="the user who submitted it")
    state: str = Field(description="queued, running, succeeded, failed or cancelled")
    sql: str
    submitted_at: float
    elapsed_s: float
    rows: int = Field(description="rows of the result (so far: of the final stage's done tasks)")
    tasks_total: int
    tasks_done: int
    tasks_running: int
    stages_total: int
    stages_done: int
    progress: float = Field(description="tasks done / tasks, 0 to 1")
    tasks_rerun: int
    outputs_recomputed: int
    speculated: int = Field(default=0, description="speculative copies of straggling attempts")
    error: str
    error_type: str


class StageInputModel(BaseModel):
    stage: int
    name: str
    mode: str = Field(description="partition (hash exchange) or all (broadcast / gather)")


class PhasesModel(BaseModel):
    """Seconds of a task attempt's span by phase, from the scheduler's launch to its
    report in the scheduler's hands (``scheduler.breakdown``)."""

    launch_s: float = Field(description="the scheduler's launch to a slot starting it")
    setup_s: float = Field(description="scan database, scans' SQL, inputs registered")
    fetch_s: float = Field(description="upstream partitions read: over Flight or mapped")
    execute_s: float = Field(description="DuckDB planning the fragment and making its rows")
    write_s: float = Field(description="rows split into partitions, encoded, written")
    cleanup_s: float = Field(description="inputs unregistered, memory handed back")
    other_s: float = Field(description="on the slot outside the phases")
    report_s: float = Field(description="the slot's end to the scheduler having the report")
    fetched_local_bytes: int = Field(default=0, description="upstream bytes read on its host")
    fetched_remote_bytes: int = Field(default=0, description="upstream bytes fetched over Flight")
    fetch_remote_s: float = Field(default=0.0, description="of fetch_s: over Flight")
    write_io_s: float = Field(default=0.0, description="of write_s: file writes and their CRC")


class StagePhasesModel(PhasesModel):
    """Where a stage's succeeded tasks' time went, summed over them."""

    tasks: int = Field(description="succeeded attempts that reported their timings")
    executors: int = Field(description="executors they ran on")
    task_median_s: float = Field(description="time on the slot, median over the tasks")
    task_max_s: float = Field(description="time on the slot of the slowest task")
    skew: float = Field(description="task_max_s / task_median_s (1: no skew)")


class ExecutorTimeModel(BaseModel):
    """One executor's slot-seconds in a job's window."""

    executor: str
    slots: int
    attempts: int
    busy_s: float = Field(description="holding attempts of the job (launch to report)")
    idle_planning_s: float = Field(description="idle before the job's first launch")
    idle_barrier_s: float = Field(description="idle while another slot ran a task of the job")
    idle_scheduler_s: float = Field(description="idle while no slot ran one (stage hops, end)")


class BreakdownModel(BaseModel):
    """Every slot's time over the job's window (planning to end), by what it did."""

    window_s: float = Field(description="planning plus the job's run")
    planning_s: float
    slots: int = Field(description="slots counted: the cluster's executors'")
    capacity_s: float = Field(description="window_s * slots")
    seconds: dict[str, float] = Field(
        description="slot-seconds by category: the phases of succeeded attempts "
        "(launch ... report), wasted (attempts that failed, were lost or cancelled), "
        "idle_planning, idle_barrier, idle_scheduler; they add up to capacity_s"
    )
    executors: list[ExecutorTimeModel]


class StageModel(BaseModel):
    """One stage: what it reads and writes, its SQL, and its tasks' progress."""

    id: int
    label: str
    num_tasks: int = Field(description="tasks it runs (fewer than planned where coalesced)")
    planned_tasks: int | None = Field(
        default=None,
        description="the planner's task count where adaptive execution ran the stage as "
        "fewer tasks, each reading a range of its hash partitions; null: as planned",
    )
    done: int
    running: int
    pending: int
    failed: int = Field(description="attempts of its tasks that reported a failure")
    lost: int = Field(description="attempts of its tasks lost with their executor")
    attempts: int
    tasks_rerun: int
    outputs_recomputed: int
    speculated: int = Field(default=0, description="copies of straggling attempts launched")
    speculation_won: int = Field(
        default=0, description="copies that finished first (their output was kept)"
    )
    speculation_lost: int = Field(
        default=0, description="copies cancelled because the attempt they copied finished first"
    )
    rows: int
    bytes: int
    elapsed_s: float
    output: str = Field(description="hash(keys) into N partitions, or single")
    inputs: list[StageInputModel]
    scan_table: str | None
    side_tables: list[str] = Field(
        default_factory=list, description="small tables every task reads whole"
    )
    ranged_tables: list[str] = Field(
        default_factory=list,
        description="tables each task reads only the row groups of that its join keys "
        "may meet (by the ranges in the Parquet footers)",
    )
    sql: str
    final: bool
    phases: StagePhasesModel | None = Field(
        default=None,
        description="where its succeeded tasks' time went; null before any reported",
    )


class AttemptModel(BaseModel):
    """One task attempt: where it ran, how long, how it ended and why."""

    stage: int
    partition: int
    attempt: int
    executor: str
    kind: str = Field(description="first, re-run, recompute or speculative")
    state: str = Field(description="running, succeeded, failed, lost or cancelled")
    launched_at: float
    elapsed_s: float | None
    reason: str
    rows: int
    bytes: int
    output_lost: bool
    phases: PhasesModel | None = Field(
        default=None, description="where its time went; null until its executor reported"
    )


class JobDetail(JobSummary):
    """A job with its stage graph and its task attempts."""

    stages: list[StageModel]
    attempts: list[AttemptModel]
    attempts_not_kept: int = Field(description="attempts beyond the kept history")
    planning_s: float = Field(default=0.0, description="planning, before submitted_at")
    fallback: str | None = Field(
        default=None,
        description="why the planner runs the whole query in one task over its gathered "
        "tables; null: the plan is split into stages",
    )
    breakdown: BreakdownModel | None = Field(
        default=None, description="every slot's time over the job's window, by what it did"
    )


class ClusterModel(BaseModel):
    scheduler_address: str
    executors: dict[str, int] = Field(description="executors by state")
    jobs: dict[str, int] = Field(description="jobs by state")
    slots: int = Field(description="task slots of alive executors")
    running_tasks: int


class CancelModel(BaseModel):
    cancelled: bool = Field(description="false when the job had already finished")


class ExplainRequest(BaseModel):
    sql: str
    dialect: str | None = None


class ExplainModel(BaseModel):
    text: str
    stages: list[StageModel]


class ErrorModel(BaseModel):
    detail: str


class LoginRequest(BaseModel):
    """A user name and password, or a token (made by ``mangonel users token``)."""

    user: str = ""
    password: str = ""
    token: str = ""


class SessionModel(BaseModel):
    """Who the caller is, and how this scheduler is secured."""

    authenticated: bool = Field(description="the caller's token (or none needed) is valid")
    user: str = Field(description="the caller's user name; empty when not authenticated")
    admin: bool
    login_required: bool = Field(description="this scheduler lets only known users in")
    tls: bool = Field(description="the scheduler's channels are encrypted; false: insecure")
    problem: str = Field(description="why the caller's token was refused; empty otherwise")


class LoginModel(BaseModel):
    """A login's token (also set as the HttpOnly cookie ``mangonel_token``)."""

    token: str
    user: str
    admin: bool
    expires_at: float = Field(description="Unix time the token expires; 0: never")
