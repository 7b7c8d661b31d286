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
from mangonel.errors import JobCancelledError, JobFailedError, MangonelError
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId
from mangonel.plan.explain import render
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.scheduler.events import (
    CancelTask,
    Command,
    DeclareExecutorLost,
    Event,
    ExecutorDraining,
    ExecutorHeartbeat,
    ExecutorInfo,
    ExecutorLost,
    ExecutorRegistered,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    LaunchTask,
    Limits,
    LossReason,
    PartitionOutput,
    ReleaseOutputs,
    TaskCompleted,
    TaskFailed,
    TaskFailure,
    Tick,
)
from mangonel.scheduler.jobs import JobPhase, JobRecord
from mangonel.scheduler.registry import CLOSE, ExecutorEntry, ExecutorPhase
from mangonel.scheduler.state_views import ExecutorView, JobView
from mangonel.scheduler.store import CatalogStore, MemoryCatalogStore

log = logging.getLogger(__name__)


class StateMachine(Protocol):
    """What the shell needs of ``scheduler.state.SchedulerState``."""

    def handle(self, event: Event) -> list[Command]: ...

    def job(self, job_id: JobId) -> JobView | None: ...

    def executors(self) -> list[ExecutorView]: ...


class JobNotFoundError(MangonelError):
    """No job with this id (finished jobs are forgotten when the scheduler restarts)."""


class ExecutorNotFoundError(MangonelError):
    """The scheduler does not know this executor (lost, or the scheduler restarted)."""


@dataclass(frozen=True)
class CoreConfig:
    """Settings of the shell around the state machine.

    Attributes:
        planner: Passed to ``plan_query`` for every job.
        limits: Given to the state machine; the shell reads the heartbeat timeout.
        tick_interval_s: How often time passes for the state machine.
        result_ttl_s: A result no client released is deleted after this long.
        keep_jobs: Finished jobs still listed by ``ClusterStatus``.
        keep_lost_executors: Lost executors still listed by ``ClusterStatus``.
        connect_timeout_s: An executor that registered but did not open its
            command stream in this long is written off (it died in between).
    """

    planner: PlannerConfig = field(default_factory=PlannerConfig)
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
        clock: Monotonic seconds; injectable for tests.
    """

    def __init__(
        self,
        state: StateMachine,
        config: CoreConfig | None = None,
        catalog: CatalogStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or CoreConfig()
        self.catalog: CatalogStore = catalog or MemoryCatalogStore()
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
            for command in commands:
                log.debug("command (cause %d): %s", command.cause, describe(command))
                self._execute(command, event.time)
            self._release_strays(commands, event.time)
            for record in self._jobs.values():
                if not record.phase.finished:
                    record.update(self._state.job(record.id), event.time)
            return commands

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
        # Lost entries stay listed for the status page, but not forever: a
        # forgotten id reads as unknown, which is handled as lost.
        lost = [e for e in self._executors.values() if e.phase is ExecutorPhase.LOST]
        for old in lost[: max(0, len(lost) - self.config.keep_lost_executors)]:
            del self._executors[old.id]

    # -------------------------------------------------------------- executors

    def register_executor(
        self, host: str, flight_address: str, slots: int, pid: int = 0, work_dir: str = ""
    ) -> ExecutorEntry:
        """Give a new executor its id; it takes tasks once its stream connects."""
        if slots < 1:
            raise MangonelError(f"an executor needs at least one slot, got {slots}")
        with self._lock:
            self._executor_seq += 1
            # The random suffix keeps ids unique across scheduler restarts.
            eid = ExecutorId(f"exec-{self._executor_seq}-{secrets.token_hex(2)}")
            entry = ExecutorEntry(ExecutorInfo(eid, host, flight_address, slots), pid, work_dir)
            entry.last_heard = self._clock()
            self._executors[eid] = entry
            log.info(
                "executor %s registered (host %s, flight %s, %d slots, pid %d)",
                eid,
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
            entry.move(ExecutorPhase.ALIVE)
            self._emit(lambda eid, now: ExecutorRegistered(eid, now, entry.info))
            return entry

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
        self, attempt: TaskAttemptId, executor: ExecutorId, outputs: tuple[PartitionOutput, ...]
    ) -> None:
        with self._lock:
            if not self._accepts_reports(executor, attempt):
                return
            self._emit(lambda eid, now: TaskCompleted(eid, now, attempt, executor, outputs))

    def report_failed(
        self, attempt: TaskAttemptId, executor: ExecutorId, failure: TaskFailure
    ) -> None:
        with self._lock:
            if not self._accepts_reports(executor, attempt):
                return
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
        self.catalog.put(table)
        log.info("table %s registered: %d files, %d rows", name, len(table.files), table.rows)
        return table

    def drop_table(self, name: str) -> bool:
        return self.catalog.drop(name)

    def tables(self) -> list[Table]:
        return sorted(self.catalog.snapshot().values(), key=lambda t: t.name)

    # ------------------------------------------------------------------- jobs

    def explain(self, sql: str, dialect: str | None = None) -> str:
        plan = plan_query(sql, self.catalog.snapshot(), self.config.planner, dialect)
        return render(plan)

    def submit(self, sql: str, dialect: str | None = None) -> JobRecord:
        """Plan the query (outside the lock: it can take a while) and start the job.

        Raises:
            QueryError: (a subclass) the query cannot run as written.
        """
        plan = plan_query(sql, self.catalog.snapshot(), self.config.planner, dialect)
        with self._lock:
            job = JobId(secrets.token_hex(4))
            while job in self._jobs:
                job = JobId(secrets.token_hex(4))
            record = JobRecord.create(job, sql, plan, self._clock())
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
        for record in sorted(finished, key=lambda r: r.submitted)[: max(0, excess)]:
            del self._jobs[record.id]
            self._cancelled.discard(record.id)

    def _release(self, record: JobRecord, why: str) -> None:
        """Delete what is left of a succeeded job: its result, and stray attempts' files."""
        if record.phase is not JobPhase.SUCCEEDED or record.result_released:
            return
        record.result_released = True
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
