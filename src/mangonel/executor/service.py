"""The executor's control loop: register, take commands, run tasks, report, drain.

One ``ExecutorService`` is one executor process. Each registration with the
scheduler begins a *life*: an executor id, a locked directory
``<work root>/<executor id>/`` for that life's shuffle files, and the tasks the
scheduler gave it::

    start: sweep dead executors' directories, claim the spill directory
      │
      ▼
    register ──▶ claim <work root>/<id> ──▶ connect ──▶ commands ... ──▶ stream ended
      ▲   ▲                                    ▲                             │
      │   │                                    │ resumed: same id, same      │
      │   │                                    │ files, new stream           ▼
      │   │                               register again asking to resume <id>,
      │   │                               saying which outputs it still holds
      │   │   refused (it was counted as lost):           │
      │   └── end the old life: delete its directory ◀────┘
      │       once its cancelled tasks stopped
      └─ back off; draining: exit instead of registering again

* Commands arrive on the scheduler's stream and are handled at once:
  ``LaunchTask`` queues the task on a pool of ``slots`` threads, each task
  taking a free ``TaskRunner`` (one DuckDB database per slot); ``CancelTask``
  stops it; ``ReleaseOutputs`` deletes shuffle files.
* Heartbeats go from a thread of their own, so a busy executor is never taken
  for a lost one. A heartbeat answered "unknown executor" ends the stream.
* When the stream ends, the scheduler either counted this life as lost or
  went away (crashed, restarted, a new leader took over); either way it runs
  the life's tasks again, so the executor cancels them. It then registers
  again asking to resume the life, with the paths of the outputs it still
  holds: a restarted scheduler that still counts on it takes it back (its
  outputs stay in use; those it lost are made again); otherwise the life is
  over and its files are deleted once its tasks stopped (a frozen-then-thawed
  executor must not leak its first life's files), and a new life begins under
  a new id. Late reports of an old life are ignored by the scheduler.
* ``drain()`` (on SIGTERM) tells the scheduler this executor leaves. The
  scheduler gives it no new task and closes its stream once its tasks finished
  and no job needs its outputs; ``serve()`` then returns instead of registering
  again. ``run_executor`` bounds the whole drain (``drain_timeout_s``).
* A cleanup thread sweeps the work root every ``cleanup_interval_s`` for the
  directories of dead executors (``executor.workdir``).
* A ``FaultInjector`` hooks into each task for chaos tests (``executor.faults``).
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from mangonel.executor.config import ExecutorConfig
from mangonel.executor.failures import TaskCancelledError, TaskFailedError, classify
from mangonel.executor.faults import FaultInjector
from mangonel.executor.flight import ShuffleFlightServer
from mangonel.executor.link import CommandStream, ExecutorCommand, Registration, SchedulerLink
from mangonel.executor.runner import TaskRunner
from mangonel.executor.shuffle import OutputRegistry, ShuffleReader, ShuffleWriter
from mangonel.executor.workdir import OwnedDir, WorkRoot
from mangonel.ids import ExecutorId, TaskAttemptId
from mangonel.task import (
    CancelTask,
    LaunchTask,
    PartitionOutput,
    ReleaseOutputs,
    TaskFailure,
    TaskSpec,
)

log = logging.getLogger(__name__)

_BACKOFF_START_S = 0.1
_BACKOFF_MAX_S = 1.0
"""A restarted scheduler waits for its executors to reattach: try often."""


class _Life:
    """One registration: its id, its directory, its writer and its tasks."""

    def __init__(self, executor: ExecutorId, home: OwnedDir, writer: ShuffleWriter) -> None:
        self.executor = executor
        self.home = home
        self.writer = writer
        self.tasks: set[TaskAttemptId] = set()
        """Attempts queued or running (guarded by the service's lock)."""
        self.ended = False


class ExecutorService:
    """An executor: Flight server, task slots and the loop that drives them.

    Args:
        config: The executor's settings.
        link: The line to the scheduler.
    """

    def __init__(self, config: ExecutorConfig, link: SchedulerLink) -> None:
        self.config = config
        self.link = link
        self.registry = OutputRegistry()
        self.work = WorkRoot(config.work_dir)
        label = str(config.index) if config.index is not None else ""
        self.faults = FaultInjector(config.faults_file, label)
        self.flight: ShuffleFlightServer | None = None
        self._spill: OwnedDir | None = None
        self._runners: queue.SimpleQueue[TaskRunner] = queue.SimpleQueue()
        self._all_runners: list[TaskRunner] = []
        self._pool = ThreadPoolExecutor(config.slots, thread_name_prefix="task")
        self._lock = threading.Lock()
        self._running: dict[TaskAttemptId, TaskRunner] = {}
        self._queued: set[TaskAttemptId] = set()
        self._cancel_queued: set[TaskAttemptId] = set()
        self._life: _Life | None = None
        self._lives: list[_Life] = []
        """Lives whose directory still exists (the current one and ended ones
        waiting for their last task to stop)."""
        self._stream: CommandStream | None = None
        self._heartbeat_s = config.heartbeat_interval_s
        self._stop = threading.Event()
        self._draining = threading.Event()
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

    # ------------------------------------------------------------- life cycle

    @property
    def executor_id(self) -> ExecutorId | None:
        """This life's id, while registered."""
        life = self._life
        return life.executor if life is not None else None

    @property
    def flight_address(self) -> str:
        if self.flight is None:
            raise RuntimeError("the executor is not started")
        return f"{self.config.flight_host()}:{self.flight.port}"

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def start(self) -> None:
        """Sweep dead executors' files, start the Flight server and the task slots."""
        self.work.sweep()
        self._spill = self.work.claim(f"spill-{os.getpid()}-{secrets.token_hex(2)}")
        self.flight = ShuffleFlightServer(
            self.work.root, self.registry, self.config.bind_host, self.config.flight_port
        )
        for slot in range(self.config.slots):
            runner = TaskRunner(
                None,
                ShuffleReader(
                    self.config.host,
                    timeout_s=self.config.fetch_timeout_s,
                    retries=self.config.fetch_retries,
                ),
                os.path.join(self._spill.path, f"slot-{slot}"),
                self.config.memory_limit,
                self.config.threads_per_slot,
            )
            self._all_runners.append(runner)
            self._runners.put(runner)
        log.info("executor flight server on %s", self.flight_address)

    def serve(self) -> None:
        """Register and take commands until stopped or drained; re-register when cut off."""
        self._heartbeat_thread.start()
        self._cleanup_thread.start()
        try:
            self._serve()
        finally:
            self.finished.set()

    def _serve(self) -> None:
        backoff = _BACKOFF_START_S
        life: _Life | None = None
        """The life to go on with: after the stream breaks, the scheduler may have
        restarted and still count on it (then its files are kept)."""
        while not self._stop.is_set() and not self._draining.is_set():
            try:
                registered = self.link.register(self._registration(life))
                if life is None or not (
                    registered.resumed and registered.executor == life.executor
                ):
                    if life is not None:
                        log.info("the scheduler let executor %s go; starting anew", life.executor)
                        self._end_life(life)
                        life = None
                    life = self._begin_life(registered.executor)
            except Exception as exc:
                log.warning("cannot register with the scheduler (retrying): %s", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            try:
                stream = self.link.connect(registered.executor)
            except Exception as exc:
                log.warning("cannot connect to the scheduler (retrying): %s", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            with self._lock:
                self._life, self._stream = life, stream
                if registered.heartbeat_interval_s > 0:
                    self._heartbeat_s = registered.heartbeat_interval_s
            if self._stop.is_set():  # stop() ran before the stream was published
                stream.cancel()
            if registered.resumed:
                log.info("reattached as executor %s after the scheduler restarted", life.executor)
            else:
                log.info("registered as executor %s", registered.executor)
            self.registered.set()
            try:
                for command in stream:
                    backoff = _BACKOFF_START_S
                    self._handle(life, command)
            except Exception as exc:
                if not self._stop.is_set():
                    log.warning("lost the scheduler's command stream: %s", exc)
            with self._lock:
                self._life, self._stream = None, None
            # Whatever happened (this executor was counted as lost, or the
            # scheduler went away), the scheduler runs these tasks again.
            self._cancel_tasks(life)
            if self._draining.is_set():
                self._end_life(life)
                log.info("drained: the scheduler let executor %s go", life.executor)
                return
            if not self._stop.is_set():
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)

    def _registration(self, life: _Life | None) -> Registration:
        """Who this executor is; with ``life``, a request to go on with it."""
        held_paths: tuple[str, ...] = ()
        held_jobs: tuple[str, ...] = ()
        if life is not None:
            held_paths = tuple(self.registry.paths_under(life.writer.root))
            held_jobs = tuple(life.writer.jobs())
        return Registration(
            host=self.config.host,
            flight_address=self.flight_address,
            slots=self.config.slots,
            pid=os.getpid(),
            work_dir=self.work.root,
            resume=life.executor if life is not None else None,
            held_paths=held_paths,
            held_jobs=held_jobs,
        )

    def drain(self) -> None:
        """Leave the cluster gracefully; returns at once (watch ``finished``).

        The scheduler gives this executor no new task, lets its running tasks
        finish, and closes its stream once no job needs its outputs; ``serve()``
        then returns. When there is no scheduler to tell (not registered, or it
        cannot be reached), the executor stops at once: nobody counts on it.
        """
        self._draining.set()
        with self._lock:
            life = self._life
        if life is None:
            self.stop()
            return
        try:
            self.link.drain(life.executor)
        except Exception as exc:
            log.warning("cannot tell the scheduler that executor %s drains: %s", life.executor, exc)
            self.stop()
            return
        log.info("draining executor %s: %d tasks running", life.executor, self.running_tasks)

    def stop(self) -> None:
        """Ask ``serve()`` to return; safe from any thread."""
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def close(self) -> None:
        """Cancel running tasks and release everything; after ``serve()`` returned."""
        self._stop.set()
        self._cancel_all()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.flight is not None:
            self.flight.shutdown()
        for runner in self._all_runners:
            runner.reader.close()
            runner.close()
        self.link.close()
        with self._lock:
            lives, self._lives = self._lives, []
        for life in lives:
            self._retire(life)
        if self._spill is not None:
            self._spill.remove()

    # ------------------------------------------------------------------ lives

    def _begin_life(self, executor: ExecutorId) -> _Life:
        home = self.work.claim(executor)
        life = _Life(
            executor, home, ShuffleWriter(os.path.join(home.path, "shuffle"), self.registry)
        )
        with self._lock:
            self._lives.append(life)
        return life

    def _cancel_tasks(self, life: _Life) -> None:
        """Cancel every task the life has queued or running."""
        with self._lock:
            for attempt in life.tasks:
                runner = self._running.get(attempt)
                if runner is not None:
                    runner.cancel(attempt)
                else:
                    self._cancel_queued.add(attempt)

    def _end_life(self, life: _Life) -> None:
        """Cancel what the life runs; delete its files once nothing of it runs."""
        self._cancel_tasks(life)
        with self._lock:
            life.ended = True
            idle = not life.tasks
        if idle:
            self._retire(life)

    def _retire(self, life: _Life) -> None:
        with self._lock:
            if life in self._lives:
                self._lives.remove(life)
        self.registry.remove_under(life.writer.root)
        life.home.remove()
        log.info("deleted the files of executor %s's life", life.executor)

    # --------------------------------------------------------------- commands

    def _handle(self, life: _Life, command: ExecutorCommand) -> None:
        if isinstance(command, LaunchTask):
            with self._lock:
                self._queued.add(command.task.attempt)
                life.tasks.add(command.task.attempt)
            self._pool.submit(self._run_task, life, command.task)
        elif isinstance(command, CancelTask):
            self._cancel(command.attempt)
        elif isinstance(command, ReleaseOutputs):
            try:
                life.writer.release(command.job, command.stages)
            except Exception:
                log.exception("releasing the files of job %s failed", command.job)
        else:
            log.warning("ignoring an unknown command %r", command)

    def _cancel(self, attempt: TaskAttemptId) -> None:
        with self._lock:
            runner = self._running.get(attempt)
            if runner is not None:
                runner.cancel(attempt)
            elif attempt in self._queued:
                self._cancel_queued.add(attempt)

    def _cancel_all(self) -> None:
        with self._lock:
            for attempt, runner in self._running.items():
                runner.cancel(attempt)
            self._cancel_queued |= self._queued

    @property
    def running_tasks(self) -> int:
        with self._lock:
            return len(self._running)

    # ------------------------------------------------------------------ tasks

    def _run_task(self, life: _Life, spec: TaskSpec) -> None:
        attempt = spec.attempt
        runner = self._runners.get()
        try:
            with self._lock:
                self._queued.discard(attempt)
                if attempt in self._cancel_queued:
                    self._cancel_queued.discard(attempt)
                    log.info("task %s cancelled before it started", attempt)
                    return
                self._running[attempt] = runner
            self._attempt(life, spec, runner)
        finally:
            with self._lock:
                self._running.pop(attempt, None)
                life.tasks.discard(attempt)
                retire = life.ended and not life.tasks
            self._runners.put(runner)
            task = attempt.task
            if life.writer.is_released(task.job, task.stage):
                # Released while this attempt ran (its job ended): whatever it
                # wrote after the release is deleted here, or nobody would.
                life.writer.release(task.job, (task.stage,))
            if retire:
                self._retire(life)

    def _attempt(self, life: _Life, spec: TaskSpec, runner: TaskRunner) -> None:
        attempt = spec.attempt
        started = time.monotonic()
        try:
            self.faults.task_started(attempt)
            outputs = runner.run(spec, life.writer)
        except TaskCancelledError:
            log.info("task %s cancelled", attempt)
            return
        except TaskFailedError as exc:
            self._report(life.executor, attempt, exc.failure, time.monotonic() - started)
            return
        except Exception as exc:  # a bug of ours; the scheduler decides on a retry
            log.exception("task %s failed unexpectedly", attempt)
            self._report(life.executor, attempt, classify(exc), time.monotonic() - started)
            return
        try:
            self.faults.outputs_written(attempt, outputs)
        except OSError:
            log.exception("injecting a file fault into task %s failed", attempt)
        self.faults.task_finished(attempt, before_report=True)
        self._report(life.executor, attempt, outputs, time.monotonic() - started)
        self.faults.task_finished(attempt, before_report=False)

    def _report(
        self,
        executor: ExecutorId,
        attempt: TaskAttemptId,
        result: tuple[PartitionOutput, ...] | TaskFailure,
        elapsed_s: float,
    ) -> None:
        # A report that cannot be delivered is not retried: the scheduler has
        # then lost this executor's stream too, and re-runs the task elsewhere.
        try:
            if isinstance(result, tuple):
                log.info("task %s done in %.3f s", attempt, elapsed_s)
                self.link.report_completed(executor, attempt, result, elapsed_s)
            else:
                log.info("task %s failed in %.3f s: %s", attempt, elapsed_s, result)
                self.link.report_failed(executor, attempt, result, elapsed_s)
        except Exception as exc:
            log.warning("cannot report task %s: %s", attempt, exc)

    # ------------------------------------------------------- background loops

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            with self._lock:
                life, stream = self._life, self._stream
            if life is None:
                continue
            try:
                known = self.link.heartbeat(life.executor, self.running_tasks)
            except Exception as exc:
                log.debug("heartbeat failed: %s", exc)
                continue
            if not known and stream is not None:
                log.warning(
                    "the scheduler no longer knows executor %s: registering again", life.executor
                )
                stream.cancel()

    def _cleanup_loop(self) -> None:
        # Its own thread: deleting a dead executor's files can take a while,
        # and heartbeats must never wait for it.
        while not self._stop.wait(self.config.cleanup_interval_s):
            try:
                self.work.sweep()
            except Exception:  # the loop must survive one bad sweep
                log.exception("sweeping the work root failed")
