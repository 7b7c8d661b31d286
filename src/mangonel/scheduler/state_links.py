"""Slow links: each executor's outbound rate, as its readers measure it, and the
rule that stops a job reading a slow one when making its outputs again on the
fast executors finishes sooner.

A gray failure the detector cannot see: an executor whose link is slow (a
congested or throttled port) still heartbeats, and a fetch from it keeps
receiving bytes, so nothing fails; but every reader of its outputs waits on it,
and the query runs at the speed of that one link. Speculation by run time does
not help: a copy of the reader fetches over the same link.

**Measured rates** (``LinkRates``): each executor's heartbeat carries, per
peer, the bytes its Flight fetches received and the seconds at least one fetch
from that peer was open (``task.LinkSample``, ``executor.peer_rates``). Per
producer, the scheduler keeps a moving average of the rate each reader gets
(half weight to the newest sample), forgetting a reader not heard about for
``FRESH_S``. A producer's rate is the median over its readers; the *fast* rate
the median over the other producers'.

**The rule** (``slow_links``, on ``Tick``, with ``--speculation``): for a
running job whose readers fetch from a producer ``p`` whose rate is under
``1 / SLOW_RATIO`` of the fast rate, with ``k`` readers measuring it:

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

>>> from mangonel.task import LinkSample
>>> rates = LinkRates()
>>> rates.observe(ExecutorId("r"), (LinkSample(ExecutorId("p"), 2_500_000, 1.0),), now=0.0)
>>> rates.rate(ExecutorId("p"), now=1.0)
(2500000.0, 1)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mangonel.ids import ExecutorId, JobId, StageId
from mangonel.scheduler.events import HealthChange, Limits, LogExecutorHealth
from mangonel.scheduler.state_executors import ExecutorRecord, ExecutorRegistry
from mangonel.scheduler.state_jobs import JobRecord, StageRecord
from mangonel.scheduler.state_recovery import Step
from mangonel.scheduler.state_views import JobState
from mangonel.task import InputMode, LinkSample

__all__ = ["FRESH_S", "LinkRates", "LinkRelief", "SlowLink", "slow_links"]

FRESH_S = 10.0
"""A reader's rate from a producer counts for this long after its last sample:
samples come only while it reads from it."""
MIN_BUSY_S = 0.05
"""A sample of less busy time says more about a call's latency than the link."""
RATE_WEIGHT = 0.5
"""Weight of the newest sample in a reader's moving average of a producer's rate."""
SLOW_RATIO = 3.0
"""A producer is slow when the others are at least this many times faster."""
MIN_SAVING_S = 1.0
"""The rule acts only to save at least this much (estimates are rough)."""


@dataclass
class _Seen:
    rate: float
    at: float


@dataclass
class LinkRates:
    """Per producer, the rate each reader gets from it (a moving average), and
    when it was last measured. Pure: the time arrives with each call."""

    _by_producer: dict[ExecutorId, dict[ExecutorId, _Seen]] = field(default_factory=dict)

    def observe(self, reader: ExecutorId, samples: Iterable[LinkSample], now: float) -> None:
        """``reader``'s heartbeat said what its fetches received from each peer."""
        for s in samples:
            if s.peer == reader or s.busy_s < MIN_BUSY_S or s.bytes <= 0:
                continue
            readers = self._by_producer.setdefault(s.peer, {})
            seen = readers.get(reader)
            if seen is None or now - seen.at > FRESH_S:
                readers[reader] = _Seen(s.rate, now)
            else:
                seen.rate = (1 - RATE_WEIGHT) * seen.rate + RATE_WEIGHT * s.rate
                seen.at = now

    def rate(self, producer: ExecutorId, now: float) -> tuple[float, int] | None:
        """The median rate ``producer``'s fresh readers get, and how many they
        are; ``None`` when none measured it within ``FRESH_S``."""
        readers = self._by_producer.get(producer)
        if not readers:
            return None
        fresh = [s.rate for s in readers.values() if now - s.at <= FRESH_S]
        if not fresh:
            return None
        return statistics.median(fresh), len(fresh)

    def producers(self, now: float) -> list[ExecutorId]:
        """Producers measured within ``FRESH_S``; older measurements are
        dropped (a lost executor's among them)."""
        for producer, readers in list(self._by_producer.items()):
            for reader, seen in list(readers.items()):
                if now - seen.at > FRESH_S:
                    del readers[reader]
            if not readers:
                del self._by_producer[producer]
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


def slow_links(
    jobs: Iterable[JobRecord],
    rates: LinkRates,
    executors: Sequence[ExecutorRecord],
    now: float,
) -> list[SlowLink]:
    """The jobs to stop reading a slow producer, and which (see the module
    docstring): at most one producer per job and call, the slowest."""
    trusted = {r.id: r for r in executors if r.takes_tasks}
    measured = {p: m for p in rates.producers(now) if (m := rates.rate(p, now)) is not None}
    found: list[SlowLink] = []
    if len(measured) < 2:
        return found
    for job in jobs:
        if job.state is not JobState.RUNNING or job.commit is not None:
            continue
        best: SlowLink | None = None
        for producer, (rate, readers) in measured.items():
            if producer in job.excluded or producer not in trusted:
                continue
            others = [m[0] for p, m in measured.items() if p != producer]
            fast = statistics.median(others)
            if rate * SLOW_RATIO > fast or not job.readers_of({producer}):
                continue
            slots = sum(
                r.info.slots for e, r in trusted.items() if e != producer and e not in job.excluded
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


class LinkRelief:
    """The slow-link rule of ``SchedulerState``; see the module docstring."""

    limits: Limits
    _executors: ExecutorRegistry
    _jobs: dict[JobId, JobRecord]
    _links: LinkRates

    if TYPE_CHECKING:

        def _exclude(self, job: JobRecord, executor: ExecutorId, why: str, step: Step) -> None: ...

    def _relieve_slow_links(self, step: Step) -> None:
        """On a ``Tick``: each job reading a slow producer whose outputs are
        sooner made again elsewhere stops using it (``slow_links``)."""
        if not self.limits.speculation or not self._jobs:
            return
        for slow in slow_links(
            self._jobs.values(), self._links, self._executors.live_records(), step.now
        ):
            why = slow.why()
            self._exclude(slow.job, slow.producer, why, step)
            step.commands.append(
                LogExecutorHealth(step.cause, HealthChange.SLOW_LINK, slow.producer, why)
            )
