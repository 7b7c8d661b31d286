"""A job's stages and their tasks inside the scheduler's state machine.

``StageRecord`` holds a stage's tasks (``TaskRecord``) with the indexes over
them (pending queue, counts by state, outputs held by each executor), kept by an
explicit call at each transition (``TaskRecord.move`` tells ``StageRecord.moved``)
and checked by ``validate``. ``state_jobs.JobRecord`` holds a job's stages;
nothing here emits commands.

A task's life; each state is its own type holding only that state's data, so a
running task always knows its executor and a done task always has outputs. A
running task may also have a speculative copy (``TaskRecord.speculative``) on
another executor: the first of the two to complete makes it Done, the other is
cancelled; when one of them fails or is lost, the other goes on alone::

              launch (slot free, stage's inputs whole)
    Pending ─────────────────────────────────────────▶ Running(attempt, executor)
      ▲  ▲                                                 │          │
      │  │ attempt failed, executor lost, fetch failed     │          │ TaskCompleted
      │  └─────────────────────────────────────────────────┘          ▼
      │                                               Done(attempt, executor, outputs)
      │         its executor was lost while the output is still needed  │
      └─────────────────────────────────────────────────────────────────┘

A stage's state is derived from its tasks and its inputs, never stored, so it
cannot disagree with them::

                  every upstream stage          every task
                  has its outputs whole         done
        WAITING ───────────────────▶ RUNNABLE ───────────▶ COMPLETE
           ▲                          │    ▲                   │
           │ an upstream output       │    │ one of its own    │
           │ was lost                 │    │ outputs was lost  │
           └──────────────────────────┘    └───────────────────┘

A COMPLETE stage whose upstream loses outputs stays COMPLETE: it no longer needs
them. A stage whose own output and inputs are both lost goes back to WAITING.

Why it is just over 600 lines: a task and the stage that indexes it change
together (every transition of one is a call on the other), so they stay in one file.
"""

from __future__ import annotations

import bisect
import enum
import heapq
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields

from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, TaskAttemptId, TaskId
from mangonel.plan.physical import Stage
from mangonel.scheduler.adaptive import ranges
from mangonel.scheduler.invariants import StateInvariantError
from mangonel.scheduler.state_views import StageView
from mangonel.task import (
    PartitionLocation,
)

# ------------------------------------------------------------------- task states


@dataclass(frozen=True)
class Pending:
    """Waiting for its stage's inputs and a free slot."""


@dataclass(frozen=True)
class Running:
    attempt: TaskAttemptId
    executor: ExecutorId
    started: float = field(default=0.0, compare=False)
    """When it was launched (what speculation measures); not part of its identity."""


@dataclass(frozen=True)
class Done:
    attempt: TaskAttemptId
    executor: ExecutorId
    outputs: tuple[PartitionLocation, ...]
    """Sorted by partition."""
    duration: float = field(default=0.0, compare=False)
    """Launch to report, as the scheduler saw it (what speculation compares with)."""


TaskState = Pending | Running | Done
PENDING = Pending()

LiveCheck = Callable[[ExecutorId], bool]
"""Whether an executor is alive or draining, i.e. still holds its output files."""


