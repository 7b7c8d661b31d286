"""The scheduler's commit thread: write statements' outputs committed off the lock.

The state machine orders a write statement's commit (``CommitWrite``: the
winning attempts' files) or its abort (``AbortWrite``); ``writes.Retirements``
says when the files a commit replaced may go (``DeleteRetired``: every job that
may read them has finished). ``DROP TABLE`` of a warehouse table comes here too
(``drop``): its files are retired like a replace's, so that a query reading the
table finishes, and it is ordered with the commits to its location (an
``INSERT`` committed before it is dropped with the table; one after it fails).
This thread carries them out one at a time, in order, off the core's lock: an
S3 commit copies every file, and two INSERTs into one table must not interleave
their manifests. A commit's outcome comes back as an event (``WriteCommitted``,
``WriteCommitFailed``), through the core.
"""

from __future__ import annotations

import errno
import logging
import queue
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from mangonel import output
from mangonel.catalog import Table, load_table
from mangonel.errors import (
    ErrorType,
    MangonelError,
    SchedulerStoppingError,
    StateStoreError,
    UnknownTableError,
)
from mangonel.scheduler.events import (
    AbortWrite,
    Command,
    CommitWrite,
    Event,
    WriteCommitFailed,
    WriteCommitted,
)
from mangonel.scheduler.hooks import EventHook
from mangonel.scheduler.writes import DeleteRetired, Retirements

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Drop:
    """Drop the warehouse's table ``name`` at ``location`` (``CommitThread.drop``)."""

    name: str
    location: str
    readable: bool
    own: str
    done: Future[bool] = field(default_factory=Future, compare=False)


@dataclass(frozen=True)
class _SweepRetired:
    """Find the files a stopped scheduler left waiting (``CommitThread.sweep_retired``)."""

    warehouse: str


_Queued = CommitWrite | AbortWrite | DeleteRetired | _Drop | _SweepRetired | None


