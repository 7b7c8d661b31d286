"""The executor's pure state machine: its lives and their tasks.

``ExecutorMachine`` holds everything the executor decides about and changes only
through ``handle(event) -> list[Action]``, like the scheduler's
``SchedulerState``. No threads, sockets, files, DuckDB or clock: the I/O shell
(``executor.service``) feeds it events under its lock and carries out the
actions, in order. Events (past tense) and actions (imperative) are defined in
``executor.events``; both name the life (``executor``) and, for a task, the
attempt.

>>> from mangonel.ids import ExecutorId
>>> state = ExecutorMachine()
>>> state.handle(ServiceStarted())
[Register(resume=None)]
>>> state.handle(Registered(ExecutorId("e1"), resumed=False))
[ClaimHome(executor='e1')]

**Lives.** Each registration with the scheduler begins a *life*: an executor
id, a locked directory ``<work root>/<id>/`` for its shuffle files (its
*home*), and the tasks the scheduler gave it::

    Register(resume=None)
      │ Registered(new id)
      ▼
    CLAIMING ──HomeClaimFailed──▶ forgotten (it has no files); Wait, Register(resume=None)
      │ HomeClaimed
      ▼
    CONNECTING ◀──── Registered(resumed, same id): same id, same files, new stream ◀─┐
      │ Connected                   ConnectFailed                                     │
      ▼                                  │                                            │
    SERVING ──StreamEnded────────────▶ DETACHED ──Wait, Register(resume=its id)───────┘
      │       (its tasks cancelled)      │
      │                                  │ Registered(another id): it was counted as
      │                                  │ lost; the new id begins a life at CLAIMING
      │ StreamEnded while draining       ▼
      └────────────────────────────▶ ENDING ──its last task stopped (or none)──▶ DeleteLifeDir
         Exit: a drained executor
         never registers again

A stop (``StopRequested``) cancels every task and ends the stream; the life
stays DETACHED, the service exits, and ``SlotsClosed`` deletes every life left.

**Tasks.** Each task attempt has one state, held by its life::

    TaskLaunched ─▶ Queued ──SlotTaken──▶ Running(slot) ──TaskFinished──▶ reported
                      │                      │
          CancelRequested,        CancelRequested, StreamEnded,
          StreamEnded,            StopRequested: InterruptTask
          StopRequested              │
                      ▼              ▼
              CancelledQueued   CancelledRunning(slot) ──TaskFinished──▶ reported,
                      │                                 unless it stopped for the cancel
                      │ SlotTaken: never started
                      ▼
                   forgotten

The decisions, each in one place:

* a cancel hits the task where it is: a queued one never starts, a running one
  is interrupted (``InterruptTask``); a cancel of an unknown attempt does nothing.
* a finished attempt is reported under the life it ran in, even when it was
  cancelled or its life has ended since: the scheduler alone knows whether the
  attempt still counts and drops stale reports (``SchedulerState._current``).
  Only an attempt that stopped because it was cancelled reports nothing.
* files of a stage released while one of its attempts ran (or before it was
  launched) are deleted again when that attempt ends (``DeleteOutputs``): they
  were committed after the release, and nobody else would delete them.
* when the stream ends, every task of the life is cancelled: the scheduler
  runs them again whatever happened (it counted the life as lost, or it
  restarted). The life then asks to be resumed; a refused life ends, and its
  home is deleted once its last task stopped (a frozen-then-thawed executor
  must not leak its first life's files).
* the stream moves, the life goes on: when the link to the scheduler comes
  back after failed heartbeats (``LinkRecovered``), a serving life opens a new
  stream on a new connection (``MoveStream``), saying which attempts it holds
  and which it finished lately (the last ``REMEMBER_FINISHED``); the scheduler
  sends again what the old stream may have held, and a launch of an attempt the
  life holds or finished lately is ignored, so it runs once.
* draining: the scheduler is told (``TellDrain``) while a stream is up;
  otherwise, or when it cannot be told, the executor stops at once (nobody
  counts on it). A drained life ends when its stream ends, and the service
  exits instead of registering again.
* back-off between failed registrations grows from ``BACKOFF_START_S`` to
  ``BACKOFF_MAX_S`` and starts again once an order arrives.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

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
    TellDrain,
    Wait,
    WaitEnded,
)
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId

BACKOFF_START_S = 0.1
BACKOFF_MAX_S = 1.0
"""A restarted scheduler waits for its executors to reattach: try often."""

_REMEMBER_RELEASED_JOBS = 1000
"""Released jobs remembered per life, for attempts that end after the release."""

REMEMBER_FINISHED = 1000
"""Finished attempts remembered per life: a launch of one sent again (after the
stream moved, ``MoveStream``) is ignored, and the scheduler is told of them
(their reports may still be on their way)."""


# ---------------------------------------------------------------------- states


class LifeState(enum.Enum):
    CLAIMING = "claiming"
    CONNECTING = "connecting"
    SERVING = "serving"
    DETACHED = "detached"
    ENDING = "ending"


@dataclass(frozen=True)
class Queued:
    """Launched, waiting for a free slot."""


@dataclass(frozen=True)
class Running:
    slot: int


@dataclass(frozen=True)
class CancelledQueued:
    """Cancelled before it had a slot: it never starts."""


@dataclass(frozen=True)
class CancelledRunning:
    """Interrupted on ``slot``; waiting for it to stop."""

    slot: int


TaskState = Queued | Running | CancelledQueued | CancelledRunning


@dataclass
class _Life:
    executor: ExecutorId
    state: LifeState
    tasks: dict[TaskAttemptId, TaskState] = field(default_factory=dict)
    released: OrderedDict[JobId, frozenset[StageId] | None] = field(default_factory=OrderedDict)
    """Stages whose files were released (``None``: the whole job)."""
    finished: OrderedDict[TaskAttemptId, None] = field(default_factory=OrderedDict)
    """Its attempts that finished lately, oldest first (``REMEMBER_FINISHED``)."""

    def was_released(self, job: JobId, stage: StageId) -> bool:
        if job not in self.released:
            return False
        stages = self.released[job]
        return stages is None or stage in stages


class ExecutorMachine:
    """Every life of this executor process and the tasks each one holds."""

    def __init__(self) -> None:
        self._lives: dict[ExecutorId, _Life] = {}
        """Lives whose home still exists (or is being claimed)."""
        self._current: _Life | None = None
        """The life registered last and not ended: CLAIMING to DETACHED."""
        self._draining = False
        self._stopping = False
        self._backoff = BACKOFF_START_S

    # ------------------------------------------------------------------ views

    @property
    def serving(self) -> ExecutorId | None:
        """The life whose stream is up, if any."""
        life = self._current
        return life.executor if life is not None and life.state is LifeState.SERVING else None

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def running_tasks(self) -> int:
        """Attempts on a slot, cancelled or not."""
        return sum(
            isinstance(t, Running | CancelledRunning)
            for life in self._lives.values()
            for t in life.tasks.values()
        )

    def life_state(self, executor: ExecutorId) -> LifeState | None:
        life = self._lives.get(executor)
        return life.state if life is not None else None

    def task_state(self, attempt: TaskAttemptId) -> TaskState | None:
        found = self._find(attempt)
        return found[1] if found is not None else None

    # ------------------------------------------------------------ entry point

    def handle(self, event: Event) -> list[Action]:
        """Apply one event; return the actions the shell must carry out, in order."""
        out: list[Action] = []
        match event:
            case ServiceStarted():
                out.append(Register(None))
            case Registered():
                self._registered(event, out)
            case RegistrationFailed():
                self._retry_later(out)
            case HomeClaimed():
                life = self._life_in(event.executor, LifeState.CLAIMING)
                if life is not None:
                    life.state = LifeState.CONNECTING
                    out.append(Connect(life.executor))
            case HomeClaimFailed():
                life = self._life_in(event.executor, LifeState.CLAIMING)
                if life is not None:
                    del self._lives[life.executor]
                    self._current = None
                self._retry_later(out)
            case Connected():
                life = self._life_in(event.executor, LifeState.CONNECTING)
                if life is not None:
                    life.state = LifeState.SERVING
                    if self._stopping:  # stopped while connecting
                        out.append(CancelStream(life.executor))
            case ConnectFailed():
                life = self._life_in(event.executor, LifeState.CONNECTING)
                if life is not None:
                    life.state = LifeState.DETACHED
                self._retry_later(out)
            case StreamEnded():
                self._stream_ended(event, out)
            case WaitEnded():
                if self._stopping or self._draining:
                    out.append(Exit())
                else:
                    life = self._current
                    out.append(Register(life.executor if life is not None else None))
            case TaskLaunched():
                self._launched(event, out)
            case CancelRequested():
                self._backoff = BACKOFF_START_S
                self._cancel(event.attempt, out)
            case OutputsReleased():
                self._released(event, out)
            case SlotTaken():
                self._slot_taken(event, out)
            case TaskFinished():
                self._finished(event, out)
            case DrainRequested():
                self._draining = True
                serving = self.serving
                out.append(TellDrain(serving) if serving is not None else Stop())
            case DrainUndelivered():
                out.append(Stop())
            case StopRequested():
                self._stopping = True
                for life in self._lives.values():
                    for attempt in list(life.tasks):
                        self._cancel(attempt, out)
                if self.serving is not None:
                    out.append(CancelStream(self.serving))
            case HeartbeatRefused():
                if self.serving == event.executor:
                    out.append(CancelStream(event.executor))
            case LinkRecovered():
                life = self._life_in(event.executor, LifeState.SERVING)
                if life is not None and not self._stopping:
                    holding = frozenset(
                        a for a, t in life.tasks.items() if isinstance(t, Queued | Running)
                    )
                    out.append(MoveStream(life.executor, holding, frozenset(life.finished)))
            case SlotsClosed():
                for executor in self._lives:
                    out.append(DeleteLifeDir(executor))
                self._lives.clear()
                self._current = None
            case _:
                raise TypeError(f"not an executor event: {event!r}")
        return out

    # ------------------------------------------------------------------ lives

    def _registered(self, event: Registered, out: list[Action]) -> None:
        old = self._current
        if old is not None and old.state is LifeState.DETACHED:
            if event.resumed and event.executor == old.executor:
                old.state = LifeState.CONNECTING
                out.append(Connect(old.executor))
                return
            self._end(old, out)
        if event.executor in self._lives:
            # Scheduler ids are never reused; a clash would hand this life the
            # files of an ended one. Give the id up and register anew.
            self._current = None
            self._retry_later(out)
            return
        life = _Life(event.executor, LifeState.CLAIMING)
        self._lives[life.executor] = life
        self._current = life
        out.append(ClaimHome(life.executor))

    def _stream_ended(self, event: StreamEnded, out: list[Action]) -> None:
        life = self._life_in(event.executor, LifeState.SERVING)
        if life is None:
            return
        # Whatever happened (this life was counted as lost, or the scheduler
        # went away), the scheduler runs these tasks again.
        for attempt in list(life.tasks):
            self._cancel(attempt, out)
        life.state = LifeState.DETACHED
        if self._draining:
            # The scheduler closed the stream of a drained executor: let go.
            self._end(life, out)
            out.append(Exit())
        elif self._stopping:
            out.append(Exit())  # its home goes with SlotsClosed
        else:
            self._wait(out)

    def _end(self, life: _Life, out: list[Action]) -> None:
        """The life is over: its home goes once no task of it is left."""
        if self._current is life:
            self._current = None
        life.state = LifeState.ENDING
        self._retire_if_idle(life, out)

    def _retire_if_idle(self, life: _Life, out: list[Action]) -> None:
        if life.state is LifeState.ENDING and not life.tasks:
            del self._lives[life.executor]
            out.append(DeleteLifeDir(life.executor))

    def _retry_later(self, out: list[Action]) -> None:
        if self._stopping or self._draining:
            out.append(Exit())
        else:
            self._wait(out)

    def _wait(self, out: list[Action]) -> None:
        out.append(Wait(self._backoff))
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    # ------------------------------------------------------------------ tasks

    def _launched(self, event: TaskLaunched, out: list[Action]) -> None:
        self._backoff = BACKOFF_START_S
        life = self._life_in(event.executor, LifeState.SERVING)
        # Attempt numbers are never reused, so a known attempt is a duplicate
        # (sent again after the stream moved, ``MoveStream``): it runs once.
        attempt = event.spec.attempt
        if life is None or attempt in life.finished or self._find(attempt) is not None:
            return
        life.tasks[event.spec.attempt] = Queued()
        out.append(QueueTask(life.executor, event.spec))

    def _cancel(self, attempt: TaskAttemptId, out: list[Action]) -> None:
        found = self._find(attempt)
        if found is None:
            return
        life, task = found
        match task:
            case Queued():
                life.tasks[attempt] = CancelledQueued()
            case Running(slot):
                life.tasks[attempt] = CancelledRunning(slot)
                out.append(InterruptTask(life.executor, attempt, slot))
            case _:
                pass  # cancelled already

    def _released(self, event: OutputsReleased, out: list[Action]) -> None:
        self._backoff = BACKOFF_START_S
        life = self._lives.get(event.executor)
        if life is None:
            return
        # Remembered before the files go: an attempt of these stages that ends
        # after this event has its late files deleted too (``_finished``).
        before = life.released.pop(event.job, frozenset())
        if event.stages is None or before is None:
            life.released[event.job] = None
        else:
            life.released[event.job] = before | frozenset(event.stages)
        while len(life.released) > _REMEMBER_RELEASED_JOBS:
            life.released.popitem(last=False)
        out.append(DeleteOutputs(life.executor, event.job, event.stages))

    def _slot_taken(self, event: SlotTaken, out: list[Action]) -> None:
        found = self._find(event.attempt)
        if found is None:
            return
        life, task = found
        match task:
            case Queued():
                life.tasks[event.attempt] = Running(event.slot)
                out.append(StartTask(life.executor, event.attempt, event.slot))
            case CancelledQueued():
                del life.tasks[event.attempt]  # cancelled before it started
                self._retire_if_idle(life, out)
            case _:
                pass  # on a slot already

    def _finished(self, event: TaskFinished, out: list[Action]) -> None:
        found = self._find(event.attempt)
        if found is None:
            return
        life, task = found
        if not isinstance(task, Running | CancelledRunning):
            return
        del life.tasks[event.attempt]
        life.finished[event.attempt] = None
        while len(life.finished) > REMEMBER_FINISHED:
            life.finished.popitem(last=False)
        executor = life.executor
        match event.outcome:
            case Completed(outputs):
                out.append(
                    ReportCompleted(
                        executor, event.attempt, outputs, event.elapsed_s, event.timings
                    )
                )
            case Failed(failure):
                out.append(
                    ReportFailed(executor, event.attempt, failure, event.elapsed_s, event.timings)
                )
            case Stopped():
                pass
        task_id = event.attempt.task
        if life.was_released(task_id.job, task_id.stage):
            # Released while this attempt ran (its job ended): what it wrote
            # after the release is deleted here, or nobody would.
            out.append(DeleteOutputs(executor, task_id.job, (task_id.stage,)))
        self._retire_if_idle(life, out)

    # ---------------------------------------------------------------- helpers

    def _life_in(self, executor: ExecutorId, state: LifeState) -> _Life | None:
        life = self._lives.get(executor)
        return life if life is not None and life.state is state else None

    def _find(self, attempt: TaskAttemptId) -> tuple[_Life, TaskState] | None:
        for life in self._lives.values():
            task = life.tasks.get(attempt)
            if task is not None:
                return life, task
        return None


__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_START_S",
    "REMEMBER_FINISHED",
    "ExecutorMachine",
    "LifeState",
    "TaskState",
]
