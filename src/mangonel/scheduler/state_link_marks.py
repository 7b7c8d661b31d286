"""Slow-link marks: an executor its readers found behind a slow link gets no
new task of any job for a while, then is tried again (a circuit breaker).

The rules of ``state_links`` act within one job: the job that finds a slow
producer stops reading it, at the price of making its outputs again. Without
a memory, every job after it would place tasks there again, find it slow
again, and pay again. So the verdict is kept for the cluster
(``ExecutorRecord.link``)::

                 its readers get under 1/R of the others' rate
    trusted ─────────────────────────────────────────────────▶ marked
       ▲         (the same evidence the job rule acts on)     (no new task
       │                                                      of any job)
       │ on trial, its readers get it as fast                    │
       │ as the others, or not slow for a back-off               │ its back-off
       │                                                         │ is over
       └──────────────────────── on trial ◀──────────────────────┘
                                 (takes tasks again)
                                     │ its readers get it slowly again:
                                     └─▶ marked, the back-off doubled

* **Marked** (``LinkMarked``, the breaker open): its link probes find it
  slow (see below), or the same comparison as the job rule
  (``LinkRates.compare``: its readers get under
  ``1 / Limits.slow_link_ratio`` of what they get from the others, after
  ``MIN_EVIDENCE_S`` of reading, and it was heard from within ``HEARD_S``; and
  they received something: a peer that sends nothing is frozen or cut off,
  the failure detector's case), but
  whether or not a job gains by leaving it. It takes no new task of any job
  (``ExecutorRecord.takes_tasks``) for ``Limits.slow_link_backoff_s`` (20 s),
  doubled for each mark in a row, up to ``SLOW_LINK_BACKOFF_CAP`` times. It
  keeps its running attempts and serves its outputs; it is not lost, not
  quarantined, and a job that reads it is still relieved by ``state_links``.
  Never the last executor that takes tasks: not marked when no other would
  take one, and the marks are ignored (``ExecutorRegistry.marks_hold``) while
  that is so (the others lost, distrusted or excluded since).
* **On trial** (``LinkOnTrial``, half open): the back-off is over; it takes
  tasks again, and what its readers measured before is forgotten
  (``LinkRates.forget``), so the fetches of its next outputs decide: slow
  again, it is marked again for twice as long; as fast as the others (with
  ``MIN_EVIDENCE_S`` of reading, or by its probes), or not found slow for as
  long as its last back-off lasted, it is trusted, and its next mark starts
  from the first back-off. With probes a trial is decided by them within a
  few intervals, before a job need cross the link; without, it costs at most
  the job that finds the link still slow, once per back-off.

**Probes** (``executor.probes``, judged by ``LinkRates.probed``): each
executor times small synthetic fetches from a few peers every
``--link-probe-interval``, and from every peer marked or on trial
(``state_probes``), so a link that became slow is marked before a job places
work behind it, and a trial is decided by probes within a few intervals
rather than by a job's luck in reading enough from it. The fetches overrule
the probes: where a producer's readers read ``MIN_EVIDENCE_S`` from it, they
alone judge it; else its probes, by rules of their own against noise
(``state_links``, "Probes").

Memory only, like exclusions: a restarted scheduler trusts every link again,
and marks a slow one again after a few probes (or one job's reading).

>>> backoff_s(1, 20.0), backoff_s(2, 20.0), backoff_s(9, 20.0)
(20.0, 40.0, 160.0)
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mangonel import defaults
from mangonel.ids import ExecutorId
from mangonel.scheduler.events import HealthChange, Limits, LogExecutorHealth
from mangonel.scheduler.state_executors import (
    ExecutorRecord,
    ExecutorRegistry,
    LinkMarked,
    LinkOnTrial,
)
from mangonel.scheduler.state_links import (
    HEARD_S,
    MIN_EVIDENCE_S,
    Compared,
    LinkRates,
    unfit_readers,
)

if TYPE_CHECKING:
    from mangonel.scheduler.state_recovery import Step

__all__ = ["LinkMarks", "LinkVerdict", "backoff_s", "judge_links"]


def backoff_s(marks: int, base_s: float) -> float:
    """How long the ``marks``-th mark in a row lasts: ``base_s`` doubled for
    each mark before it, at most ``defaults.SLOW_LINK_BACKOFF_CAP`` times ``base_s``."""
    cap = defaults.SLOW_LINK_BACKOFF_CAP
    return base_s * min(2 ** min(marks - 1, cap.bit_length()), cap)


@dataclass(frozen=True)
class LinkVerdict:
    """A change of one executor's link mark, and why (for the log)."""

    executor: ExecutorRecord
    change: HealthChange
    link: LinkMarked | LinkOnTrial | None
    why: str


