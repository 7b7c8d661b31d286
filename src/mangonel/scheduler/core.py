"""The scheduler's I/O shell, without the network: events in, commands carried out.

Over 600 lines because it is the one object every door calls under one lock: each
of its methods turns a call into an event (or a read of a view), and they share
that lock, the event counter and the store writer. What runs apart from the lock
lives beside it: the commit thread (``commits``), what a restart rebuilds from
the store (``restore``), each job's watchers' record (``jobs``), what a front
door does with a caller's job (``doors``), the store's encoding (``persist``)
and the counters (``telemetry``).

``SchedulerCore`` wraps the pure state machine (``scheduler.state``), which
makes every decision. The shell turns what happens outside (an executor
registers or opens its stream, a task reports, a client submits SQL, cancels
or reads a result, time passes) into events with increasing ``event_id``s and
its clock's time, feeds them to ``StateMachine.handle`` under one lock, and
carries out the commands it gets back while still holding the lock, so that
commands reach each executor's queue in the order the state machine decided
them:

* ``LaunchTask`` / ``CancelTask`` / ``ReleaseOutputs``: onto the executor's
  command queue, which its Connect stream drains.
* ``DeclareExecutorLost``: close the executor's stream (the process exits);
  the one place a stream is closed, a closed stream's ``ExecutorLost`` included.
* ``ResumeExecutor`` / ``RefuseStream`` / ``RefuseHeartbeat``: the answer to the
  registration, Connect or heartbeat RPC that sent the event.
* ``JobSucceeded`` / ``JobFailed`` / ``JobCancelled``: copy the job's final
  view (and result) into its watchers' record; its watchers wake. A failure is
  logged under the job's id with its type (an internal error as an error).
* ``ForgetJob``: drop the job's watchers' record (its stored keys went with
  the event's commit).
* ``CommitWrite`` / ``AbortWrite``: onto the commit thread (``commits``), which
  reports the outcome as an event.

What else the shell keeps is I/O: the lock, each executor's command queue
(``registry.ExecutorEntry``), each job's watchers' record (``jobs.JobWatch``:
a condition variable, a copy of the state machine's view, SQL text, timing),
the store writer, the ticker thread (a ``Tick`` every ``CoreConfig.tick_s``), and
``telemetry``, which observes the events and commands for the web UI and
/metrics. Whether a task's report counts for telemetry is the state machine's
rule (``is_current``), and which jobs an event touched, for the store, its answer
(``touched_jobs``); only ``drain``'s refusal of an executor not alive reads a view.

Before any command of an event is carried out, what the event changed is
committed to the state store (``scheduler.persist``: the jobs it or its
commands touched, the executors, the scheduler-wide meta), so a scheduler
killed at any moment restarts from a state it can go on from: ``recover()``
reads the store back, and ``SchedulerRecovered`` gives up on the attempts that
were running and makes the executors of the previous run reattach. A write
that fails (another scheduler took the store over, or it cannot be reached) is
fatal: ``fatal`` is set, ``on_fatal`` runs, and the scheduler must stop.

Test hooks (crash points) are called at fixed points of each persisted event
through ``hook`` (``scheduler.hooks``), a no-op unless a test wired one in.

The gRPC servicers (``scheduler.service``) call into this class and convert
messages; this module never sees a protobuf message.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import pyarrow as pa

from mangonel import defaults, output
from mangonel.catalog import Table, load_table
from mangonel.errors import (
    ErrorType,
    InternalError,
    MangonelError,
    PermissionDeniedError,
    StateStoreError,
    UnknownTableError,
)
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.plan.explain import render
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlanCache, PlannerConfig, parameter_types, result_schema
from mangonel.scheduler import restore
from mangonel.scheduler.commits import CommitThread
from mangonel.scheduler.events import (
    AbortWrite,
    CancelRequested,
    Command,
    CommitWrite,
    DeclareExecutorLost,
    Event,
    ExecutorConnected,
    ExecutorDraining,
    ExecutorHeartbeat,
    ExecutorLost,
    ExecutorRegistered,
    ExecutorStreamReopened,
    ForgetJob,
    HealthChange,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    Limits,
    LogExecutorHealth,
    LogRejectedFragment,
    LossReason,
    RefuseHeartbeat,
    RefuseStream,
    ResultRead,
    ResumeExecutor,
    SchedulerRecovered,
    TaskCompleted,
    TaskFailed,
    Tick,
)
from mangonel.scheduler.hooks import NO_HOOK, EventHook
from mangonel.scheduler.jobs import JobWatch
from mangonel.scheduler.persist import (
    PersistedState,
    StateWriter,
    StoredDrop,
    StoredPlan,
    StoredTable,
    drop_key,
    job_key,
    read_snapshot,
    state_changes,
    table_key,
)
from mangonel.scheduler.registry import (
    CLOSE,
    ExecutorEntry,
    ExecutorListing,
    Stream,
    move_queued,
)
from mangonel.scheduler.state_executors import RegistrySnapshot
from mangonel.scheduler.state_jobs import FinishedJob, JobRecord
from mangonel.scheduler.state_views import ExecutorState, ExecutorView, JobView
from mangonel.scheduler.store import CatalogStore, MemoryCatalogStore, MemoryStateStore, StateStore
from mangonel.scheduler.telemetry import Telemetry
from mangonel.scheduler.unreadable import UnreadableTables
from mangonel.scheduler.writes import (
    DROPPED,
    WRITER_HINT,
    WriteSettings,
    default_warehouse,
    plan_statement,
)
from mangonel.security.auth import ANONYMOUS
from mangonel.sql.writes import WriteKind, WriteStatement, parse_write
from mangonel.task import (
    CancelTask,
    ExecutorInfo,
    FileFormat,
    LaunchTask,
    LinkSample,
    PartitionOutput,
    ProbeTarget,
    ReleaseOutputs,
    TaskFailure,
    TaskTimings,
)

log = logging.getLogger(__name__)

_T = TypeVar("_T")

SLOW_COMMIT_S = 0.05
"""A commit to the state store at least this long is logged: each event waits for its
own (the median on this project's machines is well under a millisecond with SQLite,
with a tail of 10 to 190 ms on their virtual disks)."""

MAX_TICK_S = 0.25
"""The longest wait between two ``Tick`` events (``CoreConfig.tick_s``): a
quarter of a second, as with the 10 s default heartbeat timeout."""

_LIVE = (ExecutorState.ALIVE, ExecutorState.DRAINING)


class StateMachine(PersistedState, Protocol):
    """What the shell needs of ``scheduler.state.SchedulerState``: what it persists
    (``PersistedState``) and the events and views it reads."""

    def handle(self, event: Event) -> list[Command]: ...

    def job(self, job_id: JobId) -> JobView | None: ...

    def executors(self) -> list[ExecutorView]: ...

    def executor(self, executor: ExecutorId) -> ExecutorView | None: ...

    def job_slots(self) -> int: ...

    def job_parallel(self) -> int: ...

    def is_current(self, attempt: TaskAttemptId, executor: ExecutorId) -> bool: ...

    def probe_targets(self, executor: ExecutorId, now: float) -> tuple[ProbeTarget, ...]: ...

    def restore(
        self,
        executors: RegistrySnapshot | None,
        jobs: list[JobRecord],
        finished: list[FinishedJob],
        no_executor_since: float | None,
    ) -> None: ...


class JobNotFoundError(MangonelError):
    """No job with this id (finished jobs are forgotten after a while)."""


class ExecutorNotFoundError(MangonelError):
    """The scheduler does not know this executor (lost, or the scheduler restarted)."""


@dataclass(frozen=True)
class CoreConfig:
    """Settings of the shell around the state machine.

    Attributes:
        planner: Passed to ``plan_query`` for every job.
        plan_cache: Plans of recent queries kept for the same SQL sent again
            (``plan.planner.PlanCache``); 0 plans every query afresh.
        limits: Given to the state machine (timeouts, retries, results'
            time-to-live); the shell reads the heartbeat timeout.
        tick_interval_s: How often time passes for the state machine; by
            default (``None``) half a heartbeat interval, at most
            ``MAX_TICK_S``: the silences judged on a ``Tick`` are counted in
            beats, and a tick of 0.25 s was most of a beat of 0.15 s (the
            3 s timeout of the gray-failure lab), late on every suspicion.
        keep_jobs: Finished jobs kept for the status views (by the state
            machine) and in the attempt history (by telemetry).
    """

    planner: PlannerConfig = field(default_factory=PlannerConfig)
    plan_cache: int = defaults.PLAN_CACHE
    limits: Limits = field(default_factory=Limits)
    tick_interval_s: float | None = None
    keep_jobs: int = defaults.KEEP_JOBS
    warehouse: str = ""
    """Where ``CREATE TABLE AS`` writes its tables (``scheduler.writes``); empty:
    ``default_warehouse`` of a memory store."""
    write_roots: tuple[str, ...] = ()
    """The locations ``COPY ... TO`` may write under; none: ``COPY`` is refused."""

    @property
    def heartbeat_interval_s(self) -> float:
        return self.limits.heartbeat_interval_s

    @property
    def tick_s(self) -> float:
        """Seconds between two ``Tick`` events (``tick_interval_s``)."""
        if self.tick_interval_s is not None:
            return self.tick_interval_s
        return min(MAX_TICK_S, self.limits.heartbeat_interval_s / 2)


class SchedulerCore:
    """Events in, commands out, one lock around the state machine.

    Args:
        state: The pure state machine.
        config: Planner settings, limits and timers.
        catalog: Where tables live; in memory by default.
        clock: Seconds since the epoch (every time is persisted, and must mean
            the same after a restart); injectable for tests.
        store: Where the state is made durable, acquired by this scheduler
            (``recover()`` reads it back); nothing durable by default.
    """

    def __init__(
        self,
        state: StateMachine,
        config: CoreConfig | None = None,
        catalog: CatalogStore | None = None,
        clock: Callable[[], float] = time.time,
        store: StateStore | None = None,
    ) -> None:
        self.config = config or CoreConfig()
        self.catalog: CatalogStore = catalog or MemoryCatalogStore()
        if store is None:
            store = MemoryStateStore()
            store.acquire("scheduler")
        self.store = store
        self._writer = StateWriter(store, {})
        self.fatal: StateStoreError | None = None
        """Set when the store could not be written (or another scheduler took
        it over): this scheduler's memory is ahead of its store, so it must stop."""
        self.on_fatal: Callable[[StateStoreError], None] | None = None
        self.hook: EventHook = NO_HOOK
        """Called at fixed points of each persisted event (``scheduler.hooks``):
        crash tests wire theirs in; production does nothing."""
        self._state = state
        self._clock = clock
        self._lock = threading.RLock()
        self._last_event_id = 0
        self._executor_seq = 0
        self._executors: dict[ExecutorId, ExecutorEntry] = {}
        self._jobs: dict[JobId, JobWatch] = {}
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        # Attempt history, counters and bytes held, for the web UI and /metrics.
        self.telemetry = Telemetry(keep_jobs=self.config.keep_jobs)
        self.plans = PlanCache(self.config.plan_cache)
        self.warehouse = self.config.warehouse or default_warehouse(store.url)
        self._owned: set[str] = set()
        """Tables the warehouse owns (``CREATE TABLE AS``): ``DROP TABLE`` deletes their files."""
        self.unreadable = UnreadableTables(self._lock, self.catalog, self._stop)
        """Tables kept in the store whose files cannot be read now (``scheduler.unreadable``)."""
        self._commits = CommitThread(
            self._lock,
            self._emit,
            self._running_jobs,
            lambda name: name in self.catalog.snapshot() or self.unreadable.get(name) is not None,
            self._table_committed,
            self._table_unreadable,
            self._forget_table,
            lambda: self.hook,
            self._clock,
        )
        self._planning: set[str] = set()
        """Statements being planned (outside the lock), as ``planning-N``: they count
        among the running jobs whose reads a replace or drop waits for."""
        self._planning_seq = itertools.count(1)
        self._submitting: dict[tuple[str, str], Future[JobWatch]] = {}
        """Submissions being planned, by (owner, request id): the same submission
        tried again meanwhile waits for the first's answer (``submit``)."""
        self._drops_done: dict[tuple[str, str], StoredDrop] = {}
        """Drops that took effect before the restart without their job written, and
        the admins' ``DropTable`` calls that dropped a table, by (owner, request
        id): the client's retry is answered as done (``StoredDrop``)."""
        self._drop_calls = threading.Lock()
        """Held by ``drop_table_once``: a call sent again while the first is still
        under way waits for its end, then finds its answer."""

    # ------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Start the ticker thread (``Tick`` events: every timeout is the state's); look
        for the files of tables replaced or dropped before a restart that wait for
        their readers."""
        self._ticker = threading.Thread(target=self._tick_loop, name="scheduler-tick", daemon=True)
        self._ticker.start()
        self.unreadable.start()
        self._commits.sweep_retired(self.warehouse)

    @property
    def stopped(self) -> bool:
        """``stop`` was called: no stream opened since is fed."""
        return self._stop.is_set()

    def stop(self) -> None:
        """Stop ticking and end every executor's command stream."""
        self._stop.set()
        self._commits.stop()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        with self._lock:
            for entry in self._executors.values():
                entry.commands.put(CLOSE)

    def recover(self) -> int:
        """Read back what the store holds (after a restart); return the unfinished jobs.

        Tables are registered again (their footers re-read), jobs and executors
        restored, then ``SchedulerRecovered`` gives up on the attempts that
        were running and makes every live executor wait to reattach. Call it
        once, after acquiring the store and before serving.

        Raises:
            StateStoreError: the store cannot be read, or holds what this
                mangonel cannot read.
        """
        data = self.store.load()
        snap = read_snapshot(data, self.store.url)
        with self._lock:
            self._writer = StateWriter(self.store, data)
            if snap.empty:
                return 0
            # Read back, nothing written yet: no event names the moment.
            self.hook.check(Tick(0, self._clock()), [], "recovering")
            found = restore.rebuild(snap, data, self.store.url, self._clock())
            self._owned |= found.owned
            self._drops_done.update(found.drops_done)
            for table in found.tables:
                self.catalog.put(table)
            self.unreadable.add_all(found.unreadable)
            self._jobs.update(found.watches)
            self._state.restore(
                snap.executors,
                found.running,
                found.finished,
                snap.meta.no_executor_since,
                snap.revivals,
            )
            if found.puts or found.deletes:
                self._write(found.puts, found.deletes)
            self._emit(lambda eid, now: SchedulerRecovered(eid, now))
            log.info(
                "recovered from %s: %d tables (%d of them unreadable now), %d unfinished and "
                "%d finished jobs, %d executors expected back",
                self.store.url,
                len(snap.tables),
                len(found.unreadable),
                len(found.running),
                len(snap.jobs) - len(found.running),
                len(snap.executors.live) if snap.executors is not None else 0,
            )
            return len(found.running)

    def final_stage(self, job: str) -> StageId | None:
        """The last stage of ``job``'s plan (``None`` once the job is forgotten)."""
        record = self._jobs.get(JobId(job))
        if record is None or not record.plan.stages:
            return None
        return record.plan.final.id

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            try:
                self._emit(lambda eid, now: Tick(eid, now))
            except Exception:  # the ticker must survive a bug in one tick
                log.exception("tick failed")

    # ---------------------------------------------------------------- events

    def _emit(self, make: Callable[[int, float], Event]) -> list[Command]:
        with self._lock:
            if self.fatal is not None:
                # The state machine is ahead of the store: it may hold a job's end
                # that was never written (and whose result was never handed over).
                # Nothing more is handled, so no watcher hears of it; the restarted
                # scheduler takes up from what the store holds.
                raise self.fatal
            self._last_event_id += 1
            event = make(self._last_event_id, self._clock())
            if not isinstance(event, Tick):
                log.debug("event %d: %s", event.event_id, describe(event))
            commands = self._state.handle(event)
            # Durable before anything is carried out: a crash from here on
            # recovers to the state after this event.
            persisted = self._persist(event, commands)
            if persisted:
                self.hook.check(event, commands, "persisted")
            for command in commands:
                log.debug("command (cause %d): %s", command.cause, describe(command))
                self._execute(command, event.time)
            if persisted:
                self.hook.check(event, commands, "executed")
            for record in self._jobs.values():
                if not record.state.finished:
                    record.update(self._state.job(record.id), event.time)
            return commands

    # ------------------------------------------------------------ persistence

    def _persist(self, event: Event, commands: list[Command]) -> bool:
        """Write what ``event`` changed to the store (see ``scheduler.persist``).

        Returns False for an event that changes nothing the store keeps.
        """
        changes = state_changes(self._state, self._jobs)
        if changes is None:
            return False
        puts, deletes = changes
        if isinstance(event, JobSubmitted):
            record = self._jobs[event.job]
            puts[job_key(event.job, "plan")] = StoredPlan(
                record.sql,
                record.submitted,
                record.submitted_wall,
                event.plan,
                record.request_id,
                record.owner,
            )
            if event.plan.dropped and record.request_id:
                deletes.append(drop_key(record.owner, record.request_id))  # the job answers it
        self._write(puts, deletes)
        return True

    def _write(self, puts: dict[str, object], deletes: list[str] | None = None) -> None:
        """Commit to the store; a failure is fatal (memory is now ahead of the store)."""
        if self.fatal is not None:
            raise self.fatal
        started = time.perf_counter()
        try:
            self._writer.commit(puts, deletes or [])
        except StateStoreError as exc:
            self.fatal = exc
            self._stop.set()
            log.critical("the scheduler stops: %s", exc)
            if self.on_fatal is not None:
                threading.Thread(target=self.on_fatal, args=(exc,), daemon=True).start()
            raise
        took = time.perf_counter() - started
        if took >= SLOW_COMMIT_S:
            log.warning(
                "the state store took %.0f ms to commit (its disk's sync, or etcd): every "
                "event and launch waited",
                took * 1e3,
            )

    def _execute(self, command: Command, now: float) -> None:
        if isinstance(command, ReleaseOutputs) and command.stages is None:
            # The result is read or expired (or the job failed): so are its copies.
            released = self._jobs.get(command.job)
            if released is not None:
                released.drop_result_files()
        if isinstance(command, LaunchTask | CancelTask | ReleaseOutputs):
            entry = self._executors.get(command.executor)
            if entry is None:
                log.warning(
                    "dropping %s for executor %s that has no stream",
                    type(command).__name__,
                    command.executor,
                )
                return
            entry.commands.put(command)
            self.telemetry.command_sent(command, now)
            if isinstance(command, LaunchTask):
                attempt = command.task.attempt
                job = self._jobs.get(attempt.task.job)
                if job is not None:
                    job.task_launched(attempt, now)
        elif isinstance(command, JobSucceeded | JobFailed | JobCancelled):
            self._commits.job_finished(command.job)
            job = self._jobs.get(command.job)
            if job is not None:
                result = command.result if isinstance(command, JobSucceeded) else None
                job.update(self._state.job(command.job), now, result)
                self.telemetry.job_finished(job.id, job.state.value, job.elapsed(now), now)
            if isinstance(command, JobFailed):
                # Under the job's id, which an internal error's message asks to report.
                internal = command.error_type is ErrorType.INTERNAL
                log.log(
                    logging.ERROR if internal else logging.INFO,
                    "job %s failed (%s): %s",
                    command.job,
                    command.error_type.value,
                    command.message,
                )
        elif isinstance(command, CommitWrite | AbortWrite):
            self._commits.put(command)
        elif isinstance(command, LogExecutorHealth):
            who = f"executor {command.executor}" if command.executor else "the scheduler"
            log.warning("%s %s: %s", who, command.change.value, command.detail)
            if command.change is HealthChange.CAME_BACK:
                self.telemetry.false_loss()
        elif isinstance(command, LogRejectedFragment):
            log.error(
                "job %s: internal error, DuckDB refused the SQL of stage %s in task %s: %s\n"
                "-- the stage's SQL, as the planner wrote it:\n%s\n"
                "-- the query it was planned from:\n%s",
                command.job,
                command.stage,
                command.attempt,
                command.message,
                command.fragment,
                command.query,
            )
        elif isinstance(command, DeclareExecutorLost):
            # Every loss in the log with what it rests on: false losses are counted from it.
            log.warning(
                "executor %s lost (%s): %s",
                command.executor,
                command.reason.value,
                command.detail or "-",
            )
            self._closed(command.executor)
        elif isinstance(command, ForgetJob):
            self._jobs.pop(command.job, None)
        elif isinstance(command, ResumeExecutor | RefuseStream | RefuseHeartbeat):
            pass  # answers to the RPC that sent the event: read by its caller
        else:
            log.warning("unknown command %r", command)

    def _closed(self, executor: ExecutorId) -> None:
        """The state machine lost ``executor``: end its stream, note why."""
        entry = self._executors.get(executor)
        if entry is not None:
            entry.commands.put(CLOSE)
        view = self._state.executor(executor)
        if view is not None and view.reason is not None:
            self.telemetry.executor_lost(executor, view.reason, view.detail, self._clock())
        # Entries go with the state machine's bounded history of lost executors.
        listed = {v.id for v in self._state.executors()}
        for gone in [e for e in self._executors if e not in listed]:
            del self._executors[gone]

    # -------------------------------------------------------------- executors

    def register_executor(
        self,
        host: str,
        flight_address: str,
        slots: int,
        pid: int = 0,
        work_dir: str = "",
        resume: ExecutorId | None = None,
        held: frozenset[str] = frozenset(),
        held_jobs: tuple[str, ...] = (),
        cores: int = 0,
        threads: int = 0,
    ) -> ExecutorEntry:
        """Give an executor its id; it takes tasks once its stream connects.

        An executor whose stream broke asks to ``resume`` its id with the
        outputs it ``held``; the state machine decides whether it goes on under
        that id (``entry.resumed``) or under a fresh one, as a new executor.
        ``cores`` and ``threads`` (0: unknown) say how many of its tasks its host
        runs at full speed at once (``ExecutorInfo``; the planner's
        ``PlannerConfig.parallel``).
        """
        if slots < 1:
            raise MangonelError(f"an executor needs at least one slot, got {slots}")
        with self._lock:
            self._executor_seq += 1
            # The random suffix keeps ids unique across scheduler restarts.
            fresh = ExecutorId(f"exec-{self._executor_seq}-{secrets.token_hex(2)}")
            info = ExecutorInfo(fresh, host, flight_address, slots, max(0, cores), max(0, threads))
            jobs = tuple(JobId(j) for j in held_jobs)
            commands = self._emit(
                lambda eid, now: ExecutorRegistered(eid, now, info, resume, held, jobs)
            )
            resumed = next((c.executor for c in commands if isinstance(c, ResumeExecutor)), None)
            entry = ExecutorEntry(resumed or fresh, pid, work_dir, resumed=resumed is not None)
            self._executors[entry.id] = entry
            what = (
                f"reattached under its id ({len(held)} outputs held)" if resumed else "registered"
            )
            log.info(
                "executor %s %s (host %s, flight %s, %d slots of %s threads, %s cores, pid %d)",
                entry.id,
                what,
                host,
                flight_address,
                slots,
                threads or "?",
                cores or "?",
                pid,
            )
            return entry

    def executor_connected(self, executor: ExecutorId) -> Stream:
        """The executor's Connect stream opened: from now on it takes tasks.

        Raises:
            ExecutorNotFoundError: the state machine refused the stream (the
                executor was not waiting to connect); it must register again.
        """
        with self._lock:
            opened = 0

            def event(eid: int, now: float) -> ExecutorConnected:
                nonlocal opened
                opened = eid
                return ExecutorConnected(eid, now, executor)

            commands = self._emit(event)
            entry = self._executors.get(executor)
            if entry is None or any(isinstance(c, RefuseStream) for c in commands):
                raise ExecutorNotFoundError(
                    f"executor {executor} is not waiting to connect; register again"
                )
            return Stream(opened, entry.commands)

    def executor_reopened(
        self,
        executor: ExecutorId,
        holding: frozenset[TaskAttemptId],
        finished: frozenset[TaskAttemptId],
        held_jobs: tuple[str, ...] = (),
    ) -> Stream:
        """A live executor opened a new Connect stream (its link came back after
        a failure): it replaces the old one, which is closed; what the old one may
        have held is sent again on the new one (``state_streams``), the release
        of the ``held_jobs`` that ended too.

        Raises:
            ExecutorNotFoundError: the state machine refused the stream (the
                executor is not live); it must register again.
        """
        with self._lock:
            entry = self._executors.get(executor)
            if entry is None:
                raise ExecutorNotFoundError(f"executor {executor} is not live; register again")
            old, new = entry.commands, queue.SimpleQueue[object]()
            # What the old stream has not taken yet goes first on the new one,
            # before what the state machine sends again (the executor ignores
            # a launch it knows).
            move_queued(old, new)
            entry.commands = new
            opened = 0
            jobs = tuple(JobId(j) for j in held_jobs)

            def event(eid: int, now: float) -> ExecutorStreamReopened:
                nonlocal opened
                opened = eid
                return ExecutorStreamReopened(eid, now, executor, holding, finished, jobs)

            commands = self._emit(event)
            if any(isinstance(c, RefuseStream) for c in commands):
                move_queued(new, old)
                entry.commands = old
                raise ExecutorNotFoundError(f"executor {executor} is not live; register again")
            old.put(CLOSE)
            return Stream(opened, new)

    def connection_closed(self, executor: ExecutorId, detail: str = "", stream: int = 0) -> None:
        """The executor's Connect stream ``stream`` ended: a live executor is lost
        at once, unless a newer stream replaced that one.

        The state machine answers with ``DeclareExecutorLost`` (carried out like
        any other: logged, the stream's queue closed), or with nothing when it
        let the executor go already, or the stream was replaced.
        """
        if self._stop.is_set():
            return
        detail = detail or "its command stream closed"
        reason = LossReason.CONNECTION_LOST
        self._emit(lambda eid, now: ExecutorLost(eid, now, executor, reason, detail, stream))

    def heartbeat(
        self,
        executor: ExecutorId,
        unhealthy: str = "",
        links: tuple[LinkSample, ...] = (),
        probes: tuple[LinkSample, ...] = (),
        running: int | None = None,
        failed_beats: int = 0,
    ) -> bool:
        """Record a heartbeat; return False when the executor must register again.

        ``unhealthy``: why the executor can take no task now, ``""`` when it can.
        ``links``: what its fetches received from each peer since its last beat.
        ``probes``: its link probes since its last beat (``executor.probes``).
        ``running``: the attempts it runs (``None``: not said).
        ``failed_beats``: its heartbeats that failed since its last answered one.

        A thawed executor that was declared lost while frozen hears False here
        (the state machine answers ``RefuseHeartbeat``; its stream was closed
        too): it registers again, asking for its id, and goes on under it when
        outputs it holds are still needed (``state_revival``), else under a new id.
        """
        commands = self._emit(
            lambda eid, now: ExecutorHeartbeat(
                eid, now, executor, unhealthy, links, probes, failed_beats, running
            )
        )
        return not any(isinstance(c, RefuseHeartbeat) for c in commands)

    def probe_targets(self, executor: ExecutorId) -> tuple[ProbeTarget, ...]:
        """The peers ``executor`` is to probe until its next heartbeat
        (``state_probes``): the answer to the heartbeat just recorded."""
        with self._lock:
            return self._state.probe_targets(executor, self._clock())

    def report_completed(
        self,
        attempt: TaskAttemptId,
        executor: ExecutorId,
        outputs: tuple[PartitionOutput, ...],
        elapsed_s: float | None = None,
        files: Mapping[str, bytes] | None = None,
        timings: TaskTimings | None = None,
    ) -> None:
        """A task completed; ``files``: the small files its report carried, by path
        (kept for the client if they may be the job's result); ``timings``: where
        its time went on the executor (kept by ``telemetry``)."""
        with self._lock:
            if self._state.is_current(attempt, executor):
                self.telemetry.task_completed(
                    attempt, executor, outputs, elapsed_s, self._clock(), timings
                )
                record = self._jobs.get(attempt.task.job)
                if files and record is not None:
                    record.keep_result_files(attempt.task.stage, files)
            self._emit(lambda eid, now: TaskCompleted(eid, now, attempt, executor, outputs))

    def report_failed(
        self,
        attempt: TaskAttemptId,
        executor: ExecutorId,
        failure: TaskFailure,
        elapsed_s: float | None = None,
        timings: TaskTimings | None = None,
    ) -> None:
        with self._lock:
            if self._state.is_current(attempt, executor):
                self.telemetry.task_failed(
                    attempt, executor, failure, elapsed_s, self._clock(), timings
                )
            self._emit(lambda eid, now: TaskFailed(eid, now, attempt, executor, failure))

    def drain(self, executor: ExecutorId) -> None:
        with self._lock:
            view = self._state.executor(executor)
            if view is None or view.state not in _LIVE:
                raise ExecutorNotFoundError(f"executor {executor} is not alive")
            self._emit(lambda eid, now: ExecutorDraining(eid, now, executor))

    def executors(self) -> list[ExecutorListing]:
        """Every executor the state machine lists, with the pid it registered with."""
        with self._lock:
            return [
                ExecutorListing(v, e.pid if (e := self._executors.get(v.id)) else 0)
                for v in self._state.executors()
            ]

    def running_tasks(self) -> dict[ExecutorId, int]:
        """Attempts running on each executor, as the state machine counts them."""
        with self._lock:
            return {v.id: v.running for v in self._state.executors()}

    def now(self) -> float:
        """The shell's clock (``time.time()`` unless a test gave another)."""
        return self._clock()

    # ---------------------------------------------------------------- catalog

    def register_table(
        self,
        name: str,
        path: str,
        kind: FileFormat = FileFormat.PARQUET,
        options: Mapping[str, str] | None = None,
        columns: Sequence[tuple[str, str]] = (),
    ) -> Table:
        """Read what the planner needs of the table (Parquet footers; a CSV or JSON
        table's columns, declared or inferred once, and sizes) and add it to the catalog.

        Raises:
            CatalogError: the path is missing or unreadable, or a name, option or
                column is invalid.
        """
        table = load_table(name, path, kind, options, columns)
        name = table.name  # in lower case
        stored = StoredTable(
            table.location,
            table.format.value,
            dict(table.options),
            list(table.text.columns) if table.text is not None else [],
        )
        with self._lock:
            self._write({table_key(name): stored})
            self.catalog.put(table)
            self.unreadable.forget(name)
            # The name now stands for the user's files: a DROP must never delete them.
            self._owned.discard(name)
        log.info("table %s registered: %d files, %d rows", name, len(table.files), table.rows)
        return table

    def drop_table(
        self, name: str, statement: str = "", request: tuple[str, str] | None = None
    ) -> bool:
        """Forget a table; one the warehouse owns loses its files too, once no query
        that may read them runs (``CommitThread.drop``). Whether there was one.
        ``statement``: the ``DROP TABLE`` being planned (``_planning``), not waited for;
        ``request``: its submission's (owner, request id), kept in the store before
        anything is dropped (``StoredDrop``).

        Raises:
            OSError, MangonelError: a warehouse table's location could not be
                written; the table is still there.
        """
        name = name.lower()  # as the catalog keeps it (``load_table``)
        with self._lock:
            table = self.catalog.snapshot().get(name)
            kept = self.unreadable.get(name)
            owned = name in self._owned
            if request is not None and (table is not None or kept is not None):
                self._write({drop_key(*request): StoredDrop(*request, name, self._clock())})
            if not owned or (table is None and kept is None):
                return self._forget_table(name)
        location = table.location if table is not None else kept.stored.path if kept else ""
        return self._commits.drop(
            name, output.normalize(location), readable=table is not None, own=statement
        )

    def drop_table_once(self, name: str, request: tuple[str, str] | None) -> bool:
        """``drop_table`` for the admins' ``DropTable`` call, once per ``request``
        (owner, request id; None: a client that sends none). A call sent again
        after its answer was lost (the scheduler died, a link was cut) is answered
        True when the first one dropped the table: from memory, or after a restart
        or failover from the ``StoredDrop`` it left, kept ``DROP_RETRY_KEEP_S``.
        Without it the retry said "no table" of the table the call had dropped.
        Whether there was one.

        Raises:
            OSError, MangonelError: as ``drop_table``.
        """
        if request is None:
            return self.drop_table(name)
        with self._drop_calls:
            with self._lock:
                self._forget_old_drops()
                if request in self._drops_done:
                    return True
            try:
                dropped = self.drop_table(name, request=request)
            except BaseException:
                self._drop_answered(request)  # the table is still there
                raise
            if not dropped:
                self._drop_answered(request)
                return False
            # Dropped, the answer not sent: no event names the moment.
            self.hook.check(Tick(0, self._clock()), [], "dropped")
            with self._lock:
                self._drops_done[request] = StoredDrop(*request, name.lower(), self._clock())
            return True

    def _forget_old_drops(self) -> None:
        """Forget the drops kept for retries longer than ``DROP_RETRY_KEEP_S`` (a
        restart forgets them too: ``restore.rebuild``). Called with the lock held."""
        now = self._clock()
        old = [r for r, d in self._drops_done.items() if now - d.at > defaults.DROP_RETRY_KEEP_S]
        if old:
            self._write({}, [drop_key(*r) for r in old])
            for r in old:
                del self._drops_done[r]

    def _forget_table(self, name: str) -> bool:
        """Forget ``name`` (durable, out of the catalog); whether there was such a
        table. Called with the lock held."""
        kept = self.unreadable.forget(name)
        self._write({}, [table_key(name)])
        dropped = self.catalog.drop(name) or kept is not None
        self._owned.discard(name)
        return dropped

    # ------------------------------------------------------------ writing data

    def _table_committed(self, table: Table) -> None:
        """A write statement made or filled ``table``: durable, listed, the warehouse's."""
        with self._lock:
            self._write({table_key(table.name): StoredTable(table.location, owned=True)})
            self.catalog.put(table)
            self.unreadable.forget(table.name)
            self._owned.add(table.name)

    def _table_unreadable(self, name: str, location: str, error: str) -> None:
        """A write statement's commit took effect and its table's files could not be
        read: durable and the warehouse's all the same, read again later."""
        stored = StoredTable(location, owned=True)
        with self._lock:
            self._write({table_key(name): stored})
            self.unreadable.add(name, restore.UnreadableTable(stored, error, time.time()))
            self._owned.add(name)

    def _running_jobs(self) -> frozenset[str]:
        """The jobs not finished, and the statements being planned (``_planning``)."""
        with self._lock:
            running = {j for j, r in self._jobs.items() if not r.state.finished}
            return frozenset(running | self._planning)

    def _submit_write(
        self,
        statement: WriteStatement,
        dialect: str | None,
        may_write: bool,
        planning: str,
        request: tuple[str, str] | None,
    ) -> DistributedPlan | str:
        """Check a write statement and plan it (``scheduler.writes.plan_statement``);
        or carry out a ``DROP TABLE`` and return the query that answers it.
        ``planning``: the statement's place among those being planned (``_planning``);
        ``request``: its submission's (owner, request id), if it has one.

        Raises:
            PermissionDeniedError: the user may not write, or not there.
            QueryError: (a subclass) the statement cannot run as written.
        """
        if not may_write:
            raise PermissionDeniedError(f"{statement.kind.value} is refused: {WRITER_HINT}")
        if statement.kind is WriteKind.DROP_TABLE:
            with self._lock:
                if request is not None and self._drops_done.pop(request, None) is not None:
                    return DROPPED  # before a restart; its client tries again
            try:
                dropped = self.drop_table(statement.table, planning, request)
            except BaseException:
                self._drop_answered(request)  # the table is still there
                raise
            if not dropped:
                self._drop_answered(request)
                if not statement.if_not_exists:
                    raise UnknownTableError(f"there is no table {statement.table!r} to drop")
            else:
                # Dropped, its job not written: no event names the moment.
                self.hook.check(Tick(0, self._clock()), [], "dropped")
            return DROPPED
        if statement.table:
            self.unreadable.refuse(statement.table, "written")
        with self._lock:
            owned = frozenset(self._owned)
        return plan_statement(
            statement,
            self.catalog.snapshot(),
            owned,
            WriteSettings(self.warehouse, self.config.write_roots),
            self._planner(),
            dialect,
        )

    def _drop_answered(self, request: tuple[str, str] | None) -> None:
        """Delete a drop's ``StoredDrop`` that no retry needs (it dropped nothing).
        A store that failed keeps it: the restart finds whether the table went."""
        if request is not None:
            with self._lock, contextlib.suppress(StateStoreError):
                self._write({}, [drop_key(*request)])

    def tables(self) -> list[Table]:
        return sorted(self.catalog.snapshot().values(), key=lambda t: t.name)

    def retirements_waiting(self) -> int:
        """Replaces and drops whose old files wait for the jobs that may read them."""
        with self._lock:
            return self._commits.waiting()

    # ------------------------------------------------------------------- jobs

    def plan(self, sql: str, dialect: str | None = None) -> DistributedPlan:
        """The query's plan, from the plan cache when it holds one; nothing runs."""
        return self._on_catalog(lambda c: self.plans.plan(sql, c, self._planner(), dialect))

    def _on_catalog(self, use: Callable[[Mapping[str, Table]], _T]) -> _T:
        """``use`` of the catalog as it is now, an unknown table explained where it
        is kept unreadable; once more where the table it did not find came into the
        catalog meanwhile: one read again is put back between the look and the
        error, and was in neither place when asked (CI, 2026-12-06)."""
        with self.unreadable.explained():
            snapshot = self.catalog.snapshot()
            try:
                return use(snapshot)
            except UnknownTableError as exc:
                now = self.catalog.snapshot()
                if exc.table and exc.table not in snapshot and exc.table in now:
                    return use(now)
                raise

    def _planner(self) -> PlannerConfig:
        """The planner's settings with the slots a job may hold now: exchanges of
        several waves of tasks are sized to whole waves (``PlannerConfig.slots``).
        Part of the plan cache's key, so a plan made for another cluster size is
        made again."""
        with self._lock:
            slots = self._state.job_slots()
            parallel = self._state.job_parallel()
        return replace(self.config.planner, slots=slots, parallel=parallel)

    def result_schema(self, sql: str, dialect: str | None = None) -> pa.Schema:
        """The Arrow schema of the query's result as DuckDB types it; nothing runs."""
        return self._on_catalog(lambda c: result_schema(sql, c, dialect))

    def parameter_types(
        self, sql: str, count: int, dialect: str | None = None
    ) -> list[pa.DataType | None]:
        """The Arrow types of a query's parameters (``$1``...) where it tells them."""
        return self._on_catalog(lambda c: parameter_types(sql, count, c, dialect))

    def explain(self, sql: str, dialect: str | None = None) -> str:
        return render(self.plan(sql, dialect))

    def submit(
        self,
        sql: str,
        dialect: str | None = None,
        request_id: str = "",
        owner: str = ANONYMOUS.user,
        may_write: bool = True,
    ) -> JobWatch:
        """Plan the query (outside the lock: it can take a while) and start the job.

        A write statement (``sql.writes``) is checked and planned to write
        (``plan.write``); ``may_write``: whether its user may write at all.

        A ``request_id`` the scheduler has seen from the same ``owner`` (a client
        retrying a submission whose answer it lost) gets the job it started then;
        one still being planned, its answer once planned (the job, or the error);
        a ``DROP TABLE`` that took effect before a restart, a job that answers it.
        ``owner`` is kept with the job (and in the store): whether a caller may
        see the job is the service's question (``Principal.may_see``), not the
        state machine's, which never looks at who submitted what.

        Raises:
            QueryError: (a subclass) the query cannot run as written.
            InternalError: the planner failed on a valid query (logged with it).
            StateStoreError, SchedulerStoppingError: the scheduler stops (a store
                error, a SIGTERM) and the call did nothing: send it again.
        """
        if self.fatal is not None:
            raise self.fatal  # it stops: the client tries the leader, or this one again
        try:
            return self._submit_once(sql, dialect, request_id, owner, may_write)
        except MangonelError as exc:
            if self.fatal is None or isinstance(exc, StateStoreError):
                raise
            # It began to stop while this was planned: a DROP TABLE found the
            # commit thread stopping ("was not dropped"; scripts/soak.py
            # --etcd-faults, seed 107). The client tries the leader, or this one
            # again, which finds what took effect (``StoredDrop``).
            raise self.fatal from exc

    def _submit_once(
        self, sql: str, dialect: str | None, request_id: str, owner: str, may_write: bool
    ) -> JobWatch:
        """``submit``, once per (owner, ``request_id``)."""
        if not request_id:
            return self._submit(sql, dialect, None, owner, may_write)
        request = (owner, request_id)
        with self._lock:
            existing = self._submitted(request)
            if existing is not None:
                return existing
            first = self._submitting.get(request)
            if first is None:
                mine: Future[JobWatch] = Future()
                self._submitting[request] = mine
        if first is not None:
            # Sent again while the first is planned (its answer timed out: a frozen
            # scheduler, a slow link). Planned twice, a DROP TABLE would find its
            # table gone (CI, 2026-12-07: the randomized fault run).
            return first.result()
        try:
            record = self._submit(sql, dialect, request, owner, may_write)
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._submitting[request]  # from here its job (or none) answers
        mine.set_result(record)
        return record

    def _submitted(self, request: tuple[str, str]) -> JobWatch | None:
        """The job of the submission (owner, request id), if any. Called with the lock held."""
        for existing in self._jobs.values():
            if (existing.owner, existing.request_id) == request:
                return existing
        return None

    def _submit(
        self,
        sql: str,
        dialect: str | None,
        request: tuple[str, str] | None,
        owner: str,
        may_write: bool,
    ) -> JobWatch:
        """``submit``, once per submission."""
        started = time.perf_counter()
        with self._lock:
            # Planned on the catalog as it is now: a replace or drop committed
            # meanwhile keeps the files for this statement's job too.
            planning = f"planning-{next(self._planning_seq)}"
            self._planning.add(planning)
        try:
            statement = parse_write(sql, dialect)
            if statement is None:
                # As ``plan``: a table read again between the look and the error
                # is planned on (CI, 2026-12-07: a submission met that race).
                plan = self._on_catalog(lambda c: self.plans.plan(sql, c, self._planner(), dialect))
            else:
                with self.unreadable.explained():
                    planned = self._submit_write(statement, dialect, may_write, planning, request)
                if isinstance(planned, str):  # done already: its answer is a query
                    plan = self.plans.plan(planned, self.catalog.snapshot(), self._planner())
                    if statement.kind is WriteKind.DROP_TABLE:
                        plan = replace(plan, dropped=statement.table)
                else:
                    plan = planned
        except BaseException as err:
            if isinstance(err, InternalError):
                log.error("planning failed, a bug in mangonel: %s\n-- the query:\n%s", err, sql)
            with self._lock:
                self._planning.discard(planning)
                self._commits.planned(planning, None)
            raise
        with self._lock:
            self._planning.discard(planning)
            job = JobId(secrets.token_hex(4))
            while job in self._jobs:
                job = JobId(secrets.token_hex(4))
            record = JobWatch.create(job, sql, plan, self._clock())
            record.planning_s = time.perf_counter() - started
            record.request_id = request[1] if request is not None else ""
            record.owner = owner
            self._jobs[job] = record
            self._commits.planned(planning, job)
            self.telemetry.job_submitted(plan.fallback)
            # The planning time says what a query's first run paid (a plan the
            # cache held takes well under a millisecond).
            log.info(
                "job %s submitted by %s: %d stages, %d tasks, planned in %.1f ms",
                job,
                owner,
                len(plan.stages),
                sum(s.num_tasks for s in plan.stages),
                (time.perf_counter() - started) * 1e3,
            )
            if plan.fallback is not None:
                log.warning(
                    "job %s runs whole in one task (the planner does not split it): %s",
                    job,
                    plan.fallback,
                )
            try:
                self._emit(lambda eid, now: JobSubmitted(eid, now, job, plan))
            except BaseException:
                # Not in the store: no scheduler will run it, so none may name it (a
                # retry of this submission, answered with it, then watched it on the
                # scheduler that took over, which had never heard of it).
                del self._jobs[job]
                raise
            return record

    def job(self, job: JobId) -> JobWatch:
        with self._lock:
            record = self._jobs.get(job)
        if record is None:
            raise JobNotFoundError(
                f"no job {job!r} on this scheduler; `mangonel status` lists jobs"
            )
        return record

    def jobs(self) -> list[JobWatch]:
        with self._lock:
            return list(self._jobs.values())

    def cancel(self, job: JobId, reason: str = "cancelled by the user") -> bool:
        """Cancel a job; return False when it had finished already."""
        self.job(job)
        commands = self._emit(lambda eid, now: CancelRequested(eid, now, job, reason))
        return any(isinstance(c, JobCancelled) and c.job == job for c in commands)

    def release_result(self, job: JobId) -> None:
        """The client read the result: its files may go (reading twice is harmless)."""
        self.job(job).drop_result_files()
        self._emit(lambda eid, now: ResultRead(eid, now, job))


def describe(item: Event | Command) -> str:
    """A one-line log text of an event or command, with its ids but not whole plans."""
    if isinstance(item, JobSubmitted):
        return f"JobSubmitted job={item.job} stages={len(item.plan.stages)}"
    if isinstance(item, LaunchTask):
        copy = " (speculative copy)" if item.speculative else ""
        return f"LaunchTask {item.task.attempt} -> {item.executor}{copy}"
    if isinstance(item, TaskCompleted):
        return f"TaskCompleted {item.attempt} on {item.executor} ({len(item.outputs)} outputs)"
    if isinstance(item, JobSucceeded):
        return f"JobSucceeded job={item.job} ({len(item.result)} result partitions)"
    return repr(item)