@dataclass
class TaskRecord:
    """One task (partition) of a stage, across all its attempts."""

    id: TaskId
    state: TaskState = PENDING
    attempts_launched: int = 0
    """Also the next attempt number: attempts count from 0 and are never reused."""
    failures: int = 0
    """Attempts that count against ``Limits.max_task_attempts``."""
    failed_on: tuple[ExecutorId, ...] = ()
    last_error: str = ""
    last_error_type: ErrorType = ErrorType.JOB_FAILED
    """What ``last_error`` is blamed on: the job's error type should the task use
    up its attempts (a store that did not answer, say)."""
    reruns: int = 0
    recomputes: int = 0
    speculative: Running | None = None
    """A copy of the running attempt on another executor (speculative execution);
    only while ``state`` is ``Running``. Whichever finishes first is kept, the
    other is cancelled. Dropped, not resumed, after a scheduler restart."""
    owner: StageRecord | None = field(default=None, repr=False, compare=False)
    """The stage that keeps count of its tasks; not stored."""

    # Transitions. A task's fields change only through these (the state machine
    # never assigns them): each tells the stage that keeps count what moved, by
    # an explicit call, and marks the task changed for the store.

    @classmethod
    def fresh(cls, task: TaskId) -> TaskRecord:
        """A new pending task, built without the dataclass's ``__init__`` (a job
        may have 100,000)."""
        rec = object.__new__(cls)
        rec.__dict__.update(_FRESH_TASK, id=task)
        return rec

    def move(self, state: TaskState) -> None:
        """Pending, Running or Done: the stage moves it between its counts."""
        if self.owner is not None:
            self.owner.moved(self, state)
        self.state = state

    def set_copy(self, copy: Running | None) -> None:
        """A speculative copy launched (``copy``), or dropped (``None``)."""
        if self.owner is not None:
            self.owner.copied(self, copy)
        self.speculative = copy

    def next_attempt(self) -> TaskAttemptId:
        """The next attempt's id; one more launched."""
        attempt = TaskAttemptId(self.id, self.attempts_launched)
        self.attempts_launched += 1
        if self.owner is not None:
            self.owner.counted(self, "attempts_launched")
        return attempt

    def recompute(self) -> None:
        """Its output was lost and is needed: back to pending, a recompute more."""
        self.move(PENDING)
        self.recomputes += 1
        if self.owner is not None:
            self.owner.counted(self, "recomputes")

    def restored(self, done: Done) -> None:
        """Its output, sent back to pending when its executor was lost or
        suspected, is there after all (``state_revival``): done as it was, and
        the recompute that sending back counted is taken back."""
        self.move(done)
        if self.recomputes > 0:
            self.recomputes -= 1
            if self.owner is not None:
                self.owner.counted(self, "recomputes", -1)

    def ended(
        self, executor: ExecutorId, error: str, error_type: ErrorType, *, charge: bool
    ) -> None:
        """An attempt on ``executor`` ended without output: a re-run more, its
        error kept; ``charge``: it counts against ``Limits.max_task_attempts``.
        (Where the task goes next is the caller's ``move``.)"""
        self.reruns += 1
        if self.owner is not None:
            self.owner.counted(self, "reruns")
        self.note_error(error, error_type)
        if charge:
            self.failures += 1
            if executor not in self.failed_on:
                self.failed_on = (*self.failed_on, executor)

    def refunded(self, executor: ExecutorId) -> None:
        """An attempt charged when ``executor`` was lost was not this task's doing:
        the executor came back alive (``state_revival``, a false loss). The charge
        is taken back, and the executor is one it may run on again."""
        if self.failures > 0:
            self.failures -= 1
        self.failed_on = tuple(e for e in self.failed_on if e != executor)
        if self.owner is not None:
            self.owner.changed.add(self.id)

    def note_error(self, error: str, error_type: ErrorType) -> None:
        """The last error, and what it is blamed on (the job's, should it be the last)."""
        self.last_error, self.last_error_type = error, error_type
        if self.owner is not None:
            self.owner.changed.add(self.id)

    def validate(self) -> None:
        """Check the ``task-attempts`` and ``task-outputs`` invariants
        (docs/architecture.md, "Invariants of the state")."""
        # Written for speed: the tests run it for every task after every event.
        failed_on, failures, launched = self.failed_on, self.failures, self.attempts_launched
        if (failed_on and (len(set(failed_on)) != len(failed_on) or len(failed_on) > failures)) or (
            not 0 <= failures <= launched
        ):
            raise StateInvariantError(
                "task-attempts",
                f"task {self.id} failed {failures} of {launched} attempts, on {failed_on}",
            )
        state, copy = self.state, self.speculative
        if copy is None and isinstance(state, Pending):
            return
        for run in (state, copy):
            if isinstance(run, Running | Done) and (
                (run.attempt.task is not self.id and run.attempt.task != self.id)
                or not 0 <= run.attempt.attempt < launched
            ):
                raise StateInvariantError(
                    "task-attempts", f"task {self.id} holds attempt {run.attempt} of {launched}"
                )
        if copy is not None and (not isinstance(state, Running) or copy.executor == state.executor):
            raise StateInvariantError(
                "task-attempts", f"task {self.id} has a copy {copy} beside {state}"
            )
        if isinstance(state, Done):
            executor, stage, partition = state.executor, self.id.stage, self.id.partition
            last = -1
            for o in state.outputs:
                if (
                    o.executor != executor
                    or o.stage != stage
                    or o.map_partition != partition
                    or o.partition < last
                ):
                    raise StateInvariantError(
                        "task-outputs", f"task {self.id} done on {executor}: {state.outputs}"
                    )
                last = o.partition


_FRESH_TASK = {
    f.name: f.default_factory() if f.default_factory is not MISSING else f.default
    for f in fields(TaskRecord)
    if f.name != "id"
}


class StageState(enum.Enum):
    WAITING = "waiting"
    RUNNABLE = "runnable"
    COMPLETE = "complete"


