"""Slow links: the rates each executor's fetches get from each peer, and the two
rules that act on them: a job stops reading a slow producer when making its
outputs again on the fast executors finishes sooner, and a reader behind a
slow link of its own gets a copy on a fast executor when that reads sooner.

A gray failure the detector cannot see: an executor whose link is slow (a
congested or throttled port) still heartbeats, and a fetch from it keeps
receiving bytes, so nothing fails; but every reader of its outputs waits on it,
and the query runs at the speed of that one link. Speculation by run time does
not help: a copy of the reader fetches over the same link.

**Measured rates** (``LinkRates``): each executor's heartbeat carries, per
peer, the bytes its Flight fetches received and the seconds at least one fetch
from that peer was open (``task.LinkSample``, ``executor.peer_rates``). Per
producer, the scheduler keeps the rate each reader gets over about the last two
seconds (bytes over busy seconds, both decayed by ``DECAY`` a beat), forgetting
a reader not heard about for ``FRESH_S``; a rule acts on a link only after
``MIN_EVIDENCE_S`` of reading over it (a freshly started executor serves its
first fetches slowly). Each reader compares a producer with the other producers it reads
(``LinkRates.compare``): what a reader gets is the lesser of the
producer's outbound link and its own inbound one, so a reader behind a slow
link of its own finds everyone slow and nobody slower. A producer's rate is the
median over its readers, the *fast* rate the median of those readers' rates
from the others.

**Probes** (``LinkRates.observe_probes``, ``LinkRates.probed``): each
executor also times small synthetic fetches from a few peers
(``executor.probes``: a few hundred KiB, the call's latency left out), one
sample per probe, kept apart from the fetches: a probe lasts a tenth of a
second on a slow link, so ``MIN_EVIDENCE_S`` of them would take a minute, and
a probe is more easily hurt by a moment's noise than a second of bulk reading.
Their own rules, so that a healthy link is not marked on a noisy probe:

* a reader's rate from a producer is the *best* of its last ``PROBES_KEPT``
  fresh probes of it: a pause, a busy CPU or a burst of job traffic slows one
  probe, a slow link slows them all;
* compared, as the fetches are, with the same reader's best probes of the
  other producers, the producer's rate the median over its readers;
* a verdict needs ``PROBE_EVIDENCE`` fresh probes of the producer in all;
* slow only if the readers' best probes lasted at least ``PROBE_MIN_S``
  (the median): a probe faster than that says more of timing noise (a thread
  scheduled late) than of the link, and a link that moves a probe that fast is
  left to the fetches' rules;
* the fetches overrule the probes: a producer with ``MIN_EVIDENCE_S`` of
  fetch readings is judged by them alone (``state_link_marks``), so a link
  saturated by jobs yet healthy is judged by what the jobs get.

**The rule** (``slow_links``, on ``Tick``, with ``--speculation``): for a
running job whose readers fetch from a producer ``p`` whose rate is under
``1 / --slow-link-ratio`` (3) of the fast rate, with ``k`` readers measuring it:

* ``slow_s``, the time to read what the job still needs from ``p`` at ``p``'s
  rate: the bytes of ``p``'s outputs the job's unfinished stages read (a running
  reader is taken as halfway through its input), over ``k`` times the rate;
* ``fast_s``, the time to make them again on the other executors and read
  everything those readers need at the fast rate: for each stage whose outputs
  on ``p`` would go (those the job needs, and their own inputs on ``p`` as
  ``Recovery`` recomputes them), ``ceil(outputs / free-able slots)`` waves of its
  median task time, then the readers' bytes over ``k`` times the fast rate.

When ``slow_s`` exceeds ``fast_s`` by ``MIN_SAVING_S`` and by half ``fast_s``
(a margin for what the estimate does not see), the job stops using ``p``
(``Recovery._exclude``, the rule of a cut between two executors): its readers
of ``p``'s outputs and its attempts on ``p`` are cancelled (uncharged), the
outputs go back to pending (a recompute each) and run on the other executors,
``p`` gets no more of the job's tasks, and ``p`` stays alive and serves other
jobs. Bounded: once per job and executor (an excluded executor is never
judged again for that job), never the job's last usable executor, never a
suspected or quarantined one (``state_liveness`` handles those); the
recomputes take the slots the cancelled readers freed. Exactly once as every
exclusion is: the cancelled attempts' reports are stale (``_current``).

**Readers behind a slow link** (``slow_readers``, on ``Tick`` after
``_speculate``, with ``--speculation``): an executor whose readers get every
producer under ``1 / --slow-link-ratio`` of what the producers' other readers
get (``LinkRates.compare_reader``) has a slow link of its own (a link slowed
both ways slows its reads too). A running attempt there without a copy whose
inputs, at the rates that executor gets from each producer, still take longer
to read (less the time it has run) than a copy elsewhere would take to read
them all at the others' rates, by ``MIN_SAVING_S`` and half the copy's time,
gets one speculative copy on the least loaded executor with a free slot that
is neither its own nor behind a slow link (``Placement._launch_copy``: the
first to finish wins, as for any copy).

Both are logged (``HealthChange.SLOW_LINK``, with the estimates).

>>> from mangonel.task import LinkSample
>>> rates = LinkRates()
>>> p, q = ExecutorId("p"), ExecutorId("q")
>>> rates.observe(ExecutorId("r"), (LinkSample(p, 2_500_000, 1.0), LinkSample(q, 10**8, 1.0)), 0.0)
>>> rates.compare(p, now=1.0)
Compared(rate=2500000.0, others=100000000.0, readers=1, busy_s=1.0)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mangonel.ids import ExecutorId, JobId, StageId
from mangonel.scheduler.events import HealthChange, Limits, LogExecutorHealth
from mangonel.scheduler.state_executors import ExecutorRecord, ExecutorRegistry
from mangonel.scheduler.state_jobs import Done, JobRecord, Running, StageRecord, TaskRecord
from mangonel.scheduler.state_liveness import FLAP_WINDOW_S
from mangonel.scheduler.state_recovery import Step
from mangonel.scheduler.state_views import JobState
from mangonel.task import InputMode, LinkSample

__all__ = [
    "FRESH_S",
    "Compared",
    "LinkRates",
    "LinkRelief",
    "Probed",
    "SlowLink",
    "SlowReader",
    "slow_links",
    "slow_readers",
    "unfit_readers",
]

FRESH_S = 10.0
"""A reader's rate from a producer counts for this long after its last sample:
samples come only while it reads from it."""
MIN_BUSY_S = 0.01
"""A sample of less busy time says more about a call's latency than the link
(a fast producer's small files read with the call's latency look slower than
it is: it is the slow one that must prove itself, ``MIN_EVIDENCE_S``)."""
MIN_EVIDENCE_S = 1.0
"""A rule acts on a link only after its readers spent this long reading over it
(within ``FRESH_S``): the first fetches from a freshly started executor come
slowly for a moment, a slow link stays slow."""
DECAY = 0.75
"""Per heartbeat, what a reader's earlier bytes and busy seconds from a producer
still weigh in its rate: about the last two seconds count."""
HEARD_S = 1.0
"""Neither rule judges an executor not heard from for this long (two of the
default beats): silence is the failure detector's business
(``state_liveness``), and a frozen or cut-off peer's fetches, busy with nothing
received, would look like a very slow link."""
MIN_SAVING_S = 1.0
"""The rule acts only to save at least this much (estimates are rough)."""
PROBES_KEPT = 3
"""A reader's probes of a producer kept (the last; their best is its rate)."""
PROBE_EVIDENCE = 3
"""Fresh probes of a producer, over all its readers, before probes judge it."""
PROBE_MIN_S = 0.05
"""A producer is found slow by probes only if its readers' best probes lasted
this long (their median): a 256 KiB probe faster than that (a link over about
40 mbit) is timed mostly by the hosts' scheduling, not by the link."""


