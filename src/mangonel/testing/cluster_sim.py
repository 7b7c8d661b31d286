"""A deterministic simulation of a whole cluster in one process, with faults at any step.

The real pure state machines run here: one ``SchedulerState``, persisted after
every event through the shell's own ``persist.state_changes`` into an in-memory
store, and one ``ExecutorMachine`` per simulated executor process. Around them
this module plays everything else, driven by one ``random.Random(seed)``:

* **the network**: every message takes a random time; a stream delivers in
  order, unary calls (reports, heartbeats, registrations) overtake each other;
  calls may be delivered twice (a registration as a lost first try and its
  retry); links are cut both ways, one way, between
  executors only (``PEER_CUT``), or flap; a stream on a cut link breaks after
  ``keepalive_s`` (gRPC's pings), and a call over it fails; an executor whose
  heartbeat is answered after failed ones moves its command stream to a new
  connection (``move_stream``), and what the old one still carried is lost.
* **the executor shells**: slots, task work (durations, slow executors),
  fetches from other executors' disks (unreachable holder, missing file, a
  checksum that does not match), out of memory, disk full, task errors,
  crashes, freezes and thaws, drains.
* **the scheduler shell**: what ``SchedulerCore`` does (ids, streams,
  heartbeats of unknown executors, ticks), crashes at any event (before its
  write, after it, between two of its commands) and restarts from the store.
* **clients**: jobs submitted (several at once), cancelled, results read.
* **clocks**: the scheduler's wall clock steps back and forth (``clock()``),
  executors' clocks drift (``Proc.rate``).

Each task's outputs are values computed from exactly what it read
(``testing.sim_data``), so the result of a job that succeeded is checked
against the answer computed without faults. After every scheduler event the
invariants are checked (``SimChecks``); faults stop at ``faults_until_s`` and
every job must end within ``liveness_s`` after that. A run is a pure function of
``(seed, SimConfig)``: ``python -m mangonel.testing.cluster_sim --seed N``
replays one, and ``shrink`` removes faults from a failing run's schedule while
it still fails.

>>> result = run(SimConfig(seed=3, jobs=2))
>>> result.violation is None and result.jobs_ended == 2
True

Why it is over 1,000 lines: ``ClusterSim`` is one event loop, and its handlers
(the scheduler's shell, the executors' shells, the network, the faults) share
its queue, clock and random stream, which is what makes a run replayable; what
needs none of them is already apart (``sim_world``, ``sim_checks``, ``sim_data``,
``sim_restore``).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from mangonel.executor import events as ex
from mangonel.executor.link import HEARTBEAT_DEADLINE_S
from mangonel.executor.state import ExecutorMachine
from mangonel.ids import ExecutorId, JobId, TaskAttemptId
from mangonel.plan.physical import DistributedPlan
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
    LogExecutorHealth,
    LossReason,
    RefuseHeartbeat,
    RefuseStream,
    ResultRead,
    ResumeExecutor,
    SchedulerRecovered,
    TaskCompleted,
    TaskFailed,
    Tick,
    WriteCommitFailed,
    WriteCommitted,
)
from mangonel.scheduler.persist import (
    StateWriter,
    StoredPlan,
    job_key,
    state_changes,
)
from mangonel.scheduler.state import SchedulerState
from mangonel.scheduler.state_views import ExecutorState
from mangonel.scheduler.store import MemoryStateStore
from mangonel.task import (
    CancelTask,
    ExecutionError,
    ExecutionProblem,
    ExecutorInfo,
    FetchFailed,
    FetchProblem,
    InputMode,
    LaunchTask,
    LinkSample,
    PartitionLocation,
    PartitionOutput,
    ReleaseOutputs,
    TaskSpec,
)
from mangonel.testing import sim_data
from mangonel.testing.scheduler_sim import synthetic_plan
from mangonel.testing.sim_checks import SimChecks
from mangonel.testing.sim_world import (
    CLOCK_STEP_S,
    DRAIN_TIMEOUT_S,
    FAST_LINK_RATE,
    FLAP_CUT_S,
    FLAP_EVERY_S,
    HEARTBEAT_S,
    KEEPALIVE_S,
    SCHEDULER,
    SETTLE_S,
    SIM_PROBE_BYTES,
    SLOW_LINK_RATE,
    STORE_URL,
    TICK_S,
    CrashPoint,
    Fault,
    Proc,
    SimConfig,
    SimFile,
    SimResult,
    Stream,
    Violation,
    new_state,
    restored_state,
)
from mangonel.testing.sim_writes import SimWrites

RULES = {
    HealthChange.SLOW_LINK: "rule:slow-link",  # ``state_links``
    HealthChange.LINK_MARKED: "rule:slow-link-mark",  # ``state_link_marks``
    HealthChange.LAGGING: "rule:lagging",  # ``state_liveness.observe_running``
    HealthChange.CAUGHT_UP: "rule:caught-up",
    HealthChange.HEDGED: "rule:hedged",  # ``state_liveness.hedge``
    HealthChange.RELAPSED: "rule:relapsed",  # ``state_liveness.judge``
    HealthChange.QUARANTINED: "rule:quarantined",  # ``state_liveness.judge``
    HealthChange.MOVED: "rule:quarantine-moved",  # ``Recovery._move_quarantined``
    HealthChange.STREAM_MOVED: "rule:stream-moved",  # ``state_streams``
}
"""The health changes counted in ``SimResult.faults`` when the scheduler logs
them: a test (and a batch's summary) shows each rule really acted."""

# ------------------------------------------------------------------ the simulator


class ClusterSim:
    """One run. ``run()`` returns its ``SimResult``; a broken invariant ends it."""

    def __init__(
        self,
        config: SimConfig,
        checks: SimChecks | None = None,
        scheduler: type[SchedulerState] = SchedulerState,
        executor: type[ExecutorMachine] = ExecutorMachine,
    ) -> None:
        self.scheduler_type = scheduler
        self.executor_type = executor
        self.config = config
        self.rng = random.Random(config.seed)
        self.result = SimResult(config)
        self.checks = checks or SimChecks()
        self.now = 0.0
        self.skew = 0.0
        """The scheduler's clock less true time (``Fault.CLOCK_STEP``)."""
        self._seq = 0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        # Jobs differ in size (so adaptive execution groups their partitions
        # differently): job n has ``tasks + n % 3`` tasks.
        shapes = {k: synthetic_plan(config.tasks + k, config.partitions) for k in range(3)}
        answers = {k: sim_data.expected_result(plan) for k, plan in shapes.items()}
        self.shapes = shapes
        self.answers = answers
        self.plans: dict[JobId, DistributedPlan] = {}
        self.expected: dict[JobId, tuple[int, ...]] = {}
        # The scheduler and its store.
        self.store = MemoryStateStore(STORE_URL)
        self.store.acquire("sim")
        self.up = True
        self.life = 0
        self.state = self.new_state()
        self.writer = StateWriter(self.store, {})
        self.known: set[JobId] = set()
        self.event_id = 0
        self.fresh_ids = 0
        self.streams: dict[ExecutorId, Stream] = {}
        self.crash_at: tuple[CrashPoint, int] | None = None
        # The world.
        self.procs: dict[str, Proc] = {}
        self.cut: dict[tuple[str, str], int] = {}
        """Directed links that drop everything now: (from host, to host) -> which cut."""
        self.cuts = 0
        self.connection: Counter[str] = Counter()
        """How many times each executor host's connection to the scheduler broke."""
        self.task_fault_until = 0.0
        self.submitted = 0
        """Jobs the client saw accepted."""
        self.next_job = 0
        self.fault_index = 0
        self.writes = SimWrites(config.write_every, config.write_kinds, config.read_every)

    def new_state(self) -> SchedulerState:
        return new_state(self.config, self.scheduler_type)

    def clock(self) -> float:
        """The scheduler's wall clock: true time, and the steps ``Fault.CLOCK_STEP`` made."""
        return self.now + self.skew

    # ---------------------------------------------------------------- the clock

    def at(self, delay: float, what: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay, self._seq, what))

    def latency(self) -> float:
        hi = self.config.latency_s
        return hi / 10 + self.rng.random() * hi * 0.9

    def run(self) -> SimResult:
        cfg = self.config
        for i in range(cfg.executors):
            self.start_proc(f"h{i}")
        for _ in range(min(cfg.concurrent, cfg.jobs)):
            self.at(self.rng.random(), self.submit)
        self.at(TICK_S, self.tick)
        self.at(self.rng.expovariate(1 / cfg.fault_every_s), self.inject)
        self.at(cfg.faults_until_s, self.heal_all)
        deadline = cfg.faults_until_s + cfg.liveness_s
        settle_until: float | None = None
        try:
            while self._queue:
                when, _, what = heapq.heappop(self._queue)
                self.now = when
                self.result.steps += 1
                what()
                if settle_until is None and self.done():
                    # What the ends set off (releases, cancels) lands before the last checks.
                    settle_until = self.now + SETTLE_S
                if settle_until is not None and self.now >= settle_until and self.landed():
                    break
                if self.now > deadline or self.result.steps >= cfg.max_steps:
                    open_jobs = sorted(j for j, o in self.checks.outcome.items() if o is None)
                    raise Violation(
                        "liveness",
                        f"jobs {open_jobs} had not ended {self.now - cfg.faults_until_s:.0f} s "
                        f"after faults stopped ({self.result.steps} steps)",
                    )
            if self.result.violation is None:
                self.checks.at_end(self)
                outcome = self.checks.outcome
                self.writes.check_end(
                    {j for j, o in outcome.items() if o is JobSucceeded},
                    {j for j, o in outcome.items() if o is not None},
                )
        except Violation as exc:
            self.result.violation = exc
        finally:
            self.writes.close()
        self.result.sim_time = self.now
        self.result.jobs_accepted = len(self.checks.outcome)
        return self.result

    def landed(self) -> bool:
        """Every command put on an open stream was handed on: a release the last tick
        sent (an orphan's result expiring) lands before the checks look for its files
        (seed 3002727 of four executors of one slot ended with it in flight); and
        the commit thread is done."""
        streams = all(s.handed == s.sent for s in self.streams.values() if s.open)
        # And the commit thread of a scheduler that is up has carried out its queue
        # (the deletions the last jobs' ends let go: ``retired-deleted``).
        return streams and self.up and not self.writes.busy

    def done(self) -> bool:
        return (
            self.submitted == self.config.jobs
            and all(self.checks.outcome.values())
            and self.now > self.config.faults_until_s
            and all(
                j in self.checks.read or j in self.checks.orphans or s is not JobSucceeded
                for j, s in self.checks.outcome.items()
            )
        )

    # -------------------------------------------------------------- the network

    def reachable(self, src: str, dst: str) -> bool:
        return (src, dst) not in self.cut

    def transmit(
        self, src: str, dst: str, deliver: Callable[[], None], fail: Callable[[], None]
    ) -> None:
        """One message between an executor host and the scheduler, over their TCP
        connection: held while its direction is cut (retransmitted), lost if the
        connection breaks first (``break_connection``)."""
        host = dst if src == SCHEDULER else src
        connection = self.connection[host]

        def attempt() -> None:
            if self.connection[host] != connection:
                fail()
            elif self.reachable(src, dst):
                deliver()
            else:
                self.at(0.25, attempt)

        self.at(self.latency(), attempt)

    def break_connection(self, host: str) -> None:
        """A cut outlasted the keepalive: the connection breaks, with the streams
        and calls on it, and both ends learn it."""
        self.connection[host] += 1
        for stream in [s for s in self.streams.values() if s.proc.host == host]:
            self.break_stream(stream)
        proc = self.procs.get(host)
        if proc is not None and proc.stream is not None and not proc.stream.open:
            self.end_on_executor(proc.stream)  # not yet accepted: it fails too

    def call(
        self,
        proc: Proc,
        handler: Callable[[], Any],
        answer: Callable[[Any], None],
        failed: Callable[[], None] | None = None,
        duplicate: bool = True,
    ) -> None:
        """A unary call from ``proc`` to the scheduler: ``handler`` runs there,
        ``answer`` back on the executor with what it returned (``failed`` when
        no answer came: its connection broke, the scheduler was down, or it
        crashed while handling the call)."""

        def fail() -> None:
            if failed is not None:
                self.on_proc(proc, failed)

        def arrive() -> None:
            if not self.up:
                self.at(self.latency(), fail)  # connection refused
                return
            life = self.life
            reply = handler()
            if not self.up or self.life != life:
                self.at(self.latency(), fail)
                return
            self.transmit(
                SCHEDULER, proc.host, lambda: self.on_proc(proc, lambda: answer(reply)), fail
            )

        self.transmit(proc.host, SCHEDULER, arrive, fail)
        if duplicate and self.rng.random() < self.config.duplicate_rate:
            # A retry of a call whose first copy got through after all.
            self.result.faults["duplicate"] += 1
            self.transmit(proc.host, SCHEDULER, lambda: arrive() if self.up else None, lambda: None)

    def send(self, command: Command) -> None:
        """A command onto an executor's stream: in order, held while the link is cut."""
        stream = self.streams.get(command.executor)  # type: ignore[union-attr]
        if stream is None or not stream.open:
            return  # as ``SchedulerCore._execute``: dropped, no stream
        when = max(stream.last_delivery, self.now + self.latency())
        stream.last_delivery = when
        stream.sent += 1
        n = stream.sent
        self.at(when - self.now, lambda: self.deliver(stream, command, n))

    def deliver(self, stream: Stream, command: Command, n: int) -> None:
        """Command ``n`` of ``stream`` arrives, after every one before it: a command
        held (a cut, a lag) holds back those behind it, as TCP does (rescheduled
        one by one, a held launch once came after the cancel sent behind it)."""
        if not stream.open:
            return
        proc = stream.proc
        if n != stream.handed + 1:
            stream.last_delivery = max(stream.last_delivery, self.now + 0.001)
            self.at(stream.last_delivery - self.now, lambda: self.deliver(stream, command, n))
            return
        cut = not self.reachable(SCHEDULER, proc.host)
        if cut or self.now < stream.held_until or proc.moving_to is stream:
            # Held, in order, and looked at again every 0.5 s: until the cut
            # heals or the stream's retry comes (``Fault.STREAM_LAG``), or
            # faults stop (``heal_all``); on a stream the executor is moving
            # to, until it reads it (``move_stream``).
            held = self.now + 0.5 if cut else min(self.now + 0.5, stream.held_until)
            if proc.moving_to is stream:
                held = self.now + 0.05
            stream.last_delivery = max(stream.last_delivery, held)
            self.at(stream.last_delivery - self.now, lambda: self.deliver(stream, command, n))
            return
        stream.handed = n
        self.on_proc(
            proc,
            lambda: (
                self.proc_command(proc, stream.executor, command) if proc.stream is stream else None
            ),
        )

    def break_stream(self, stream: Stream) -> None:
        """Both ends learn the stream is gone."""
        if stream.open:
            stream.open = False
            if self.streams.get(stream.executor) is stream:
                del self.streams[stream.executor]
            if self.up:
                self.connection_closed(stream.executor)
        self.at(self.latency(), lambda: self.end_on_executor(stream))

    # ------------------------------------------------------- the scheduler shell

    def emit(self, make: Callable[[int, float], Event]) -> list[Command]:
        """What ``SchedulerCore._emit`` does: handle, persist, carry out; the
        invariants after it; a crash where one is armed."""
        self.event_id += 1
        event = make(self.event_id, self.clock())
        self.result.scheduler_events += 1
        commands = self.state.handle(event)
        changes = state_changes(self.state, self.known)
        crash = self.crash_at if changes is not None else None
        if crash is not None and crash[0] is CrashPoint.BEFORE_WRITE:
            self.crash_scheduler()
            return []
        self.checks.after_handle(self, event, commands)
        if changes is not None:
            puts, deletes = changes
            if isinstance(event, JobSubmitted):
                puts[job_key(event.job, "plan")] = StoredPlan("sim", event.time, 0.0, event.plan)
            self.writer.commit(puts, deletes)
            if self.config.check_restore:
                self.checks.restore_equivalent(self)
        if crash is not None and crash[0] is CrashPoint.AFTER_WRITE:
            self.crash_scheduler()
            return []
        for i, command in enumerate(commands):
            if crash is not None and i == crash[1] % max(1, len(commands)):
                self.crash_scheduler()
                return []
            self.carry_out(command)
        if isinstance(event, TaskCompleted):
            self.writes.reported.add(event.attempt)  # handled, and its commands out
        return commands

    def carry_out(self, command: Command) -> None:
        self.checks.carried_out(self, command)
        if isinstance(command, LaunchTask | CancelTask | ReleaseOutputs):
            self.send(command)
        elif isinstance(command, JobSucceeded | JobFailed | JobCancelled):
            if isinstance(command, JobSucceeded):
                self.writes.check_succeeded(command.job)
            if self.writes.job_finished(self.life, command.job):
                self.at(self.latency(), lambda life=self.life: self.commit_next(life))
        elif isinstance(command, CommitWrite | AbortWrite):
            if self.writes.put(self.life, command):
                self.at(self.latency(), lambda life=self.life: self.commit_next(life))
        elif isinstance(command, DeclareExecutorLost):
            stream = self.streams.get(command.executor)
            if stream is not None:
                self.break_stream(stream)
        elif isinstance(command, ForgetJob):
            self.known.discard(command.job)
        elif isinstance(command, LogExecutorHealth) and command.change in RULES:
            self.result.faults[RULES[command.change]] += 1  # the rule acted

    def connection_closed(self, executor: ExecutorId) -> None:
        self.emit(lambda i, t: ExecutorLost(i, t, executor, LossReason.CONNECTION_LOST))

    def tick(self) -> None:
        if self.up:
            self.emit(lambda i, t: Tick(i, t))
        self.at(TICK_S, self.tick)

    def commit_next(self, life: int) -> None:
        """The scheduler's commit thread (``scheduler.commits``): the next command
        of its queue, its answer, and then the one after it."""
        if not self.up or life != self.life:
            return  # the thread died with its scheduler
        running = frozenset(str(j) for j in self.state.unfinished_jobs())
        done = self.writes.next(life, running, self.commit_crash)
        if done is None:
            return
        command, outcome = done
        if outcome is False:
            self.crash_scheduler()
            return
        if isinstance(command, CommitWrite):
            job = command.job
            if outcome is True:
                self.emit(lambda i, t: WriteCommitted(i, t, job))
            else:
                self.emit(lambda i, t, why=str(outcome): WriteCommitFailed(i, t, job, why))
            if self.life != life:
                return
        self.at(self.latency(), lambda: self.commit_next(life))

    def commit_crash(self) -> str | None:
        """Where the scheduler dies during this commit, if it does: after the
        intent, before any move (``"intent"``), or after the commit, before its
        answer (``"answer"``)."""
        cfg = self.config
        if Fault.SCHEDULER_CRASH not in cfg.faults or self.now >= cfg.faults_until_s:
            return None
        roll = self.rng.random()
        where = "intent" if roll < 0.1 else "answer" if roll < 0.2 else None
        if where is not None:
            self.result.faults[f"commit:crash-after-{where}"] += 1
        return where

    def crash_scheduler(self) -> None:
        self.crash_at = None
        self.up = False
        self.life += 1
        self.writes.crashed()  # its commit thread died with it
        for stream in list(self.streams.values()):
            stream.open = False
            self.at(self.latency(), lambda s=stream: self.end_on_executor(s))
        self.streams.clear()
        self.at(0.5 + self.rng.random() * 3, self.restart_scheduler)

    def restart_scheduler(self) -> None:
        """What ``SchedulerCore.recover`` does: read the store, restore, recover."""
        self.state = restored_state(self.store, self.new_state)
        self.writer = StateWriter(self.store, self.store.load())
        self.known = set(self.state.unfinished_jobs()) | {
            v.id for v in self.state.jobs() if v.state.finished
        }
        self.up = True
        self.checks.restarted(self)
        self.emit(lambda i, t: SchedulerRecovered(i, t))
        if self.up and self.writes.restarted(self.life):
            self.at(self.latency(), lambda life=self.life: self.commit_next(life))

    # The calls an executor makes (``SchedulerCore``'s methods of the same names).

    def register(self, proc: Proc, resume: ExecutorId | None) -> tuple[ExecutorId, bool]:
        self.fresh_ids += 1
        fresh = ExecutorId(f"e{self.life}-{self.fresh_ids}")
        info = ExecutorInfo(fresh, proc.host, f"{proc.host}:1", proc.slots)
        held: frozenset[str] = frozenset()
        jobs: tuple[JobId, ...] = ()
        if resume is not None:
            home = proc.homes.get(resume, {})
            held = frozenset(home)
            jobs = tuple(sorted({f.job for f in home.values()}))
        commands = self.emit(lambda i, t: ExecutorRegistered(i, t, info, resume, held, jobs))
        resumed = next((c.executor for c in commands if isinstance(c, ResumeExecutor)), None)
        return (resumed or fresh), resumed is not None

    def connect(self, stream: Stream) -> None:
        """The executor's stream reaches the scheduler (``SchedulerCore.executor_connected``)."""
        executor = stream.executor
        # Open before the event: the launches it decides go onto this stream
        # (``SchedulerCore`` queues them on the executor's entry).
        old = self.streams.get(executor)
        stream.open = True
        stream.last_delivery = self.now

        def connected(i: int, t: float) -> ExecutorConnected:
            stream.opened = i
            return ExecutorConnected(i, t, executor)

        self.streams[executor] = stream
        commands = self.emit(connected)
        if not self.up or any(isinstance(c, RefuseStream) for c in commands):
            stream.open = False
            if self.streams.get(executor) is stream:
                if old is not None:
                    self.streams[executor] = old
                else:
                    del self.streams[executor]
            self.at(self.latency(), lambda: self.end_on_executor(stream))
        elif old is not None and old is not stream:
            old.open = False

    def heartbeat(
        self,
        executor: ExecutorId,
        unhealthy: str,
        links: tuple[LinkSample, ...] = (),
        probes: tuple[LinkSample, ...] = (),
        failed_beats: int = 0,
        running: int | None = None,
    ) -> bool:
        if failed_beats:
            self.result.faults["beat:failed-reported"] += 1
        commands = self.emit(
            lambda i, t: ExecutorHeartbeat(
                i, t, executor, unhealthy, links, probes, failed_beats, running
            )
        )
        return not any(isinstance(c, RefuseHeartbeat) for c in commands)

    def drain(self, executor: ExecutorId) -> bool:
        view = self.state.executor(executor)
        if view is None or view.state not in (
            ExecutorState.ALIVE,
            ExecutorState.DRAINING,
        ):
            return False
        self.emit(lambda i, t: ExecutorDraining(i, t, executor))
        return True

    # ---------------------------------------------------------------- clients

    def submit(self) -> None:
        """A client submits a job; one whose answer was lost (the scheduler crashed
        while handling it) it submits again, under a new id."""
        if self.submitted >= self.config.jobs:
            return
        if not self.up:
            self.at(1.0, self.submit)
            return
        shape = self.next_job % 3
        job = JobId(f"j{self.next_job}")
        plan = self.plans[job] = self.writes.plan(self.next_job, job, self.shapes[shape])
        self.next_job += 1
        self.known.add(job)
        self.checks.submitted(job)
        self.expected[job] = self.answers[shape]
        life = self.life
        self.emit(lambda i, t: JobSubmitted(i, t, job, plan))
        if self.life != life:
            self.checks.orphans.add(job)
            self.at(1.0, self.submit)
            return
        if self.writes.submitted(life):
            self.at(self.latency(), lambda: self.commit_next(life))
        self.submitted += 1
        self.at(1.0, lambda: self.watch(job))

    def watch(self, job: JobId) -> None:
        """The client polls its job; once it ended, reads its result (again if the
        scheduler crashed before it took the read) and submits the next."""
        if not self.up:
            self.at(1.0, lambda: self.watch(job))
            return
        view = self.state.job(job)
        forgotten = view is None and self.checks.outcome.get(job) is not None
        if not forgotten and (view is None or not view.state.finished):
            self.at(1.0, lambda: self.watch(job))
            return
        if job in self.checks.succeeded_results and job not in self.checks.read:
            life = self.life
            self.emit(lambda i, t: ResultRead(i, t, job))
            if self.life != life:
                self.at(1.0, lambda: self.watch(job))
                return
            self.checks.read_result(self, job)
        self.at(self.rng.random(), self.submit)

    # --------------------------------------------------------- executor shells

    def start_proc(self, host: str) -> None:
        proc = Proc(host, self.config.slots, self.executor_type())
        self.procs[host] = proc
        self.feed(proc, ex.ServiceStarted())
        self.at(HEARTBEAT_S, lambda: self.beat(proc))

    def on_proc(self, proc: Proc, what: Callable[[], None]) -> None:
        """Run ``what`` in ``proc``'s shell (later, if it is frozen; never, if dead)."""
        if not proc.alive or proc.exited:
            return
        if proc.frozen:
            proc.inbox.append(what)
            return
        what()

    def feed(self, proc: Proc, event: ex.Event) -> None:
        if not proc.alive or proc.exited:
            return
        for action in proc.state.handle(event):
            self.act(proc, action)

    def act(self, proc: Proc, action: ex.Action) -> None:
        match action:
            case ex.Register(resume):
                if proc.register_twice:
                    proc.register_twice = False
                    # The first try: taken, its answer lost (the executor's call timed out).
                    self.transmit(
                        proc.host,
                        SCHEDULER,
                        lambda: self.register(proc, resume) if self.up else None,
                        lambda: None,
                    )
                self.call(
                    proc,
                    lambda: self.register(proc, resume),
                    lambda reply: self.feed(proc, ex.Registered(*reply)),
                    lambda: self.feed(proc, ex.RegistrationFailed()),
                    duplicate=False,
                )
            case ex.ClaimHome(executor):
                proc.homes.setdefault(executor, {})
                self.feed(proc, ex.HomeClaimed(executor))
            case ex.Connect(executor):
                self.open_stream(proc, executor)
            case ex.Wait(delay):
                self.at(
                    delay / proc.rate,
                    lambda: self.on_proc(proc, lambda: self.feed(proc, ex.WaitEnded())),
                )
            case ex.Exit():
                if not proc.exited:
                    proc.exited = True
                    self.at(5.0, lambda: self.start_proc(proc.host))
            case ex.CancelStream(executor):
                if proc.stream is not None and proc.stream.executor == executor:
                    self.break_stream(proc.stream)
            case ex.QueueTask(executor, spec):
                proc.queue.append((executor, spec))
                self.take_slots(proc)
            case ex.StartTask(attempt=attempt):
                self.start_task(proc, attempt)
            case ex.InterruptTask(attempt=attempt):
                self.at(
                    0.01,
                    lambda: self.on_proc(
                        proc, lambda: self.task_ended(proc, attempt, ex.Stopped())
                    ),
                )
            case ex.ReportCompleted(executor, attempt, outputs):
                self.call(
                    proc,
                    lambda: self.emit(lambda i, t: TaskCompleted(i, t, attempt, executor, outputs)),
                    lambda _: None,
                )
            case ex.ReportFailed(executor, attempt, failure):
                self.call(
                    proc,
                    lambda: self.emit(lambda i, t: TaskFailed(i, t, attempt, executor, failure)),
                    lambda _: None,
                )
            case ex.DeleteOutputs(executor, job, stages):
                home = proc.homes.get(executor, {})
                for path in [p for p, f in home.items() if f.job == job]:
                    if stages is None or home[path].stage in {int(s) for s in stages}:
                        self.checks.deleted(proc, path, home[path], released=True)
                        del home[path]
            case ex.DeleteLifeDir(executor):
                for path, f in proc.homes.pop(executor, {}).items():
                    self.checks.deleted(proc, path, f, released=False)
            case ex.TellDrain(executor):
                self.call(
                    proc,
                    lambda: self.drain(executor),
                    lambda ok: None if ok else self.feed(proc, ex.DrainUndelivered(executor)),
                    lambda: self.feed(proc, ex.DrainUndelivered(executor)),
                    duplicate=False,
                )
            case ex.Stop():
                self.feed(proc, ex.StopRequested())
            case ex.MoveStream(executor, holding, finished):
                self.move_stream(proc, executor, holding, finished)
            case _:
                raise TypeError(f"unknown action {action!r}")

    def open_stream(self, proc: Proc, executor: ExecutorId) -> None:
        """``Connect``: as the real shell, the executor counts itself connected at
        once; the stream fails later if it never reaches the scheduler or is refused."""
        stream = Stream(executor, proc, open=False)
        proc.stream = stream
        self.feed(proc, ex.Connected(executor))

        def arrive() -> None:
            if not self.up:
                self.at(self.latency(), lambda: self.end_on_executor(stream))
            elif proc.alive and proc.stream is stream:
                self.connect(stream)

        self.transmit(proc.host, SCHEDULER, arrive, lambda: self.end_on_executor(stream))

    def end_on_executor(self, stream: Stream) -> None:
        proc = stream.proc

        def ended() -> None:
            if proc.stream is stream:
                proc.stream = None
                self.feed(proc, ex.StreamEnded(stream.executor))

        self.on_proc(proc, ended)

    def move_stream(
        self,
        proc: Proc,
        executor: ExecutorId,
        holding: frozenset[TaskAttemptId],
        finished: frozenset[TaskAttemptId],
    ) -> None:
        """``MoveStream``, as ``ExecutorService._move_stream`` and
        ``SchedulerCore.executor_reopened`` do it: a new stream, naming the jobs
        the life has files of, replaces the old one once the scheduler took it
        (the old one is closed there, what it still carried lost, and its end is
        no loss); the executor reads the new one once the answer comes back. A
        move that fails keeps the old stream."""
        old = proc.stream
        if proc.moving_to is not None or old is None or old.executor != executor:
            return  # one move at a time; the next recovery tries again
        held_jobs = tuple(sorted({f.job for f in proc.homes.get(executor, {}).values()}))
        new = proc.moving_to = Stream(executor, proc, open=False)

        def failed() -> None:
            # Not taken, or its answer lost: the executor gives the new stream
            # up (its end, if the scheduler took it, is the executor's loss),
            # and keeps the old one, unless the scheduler closed that.
            if proc.moving_to is new:
                proc.moving_to = None
            if new.open:
                self.break_stream(new)
            if not old.open:
                self.end_on_executor(old)

        def arrive() -> None:
            if not self.up or not proc.alive or proc.exited or proc.moving_to is not new:
                self.at(self.latency(), lambda: self.on_proc(proc, failed))
                return
            life = self.life
            taken = self.reopened(new, holding, finished, held_jobs)
            if not taken or self.life != life:
                self.at(self.latency(), lambda: self.on_proc(proc, failed))
                return
            self.transmit(
                SCHEDULER,
                proc.host,
                lambda: self.on_proc(proc, lambda: self.switch_stream(proc, old, new)),
                lambda: self.on_proc(proc, failed),
            )

        self.transmit(proc.host, SCHEDULER, arrive, lambda: self.on_proc(proc, failed))

    def reopened(
        self,
        stream: Stream,
        holding: frozenset[TaskAttemptId],
        finished: frozenset[TaskAttemptId],
        held_jobs: tuple[JobId, ...],
    ) -> bool:
        """The new stream reaches the scheduler (``SchedulerCore.executor_reopened``):
        whether it took it."""
        executor = stream.executor
        old = self.streams.get(executor)
        stream.open = True
        stream.last_delivery = self.now

        def reopened(i: int, t: float) -> ExecutorStreamReopened:
            stream.opened = i
            return ExecutorStreamReopened(i, t, executor, holding, finished, held_jobs)

        # Open before the event: what it sends again goes onto the new stream.
        self.streams[executor] = stream
        life = self.life
        commands = self.emit(reopened)
        if self.life != life:
            # The scheduler crashed: the old stream's connection went with it
            # (``crash_scheduler`` saw only the new one).
            stream.open = False
            if old is not None and old.open:
                old.open = False
                self.at(self.latency(), lambda: self.end_on_executor(old))
            return False
        if any(isinstance(c, RefuseStream) for c in commands):
            stream.open = False
            if self.streams.get(executor) is stream:
                if old is not None:
                    self.streams[executor] = old
                else:
                    del self.streams[executor]
            return False
        released = sum(isinstance(c, ReleaseOutputs) for c in commands)
        self.result.faults["rule:stream-move-released"] += released
        if old is not None and old is not stream:
            old.open = False  # closed: what it still carried is lost
            if old.opened:
                # Its end reaches the scheduler: a replaced stream's, no loss.
                opened = old.opened
                self.emit(
                    lambda i, t: ExecutorLost(
                        i, t, executor, LossReason.CONNECTION_LOST, "replaced", opened
                    )
                )
        return True

    def switch_stream(self, proc: Proc, old: Stream, new: Stream) -> None:
        """The scheduler's answer reached the executor: it reads the new stream
        from now on, if the life it moved is still the one its old stream served."""
        if proc.moving_to is not new:
            return
        proc.moving_to = None
        if proc.stream is not old:
            if new.open:
                self.break_stream(new)  # the life ended meanwhile
            return
        proc.stream = new
        if not new.open:
            self.end_on_executor(new)  # closed before the executor read it

    def stop(self, proc: Proc) -> None:
        """``executor.main``'s drain bound passed: the service stops, and the process exits."""
        self.feed(proc, ex.StopRequested())
        self.feed(proc, ex.SlotsClosed())
        if not proc.exited:
            proc.exited = True
            self.at(5.0, lambda: self.start_proc(proc.host))

    def proc_command(self, proc: Proc, executor: ExecutorId, command: Command) -> None:
        if isinstance(command, LaunchTask):
            self.feed(proc, ex.TaskLaunched(executor, command.task))
        elif isinstance(command, CancelTask):
            self.feed(proc, ex.CancelRequested(executor, command.attempt))
        elif isinstance(command, ReleaseOutputs):
            self.feed(proc, ex.OutputsReleased(executor, command.job, command.stages))

    def beat(self, proc: Proc) -> None:
        if not proc.alive or proc.exited:
            return
        if not proc.frozen:
            executor = proc.state.serving
            if executor is not None:
                self.send_beat(proc, executor)
        self.at(HEARTBEAT_S / proc.rate, lambda: self.beat(proc))

    def send_beat(self, proc: Proc, executor: ExecutorId) -> None:
        """One heartbeat, as ``executor.link`` sends it: with the attempts the
        executor runs and how many of its heartbeats failed since its last
        answered one. Not answered within ``HEARTBEAT_DEADLINE_S`` (its clock's),
        or failed sooner (the connection broke, the scheduler was down), it
        failed: the connection is given up, so a request still held in a cut
        never arrives, and a late answer is not heard."""
        unhealthy = "disk full" if self.now < proc.unhealthy_until else ""
        links = self.link_samples(proc)
        probes = self.probe_samples(proc, executor)
        failed, running = proc.beats_failed, proc.state.running_tasks
        given_up = answered = False

        def handle() -> bool | None:
            if given_up:
                return None  # its connection was closed before it got there
            return self.heartbeat(executor, unhealthy, links, probes, failed, running)

        def answer(known: bool | None) -> None:
            nonlocal answered
            if given_up or answered:
                return
            answered = True
            back, proc.beats_failed = proc.beats_failed > 0, 0
            if not known:
                self.feed(proc, ex.HeartbeatRefused(executor))
            elif back:
                self.feed(proc, ex.LinkRecovered(executor))  # the link came back

        def give_up() -> None:
            nonlocal given_up
            if given_up or answered:
                return
            given_up = True
            proc.beats_failed += 1
            self.result.faults["beat:failed"] += 1

        self.at(HEARTBEAT_DEADLINE_S / proc.rate, lambda: self.on_proc(proc, give_up))
        if failed and not (
            self.reachable(proc.host, SCHEDULER) and self.reachable(SCHEDULER, proc.host)
        ):
            # After a failed heartbeat ``executor.link`` gives its connection
            # up: this one goes on a new connection, whose handshake needs both
            # ways. Cut even one way, it is never made: the heartbeat fails at
            # its deadline, unheard (measured on the lab, 2026-12-06).
            self.result.faults["beat:no-connection"] += 1
            return
        self.call(proc, handle, answer, give_up)

    def link_samples(self, proc: Proc) -> tuple[LinkSample, ...]:
        """What the running tasks' fetches got from each peer since the last
        beat, as ``executor.peer_rates`` would say: a beat's time from each
        peer another host's task reads from, at that peer's link rate."""
        peers: dict[ExecutorId, float] = {}
        for _, spec in proc.running.values():
            for inp in spec.inputs:
                for loc in inp.locations:
                    if loc.host != proc.host:
                        peers[loc.executor] = self.link_rate(loc.host)
        interval = HEARTBEAT_S / proc.rate
        return tuple(LinkSample(p, int(r * interval), interval) for p, r in sorted(peers.items()))

    def probe_samples(self, proc: Proc, executor: ExecutorId) -> tuple[LinkSample, ...]:
        """One link probe of each peer the scheduler names (``state_probes``), at
        the lesser of the peer's link rate and this host's, as
        ``executor.probes`` would time it (``SIM_PROBE_BYTES``)."""
        hosts = {p.state.serving: h for h, p in self.procs.items() if p.state.serving}
        mine = self.link_rate(proc.host)
        samples = []
        for target in self.state.probe_targets(executor, self.now):
            host = hosts.get(target.executor)
            if host is None or host == proc.host:
                continue
            rate = min(self.link_rate(host), mine)
            samples.append(LinkSample(target.executor, SIM_PROBE_BYTES, SIM_PROBE_BYTES / rate))
        return tuple(samples)

    def link_rate(self, host: str) -> float:
        holder = self.procs.get(host)
        slow = holder is not None and self.now < holder.link_slow_until
        return SLOW_LINK_RATE if slow else FAST_LINK_RATE

    def take_slots(self, proc: Proc) -> None:
        while proc.free and proc.queue:
            executor, spec = proc.queue.popleft()
            slot = proc.free.pop()
            proc.running[spec.attempt] = (executor, spec)
            self.feed(proc, ex.SlotTaken(spec.attempt, slot))
            if spec.attempt in proc.running and proc.state.task_state(spec.attempt) is None:
                self.free_slot(proc, spec.attempt)  # cancelled before it started

    def free_slot(self, proc: Proc, attempt: TaskAttemptId) -> None:
        if proc.running.pop(attempt, None) is not None:
            proc.free.append(len(proc.free))
            proc.free.sort()
            self.at(0.0, lambda: self.on_proc(proc, lambda: self.take_slots(proc)))

    def start_task(self, proc: Proc, attempt: TaskAttemptId) -> None:
        duration = 0.2 + self.rng.random() * 1.5
        if self.now < proc.slow_until:
            duration *= 6
        running = proc.running.get(attempt)
        if running is not None:
            job = running[1].attempt.task.job
            self.writes.read(running[1], ended=self.checks.outcome.get(job) is not None)
        if running is not None and running[1].sink is not None:
            self.writes.begin(running[1])
        if running is not None and any(
            self.link_rate(loc.host) == SLOW_LINK_RATE
            for inp in running[1].inputs
            for loc in inp.locations
            if loc.host != proc.host
        ):
            duration *= 6  # it reads a peer behind a slow link
        self.at(duration, lambda: self.on_proc(proc, lambda: self.finish_task(proc, attempt)))

    def finish_task(self, proc: Proc, attempt: TaskAttemptId) -> None:
        if attempt not in proc.running:
            return
        executor, spec = proc.running[attempt]
        outcome = self.work(proc, executor, spec)
        self.task_ended(proc, attempt, outcome)

    def task_ended(self, proc: Proc, attempt: TaskAttemptId, outcome: ex.TaskOutcome) -> None:
        if attempt not in proc.running:
            return
        spec = proc.running[attempt][1]
        if spec.sink is not None and not isinstance(outcome, ex.Completed):
            self.writes.discard(spec)
        self.free_slot(proc, attempt)
        self.feed(proc, ex.TaskFinished(attempt, outcome, 0.1))

    def work(self, proc: Proc, executor: ExecutorId, spec: TaskSpec) -> ex.TaskOutcome:
        """What the task computes: read its inputs, write its outputs."""
        rate = self.config.task_fault_rate * (5 if self.now < self.task_fault_until else 1)
        if proc.disk_full_next:
            proc.disk_full_next = False
            proc.unhealthy_until = self.now + 3.0
            self.result.faults["task:disk-full"] += 1
            return ex.Failed(ExecutionError("simulated: disk full", ExecutionProblem.DISK_FULL))
        roll = self.rng.random()
        if roll < rate / 3:
            self.result.faults["task:error"] += 1
            return ex.Failed(ExecutionError("simulated task error"))
        if roll < rate * 2 / 3:
            self.result.faults["task:out-of-memory"] += 1
            return ex.Failed(ExecutionError("simulated", ExecutionProblem.OUT_OF_MEMORY))
        plan = self.plans[spec.attempt.task.job]
        stage = next(s for s in plan.stages if s.id == spec.attempt.task.stage)
        read: list[tuple[str, InputMode, PartitionLocation, int]] = []
        flake = roll < rate
        for inp in spec.inputs:
            for loc in inp.locations:
                failure = self.fetch(proc, loc, flake)
                if isinstance(failure, FetchFailed):
                    if flake:
                        self.result.faults["task:fetch-flake"] += 1
                    return ex.Failed(failure)
                read.append((inp.name, inp.mode, loc, failure))
        values = (
            sim_data.scan_outputs(stage, spec.attempt.task.partition)
            if not stage.inputs
            else sim_data.reader_outputs(stage, read)
        )
        if spec.sink is not None:
            self.writes.stage(spec, values)
        home = proc.homes.get(executor)
        assert home is not None, f"{executor} runs {spec.attempt} without a home"
        outputs = []
        job = spec.attempt.task.job
        for p, value in sorted(values.items()):
            path = f"/{proc.host}/{executor}/{spec.attempt}/{p}"
            sid, mp = int(stage.id), spec.attempt.task.partition
            home[path] = SimFile(job, sid, mp, p, value)
            size = sim_data.output_bytes(sid, mp, p)
            outputs.append(PartitionOutput(p, path, 1, size, sim_data.encode_value(value)))
        return ex.Completed(tuple(outputs))

    def fetch(self, reader: Proc, loc: PartitionLocation, flake: bool) -> FetchFailed | int:
        holder = self.procs.get(loc.host)
        if (
            flake
            or holder is None
            or not holder.alive
            or holder.exited
            or holder.frozen
            or not self.reachable(reader.host, holder.host)
            or not self.reachable(holder.host, reader.host)
        ):
            problem = FetchProblem.UNREACHABLE
            return FetchFailed(loc.executor, loc.stage, loc.map_partition, "unreachable", problem)
        found = holder.file(loc.path)
        self.checks.fetched(self, loc)
        if found is None or sim_data.encode_value(found.value) != loc.checksum:
            problem = FetchProblem.OUTPUT_LOST
            return FetchFailed(
                loc.executor, loc.stage, loc.map_partition, "lost or corrupt", problem
            )
        return found.value

    # ------------------------------------------------------------------- faults

    def inject(self) -> None:
        cfg = self.config
        if self.now >= cfg.faults_until_s or not cfg.faults:
            return
        self.at(self.rng.expovariate(1 / cfg.fault_every_s), self.inject)
        kind = self.rng.choice(cfg.faults)
        index = self.fault_index
        self.fault_index += 1
        # Every choice is drawn whether or not the fault is skipped, so a
        # shrunk schedule leaves the other faults where they were.
        host = self.rng.choice(sorted(self.procs))
        other = self.rng.choice(sorted(self.procs))
        length = 1.0 + self.rng.random() * 8.0
        pick = self.rng.random()
        if index in cfg.skip:
            return
        self.result.schedule.append(f"{index}:{kind.value}@{self.now:.2f}:{host}")
        self.result.faults[kind.value] += 1
        proc = self.procs[host]
        match kind:
            case Fault.EXECUTOR_CRASH:
                self.crash_proc(proc, restart_after=length)
            case Fault.FREEZE:
                proc.frozen = True
                self.at(length, lambda: self.thaw(proc))
            case Fault.CUT:
                self.cut_link((host, SCHEDULER), (SCHEDULER, host), length=length)
            case Fault.CUT_TO_SCHEDULER:
                self.cut_link((host, SCHEDULER), length=length)
            case Fault.CUT_FROM_SCHEDULER:
                self.cut_link((SCHEDULER, host), length=length)
            case Fault.PEER_CUT:
                if other != host:
                    self.cut_link((host, other), (other, host), length=length)
            case Fault.FLAP:
                for k in range(4):
                    self.at(
                        k * FLAP_EVERY_S,
                        lambda: self.cut_link(
                            (host, SCHEDULER), (SCHEDULER, host), length=FLAP_CUT_S
                        ),
                    )
            case Fault.STREAM_LAG:
                if proc.stream is not None:
                    stream = proc.stream
                    stream.held_until = max(stream.held_until, self.now + length)
                if pick < 0.5:  # and the cut that left it held
                    self.cut_link((host, SCHEDULER), (SCHEDULER, host), length=FLAP_CUT_S)
            case Fault.SLOW:
                proc.slow_until = self.now + length * 2
            case Fault.SLOW_LINK:
                proc.link_slow_until = self.now + length * 2
            case Fault.CORRUPT:
                files = sorted(p for home in proc.homes.values() for p in home)
                if files:
                    path = files[int(pick * len(files))]
                    found = proc.file(path)
                    assert found is not None
                    found.value = (found.value + 1) % sim_data.MODULUS
            case Fault.DISK_FULL:
                proc.disk_full_next = True
            case Fault.SCHEDULER_CRASH:
                if self.up:
                    point = list(CrashPoint)[int(pick * 3)]
                    self.crash_at = (point, int(pick * 1000))
            case Fault.CANCEL:
                open_jobs = sorted(j for j in self.known if self.checks.outcome.get(j) is None)
                if open_jobs and self.up:
                    job = open_jobs[int(pick * len(open_jobs))]
                    self.emit(lambda i, t: CancelRequested(i, t, job))
            case Fault.DRAIN:
                self.on_proc(proc, lambda: self.feed(proc, ex.DrainRequested()))
                self.at(DRAIN_TIMEOUT_S, lambda: self.on_proc(proc, lambda: self.stop(proc)))
            case Fault.TASK_ERROR:
                self.task_fault_until = self.now + length
            case Fault.REGISTER_TWICE:
                proc.register_twice = True
            case Fault.CLOCK_STEP:
                self.skew += (pick * 2 - 1) * CLOCK_STEP_S
            case Fault.CLOCK_DRIFT:
                proc.rate = 0.6 + pick * 0.8
                self.at(length * 2, lambda: setattr(proc, "rate", 1.0))

    def cut_link(self, *links: tuple[str, str], length: float) -> None:
        for link in links:
            if link in self.cut:
                continue  # cut already, by a cut that heals on its own time
            self.cuts += 1
            cut = self.cut[link] = self.cuts

            def heal(link: tuple[str, str] = link, cut: int = cut) -> None:
                if self.cut.get(link) == cut:
                    del self.cut[link]

            def keepalive(link: tuple[str, str] = link, cut: int = cut) -> None:
                if self.cut.get(link) == cut:
                    self.break_connection(link[1] if link[0] == SCHEDULER else link[0])

            self.at(length, heal)
            if SCHEDULER in link:
                self.at(KEEPALIVE_S, keepalive)

    def crash_proc(self, proc: Proc, restart_after: float) -> None:
        if not proc.alive:
            return
        proc.alive = False
        for stream in [s for s in self.streams.values() if s.proc is proc]:
            stream.open = False
            del self.streams[stream.executor]
            if self.up:
                # The process exited: its socket closes at once.
                self.at(
                    self.latency(),
                    lambda e=stream.executor: self.connection_closed(e) if self.up else None,
                )
        for path, f in sorted((p, f) for home in proc.homes.values() for p, f in home.items()):
            self.checks.deleted(proc, path, f, released=False)
        self.at(
            restart_after,
            lambda: self.start_proc(proc.host) if self.procs[proc.host] is proc else None,
        )

    def thaw(self, proc: Proc) -> None:
        if not proc.frozen:
            return
        proc.frozen = False
        inbox, proc.inbox = proc.inbox, []
        for what in inbox:
            self.on_proc(proc, what)

    def heal_all(self) -> None:
        """Faults stop: links heal, processes thaw or start again, the scheduler returns."""
        self.cut.clear()
        self.task_fault_until = 0.0
        for stream in self.streams.values():
            stream.held_until = 0.0
        for proc in list(self.procs.values()):
            proc.slow_until = 0.0
            proc.link_slow_until = 0.0
            if proc.stream is not None:
                proc.stream.held_until = 0.0
            proc.disk_full_next = False
            proc.rate = 1.0
            proc.register_twice = False
            self.thaw(proc)
        self.crash_at = None