def _valid_bounds(bounds: tuple[int, ...], partitions: int) -> bool:
    """Whether ``bounds`` are first partitions of ranges over ``partitions``:
    from 0, strictly increasing, each below ``partitions`` (empty: as planned)."""
    if not bounds:
        return True
    return bounds[0] == 0 and list(bounds) == sorted(set(bounds)) and bounds[-1] < partitions


class Held:
    """The finished outputs of one stage on one executor: which partitions, and
    their rows and bytes (what its loss takes off the stage's, at once)."""

    __slots__ = ("partitions", "rows", "bytes")

    def __init__(self) -> None:
        self.partitions: set[int] = set()
        self.rows = 0
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.partitions)

    def __iter__(self) -> Iterator[int]:
        return iter(self.partitions)


@dataclass
class StageRecord:
    """A stage of an unfinished job: its tasks, and counts kept as they change.

    Every task transition tells it (``moved``, ``copied``, ``counted``: explicit
    calls from ``TaskRecord``'s transitions), and it keeps the counts, the
    pending queue, where done outputs are and the sorted durations, so that the
    questions an event asks (is the stage complete, which task goes next, which
    outputs an executor held, the stage's view) cost what the event changed, not
    the stage's size.
    """

    stage: Stage
    tasks: list[TaskRecord]
    reruns: int = 0
    """Times some of its finished outputs were lost and had to be made again."""
    speculated: int = 0
    """Copies of straggling attempts launched (kept in memory only)."""
    speculation_won: int = 0
    """Copies that finished first: their output was kept, the original cancelled."""
    speculation_lost: int = 0
    """Copies cancelled because the original finished first."""
    changed: set[TaskId] = field(default_factory=set, repr=False)
    """Tasks changed since the store was last given them (the job's set)."""
    bounds: tuple[int, ...] = ()
    """Adaptive execution coalesced the stage: task *j* reads the partitions from
    ``bounds[j]`` up to the next bound (the last up to ``stage.num_tasks``) of
    every partitioned input. Empty: task *i* reads partition *i*, as planned."""
    adaptable: bool = field(default=False, repr=False)
    """It may still be coalesced: ``coalescible`` and not decided yet (memory
    only: after a restart a stage that never launched is decided again)."""

    def __post_init__(self) -> None:
        self._ranges: list[range] = ranges(self.bounds, self.stage.num_tasks)
        self.adopt(self.tasks)

    def coalesce(self, job: JobId, bounds: tuple[int, ...]) -> None:
        """Run as ``len(bounds)`` tasks, each reading a range of partitions.

        Only before any task of the stage launched: its tasks are replaced by
        fresh pending ones (none of them has a key in the store yet).
        """
        if self.totals["attempts_launched"]:
            raise ValueError(f"stage {self.stage.id} already launched tasks")
        n = self.stage.num_tasks
        if not bounds or not _valid_bounds(bounds, n):
            raise ValueError(f"bad partition ranges {bounds} for stage {self.stage.id}")
        self.bounds = bounds
        self._ranges = ranges(bounds, n)
        self.adaptable = False
        self.adopt([TaskRecord.fresh(TaskId(job, self.stage.id, j)) for j in range(len(bounds))])

    def partitions_of(self, task: int) -> range:
        """The partitions of its partitioned inputs that task ``task`` reads."""
        return self._ranges[task] if self._ranges else range(task, task + 1)

    def adopt(self, tasks: list[TaskRecord]) -> None:
        """Take ``tasks`` as this stage's (created, or read back from the store)
        and count them afresh."""
        self.tasks = tasks
        self._pending: set[int] = set()
        """Pending partitions."""
        self._queue: list[int] = []
        """A heap of partitions, each at most once (``_queued``): every pending one,
        and ones that left pending since (dropped as they surface). A heap,
        not a sorted list: an executor's loss sends thousands back at once."""
        self._queued: set[int] = set()
        self.running: set[int] = set()
        """Running partitions."""
        self.done_on: dict[ExecutorId, Held] = {}
        """Executor -> the outputs it holds (never empty)."""
        self.done = 0
        self.durations: list[float] = []
        """How long its tasks took, sorted: every attempt that finished with its
        output. An output lost later keeps its duration: it still says how long
        the stage's tasks take (speculation's median), and taking it out moved
        the rest of the sorted list, for each of the thousands a loss may take."""
        self.totals = {"attempts_launched": 0, "reruns": 0, "recomputes": 0}
        self.speculative_running = 0
        self.rows = 0
        self.bytes = 0
        for task in tasks:
            state = task.state
            if isinstance(state, Done):
                self._enter(task.id.partition, state)
            elif isinstance(state, Running):
                self.running.add(task.id.partition)
            for name in self.totals:
                self.totals[name] += getattr(task, name)
            self.speculative_running += task.speculative is not None
            task.owner = self
        # A sorted list is a heap: built at once, not one push a task.
        self._queue = sorted(t.id.partition for t in tasks if isinstance(t.state, Pending))
        self._pending = set(self._queue)
        self._queued = set(self._queue)

    def moved(self, task: TaskRecord, state: TaskState) -> None:
        """``task``'s state is about to become ``state`` (``TaskRecord.move``)."""
        self.changed.add(task.id)
        partition = task.id.partition
        self._leave(partition, task.state)
        self._enter(partition, state)

    def copied(self, task: TaskRecord, copy: Running | None) -> None:
        """``task``'s speculative copy is about to become ``copy``."""
        self.changed.add(task.id)
        self.speculative_running += (copy is not None) - (task.speculative is not None)

    def counted(self, task: TaskRecord, total: str, by: int = 1) -> None:
        """``task``'s count ``total`` (a key of ``totals``) went up by ``by``."""
        self.changed.add(task.id)
        self.totals[total] += by

    def _enter(self, partition: int, state: TaskState) -> None:
        if isinstance(state, Pending):
            self._pending.add(partition)
            if partition not in self._queued:
                self._queued.add(partition)
                heapq.heappush(self._queue, partition)
        elif isinstance(state, Running):
            self.running.add(partition)
        else:
            held = self.done_on.get(state.executor)
            if held is None:
                held = self.done_on[state.executor] = Held()
            held.partitions.add(partition)
            self.done += 1
            bisect.insort(self.durations, state.duration)
            rows = bytes_ = 0
            for o in state.outputs:
                rows += o.rows
                bytes_ += o.bytes
            held.rows += rows
            held.bytes += bytes_
            self.rows += rows
            self.bytes += bytes_

    def _leave(self, partition: int, state: TaskState) -> None:
        if isinstance(state, Pending):
            self._pending.discard(partition)
        elif isinstance(state, Running):
            self.running.discard(partition)
        else:
            held = self.done_on[state.executor]
            held.partitions.discard(partition)
            if not held.partitions:
                del self.done_on[state.executor]
            self.done -= 1
            rows = bytes_ = 0
            for o in state.outputs:
                rows += o.rows
                bytes_ += o.bytes
            held.rows -= rows
            held.bytes -= bytes_
            self.rows -= rows
            self.bytes -= bytes_

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def validate(self, job: JobId) -> None:
        """Count the tasks afresh and compare with what the transitions kept: the
        ``stage-tasks`` and ``stage-counts`` invariants (docs/architecture.md,
        "Invariants of the state"), and each task's own (``TaskRecord.validate``)."""
        where = f"stage {self.stage.id} of job {job}"
        planned = self.stage.num_tasks
        if (
            len(self.tasks) != (len(self.bounds) if self.bounds else planned)
            or not _valid_bounds(self.bounds, planned)
            or self._ranges != ranges(self.bounds, planned)
            or (self.adaptable and (self.bounds or self.totals["attempts_launched"]))
        ):
            raise StateInvariantError(
                "stage-tasks",
                f"{where}: {len(self.tasks)} tasks of {planned} planned, bounds "
                f"{self.bounds}, adaptable {self.adaptable}",
            )
        pending: set[int] = set()
        running: set[int] = set()
        done_on: dict[ExecutorId, tuple[set[int], int, int]] = {}
        durations: Counter[float] = Counter()
        launched = reruns = recomputes = copies = 0
        sid = self.stage.id
        for p, task in enumerate(self.tasks):
            tid = task.id
            if tid.partition != p or tid.stage != sid or tid.job != job or task.owner is not self:
                raise StateInvariantError(
                    "stage-tasks", f"{where}: its task {p} is {tid}, or counted elsewhere"
                )
            task.validate()
            state = task.state
            if isinstance(state, Pending):
                pending.add(p)
            elif isinstance(state, Running):
                running.add(p)
            else:
                parts, rows, bytes_ = done_on.get(state.executor, (set(), 0, 0))
                parts.add(p)
                for o in state.outputs:
                    rows += o.rows
                    bytes_ += o.bytes
                done_on[state.executor] = (parts, rows, bytes_)
                durations[state.duration] += 1
            launched += task.attempts_launched
            reruns += task.reruns
            recomputes += task.recomputes
            copies += task.speculative is not None
        totals = {"attempts_launched": launched, "reruns": reruns, "recomputes": recomputes}
        kept = {e: (h.partitions, h.rows, h.bytes) for e, h in self.done_on.items()}
        queue = self._queue
        for what, mine, fresh in (
            ("pending", self._pending, pending),
            ("running", self.running, running),
            ("done_on", kept, done_on),
            ("done", self.done, sum(len(parts) for parts, _, _ in done_on.values())),
            ("rows, bytes", (self.rows, self.bytes),
             (sum(r for _, r, _ in done_on.values()), sum(b for _, _, b in done_on.values()))),
            ("totals", self.totals, totals),
            ("speculative_running", self.speculative_running, copies),
            # Partitions that left pending may wait in the queue until they surface.
            ("queue", (set(queue), len(queue), pending <= self._queued),
             (self._queued, len(self._queued), True)),
            ("queue order", _is_heap(queue), True),
            # An output lost keeps its run time (see ``durations``).
            ("durations", (self.durations == sorted(self.durations),
                           not durations - Counter(self.durations)), (True, True)),
            ("speculation counts",
             self.speculated >= self.speculation_won + self.speculation_lost + copies, True),
        ):  # fmt: skip
            if mine != fresh:
                raise StateInvariantError(
                    "stage-counts", f"{where}: {what} is {mine!r}, its tasks say {fresh!r}"
                )

    def pending_tasks(self) -> Iterator[TaskRecord]:
        """Pending tasks in partition order, each as it is reached: the caller
        may launch (or leave) each one it is given before asking for the next,
        and may stop at any point (the tasks it left stay queued). One
        iteration of a stage at a time: the tasks one leaves are set aside
        until it ends (or is dropped), so a second one running meanwhile
        would not see them."""
        queue, queued, left = self._queue, self._queued, []
        try:
            while queue:
                partition = queue[0]
                if partition not in self._pending:
                    heapq.heappop(queue)  # launched since it was queued
                    queued.discard(partition)
                    continue
                yield self.tasks[partition]
                if queue and queue[0] == partition and partition in self._pending:
                    left.append(heapq.heappop(queue))  # not launched: set aside
        finally:
            for partition in left:
                heapq.heappush(queue, partition)

    def running_tasks(self) -> list[TaskRecord]:
        """Running tasks, in partition order."""
        return [self.tasks[p] for p in sorted(self.running)]

    def send_back(self, executor: ExecutorId) -> list[TaskRecord]:
        """Every done task whose output ``executor`` held back to pending, each
        a recompute more; returns them in partition order.

        What ``TaskRecord.recompute`` task by task would do, in one pass: a
        lost executor may hold thousands of a stage's outputs.
        """
        held = self.done_on.pop(executor, None)
        if held is None:
            return []
        partitions = sorted(held.partitions)
        tasks = [self.tasks[p] for p in partitions]
        self.rows -= held.rows
        self.bytes -= held.bytes
        for task in tasks:
            task.state = PENDING
            task.recomputes += 1
            self.changed.add(task.id)
        self.done -= len(tasks)
        self.totals["recomputes"] += len(tasks)
        self._pending.update(partitions)
        fresh = [p for p in partitions if p not in self._queued]
        self._queued.update(fresh)
        queue = self._queue
        if len(fresh) * 16 < len(queue):
            # A few into a long queue (most of a big stage still pending):
            # pushing each costs less than ordering the whole queue again.
            for partition in fresh:
                heapq.heappush(queue, partition)
        else:
            queue.extend(fresh)
            heapq.heapify(queue)
        return tasks

    def done_tasks_on(self, executor: ExecutorId) -> list[TaskRecord]:
        """Done tasks whose output ``executor`` holds, in partition order."""
        return [self.tasks[p] for p in sorted(self.done_on.get(executor, ()))]

    def median_duration(self) -> float:
        """Of the done tasks (at least one must be)."""
        d, n = self.durations, len(self.durations)
        return d[n // 2] if n % 2 else (d[n // 2 - 1] + d[n // 2]) / 2

    @property
    def complete(self) -> bool:
        return self.done == len(self.tasks)

    def view(self) -> StageView:
        return StageView(
            id=self.stage.id,
            label=self.stage.label,
            num_tasks=len(self.tasks),
            planned_tasks=self.stage.num_tasks if self.bounds else None,
            done=self.done,
            running=len(self.running),
            pending=len(self._pending),
            attempts_launched=self.totals["attempts_launched"],
            tasks_rerun=self.totals["reruns"],
            outputs_recomputed=self.totals["recomputes"],
            rows=self.rows,
            bytes=self.bytes,
            speculative_running=self.speculative_running,
            speculated=self.speculated,
            speculation_won=self.speculation_won,
            speculation_lost=self.speculation_lost,
        )


def _is_heap(items: list[int]) -> bool:
    return all(items[(i - 1) // 2] <= items[i] for i in range(1, len(items)))
