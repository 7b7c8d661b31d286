"""The scheduler's I/O shell, without the network: events in, commands carried out.

``SchedulerCore`` wraps the pure state machine. It turns what happens outside
(an executor registers, a task reports, a client submits SQL, time passes) into
events with increasing ``event_id``s and ``time.monotonic()`` times, feeds them
to ``StateMachine.handle`` under one lock, and carries out the commands it gets
back while still holding the lock, so that commands reach each executor's
queue in the order the state machine decided them:

* ``LaunchTask`` / ``CancelTask`` / ``ReleaseOutputs``: onto the executor's
  command queue, which its Connect stream drains.
* ``JobSucceeded`` / ``JobFailed``: finish the job record; its watchers wake.
  Every live executor that ran a task of the job is told to release the job's
  files, not only those holding current outputs: superseded and late attempts
  leave files too, and nobody else would delete them.
* ``DeclareExecutorLost``: mark the executor lost and close its stream, with the
  state machine's reason and detail. A drained executor that still holds a
  result the client has not read keeps its stream (and so its Flight server)
  until the result is released; then it is let go.

Before any command of an event is carried out, what the event changed is
committed to the state store (``scheduler.persist``: the jobs it touched, the
executors, the catalog), so a scheduler killed at any moment restarts from a
state it can go on from: ``recover()`` reads the store back, and
``SchedulerRecovered`` gives up on the attempts that were running and makes
the executors of the previous run reattach (``register_executor(resume=...)``
then ``ExecutorReattached`` with the outputs they still hold). A write that
fails (another scheduler took the store over, or it cannot be reached) is
fatal: ``fatal`` is set, ``on_fatal`` runs, and the scheduler must stop.

After every event the shell copies the state machine's view of each unfinished
job (``JobView``) into its ``JobRecord``, so ``WatchJob`` and ``ClusterStatus``
show the state machine's own numbers: tasks done, running, pending, re-run and
recomputed, rows and bytes of the current outputs.

The gRPC servicers (``scheduler.service``) call into this class and convert
messages; this module never sees a protobuf message.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from mangonel.catalog import Table, load_table
from mangonel.errors import (
    JobCancelledError,
    JobFailedError,
    MangonelError,
    StateStoreError,
)
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.plan.explain import render
from mangonel.plan.planner import PlanCache, PlannerConfig
from mangonel.scheduler.events import (
    Command,
    DeclareExecutorLost,
    Event,
    ExecutorDraining,
    ExecutorHeartbeat,
    ExecutorLost,
    ExecutorReattached,
    ExecutorRegistered,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    Limits,
    LossReason,
    SchedulerRecovered,
    TaskCompleted,
    TaskFailed,
    Tick,
)
from mangonel.scheduler.hooks import NO_HOOK, EventHook
from mangonel.scheduler.jobs import JobPhase, JobRecord
from mangonel.scheduler.persist import (
    EXECUTORS_KEY,
    META_KEY,
    StateWriter,
    StoredMeta,
    StoredOutcome,
    StoredPlan,
    StoredTable,
    job_key,
    job_keys,
    read_snapshot,
    table_key,
)
from mangonel.scheduler.registry import CLOSE, ExecutorEntry, ExecutorPhase
from mangonel.scheduler.state_executors import RegistrySnapshot
from mangonel.scheduler.state_jobs import JobProgress
from mangonel.scheduler.state_jobs import JobRecord as StateJobRecord
from mangonel.scheduler.state_views import ExecutorState, ExecutorView, JobView
from mangonel.scheduler.store import CatalogStore, MemoryCatalogStore, MemoryStateStore, StateStore
from mangonel.scheduler.telemetry import Telemetry
from mangonel.task import (
    CancelTask,
    ExecutorInfo,
    FetchFailed,
    LaunchTask,
    PartitionOutput,
    ReleaseOutputs,
    TaskFailure,
)

log = logging.getLogger(__name__)


class StateMachine(Protocol):
    """What the shell needs of ``scheduler.state.SchedulerState``."""

    def handle(self, event: Event) -> list[Command]: ...

    def job(self, job_id: JobId) -> JobView | None: ...

    def executors(self) -> list[ExecutorView]: ...

    def awaits(self, executor: ExecutorId) -> bool: ...

    def unfinished_jobs(self) -> list[JobId]: ...

    def export_job(self, job_id: JobId) -> JobProgress | None: ...

    def export_executors(self) -> RegistrySnapshot: ...

    @property
    def no_executor_since(self) -> float | None: ...

    def restore(
        self,
        executors: RegistrySnapshot | None,
        jobs: list[StateJobRecord],
        finished: list[JobView],
        no_executor_since: float | None,
    ) -> None: ...


class JobNotFoundError(MangonelError):
    """No job with this id (finished jobs are forgotten when the scheduler restarts)."""


class ExecutorNotFoundError(MangonelError):
    """The scheduler does not know this executor (lost, or the scheduler restarted)."""


@dataclass(frozen=True)
class CoreConfig:
    """Settings of the shell around the state machine.

    Attributes:
        planner: Passed to ``plan_query`` for every job.
        plan_cache: Plans of recent queries kept for the same SQL sent again
            (``plan.planner.PlanCache``); 0 plans every query afresh.
        limits: Given to the state machine; the shell reads the heartbeat timeout.
        tick_interval_s: How often time passes for the state machine.
        result_ttl_s: A result no client released is deleted after this long.
        keep_jobs: Finished jobs still listed by ``ClusterStatus``.
        keep_lost_executors: Lost executors still listed by ``ClusterStatus``.
        connect_timeout_s: An executor that registered but did not open its
            command stream in this long is written off (it died in between).
    """

    planner: PlannerConfig = field(default_factory=PlannerConfig)
    plan_cache: int = 256
    limits: Limits = field(default_factory=Limits)
    tick_interval_s: float = 0.25
    result_ttl_s: float = 600.0
    keep_jobs: int = 200
    keep_lost_executors: int = 100
    connect_timeout_s: float = 60.0

    @property
    def heartbeat_interval_s(self) -> float:
        # Several beats per timeout, so one delayed beat never looks like a loss.
        return max(0.05, min(1.0, self.limits.heartbeat_timeout_s / 4))


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
        self._jobs: dict[JobId, JobRecord] = {}
        self._cancelled: set[JobId] = set()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        # Attempt history, counters and bytes held, for the web UI and /metrics.
        self.telemetry = Telemetry(keep_jobs=self.config.keep_jobs)
        self.plans = PlanCache(self.config.plan_cache)

    # ------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Start the ticker thread (``Tick`` events, result time-to-live)."""
        self._ticker = threading.Thread(target=self._tick_loop, name="scheduler-tick", daemon=True)
        self._ticker.start()

    def stop(self) -> None:
        """Stop ticking and end every executor's command stream."""
        self._stop.set()
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
            dropped = []
            for name, table in snap.tables.items():
                try:
                    self.catalog.put(load_table(name, table.path))
                except MangonelError as exc:
                    log.error("table %s cannot be read any more, so it is dropped: %s", name, exc)
                    dropped.append(table_key(name))
            running: list[StateJobRecord] = []
            finished: list[JobView] = []
            for stored in snap.jobs:
                record = JobRecord.create(
                    stored.id, stored.plan.sql, stored.plan.plan, stored.plan.submitted
                )
                record.submitted_wall = stored.plan.submitted_wall
                record.request_id = stored.plan.request_id
                outcome = stored.outcome
                if outcome is not None:
                    record.view = outcome.view
                    record.phase, record.finished = outcome.phase, outcome.finished
                    record.error, record.error_type = outcome.error, outcome.error_type
                    record.result, record.result_released = outcome.result, outcome.result_released
                    if outcome.view is not None:
                        finished.append(outcome.view)
                    if outcome.phase is JobPhase.CANCELLED:
                        self._cancelled.add(stored.id)
                elif stored.progress is not None:
                    running.append(StateJobRecord.restore(stored.plan.plan, stored.progress))
                self._jobs[stored.id] = record
            self._state.restore(snap.executors, running, finished, snap.meta.no_executor_since)
            self._restore_executor_entries()
            if dropped:
                self._write({}, dropped)
            self._emit(lambda eid, now: SchedulerRecovered(eid, now))
            log.info(
                "recovered from %s: %d tables, %d unfinished and %d finished jobs, %d executors "
                "expected back",
                self.store.url,
                len(snap.tables) - len(dropped),
                len(running),
                len(snap.jobs) - len(running),
                len(snap.executors.live) if snap.executors is not None else 0,
            )
            return len(running)

    def final_stage(self, job: str) -> StageId | None:
        """The last stage of ``job``'s plan (``None`` once the job is forgotten)."""
        record = self._jobs.get(JobId(job))
        return record.plan.final.id if record is not None else None

    def _restore_executor_entries(self) -> None:
        """List the executors of the previous run: lost ones as they were, live
        ones as waiting to reconnect (until they reattach or are given up on)."""
        now = self._clock()
        for view in self._state.executors():
            info = ExecutorInfo(view.id, view.host, view.flight_address, view.slots)
            entry = ExecutorEntry(info, pid=0, work_dir="", restored=True, last_heard=now)
            if view.state is ExecutorState.LOST:
                entry.phase, entry.reason = ExecutorPhase.LOST, view.reason
            elif view.state is ExecutorState.DRAINING:
                entry.phase = ExecutorPhase.DRAINING
            else:
                entry.phase = ExecutorPhase.ALIVE
            entry.since, entry.detail = view.since, view.detail
            self._executors[view.id] = entry

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.config.tick_interval_s):
            try:
                self._emit(lambda eid, now: Tick(eid, now))
                self._expire_results()
            except Exception:  # the ticker must survive a bug in one tick
                log.exception("tick failed")

    # ---------------------------------------------------------------- events

    def _emit(self, make: Callable[[int, float], Event]) -> list[Command]:
        with self._lock:
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
            self._release_strays(commands, event.time)
            if persisted:
                self.hook.check(event, commands, "executed")
            for record in self._jobs.values():
                if not record.phase.finished:
                    record.update(self._state.job(record.id), event.time)
            return commands

    # ------------------------------------------------------------ persistence

    def _persist(self, event: Event, commands: list[Command]) -> bool:
        """Write what ``event`` changed to the store (see ``scheduler.persist``).

        Returns False for an event that changes nothing the store keeps.
        """
        if isinstance(event, ExecutorHeartbeat | Tick) and not commands:
            return False
        state = self._state
        puts: dict[str, object] = {}
        deletes: list[str] = []
        ended = {c.job: c for c in commands if isinstance(c, JobSucceeded | JobFailed)}
        job = _job_of(event)
        touched = [job] if job is not None else state.unfinished_jobs()
        touched += [j for j in ended if j not in touched]
        for jid in touched:
            progress = state.export_job(jid)
            if progress is not None:
                puts[job_key(jid, "progress")] = progress
            elif jid in ended:
                puts[job_key(jid, "outcome")] = self._outcome(jid, ended[jid], event.time)
                deletes.append(job_key(jid, "progress"))
        if isinstance(event, JobSubmitted):
            record = self._jobs[event.job]
            puts[job_key(event.job, "plan")] = StoredPlan(
                record.sql, record.submitted, record.submitted_wall, event.plan, record.request_id
            )
        puts[EXECUTORS_KEY] = state.export_executors()
        puts[META_KEY] = StoredMeta(state.no_executor_since)
        self._write(puts, deletes)
        return True

    def _outcome(self, job: JobId, command: JobSucceeded | JobFailed, now: float) -> StoredOutcome:
        view = self._state.job(job)
        if isinstance(command, JobSucceeded):
            return StoredOutcome(JobPhase.SUCCEEDED, now, result=command.result, view=view)
        if job in self._cancelled:
            return StoredOutcome(
                JobPhase.CANCELLED, now, command.message, JobCancelledError.__name__, view=view
            )
        return StoredOutcome(
            JobPhase.FAILED, now, command.message, JobFailedError.__name__, view=view
        )

    def _save_outcome(self, record: JobRecord) -> None:
        """Write a finished job's outcome as the shell holds it (e.g. once its result was read)."""
        if record.finished is None:
            return
        outcome = StoredOutcome(
            record.phase,
            record.finished,
            record.error,
            record.error_type,
            record.result,
            record.result_released,
            record.view,
        )
        self._write({job_key(record.id, "outcome"): outcome})

    def _write(self, puts: dict[str, object], deletes: list[str] | None = None) -> None:
        """Commit to the store; a failure is fatal (memory is now ahead of the store)."""
        if self.fatal is not None:
            raise self.fatal
        try:
            self._writer.commit(puts, deletes or [])
        except StateStoreError as exc:
            self.fatal = exc
            self._stop.set()
            log.critical("the scheduler stops: %s", exc)
            if self.on_fatal is not None:
                threading.Thread(target=self.on_fatal, args=(exc,), daemon=True).start()
            raise

    def _execute(self, command: Command, now: float) -> None:
        if isinstance(command, LaunchTask | CancelTask | ReleaseOutputs):
            entry = self._executors.get(command.executor)
            if entry is None or entry.phase is ExecutorPhase.LOST:
                log.warning(
                    "dropping %s for executor %s that is gone",
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
                    job.task_launched(command.executor, attempt, now)
        elif isinstance(command, JobSucceeded):
            job = self._jobs.get(command.job)
            if job is not None:
                job.update(self._state.job(command.job), now)
                job.finish(JobPhase.SUCCEEDED, now, result=command.result)
                self.telemetry.job_finished(job.id, job.phase.value, job.elapsed(now), now)
        elif isinstance(command, JobFailed):
            job = self._jobs.get(command.job)
            if job is not None:
                job.update(self._state.job(command.job), now)
                if command.job in self._cancelled:
                    job.finish(
                        JobPhase.CANCELLED,
                        now,
                        error=command.message,
                        error_type=JobCancelledError.__name__,
                    )
                else:
                    job.finish(
                        JobPhase.FAILED,
                        now,
                        error=command.message,
                        error_type=JobFailedError.__name__,
                    )
                self.telemetry.job_finished(job.id, job.phase.value, job.elapsed(now), now)
        elif isinstance(command, DeclareExecutorLost):
            detail = self._loss_detail(command.executor) or "declared lost by the scheduler"
            entry = self._executors.get(command.executor)
            if (
                command.reason is LossReason.DRAINED
                and entry is not None
                and entry.phase is ExecutorPhase.DRAINING
                and self._holds_unread_results(command.executor)
            ):
                # Closing the stream would end the process, and with it the
                # result a client is about to read: wait for the release.
                entry.awaiting_results = True
                entry.detail = f"{detail}; serving results not read yet"
                log.info("executor %s drained; it serves unread results first", entry.id)
                return
            self._mark_lost(command.executor, command.reason, detail)
        else:
            log.warning("unknown command %r", command)

    def _loss_detail(self, executor: ExecutorId) -> str:
        """The state machine's words for why it let ``executor`` go."""
        for view in self._state.executors():
            if view.id == executor:
                return view.detail
        return ""

    def _release_strays(self, commands: list[Command], now: float) -> None:
        """Release ended jobs' files on executors the state machine did not name.

        The state machine releases outputs where current attempts left them;
        attempts that were superseded (re-run elsewhere, reported late, cut
        off by a cancel) left files on other executors, which only the shell
        knows of (it saw every launch).
        """
        for command in commands:
            if not isinstance(command, JobSucceeded | JobFailed):
                continue
            job = self._jobs.get(command.job)
            if job is None:
                continue
            covered = {
                c.executor
                for c in commands
                if isinstance(c, ReleaseOutputs) and c.job == command.job
            }
            if isinstance(command, JobSucceeded):
                # The final stage's files wait for the client (``_release``).
                stages: tuple[StageId, ...] | None = tuple(s.id for s in job.plan.stages[:-1])
                if not stages:
                    continue
            else:
                stages = None
            for executor in sorted(job.executors - covered):
                entry = self._executors.get(executor)
                if entry is not None and entry.usable:  # a lost one's files went with it
                    self._execute(ReleaseOutputs(command.cause, executor, job.id, stages), now)

    def _holds_unread_results(self, executor: ExecutorId) -> bool:
        return any(
            record.phase is JobPhase.SUCCEEDED
            and not record.result_released
            and any(loc.executor == executor for loc in record.result)
            for record in self._jobs.values()
        )

    def _let_drained_go(self) -> None:
        """Close the streams of drained executors whose results were all read."""
        for entry in list(self._executors.values()):
            if (
                entry.awaiting_results
                and entry.phase is ExecutorPhase.DRAINING
                and not self._holds_unread_results(entry.id)
            ):
                detail = entry.detail.removesuffix("; serving results not read yet")
                self._mark_lost(entry.id, LossReason.DRAINED, detail)

    def _mark_lost(self, executor: ExecutorId, reason: LossReason, detail: str) -> None:
        entry = self._executors.get(executor)
        if entry is None or entry.phase is ExecutorPhase.LOST:
            return
        entry.move(ExecutorPhase.LOST, reason, detail)
        self.telemetry.executor_lost(executor, reason, detail, self._clock())
        # Lost entries stay listed for the status page, but not forever: a
        # forgotten id reads as unknown, which is handled as lost.
        lost = [e for e in self._executors.values() if e.phase is ExecutorPhase.LOST]
        for old in lost[: max(0, len(lost) - self.config.keep_lost_executors)]:
            del self._executors[old.id]

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
    ) -> ExecutorEntry:
        """Give an executor its id; it takes tasks once its stream connects.

        An executor whose stream broke asks to ``resume`` its id: after a
        scheduler restart, an executor the restored state still counts on goes
        on under that id with the outputs it ``held`` (``entry.resume_held``
        is set); any other gets a new id, as a new executor.
        """
        if slots < 1:
            raise MangonelError(f"an executor needs at least one slot, got {slots}")
        with self._lock:
            info: ExecutorInfo
            old = self._executors.get(resume) if resume else None
            if (
                resume
                and self._state.awaits(resume)
                and (old is None or old.restored or old.phase is ExecutorPhase.CONNECTING)
            ):
                info = ExecutorInfo(resume, host, flight_address, slots)
                entry = ExecutorEntry(info, pid, work_dir, resume_held=held, resume_jobs=held_jobs)
                what = f"reattached after the scheduler restarted ({len(held)} outputs held)"
            else:
                self._executor_seq += 1
                # The random suffix keeps ids unique across scheduler restarts.
                eid = ExecutorId(f"exec-{self._executor_seq}-{secrets.token_hex(2)}")
                info = ExecutorInfo(eid, host, flight_address, slots)
                entry = ExecutorEntry(info, pid, work_dir)
                what = "registered"
            entry.last_heard = self._clock()
            self._executors[info.id] = entry
            log.info(
                "executor %s %s (host %s, flight %s, %d slots, pid %d)",
                info.id,
                what,
                host,
                flight_address,
                slots,
                pid,
            )
            return entry

    def executor_connected(self, executor: ExecutorId) -> ExecutorEntry:
        """The executor's Connect stream opened: from now on it takes tasks."""
        with self._lock:
            entry = self._executors.get(executor)
            if entry is None or entry.phase is not ExecutorPhase.CONNECTING:
                raise ExecutorNotFoundError(
                    f"executor {executor} is not waiting to connect; register again"
                )
            # Listed in the order they connected, which is the state machine's
            # order too (it breaks ties between idle executors by it).
            self._executors[executor] = self._executors.pop(executor)
            if entry.resume_held is None:
                entry.move(ExecutorPhase.ALIVE)
                self._emit(lambda eid, now: ExecutorRegistered(eid, now, entry.info))
                return entry
            held = entry.resume_held
            draining = any(
                v.id == executor and v.state is ExecutorState.DRAINING
                for v in self._state.executors()
            )
            entry.move(ExecutorPhase.DRAINING if draining else ExecutorPhase.ALIVE)
            commands = self._emit(lambda eid, now: ExecutorReattached(eid, now, entry.info, held))
            self._release_unneeded(entry, commands[0].cause if commands else self._last_event_id)
            return entry

    def _release_unneeded(self, entry: ExecutorEntry, cause: int) -> None:
        """Delete a reattached executor's files of jobs that ended while it was away."""
        now = self._clock()
        for name in entry.resume_jobs:
            record = self._jobs.get(JobId(name))
            if record is not None and not record.phase.finished:
                # Files of its attempts from before the restart: released with the job.
                record.executors.add(entry.id)
                continue
            stages: tuple[StageId, ...] | None = None
            if (
                record is not None
                and record.phase is JobPhase.SUCCEEDED
                and not record.result_released
            ):
                stages = tuple(s.id for s in record.plan.stages[:-1])  # keep the result
                if not stages:
                    continue
            self._execute(ReleaseOutputs(cause, entry.id, JobId(name), stages), now)

    def connection_closed(self, executor: ExecutorId, detail: str = "") -> None:
        """The executor's Connect stream ended: the executor is lost at once."""
        if self._stop.is_set():
            return
        with self._lock:
            entry = self._executors.get(executor)
            if entry is None or entry.phase in (ExecutorPhase.LOST, ExecutorPhase.CONNECTING):
                return
            reason = (
                LossReason.DRAINED
                if entry.phase is ExecutorPhase.DRAINING
                else LossReason.CONNECTION_LOST
            )
            detail = detail or "its command stream closed"
            self._mark_lost(executor, reason, detail)
            self._emit(lambda eid, now: ExecutorLost(eid, now, executor, reason, detail))

    def heartbeat(self, executor: ExecutorId) -> bool:
        """Record a heartbeat; return False when the executor must register again.

        A thawed executor that was declared lost while frozen hears False here
        (its stream was closed too): it registers anew, under a new id.
        """
        with self._lock:
            entry = self._executors.get(executor)
            if entry is None or entry.phase is ExecutorPhase.LOST:
                return False
            entry.last_heard = self._clock()
            if entry.usable:
                self._emit(lambda eid, now: ExecutorHeartbeat(eid, now, executor))
            return True

    def report_completed(
        self,
        attempt: TaskAttemptId,
        executor: ExecutorId,
        outputs: tuple[PartitionOutput, ...],
        elapsed_s: float | None = None,
    ) -> None:
        with self._lock:
            if not self._accepts_reports(executor, attempt):
                return
            self.telemetry.task_completed(attempt, executor, outputs, elapsed_s, self._clock())
            self._emit(lambda eid, now: TaskCompleted(eid, now, attempt, executor, outputs))

    def report_failed(
        self,
        attempt: TaskAttemptId,
        executor: ExecutorId,
        failure: TaskFailure,
        elapsed_s: float | None = None,
    ) -> None:
        with self._lock:
            if not self._accepts_reports(executor, attempt):
                return
            self.telemetry.task_failed(attempt, executor, failure, elapsed_s, self._clock())
            self._emit(lambda eid, now: TaskFailed(eid, now, attempt, executor, failure))

    def _accepts_reports(self, executor: ExecutorId, attempt: TaskAttemptId) -> bool:
        entry = self._executors.get(executor)
        if entry is None or not entry.usable:
            # Its outputs were already written off when it was lost; a late report
            # must not bring them back.
            log.info("ignoring report of %s from executor %s that is not alive", attempt, executor)
            return False
        entry.last_heard = self._clock()
        return True

    def drain(self, executor: ExecutorId) -> None:
        with self._lock:
            entry = self._executors.get(executor)
            if entry is None or not entry.usable:
                raise ExecutorNotFoundError(f"executor {executor} is not alive")
            if entry.phase is ExecutorPhase.DRAINING:
                return
            entry.move(ExecutorPhase.DRAINING)
            self._emit(lambda eid, now: ExecutorDraining(eid, now, executor))

    def executors(self) -> list[ExecutorEntry]:
        with self._lock:
            return list(self._executors.values())

    def running_tasks(self) -> dict[ExecutorId, int]:
        """Attempts running on each executor, as the state machine counts them."""
        with self._lock:
            return {v.id: v.running for v in self._state.executors()}

    def now(self) -> float:
        """The shell's clock (``time.monotonic()`` unless a test gave another)."""
        return self._clock()

    # ---------------------------------------------------------------- catalog

    def register_table(self, name: str, path: str) -> Table:
        """Read the table's Parquet footers and add it to the catalog.

        Raises:
            CatalogError: the path is missing, not Parquet, or the name is invalid.
        """
        table = load_table(name, path)
        with self._lock:
            self._write({table_key(name): StoredTable(table.location)})
            self.catalog.put(table)
        log.info("table %s registered: %d files, %d rows", name, len(table.files), table.rows)
        return table

    def drop_table(self, name: str) -> bool:
        with self._lock:
            self._write({}, [table_key(name)])
            return self.catalog.drop(name)

    def tables(self) -> list[Table]:
        return sorted(self.catalog.snapshot().values(), key=lambda t: t.name)

    # ------------------------------------------------------------------- jobs

    def explain(self, sql: str, dialect: str | None = None) -> str:
        plan = self.plans.plan(sql, self.catalog.snapshot(), self.config.planner, dialect)
        return render(plan)

    def submit(self, sql: str, dialect: str | None = None, request_id: str = "") -> JobRecord:
        """Plan the query (outside the lock: it can take a while) and start the job.

        A ``request_id`` the scheduler has seen (a client retrying a submission
        whose answer it lost) gets the job it started then.

        Raises:
            QueryError: (a subclass) the query cannot run as written.
        """
        if request_id:
            with self._lock:
                for existing in self._jobs.values():
                    if existing.request_id == request_id:
                        return existing
        plan = self.plans.plan(sql, self.catalog.snapshot(), self.config.planner, dialect)
        with self._lock:
            if request_id:
                for existing in self._jobs.values():
                    if existing.request_id == request_id:
                        return existing
            job = JobId(secrets.token_hex(4))
            while job in self._jobs:
                job = JobId(secrets.token_hex(4))
            record = JobRecord.create(job, sql, plan, self._clock())
            record.request_id = request_id
            self._jobs[job] = record
            log.info("job %s submitted: %d stages", job, len(plan.stages))
            self._emit(lambda eid, now: JobSubmitted(eid, now, job, plan))
            return record

    def job(self, job: JobId) -> JobRecord:
        with self._lock:
            record = self._jobs.get(job)
        if record is None:
            raise JobNotFoundError(
                f"no job {job!r} on this scheduler; `mangonel status` lists jobs"
            )
        return record

    def jobs(self) -> list[JobRecord]:
        with self._lock:
            return list(self._jobs.values())

    def cancel(self, job: JobId, reason: str = "cancelled by the user") -> bool:
        """Cancel a running job; return False when it had finished already."""
        record = self.job(job)
        with self._lock:
            if record.phase.finished:
                return False
            self._cancelled.add(job)
            self._emit(lambda eid, now: JobCancelled(eid, now, job, reason))
            if not record.phase.finished:
                # The state machine may answer a cancel with CancelTask commands only;
                # the job is over for its watchers either way.
                record.finish(
                    JobPhase.CANCELLED,
                    self._clock(),
                    error=reason,
                    error_type=JobCancelledError.__name__,
                )
            now = self._clock()
            self.telemetry.job_finished(job, record.phase.value, record.elapsed(now), now)
            return True

    def release_result(self, job: JobId) -> None:
        """The client read the result: its files may go."""
        record = self.job(job)
        with self._lock:
            self._release(record, "released by the client")

    def _forget_old_jobs(self) -> None:
        # Finished jobs stay listed for `mangonel status`, but not forever.
        finished = [
            r
            for r in self._jobs.values()
            if r.phase.finished and (r.result_released or r.phase is not JobPhase.SUCCEEDED)
        ]
        excess = len(finished) - self.config.keep_jobs
        forgotten = sorted(finished, key=lambda r: r.submitted)[: max(0, excess)]
        for record in forgotten:
            del self._jobs[record.id]
            self._cancelled.discard(record.id)
        if forgotten:
            self._write({}, [key for r in forgotten for key in job_keys(r.id)])

    def _release(self, record: JobRecord, why: str) -> None:
        """Delete what is left of a succeeded job: its result, and stray attempts' files."""
        if record.phase is not JobPhase.SUCCEEDED or record.result_released:
            return
        record.result_released = True
        self._save_outcome(record)
        self._last_event_id += 1
        cause = self._last_event_id
        holders = {loc.executor for loc in record.result} | record.executors
        for executor in sorted(holders):
            entry = self._executors.get(executor)
            if entry is None or not entry.usable:
                continue  # a lost executor's files are deleted with its life
            # All stages: the intermediate ones went at success, so this is the
            # result plus whatever superseded attempts of the final stage wrote.
            command = ReleaseOutputs(cause, executor, record.id, None)
            log.debug("command (cause %d, result %s): %s", cause, why, describe(command))
            self._execute(command, self._clock())
        self._let_drained_go()

    def _expire_results(self) -> None:
        with self._lock:
            now = self._clock()
            self._forget_old_jobs()
            for entry in list(self._executors.values()):
                if (
                    entry.phase is ExecutorPhase.CONNECTING
                    and now - entry.last_heard > self.config.connect_timeout_s
                ):
                    self._mark_lost(
                        entry.id,
                        LossReason.CONNECTION_LOST,
                        f"registered but opened no command stream in "
                        f"{self.config.connect_timeout_s:g} s",
                    )
            for record in self._jobs.values():
                if (
                    record.phase is JobPhase.SUCCEEDED
                    and not record.result_released
                    and record.finished is not None
                    and now - record.finished > self.config.result_ttl_s
                ):
                    self._release(record, "time-to-live expired")


def _job_of(event: Event) -> JobId | None:
    """The one job an event is about, or ``None`` when it may touch any job."""
    if isinstance(event, JobSubmitted | JobCancelled):
        return event.job
    if isinstance(event, TaskCompleted):
        return event.attempt.task.job
    if isinstance(event, TaskFailed) and not isinstance(event.failure, FetchFailed):
        return event.attempt.task.job  # a fetch failure may lose an executor
    return None


def describe(item: Event | Command) -> str:
    """A one-line log text of an event or command, with its ids but not whole plans."""
    if isinstance(item, JobSubmitted):
        return f"JobSubmitted job={item.job} stages={len(item.plan.stages)}"
    if isinstance(item, LaunchTask):
        return f"LaunchTask {item.task.attempt} -> {item.executor}"
    if isinstance(item, TaskCompleted):
        return f"TaskCompleted {item.attempt} on {item.executor} ({len(item.outputs)} outputs)"
    if isinstance(item, JobSucceeded):
        return f"JobSucceeded job={item.job} ({len(item.result)} result partitions)"
    return repr(item)
