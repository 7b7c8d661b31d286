"""What a simulated cluster is made of: its configuration, its faults, its processes.

The vocabulary of ``testing.cluster_sim``: ``SimConfig`` (a run is a pure
function of it), ``Fault`` (the kinds injected), ``Proc`` and ``Stream`` (an
executor process and its command stream as the simulated shells hold them),
``SimResult``, ``Violation``, the limits and timings the runs use, and
``restored_state`` (the state a restarted scheduler reads from the store).
"""

from __future__ import annotations

import enum
import operator
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mangonel.executor.state import ExecutorMachine
from mangonel.ids import ExecutorId, JobId, TaskAttemptId
from mangonel.scheduler.events import (
    Limits,
)
from mangonel.scheduler.persist import (
    decode,
    encode,
    read_snapshot,
)
from mangonel.scheduler.state import SchedulerState
from mangonel.scheduler.state_executors import RegistrySnapshot
from mangonel.scheduler.state_jobs import JobRecord
from mangonel.scheduler.state_stages import TaskRecord
from mangonel.scheduler.store import MemoryStateStore
from mangonel.task import (
    TaskSpec,
)

SCHEDULER = "sched"
STORE_URL = "memory://cluster-sim"


class Fault(enum.Enum):
    """A fault the simulator injects at a random moment (``SimConfig.faults``)."""

    EXECUTOR_CRASH = "executor-crash"
    """The process dies with its files; a fresh one starts on its host later."""
    FREEZE = "freeze"
    """The process stops (SIGSTOP) and thaws later, its timers and messages waiting."""
    CUT = "cut"
    """The link between an executor and the scheduler drops everything both ways."""
    CUT_TO_SCHEDULER = "cut-to-scheduler"
    """One way: the executor's calls are lost, the scheduler's stream still flows."""
    CUT_FROM_SCHEDULER = "cut-from-scheduler"
    """One way: the scheduler's stream stalls, the executor's calls arrive."""
    PEER_CUT = "peer-cut"
    """Two executors cannot fetch from each other; both reach the scheduler."""
    FLAP = "flap"
    """An executor's link to the scheduler goes down and up four times, each cut
    longer than a heartbeat's deadline: the heartbeats sent into a cut fail, and
    the next one that gets through says how many did (``failed_beats``, which
    count toward a flap: ``ExecutorRegistry.heard_from``)."""
    SLOW = "slow"
    """An executor's tasks take several times longer for a while."""
    SLOW_LINK = "slow-link"
    """An executor's outbound link is slow for a while: tasks that read its
    outputs take several times longer, and their executors' heartbeats say
    how little it gives them (``LinkSample``s; ``scheduler.state_links``)."""
    CORRUPT = "corrupt"
    """A shuffle file's bytes change on disk (its checksum no longer matches)."""
    DISK_FULL = "disk-full"
    """An executor's next task fails for lack of disk; it is unhealthy a while."""
    SCHEDULER_CRASH = "scheduler-crash"
    """The scheduler dies at its next persisted event: before its write, after
    it, or between two of its commands; it restarts from the store."""
    CANCEL = "cancel"
    """A client cancels a random unfinished job."""
    DRAIN = "drain"
    """An executor is asked to leave (SIGTERM)."""
    TASK_ERROR = "task-error"
    """Raise the chance of task failures (errors, out of memory, fetch flakes) a while."""
    CLOCK_STEP = "clock-step"
    """The scheduler's wall clock steps, forward or back, by up to ``CLOCK_STEP_S``
    (an NTP step, or a restart on a host whose clock disagrees): the times its
    events carry, and those it stored, no longer follow one line."""
    REGISTER_TWICE = "register-twice"
    """An executor's next registration reaches the scheduler twice: a first try
    the scheduler took but whose answer was lost (the call timed out), then the
    executor's retry (a fresh registration, or a resume, asked again)."""
    CLOCK_DRIFT = "clock-drift"
    """An executor's clock runs fast or slow (0.6 to 1.4 times the scheduler's)
    a while: its heartbeats and its timers fire early or late."""
    STREAM_LAG = "stream-lag"
    """An executor's command stream holds what the scheduler sends it a while
    (its bytes wait for TCP's next retry after a cut), while its heartbeats and
    reports, on connections of their own, go through and count the attempts it
    runs: the launches they miss make it *lagging* (``state_liveness``). Half
    the time the cut that left it held is simulated too (``FLAP_CUT_S``, both
    ways): its heartbeats fail, and when one is answered again the executor
    moves its stream to a new connection (``ClusterSim.move_stream``), which
    nothing holds."""


class CrashPoint(enum.Enum):
    BEFORE_WRITE = "before-write"
    AFTER_WRITE = "after-write"
    MID_COMMANDS = "mid-commands"


