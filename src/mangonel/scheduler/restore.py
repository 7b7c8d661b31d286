"""What a restarted scheduler rebuilds from its state store, before it serves.

``SchedulerCore.recover`` reads the store (``persist.read_snapshot``) and hands
the snapshot here; ``rebuild`` says what to put back: the tables (their footers
read again; one that cannot be read now is kept, unreadable, for the core to try
again: ``UnreadableTable``), each job's watchers'
record (``jobs.JobWatch``), the unfinished jobs' records for the state machine
(``state_jobs.JobRecord``) and the finished ones, and what to write back. A job
whose record cannot be restored (its progress does not fit its plan, or its
entry cannot be read) is failed in its place: its client hears why, and the
store then holds a record a later restart reads. Nothing here takes the core's
lock or writes the store: the core applies the result under its lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from mangonel import defaults, storage
from mangonel.catalog import Table, load_table
from mangonel.errors import (
    DroppedLocationError,
    ErrorType,
    MangonelError,
    ObjectStoreUnavailableError,
)
from mangonel.ids import JobId
from mangonel.plan.physical import DistributedPlan
from mangonel.scheduler.jobs import JobWatch
from mangonel.scheduler.persist import (
    BrokenJob,
    Snapshot,
    StoredDrop,
    StoredPlan,
    StoredTable,
    job_key,
    table_key,
)
from mangonel.scheduler.state_jobs import FinishedJob, JobRecord
from mangonel.scheduler.state_views import JobState, JobView
from mangonel.task import FileFormat

log = logging.getLogger(__name__)


@dataclass
class Rebuilt:
    """What ``rebuild`` found in the store, to be put back."""

    tables: list[Table] = field(default_factory=list)
    unreadable: dict[str, UnreadableTable] = field(default_factory=dict)
    """Tables that could not be read now (their store away, a mount not there yet):
    kept in the store, tried again by the core."""
    owned: set[str] = field(default_factory=set)
    """Tables the warehouse owns (``DROP TABLE`` deletes their files)."""
    watches: dict[JobId, JobWatch] = field(default_factory=dict)
    running: list[JobRecord] = field(default_factory=list)
    finished: list[FinishedJob] = field(default_factory=list)
    drops_done: dict[tuple[str, str], StoredDrop] = field(default_factory=dict)
    """Drops that took effect before the restart without their job written, and
    the admins' ``DropTable`` calls of the last hour: each drop's entry, by its
    submission's or call's (owner, request id), for the client's retry
    (``StoredDrop``)."""
    puts: dict[str, object] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    """Stale keys, the failed-in-place jobs' raw entries, the drops no retry needs."""


@dataclass
class UnreadableTable:
    """A table in the store whose files could not be read: queries naming it fail
    saying so until a try reads them (``SchedulerCore``); ``DROP TABLE`` forgets it."""

    stored: StoredTable
    error: str
    since: float
    """Wall-clock time of the first failed read."""


