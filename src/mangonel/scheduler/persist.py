"""What the scheduler keeps in its ``StateStore``, and how it reads it back.

The layout, one JSON document per key (encoded with cattrs from the domain
dataclasses, so the store holds the same types the state machine uses)::

    tables/<name>          StoredTable: the table's path, format, options and (CSV,
                           JSON) columns (footers, sizes are re-read at start)
    jobs/<id>/plan         StoredPlan: SQL, submission time, owner, the distributed plan
                           (written once)
    jobs/<id>/progress     JobProgress without its tasks: the job's state, stage
                           re-runs, where it ran (while the job runs)
    jobs/<id>/tasks/<stage>/<partition>
                           TaskRecord: one task's state, attempts, outputs'
                           locations (while the job runs; a task never changed
                           since submission has no key: it is pending)
    jobs/<id>/outcome      FinishedJob: the state machine's record of a finished job:
                           its final view (how it ended, when, its error), its
                           result's locations, whether the client read it, where
                           it ran (once it finished)
    executors              RegistrySnapshot: live executors and the recent lost ones
    revivals               StoredRevivals: what lost executors that may come back
                           held, so one lost before a restart is revived after it
                           (``state_revival``; absent in older stores: none)
    meta                   StoredMeta: scheduler-wide state (since when no executor lives)
    drops/<digest>         StoredDrop: a ``DROP TABLE`` a client submitted with a request
                           id, from just before it drops until its job's plan is
                           written; an admin's ``DropTable`` call, for an hour
                           (absent in older stores: none)

One task event therefore writes the one task's key and the job's small head,
whatever the job's size; a job's task keys go when it finishes (its
``outcome`` replaces them). A ``progress`` document that holds the tasks
itself (the layout before task keys) is still read.

The shell writes, after each event and before it carries out any of the
event's commands, every key whose document changed (``StateWriter`` keeps what
the store holds and writes only differences), in one atomic commit. A crash at
any point therefore leaves the store at the state after some event whose
commands may or may not have been carried out, which recovery handles: running
attempts are given up on and executors reattach (``SchedulerRecovered``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cattrs.gen import make_dict_unstructure_fn, override
from cattrs.preconf.json import make_converter
from cattrs.strategies import configure_tagged_union

from mangonel.errors import StateStoreError
from mangonel.ids import JobId, StageId, TaskId
from mangonel.plan.physical import DistributedPlan
from mangonel.scheduler.state_executors import ExecutorRecord, RegistrySnapshot
from mangonel.scheduler.state_jobs import FinishedJob, JobProgress, StageProgress
from mangonel.scheduler.state_revival import StoredRevivals
from mangonel.scheduler.state_stages import TaskRecord, TaskState
from mangonel.scheduler.store import StateStore
from mangonel.task import PartitionLocation

log = logging.getLogger(__name__)

_converter = make_converter()
configure_tagged_union(TaskState, _converter, tag_name="kind")
# A location's ticket is signed on the way out (``scheduler.tickets``), never kept.
_converter.register_unstructure_hook(
    PartitionLocation,
    make_dict_unstructure_fn(PartitionLocation, _converter, ticket=override(omit=True)),
)
_converter.register_unstructure_hook(
    ExecutorRecord,
    make_dict_unstructure_fn(ExecutorRecord, _converter, registry=override(omit=True)),
)
# Where a task notes its changes is the state machine's bookkeeping, not state.
_converter.register_unstructure_hook(
    TaskRecord,
    make_dict_unstructure_fn(TaskRecord, _converter, owner=override(omit=True)),
)


@dataclass(frozen=True)
class StoredTable:
    path: str
    format: str = "parquet"
    options: dict[str, str] = field(default_factory=dict)
    columns: list[tuple[str, str]] = field(default_factory=list)
    """A CSV or JSON table's columns (name, DuckDB type) as fixed at register: a
    restarted scheduler reads its files with the same schema, never infers again."""
    owned: bool = False
    """Written by ``CREATE TABLE AS`` into the warehouse: ``DROP TABLE`` deletes its files."""


@dataclass(frozen=True)
class StoredPlan:
    sql: str
    submitted: float
    submitted_wall: float
    plan: DistributedPlan
    request_id: str = ""
    owner: str = ""
    """The user who submitted the job; empty in stores written before users existed
    (such jobs are the admins' alone)."""


@dataclass(frozen=True)
class StoredDrop:
    """A ``DROP TABLE`` under way for a client's submission (``request_id``): written
    before the table is dropped, deleted in the commit that writes the statement's
    job. A scheduler that stopped between the two finds it at its restart: the
    table gone, the drop took effect, and the client's retry of the submission is
    answered as done instead of dropping again (``SchedulerCore.submit``). An
    admin's ``DropTable`` call writes one too, kept ``DROP_RETRY_KEEP_S`` for the
    call's retries (``SchedulerCore.drop_table_once``)."""

    owner: str
    request_id: str
    table: str
    at: float
    """When it was written (the scheduler's clock, wall time)."""


@dataclass(frozen=True)
class StoredMeta:
    no_executor_since: float | None = None


@dataclass
class StoredJob:
    id: JobId
    plan: StoredPlan
    progress: JobProgress | None = None
    outcome: FinishedJob | None = None


@dataclass
class BrokenJob:
    """A job whose record a restarted scheduler cannot take back: it fails the job
    (its client hears why) and serves everything else.

    Attributes:
        id: The job.
        problem: What is wrong, for the log and the client's error.
        keys: Every key the store holds of the job (to be replaced by its outcome).
        plan: Its plan, where that much was readable.
        fields: What could be read of a plan that could not be decoded whole
            (its SQL, owner, request id, submission time), as plain JSON values.
    """

    id: JobId
    problem: str
    keys: list[str] = field(default_factory=list)
    plan: StoredPlan | None = None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Snapshot:
    """Everything a restarted scheduler reads back."""

    tables: dict[str, StoredTable] = field(default_factory=dict)
    jobs: list[StoredJob] = field(default_factory=list)
    broken: list[BrokenJob] = field(default_factory=list)
    """Jobs whose records cannot be restored (see ``BrokenJob``)."""
    drops: dict[str, StoredDrop] = field(default_factory=dict)
    """Drops that were under way when the scheduler stopped, by key (``StoredDrop``)."""
    stale: list[str] = field(default_factory=list)
    """Keys left behind by a crash between the commits of one state change (a
    finished job's progress and tasks beside its outcome, a forgotten job's
    outcome without its plan): recovery deletes them."""
    executors: RegistrySnapshot | None = None
    meta: StoredMeta = field(default_factory=StoredMeta)
    revivals: StoredRevivals | None = None

    @property
    def empty(self) -> bool:
        return (
            not self.tables
            and not self.jobs
            and not self.broken
            and not self.drops
            and self.executors is None
        )


def table_key(name: str) -> str:
    return f"tables/{name}"


def drop_key(owner: str, request_id: str) -> str:
    """Where a ``StoredDrop`` is kept: a digest, as user names and request ids are
    the clients' own text."""
    digest = hashlib.sha256(f"{owner}\0{request_id}".encode()).hexdigest()[:32]
    return f"drops/{digest}"


def job_key(job: JobId, part: str) -> str:
    return f"jobs/{job}/{part}"


def job_prefix(job: JobId) -> str:
    """Every key of a job starts so: given as a delete, ``StateWriter`` deletes them
    all, those of its tasks included."""
    return job_key(job, "")


def task_key(job: JobId, stage: StageId, partition: int) -> str:
    return f"jobs/{job}/tasks/{stage}/{partition}"


EXECUTORS_KEY = "executors"
META_KEY = "meta"
REVIVALS_KEY = "revivals"
_CACHED = frozenset({EXECUTORS_KEY, REVIVALS_KEY})
"""Keys whose objects are never changed once given to ``StateWriter.commit``."""


def _is_snapshot(value: object) -> bool:
    """A value built afresh for every commit and never changed after: a job's
    head (``JobRecord.head``, a ``JobProgress`` without tasks; one with tasks
    holds the live task lists). One equal to the last put at its key has the
    same text: comparing costs microseconds, while encoding a head whose
    ``ran_on`` lists 1,000 executors cost more than the task event that asked."""
    return isinstance(value, JobProgress) and not any(s.tasks for s in value.stages.values())


def encode(value: object) -> str:
    return json.dumps(_converter.unstructure(value), separators=(",", ":"))


def decode(text: str, kind: type[Any]) -> Any:
    return _converter.structure(json.loads(text), kind)


def read_snapshot(
    data: Mapping[str, str], where: str, decoder: Callable[[str, type[Any]], Any] = decode
) -> Snapshot:
    """Decode a store's keys (each with ``decoder``: the simulator's keeps what
    it decoded before, ``testing.sim_restore``).

    A job's keys that cannot be read, or that do not fit its plan, make it a
    ``BrokenJob`` (logged with what is wrong): one damaged job never keeps the
    scheduler from starting. A table's entry that cannot be read is dropped
    (logged) like a table whose files are gone.

    Raises:
        StateStoreError: a scheduler-wide key (``executors``, ``meta``, or one this
            mangonel does not know) holds something this mangonel cannot read;
            the message names the store and the key.
    """
    snap = Snapshot()
    plans: dict[JobId, StoredPlan] = {}
    progress: dict[JobId, JobProgress] = {}
    outcomes: dict[JobId, FinishedJob] = {}
    tasks: dict[JobId, list[TaskRecord]] = {}
    keys: dict[JobId, list[str]] = {}
    problems: dict[JobId, str] = {}
    raw_plans: dict[JobId, str] = {}
    for key, text in sorted(data.items()):
        parts = key.split("/")
        if parts[0] == "jobs" and len(parts) >= 3:
            job = JobId(parts[1])
            keys.setdefault(job, []).append(key)
            try:
                _read_job_key(job, parts, text, plans, progress, outcomes, tasks, decoder)
            except Exception as exc:
                problems.setdefault(job, f"its entry {key!r} cannot be read ({exc})")
                if parts[2:] == ["plan"]:
                    raw_plans[job] = text
            continue
        try:
            if parts[0] == "tables" and len(parts) == 2:
                snap.tables[parts[1]] = decoder(text, StoredTable)
            elif parts[0] == "drops" and len(parts) == 2:
                snap.drops[key] = decoder(text, StoredDrop)
            elif key == EXECUTORS_KEY:
                snap.executors = decoder(text, RegistrySnapshot)
            elif key == META_KEY:
                snap.meta = decoder(text, StoredMeta)
            elif key == REVIVALS_KEY:
                snap.revivals = decoder(text, StoredRevivals)
            else:
                raise ValueError("unknown key")
        except Exception as exc:
            if parts[0] == "tables":
                log.error("the table entry %r cannot be read, so it is dropped: %s", key, exc)
                continue
            if parts[0] == "drops":
                # Only a retry of its statement would have asked; it drops again.
                log.error("the entry %r cannot be read, so it is deleted: %s", key, exc)
                snap.stale.append(key)
                continue
            raise StateStoreError(
                f"the state store {where} holds an entry this mangonel cannot read "
                f"({key!r}: {exc}); it was written by another version or damaged. Move the "
                "store aside (or use another --state) to start with an empty state."
            ) from exc
    for job in keys:
        plan = plans.get(job)
        head = progress.get(job)
        outcome = outcomes.get(job)
        problem = problems.get(job)
        if outcome is not None:
            # It ended: whatever else is left of it (a crash between the commits of
            # its end) is superseded by its outcome; without its plan it was being
            # forgotten (``ForgetJob``).
            ended = [job_key(job, "plan"), job_key(job, "outcome")]
            if plan is None:
                snap.stale += keys[job]
            else:
                snap.jobs.append(StoredJob(job, plan, None, outcome))
                snap.stale += [k for k in keys[job] if k not in ended]
            continue
        if problem is None and plan is None:
            problem = "its plan is missing"
        if problem is None and plan is not None and head is not None:
            try:
                _fill_tasks(head, plan, tasks.get(job, []))
            except ValueError as exc:
                problem = f"its tasks do not match its plan ({exc})"
        if problem is None and head is None:
            if plan is not None and job not in tasks:
                # Planned, and the scheduler died before its first state was written.
                log.warning("job %s has a plan but no progress in the store; it is dropped", job)
                snap.stale += keys[job]
                continue
            problem = "its progress is missing"
        if problem is not None:
            snap.broken.append(_broken(job, problem, keys[job], plan, raw_plans.get(job), where))
            continue
        assert plan is not None
        snap.jobs.append(StoredJob(job, plan, head, None))
    snap.jobs.sort(key=lambda j: j.plan.submitted)
    return snap


def _read_job_key(
    job: JobId,
    parts: list[str],
    text: str,
    plans: dict[JobId, StoredPlan],
    progress: dict[JobId, JobProgress],
    outcomes: dict[JobId, FinishedJob],
    tasks: dict[JobId, list[TaskRecord]],
    decoder: Callable[[str, type[Any]], Any] = decode,
) -> None:
    """Decode one of a job's keys into its dictionary; raises what decoding raises."""
    if len(parts) == 3 and parts[2] == "plan":
        plans[job] = decoder(text, StoredPlan)
    elif len(parts) == 3 and parts[2] == "progress":
        progress[job] = decoder(text, JobProgress)
    elif len(parts) == 3 and parts[2] == "outcome":
        outcomes[job] = decoder(text, FinishedJob)
    elif len(parts) == 5 and parts[2] == "tasks":
        task = decoder(text, TaskRecord)
        if (str(task.id.stage), str(task.id.partition)) != (parts[3], parts[4]):
            raise ValueError(f"the key holds task {task.id}")
        tasks.setdefault(job, []).append(task)
    else:
        raise ValueError("unknown job part")


def _broken(
    job: JobId,
    problem: str,
    keys: list[str],
    plan: StoredPlan | None,
    raw_plan: str | None,
    where: str,
) -> BrokenJob:
    log.error(
        "the state store %s holds job %s in a form this scheduler cannot restore: %s; "
        "the job is failed and everything else served",
        where,
        job,
        problem,
    )
    fields: dict[str, Any] = {}
    if raw_plan is not None:
        try:
            loaded = json.loads(raw_plan)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            fields = {
                k: v
                for k, v in loaded.items()
                if k in ("sql", "submitted", "submitted_wall", "request_id", "owner")
                and isinstance(v, str | float | int)
            }
    return BrokenJob(job, problem, keys, plan, fields)


def _fill_tasks(head: JobProgress, plan: StoredPlan, tasks: list[TaskRecord]) -> None:
    """Put the job's task keys into its head: every task of the plan, those
    without a key pending as created. A stage adaptive execution coalesced has
    one task per range of partitions (``StageProgress.bounds``), not the plan's
    count."""
    for stage in plan.plan.stages:
        held = head.stages.setdefault(stage.id, StageProgress(0, []))
        if not held.tasks:
            count = len(held.bounds) if held.bounds else stage.num_tasks
            held.tasks = [TaskRecord.fresh(TaskId(head.id, stage.id, p)) for p in range(count)]
    for task in tasks:
        stage_tasks = head.stages[task.id.stage].tasks if task.id.stage in head.stages else []
        if not 0 <= task.id.partition < len(stage_tasks):
            raise ValueError(f"task {task.id} is not in the plan")
        stage_tasks[task.id.partition] = task


class PersistedState(Protocol):
    """What ``state_changes`` reads of ``scheduler.state.SchedulerState``."""

    def touched_jobs(self) -> list[JobId] | None: ...

    def export_job_head(self, job_id: JobId) -> JobProgress | None: ...

    def take_changed_tasks(self, job_id: JobId) -> list[TaskRecord]: ...

    def export_finished(self, job_id: JobId) -> FinishedJob | None: ...

    def export_executors(self) -> RegistrySnapshot: ...

    def export_revivals(self) -> StoredRevivals: ...

    @property
    def no_executor_since(self) -> float | None: ...


def state_changes(
    state: PersistedState, known: Container[JobId]
) -> tuple[dict[str, object], list[str]] | None:
    """The documents the state's last event may have changed, as puts and deletes
    for ``StateWriter``.

    Everything but a new job's ``plan``, which only the shell knows whole (its
    SQL, owner, request id). Which jobs the event touched, the state says
    (``touched_jobs``). ``known`` are the jobs the shell still lists: a job the
    state machine no longer knows but the shell does was forgotten
    (``ForgetJob``), and its keys go. ``None`` for an event that changed
    nothing the store keeps (a heartbeat, a tick with no command).
    """
    touched = state.touched_jobs()
    if touched is None:
        return None
    puts: dict[str, object] = {}
    deletes: list[str] = []
    for jid in touched:
        progress = state.export_job_head(jid)
        finished = state.export_finished(jid) if progress is None else None
        if progress is not None:
            puts[job_key(jid, "progress")] = progress
            for task in state.take_changed_tasks(jid):
                puts[task_key(jid, task.id.stage, task.id.partition)] = task
        elif finished is not None:
            puts[job_key(jid, "outcome")] = finished
            deletes.append(job_key(jid, "progress"))
            # Once, at the end: a key for every task that may have one.
            deletes.extend(
                task_key(jid, stage.id, p)
                for stage in finished.view.stages
                for p in range(stage.num_tasks)
            )
        elif jid in known:  # forgotten (``ForgetJob``)
            # All of them: a job that ended in this event and was forgotten in it
            # (more jobs ended at once than the history keeps) still has its tasks'
            # keys, which no outcome's deletes took (the whole-cluster simulation,
            # seed 3600031: five jobs failed by one event, a restart then found
            # task keys without a plan and failed a job nobody had asked about).
            deletes.append(job_prefix(jid))
    puts[EXECUTORS_KEY] = state.export_executors()
    puts[REVIVALS_KEY] = state.export_revivals()
    puts[META_KEY] = StoredMeta(state.no_executor_since)
    return puts, deletes


class StateWriter:
    """Writes documents to the store, only those that changed, one commit per call.

    Every document is written whole. A call that changes more documents than one
    commit of the store may hold (etcd: 128 operations, 1.5 MiB) is written in
    several commits, each fenced: the jobs' documents first, then the deletes,
    the ``executors`` and ``meta`` documents last. A crash between them leaves
    job documents newer than the executors' (and keys that were to go: a
    finished job's ``progress`` beside its ``outcome``, which wins), which
    recovery handles:
    ``SchedulerRecovered`` checks every job's finished tasks against the
    executors it restored.

    Args:
        store: The store, acquired by this scheduler.
        held: What the store holds now (``store.load()``), so the first commit
            after a restart writes only differences too.
    """

    def __init__(self, store: StateStore, held: Mapping[str, str]) -> None:
        self.store = store
        self._held = dict(held)
        self._encoded: dict[str, tuple[object, str]] = {}
        """Key -> the last object put there and its text: an object given again
        (the state machine's cached executors snapshot) is not encoded again."""

    def commit(self, puts: Mapping[str, object], deletes: list[str] | tuple[str, ...] = ()) -> None:
        """Encode ``puts`` and write those that differ from the store, with ``deletes``
        (keys, or a prefix ending in ``/``: every key held under it, ``job_prefix``).

        Raises:
            StoreFencedError, StateStoreError: from the store; nothing was written.
        """
        deletes = [held for key in deletes for held in self._expand(key)]  # prefixes: keys held
        changed: dict[str, str] = {}
        for key, value in puts.items():
            last = self._encoded.get(key)
            snapshot = _is_snapshot(value)
            if last is not None and (last[0] is value or (snapshot and last[0] == value)):
                text = last[1]
            else:
                text = encode(value)
            if snapshot or key in _CACHED:
                self._encoded[key] = (value, text)
            if self._held.get(key) != text:
                changed[key] = text
        gone = [k for k in deletes if k in self._held and k not in puts]
        for key in deletes:
            if key not in puts:
                self._encoded.pop(key, None)  # a finished job's head: not kept for ever
        if not changed and not gone:
            return
        for chunk_puts, chunk_deletes in self._chunks(changed, gone):
            self.store.commit(chunk_puts, chunk_deletes)
            self._held.update(chunk_puts)
            for key in chunk_deletes:
                del self._held[key]

    def _expand(self, key: str) -> list[str]:
        """A key to delete, or those held under it where it ends in ``/``."""
        if not key.endswith("/"):
            return [key]
        return sorted(k for k in self._held if k.startswith(key))

    def _chunks(
        self, puts: dict[str, str], deletes: list[str]
    ) -> list[tuple[dict[str, str], list[str]]]:
        """``puts`` and ``deletes`` in commits the store takes; one when they fit."""
        max_ops, max_bytes = self.store.max_ops, self.store.max_bytes
        size = sum(len(k) + len(v) for k, v in puts.items()) + sum(len(k) for k in deletes)
        fits_ops = max_ops is None or len(puts) + len(deletes) <= max_ops
        if fits_ops and (max_bytes is None or size <= max_bytes):
            return [(puts, deletes)]
        last = (EXECUTORS_KEY, REVIVALS_KEY, META_KEY)  # scheduler-wide documents go last
        # Puts before deletes: a finishing job's ``outcome`` is written before its
        # ``progress`` and task keys go (a job of hundreds of tasks needs several
        # commits for them), so a crash between the commits leaves both, and the
        # outcome wins on restore, never a plan with neither (a job dropped).
        ops: list[tuple[str, str | None]] = [(k, v) for k, v in puts.items() if k not in last]
        ops += [(k, None) for k in deletes]
        ops += [(k, puts[k]) for k in last if k in puts]
        chunks: list[tuple[dict[str, str], list[str]]] = []
        current: tuple[dict[str, str], list[str]] = ({}, [])
        used = 0
        for key, value in ops:
            cost = len(key) + (len(value) if value is not None else 0)
            count = len(current[0]) + len(current[1])
            full = (max_ops is not None and count >= max_ops) or (
                max_bytes is not None and count > 0 and used + cost > max_bytes
            )
            if full:
                chunks.append(current)
                current, used = ({}, []), 0
            if value is None:
                current[1].append(key)
            else:
                current[0][key] = value
            used += cost
        if current[0] or current[1]:
            chunks.append(current)
        log.info("writing one state change in %d commits (store limits)", len(chunks))
        return chunks