# ------------------------------------------------------------------ running


def run(
    config: SimConfig,
    checks: SimChecks | None = None,
    scheduler: type[SchedulerState] = SchedulerState,
    executor: type[ExecutorMachine] = ExecutorMachine,
) -> SimResult:
    """One simulated run; ``result.violation`` says what broke, if anything did."""
    return ClusterSim(config, checks, scheduler, executor).run()


def shrink(
    config: SimConfig,
    checks: Callable[[], SimChecks] = SimChecks,
    scheduler: type[SchedulerState] = SchedulerState,
    executor: type[ExecutorMachine] = ExecutorMachine,
) -> SimConfig:
    """A configuration whose run still fails the same invariant with as few faults
    as removing them one at a time allows (each fault's random draws stay where
    they were, so the others land where they did)."""

    def fails(trial: SimConfig) -> str | None:
        result = run(trial, checks(), scheduler, executor)
        return result.violation.invariant if result.violation else None

    invariant = fails(config)
    assert invariant is not None, "shrink a failing run"
    count = len(run(config, checks(), scheduler, executor).schedule) + len(config.skip)
    skip = set(config.skip)
    for index in range(count):
        if index in skip:
            continue
        trial = replace(config, skip=tuple(sorted(skip | {index})))
        if fails(trial) == invariant:
            skip.add(index)
    return replace(config, skip=tuple(sorted(skip)))