def rebuild(snap: Snapshot, data: Mapping[str, object], store_url: str, now: float) -> Rebuilt:
    """What to restore from a snapshot of the store (``data``, as it was read)."""
    out = Rebuilt()
    store_away: str | None = None
    for name, table in snap.tables.items():
        if table.owned:
            out.owned.add(name)
        if store_away is not None and storage.is_remote(table.path):
            # Each table would wait out the store's retries again (tens of seconds).
            out.unreadable[name] = UnreadableTable(table, store_away, time.time())
            continue
        try:
            out.tables.append(load_stored(name, table))
        except DroppedLocationError:
            # Dropped just before the scheduler stopped, its name not forgotten yet:
            # the drop took effect (its manifest says so), and the core's sweep
            # deletes the files (``CommitThread.sweep_retired``).
            log.info("table %s was dropped before the restart: forgotten", name)
            out.owned.discard(name)
            out.deletes.append(table_key(name))
        except MangonelError as exc:
            log.error(
                "table %s cannot be read now, kept (queries naming it fail until it can "
                "be read; tried again every %g s): %s",
                name,
                defaults.UNREADABLE_TABLE_RETRY_S,
                exc,
            )
            out.unreadable[name] = UnreadableTable(table, str(exc), time.time())
            if isinstance(exc, ObjectStoreUnavailableError) and storage.is_remote(table.path):
                store_away = f"not read: the object store was unavailable ({exc})"
    present = {table.name for table in out.tables} | set(out.unreadable)
    for key, drop in snap.drops.items():
        if drop.table in present:
            # It stopped before the table was dropped: a retry drops it.
            out.deletes.append(key)
        elif now - drop.at > defaults.DROP_RETRY_KEEP_S:
            log.info("the answer to a DROP TABLE %s (%s) was never asked for", drop.table, key)
            out.deletes.append(key)
        else:
            log.info("table %s was dropped before the restart; its client is answered", drop.table)
            out.drops_done[(drop.owner, drop.request_id)] = drop
    broken = list(snap.broken)
    for stored in snap.jobs:
        if stored.outcome is None and stored.progress is not None:
            try:
                out.running.append(JobRecord.restore(stored.plan.plan, stored.progress))
            except Exception as exc:  # one job's record never stops the scheduler
                problem = f"its progress does not fit its plan ({exc})"
                log.exception("job %s cannot be restored: %s", stored.id, problem)
                keys = [k for k in data if k.startswith(job_key(stored.id, ""))]
                broken.append(BrokenJob(stored.id, problem, keys, stored.plan))
                continue
        record = JobWatch.create(
            stored.id, stored.plan.sql, stored.plan.plan, stored.plan.submitted
        )
        record.submitted_wall = stored.plan.submitted_wall
        record.request_id = stored.plan.request_id
        record.owner = stored.plan.owner
        if stored.outcome is not None:
            out.finished.append(stored.outcome)
            record.update(stored.outcome.view, stored.plan.submitted, stored.outcome.result)
        out.watches[stored.id] = record
    out.deletes += snap.stale
    for job in broken:
        outcome, plan, record = failed_in_place(job, store_url, now)
        out.finished.append(outcome)
        out.watches[job.id] = record
        out.puts[job_key(job.id, "plan")] = plan
        out.puts[job_key(job.id, "outcome")] = outcome
        out.deletes += [k for k in job.keys if k not in out.puts]
    return out


def failed_in_place(
    job: BrokenJob, store_url: str, now: float
) -> tuple[FinishedJob, StoredPlan, JobWatch]:
    """A failed job in place of one whose record cannot be restored: its client
    hears why, and the store holds a record a restart reads (what could be read
    of its plan, else an empty plan with what its raw entry still said)."""
    plan = job.plan
    if plan is None:
        f = job.fields
        submitted = float(f.get("submitted", now))
        plan = StoredPlan(
            str(f.get("sql", "")),
            submitted,
            float(f.get("submitted_wall", submitted)),
            DistributedPlan((), ()),
            str(f.get("request_id", "")),
            str(f.get("owner", "")),
        )
    error = (
        f"the scheduler restarted and could not restore this job from its state store "
        f"{store_url}: {job.problem}. The job was failed; submit the query again. "
        "The store was damaged or written by another mangonel version: the "
        f"scheduler's log has the details under job {job.id}."
    )
    view = JobView(
        job.id, JobState.FAILED, plan.submitted, now, error, (), plan.sql, ErrorType.INTERNAL
    )
    record = JobWatch.create(job.id, plan.sql, plan.plan, plan.submitted)
    record.submitted_wall = plan.submitted_wall
    record.request_id = plan.request_id
    record.owner = plan.owner
    record.update(view, now)
    return FinishedJob(view), plan, record


def load_stored(name: str, stored: StoredTable) -> Table:
    """A table as the store recorded it: a CSV or JSON one with its columns of register."""
    kind = FileFormat(stored.format)
    columns = [(n, t) for n, t in stored.columns]
    return load_table(name, stored.path, kind, stored.options, columns)
