"""Whatever the store holds after any event restores into the state the scheduler had.

A scheduler may be killed right after any event is committed (``SchedulerCore``
writes each event's changes before carrying out its commands). So after *every*
event of a random run, this test reads the store as a restarted scheduler would
(``read_snapshot``, ``JobRecord.restore``, ``SchedulerState.restore``) and checks
that the restored state is the live one, document for document, and that
``SchedulerRecovered`` takes it on. The runs mix what a real cluster does at
once: several jobs queued behind one another for few slots, adaptive stages
decided and not yet launched, speculative copies, task and fetch failures,
drains, cancels, executors lost and replaced, results read. From a few of those
moments the restored scheduler is driven on, with the executors reattaching,
until every job has ended.

A queued job's head once held stages without tasks and no task keys, and every
restart refused it ("stored progress of stage 1 does not match ..."): this is the
check that finds that kind of record for every moment a run reaches.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest

from mangonel.ids import ExecutorId, JobId, TaskAttemptId
from mangonel.scheduler.core import SchedulerCore
from mangonel.scheduler.events import (
    CancelRequested,
    Command,
    DeclareExecutorLost,
    Event,
    ExecutorConnected,
    ExecutorDraining,
    ExecutorHeartbeat,
    ExecutorLost,
    ExecutorRegistered,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    Limits,
    LossReason,
    ResultRead,
    ResumeExecutor,
    SchedulerRecovered,
    TaskCompleted,
    TaskFailed,
    Tick,
)
from mangonel.scheduler.persist import (
    StateWriter,
    StoredPlan,
    encode,
    job_key,
    read_snapshot,
    state_changes,
)
from mangonel.scheduler.state import SchedulerState
from mangonel.scheduler.state_jobs import FinishedJob, JobRecord
from mangonel.scheduler.state_views import ExecutorState, JobState, JobView
from mangonel.scheduler.store import MemoryStateStore
from mangonel.task import (
    CancelTask,
    ExecutionError,
    ExecutorInfo,
    FetchFailed,
    FetchProblem,
    LaunchTask,
    OutputKind,
    PartitionOutput,
)
from mangonel.testing.scheduler_sim import synthetic_plan

LIMITS = Limits(
    heartbeat_timeout_s=5.0,
    result_ttl_s=1e9,
    adaptive=True,
    speculation=True,
    speculation_min_s=0.5,
)


@dataclass
class Cluster:
    """A state machine, its store as the shell writes it, and what the executors run."""

    rng: random.Random
    state: SchedulerState = field(default_factory=lambda: SchedulerState(LIMITS))
    store: MemoryStateStore = field(default_factory=lambda: _store())
    writer: StateWriter = field(init=False)
    known: set[JobId] = field(default_factory=set)
    plans: dict[JobId, object] = field(default_factory=dict)
    running: dict[TaskAttemptId, LaunchTask] = field(default_factory=dict)
    files: dict[ExecutorId, set[str]] = field(default_factory=dict)
    """Output files each live executor holds (what it offers when it reattaches)."""
    ended: dict[JobId, type[Command]] = field(default_factory=dict)
    now: float = 0.0
    last_id: int = 0
    next_executor: int = 0

    def __post_init__(self) -> None:
        self.writer = StateWriter(self.store, {})

    def emit(self, make: type[Event], *args: object) -> list[Command]:
        """Handle one event, check the state's invariants (``validate``), persist it
        as ``SchedulerCore._emit`` does, and carry it out."""
        self.last_id += 1
        self.now += 0.1
        event = make(self.last_id, self.now, *args)  # type: ignore[call-arg]
        commands = self.state.handle(event)
        self.state.validate()
        changes = state_changes(self.state, self.known)
        if changes is not None:
            puts, deletes = changes
            if isinstance(event, JobSubmitted):
                puts[job_key(event.job, "plan")] = StoredPlan("q", event.time, 0.0, event.plan)
            self.writer.commit(puts, deletes)
        for command in commands:
            self._carry_out(command)
        return commands

    def _carry_out(self, command: Command) -> None:
        if isinstance(command, LaunchTask):
            self.running[command.task.attempt] = command
        elif isinstance(command, CancelTask):
            self.running.pop(command.attempt, None)
        elif isinstance(command, DeclareExecutorLost):
            self.files.pop(command.executor, None)
        elif isinstance(command, JobSucceeded | JobFailed | JobCancelled):
            self.ended[command.job] = type(command)

    def add_executor(self, slots: int) -> None:
        eid = ExecutorId(f"e{self.next_executor}")
        self.next_executor += 1
        self.emit(ExecutorRegistered, ExecutorInfo(eid, f"h{eid}", f"h{eid}:1", slots))
        self.emit(ExecutorConnected, eid)
        self.files[eid] = set()

    def submit(self, tasks: int) -> None:
        job = JobId(f"j{len(self.known)}")
        self.known.add(job)
        plan = synthetic_plan(tasks, 2)
        self.plans[job] = plan
        self.emit(JobSubmitted, job, plan)

    def live(self) -> list[ExecutorId]:
        return sorted(self.files)

    # ------------------------------------------------------------- one step

    def step(self) -> None:
        """One random event, weighted towards tasks finishing."""
        roll = self.rng.random()
        attempts = sorted(self.running, key=str)
        if attempts and roll < 0.55:
            self._complete(self.running.pop(self.rng.choice(attempts)))
        elif attempts and roll < 0.62:
            self._fail(self.running.pop(self.rng.choice(attempts)))
        elif roll < 0.67 and len(self.live()) > 1:
            lost = self.rng.choice(self.live())
            self._drop(lost)
            self.emit(ExecutorLost, lost, LossReason.CONNECTION_LOST)
            self.add_executor(self.rng.choice((1, 2)))
        elif roll < 0.69 and len(self.live()) > 1:
            self.emit(ExecutorDraining, self.rng.choice(self.live()))
        elif roll < 0.71:
            open_jobs = sorted(j for j in self.known if j not in self.ended)
            if open_jobs:
                self.emit(CancelRequested, self.rng.choice(open_jobs))
        elif roll < 0.74 and len(self.known) < 8:
            self.submit(self.rng.choice((4, 9, 16)))
        elif roll < 0.77:
            for job, how in sorted(self.ended.items()):
                if how is JobSucceeded:
                    self.emit(ResultRead, job)
                    del self.ended[job]
                    break
        else:
            self.now += self.rng.choice((0.2, 1.0))  # time for stragglers to be copied
            for eid in self.live():
                self.emit(ExecutorHeartbeat, eid)
            self.emit(Tick)

    def _complete(self, launch: LaunchTask) -> None:
        attempt = launch.task.attempt
        spec = launch.task.output
        parts = range(spec.partitions) if spec.kind is OutputKind.HASH else range(1)
        outputs = tuple(
            PartitionOutput(p, f"/w/{launch.executor}/{attempt}/{p}", 10, 1000, "c") for p in parts
        )
        self.files.setdefault(launch.executor, set()).update(o.path for o in outputs)
        self.emit(TaskCompleted, attempt, launch.executor, outputs)

    def _fail(self, launch: LaunchTask) -> None:
        attempt = launch.task.attempt
        inputs = [loc for i in launch.task.inputs for loc in i.locations]
        if inputs and self.rng.random() < 0.5:
            loc = self.rng.choice(inputs)
            problem = self.rng.choice((FetchProblem.UNREACHABLE, FetchProblem.OUTPUT_LOST))
            failure: object = FetchFailed(
                loc.executor, loc.stage, loc.map_partition, "simulated", problem
            )
        else:
            failure = ExecutionError("simulated task error")
        self.emit(TaskFailed, attempt, launch.executor, failure)

    def _drop(self, executor: ExecutorId) -> None:
        self.files.pop(executor, None)
        for attempt, launch in list(self.running.items()):
            if launch.executor == executor:
                del self.running[attempt]


def _store() -> MemoryStateStore:
    store = MemoryStateStore("memory://restore-check")
    store.acquire("test")
    return store


def restored_from(cluster: Cluster) -> SchedulerState:
    """A fresh state machine from the store, as ``SchedulerCore.recover`` builds it."""
    snap = read_snapshot(cluster.store.load(), "memory://restore-check")
    running, finished = [], []
    for stored in snap.jobs:
        if stored.outcome is not None:
            finished.append(stored.outcome)
        else:
            assert stored.progress is not None
            running.append(JobRecord.restore(stored.plan.plan, stored.progress))
    state = SchedulerState(LIMITS)
    state.restore(snap.executors, running, finished, snap.meta.no_executor_since)
    return state


def assert_same(live: SchedulerState, restored: SchedulerState, where: str) -> None:
    assert sorted(restored.unfinished_jobs()) == sorted(live.unfinished_jobs()), where
    for job in live.unfinished_jobs():
        assert encode(restored.export_job(job)) == encode(live.export_job(job)), (where, job)
    for view in live.jobs():
        if view.state.finished:
            assert encode(restored.export_finished(view.id)) == encode(
                live.export_finished(view.id)
            ), (where, view.id)
    assert encode(restored.export_executors()) == encode(live.export_executors()), where
    assert restored.no_executor_since == live.no_executor_since, where


def run_on_after_restart(cluster: Cluster, state: SchedulerState, rough: bool = False) -> None:
    """Drive a restored scheduler on: the executors reattach with what they hold,
    then tasks finish, until every job has ended (none may hang).

    ``rough``: some executors never come back (and time out first), and the
    others come back without some of their files.
    """
    cluster.state = state
    cluster.running.clear()
    cluster.emit(SchedulerRecovered)
    if rough:
        for eid in cluster.live():
            if cluster.rng.random() < 0.3:
                cluster._drop(eid)
            else:
                kept = {p for p in sorted(cluster.files[eid]) if cluster.rng.random() < 0.8}
                cluster.files[eid] = kept
        cluster.now += LIMITS.heartbeat_timeout_s
        for eid in cluster.live():
            cluster.emit(ExecutorHeartbeat, eid)
        cluster.emit(Tick)  # those not coming back are lost
    for eid in cluster.live():
        fresh = ExecutorInfo(ExecutorId(f"fresh-{eid}"), f"h{eid}", f"h{eid}:1", 2)
        jobs = tuple(sorted(cluster.known))
        held = frozenset(cluster.files[eid])
        if cluster.emit(ExecutorRegistered, fresh, eid, held, jobs) == [
            ResumeExecutor(cluster.last_id, eid)
        ]:
            cluster.emit(ExecutorConnected, eid)
    for _ in range(5000):
        if not state.unfinished_jobs():
            return
        if cluster.running:
            attempt = min(cluster.running, key=str)
            cluster._complete(cluster.running.pop(attempt))
        else:
            cluster.now += 1.0
            for eid in cluster.live():
                cluster.emit(ExecutorHeartbeat, eid)
            cluster.emit(Tick)
        if not any(v.state is ExecutorState.ALIVE for v in state.executors()):
            cluster.add_executor(2)  # none, or only draining ones: jobs need one
    raise AssertionError(f"jobs never ended after the restart: {state.unfinished_jobs()}")


def runs(seeds: range) -> Iterator[tuple[int, Cluster]]:
    for seed in seeds:
        cluster = Cluster(random.Random(seed))
        cluster.add_executor(1)  # one slot: jobs queue behind one another
        cluster.add_executor(2)
        for _ in range(3):
            cluster.submit(9)
        yield seed, cluster


@pytest.mark.parametrize("seed", [217, 239])
def test_runs_where_an_output_lost_once_left_a_job_waiting_for_ever(seed: int) -> None:
    # A reader found an output lost (``OUTPUT_LOST``) whose own inputs had gone
    # with an executor lost while nothing needed them: they were not made again,
    # and the job waited for them for ever (``job-progress``, checked
    # after every event by ``Cluster.emit``).
    for _, cluster in runs(range(seed, seed + 1)):
        for _ in range(250):
            cluster.step()


@pytest.mark.parametrize("seeds", [range(0, 10), range(10, 20)])
def test_the_store_after_every_event_restores_into_the_live_state(seeds: range) -> None:
    checked = 0
    for seed, cluster in runs(seeds):
        for step in range(250):
            cluster.step()
            restored = restored_from(cluster)
            assert_same(cluster.state, restored, f"seed {seed} step {step}")
            # What a restarted scheduler does first keeps every invariant too.
            restored.handle(SchedulerRecovered(cluster.last_id + 1, cluster.now))
            restored.validate()
            checked += 1
    assert checked == 250 * len(seeds)


def test_queued_jobs_restore_and_finish_after_a_restart() -> None:
    cluster = Cluster(random.Random(1))
    cluster.add_executor(1)
    for _ in range(3):
        cluster.submit(9)
    queued = [v.id for v in cluster.state.jobs() if v.state.name == "QUEUED"]
    assert len(queued) >= 2, "the test needs jobs waiting for the one slot"
    state = restored_from(cluster)
    assert_same(cluster.state, state, "queued")
    run_on_after_restart(cluster, state)
    assert all(cluster.ended.get(j) is JobSucceeded for j in cluster.known), cluster.ended


@pytest.mark.parametrize("seed", range(8))
def test_a_restart_at_a_random_moment_ends_every_job(seed: int) -> None:
    cluster = Cluster(random.Random(100 + seed))
    cluster.add_executor(1)
    cluster.add_executor(2)
    for _ in range(3):
        cluster.submit(9)
    for _ in range(random.Random(seed).randrange(5, 120)):
        cluster.step()
    state = restored_from(cluster)
    assert_same(cluster.state, state, f"seed {seed}")
    run_on_after_restart(cluster, state)
    assert not state.unfinished_jobs()
    assert all(v.state.finished for v in state.jobs())


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 197])
def test_a_restart_where_executors_come_back_without_files_or_not_at_all_ends_every_job(
    seed: int,
) -> None:
    # Seed 197: an executor came back without an output whose own input had
    # been on an executor that did not come back; that input was not made
    # again and the job waited for it for ever (``job-progress``).
    cluster = Cluster(random.Random(200 + seed))
    cluster.add_executor(1)
    cluster.add_executor(2)
    cluster.add_executor(2)
    for _ in range(3):
        cluster.submit(9)
    for _ in range(random.Random(seed).randrange(20, 120)):
        cluster.step()
    run_on_after_restart(cluster, restored_from(cluster), rough=True)
    assert all(v.state.finished for v in cluster.state.jobs())


# ------------------------------------------------- records that cannot be restored


def _restart_core(data: dict[str, str]) -> tuple[SchedulerCore, MemoryStateStore]:
    """A scheduler shell started on a store holding ``data``, recovered."""
    store = _store()
    store.commit(data)
    core = SchedulerCore(SchedulerState(LIMITS), store=store)
    core.recover()
    return core, store


def _three_jobs() -> Cluster:
    cluster = Cluster(random.Random(7))
    cluster.add_executor(1)
    for _ in range(3):
        cluster.submit(9)
    for _ in range(3):
        cluster._complete(cluster.running.pop(min(cluster.running, key=str)))
    return cluster


@pytest.mark.parametrize(
    "damage",
    [
        "progress",  # the head of the running job is not JSON
        "plan",  # its plan cannot be decoded (its SQL and owner still can)
        "task",  # one of its task keys names another task
    ],
)
def test_one_record_that_cannot_be_restored_fails_its_job_and_the_rest_is_served(
    damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = _three_jobs()
    data = cluster.store.load()
    victim = JobId("j0")
    assert cluster.state.job(victim).state.name == "RUNNING"  # type: ignore[union-attr]
    if damage == "progress":
        data[job_key(victim, "progress")] = '{"id": "j0", "state": "runn'
    elif damage == "plan":
        data[job_key(victim, "plan")] = (
            '{"sql": "SELECT 42", "submitted": 1.0, "submitted_wall": 2.0, "plan": {"x": 1},'
            ' "request_id": "r-1", "owner": "ann"}'
        )
    else:
        key = next(k for k in sorted(data) if k.startswith("jobs/j0/tasks/"))
        data[key] = data[key].replace('"partition":0', '"partition":5')
    with caplog.at_level("ERROR"):
        core, store = _restart_core(data)
    assert "cannot restore" in caplog.text or "cannot be restored" in caplog.text
    failed = core.job(victim)
    assert failed.state is JobState.FAILED
    assert "could not restore this job" in failed.error and "submit the query again" in failed.error
    assert failed.error_type == "InternalError"
    if damage == "plan":
        assert (failed.sql, failed.request_id, failed.owner) == ("SELECT 42", "r-1", "ann")
    # The others are restored as they were, and the store now reads back whole.
    for job in ("j1", "j2"):
        assert core.job(JobId(job)).state is JobState.QUEUED
    again = read_snapshot(store.load(), "again")
    assert not again.broken
    assert not [k for k in store.load() if k.startswith("jobs/j0/") and "/tasks/" in k]
    restarted, _ = _restart_core(store.load())
    assert restarted.job(victim).state is JobState.FAILED
    assert {restarted.job(JobId(j)).state for j in ("j1", "j2")} == {JobState.QUEUED}


def test_leftovers_of_a_crash_between_commits_are_deleted_at_the_restart() -> None:
    cluster = _three_jobs()
    data = cluster.store.load()
    # A finished job whose progress and a task key outlived its outcome, and a
    # forgotten job whose outcome outlived its plan.
    finished = JobId("j9")
    plan = StoredPlan("q", 1.0, 1.0, synthetic_plan(4, 2))
    view = JobView(finished, JobState.FAILED, 1.0, 2.0, "boom", ())
    data[job_key(finished, "plan")] = encode(plan)
    data[job_key(finished, "outcome")] = encode(FinishedJob(view))
    data[job_key(finished, "progress")] = data[job_key(JobId("j1"), "progress")]
    data["jobs/j9/tasks/1/0"] = next(v for k, v in data.items() if k.startswith("jobs/j0/tasks/"))
    data[job_key(JobId("j8"), "outcome")] = encode(FinishedJob(replace(view, id=JobId("j8"))))
    core, store = _restart_core(data)
    assert core.job(finished).state is JobState.FAILED
    left = store.load()
    assert job_key(finished, "outcome") in left and job_key(finished, "plan") in left
    assert not [k for k in left if k.startswith(("jobs/j9/tasks", "jobs/j9/progress", "jobs/j8"))]