@dataclass
class _Seen:
    """What one reader got from one producer lately."""

    bytes: float
    busy: float
    """Bytes and busy seconds, the older ones decayed (``DECAY``): a rate over
    the time, not an average of the heartbeats' rates. Batches arrive whole, so
    a beat's interval may see a slow link busy and nothing received, the next
    a whole batch; an average of their rates would drop the first."""
    at: float
    busy_s: float
    """Seconds of reading since the reader was last fresh (``MIN_EVIDENCE_S``)."""

    @property
    def rate(self) -> float:
        return self.bytes / self.busy if self.busy > 0 else 0.0


@dataclass(frozen=True)
class Compared:
    """A producer's rate against the others', as the readers of both measured them."""

    rate: float
    """Bytes per second its readers get from it (their median)."""
    others: float
    """... from the other producers they read (the median of their medians)."""
    readers: int
    """The readers that measured both."""
    busy_s: float = 0.0
    """Seconds those readers spent reading it (``MIN_EVIDENCE_S``)."""


@dataclass(frozen=True)
class _Probe:
    at: float
    rate: float
    seconds: float


@dataclass(frozen=True)
class Probed:
    """A producer's rate against the others', as its readers' probes measured them."""

    rate: float
    """Bytes per second: the median over its readers of each one's best probe."""
    others: float
    """... of the other producers, as the same readers' best probes measured them."""
    readers: int
    probes: int
    """Fresh probes of it by those readers."""
    best_s: float
    """How long the readers' best probes of it lasted (their median)."""

    def slow(self, ratio: float) -> bool:
        """Found slow: under ``1 / ratio`` of the others, and slow enough to
        time (``PROBE_MIN_S``)."""
        return self.rate * ratio <= self.others and self.best_s >= PROBE_MIN_S


