"""The executor registry inside the scheduler's state machine.

Over 600 lines because it is one thing, the registry and its one record type:
which executors exist, their states, slots, health and suspicions, with the
indexes (free slots, live ids) kept beside them and checked by ``validate``.

Owns which executors exist, their liveness and their slots. It makes no
decisions about tasks: ``SchedulerState`` asks it who is free and tells it what
runs where. Pure data, no clock: every time arrives as an argument.

An executor's life, the only one the scheduler keeps (an id is never reused:
a restarted process registers anew, under a fresh id)::

      ExecutorRegistered
              │
              ▼
         CONNECTING ── no stream within Limits.connect_timeout_s (Tick) ──┐
              │                                                           │
              │ ExecutorConnected                                         │
              ▼                                                           ▼
            ALIVE ──── ExecutorDraining ────▶ DRAINING ─── nothing to ──▶ LOST
              │                                  │         run, hold or
              │ ExecutorLost, heartbeat timeout, │         serve (unread
              │ fetches from it failed on two    │         results read)
              │ executors                        │
              ▼                                  ▼
            LOST ◀───────────────────────────────┘ (its stream closed: DRAINED)

After a scheduler restart, every ALIVE or DRAINING executor of the stored
state is *awaiting* (``ExecutorRecord.awaiting``): it keeps its state and its
outputs count as held, but it takes no task until it reattaches: an
``ExecutorRegistered`` asking to ``resume`` its id is accepted (``resuming``
holds what it offered) and the ``ExecutorConnected`` that follows reattaches
it. One that does not reattach times out like a silent executor.

An ALIVE executor may also be *excluded* (``ExecutorRecord.excluded_until``):
tasks failed on it for execution reasons too often (see
``SchedulerState._count_failure``), so it gets no new task until a ``Tick``
finds the exclusion over. It keeps running its attempts, serving its outputs
and heartbeating: it is not lost. Exclusions live in memory only; a restarted
scheduler starts with none.

An ALIVE or DRAINING executor may be *suspected* (``suspected_since``: its
silence is improbable, says the phi accrual detector) or *quarantined*
(``quarantined_until``: suspected again and again, a flapping link); either way
it gets no new task, and stays alive. ``state_liveness`` owns those rules, and
the registry's ``isolated_since`` (most executors suspected at once: the
scheduler takes itself for cut off).

An ALIVE executor may also be *marked behind a slow link* (``ExecutorRecord.link``,
``state_link_marks``): its readers get a small share of the others' rate
from it, so no job places a new task on it until its back-off ends; then it
is on trial (it takes tasks again, and the rates of its next fetches decide).
It keeps its running attempts and serves its outputs. The marks hold only
while some other executor takes tasks (``marks_hold``): never does a mark
leave no executor to run work. In memory only, like exclusions.

LOST is final, but for one way back: an executor lost for silence or a broken
stream that comes back alive may be revived (``revive``: ALIVE again, awaiting
its stream, as after a restart), when ``state_revival`` finds it worth its id.
Lost executors are kept in a bounded history for the status
views only; the registry forgets the oldest, and a forgotten id reads as unknown,
which is treated the same way as lost (its reports are ignored).
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from mangonel.ids import ExecutorId, JobId, TaskAttemptId, TaskId
from mangonel.scheduler.detector import ArrivalWindow
from mangonel.scheduler.events import LossReason
from mangonel.scheduler.invariants import StateInvariantError
from mangonel.scheduler.state_views import ExecutorState, ExecutorView
from mangonel.task import ExecutorInfo

FAILED_GAP_BEATS = 4
"""A silence of at least this many heartbeat intervals that ended with a
heartbeat saying some of the executor's own heartbeats failed is a gap
(``ExecutorRegistry.heard_from``): a link that went down, however briefly."""


@dataclass(frozen=True)
class Resume:
    """What an awaiting executor offered when it asked to resume its id."""

    info: ExecutorInfo
    held: frozenset[str]
    """Paths of the output files it still has."""
    held_jobs: tuple[JobId, ...]
    """Jobs it has files of (those of jobs that ended meanwhile are released)."""


@dataclass(frozen=True)
class LinkMarked:
    """Marked behind a slow link (the breaker open): no new task until ``until``."""

    since: float
    until: float
    marks: int
    """Marks in a row, this one included (the back-off doubled ``marks - 1`` times)."""
    why: str


@dataclass(frozen=True)
class LinkOnTrial:
    """Its back-off over (the breaker half open): it takes tasks again, and the
    rates its readers measure from ``since`` on decide whether it is marked
    again (``marks + 1``) or trusted."""

    since: float
    marks: int
    why: str
    """Why it was marked."""


@dataclass
class ExecutorRecord:
    """One executor's registration, liveness and running attempts."""

    info: ExecutorInfo
    seq: int
    """Registration order: breaks ties between equally loaded executors."""
    state: ExecutorState
    since: float
    last_heartbeat: float
    running: set[TaskAttemptId] = field(default_factory=set)
    reason: LossReason | None = None
    detail: str = ""
    awaiting: bool = False
    """Known from before a scheduler restart and not reattached yet: it takes
    no task, but its outputs count as held until it is given up on."""
    resuming: Resume | None = None
    """Set while awaiting, once its resume was accepted and until its stream opens."""
    unhealthy: str = ""
    """Why it takes no task now, as its last heartbeat said (a full work
    directory); ``""`` when it is healthy."""
    failures: list[tuple[float, TaskId]] = field(default_factory=list)
    """Recent attempts that failed on it for execution reasons: when, which task."""
    excluded_until: float | None = None
    """Excluded from new tasks until then (``None``: it is not)."""
    exclusion: str = ""
    """Why it is, or last was, excluded."""
    slowness: float = 1.0
    """How long its recent tasks took against their stages' medians (a moving
    average of the ratios; 1.0: as fast as the others)."""
    slow: bool = False
    """``slowness`` reached ``Limits.speculation_multiplier``: between executors
    equally loaded, the others get a task first (``state_gray.observe_speed``)."""
    arrivals: ArrivalWindow | None = field(default=None, repr=False, compare=False)
    """Its recent heartbeats' intervals (``scheduler.detector``); ``None`` until the first."""
    suspected_since: float | None = None
    """Since when its silence is suspect (``state_liveness``); ``None``: trusted."""
    gaps: list[float] = field(default_factory=list)
    """When its recent long silences ended: heartbeats that came after a silence
    a regular executor would have been suspected for (``ExecutorRegistry.long_gap_s``),
    within ``state_liveness.FLAP_WINDOW_S``: what tells a flapping link."""
    quarantined_until: float | None = None
    """Quarantined (a flapping link): no new task until then, its outputs still served."""
    behind_since: float | None = None
    """When a heartbeat first counted fewer attempts than were launched on it
    ``state_liveness.STREAM_LAG_S`` before; ``None`` once one counts them all."""
    lagging_since: float | None = None
    """Since when its command stream is held up (``state_liveness.observe_running``):
    no new task, its running attempts copied; ``None``: its commands get through."""
    quarantine: str = ""
    """Why it is, or last was, quarantined."""
    link: LinkMarked | LinkOnTrial | None = None
    """Behind a slow link (``state_link_marks``); ``None``: its link is trusted."""
    stream: int = 0
    """Its command stream now, by the ``event_id`` of the event that opened it
    (``ExecutorConnected``, ``ExecutorStreamReopened``); 0: none yet. Not stored:
    a restarted scheduler waits for a new stream."""
    streams_moved: int = 0
    """How often its stream moved to a new connection (``state_streams``)."""
    registry: ExecutorRegistry | None = field(default=None, repr=False, compare=False)
    """The registry that holds it; not stored. A change of a stored field (one
    ``RegistrySnapshot`` keeps) or of its rank is made by the registry's own
    transitions, which say so (``stored_changed``, ``rank_changed``)."""

    @property
    def rank(self) -> tuple[float, bool, int]:
        """What ``least_loaded`` orders by: load, then not slow, then connection order."""
        # ``load`` written out: asked several times an event, for a thousand executors.
        slots = self.info.slots
        return (len(self.running) / slots if slots > 0 else 1.0, self.slow, self.seq)

    @property
    def id(self) -> ExecutorId:
        return self.info.id

    @property
    def excluded(self) -> bool:
        return self.excluded_until is not None

    @property
    def takes_tasks(self) -> bool:
        """Whether it is given new tasks when a slot of it is free: it would
        (``would_take_tasks``), and is not marked behind a slow link while the
        marks hold (``ExecutorRegistry.marks_hold``)."""
        return self.would_take_tasks and not self.marked

    @property
    def marked(self) -> bool:
        """Whether it is marked behind a slow link while the marks hold: no job
        places a task on it (``state_link_marks``)."""
        registry = self.registry
        return type(self.link) is LinkMarked and registry is not None and registry.marks_hold

    @property
    def would_take_tasks(self) -> bool:
        """Whether it takes new tasks, a slow-link mark aside: alive, not
        awaiting its reattachment, healthy, neither excluded nor distrusted
        (suspected, quarantined or lagging)."""
        return not (
            self.state is not ExecutorState.ALIVE
            or self.awaiting
            or self.unhealthy
            or self.excluded_until is not None  # ``excluded``, without a call
            or self.suspected_since is not None
            or self.quarantined_until is not None
            or self.lagging_since is not None
        )

    @property
    def free_slots(self) -> int:
        if not self.takes_tasks:
            return 0
        return max(0, self.info.slots - len(self.running))

    @property
    def load(self) -> float:
        # Fraction of slots in use, so an 8-slot executor with 2 tasks counts as
        # less loaded than a 2-slot one with 1.
        return len(self.running) / self.info.slots if self.info.slots > 0 else 1.0

    def view(self) -> ExecutorView:
        return ExecutorView(
            id=self.info.id,
            host=self.info.host,
            flight_address=self.info.flight_address,
            slots=self.info.slots,
            state=self.state,
            since=self.since,
            reason=self.reason,
            detail=self.detail,
            running=len(self.running),
            last_heartbeat=self.last_heartbeat,
            unhealthy=self.unhealthy,
            excluded_until=self.excluded_until,
            exclusion=self.exclusion,
            slowness=self.slowness,
            slow=self.slow,
            suspected_since=self.suspected_since,
            quarantined_until=self.quarantined_until,
            quarantine=self.quarantine,
            lagging_since=self.lagging_since,
            streams_moved=self.streams_moved,
            slow_link_since=self.link.since if type(self.link) is LinkMarked else None,
            slow_link_until=self.link.until if type(self.link) is LinkMarked else None,
            slow_link=self.link.why if self.link is not None else "",
        )