def judge_links(
    registry: ExecutorRegistry, rates: LinkRates, now: float, limits: Limits
) -> list[LinkVerdict]:
    """The marks that change at ``now``: back-offs over (on trial), links found
    slow (marked) and trials found fast (trusted). Pure: the caller applies them.

    A reader behind a slow link of its own may read one peer more slowly than
    another (a rate limiter lets small files through in a burst): readers
    marked or on trial judge no one, and the slowest of the links found slow
    now is marked first, its readers then set aside for the others, so a
    slowed host marks itself, not the peers it read badly. Nor do readers
    whose own link failed lately (``state_links.unfit_readers``): a job's own
    rule still hears those, for that job only.
    """
    ratio = limits.slow_link_ratio
    found: list[LinkVerdict] = []
    live = registry.live_records()
    behind = unfit_readers(live, now)
    judged: list[tuple[float, ExecutorRecord]] = []
    for rec in live:
        link = rec.link
        if isinstance(link, LinkMarked):
            if now >= link.until:
                why = (
                    f"its back-off of {link.until - link.since:.0f} s is over: it takes tasks "
                    f"again, and its next fetches decide (marked for: {link.why})"
                )
                trial = LinkOnTrial(now, link.marks, link.why)
                found.append(LinkVerdict(rec, HealthChange.LINK_ON_TRIAL, trial, why))
            continue
        if isinstance(link, LinkOnTrial):
            served = backoff_s(link.marks, limits.slow_link_backoff_s)
            if now - link.since >= served:
                why = (
                    f"on trial for {now - link.since:.0f} s, as long as its last back-off, "
                    f"and not found slow"
                )
                found.append(LinkVerdict(rec, HealthChange.LINK_HEALED, None, why))
                continue
        if not rec.would_take_tasks or now - rec.last_heartbeat > HEARD_S:
            continue  # a silent one is the failure detector's (``state_links.HEARD_S``)
        judging = _judge(rates, rec.id, now, behind, ratio)
        if judging is not None:
            judged.append((judging.rate / judging.others, rec))
    marking: set[ExecutorId] = set()
    for _, rec in sorted(judged, key=lambda j: j[0]):
        link = rec.link
        judging = _judge(rates, rec.id, now, behind | marking, ratio)
        if judging is None:
            continue
        rate, fast = judging.rate / 1e6, judging.others / 1e6
        if judging.slow:
            others = any(
                r is not rec
                and r.would_take_tasks
                and type(r.link) is not LinkMarked
                and r.id not in marking
                for r in live
            )
            if not others:
                continue  # never the last executor that takes tasks
            marks = link.marks + 1 if isinstance(link, LinkOnTrial) else 1
            wait = backoff_s(marks, limits.slow_link_backoff_s)
            what = (
                f"{judging.who} get {rate:.2f} MB/s from it against {fast:.2f} MB/s from "
                f"the others ({judging.amount})"
            )
            why = f"{what}: no new task of any job for {wait:.0f} s (mark {marks} in a row)"
            marking.add(rec.id)
            mark = LinkMarked(now, now + wait, marks, what)
            found.append(LinkVerdict(rec, HealthChange.LINK_MARKED, mark, why))
        elif isinstance(link, LinkOnTrial):
            why = (
                f"on trial for {now - link.since:.1f} s, {judging.who} get {rate:.2f} MB/s "
                f"from it against {fast:.2f} MB/s from the others ({judging.amount})"
            )
            found.append(LinkVerdict(rec, HealthChange.LINK_HEALED, None, why))
    return found


@dataclass(frozen=True)
class _Judged:
    """A producer's link as the fetches, or else the probes, found it."""

    rate: float
    others: float
    slow: bool
    who: str
    """Who measured it, for the log: its readers' fetches, or their probes."""
    amount: str
    """How much they measured."""


def _judge(
    rates: LinkRates,
    producer: ExecutorId,
    now: float,
    ignoring: AbstractSet[ExecutorId],
    ratio: float,
) -> _Judged | None:
    """``producer``'s link found slow or not: by its readers' fetches when they
    read ``MIN_EVIDENCE_S`` from it (they overrule the probes: a link busy with
    jobs' bytes is judged by what the jobs get), else by their probes
    (``LinkRates.probed``, with their own rules against noise); ``None``
    when neither says enough."""
    compared = _evidence(rates, producer, now, ignoring)
    if compared is not None:
        return _Judged(
            compared.rate,
            compared.others,
            compared.rate * ratio <= compared.others,
            "its readers",
            f"{compared.readers} reader(s), {compared.busy_s:.1f} s of reading",
        )
    probed = rates.probed(producer, now, ignoring)
    if probed is None or probed.rate <= 0 or probed.others <= 0:
        return None
    return _Judged(
        probed.rate,
        probed.others,
        probed.slow(ratio),
        "its readers' link probes",
        f"{probed.readers} reader(s), {probed.probes} probes, the best of "
        f"{probed.best_s * 1000:.0f} ms",
    )


def _evidence(
    rates: LinkRates, producer: ExecutorId, now: float, ignoring: AbstractSet[ExecutorId]
) -> Compared | None:
    """``producer``'s rate against the others', when there is enough to judge
    by: ``MIN_EVIDENCE_S`` of reading, and something received (a peer that
    sends nothing is frozen or cut off, which the failure detector judges
    within a second or two; a slow link delivers something)."""
    compared = rates.compare(producer, now, ignoring)
    if compared is None or compared.busy_s < MIN_EVIDENCE_S:
        return None
    if compared.rate <= 0 or compared.others <= 0:
        return None
    return compared


class LinkMarks:
    """The slow-link marks of ``SchedulerState``; see the module docstring."""

    limits: Limits
    _executors: ExecutorRegistry
    _links: LinkRates

    def _mark_slow_links(self, step: Step) -> None:
        """On a ``Tick``, after the job rule (``_relieve_slow_links``): mark,
        try again and trust executors' links (``judge_links``), each change logged."""
        limits = self.limits
        if not limits.speculation or not limits.slow_link_ratio:
            return
        for verdict in judge_links(self._executors, self._links, step.now, limits):
            rec = verdict.executor
            if verdict.change is HealthChange.LINK_ON_TRIAL:
                # Only the fetches from now on judge it: not what was measured
                # before its mark, nor by the readers that finished during it.
                self._links.forget(rec.id)
            self._executors.set_link(rec, verdict.link)
            step.commands.append(LogExecutorHealth(step.cause, verdict.change, rec.id, verdict.why))