@dataclass
class LinkRates:
    """Per producer, the rate each reader gets from it (a moving average), and
    when it was last measured. Pure: the time arrives with each call."""

    _by_producer: dict[ExecutorId, dict[ExecutorId, _Seen]] = field(default_factory=dict)
    _probes: dict[ExecutorId, dict[ExecutorId, list[_Probe]]] = field(default_factory=dict)
    """Per producer and reader, its last ``PROBES_KEPT`` probes."""

    def observe_probes(self, reader: ExecutorId, samples: Iterable[LinkSample], now: float) -> None:
        """``reader``'s heartbeat carried its link probes since its last one."""
        for s in samples:
            if s.peer == reader or s.busy_s <= 0 or s.bytes <= 0:
                continue
            kept = self._probes.setdefault(s.peer, {}).setdefault(reader, [])
            kept.append(_Probe(now, s.bytes / s.busy_s, s.busy_s))
            del kept[:-PROBES_KEPT]

    def _best_probe(self, producer: ExecutorId, reader: ExecutorId, now: float) -> _Probe | None:
        fresh = [p for p in self._probes.get(producer, {}).get(reader, ()) if now - p.at <= FRESH_S]
        return max(fresh, key=lambda p: p.rate) if fresh else None

    def probed(
        self,
        producer: ExecutorId,
        now: float,
        ignoring: AbstractSet[ExecutorId] = frozenset(),
    ) -> Probed | None:
        """How ``producer``'s readers' probes get it against the other producers
        they probed (see "Probes" above): ``None`` with fewer than
        ``PROBE_EVIDENCE`` fresh probes of it by readers that probed another."""
        rates: list[float] = []
        others: list[float] = []
        best_s: list[float] = []
        count = 0
        for reader, kept in self._probes.get(producer, {}).items():
            if reader in ignoring:
                continue
            best = self._best_probe(producer, reader, now)
            if best is None:
                continue
            elsewhere = [
                b.rate
                for p in self._probes
                if p != producer and (b := self._best_probe(p, reader, now)) is not None
            ]
            if not elsewhere:
                continue
            rates.append(best.rate)
            others.append(statistics.median(elsewhere))
            best_s.append(best.seconds)
            count += sum(1 for p in kept if now - p.at <= FRESH_S)
        if count < PROBE_EVIDENCE:
            return None
        return Probed(
            statistics.median(rates),
            statistics.median(others),
            len(rates),
            count,
            statistics.median(best_s),
        )

    def observe(self, reader: ExecutorId, samples: Iterable[LinkSample], now: float) -> None:
        """``reader``'s heartbeat said what its fetches received from each peer."""
        for s in samples:
            if s.peer == reader or s.busy_s < MIN_BUSY_S:
                continue
            readers = self._by_producer.setdefault(s.peer, {})
            seen = readers.get(reader)
            if seen is None or now - seen.at > FRESH_S:
                readers[reader] = _Seen(s.bytes, s.busy_s, now, s.busy_s)
            else:
                seen.bytes = DECAY * seen.bytes + s.bytes
                seen.busy = DECAY * seen.busy + s.busy_s
                seen.at = now
                seen.busy_s += s.busy_s

    def compare(
        self,
        producer: ExecutorId,
        now: float,
        ignoring: AbstractSet[ExecutorId] = frozenset(),
    ) -> Compared | None:
        """How ``producer``'s fresh readers get it against the other producers
        they read: ``None`` when no reader measured it and another producer
        within ``FRESH_S``.

        Each reader compares it with its own other producers: what a reader
        gets is the lesser of the producer's outbound link and its own inbound
        one, so a reader behind a slow link of its own gets everyone slowly,
        and judges nobody slow. Not always evenly (a peer's small files may
        pass a rate limiter's burst): readers in ``ignoring``, known to be
        behind a slow link (``state_link_marks``), do not judge at all.
        """
        readers = self._by_producer.get(producer)
        if not readers:
            return None
        rates: list[float] = []
        others: list[float] = []
        busy = 0.0
        for reader, seen in readers.items():
            if now - seen.at > FRESH_S or reader in ignoring:
                continue
            elsewhere = [
                other.rate
                for p, by in self._by_producer.items()
                if p != producer and (other := by.get(reader)) is not None
                if now - other.at <= FRESH_S
            ]
            if elsewhere:
                rates.append(seen.rate)
                others.append(statistics.median(elsewhere))
                busy += seen.busy_s
        if not rates:
            return None
        return Compared(statistics.median(rates), statistics.median(others), len(rates), busy)

    def compare_reader(self, reader: ExecutorId, now: float) -> Compared | None:
        """How fast ``reader`` gets the producers it reads against how fast
        their other readers get them: a reader behind a slow link of its own
        gets every producer slower than the others do. ``None`` when no
        producer it read within ``FRESH_S`` had another reader then."""
        mine: list[float] = []
        theirs: list[float] = []
        busy = 0.0
        for readers in self._by_producer.values():
            seen = readers.get(reader)
            if seen is None or now - seen.at > FRESH_S:
                continue
            others = [s.rate for r, s in readers.items() if r != reader and now - s.at <= FRESH_S]
            if others:
                mine.append(seen.rate)
                theirs.append(statistics.median(others))
                busy += seen.busy_s
        if not mine:
            return None
        return Compared(statistics.median(mine), statistics.median(theirs), len(mine), busy)

    def seen_by(self, reader: ExecutorId, producer: ExecutorId, now: float) -> float | None:
        """The rate ``reader`` gets from ``producer``, if it measured it lately."""
        seen = self._by_producer.get(producer, {}).get(reader)
        return seen.rate if seen is not None and now - seen.at <= FRESH_S else None

    def outbound(
        self, producer: ExecutorId, now: float, besides: ExecutorId | None = None
    ) -> float | None:
        """The median rate readers other than ``besides`` get from ``producer``."""
        rates = [
            s.rate
            for r, s in self._by_producer.get(producer, {}).items()
            if r != besides and now - s.at <= FRESH_S
        ]
        return statistics.median(rates) if rates else None

    def forget(self, producer: ExecutorId) -> None:
        """Drop what every reader measured from ``producer`` (a link on trial
        is judged by its fetches from then on: ``state_link_marks``)."""
        self._by_producer.pop(producer, None)
        self._probes.pop(producer, None)

    def producers(self, now: float) -> list[ExecutorId]:
        """Producers measured within ``FRESH_S``; older measurements are
        dropped (a lost executor's among them)."""
        for producer, readers in list(self._by_producer.items()):
            for reader, seen in list(readers.items()):
                if now - seen.at > FRESH_S:
                    del readers[reader]
            if not readers:
                del self._by_producer[producer]
        for producer, by in list(self._probes.items()):
            for reader, kept in list(by.items()):
                if not kept or now - kept[-1].at > FRESH_S:
                    del by[reader]
            if not by:
                del self._probes[producer]
        return list(self._by_producer)