@dataclass(frozen=True)
class SimConfig:
    """One simulated run; with the seed, everything it does.

    Attributes:
        seed: Of every random choice.
        executors: Executor hosts (each runs one process at a time).
        slots: Task slots of each executor.
        jobs: Jobs submitted in all.
        concurrent: Jobs a client keeps in flight at once.
        tasks: Tasks of each job's plan (``synthetic_plan``), and its ``partitions``.
        partitions: Hash partitions of each exchange.
        faults: The kinds injected.
        fault_every_s: Mean simulated seconds between two injected faults.
        faults_until_s: No fault starts after this; the network heals, frozen
            processes thaw, crashed ones restart, the scheduler comes back.
        task_fault_rate: Chance of an execution error or fetch flake per task.
        duplicate_rate: Chance a unary call is delivered twice.
        latency_s: Most simulated seconds a message takes (at least a tenth of it).
        liveness_s: Every job must end this long after faults stop.
        max_job_share: The scheduler's ``Limits.max_job_share`` (fair shares below 1).
        keep_finished_jobs: Settled jobs the scheduler keeps (few: jobs are
            forgotten, and their keys deleted, within a run).
        keep_lost_executors: Lost executors it keeps (few: reports and fetch
            failures arrive about executors it forgot).
        max_steps: Most simulation steps (a bound, never the expected end).
        check_restore: Check after every persisted event that the store restores
            into the live state (a pass over the store: the costly check).
        skip: Indexes of scheduled faults to leave out (the shrinker's knob).
        write_every: Every this many jobs, one is a write statement whose files the
            real ``output`` module commits (``testing.sim_writes``); 0: none.
        write_kinds: The kinds of write statement, taken in turn, comma-separated:
            ``own`` (a location of its own), ``append`` (one location they all
            append to), ``contested`` (one location only the first may create),
            ``replace`` (one location each replaces); ``-empty`` after a kind: the
            statement's tasks write no file (a ``PARTITION_BY`` of no rows);
            ``drop``: a plain query whose client drops the replaced location's
            table as it submits it.
        read_every: Every this many jobs (not a write statement), one is a query
            of the location that ``replace`` statements write, planned on the
            files its manifest lists at submission; 0: none.
    """

    seed: int = 0
    executors: int = 3
    slots: int = 2
    jobs: int = 3
    concurrent: int = 2
    tasks: int = 9
    partitions: int = 3
    faults: tuple[Fault, ...] = tuple(Fault)
    fault_every_s: float = 3.0
    faults_until_s: float = 40.0
    task_fault_rate: float = 0.03
    duplicate_rate: float = 0.02
    latency_s: float = 0.05
    liveness_s: float = 400.0
    max_job_share: float = 1.0
    keep_finished_jobs: int = 4
    keep_lost_executors: int = 4
    max_steps: int = 200_000
    check_restore: bool = True
    skip: tuple[int, ...] = ()
    write_every: int = 0
    write_kinds: str = "own,append,contested"
    read_every: int = 0

    def command(self) -> str:
        """The one command that replays this run."""
        default = SimConfig()
        args = [f"--seed {self.seed}"]
        for f in fields(self):
            if f.name in ("seed",):
                continue
            value = getattr(self, f.name)
            if value == getattr(default, f.name):
                continue
            if f.name == "faults":
                value = ",".join(k.value for k in value)
            elif f.name == "skip":
                value = ",".join(str(i) for i in value)
            elif isinstance(value, bool):
                value = int(value)
            args.append(f"--{f.name.replace('_', '-')} {value}")
        return "python -m mangonel.testing.cluster_sim " + " ".join(args)


LIMITS = Limits(
    heartbeat_timeout_s=5.0,
    connect_timeout_s=10.0,
    no_executor_grace_s=30.0,
    result_ttl_s=60.0,
    unreachable_window_s=30.0,
    speculation=True,
    speculation_min_s=0.5,
    exclusion_window_s=30.0,
    exclusion_s=10.0,
    adaptive=True,
    adaptive_partition_bytes=4000,
    adaptive_min_partition_bytes=1600,
)
KEEPALIVE_S = 3.0
"""A stream over a link that carries nothing this long breaks (gRPC's keepalive)."""
TICK_S = 0.5
DRAIN_TIMEOUT_S = 15.0
"""A draining executor stops this long after SIGTERM (``--drain-timeout``)."""
SETTLE_S = 5.0
"""Simulated time between the last job's end (and its result read) and the end checks."""
HEARTBEAT_S = LIMITS.heartbeat_timeout_s / 4
FAST_LINK_RATE = 100_000.0
"""Bytes per second a reader gets from a peer, as its heartbeats say (the
simulated files are 20 to 300 bytes: a fetch is quick)..."""
SLOW_LINK_RATE = 100.0
"""... and from one behind a slow link (``Fault.SLOW_LINK``)."""
SIM_PROBE_BYTES = 20
"""Bytes of one simulated link probe (``executor.probes``): 0.2 s behind a slow
link, past ``state_links.PROBE_MIN_S``; a fraction of a millisecond otherwise."""
FLAP_CUT_S = 1.5
"""How long each of a flap's cuts lasts: past the heartbeat deadline, so the
heartbeat sent at the start of a cut fails (``Fault.FLAP``)..."""
FLAP_EVERY_S = 2.5
"""... and how often one starts."""
CLOCK_STEP_S = 15.0
"""The most a ``Fault.CLOCK_STEP`` moves the scheduler's clock, either way."""


