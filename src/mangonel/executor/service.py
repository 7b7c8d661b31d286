"""The executor's I/O shell: sockets, threads, DuckDB slots and files around ``ExecutorMachine``.

One ``ExecutorService`` is one executor process. Every decision (which life a
registration continues, what a cancel hits, whether a finished attempt is
reported, when a life's files go, whether a drained executor registers again)
is made by the pure state machine ``executor.state.ExecutorMachine``, whose
module docstring draws the life cycles of a *life* (one registration: an
executor id and its locked directory ``<work root>/<executor id>/``) and of a
task. This shell owns only what I/O needs and carries out the actions:

* the control thread (``serve``) registers, claims a life's directory, opens
  the scheduler's command stream and turns each order on it (``LaunchTask``,
  ``CancelTask``, ``ReleaseOutputs``) into an event, the moment it arrives;
* a pool of ``slots`` task threads, each task taking a free ``TaskRunner``
  (one DuckDB database per slot), runs the attempts and reports them;
* the Flight server serves the files the lives wrote (``executor.flight``);
* heartbeats go from a thread of their own, so a busy executor is never taken
  for a lost one; one answered "unknown executor" ends the stream; each says
  whether the executor is healthy (``executor.health``: its work directory has
  room), and one goes out at once when a task met a full disk, before that
  failure is reported;
* a cleanup thread sweeps the work root every ``cleanup_interval_s`` for the
  directories of dead executors (``executor.workdir``);
* ``drain()`` (on SIGTERM) and ``stop()`` / ``close()``.

Events are fed in under one lock, and the actions they return are carried
out after it is released (only ``InterruptTask`` runs under it, see ``_feed``).
Test hooks (fault injection) sit behind ``executor.hooks.TaskHooks``; the
default does nothing.

Why it is over 600 lines (a hundred of them import the events it feeds and the
actions it carries out): it does one thing, carrying out ``ExecutorMachine``'s
actions, and its parts (the control thread, the task threads, the heartbeat and
cleanup threads) share one lock, the slots, the link and the lives' writers;
split, they would hand that state between modules, and none would read alone.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mangonel import pauses
from mangonel.executor.config import ExecutorConfig
from mangonel.executor.events import (
    Action,
    CancelRequested,
    CancelStream,
    ClaimHome,
    Completed,
    Connect,
    Connected,
    ConnectFailed,
    DeleteLifeDir,
    DeleteOutputs,
    DrainRequested,
    DrainUndelivered,
    Event,
    Exit,
    Failed,
    HeartbeatRefused,
    HomeClaimed,
    HomeClaimFailed,
    InterruptTask,
    LinkRecovered,
    MoveStream,
    OutputsReleased,
    QueueTask,
    Register,
    Registered,
    RegistrationFailed,
    ReportCompleted,
    ReportFailed,
    ServiceStarted,
    SlotsClosed,
    SlotTaken,
    StartTask,
    Stop,
    Stopped,
    StopRequested,
    StreamEnded,
    TaskFinished,
    TaskLaunched,
    TaskOutcome,
    TellDrain,
    Wait,
    WaitEnded,
)
from mangonel.executor.failures import TaskCancelledError, TaskFailedError, classify
from mangonel.executor.flight import ShuffleFlightServer
from mangonel.executor.health import DiskHealth, DiskSpace
from mangonel.executor.hooks import NO_HOOKS, TaskHooks
from mangonel.executor.link import CommandStream, ExecutorCommand, Registration, SchedulerLink
from mangonel.executor.memory import format_size
from mangonel.executor.peer_rates import PeerRates
from mangonel.executor.phases import PhaseClock
from mangonel.executor.probes import LinkProber
from mangonel.executor.runner import TaskRunner, warm_up
from mangonel.executor.shuffle import ShuffleReader
from mangonel.executor.shuffle_write import OutputRegistry, ShuffleWriter, checksum_of
from mangonel.executor.state import (
    ExecutorMachine,
)
from mangonel.executor.workdir import OwnedDir, WorkRoot
from mangonel.ids import ExecutorId
from mangonel.security.tickets import TicketSigner
from mangonel.security.tls import TlsMaterial, warn_if_exposed
from mangonel.task import (
    CancelTask,
    ExecutionError,
    ExecutionProblem,
    LaunchTask,
    PartitionOutput,
    ReleaseOutputs,
    TaskSpec,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Home:
    """A life's files: its locked directory and the writer of its shuffle files."""

    owned: OwnedDir
    writer: ShuffleWriter