@dataclass(frozen=True)
class SlowLink:
    """A job to stop reading a slow producer, and the estimates that say so."""

    job: JobRecord
    producer: ExecutorId
    rate: float
    """Bytes per second a reader gets from ``producer``."""
    fast_rate: float
    """... from the other producers (their median)."""
    slow_s: float
    fast_s: float
    bytes: int
    """The job's bytes left to read from ``producer``."""

    def why(self) -> str:
        return (
            f"its link is slow: readers of job {self.job.id} get "
            f"{self.rate / 1e6:.2f} MB/s from it against {self.fast_rate / 1e6:.2f} MB/s "
            f"from the others; {self.bytes / 1e6:.1f} MB left to read from it would take "
            f"about {self.slow_s:.1f} s, making its outputs again elsewhere about "
            f"{self.fast_s:.1f} s"
        )


def _reading_share(rec: StageRecord) -> float:
    """How much of its input a stage has left to read: its pending tasks whole,
    its running ones half."""
    total = len(rec.tasks)
    if not total:
        return 0.0
    running = len(rec.running)
    pending = total - rec.done - running
    return (pending + 0.5 * running) / total


def _bytes_to_read(job: JobRecord, holder: ExecutorId | None) -> int:
    """Bytes the job's unfinished stages have left to read from ``holder``'s
    outputs (from every executor's with ``None``)."""
    left = 0.0
    for rec in job.stages.values():
        if rec.complete:
            continue
        share = _reading_share(rec)
        remaining = len(rec.tasks) - rec.done
        for i in rec.stage.inputs:
            upstream = job.stages[i.stage]
            held = (
                sum(h.bytes for h in upstream.done_on.values())
                if holder is None
                else (h.bytes if (h := upstream.done_on.get(holder)) is not None else 0)
            )
            # A task reading ALL of an input reads every byte of it.
            left += held * (remaining if i.mode is InputMode.ALL else share)
    return int(left)