class Violation(AssertionError):
    """An invariant failed; ``invariant`` names it (docs/architecture.md)."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"[{invariant}] {detail}")
        self.invariant = invariant
        self.detail = detail


@dataclass
class SimResult:
    config: SimConfig
    steps: int = 0
    scheduler_events: int = 0
    sim_time: float = 0.0
    jobs_succeeded: int = 0
    jobs_failed: int = 0
    jobs_cancelled: int = 0
    jobs_accepted: int = 0
    """Jobs the scheduler took: ``SimConfig.jobs``, and any whose submission's
    answer a crash swallowed but which the store kept (the client sent those again)."""
    faults: Counter[str] = field(default_factory=Counter)
    """Injected faults by kind (``Fault`` values, task faults as ``task:<kind>``)."""
    schedule: list[str] = field(default_factory=list)
    """The faults injected, in order (``skip`` indexes into it)."""
    violation: Violation | None = None

    @property
    def jobs_ended(self) -> int:
        return self.jobs_succeeded + self.jobs_failed + self.jobs_cancelled

    def summary(self) -> dict[str, Any]:
        return {
            "seed": self.config.seed,
            "steps": self.steps,
            "scheduler_events": self.scheduler_events,
            "sim_time": round(self.sim_time, 2),
            "succeeded": self.jobs_succeeded,
            "failed": self.jobs_failed,
            "cancelled": self.jobs_cancelled,
            "faults": dict(self.faults),
            "violation": str(self.violation) if self.violation else None,
        }


# ------------------------------------------------------------------ the processes


@dataclass
class SimFile:
    job: JobId
    stage: int
    map_partition: int
    partition: int
    value: int


@dataclass
class Proc:
    """One executor process: its pure state machine and what its shell holds."""

    host: str
    slots: int
    state: ExecutorMachine
    alive: bool = True
    frozen: bool = False
    inbox: list[Callable[[], None]] = field(default_factory=list)
    """What happened to it while frozen, run in order when it thaws."""
    free: list[int] = field(default_factory=list)
    queue: deque[tuple[ExecutorId, TaskSpec]] = field(default_factory=deque)
    running: dict[TaskAttemptId, tuple[ExecutorId, TaskSpec]] = field(default_factory=dict)
    homes: dict[ExecutorId, dict[str, SimFile]] = field(default_factory=dict)
    """Each life's directory: path -> file."""
    stream: Stream | None = None
    """Its current command stream, as the executor sees it."""
    unhealthy_until: float = 0.0
    slow_until: float = 0.0
    link_slow_until: float = 0.0
    """Until then, readers of its outputs get ``SLOW_LINK_RATE`` (``Fault.SLOW_LINK``)."""
    disk_full_next: bool = False
    exited: bool = False
    register_twice: bool = False
    """Its next registration is delivered twice (``Fault.REGISTER_TWICE``)."""
    rate: float = 1.0
    """How fast its clock runs against true time (``Fault.CLOCK_DRIFT``): its
    timers of ``d`` seconds fire after ``d / rate``."""
    beats_failed: int = 0
    """Its heartbeats that failed (unanswered within the deadline) since its
    last answered one: what its next heartbeat says (``executor.link``)."""
    moving_to: Stream | None = None
    """The stream it is moving to, until the scheduler's answer comes
    (``ClusterSim.move_stream``): one move at a time, as ``ExecutorService``."""

    def __post_init__(self) -> None:
        self.free = list(range(self.slots))

    def file(self, path: str) -> SimFile | None:
        for home in self.homes.values():
            found = home.get(path)
            if found is not None:
                return found
        return None


@dataclass
class Stream:
    """A scheduler -> executor command stream."""

    executor: ExecutorId
    proc: Proc
    open: bool = True
    last_delivery: float = 0.0
    held_until: float = 0.0
    """Until then it delivers nothing (``Fault.STREAM_LAG``); a stream opened
    on a new connection is not held."""
    opened: int = 0
    """The id of the event that opened it (``ExecutorConnected`` or
    ``ExecutorStreamReopened``); 0 until the scheduler took it."""
    sent: int = 0
    """Commands put on it."""
    handed: int = 0
    """Of those, how many it handed on, in the order they were put on it."""


