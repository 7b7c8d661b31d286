"""Executors declared lost that come back alive: whether they go on under their
id, and which of the outputs they left are still worth keeping.

Pure rules that ``SchedulerState`` applies; no clock, no I/O. A loss for
silence or a broken stream is a guess: a link that stayed down past the
heartbeat timeout, or a flapping one that held a keepalive ping of the command
stream unanswered, loses an executor whose process lived on with every shuffle
file it wrote. When it comes back it asks to resume its id (``ExecutorRegistered``
with ``resume``, ``held``: its files). Every such return is a **false loss**,
counted and logged (``HealthChange.CAME_BACK``) whatever is decided next::

    lost (CONNECTION_LOST, HEARTBEAT_TIMEOUT), outputs it held noted (``Left``)
      │ ExecutorRegistered(resume=its id, held)
      ▼
    revivable, and some output it holds ── no ──▶ registered anew under a fresh id
    still needed and not made again?              (its old life's files deleted)
      │ yes: ResumeExecutor; awaiting its stream, as after a scheduler restart
      ▼ ExecutorConnected
    ALIVE under its id; for each output it left (``restore``):
      task pending, files held ─────────────▶ Done on it again (no recompute)
      task recomputing, files held ─────────▶ Done on it again; the recompute cancelled
      task done elsewhere (recomputed first) ▶ nothing: its copy goes with the job's files
      files not held, job over or gone ──────▶ nothing (released as after a restart)

**Revivable**: lost for silence or a broken stream (a process that exited, a
drained executor or a holder its readers could not reach are not: the last
would come back as unreachable as it left), noted at its loss (``Left``; kept
in the store, ``StoredRevivals``, so an executor lost before a scheduler
restart comes back after it as well), and revived fewer than ``MAX_REVIVALS`` times:
a link that keeps dropping for longer than the timeout would otherwise cancel
the same recomputes again and again. Past that it registers anew, as before.
An executor that comes back when every job already did without it (the query
finished, or made its outputs again) registers anew too: its id would keep
nothing worth keeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from mangonel.ids import ExecutorId, JobId, TaskId
from mangonel.scheduler.events import LossReason
from mangonel.scheduler.state_jobs import JobRecord
from mangonel.scheduler.state_stages import Done, Pending, Running, TaskRecord

__all__ = [
    "MAX_REVIVALS",
    "REVIVABLE",
    "Left",
    "Restored",
    "Revivals",
    "StoredRevivals",
    "restore",
]

REVIVABLE = frozenset({LossReason.CONNECTION_LOST, LossReason.HEARTBEAT_TIMEOUT})
"""Losses that may have been wrong about the process: it may come back."""

MAX_REVIVALS = 3
"""Times one executor id may come back under itself; then it registers anew."""


@dataclass
class Left:
    """The outputs an executor held when it was lost, by job."""

    outputs: dict[JobId, list[tuple[TaskId, Done]]] = field(default_factory=dict)

    def merged(self, other: Left) -> Left:
        """These outputs and ``other``'s (one job's lists joined)."""
        out = Left({j: list(o) for j, o in self.outputs.items()})
        for job, outputs in other.outputs.items():
            out.outputs.setdefault(job, []).extend(outputs)
        return out

    def paths(self) -> frozenset[str]:
        """Every file of these outputs."""
        return frozenset(
            o.path for outputs in self.outputs.values() for _, d in outputs for o in d.outputs
        )

    @classmethod
    def of(cls, jobs: Iterable[JobRecord], executor: ExecutorId) -> Left:
        """What ``executor`` holds in ``jobs``, noted before its loss sends any of
        it back to pending."""
        left = cls()
        for job in jobs:
            held = [
                (t.id, t.state)
                for stage in job.stages.values()
                for t in stage.done_tasks_on(executor)
                if isinstance(t.state, Done)
            ]
            if held:
                left.outputs[job.id] = held
        return left


@dataclass(frozen=True)
class Restored:
    """What ``restore`` decided for one job."""

    done: list[tuple[TaskRecord, Done]]
    """Tasks to mark done on the executor again, with the state they had."""
    cancel: list[TaskRecord]
    """Of those, the ones whose recompute is running: cancel it first."""


@dataclass(frozen=True)
class StoredRevivals:
    """What the store keeps of ``Revivals`` (``scheduler.persist``): a restarted
    scheduler revives an executor lost before the restart as this life would."""

    left: dict[ExecutorId, Left] = field(default_factory=dict)
    returning: dict[ExecutorId, Left] = field(default_factory=dict)
    count: dict[ExecutorId, int] = field(default_factory=dict)
    charged: dict[ExecutorId, dict[JobId, list[TaskId]]] = field(default_factory=dict)


@dataclass
class Revivals:
    """The lost executors that may come back, and how often each has.

    Changed only through its methods, each of which drops the cached
    ``export``: most events change nothing here, and the shell writes the
    document only when it is a new one."""

    left: dict[ExecutorId, Left] = field(default_factory=dict)
    """Lost executors that may come back, with what they held."""
    returning: dict[ExecutorId, Left] = field(default_factory=dict)
    """Revived executors whose stream has not opened yet, with what they held."""
    count: dict[ExecutorId, int] = field(default_factory=dict)
    """Times each has been revived."""
    charged: dict[ExecutorId, dict[JobId, list[TaskId]]] = field(default_factory=dict)
    """Lost executors that may come back, with the tasks whose running attempt on
    each was charged at its loss (``Limits.max_task_attempts``): should it come
    back alive, revived or not, the loss was not those tasks' doing (``refunds``)."""
    _exported: StoredRevivals | None = field(default=None, repr=False, compare=False)

    def export(self) -> StoredRevivals:
        """What the store keeps, the same object until something changes."""
        if self._exported is None:
            self._exported = StoredRevivals(
                dict(self.left),
                dict(self.returning),
                dict(self.count),
                {e: {j: list(t) for j, t in by.items()} for e, by in self.charged.items()},
            )
        return self._exported

    @classmethod
    def restored(
        cls,
        stored: StoredRevivals,
        lost: Callable[[ExecutorId], bool],
        awaited: Callable[[ExecutorId], bool],
    ) -> Revivals:
        """The revivals a restarted scheduler goes on with: those of executors
        still ``lost`` in its registry, and the returning ones it ``awaited``
        (they reattach as every live executor does after a restart)."""
        known = {e for e in stored.count if lost(e) or awaited(e)}
        return cls(
            left={e: left for e, left in stored.left.items() if lost(e)},
            returning={e: left for e, left in stored.returning.items() if awaited(e)},
            count={e: n for e, n in stored.count.items() if e in known},
            charged={e: by for e, by in stored.charged.items() if lost(e)},
        )

    def arrived(self, executor: ExecutorId) -> Left | None:
        """A revived executor's stream opened: what it left, to give back."""
        left = self.returning.pop(executor, None)
        if left is not None:
            self._exported = None
        return left

    def charge(self, executor: ExecutorId, reason: LossReason, job: JobId, task: TaskId) -> None:
        """``task``'s attempt on ``executor``, lost for ``reason``, was charged."""
        if reason in REVIVABLE:
            self.charged.setdefault(executor, {}).setdefault(job, []).append(task)
            self._exported = None

    def refunds(self, executor: ExecutorId) -> dict[JobId, list[TaskId]]:
        """``executor`` came back alive: the charges its loss made, to take back."""
        self._exported = None
        return self.charged.pop(executor, {})

    def note(self, executor: ExecutorId, reason: LossReason, left: Left) -> None:
        """``executor`` is lost for ``reason``, holding ``left`` (a revived one
        whose stream never opened left what it left before)."""
        self._exported = None
        left = self.returning.pop(executor, None) or left
        if reason in REVIVABLE and self.count.get(executor, 0) < MAX_REVIVALS:
            self.left[executor] = left
        else:
            self.left.pop(executor, None)

    def take(self, executor: ExecutorId) -> bool:
        """Whether ``executor`` may come back under its id; if so, it is counted
        as one revival more and what it left waits for its stream
        (``returning``). ``False``: it registers anew."""
        left = self.left.pop(executor, None)
        if left is None:
            return False
        self._exported = None
        self.count[executor] = self.count.get(executor, 0) + 1
        self.returning[executor] = left
        return True

    def forget(self, known: Callable[[ExecutorId], bool]) -> None:
        """Keep only the executors still ``known`` (the registry's bounded history)."""
        for kept in (self.left, self.returning, self.count, self.charged):
            for executor in [e for e in kept if not known(e)]:
                del kept[executor]
                self._exported = None


def restore(
    jobs: Mapping[JobId, JobRecord], left: Left, held: frozenset[str], executor: ExecutorId
) -> dict[JobId, Restored]:
    """Which outputs ``executor``, back with the files ``held``, has again.

    An output counts again when every one of its files is held, its job still
    runs and may use the executor (``JobRecord.excluded``), and its task has not
    been made again meanwhile: it is pending, or a recompute of it runs (the
    recompute loses). One done elsewhere won: the executor's copy stays unread
    and goes with the job's files.
    """
    out: dict[JobId, Restored] = {}
    for job_id, outputs in left.outputs.items():
        job = jobs.get(job_id)
        if job is None or executor in job.excluded:
            continue
        done: list[tuple[TaskRecord, Done]] = []
        cancel: list[TaskRecord] = []
        for task_id, state in outputs:
            task = job.task(task_id)
            if task is None or not all(o.path in held for o in state.outputs):
                continue
            if isinstance(task.state, Pending):
                done.append((task, state))
            elif isinstance(task.state, Running) and task.state.attempt != state.attempt:
                done.append((task, state))
                cancel.append(task)
        if done:
            out[job_id] = Restored(done, cancel)
    return out