def _recompute_s(job: JobRecord, producer: ExecutorId, slots: int) -> float | None:
    """How long making ``producer``'s outputs again would take on ``slots``
    slots: the stages whose outputs there the job needs, and their own inputs
    there (``Recovery`` walks them so), each in waves of its median task time.
    ``None`` when a stage has no run time to go by."""
    needed: set[StageId] = set(job.needed_stages())
    todo = [s for s in needed if producer in job.stages[s].done_on]
    seen: set[StageId] = set()
    total = 0.0
    while todo:
        sid = todo.pop()
        if sid in seen:
            continue
        seen.add(sid)
        rec = job.stages[sid]
        held = rec.done_on.get(producer)
        if held is None:
            continue
        if not rec.durations:
            return None
        total += math.ceil(len(held) / slots) * rec.median_duration()
        todo.extend(u for u in rec.stage.upstream if producer in job.stages[u].done_on)
    return total


def unfit_readers(executors: Iterable[ExecutorRecord], now: float) -> set[ExecutorId]:
    """The readers whose rates mark no producer's link for the cluster
    (``state_link_marks``; ``LinkRates.compare``): behind a slow link of their own
    (marked or on trial), or whose own link failed lately (suspected or
    quarantined now, or a long silence within ``state_liveness.FLAP_WINDOW_S``).
    A flapping reader reads one peer across a cut and the next between two, and
    finds the first slow: the lab's flapping host marked a healthy peer that way,
    which then took no task of any job for 20 s."""
    return {
        r.id
        for r in executors
        if r.link is not None
        or r.suspected_since is not None
        or r.quarantined_until is not None
        or any(now - t < FLAP_WINDOW_S for t in r.gaps)
    }