class CommitThread:
    """Carries out ``CommitWrite``, ``AbortWrite`` and ``DeleteRetired`` in order.

    Args:
        lock: The core's lock: a commit's retired files are listed against the
            jobs running at that instant, and ``job_finished`` (called under it)
            must not slip in between.
        emit: The core's way in for an event (the commit's outcome).
        running_jobs: The ids of the jobs not finished yet.
        has_table: Whether the catalog holds a table now.
        table_committed: Register a committed table: durable, in the catalog, and
            owned by the warehouse (called with ``lock`` held).
        table_unreadable: Record a committed table whose files could not be read
            (name, location, why): durable and owned, read again later.
        forget_table: Forget a table (durable, out of the catalog); whether there
            was one (called with ``lock`` held).
        hook: The core's test hook now (crash points at ``commit-intent`` and
            ``committed``).
        clock: The core's clock.
    """

    def __init__(
        self,
        lock: threading.RLock,
        emit: Callable[[Callable[[int, float], Event]], list[Command]],
        running_jobs: Callable[[], frozenset[str]],
        has_table: Callable[[str], bool],
        table_committed: Callable[[Table], None],
        table_unreadable: Callable[[str, str, str], None],
        forget_table: Callable[[str], bool],
        hook: Callable[[], EventHook],
        clock: Callable[[], float],
    ) -> None:
        self._lock = lock
        self._emit = emit
        self._running_jobs = running_jobs
        self._has_table = has_table
        self._table_committed = table_committed
        self._table_unreadable = table_unreadable
        self._forget_table = forget_table
        self._hook = hook
        self._clock = clock
        self._queue: queue.Queue[_Queued] = queue.Queue()
        self._retirements = Retirements()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scheduler-commit", daemon=True)
        self._thread.start()

    def put(self, command: CommitWrite | AbortWrite) -> None:
        """Carry out the state machine's command, after those before it."""
        self._queue.put(command)

    def job_finished(self, job: str) -> None:
        """``job`` ended: delete what it alone still held back (under the core's lock)."""
        for release in self._retirements.finished(job):
            self._queue.put(release)

    def waiting(self) -> int:
        """How many replaces and drops hold files back for their readers (under the
        core's lock)."""
        return len(self._retirements.waiting())

    def planned(self, planning: str, job: str | None) -> None:
        """A statement being planned (``planning``, one of ``running_jobs``) became
        ``job``, or ``None``: it failed, or was a retry of a job there is (under the
        core's lock)."""
        if job is None:
            self.job_finished(planning)
        else:
            self._retirements.became(planning, job)

    def drop(self, name: str, location: str, readable: bool, own: str = "") -> bool:
        """Drop the warehouse's table ``name``, after the commits queued before: its
        name at once, its files once no job that may read them runs. Whether there
        was such a table.

        ``readable``: the table was in the catalog. One kept unreadable (its storage
        away) is forgotten even where its files cannot be reached; they stay.
        ``own``: the ``DROP TABLE`` statement's own place among the running jobs
        (it reads nothing): not waited for.

        Raises:
            OSError, MangonelError: the table's location could not be written; the
                table is still there.
            SchedulerStoppingError: the thread stops: the table is still there.
        """
        command = _Drop(name, location, readable, own)
        if self._stopping.is_set():
            raise SchedulerStoppingError(f"the scheduler is stopping: table {name} was not dropped")
        self._queue.put(command)
        return command.done.result()

    def sweep_retired(self, warehouse: str) -> None:
        """Delete, once the jobs running now have finished, the files that replaces
        and drops of the warehouse's tables took out while a stopped scheduler ran
        (its ``Retirements`` died with it)."""
        self._queue.put(_SweepRetired(warehouse))

    def stop(self) -> None:
        """End the thread once what is queued is done."""
        self._stopping.set()
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            command = self._queue.get()
            if command is None:
                # A drop queued meanwhile would wait for good: it did not happen.
                while not self._queue.empty():
                    late = self._queue.get()
                    if isinstance(late, _Drop):
                        late.done.set_exception(
                            SchedulerStoppingError(
                                f"the scheduler is stopping: table {late.name} was not dropped"
                            )
                        )
                return
            if isinstance(command, AbortWrite):
                try:
                    output.abort(command.target.location, command.job)
                except Exception:  # swept by the next commit's staging cleanup
                    log.exception("job %s: its staged files could not be removed", command.job)
                continue
            if isinstance(command, DeleteRetired):
                self._delete_retired(command)
                continue
            if isinstance(command, _Drop):
                self._drop(command)
                continue
            if isinstance(command, _SweepRetired):
                self._sweep_retired(command)
                continue
            self._commit(command)

    def _drop(self, command: _Drop) -> None:
        name, location = command.name, command.location
        try:
            dropped = output.drop(location, f"drop-{secrets.token_hex(4)}")
        except (OSError, MangonelError) as exc:
            if command.readable:
                command.done.set_exception(exc)
                return
            # Unreadable, its storage likely away: the name is free, the files stay.
            log.warning("table %s dropped; its files at %s stay: %s", name, location, exc)
            dropped = None
        else:
            if dropped is None:  # no manifest: written before there were any
                try:
                    output.remove_all(location)
                except (OSError, MangonelError) as exc:
                    if command.readable:
                        command.done.set_exception(exc)
                        return
                    log.warning("table %s dropped; its files at %s stay: %s", name, location, exc)
        try:
            with self._lock:
                forgotten = self._forget_table(name)
                ready = []
                if dropped is not None:
                    running = self._running_jobs() - {command.own}
                    ready = self._retirements.committed(location, dropped.job, running)
        except BaseException as exc:  # noqa: BLE001 - the caller's, whatever it is
            command.done.set_exception(exc)
            return
        waiting = "" if ready or dropped is None else ", its files once its readers are done"
        log.info("table %s dropped%s (%s)", name, waiting, location)
        for release in ready:  # no reader: gone before the statement's client hears of it
            self._delete_retired(release)
        command.done.set_result(forgotten)

    def _sweep_retired(self, command: _SweepRetired) -> None:
        try:
            left = output.waiting_under(command.warehouse)
        except Exception:  # noqa: BLE001 - the files stay; nothing else depends on them
            log.exception("the warehouse %s could not be looked through", command.warehouse)
            return
        for location, manifest in left:
            with self._lock:
                ready = self._retirements.committed(location, manifest.job, self._running_jobs())
            for release in ready:
                self._delete_retired(release)

    def _register(self, name: str, location: str, job: str) -> bool:
        """Put the committed table into the catalog; False where the store failed.

        The commit took effect: from here the statement succeeds, whatever the table's
        footers say. One that cannot be read now is kept as unreadable (queries
        naming it say why, and it is read again later): failing the statement would
        tell its client that nothing was written, and a retry would write it twice.
        """
        try:
            try:
                table = load_table(name, location)
            except Exception as exc:  # noqa: BLE001 - whatever it is, the commit took effect
                log.error(
                    "job %s: committed to %s, and table %s cannot be read now (kept, read "
                    "again later): %s",
                    job,
                    location,
                    name,
                    exc,
                )
                with self._lock:
                    self._table_unreadable(name, location, str(exc))
                return True
            with self._lock:
                self._table_committed(table)
        except StateStoreError:
            return False
        return True

    def _delete_retired(self, command: DeleteRetired) -> None:
        """Delete the files a commit replaced or a drop left, their readers done."""
        try:
            deleted = output.delete_retired(command.location, command.job)
        except Exception:  # still listed as retired: the next replace takes them
            log.exception("the files %s took out could not be deleted", command.job)
        else:
            log.info(
                "%s: the %d files it took out deleted at %s, their readers done",
                command.job,
                deleted,
                command.location,
            )

    def _commit(self, command: CommitWrite) -> None:
        """Commit a write statement's output and register its table; report the outcome."""
        target = command.target
        job = command.job

        def crash_point(point: str) -> None:
            self._hook().check(WriteCommitted(0, self._clock(), job), [command], point)

        try:
            if target.mode is output.CommitMode.APPEND and not self._has_table(target.table):
                raise UnknownTableError(
                    f"table {target.table} was dropped while this INSERT ran; nothing was added"
                )
            done = output.commit(
                target.location,
                job,
                dict(command.winners),
                target.format.value,
                target.mode,
                after_intent=lambda: crash_point("commit-intent"),
                running=self._running_jobs(),
            )
        except Exception as exc:
            if isinstance(exc, StateStoreError):
                return  # fatal: the scheduler stops, and a restart commits again
            msg = f"the output of job {job} could not be committed to {target.location}: {exc}"
            kind = ErrorType.JOB_FAILED
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                kind = ErrorType.WRITE_TARGET_FULL
                msg = f"disk full: {msg}. {kind.advice}"
            log.error("%s", msg)
            self._emit(lambda eid, now: WriteCommitFailed(eid, now, job, msg, kind))
            return
        log.info(
            "job %s committed %d files to %s (%d in its manifest)",
            job,
            len(done.added),
            target.location,
            len(done.files),
        )
        if target.table and not self._register(target.table, target.location, job):
            return  # the store failed: the scheduler stops, a restart commits again
        crash_point("committed")
        if done.retired:
            # Jobs running now may have been planned on the manifest just replaced;
            # with none, the old files go before the statement's client hears of it.
            with self._lock:
                ready = self._retirements.committed(target.location, job, self._running_jobs())
            for release in ready:
                self._delete_retired(release)
        self._emit(lambda eid, now: WriteCommitted(eid, now, job))