_REPORT_RETRY_S = 120.0
"""How long a task's report is tried again while the executor's life goes on
(its stream breaks sooner when the scheduler is gone: keepalive, 15 s)."""


class ExecutorService:
    """An executor: Flight server, task slots and the loop that drives them.

    Args:
        config: The executor's settings.
        link: The line to the scheduler.
        hooks: Called at fixed points of every task (fault injection in tests).
    """

    def __init__(
        self, config: ExecutorConfig, link: SchedulerLink, hooks: TaskHooks = NO_HOOKS
    ) -> None:
        self.config = config
        self.link = link
        self.hooks = hooks
        self.registry = OutputRegistry()
        self.work = WorkRoot(config.work_dir)
        self.flight: ShuffleFlightServer | None = None
        self._spill: OwnedDir | None = None
        self._slots: list[TaskRunner] = []
        self._peer_rates = PeerRates()
        """What the slots' fetches received from each peer, for the heartbeats."""
        self._free_slots: queue.LifoQueue[int] = queue.LifoQueue()
        """Last in, first out: a task takes the slot freed last, whose scan databases
        (``TaskRunner``: one per set of files, about 20 ms to open) most likely
        serve it too. Taken in turn, every slot opened its own for the same
        tables, and a short query sent again paid that in each slot first."""
        self._pool = ThreadPoolExecutor(2 * config.slots, thread_name_prefix="task")
        """A thread per slot running a task, and one per slot reporting the task it ran
        (or waiting for a slot): a slot is free again before its task's report has its
        answer (``_run_task``)."""
        self._lock = threading.Lock()
        self._state = ExecutorMachine()
        """Guarded by ``_lock``, like the two fields below."""
        self._homes: dict[ExecutorId, _Home] = {}
        self._stream: tuple[ExecutorId, CommandStream] | None = None
        self._moving = False
        """A stream move is under way (``_move_stream``)."""
        self._move_ended = threading.Condition(self._lock)
        self._heartbeat_s = config.heartbeat_interval_s
        self._beats_lock = threading.Lock()
        self._beats_failing: tuple[float, int] | None = None
        """Guarded by ``_beats_lock``: since when heartbeats fail, and how many have
        (``_note_beat``); ``None`` while they are answered."""
        self._health_lock = threading.Lock()
        self._health = DiskHealth()
        """Guarded by ``_health_lock``, like ``_unhealthy``: the last reason reported."""
        self._unhealthy = ""
        self._stop = threading.Event()
        """Wakes the back-off wait and the background loops."""
        self.registered = threading.Event()
        """Set once the first registration and stream are up."""
        self.finished = threading.Event()
        """Set when ``serve()`` returned (stopped, or drained)."""
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name="heartbeat", daemon=True
        )
        self._cleanup_thread = threading.Thread(
            target=self._cleanup_loop, name="cleanup", daemon=True
        )
        self._prober: LinkProber | None = None
        """Times small fetches from the peers the scheduler names (``executor.probes``);
        made in ``start`` (it signs with the cluster secret); ``None``: no probes."""

    # ------------------------------------------------------------------ views

    @property
    def executor_id(self) -> ExecutorId | None:
        """This life's id, while its stream is up."""
        with self._lock:
            return self._state.serving

    @property
    def flight_address(self) -> str:
        if self.flight is None:
            raise RuntimeError("the executor is not started")
        return f"{self.config.flight_host()}:{self.flight.port}"

    @property
    def draining(self) -> bool:
        with self._lock:
            return self._state.draining

    @property
    def running_tasks(self) -> int:
        with self._lock:
            return self._state.running_tasks

    # ------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Sweep dead executors' files, start the Flight server and the task slots."""
        self.work.sweep()
        self._spill = self.work.claim(f"spill-{os.getpid()}-{secrets.token_hex(2)}")
        material = TlsMaterial.load(self.config.security)
        secret = self.config.security.cluster_secret()
        signer = TicketSigner(secret) if secret is not None else None
        self.flight = ShuffleFlightServer(
            self.work.root,
            self.registry,
            self.config.bind_host,
            self.config.flight_port,
            tls_material=material,
            signer=signer,
        )
        if self.config.link_probe_interval_s > 0:
            self._prober = LinkProber(tls_material=material, signer=signer, rates=self._peer_rates)
        warn_if_exposed(
            log, "executor's Flight server", self.config.bind_host, self.config.security
        )
        budget = self.config.slot_budget()
        if self.config.memory_limit is not None:
            log.warning(
                "--memory-limit (DuckDB's limit per slot) is deprecated: give --memory, "
                "the executor's whole budget, and each slot gets a share of it"
            )
        log.info(
            "each slot's DuckDB may use %s, and spill %s",
            budget.describe(),
            format_size(budget.spill) if budget.spill is not None else "DuckDB's default",
        )
        for slot in range(self.config.slots):
            runner = TaskRunner(
                None,
                ShuffleReader(
                    self.config.host_id,
                    timeout_s=self.config.fetch_timeout_s,
                    retries=self.config.fetch_retries,
                    spool_dir=os.path.join(self._spill.path, f"fetched-{slot}"),
                    tls_material=material,
                    rates=self._peer_rates,
                ),
                os.path.join(self._spill.path, f"slot-{slot}"),
                budget,
                self.config.threads_per_slot,
            )
            runner.hooks = self.hooks
            self._slots.append(runner)
            self._free_slots.put(slot)
        # While the executor registers: its first task would pay this otherwise.
        # Not a daemon: a process told to stop during the warm-up waits for it
        # (a second or two at most), since DuckDB still running on a daemon thread
        # while the interpreter shuts down aborts the process (SIGABRT).
        threading.Thread(target=_warm_up, args=(self._spill.path,), name="warm-up").start()
        log.info("executor flight server on %s", self.flight_address)

    def serve(self) -> None:
        """Register and take orders until stopped or drained; re-register when cut off."""
        self._heartbeat_thread.start()
        self._cleanup_thread.start()
        prober = self._prober
        if prober is not None:
            threading.Thread(
                target=prober.run,
                args=(self._stop, self.config.link_probe_interval_s),
                name="link-probes",
                daemon=True,
            ).start()
        try:
            self._serve()
        finally:
            self.finished.set()

    def drain(self) -> None:
        """Leave the cluster gracefully; returns at once (watch ``finished``).

        The scheduler gives this executor no new task, lets its running tasks
        finish, and closes its stream once no job needs its outputs; ``serve()``
        then returns. When there is no scheduler to tell (not registered, or it
        cannot be reached), the executor stops at once: nobody counts on it.
        """
        self._carry_out_all(self._feed(DrainRequested()))

    def stop(self) -> None:
        """Ask ``serve()`` to return and cancel every task; safe from any thread."""
        self._stop.set()
        self._carry_out_all(self._feed(StopRequested()))

    def close(self) -> None:
        """Cancel running tasks and release everything; after ``serve()`` returned."""
        self.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.flight is not None:
            self.flight.shutdown()
        for runner in self._slots:
            runner.reader.close()
            runner.close()
        self.link.close()
        self._carry_out_all(self._feed(SlotsClosed()))
        if self._spill is not None:
            self._spill.remove()

    # ------------------------------------------------------- the state machine

    def _feed(self, event: Event) -> list[Action]:
        """Hand ``event`` to the state; return the actions to carry out."""
        with self._lock:
            actions = self._state.handle(event)
            # Carried out under the lock: the state frees a slot (TaskFinished)
            # only under it too, so a slot is never interrupted for an attempt it
            # no longer runs. ``TaskRunner.cancel`` is quick and never blocks.
            for action in actions:
                if isinstance(action, InterruptTask):
                    self._slots[action.slot].cancel(action.attempt)
        return [a for a in actions if not isinstance(a, InterruptTask)]

    def _carry_out_all(self, actions: list[Action]) -> None:
        for action in actions:
            self._carry_out(action)

    def _carry_out(self, action: Action) -> None:
        """Carry out an action that needs no reply (the control loop's are in ``_serve``)."""
        match action:
            case QueueTask(spec=spec):
                self._pool.submit(self._run_task, spec, time.time())
            case CancelStream(executor=executor):
                with self._lock:
                    stream = self._stream
                if stream is not None and stream[0] == executor:
                    stream[1].cancel()
            case MoveStream():
                with self._lock:
                    if self._moving:
                        return  # one move at a time; the next recovery tries again
                    self._moving = True
                threading.Thread(
                    target=self._move_stream, args=(action,), name="stream-move", daemon=True
                ).start()
            case ReportCompleted() | ReportFailed():
                self._report(action)
            case DeleteOutputs(executor=executor, job=job, stages=stages):
                with self._lock:
                    home = self._homes.get(executor)
                if home is not None:
                    try:
                        home.writer.release(job, stages)
                    except Exception:
                        log.exception("releasing the files of job %s failed", job)
            case DeleteLifeDir(executor=executor):
                with self._lock:
                    home = self._homes.pop(executor, None)
                if home is not None:
                    self.registry.remove_under(home.writer.root)
                    home.owned.remove()
                    log.info("deleted the files of executor %s's life", executor)
            case TellDrain(executor=executor):
                try:
                    self.link.drain(executor)
                except Exception as exc:
                    log.warning(
                        "cannot tell the scheduler that executor %s drains: %s", executor, exc
                    )
                    self._carry_out_all(self._feed(DrainUndelivered(executor)))
                    return
                log.info("draining executor %s: %d tasks running", executor, self.running_tasks)
            case Stop():
                self.stop()
            case _:
                raise RuntimeError(f"the executor cannot carry out {action!r} here")

    # ------------------------------------------------------------ control loop

    def _serve(self) -> None:
        actions = self._feed(ServiceStarted())
        while True:
            reply: Event | None = None
            for action in actions:
                match action:
                    case Exit():
                        return
                    case Register(resume=resume):
                        reply = self._register(resume)
                    case ClaimHome(executor=executor):
                        reply = self._claim(executor)
                    case Connect(executor=executor):
                        reply = self._connect(executor)
                    case Wait(delay_s=delay_s):
                        self._stop.wait(delay_s)
                        reply = WaitEnded()
                    case _:
                        self._carry_out(action)
            if reply is None:
                raise RuntimeError(f"the executor's state left its control loop idle: {actions}")
            actions = self._feed(reply)

    def _register(self, resume: ExecutorId | None) -> Event:
        try:
            registered = self.link.register(self._registration(resume))
        except Exception as exc:
            log.warning("cannot register with the scheduler (retrying): %s", exc)
            return RegistrationFailed()
        if registered.heartbeat_interval_s > 0:
            self._heartbeat_s = registered.heartbeat_interval_s
        if registered.resumed and registered.executor == resume:
            log.info("reattached as executor %s: the scheduler kept its life and files", resume)
        else:
            if resume is not None:
                log.info("the scheduler let executor %s go; starting anew", resume)
            log.info("registered as executor %s", registered.executor)
        return Registered(registered.executor, registered.resumed)

    def _registration(self, resume: ExecutorId | None) -> Registration:
        """Who this executor is; with ``resume``, a request to go on with that life."""
        with self._lock:
            home = self._homes.get(resume) if resume is not None else None
        held_paths: tuple[str, ...] = ()
        held_jobs: tuple[str, ...] = ()
        if home is not None:
            held_paths = tuple(self.registry.paths_under(home.writer.root))
            held_jobs = tuple(home.writer.jobs())
        return Registration(
            host=self.config.host_id,
            flight_address=self.flight_address,
            slots=self.config.slots,
            pid=os.getpid(),
            work_dir=self.work.root,
            resume=resume,
            held_paths=held_paths,
            held_jobs=held_jobs,
            cores=self.config.cores_available,
            threads=self.config.threads_per_slot,
        )

    def _claim(self, executor: ExecutorId) -> Event:
        try:
            owned = self.work.claim(executor)
            writer = ShuffleWriter(os.path.join(owned.path, "shuffle"), self.registry)
        except Exception as exc:
            log.warning("cannot claim the directory of executor %s (retrying): %s", executor, exc)
            return HomeClaimFailed(executor)
        with self._lock:
            self._homes[executor] = _Home(owned, writer)
        return HomeClaimed(executor)

    def _connect(self, executor: ExecutorId) -> Event:
        """Open the stream and feed its orders in until it ends."""
        try:
            stream = self.link.connect(executor)
        except Exception as exc:
            log.warning("cannot connect to the scheduler (retrying): %s", exc)
            return ConnectFailed(executor)
        with self._lock:
            self._stream = (executor, stream)
        self._carry_out_all(self._feed(Connected(executor)))
        self.registered.set()
        while True:
            try:
                for command in stream:
                    event = _order(executor, command)
                    if event is None:
                        log.warning("ignoring an unknown command %r", command)
                        continue
                    self._carry_out_all(self._feed(event))
            except Exception as exc:
                if not self._stop.is_set():
                    log.warning("lost the scheduler's command stream: %s", exc)
            with self._lock:
                # The scheduler closes the old stream once it took the new one,
                # which may reach here before ``_move_stream`` switched to it.
                while self._moving:
                    self._move_ended.wait()
                now = self._stream
                if now is not None and now[0] == executor and now[1] is not stream:
                    stream = now[1]  # it moved to a new connection (``_move_stream``)
                    continue
                self._stream = None
                draining = self._state.draining
            break
        if draining:
            log.info("drained: the scheduler let executor %s go", executor)
        return StreamEnded(executor)

    def _move_stream(self, move: MoveStream) -> None:
        """On a thread of its own: open the new stream (``SchedulerLink.reopen``
        waits until the scheduler took it), make it the one the control loop
        reads, then end the old one from this side. It names the jobs this life
        has files of, as a registration does: the scheduler releases those that
        ended (their ``ReleaseOutputs`` may have been lost in the cut)."""
        try:
            with self._lock:
                home = self._homes.get(move.executor)
            held_jobs = tuple(home.writer.jobs()) if home is not None else ()
            try:
                new = self.link.reopen(move.executor, move.holding, move.finished, held_jobs)
            except Exception as exc:
                log.warning("cannot move the command stream (keeping the old one): %s", exc)
                return
            with self._lock:
                old = self._stream
                if old is None or old[0] != move.executor or self._stop.is_set():
                    replaced = None
                else:
                    self._stream = (move.executor, new)
                    replaced = old[1]
            if replaced is None:
                new.cancel()  # the life ended meanwhile
                return
            replaced.cancel()
            log.info(
                "moved the command stream of executor %s to a new connection (%d attempts "
                "held, %d finished lately)",
                move.executor,
                len(move.holding),
                len(move.finished),
            )
        finally:
            with self._lock:
                self._moving = False
                self._move_ended.notify_all()

    # ------------------------------------------------------------------ tasks

    def _run_task(self, spec: TaskSpec, received_at: float = 0.0) -> None:
        """On a task thread: take a slot; run the attempt if the state says so; report it.

        The slot is free again before the report goes out. The scheduler launches the
        next task on this slot as soon as it has the report, before its answer comes
        back: when the report held the slot (and, with one slot, the only task
        thread), the next task waited for that answer, 0.3 to 10 ms on a busy host
        at each stage boundary (TPC-DS q37, TPC-H q5 at SF1; issue 19).
        """
        slot = self._free_slots.get()
        finished: list[Action] = []
        outcome: TaskOutcome | None = None
        try:
            actions = self._feed(SlotTaken(spec.attempt, slot))
            if not any(isinstance(a, StartTask) for a in actions):
                log.info("task %s cancelled before it started", spec.attempt)
            for action in actions:
                if isinstance(action, StartTask):
                    outcome, finished = self._start(action, spec, received_at)
                else:
                    self._carry_out(action)
        finally:
            self._free_slots.put(slot)
        for action in finished:
            if isinstance(action, ReportCompleted) and spec.result:
                # The job's result: a small one goes with the report, for the client.
                self._report(action, _small_file(action.outputs), retry=True)
            elif isinstance(action, ReportCompleted | ReportFailed):
                self._report(action, retry=True)  # on the task's thread: it may wait
            else:
                self._carry_out(action)
        if isinstance(outcome, Completed):
            self.hooks.task_finished(spec.attempt, before_report=False)

    def _start(
        self, start: StartTask, spec: TaskSpec, received_at: float
    ) -> tuple[TaskOutcome, list[Action]]:
        """Run the attempt; its outcome and what the state says to do about it (the
        report, which the caller carries out once the slot is free, with where the
        attempt's time went: ``received_at`` is when its order arrived, Unix time)."""
        attempt = spec.attempt
        clock = PhaseClock()
        started, started_at = time.monotonic(), time.time()
        outcome = self._attempt(start, spec, clock)
        elapsed = time.monotonic() - started
        timings = clock.timings(received_at or started_at, started_at, started_at + elapsed)
        return outcome, self._feed(TaskFinished(attempt, outcome, elapsed, timings))

    def _attempt(self, start: StartTask, spec: TaskSpec, clock: PhaseClock) -> TaskOutcome:
        attempt = spec.attempt
        try:
            with self._lock:
                writer = self._homes[start.executor].writer  # its life holds it
            self.hooks.task_started(attempt)
            outputs = self._slots[start.slot].run(spec, writer, clock)
        except TaskCancelledError:
            log.info("task %s cancelled", attempt)
            return Stopped()
        except TaskFailedError as exc:
            return Failed(exc.failure)
        except Exception as exc:  # a bug of ours; the scheduler decides on a retry
            log.exception("task %s failed unexpectedly", attempt)
            return Failed(classify(exc))
        try:
            self.hooks.outputs_written(attempt, outputs)
        except OSError:
            log.exception("injecting a file fault into task %s failed", attempt)
        self.hooks.task_finished(attempt, before_report=True)
        return Completed(outputs)

    def _report(
        self,
        report: ReportCompleted | ReportFailed,
        files: Mapping[str, bytes] | None = None,
        retry: bool = False,
    ) -> None:
        """Send ``report``, with ``files`` (a result task's small output file, by
        path); ``retry``: try again while this life goes on (only from a task's
        own thread, never the control loop's, which must see the stream break)."""
        # A report that cannot be delivered is tried again while this life goes
        # on: a scheduler cut off for a while keeps the executor (it defers
        # losses when most executors fall silent at once, ``state_liveness``),
        # and would otherwise wait for the report forever. Once the life ends
        # (its stream broke: the scheduler lost it, and re-runs the task
        # elsewhere) the report is dropped. A report delivered twice (the
        # answer lost) is ignored the second time: the attempt is no longer running.
        attempt, elapsed_s = report.attempt, report.elapsed_s
        if (
            isinstance(report, ReportFailed)
            and isinstance(report.failure, ExecutionError)
            and report.failure.problem is ExecutionProblem.DISK_FULL
        ):
            # Unhealthy before the failure is reported: the scheduler re-queues
            # the task the moment it hears of the failure, and must not put it
            # back here. The heartbeat's call returns once the scheduler has it.
            with self._health_lock:
                self._health.disk_full(time.monotonic())
            self._heartbeat()
        if isinstance(report, ReportCompleted):
            log.info("task %s done in %.3f s", attempt, elapsed_s)
        else:
            log.info("task %s failed in %.3f s: %s", attempt, elapsed_s, report.failure)
        pause, deadline = 0.2, time.monotonic() + _REPORT_RETRY_S
        while True:
            try:
                if isinstance(report, ReportCompleted):
                    self.link.report_completed(
                        report.executor, attempt, report.outputs, elapsed_s, files, report.timings
                    )
                else:
                    self.link.report_failed(
                        report.executor, attempt, report.failure, elapsed_s, report.timings
                    )
                return
            except Exception as exc:
                with self._lock:
                    same_life = self._state.serving == report.executor
                if (
                    not retry
                    or not same_life
                    or time.monotonic() >= deadline
                    or self._stop.is_set()
                ):
                    log.warning("cannot report task %s (given up): %s", attempt, exc)
                    return
                log.warning("cannot report task %s (trying again): %s", attempt, exc)
            if self._stop.wait(pause):
                return
            pause = min(2.0, pause * 2)

    # ------------------------------------------------------- background loops

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            self._heartbeat()

    def _heartbeat(self) -> None:
        """Tell the scheduler this executor lives, how busy it is and whether it is healthy."""
        unhealthy = self.unhealthy()
        with self._lock:
            executor, running = self._state.serving, self._state.running_tasks
        if executor is None:
            return
        prober = self._prober
        probes = prober.take() if prober is not None else []
        try:
            reply = self.link.heartbeat(
                executor, running, unhealthy, self._peer_rates.take(), probes
            )
        except Exception as exc:
            log.debug("heartbeat failed: %s", exc)
            self._note_beat(exc)
            return
        self._note_beat(None)
        if prober is not None:
            prober.prober = executor
            prober.aim(reply.probe)
        if not reply.known:
            log.warning("the scheduler no longer knows executor %s: registering again", executor)
            self._carry_out_all(self._feed(HeartbeatRefused(executor)))
        elif reply.link_back:
            self._carry_out_all(self._feed(LinkRecovered(executor)))

    def _note_beat(self, failure: Exception | None) -> None:
        """Say on the log when heartbeats begin to fail, and when the scheduler answers
        them again, with how long that took: the executor's side of a cut or a
        flapping link (the scheduler logs its suspicions)."""
        now = time.monotonic()
        with self._beats_lock:
            failing = self._beats_failing
            if failure is not None:
                since, count = failing if failing is not None else (now, 0)
                self._beats_failing = (since, count + 1)
            else:
                self._beats_failing = None
        if failure is not None and failing is None:
            log.warning(
                "a heartbeat failed; trying again every %g s (the scheduler suspects a "
                "silent executor within seconds, and loses it at its heartbeat timeout): %s",
                self._heartbeat_s,
                failure,
            )
        elif failure is None and failing is not None:
            since, count = failing
            log.info("heartbeats answered again, after %d failed over %.1f s", count, now - since)

    def unhealthy(self) -> str:
        """Why this executor cannot take tasks now (its work directory is full), or ``""``."""
        try:
            st = os.statvfs(self.work.root)
            space = DiskSpace(self.work.root, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)
        except OSError as exc:
            return f"cannot see the free space of {self.work.root}: {exc}"
        with self._health_lock:
            reason = self._health.check(space, time.monotonic())
            if reason != self._unhealthy:
                if reason and not self._unhealthy:
                    log.warning("unhealthy, taking no task: %s", reason)
                elif not reason:
                    log.info("healthy again: %s free in %s", format_size(space.free), space.path)
                self._unhealthy = reason
        return reason

    def _cleanup_loop(self) -> None:
        # Its own thread: deleting a dead executor's files can take a while,
        # and heartbeats must never wait for it.
        while not self._stop.wait(self.config.cleanup_interval_s):
            try:
                self.work.sweep()
            except Exception:  # the loop must survive one bad sweep
                log.exception("sweeping the work root failed")