def slow_links(
    jobs: Iterable[JobRecord],
    rates: LinkRates,
    executors: Sequence[ExecutorRecord],
    now: float,
    ratio: float,
) -> list[SlowLink]:
    """The jobs to stop reading a slow producer, and which (see the module
    docstring): at most one producer per job and call, the one whose leaving
    saves the most. ``ratio``: ``Limits.slow_link_ratio``."""
    # Heard from within ``HEARD_S``: a silent one is the failure detector's. A
    # producer marked slow for new tasks (``state_link_marks``) is still judged:
    # a job that reads it gains as much by leaving it; its slots count for none.
    trusted = {
        r.id: r for r in executors if r.would_take_tasks and now - r.last_heartbeat <= HEARD_S
    }
    # A reader whose own link is marked slow judges no one (``LinkRates.compare``).
    # One whose link failed lately still does here, unlike for the cluster's marks
    # (``unfit_readers``): the verdict ends with the job, and leaving both rules
    # deaf to it was not shown better on the lab's flapping link (worst q9 2.7-4.8x
    # healthy in four runs, 2.4-3.8x as before in six; benchmarks/results/
    # 2026-12-06-1052e96-gray-failures-flapping-readers.md).
    behind = {r.id for r in executors if r.link is not None}
    measured = {
        p: m for p in rates.producers(now) if (m := rates.compare(p, now, behind)) is not None
    }
    found: list[SlowLink] = []
    for job in jobs:
        if job.state is not JobState.RUNNING or job.commit is not None:
            continue
        best: SlowLink | None = None
        for producer, compared in measured.items():
            rate, fast, readers = compared.rate, compared.others, compared.readers
            if compared.busy_s < MIN_EVIDENCE_S or rate <= 0:
                # Nothing received over a busy second: a frozen or cut-off
                # peer in its last heard second, the failure detector's.
                continue
            if producer in job.excluded or producer not in trusted:
                continue
            if rate * ratio > fast or not job.readers_of({producer}):
                continue
            slots = sum(
                r.info.slots
                for e, r in trusted.items()
                if e != producer and e not in job.excluded and r.takes_tasks
            )
            if slots <= 0:
                continue  # never the job's last executor
            recompute = _recompute_s(job, producer, slots)
            if recompute is None:
                continue
            left = _bytes_to_read(job, producer)
            slow_s = left / (rate * readers)
            fast_s = recompute + _bytes_to_read(job, None) / (fast * readers)
            if slow_s - fast_s < max(MIN_SAVING_S, 0.5 * fast_s):
                continue
            if best is None or slow_s - fast_s > best.slow_s - best.fast_s:
                best = SlowLink(job, producer, rate, fast, slow_s, fast_s, left)
        if best is not None:
            found.append(best)
    return found


@dataclass(frozen=True)
class SlowReader:
    """A running attempt to copy: its executor's own link is slow, and a copy
    on a fast executor would read its inputs sooner than it will."""

    job: JobRecord
    stage: StageRecord
    task: TaskRecord
    running: Running
    left_s: float
    """About how long it still needs to read its inputs at its executor's rates."""
    copy_s: float
    """About how long a copy elsewhere would take to read them all."""


def _input_bytes(job: JobRecord, rec: StageRecord, task: TaskRecord) -> dict[ExecutorId, int]:
    """Bytes ``task`` reads from each executor's outputs (its stage is runnable:
    every upstream task is done)."""
    partitions = rec.partitions_of(task.id.partition)
    by: dict[ExecutorId, int] = {}
    for i in rec.stage.inputs:
        for t in job.stages[i.stage].tasks:
            if isinstance(t.state, Done):
                for loc in t.state.outputs:
                    if i.mode is InputMode.ALL or loc.partition in partitions:
                        by[loc.executor] = by.get(loc.executor, 0) + loc.bytes
    return by