@dataclass
class RegistrySnapshot:
    """What the registry keeps across a scheduler restart (``scheduler.persist``).

    Running attempts and heartbeat times are left out: after a restart nothing
    runs, and every live executor gets a fresh heartbeat timeout to reattach.
    """

    live: list[ExecutorRecord]
    lost: list[ExecutorRecord]
    seq: int


_UNSTORED = frozenset(
    {"running", "last_heartbeat", "resuming", "failures", "excluded_until", "exclusion",
     "slowness", "slow", "registry", "arrivals", "suspected_since", "gaps",
     "quarantined_until", "quarantine", "link", "behind_since", "lagging_since"}
)  # fmt: skip
"""``ExecutorRecord`` fields a ``RegistrySnapshot`` leaves out. A lag is of one
command stream's launches, which a restart ends with the stream: it is judged
afresh (and changes with every heartbeat, which must not rewrite the store)."""


class ExecutorRegistry:
    """Connecting, alive and draining executors, plus a bounded history of lost ones."""

    def __init__(
        self, keep_lost: int = 100, heartbeat_interval_s: float = 0.5, long_gap_s: float = 2.0
    ) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        """How often executors are told to heartbeat: their detectors' prior."""
        self.long_gap_s = long_gap_s
        """A silence this long between two heartbeats is a gap (``ExecutorRecord.gaps``):
        the silence at which a regular executor is suspected. Fixed, unlike the
        detector's judgement, which learns to tolerate the gaps of a flapping link."""
        self.isolated_since: float | None = None
        """Since when most live executors are suspected at once (the scheduler
        takes itself for cut off, ``state_liveness``); in memory only."""
        self.isolation_ended: float | None = None
        """When the last isolation ended (the executors silent since before get
        one more timeout to be heard)."""
        self.marks_hold = False
        """Whether executors marked behind a slow link take no task: some other
        executor would take one (``settle_marks``)."""
        self._marked: set[ExecutorId] = set()
        """Live executors marked behind a slow link (``LinkMarked``)."""
        self._connecting: dict[ExecutorId, ExecutorRecord] = {}
        self._live: dict[ExecutorId, ExecutorRecord] = {}
        self._lost: OrderedDict[ExecutorId, ExecutorRecord] = OrderedDict()
        self._keep_lost = keep_lost
        self._seq = 0
        self._ranks: list[tuple[float, bool, int, ExecutorId]] = []
        """A heap of live executors by ``rank``, with stale entries (the rank
        changed since) left in until they surface: every change of a rank
        pushes the new one, so ``least_loaded`` costs a few heap operations
        rather than a pass over a thousand executors."""
        self._snapshot: RegistrySnapshot | None = None
        """The last ``snapshot()``, until a stored field changes."""
        self._draining: set[ExecutorId] = set()
        self._held: dict[JobId, int] = {}
        """Job -> attempts running on live executors (``slots_held``), kept as
        attempts start and stop: fair shares ask it on every event, and a pass
        over 8,000 busy slots made a simulated cluster of 1,000 executors handle
        40 times fewer events."""

    def stored_changed(self) -> None:
        """A field a snapshot keeps changed (any not in ``_UNSTORED``): the
        cached snapshot is stale."""
        self._snapshot = None

    def stream_moved(self, rec: ExecutorRecord, stream: int) -> None:
        """``rec``'s command stream moved to a new connection, the one event
        ``stream`` opened (``state_streams``)."""
        rec.stream = stream
        rec.streams_moved += 1
        self.stored_changed()

    def rank_changed(self, rec: ExecutorRecord) -> None:
        """What ``rec.rank`` reads changed (``slow``, ``seq``, ``info``; running
        attempts are pushed by ``start`` / ``stop``)."""
        if rec.id in self._live:
            self._push(rec)

    def set_detail(self, rec: ExecutorRecord, detail: str) -> None:
        """What the status views say of ``rec``'s state."""
        if rec.detail != detail:
            rec.detail = detail
            self.stored_changed()

    def _push(self, rec: ExecutorRecord) -> None:
        heapq.heappush(self._ranks, (*rec.rank, rec.id))
        if len(self._ranks) > 4 * len(self._live) + 64:
            # Mostly stale entries: start again from the live executors.
            self._ranks = [(*r.rank, r.id) for r in self._live.values()]
            heapq.heapify(self._ranks)

    def _adopt(self, rec: ExecutorRecord) -> ExecutorRecord:
        rec.registry = self
        self._snapshot = None
        return rec

    # ------------------------------------------------------------------ queries

    def live(self, executor: ExecutorId) -> ExecutorRecord | None:
        """The executor's record if it is alive or draining, else ``None``."""
        return self._live.get(executor)

    def is_live(self, executor: ExecutorId) -> bool:
        return executor in self._live

    def listens(self, executor: ExecutorId) -> bool:
        """Whether ``executor`` is connecting, alive or draining: one whose
        heartbeats count (any other must register again)."""
        return executor in self._live or executor in self._connecting

    def silent_since_isolation(self, rec: ExecutorRecord) -> bool:
        """Whether ``rec`` has been silent since before the last isolation ended:
        its silence is most likely the scheduler's own cut, which heals for the
        executors one by one (``state_liveness``)."""
        ended = self.isolation_ended
        return ended is not None and rec.last_heartbeat < ended

    def live_records(self) -> list[ExecutorRecord]:
        """Alive and draining executors, in registration order."""
        return list(self._live.values())

    def live_ids(self) -> list[ExecutorId]:
        """Alive and draining executors, in registration order."""
        return list(self._live)

    def any_live(self) -> bool:
        return bool(self._live)

    def least_loaded(
        self, excluding: AbstractSet[ExecutorId] = frozenset()
    ) -> ExecutorRecord | None:
        """The alive executor with a free slot and the lowest load, if any,
        leaving out those in ``excluding``; between equal loads, one not marked
        slow, then the earliest connected."""
        heap, passed = self._ranks, []
        best: ExecutorRecord | None = None
        while heap:
            load, slow, seq, executor = heap[0]
            rec = self._live.get(executor)
            if rec is None or rec.rank != (load, slow, seq):
                heapq.heappop(heap)  # stale: lost, or its rank changed (and was pushed)
            elif load >= 1.0:
                break  # this one is full, and so is every one after it
            elif rec.free_slots <= 0 or executor in excluding:
                passed.append(heapq.heappop(heap))  # not now, but still ranked so
            else:
                best = rec
                break
        for entry in passed:
            heapq.heappush(heap, entry)
        return best

    def slots_held(self) -> dict[JobId, int]:
        """Job -> slots its running attempts hold (speculative copies included);
        jobs holding none are left out. Kept as attempts start and stop, so it
        costs the number of jobs."""
        return dict(self._held)

    def _release(self, attempts: Iterable[TaskAttemptId]) -> None:
        for attempt in attempts:
            job = attempt.task.job
            left = self._held[job] - 1
            if left:
                self._held[job] = left
            else:
                del self._held[job]

    def alive_slots(self) -> int:
        """Slots of the alive executors (busy or not; draining ones, those
        awaiting their reattachment and those a slow-link mark bars left out):
        the cluster's size as a job's share of it is counted."""
        return sum(
            r.info.slots
            for r in self._live.values()
            if r.state is ExecutorState.ALIVE and not r.awaiting and not self._barred(r)
        )

    def _barred(self, rec: ExecutorRecord) -> bool:
        """Whether ``rec`` is marked behind a slow link and the marks hold: no
        job places a task on it, so it is no part of the cluster's size."""
        return self.marks_hold and type(rec.link) is LinkMarked

    def parallel_slots(self) -> int:
        """How many tasks the alive executors run at full speed at once: on each
        host, its slots, but no more than its cores hold tasks of their DuckDB
        threads (executors that did not say count every slot).

        ``LocalCluster`` on two cores starts two executors of one slot each, and
        each slot's DuckDB takes two threads (``ExecutorConfig.threads_per_slot``:
        the cores over the executor's own slots): one task already has every
        core, and a scan split in two runs no faster than whole, paying each
        task's fixed costs and its own build of every side it joins.
        """
        hosts: dict[str, list[ExecutorInfo]] = {}
        for r in self._live.values():
            if r.state is ExecutorState.ALIVE and not r.awaiting and not self._barred(r):
                hosts.setdefault(r.info.host, []).append(r.info)
        total = 0
        for infos in hosts.values():
            slots = sum(i.slots for i in infos)
            if all(i.cores > 0 and i.threads > 0 for i in infos):
                cores = max(i.cores for i in infos)
                threads = min(i.threads for i in infos)
                slots = min(slots, max(1, cores // threads))
            total += slots
        return total

    def takers(self) -> list[ExecutorRecord]:
        """Executors that take tasks, or will: alive ones (excluded included)
        and those awaiting their reattachment or still connecting."""
        return [
            *(r for r in self._live.values() if r.state is ExecutorState.ALIVE),
            *self._connecting.values(),
        ]

    def any_taker(self, excluding: AbstractSet[ExecutorId]) -> bool:
        """Whether an alive executor not in ``excluding`` takes tasks (busy or not):
        neither awaiting its reattachment nor excluded for failing tasks."""
        return any(
            r.state is ExecutorState.ALIVE and not r.awaiting and not r.excluded
            for r in self._live.values()
            if r.id not in excluding
        )

    def exclusions_over(self, now: float) -> list[ExecutorRecord]:
        """Live executors whose exclusion is over at ``now``."""
        return [
            r
            for r in self._live.values()
            if r.excluded_until is not None and now >= r.excluded_until
        ]

    def draining(self) -> list[ExecutorRecord]:
        """Draining executors, in registration order."""
        if not self._draining:
            return []  # the usual case, without a pass over every executor
        return [r for r in self._live.values() if r.state is ExecutorState.DRAINING]

    def views(self) -> list[ExecutorView]:
        """Live executors in connection order, then connecting ones, then lost ones
        in loss order."""
        records = [*self._live.values(), *self._connecting.values(), *self._lost.values()]
        return [r.view() for r in records]

    def view(self, executor: ExecutorId) -> ExecutorView | None:
        rec = self._live.get(executor) or self._connecting.get(executor)
        rec = rec or self._lost.get(executor)
        return rec.view() if rec is not None else None

    def timed_out(self, now: float, timeout_s: float) -> list[ExecutorId]:
        """Live executors not heard from for more than ``timeout_s``."""
        return [e for e, r in self._live.items() if now - r.last_heartbeat > timeout_s]

    def connect_timed_out(self, now: float, timeout_s: float) -> list[ExecutorId]:
        """Connecting executors registered (or heard from) more than ``timeout_s`` ago."""
        return [e for e, r in self._connecting.items() if now - r.last_heartbeat > timeout_s]

    def with_free_slots(self) -> list[ExecutorRecord]:
        """Alive executors with a free slot, in registration order (a pass over
        every executor: for ``SchedulerState.validate``, not for placing tasks)."""
        return [r for r in self._live.values() if r.free_slots > 0]

    def validate(self, running: Mapping[ExecutorId, set[TaskAttemptId]]) -> None:
        """Check the ``executor-sets`` and ``executor-index`` invariants, and the
        registry's part of ``running-placed`` (docs/architecture.md, "Invariants
        of the state"). ``running``: executor -> the attempts the jobs say run there."""
        groups = (
            (self._connecting, (ExecutorState.CONNECTING,)),
            (self._live, (ExecutorState.ALIVE, ExecutorState.DRAINING)),
            (self._lost, (ExecutorState.LOST,)),
        )
        seqs = []
        for records, states in groups:
            for eid, rec in records.items():
                lost = rec.state is ExecutorState.LOST
                if (
                    rec.id != eid
                    or rec.state not in states
                    or rec.registry is not self
                    or (rec.awaiting and records is not self._live)
                    or (rec.resuming is not None and not rec.awaiting)
                    or (rec.running and records is not self._live)
                    or lost != (rec.reason is not None)
                ):
                    raise StateInvariantError(
                        "executor-sets",
                        f"executor {eid} ({rec.state.name}, awaiting {rec.awaiting}, "
                        f"reason {rec.reason}) kept as {states[0].name}",
                    )
            seqs += [r.seq for r in records.values()] if records is self._live else []
        ids = [*self._connecting, *self._live, *self._lost]
        draining = {e for e, r in self._live.items() if r.state is ExecutorState.DRAINING}
        if (
            len(set(ids)) != len(ids)
            or self._draining != draining
            or len(set(seqs)) != len(seqs)
            or not all(0 < q <= self._seq for q in seqs)
            or len(self._lost) > self._keep_lost
        ):
            raise StateInvariantError(
                "executor-sets", f"connecting, live and lost overlap or miscount: {ids}"
            )
        for rec in [*self._connecting.values(), *self._lost.values()]:
            if (
                rec.suspected_since is not None
                or rec.quarantined_until is not None
                or rec.lagging_since is not None
            ):
                raise StateInvariantError(
                    "executor-health",
                    f"executor {rec.id} ({rec.state.name}) is suspected, "
                    f"quarantined or lagging, which only a live one can be",
                )
        for rec in self._live.values():
            distrusted = (
                rec.suspected_since is not None
                or rec.quarantined_until is not None
                or rec.lagging_since is not None
            )
            if (
                (distrusted and rec.free_slots != 0)
                or rec.gaps != sorted(rec.gaps)
                or (rec.lagging_since is not None and rec.behind_since is None)
            ):
                raise StateInvariantError(
                    "executor-health",
                    f"executor {rec.id} is suspected, quarantined or lagging and still takes "
                    f"tasks, lags without being behind, or its long silences are out of "
                    f"order: {rec.gaps}",
                )
            if rec.running and rec.stream <= 0:
                raise StateInvariantError(
                    "stream-current",
                    f"executor {rec.id} runs {sorted(map(str, rec.running))} with no command "
                    f"stream to launch them on",
                )
            if rec.awaiting and rec.suspected_since is not None:
                raise StateInvariantError(
                    "executor-health", f"executor {rec.id} awaits its reattachment and is suspected"
                )
        marked = {e for e, r in self._live.items() if type(r.link) is LinkMarked}
        fresh = bool(marked) and any(
            r.would_take_tasks for e, r in self._live.items() if e not in marked
        )
        if self._marked != marked or self.marks_hold != fresh:
            raise StateInvariantError(
                "slow-link-marks",
                f"marked {sorted(self._marked)}, the records say {sorted(marked)}; marks "
                f"hold {self.marks_hold}, a fresh look says {fresh}",
            )
        for rec in [*self._connecting.values(), *self._lost.values()]:
            if rec.link is not None:
                raise StateInvariantError(
                    "slow-link-marks", f"executor {rec.id} ({rec.state.name}) has a link mark"
                )
        for eid, rec in self._live.items():
            link = rec.link
            if not isinstance(link, LinkMarked):
                if isinstance(link, LinkOnTrial) and link.marks < 1:
                    raise StateInvariantError(
                        "slow-link-marks", f"executor {eid} is on trial after no mark"
                    )
                continue
            if (
                link.marks < 1
                or link.until <= link.since
                or (self.marks_hold and rec.free_slots != 0)
            ):
                raise StateInvariantError(
                    "slow-link-marks",
                    f"executor {eid} is marked ({link}) and still takes tasks while the "
                    f"marks hold, or its mark is malformed",
                )
        if self.isolated_since is not None and len(self._live) < 2:
            raise StateInvariantError(
                "executor-health", "isolated (most executors silent) with fewer than two live"
            )
        entries = set(self._ranks)
        ranks = self._ranks
        if not all(ranks[(i - 1) // 2] <= ranks[i] for i in range(1, len(ranks))) or any(
            (*r.rank, r.id) not in entries for r in self._live.values()
        ):
            raise StateInvariantError(
                "executor-index", "the rank heap misses a live executor's rank, or is no heap"
            )
        if self._snapshot is not None and self._snapshot != self._fresh_snapshot():
            raise StateInvariantError(
                "executor-index", "the cached snapshot differs from the registry (a stale cache)"
            )
        held = Counter(a.task.job for r in self._live.values() for a in r.running)
        if self._held != dict(held):
            raise StateInvariantError(
                "executor-index", f"slots held per job {self._held}, the executors say {held}"
            )
        for eid, attempts in running.items():
            rec = self._live.get(eid)
            if attempts and (rec is None or rec.awaiting):
                raise StateInvariantError(
                    "running-placed",
                    f"{sorted(map(str, attempts))} run on executor {eid}, which is not "
                    f"alive or is awaiting its reattachment",
                )
        for eid, rec in self._live.items():
            said = running.get(eid, set())
            if rec.running != said or len(rec.running) > max(0, rec.info.slots):
                raise StateInvariantError(
                    "running-placed",
                    f"executor {eid} ({rec.info.slots} slots) runs "
                    f"{sorted(map(str, rec.running))}, the jobs say {sorted(map(str, said))}",
                )

    # ---------------------------------------------------------------- transitions

    def register(self, info: ExecutorInfo, now: float) -> bool:
        """Add a new connecting executor; ``False`` when the id is already known
        (a lost id stays lost: a restarted process must use a fresh id)."""
        if info.id in self._live or info.id in self._connecting or info.id in self._lost:
            return False
        self._connecting[info.id] = self._adopt(
            ExecutorRecord(
                info=info, seq=0, state=ExecutorState.CONNECTING, since=now, last_heartbeat=now
            )
        )
        return True

    def connected(self, executor: ExecutorId, now: float) -> ExecutorRecord | None:
        """A connecting executor's stream opened: it is alive; ``None`` if it was
        not connecting."""
        rec = self._connecting.pop(executor, None)
        if rec is None:
            return None
        # Ordered by connection: ties between idle executors are broken by it.
        self._seq += 1
        self._live[executor] = rec
        rec.seq, rec.state, rec.since, rec.last_heartbeat = self._seq, ExecutorState.ALIVE, now, now
        self.stored_changed()
        self.rank_changed(rec)
        return rec

    def resume(self, executor: ExecutorId, offer: Resume) -> bool:
        """Accept an awaiting executor's resume (until its stream opens); ``False``
        when it is not awaiting (lost, unknown, or reattached already)."""
        rec = self._live.get(executor)
        if rec is None or not rec.awaiting:
            return False
        rec.resuming = offer
        return True

    def revive(self, executor: ExecutorId, offer: Resume, now: float) -> bool:
        """A lost executor came back alive (``state_revival`` decided it may go
        on under its id): it waits for its stream like an awaited executor after
        a restart, from ``now``. ``False`` when it is not in the lost history."""
        rec = self._lost.pop(executor, None)
        if rec is None:
            return False
        rec.state, rec.since, rec.last_heartbeat = ExecutorState.ALIVE, now, now
        rec.reason = None
        rec.detail = "came back after it was lost; waiting for its stream"
        rec.awaiting, rec.resuming = True, offer
        self._live[executor] = rec
        self.stored_changed()
        self.rank_changed(rec)
        return True

    def heard_from(
        self,
        executor: ExecutorId,
        now: float,
        unhealthy: str | None = None,
        beat: bool = False,
        failed: int = 0,
    ) -> float | None:
        """A word from the executor: a heartbeat (``beat``) or a report.

        A heartbeat feeds its failure detector; any word ends a suspicion (not
        a quarantine). The silence before it is a gap (``ExecutorRecord.gaps``)
        when it is ``long_gap_s``, or when it lasted ``FAILED_GAP_BEATS`` beats
        and the executor says ``failed`` heartbeats of its own failed meanwhile
        (its link was down), or it was suspected for it (by the hedge or as a
        relapse: the others were heard meanwhile; a heartbeat sent into a cut
        and carried through by TCP after the heal says no failure). Since its
        heartbeats go on new connections after a failure (``executor.link``), a
        flapping link's silences last little more than its cuts, shorter than a
        suspicion by phi; a pause of the executor fails
        none of its heartbeats. ``unhealthy`` (when given) replaces what the last
        heartbeat said. Returns since when it was suspected, if this ended a
        suspicion.
        """
        rec = self._live.get(executor) or self._connecting.get(executor)
        ended = None
        if rec is not None:
            rec.last_heartbeat = max(rec.last_heartbeat, now)
            last = rec.arrivals.last if rec.arrivals is not None else None
            if last is not None and not (rec.gaps and rec.gaps[-1] > last):  # not counted yet
                silence = now - last
                beats = FAILED_GAP_BEATS * self.heartbeat_interval_s
                if (
                    # a report may end the suspicion before the next beat arrives
                    (rec.suspected_since is not None and silence >= beats)
                    or (beat and (silence >= self.long_gap_s or (failed and silence >= beats)))
                ):
                    rec.gaps.append(now)
            if beat:
                if rec.arrivals is None:
                    rec.arrivals = ArrivalWindow(self.heartbeat_interval_s, self.long_gap_s)
                rec.arrivals.heard(now)
            if rec.suspected_since is not None and now >= rec.suspected_since:
                ended, rec.suspected_since = rec.suspected_since, None
            if unhealthy is not None and unhealthy != rec.unhealthy:
                rec.unhealthy = unhealthy
                self.stored_changed()
        return ended

    def drain(self, executor: ExecutorId, now: float) -> None:
        rec = self._live.get(executor)
        if rec is not None and rec.state is ExecutorState.ALIVE:
            rec.state = ExecutorState.DRAINING
            self._draining.add(executor)
            rec.since = now
            self.stored_changed()

    def mark_lost(
        self, executor: ExecutorId, reason: LossReason, detail: str, now: float
    ) -> list[TaskAttemptId]:
        """Move a live or connecting executor to the lost history; return what it
        was running."""
        rec = self._live.pop(executor, None) or self._connecting.pop(executor, None)
        if rec is None:
            return []
        self._snapshot = None
        self._draining.discard(executor)
        running = sorted(rec.running)
        self._release(running)
        rec.running.clear()
        rec.state = ExecutorState.LOST
        rec.since = now
        rec.reason = reason
        rec.detail = detail
        rec.awaiting, rec.resuming = False, None
        rec.suspected_since = rec.quarantined_until = None
        rec.lagging_since = rec.behind_since = None
        rec.link = None
        self._marked.discard(executor)
        if len(self._live) < 2:
            self.isolated_since = None  # too few left to be silent "at once"
        self._lost[executor] = rec
        while len(self._lost) > self._keep_lost:
            self._lost.popitem(last=False)
        return running

    def set_link(self, rec: ExecutorRecord, link: LinkMarked | LinkOnTrial | None) -> None:
        """``rec``'s link is marked slow, on trial, or trusted (``state_link_marks``)."""
        rec.link = link
        if type(link) is LinkMarked:
            self._marked.add(rec.id)
        else:
            self._marked.discard(rec.id)
        self.settle_marks()

    def marked(self) -> list[ExecutorRecord]:
        """Live executors marked behind a slow link, in no particular order."""
        return [self._live[e] for e in self._marked]

    def settle_marks(self) -> bool:
        """Decide whether the slow-link marks hold now: only while an executor
        that is not marked would take tasks (``would_take_tasks``), so that a
        mark never leaves no executor to run work (every one marked, or the
        others lost, distrusted, excluded). Cheap: nothing to do with no mark,
        and the first unmarked taker ends the look. Returns ``marks_hold``."""
        marked = self._marked
        self.marks_hold = bool(marked) and any(
            r.would_take_tasks for e, r in self._live.items() if e not in marked
        )
        return self.marks_hold

    def start(self, executor: ExecutorId, attempt: TaskAttemptId) -> None:
        rec = self._live[executor]
        running = rec.running
        before = len(running)
        running.add(attempt)  # one hash of the attempt, not two
        if len(running) != before:
            job = attempt.task.job
            self._held[job] = self._held.get(job, 0) + 1
        self._push(rec)

    def stop(self, executor: ExecutorId, attempt: TaskAttemptId) -> None:
        """Free the attempt's slot (no-op if the executor is gone)."""
        rec = self._live.get(executor)
        if rec is None:
            return
        running = rec.running
        before = len(running)
        running.discard(attempt)  # one hash of the attempt, not two
        if len(running) != before:
            self._release((attempt,))
            self._push(rec)

    def running_attempts(self, executor: ExecutorId) -> list[TaskAttemptId]:
        rec = self._live.get(executor)
        return sorted(rec.running) if rec is not None else []

    # ------------------------------------------------------------ persistence

    def snapshot(self) -> RegistrySnapshot:
        if self._snapshot is None:
            # Kept until a stored field changes: most events change none, and
            # a thousand executors take a while to copy (and the shell to encode:
            # ``StateWriter`` knows the same object again).
            self._snapshot = self._fresh_snapshot()
        return self._snapshot

    def _fresh_snapshot(self) -> RegistrySnapshot:
        def bare(rec: ExecutorRecord) -> ExecutorRecord:
            # A resume accepted but not connected is void after a restart: the
            # executor's stream is refused and it asks to resume again.
            # Exclusions are in memory only: a restarted scheduler trusts every
            # executor again (a bad one is excluded again after a few failures).
            # What ``replace(rec, **unstored)`` gives, without ``__init__`` and
            # ``__setattr__`` for each field: ``validate`` builds a fresh
            # snapshot after every event, and ``replace`` was most of its cost.
            copy = object.__new__(ExecutorRecord)
            copy.__dict__.update(rec.__dict__)
            copy.__dict__.update(
                registry=None,
                running=set(),
                last_heartbeat=0.0,
                resuming=None,
                failures=[],
                excluded_until=None,
                exclusion="",
                slowness=1.0,
                slow=False,
                arrivals=None,
                suspected_since=None,
                gaps=[],
                quarantined_until=None,
                quarantine="",
                link=None,
                behind_since=None,
                lagging_since=None,
            )
            return copy

        return RegistrySnapshot(
            live=[bare(r) for r in self._live.values()],
            lost=[bare(r) for r in self._lost.values()],
            seq=self._seq,
        )

    def restore(self, snapshot: RegistrySnapshot) -> None:
        self._live = {r.id: self._adopt(r) for r in snapshot.live}
        self._lost = OrderedDict((r.id, self._adopt(r)) for r in snapshot.lost)
        self._seq = snapshot.seq
        self._draining = {e for e, r in self._live.items() if r.state is ExecutorState.DRAINING}
        self._held = {}  # a snapshot holds no running attempt
        self._ranks = [(*r.rank, r.id) for r in self._live.values()]
        heapq.heapify(self._ranks)

    def recovered(self, now: float) -> list[ExecutorRecord]:
        """After a restart: every live executor waits to reattach, from ``now``."""
        for rec in self._live.values():
            rec.awaiting = True
            rec.suspected_since = rec.quarantined_until = None
            self._release(rec.running)
            rec.running.clear()
            self._push(rec)
            rec.last_heartbeat = now
            rec.detail = "waiting for it to reconnect after the scheduler restarted"
        self.stored_changed()
        return list(self._live.values())

    def reattached(self, executor: ExecutorId, now: float) -> tuple[ExecutorRecord, Resume] | None:
        """A waiting executor whose resume was accepted opened its stream: it is
        back; ``None`` when it was not waiting so."""
        rec = self._live.get(executor)
        if rec is None or not rec.awaiting or rec.resuming is None:
            return None
        offer = rec.resuming
        rec.awaiting, rec.resuming = False, None
        rec.info = offer.info
        rec.last_heartbeat = now
        rec.detail = ""
        self.stored_changed()
        self.rank_changed(rec)
        return rec, offer