def _parse(argv: list[str] | None) -> tuple[SimConfig, bool]:
    parser = argparse.ArgumentParser(
        prog="python -m mangonel.testing.cluster_sim",
        description="Replay one seed of the whole-cluster simulation (and shrink it if it fails).",
    )
    default = SimConfig()
    for f in fields(SimConfig):
        flag = f"--{f.name.replace('_', '-')}"
        value = getattr(default, f.name)
        if f.name == "faults":
            parser.add_argument(flag, default=",".join(k.value for k in value))
        elif f.name == "skip":
            parser.add_argument(flag, default="")
        elif isinstance(value, bool):
            parser.add_argument(flag, type=int, default=int(value))
        else:
            parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument(
        "--shrink", action="store_true", help="shrink the fault schedule if it fails"
    )
    args = vars(parser.parse_args(argv))
    shrinking = args.pop("shrink")
    args["faults"] = tuple(Fault(k) for k in args["faults"].split(",") if k)
    args["skip"] = tuple(int(i) for i in args["skip"].split(",") if i)
    args["check_restore"] = bool(args["check_restore"])
    return SimConfig(**args), shrinking


def main(argv: list[str] | None = None) -> int:
    config, shrinking = _parse(argv)
    result = run(config)
    print(json.dumps(result.summary(), indent=1))
    print("faults:", " ".join(result.schedule))
    if result.violation is None:
        return 0
    print(f"FAILED: {result.violation}\nreplay: {config.command()}", file=sys.stderr)
    if shrinking:
        small = shrink(config)
        again = run(small)
        print(
            f"shrunk to {len(again.schedule)} faults: {' '.join(again.schedule)}", file=sys.stderr
        )
        print(f"replay: {small.command()}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "ClusterSim",
    "Fault",
    "SimChecks",
    "SimConfig",
    "SimResult",
    "Violation",
    "run",
    "shrink",
]