INLINE_OUTPUT_BYTES = 64 * 1024
"""The largest output file sent with its task's report: the only output of a task of a
job's final stage (``TaskSpec.result``): its result. Other tasks' outputs never go
through the scheduler (100,000 tasks of small outputs would be gigabytes through it).

The scheduler hands a small result to the client in the job's final status, which
then needs no Flight read of its own: 2 to 4 ms of a short query (TPC-H, TPC-DS at
SF1; issue 19). Most results of analytical queries are a few rows; 64 KiB bounds what
a report carries and the scheduler holds per unread result.
"""


def _warm_up(directory: str) -> None:
    """The executor's warm-up (``runner.warm_up``), then what the start left frozen
    (``pauses.settle``: a full collection no longer walks it)."""
    try:
        warm_up(directory)
    finally:
        pauses.settle()


def _small_file(outputs: tuple[PartitionOutput, ...]) -> dict[str, bytes]:
    """The file of a task's only output, by path, when it is small; else nothing
    (a file that cannot be read now, or whose bytes are no longer those its checksum
    was taken of, is left to the Flight read, which reports a damaged file and has
    the query run again: the client does not check a carried file's checksum)."""
    if len(outputs) != 1 or outputs[0].bytes > INLINE_OUTPUT_BYTES:
        return {}
    output = outputs[0]
    try:
        with open(output.path, "rb") as f:
            data = f.read(INLINE_OUTPUT_BYTES + 1)
    except OSError:
        return {}
    if len(data) != output.bytes or checksum_of(data) != output.checksum:
        return {}
    return {output.path: data}


def _order(executor: ExecutorId, command: ExecutorCommand) -> Event | None:
    """The event for an order on the stream of life ``executor``."""
    if isinstance(command, LaunchTask):
        return TaskLaunched(executor, command.task)
    if isinstance(command, CancelTask):
        return CancelRequested(executor, command.attempt)
    if isinstance(command, ReleaseOutputs):
        return OutputsReleased(executor, command.job, command.stages)
    return None