def slow_readers(
    jobs: Iterable[JobRecord],
    rates: LinkRates,
    executors: Sequence[ExecutorRecord],
    now: float,
    ratio: float,
) -> list[SlowReader]:
    """Running attempts without a copy, on an executor whose readers get every
    producer under ``1 / ratio`` of what the others' readers get
    (``LinkRates.compare_reader``: its own link is slow), that a copy elsewhere
    would finish reading sooner, by ``MIN_SAVING_S`` and half the copy's time;
    the biggest saving first.

    The attempt's time to read is its inputs' bytes from each producer at the
    rate its executor gets from that one, less the time it has run; the copy's,
    the same bytes at the rate the other readers get (its own executor's files
    too, which the copy fetches). What the estimate leaves out (the copy's
    compute, the attempt's own progress past its inputs) the margin covers.
    """
    found: list[SlowReader] = []
    slow: dict[ExecutorId, Compared] = {}
    for r in executors:
        if now - r.last_heartbeat > HEARD_S:
            continue
        compared = rates.compare_reader(r.id, now)
        if (
            compared is not None
            and compared.rate * ratio <= compared.others
            and compared.busy_s >= MIN_EVIDENCE_S
        ):
            slow[r.id] = compared
    if not slow:
        return found
    for job in jobs:
        if job.state is not JobState.RUNNING or job.commit is not None:
            continue
        for rec in job.stages.values():
            if not rec.running or not rec.stage.inputs:
                continue
            for task in rec.running_tasks():
                running = task.state
                if not isinstance(running, Running) or task.speculative is not None:
                    continue
                reader = slow.get(running.executor)
                if reader is None:
                    continue
                inputs = _input_bytes(job, rec, task)
                left_s = copy_s = 0.0
                for producer, nbytes in inputs.items():
                    if producer != running.executor:
                        mine = rates.seen_by(running.executor, producer, now) or reader.rate
                        left_s += nbytes / mine if mine > 0 else math.inf
                    theirs = rates.outbound(producer, now, besides=running.executor)
                    fast = theirs or reader.others
                    # Nothing received from a producer by anyone: a stall, the
                    # failure detector's; a copy would wait on it as well.
                    copy_s += nbytes / fast if fast > 0 else math.inf
                if math.isinf(copy_s):
                    continue
                left_s -= now - running.started
                if left_s - copy_s >= max(MIN_SAVING_S, 0.5 * copy_s):
                    found.append(SlowReader(job, rec, task, running, left_s, copy_s))
    return sorted(found, key=lambda s: s.copy_s - s.left_s)


class LinkRelief:
    """The slow-link rule of ``SchedulerState``; see the module docstring."""

    limits: Limits
    _executors: ExecutorRegistry
    _jobs: dict[JobId, JobRecord]
    _links: LinkRates

    if TYPE_CHECKING:

        def _exclude(self, job: JobRecord, executor: ExecutorId, why: str, step: Step) -> None: ...

        def _copyable(self, job: JobRecord, stage: StageRecord) -> bool: ...

        def _launch_copy(
            self,
            job: JobRecord,
            stage: StageRecord,
            task: TaskRecord,
            executor: ExecutorId,
            step: Step,
        ) -> None: ...

    def _relieve_slow_links(self, step: Step) -> None:
        """On a ``Tick``: each job reading a slow producer whose outputs are
        sooner made again elsewhere stops using it (``slow_links``)."""
        ratio = self.limits.slow_link_ratio
        if not self.limits.speculation or not ratio or not self._jobs:
            return
        for slow in slow_links(
            self._jobs.values(), self._links, self._executors.live_records(), step.now, ratio
        ):
            why = slow.why()
            self._exclude(slow.job, slow.producer, why, step)
            step.commands.append(
                LogExecutorHealth(step.cause, HealthChange.SLOW_LINK, slow.producer, why)
            )

    def _copy_slow_readers(self, step: Step) -> None:
        """On a ``Tick``, after ``_speculate``: each attempt ``slow_readers``
        finds gets one copy on the least loaded executor with a free slot
        that is neither its own nor behind a slow link (nor one the job
        excludes); the first to finish wins, as for any copy."""
        ratio = self.limits.slow_link_ratio
        if not self.limits.speculation or not ratio or not self._jobs:
            return
        live = self._executors.live_records()
        found = slow_readers(self._jobs.values(), self._links, live, step.now, ratio)
        if not found:
            return
        slow = {s.running.executor for s in found}
        copied: dict[ExecutorId, list[str]] = {}
        for s in found:
            if not self._copyable(s.job, s.stage):
                continue
            target = self._executors.least_loaded(s.job.excluded | slow)
            if target is None:
                break
            self._launch_copy(s.job, s.stage, s.task, target.id, step)
            copied.setdefault(s.running.executor, []).append(
                f"{s.running.attempt} to {target.id} (about {s.left_s:.1f} s left to read "
                f"there, {s.copy_s:.1f} s for a copy)"
            )
        for executor, which in copied.items():
            why = f"its own link is slow: copied {len(which)} reader(s): {'; '.join(which)}"
            step.commands.append(
                LogExecutorHealth(step.cause, HealthChange.SLOW_LINK, executor, why)
            )