# ------------------------------------------------------------------ restore


def restored_state(store: MemoryStateStore, fresh: Callable[[], SchedulerState]) -> SchedulerState:
    """A state machine made by ``fresh``, restored from ``store`` as
    ``SchedulerCore.recover`` restores it."""
    return restored_from(store.load(), fresh)


def restored_from(
    data: Mapping[str, str],
    fresh: Callable[[], SchedulerState],
    decoder: Callable[[str, type[Any]], Any] = decode,
) -> SchedulerState:
    """``restored_state`` of a store that holds ``data``, its keys read with ``decoder``."""
    snap = read_snapshot(data, STORE_URL, decoder)
    if snap.broken:
        raise Violation("restore", f"the store holds records that cannot be read: {snap.broken}")
    running, finished = [], []
    for stored in snap.jobs:
        if stored.outcome is not None:
            finished.append(stored.outcome)
        elif stored.progress is not None:
            running.append(JobRecord.restore(stored.plan.plan, stored.progress))
    state = fresh()
    state.restore(snap.executors, running, finished, snap.meta.no_executor_since, snap.revivals)
    return state


def new_state(config: SimConfig, scheduler: type[SchedulerState]) -> SchedulerState:
    """A scheduler state machine with ``config``'s limits."""
    return scheduler(
        replace(LIMITS, max_job_share=config.max_job_share),
        keep_finished_jobs=config.keep_finished_jobs,
        keep_lost_executors=config.keep_lost_executors,
    )


_TASK_VALUES = operator.itemgetter(
    *(f.name for f in fields(TaskRecord) if f.name not in ("id", "owner"))
)
"""A task's field values but its id and its ``owner`` (``Encodings``)."""


def state_documents(state: SchedulerState, known: Encodings | None = None) -> dict[str, str]:
    """Everything the store keeps of ``state``, encoded: equal documents, equal states.

    A job's progress is one document for its head (``job/<id>``) and one for
    each task (``job/<id>/<stage>/<position>``), so that ``known`` (texts of
    records encoded before) spares encoding again the tasks that did not change.
    """
    text = known.text if known is not None else encode
    executors = (
        known.snapshot(state.export_executors()) if known else encode(state.export_executors())
    )
    docs = {"executors": executors, "since": repr(state.no_executor_since)}
    for job in state.unfinished_jobs():
        progress = state.export_job(job)
        assert progress is not None
        head = replace(
            progress, stages={s: replace(p, tasks=[]) for s, p in progress.stages.items()}
        )
        docs[f"job/{job}"] = encode(head)
        for sid, stage in progress.stages.items():
            for position, task in enumerate(stage.tasks):
                docs[f"job/{job}/{sid}/{position}"] = text(task)
    for view in state.jobs():
        if view.state.finished:
            docs[f"finished/{view.id}"] = text(state.export_finished(view.id))
    return docs


class Encodings:
    """The texts of records encoded before, by what their field values are.

    A record (a ``TaskRecord``, a ``FinishedJob``) whose field values are the
    very objects of one encoded before has the same text: its field values are
    immutable (frozen dataclasses, tuples, strings, numbers, enums), and the
    state machine changes a record only by assigning its fields. A task's id
    counts by value (a pending task is built afresh, with a new id object, at
    each restore) and its ``owner`` not at all (the encoding leaves it out);
    every other value counts by identity, and those are held so that no
    identity is reused while it counts.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[object, ...], tuple[tuple[object, ...], str]] = {}
        self._snapshot: tuple[RegistrySnapshot, str] | None = None

    def text(self, record: object) -> str:
        fields_ = vars(record)
        if type(record) is TaskRecord:
            values = _TASK_VALUES(fields_)
            key: tuple[object, ...] = (fields_["id"], *map(id, values))
        else:
            values = tuple(fields_.values())
            key = (type(record), *map(id, values))
        held = self._held.get(key)
        if held is not None:
            return held[1]
        text = encode(record)
        self._held[key] = (values, text)
        return text

    def snapshot(self, snapshot: RegistrySnapshot) -> str:
        """The text of the registry's snapshot: the last one's again while the
        registry hands out the same object (it builds a new one when a stored
        field changes, and never changes one it handed out: ``persist``'s
        ``StateWriter`` counts on the same)."""
        if self._snapshot is None or self._snapshot[0] is not snapshot:
            self._snapshot = (snapshot, encode(snapshot))
        return self._snapshot[1]

    def forget(self, keep: int = 100_000) -> None:
        """Drop every text once more than ``keep`` are held (records of jobs long gone)."""
        if len(self._held) > keep:
            self._held.clear()
