"""The executor's control loop: register, take commands, run tasks, report.

One ``ExecutorService`` is one executor process's life of work::

    start ──> register ──> connect ──> commands ... ──> stream broke ──┐
                 ^                                                      │
                 └──────────── back off, cancel running tasks <────────┘

* Commands arrive on the scheduler's stream and are handled at once:
  ``LaunchTask`` queues the task on a pool of ``slots`` threads, each task
  taking a free ``TaskRunner`` (one DuckDB database per slot); ``CancelTask``
  stops it; ``ReleaseOutputs`` deletes shuffle files.
* Heartbeats go from a thread of their own, so a busy executor is never taken
  for a lost one. A heartbeat answered "unknown executor" ends the stream.
* When the stream breaks, the scheduler has already counted this executor as
  lost and is re-running its tasks elsewhere: the executor cancels what it
  runs and registers again (a new id), backing off while the scheduler is away.
  Its files stay (a client may still be reading a result from them) and are
  served as before.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from mangonel.executor.config import ExecutorConfig
from mangonel.executor.failures import TaskCancelledError, TaskFailedError, classify
from mangonel.executor.flight import ShuffleFlightServer
from mangonel.executor.link import CommandStream, ExecutorCommand, Registration, SchedulerLink
from mangonel.executor.runner import TaskRunner
from mangonel.executor.shuffle import OutputRegistry, ShuffleReader, ShuffleWriter
from mangonel.ids import ExecutorId, TaskAttemptId
from mangonel.scheduler.events import (
    CancelTask,
    LaunchTask,
    PartitionOutput,
    ReleaseOutputs,
    TaskFailure,
    TaskSpec,
)

log = logging.getLogger(__name__)

_BACKOFF_START_S = 0.1
_BACKOFF_MAX_S = 5.0


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
        self.writer = ShuffleWriter(config.shuffle_dir, self.registry)
        self.flight: ShuffleFlightServer | None = None
        self._runners: queue.SimpleQueue[TaskRunner] = queue.SimpleQueue()
        self._all_runners: list[TaskRunner] = []
        self._pool = ThreadPoolExecutor(config.slots, thread_name_prefix="task")
        self._lock = threading.Lock()
        self._running: dict[TaskAttemptId, TaskRunner] = {}
        self._queued: set[TaskAttemptId] = set()
        self._cancel_queued: set[TaskAttemptId] = set()
        self._executor: ExecutorId | None = None
        self._stream: CommandStream | None = None
        self._heartbeat_s = config.heartbeat_interval_s
        self._stop = threading.Event()
        self.registered = threading.Event()
        """Set once the first registration and stream are up."""
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name="heartbeat", daemon=True
        )

    # ------------------------------------------------------------- life cycle

    @property
    def executor_id(self) -> ExecutorId | None:
        """This life's id, while registered."""
        return self._executor

    @property
    def flight_address(self) -> str:
        if self.flight is None:
            raise RuntimeError("the executor is not started")
        return f"{self.config.flight_host()}:{self.flight.port}"

    def start(self) -> None:
        """Clear old files, start the Flight server and the task slots."""
        # Files of an earlier process on this work dir belong to executor ids
        # the scheduler has already given up on.
        self.writer.release_all_except(())
        self.flight = ShuffleFlightServer(
            self.writer.root, self.registry, self.config.bind_host, self.config.flight_port
        )
        for slot in range(self.config.slots):
            runner = TaskRunner(
                self.writer,
                ShuffleReader(
                    self.config.host,
                    timeout_s=self.config.fetch_timeout_s,
                    retries=self.config.fetch_retries,
                ),
                self.config.spill_dir(slot),
                self.config.memory_limit,
                self.config.threads_per_slot,
            )
            self._all_runners.append(runner)
            self._runners.put(runner)
        log.info("executor flight server on %s", self.flight_address)

    def serve(self) -> None:
        """Register and take commands until ``stop()``; re-register when cut off."""
        self._heartbeat_thread.start()
        backoff = _BACKOFF_START_S
        while not self._stop.is_set():
            try:
                registered = self.link.register(
                    Registration(
                        host=self.config.host,
                        flight_address=self.flight_address,
                        slots=self.config.slots,
                        pid=os.getpid(),
                        work_dir=self.config.work_dir,
                    )
                )
                stream = self.link.connect(registered.executor)
            except Exception as exc:
                log.warning("cannot register with the scheduler (retrying): %s", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            with self._lock:
                self._executor, self._stream = registered.executor, stream
                if registered.heartbeat_interval_s > 0:
                    self._heartbeat_s = registered.heartbeat_interval_s
            if self._stop.is_set():  # stop() ran before the stream was published
                stream.cancel()
            log.info("registered as executor %s", registered.executor)
            self.registered.set()
            try:
                for command in stream:
                    backoff = _BACKOFF_START_S
                    self._handle(registered.executor, command)
            except Exception as exc:
                if not self._stop.is_set():
                    log.warning("lost the scheduler's command stream: %s", exc)
            with self._lock:
                self._executor, self._stream = None, None
            # The scheduler re-runs this life's tasks elsewhere: stop them here.
            self._cancel_all()
            if not self._stop.is_set():
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)

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
        self.writer.release_all_except(())
        shutil.rmtree(os.path.join(self.config.work_dir, "spill"), ignore_errors=True)

    # --------------------------------------------------------------- commands

    def _handle(self, executor: ExecutorId, command: ExecutorCommand) -> None:
        if isinstance(command, LaunchTask):
            with self._lock:
                self._queued.add(command.task.attempt)
            self._pool.submit(self._run_task, executor, command.task)
        elif isinstance(command, CancelTask):
            self._cancel(command.attempt)
        elif isinstance(command, ReleaseOutputs):
            try:
                self.writer.release(command.job, command.stages)
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

    def _run_task(self, executor: ExecutorId, spec: TaskSpec) -> None:
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
            started = time.monotonic()
            try:
                outputs = runner.run(spec)
            except TaskCancelledError:
                log.info("task %s cancelled", attempt)
                return
            except TaskFailedError as exc:
                self._report(executor, attempt, exc.failure, time.monotonic() - started)
            except Exception as exc:  # a bug of ours; the scheduler decides on a retry
                log.exception("task %s failed unexpectedly", attempt)
                self._report(executor, attempt, classify(exc), time.monotonic() - started)
            else:
                self._report(executor, attempt, outputs, time.monotonic() - started)
        finally:
            with self._lock:
                self._running.pop(attempt, None)
            self._runners.put(runner)

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

    # -------------------------------------------------------------- heartbeat

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            with self._lock:
                executor, stream = self._executor, self._stream
            if executor is None:
                continue
            try:
                known = self.link.heartbeat(executor, self.running_tasks)
            except Exception as exc:
                log.debug("heartbeat failed: %s", exc)
                continue
            if not known and stream is not None:
                log.warning(
                    "the scheduler no longer knows executor %s: registering again", executor
                )
                stream.cancel()
