"""A scheduler simulator: the pure state machine driven at cluster scale, no processes.

``simulate`` feeds ``SchedulerState`` the events a large cluster would send it
(executors registering, jobs submitted with a synthetic ``DistributedPlan``,
every launched attempt completing, executors lost at random and replaced,
ticks) and measures what bounds the scheduler's scale on one core:

* task events (``TaskCompleted``) handled per second;
* the time to handle one ``ExecutorLost``, and how many finished outputs the
  lost executor held;
* bytes written to the state store per task event, through the shell's own
  ``persist.state_changes`` and ``StateWriter`` into an in-memory store, so the
  figure is what the real shell would write.

Time is simulated: attempts finish in the order they were launched, and the
clock moves by ``SimConfig.step_s`` per event. Heartbeats are not sent (the
heartbeat timeout is set past the run), so the only losses are the ones the
simulator injects. ``benchmarks/scheduler_sim.py`` runs it over a grid of sizes.

>>> result = simulate(SimConfig(executors=4, slots=2, tasks_per_job=40, jobs=2))
>>> (result.jobs_succeeded, result.jobs_failed)
(2, 0)
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.plan.physical import DistributedPlan, ScanInput, Stage, StageInput
from mangonel.scheduler.events import (
    Command,
    DeclareExecutorLost,
    Event,
    ExecutorConnected,
    ExecutorLost,
    ExecutorRegistered,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    Limits,
    LossReason,
    ResultRead,
    TaskCompleted,
    Tick,
)
from mangonel.scheduler.persist import StateWriter, StoredPlan, job_key, state_changes
from mangonel.scheduler.state import SchedulerState
from mangonel.scheduler.store import MemoryStateStore
from mangonel.task import (
    CancelTask,
    ExecutorInfo,
    FileSplit,
    InputMode,
    LaunchTask,
    OutputKind,
    OutputSpec,
    PartitionOutput,
)


@dataclass(frozen=True)
class SimConfig:
    """One simulated run.

    Attributes:
        executors: Executors alive throughout (a lost one is replaced at once).
        slots: Task slots of each executor.
        tasks_per_job: Tasks of each job's plan (see ``synthetic_plan``).
        jobs: Jobs submitted in all.
        concurrent_jobs: Jobs running at once (a finished one makes room for the next).
        partitions: Output partitions of each map task (and tasks of the join stage).
        losses: Executors lost, at random moments spread over the run.
        loss_every: Also lose one every this many task events (0: never), so
            that a run stopped early (``max_seconds``) still measures losses.
        tick_every: A ``Tick`` after this many task events.
        step_s: Simulated seconds per event.
        persist: Write every event's changes through the shell's persistence.
        seed: Of the random choices (which executor is lost, and when).
        max_seconds: Stop this long (wall time) after the executors registered and
            the first jobs were submitted, every job finished or
            not (``SimResult.complete`` says which): how a slow code base is
            still measured.
        validate: Check the state's invariants after every event
            (``SchedulerState.validate``, a pass over the whole state, outside
            the measured times): for tests, not for measuring scale.
    """

    executors: int = 1000
    slots: int = 8
    tasks_per_job: int = 100_000
    jobs: int = 10
    concurrent_jobs: int = 10
    partitions: int = 4
    losses: int = 0
    loss_every: int = 0
    tick_every: int = 1000
    step_s: float = 0.0001
    persist: bool = True
    seed: int = 0
    max_seconds: float | None = None
    validate: bool = False


@dataclass
class SimResult:
    """What one run measured. Times are CPU seconds of this process (``wall_seconds``
    aside)."""

    config: SimConfig
    task_events: int = 0
    task_seconds: float = 0.0
    """In ``handle`` for task events (the state machine alone)."""
    task_persist_seconds: float = 0.0
    """Working out and writing the task events' store changes."""
    task_store_bytes: int = 0
    """Keys and values the task events wrote to the store."""
    task_store_max_bytes: int = 0
    """The most one task event wrote."""
    loss_seconds: list[float] = field(default_factory=list)
    """``handle`` of each ``ExecutorLost``."""
    loss_persist_seconds: list[float] = field(default_factory=list)
    outputs_at_loss: list[int] = field(default_factory=list)
    """Finished task outputs the lost executor held, over all jobs."""
    jobs_failed_at_loss: list[int] = field(default_factory=list)
    """Jobs each loss failed (re-runs or attempts used up): such a loss also
    cancels the job's running attempts and fills their slots with other jobs'
    tasks, so it costs the slots of the jobs it failed, not what the lost
    executor held."""
    jobs_succeeded: int = 0
    jobs_failed: int = 0
    wall_seconds: float = 0.0
    complete: bool = False
    """Every job finished before ``SimConfig.max_seconds``."""

    @property
    def events_per_s(self) -> float:
        return self.task_events / self.task_seconds if self.task_seconds else 0.0

    @property
    def events_per_s_with_store(self) -> float:
        spent = self.task_seconds + self.task_persist_seconds
        return self.task_events / spent if spent else 0.0

    @property
    def store_bytes_per_event(self) -> float:
        return self.task_store_bytes / self.task_events if self.task_events else 0.0

    def summary(self) -> dict[str, Any]:
        """The figures, for a JSON report."""
        losses = sorted(self.loss_seconds)
        failing_none = sorted(
            t for t, n in zip(self.loss_seconds, self.jobs_failed_at_loss, strict=True) if not n
        )
        both = [a + b for a, b in zip(self.loss_seconds, self.loss_persist_seconds, strict=True)]
        return {
            "config": asdict(self.config),
            "task_events": self.task_events,
            "events_per_s": round(self.events_per_s),
            "events_per_s_with_store": round(self.events_per_s_with_store),
            "store_bytes_per_event": round(self.store_bytes_per_event, 1),
            "store_max_bytes_one_event": self.task_store_max_bytes,
            "losses": len(losses),
            "loss_ms_median": round(losses[len(losses) // 2] * 1000, 2) if losses else None,
            "loss_ms_max": round(losses[-1] * 1000, 2) if losses else None,
            "loss_ms_max_failing_no_job": (
                round(failing_none[-1] * 1000, 2) if failing_none else None
            ),
            "losses_failing_jobs": sum(1 for n in self.jobs_failed_at_loss if n),
            "loss_with_store_ms_max": round(max(both, default=0.0) * 1000, 2),
            "outputs_at_loss_max": max(self.outputs_at_loss, default=0),
            "loss_ms_holding_most": (
                round(max(zip(self.outputs_at_loss, self.loss_seconds, strict=True))[1] * 1000, 2)
                if self.loss_seconds
                else None
            ),
            "jobs_succeeded": self.jobs_succeeded,
            "jobs_failed": self.jobs_failed,
            "complete": self.complete,
            "wall_s": round(self.wall_seconds, 2),
        }


def synthetic_plan(tasks: int, partitions: int) -> DistributedPlan:
    """A plan of ``tasks`` tasks in four stages, the shape of a join and aggregate.

    Two scans (60% and 40% of the tasks, less the last two stages) each hash into
    ``partitions`` partitions; a join of ``partitions`` tasks reads its partition
    of every scan task; one final task reads all of the join. Every task of the
    scans is one event, which is what scale means here; the join's launches
    carry one location per scan task, as they would in a real cluster.
    """
    scans = max(2, tasks - partitions - 1)
    left = max(1, scans * 3 // 5)
    right = scans - left
    hashed = OutputSpec(OutputKind.HASH, partitions, ("k",))

    def scan(sid: int, table: str, n: int) -> Stage:
        splits = tuple((FileSplit(f"/data/{table}/{i}.parquet", (), rows=1000),) for i in range(n))
        return Stage(
            id=StageId(sid),
            sql=f"SELECT k, v FROM {table}",
            output=hashed,
            num_tasks=n,
            columns=("k", "v"),
            scan=ScanInput(table, table, ("k", "v"), splits),
            label=f"scan {table}",
        )

    join = Stage(
        id=StageId(3),
        sql="SELECT a.k, sum(b.v) AS s FROM a JOIN b USING (k) GROUP BY a.k",
        output=OutputSpec(OutputKind.SINGLE),
        num_tasks=partitions,
        columns=("k", "s"),
        inputs=(
            StageInput("a", StageId(1), InputMode.PARTITION),
            StageInput("b", StageId(2), InputMode.PARTITION),
        ),
        label="join + agg",
    )
    final = Stage(
        id=StageId(4),
        sql="SELECT * FROM s3 ORDER BY k",
        output=OutputSpec(OutputKind.SINGLE),
        num_tasks=1,
        columns=("k", "s"),
        inputs=(StageInput("s3", StageId(3), InputMode.ALL),),
        label="sort",
    )
    return DistributedPlan(
        (scan(1, "a", left), scan(2, "b", right), join, final), ("k", "s"), sql="SELECT ..."
    )


class CountingStore(MemoryStateStore):
    """An in-memory store that counts what is written to it."""

    def __init__(self) -> None:
        super().__init__("memory://sim")
        self.bytes_written = 0
        self.acquire("sim")

    def commit(self, puts: Mapping[str, str], deletes: Collection[str] = ()) -> None:
        self.bytes_written += sum(len(k) + len(v) for k, v in puts.items())
        self.bytes_written += sum(len(k) for k in deletes)
        super().commit(puts, deletes)


class Simulator:
    """One run (``simulate`` runs one and returns its result); its ``store`` stays readable."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.result = SimResult(config)
        self.rng = random.Random(config.seed)
        # No heartbeats are simulated: the timeout lies past any run, and the
        # failure detector never suspects (its silences would be the simulator's
        # own, not the executors'). The
        # simulated outputs are tiny, and adaptive execution would coalesce every
        # reader stage into one task: the jobs would not have the sizes asked for.
        self.state = SchedulerState(
            Limits(heartbeat_timeout_s=1e9, result_ttl_s=1e9, adaptive=False, suspect_phi=math.inf)
        )
        self.store = CountingStore()
        self.writer = StateWriter(self.store, {})
        self.known: set[JobId] = set()
        self.now = 0.0
        self.event_id = 0
        self.running: dict[TaskAttemptId, LaunchTask] = {}
        self.queue: deque[TaskAttemptId] = deque()
        self.live: list[ExecutorId] = []
        self.next_executor = 0
        self.submitted = 0
        self.unfinished = 0
        self.plan = synthetic_plan(config.tasks_per_job, config.partitions)

    def run(self) -> SimResult:
        start = time.perf_counter()
        cfg = self.config
        for _ in range(cfg.executors):
            self.add_executor()
        for _ in range(min(cfg.concurrent_jobs, cfg.jobs)):
            self.submit()
        setup = time.perf_counter()  # ``max_seconds`` counts from here
        total = cfg.jobs * sum(s.num_tasks for s in self.plan.stages)
        loss_at = sorted(self.rng.randrange(1, max(2, total)) for _ in range(cfg.losses))
        events = 0
        while self.queue:
            attempt = self.queue.popleft()
            launch = self.running.pop(attempt, None)
            if launch is None:
                continue  # cancelled, or its executor was lost
            self.complete(launch)
            events += 1
            while loss_at and events >= loss_at[0]:
                loss_at.pop(0)
                self.lose_one()
            if cfg.loss_every and events % cfg.loss_every == 0:
                self.lose_one()
            if events % cfg.tick_every == 0:
                self.emit(Tick(self.next_id(), self.now))
            if cfg.max_seconds is not None and time.perf_counter() - setup > cfg.max_seconds:
                break
        self.result.complete = self.unfinished == 0 and self.submitted == cfg.jobs
        self.result.wall_seconds = time.perf_counter() - start
        return self.result

    # ----------------------------------------------------------------- events

    def next_id(self) -> int:
        self.event_id += 1
        self.now += self.config.step_s
        return self.event_id

    def emit(self, event: Event) -> tuple[list[Command], float, float, int]:
        """Handle and persist one event: its commands, both times, bytes written."""
        # CPU time of this process, not wall time: the figures are for one core,
        # and on a shared machine a process waiting for a core would count the
        # wait (the garbage collector's passes are CPU time, and count).
        t0 = time.process_time()
        commands = self.state.handle(event)
        t1 = time.process_time()
        if self.config.validate:
            self.state.validate()  # measured by neither time
        written = self.store.bytes_written
        t2 = time.process_time()
        if self.config.persist:
            self.persist(event, commands)
        t3 = time.process_time()
        self.carry_out(commands)
        return commands, t1 - t0, t3 - t2, self.store.bytes_written - written

    def persist(self, event: Event, commands: list[Command]) -> None:
        """What ``SchedulerCore._persist`` does, against the counting store."""
        changes = state_changes(self.state, self.known)
        if changes is None:
            return
        puts, deletes = changes
        if isinstance(event, JobSubmitted):
            puts[job_key(event.job, "plan")] = StoredPlan("SELECT ...", event.time, 0.0, event.plan)
        self.writer.commit(puts, deletes)

    def carry_out(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, LaunchTask):
                attempt = command.task.attempt
                self.running[attempt] = command
                self.queue.append(attempt)
            elif isinstance(command, CancelTask):
                self.running.pop(command.attempt, None)
            elif isinstance(command, DeclareExecutorLost):
                self.replace(command.executor)
            elif isinstance(command, JobSucceeded | JobFailed | JobCancelled):
                if isinstance(command, JobSucceeded):
                    self.result.jobs_succeeded += 1
                else:
                    self.result.jobs_failed += 1
                self.unfinished -= 1
                if isinstance(command, JobSucceeded):
                    self.emit(ResultRead(self.next_id(), self.now, command.job))
                if self.submitted < self.config.jobs:
                    self.submit()

    def add_executor(self) -> None:
        eid = ExecutorId(f"e{self.next_executor}")
        self.next_executor += 1
        info = ExecutorInfo(eid, f"h{eid}", f"h{eid}:1", self.config.slots)
        self.emit(ExecutorRegistered(self.next_id(), self.now, info))
        self.live.append(eid)
        self.emit(ExecutorConnected(self.next_id(), self.now, eid))

    def replace(self, executor: ExecutorId) -> None:
        if executor in self.live:
            self.live.remove(executor)
            self.add_executor()

    def submit(self) -> None:
        job = JobId(f"j{self.submitted}")
        self.submitted += 1
        self.unfinished += 1
        self.known.add(job)
        self.emit(JobSubmitted(self.next_id(), self.now, job, self.plan))

    def complete(self, launch: LaunchTask) -> None:
        attempt = launch.task.attempt
        spec = launch.task.output
        parts = range(spec.partitions) if spec.kind is OutputKind.HASH else range(1)
        outputs = tuple(
            PartitionOutput(p, f"/work/{attempt}/{p}.arrow", 10, 1000, "c") for p in parts
        )
        event = TaskCompleted(self.next_id(), self.now, attempt, launch.executor, outputs)
        _, handled, persisted, written = self.emit(event)
        r = self.result
        r.task_events += 1
        r.task_seconds += handled
        r.task_persist_seconds += persisted
        r.task_store_bytes += written
        r.task_store_max_bytes = max(r.task_store_max_bytes, written)

    def lose_one(self) -> None:
        executor = self.rng.choice(self.live)
        self.result.outputs_at_loss.append(self.state.outputs_held(executor))
        self.live.remove(executor)
        event = ExecutorLost(self.next_id(), self.now, executor, LossReason.CONNECTION_LOST)
        commands, handled, persisted, _ = self.emit(event)
        self.result.loss_seconds.append(handled)
        self.result.jobs_failed_at_loss.append(sum(isinstance(c, JobFailed) for c in commands))
        self.result.loss_persist_seconds.append(persisted)
        self.add_executor()


def simulate(config: SimConfig) -> SimResult:
    """Run one simulation to the end: every job finished (or failed)."""
    return Simulator(config).run()
