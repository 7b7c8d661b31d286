"""Whether the scheduler still counts on an executor: suspicion, quarantine, loss.

Pure rules over the executor registry that ``SchedulerState`` applies on each
``Tick`` (time arrives on the event). Silence is judged by the phi accrual
detector (``scheduler.detector``), fed by each executor's heartbeats::

      ALIVE (trusted) ── phi >= suspect_phi, ──▶ suspected ── silence past the ──▶ LOST
         ▲   ▲           hedge() or a relapse      │        heartbeat timeout
         │   └────── heard from again ─────────────┘        (evidence logged)
         │
         │   FLAP_GAPS long silences within FLAP_WINDOW_S (suspected or not)
         │                        ▼
         └── QUARANTINE_S after ── quarantined ── silence past twice the ──▶ LOST
             its last long silence                heartbeat timeout

* **Suspected**: it gets no new task at once (``ExecutorRecord.free_slots``),
  and the attempts it runs are copied onto trusted executors
  (``state_gray.stragglers``), so a query does not wait for the loss; the
  outputs of it that jobs need are made again while a trusted slot is free
  for them, or held by a reader of them
  (``state_recovery.Recovery._recompute_suspected``; not while the scheduler
  is isolated, nor for one silent since before an isolation ended), and are
  its again if it is heard first. A word from it (a heartbeat, a report)
  clears the suspicion. Work waiting on a silent executor makes it suspected
  sooner (``hedge``): once the silence has cost as long as redoing the work.
  So does a *relapse*: an executor that falls silent again within
  ``FLAP_WINDOW_S`` of a long silence is suspected after ``relapse_bar``
  (2.5 beats), not the late bar nor phi: its link was just down, so a new
  silence is likelier a cut than a delay, and a suspicion costs copies, never
  a loss.
* **Lost** only if the silence lasts: ``Limits.heartbeat_timeout_s``.
* **Quarantined**: a host whose link flaps falls silent again and again; lost
  and registered anew each time, it would throw its outputs away with every
  flap. The detector learns to tolerate its silences (they widen its
  distribution), so flaps are counted apart, against a fixed bar: a *long
  silence* is a gap between two heartbeats that a regular executor would have
  been suspected for (``ExecutorRegistry.long_gap_s``, kept in
  ``ExecutorRecord.gaps``), or one of a few beats that its failed heartbeats
  or a suspicion vouch for (``ExecutorRegistry.heard_from``). Quarantined, it
  takes no task but stays alive, so its outputs are still served and fetched
  whenever it is reachable; it is lost only after twice the
  heartbeat timeout of silence. Never the last trusted executor: with no other
  to run tasks, a flapping one is better than none.
* **Lagging**: its heartbeats arrive, but say it runs fewer attempts than
  were launched on it ``STREAM_LAG_S`` before, twice in a row
  (``observe_running``): the command stream is stuck behind a cut. No new task
  (anything sent would wait too), its running attempts copied, as for a
  suspected one; a heartbeat that counts them all ends it.
* **Isolated**: when at least ``ISOLATION_SHARE`` of the live executors (two
  or more) are suspected at once, the likeliest fault is the scheduler's own
  link, not that many deaths at the same moment. Losses for silence then wait
  ``Limits.isolation_grace_s`` longer, so that when the link returns the
  executors go on with their outputs instead of all being made again. A
  broken stream (a process that died) is still a loss at once, and an
  isolation that lasts past the grace ends in the losses a death would have
  caused: slower, never wrong.

Executors awaited after a scheduler restart, or revived after a false loss
(``state_revival``), are judged by the plain timeout until their stream opens:
they have no heartbeat history in this life of the scheduler, or a silence in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mangonel.ids import ExecutorId
from mangonel.scheduler.detector import ArrivalWindow
from mangonel.scheduler.events import Limits
from mangonel.scheduler.state_executors import ExecutorRecord, ExecutorRegistry
from mangonel.scheduler.state_views import ExecutorState

__all__ = [
    "STREAM_LAG_S",
    "FLAP_GAPS",
    "FLAP_WINDOW_S",
    "ISOLATION_SHARE",
    "QUARANTINE_LOSS_FACTOR",
    "QUARANTINE_S",
    "Judgement",
    "judge",
    "hedge",
    "late_bar",
    "late_beats",
    "relapse_bar",
    "observe_running",
]

FLAP_GAPS = 3
"""Long silences within ``FLAP_WINDOW_S`` that quarantine an executor."""

FLAP_WINDOW_S = 20.0
"""Seconds over which an executor's long silences are counted: a link cut every
few seconds shows three in it, a runtime that pauses 2 s every 10 s (and
another beat late) does not."""

QUARANTINE_S = 60.0
"""A quarantine ends this long after the executor's last long silence."""

QUARANTINE_LOSS_FACTOR = 2.0
"""A quarantined executor is lost after this many heartbeat timeouts of silence:
it runs nothing, so waiting costs only its outputs' readers, and its silences
have so far always ended."""

STREAM_LAG_S = 1.0
"""An attempt launched this long ago that the executor's heartbeat does not
count is held up on the way: two such heartbeats in a row make it *lagging*.
Commands go down the executor's one command stream, and after a cut bytes sent
into it wait for TCP's next retry, whose wait doubles (seconds after a cut of
a few; a flapping link's cuts can catch every retry, up to the stream's 20 s
keepalive). Its heartbeats, on a connection renewed after each failure
(``executor.link``), still arrive. Long enough for a busy executor to take a
launch off its stream; two beats, so that a task's report still on its way
when the heartbeat arrives (another connection) does not count."""

LATE_BEATS = 3
"""An executor silent for this many heartbeat intervals (and at least
``LATE_FLOOR_S``) gets no speculative copy (``late_beats``)."""

LATE_FLOOR_S = 0.5

RELAPSE_BEATS = 2.5
"""An executor with a long silence in its last ``FLAP_WINDOW_S`` is suspected
after this many heartbeat intervals of a new silence (``relapse_bar``), and at
least ``RELAPSE_FLOOR_S``: more than one beat missed, with half a beat for
jitter (a saturated CPU that delays a beat now and then suspects no one)."""

RELAPSE_FLOOR_S = 0.25

RELAPSE_HEARD_BEATS = 2
"""A relapse needs most other executors heard this many heartbeat intervals
after the silent one's last beat: a cut of the scheduler's own link silences
everyone within a beat of each other. (The hedge asks for a whole late bar,
0.5 s: an executor with no long silence has no record of cuts, and its beat
may simply lag before a cut of the scheduler.)"""

ISOLATION_SHARE = 0.75
"""Share of the live executors (at least two) suspected at once that makes the
scheduler take itself for the one cut off."""


@dataclass
class Judgement:
    """What one ``Tick`` found."""

    suspected: list[ExecutorRecord] = field(default_factory=list)
    """Newly suspected."""
    quarantined: list[ExecutorRecord] = field(default_factory=list)
    """Newly quarantined."""
    lost: list[tuple[ExecutorId, str]] = field(default_factory=list)
    """Lost for silence, each with its evidence."""
    isolated: bool = False
    """Whether the scheduler takes itself for cut off now."""
    isolation_near: bool = False
    """Whether it may be about to: the suspected and those whose beats are late
    (``late_beats``) together reach ``ISOLATION_SHARE``. A cut of the
    scheduler's link reaches the executors' detectors a tick or two apart:
    the first suspected must not have its outputs made again on the others,
    which are as cut (measured: three recomputes launched into the cut 0.25 s
    before the isolation held up the query 1.2 s after the heal)."""
    isolation_began: bool = False
    isolation_ended: bool = False
    relapsed: set[ExecutorId] = field(default_factory=set)
    """Those of ``suspected`` suspected for a relapse (``relapse_bar``)."""


def judge(registry: ExecutorRegistry, now: float, limits: Limits) -> Judgement:
    """Suspect, quarantine and lose executors by their silence at ``now``.

    Marks the records (suspicions, quarantines begun and over, the
    registry's isolation) and returns what changed and whom to lose; the
    caller loses them.
    """
    out = Judgement()
    timeout = limits.heartbeat_timeout_s
    interval_s = registry.heartbeat_interval_s
    judged = [r for r in registry.live_records() if not r.awaiting]
    relapse = relapse_bar(limits)
    for rec in judged:
        if rec.gaps and now - rec.gaps[0] >= FLAP_WINDOW_S:
            rec.gaps = [t for t in rec.gaps if now - t < FLAP_WINDOW_S]
        if rec.quarantined_until is not None:
            if rec.gaps:
                rec.quarantined_until = max(rec.quarantined_until, rec.gaps[-1] + QUARANTINE_S)
            if now >= rec.quarantined_until:
                rec.quarantined_until = None
                rec.quarantine = f"was quarantined: {rec.quarantine}"
        if rec.suspected_since is not None:
            continue
        window = rec.arrivals or ArrivalWindow(interval_s)
        if window.phi(now, rec.last_heartbeat) >= limits.suspect_phi:
            rec.suspected_since = now
            out.suspected.append(rec)
        elif (
            rec.gaps
            and rec.quarantined_until is None  # no task goes to it; its outputs moved
            and not math.isinf(limits.suspect_phi)
            and now - rec.last_heartbeat > relapse
            and _others_heard(judged, rec, rec.last_heartbeat + RELAPSE_HEARD_BEATS * interval_s)
        ):
            rec.suspected_since = now
            out.suspected.append(rec)
            out.relapsed.add(rec.id)
    suspected = sum(1 for r in judged if r.suspected_since is not None)
    share = math.ceil(ISOLATION_SHARE * len(judged))
    out.isolated = len(judged) >= 2 and suspected >= share
    if len(judged) >= 2 and suspected and not out.isolated:
        late = late_beats(judged, now, limits)
        quiet = sum(1 for r in judged if r.suspected_since is not None or r.id in late)
        out.isolation_near = quiet >= share
    if out.isolated and registry.isolated_since is None:
        registry.isolated_since = now
        out.isolation_began = True
    elif not out.isolated and registry.isolated_since is not None:
        registry.isolated_since = None
        registry.isolation_ended = now
        out.isolation_ended = True
    flapping = [r for r in judged if len(r.gaps) >= FLAP_GAPS]
    # Most executors flapping together is the scheduler's own link: quarantine none.
    if flapping and len(flapping) < math.ceil(ISOLATION_SHARE * len(judged)):
        for rec in flapping:
            if rec.quarantined_until is not None:
                continue
            trusted = any(
                r is not rec
                and r.state is ExecutorState.ALIVE
                and r.suspected_since is None
                and r.quarantined_until is None
                for r in judged
            )
            if trusted:
                rec.quarantined_until = rec.gaps[-1] + QUARANTINE_S
                rec.quarantine = (
                    f"its heartbeats stopped {len(rec.gaps)} times in "
                    f"{rec.gaps[-1] - rec.gaps[0]:.0f} s (a flapping link?)"
                )
                out.quarantined.append(rec)
    for rec in registry.live_records():
        silence = now - rec.last_heartbeat
        if rec.awaiting:
            if silence > timeout:
                out.lost.append(
                    (
                        rec.id,
                        f"did not reconnect within {silence:.1f} s ({rec.detail}; the "
                        f"heartbeat timeout is {timeout:g} s)",
                    )
                )
            continue
        factor = QUARANTINE_LOSS_FACTOR if rec.quarantined_until is not None else 1.0
        grace = _isolation_grace(registry, rec, now, limits)
        bound = factor * timeout + grace
        if silence > bound:
            window = rec.arrivals or ArrivalWindow(interval_s)
            detail = (
                f"no heartbeat for {silence:.1f} s (the timeout is {timeout:g} s"
                + (", twice that while quarantined" if factor > 1 else "")
                + (f", {grace:g} s more while most executors were silent at once" if grace else "")
                + f"); evidence: {window.evidence(now, rec.last_heartbeat)}; "
                + f"{len(rec.gaps)} long silence(s) before this one in the last "
                + f"{FLAP_WINDOW_S:g} s"
            )
            out.lost.append((rec.id, detail))
    return out


def _isolation_grace(
    registry: ExecutorRegistry, rec: ExecutorRecord, now: float, limits: Limits
) -> float:
    """How much longer than the timeout ``rec`` may be silent: the isolation
    grace while the scheduler is isolated; once the isolation ended, the
    executors silent since before its end get a whole timeout after it (the
    link heals for them one by one: the first heard must not lose the others
    at once)."""
    grace = limits.isolation_grace_s
    if registry.isolated_since is not None:
        return grace
    ended = registry.isolation_ended
    if ended is None or not registry.silent_since_isolation(rec):
        return 0.0
    # Not capped by the grace: the silence ended within it (else the executor
    # would have been lost meanwhile), and TCP's retries after a long cut may
    # take a second or two more to reach it.
    return max(0.0, ended - rec.last_heartbeat)


def observe_running(
    rec: ExecutorRecord, now: float, reported: int, launched_before: int
) -> bool | None:
    """A heartbeat of ``rec`` counted ``reported`` attempts, while
    ``launched_before`` of those the scheduler placed on it were launched at
    least ``STREAM_LAG_S`` before ``now``: mark it lagging on the second such
    heartbeat in a row, trusted again on one that counts them all. Returns
    ``True`` when it began to lag, ``False`` when it caught up, else ``None``."""
    if launched_before <= reported:
        rec.behind_since = None
        if rec.lagging_since is not None:
            rec.lagging_since = None
            return False
        return None
    if rec.behind_since is None:
        rec.behind_since = now
        return None
    if rec.lagging_since is None:
        rec.lagging_since = now
        return True
    return None


def late_beats(records: Iterable[ExecutorRecord], now: float, limits: Limits) -> set[ExecutorId]:
    """The executors whose heartbeats are late at ``now``: not suspected yet,
    but silent for ``LATE_BEATS`` intervals. A speculative copy goes elsewhere:
    copies are made when attempts straggle, and when the scheduler's own link
    is cut every attempt straggles in its first seconds, before anyone is
    suspected; a copy pushed down a cut executor's command stream then waits
    for TCP's retry after the heal, and the commands behind it too (measured:
    the last stage's launches 1.1 s after the heal)."""
    if math.isinf(limits.suspect_phi):
        return set()  # the failure detector is off: silence says nothing
    bar = late_bar(limits)
    return {r.id for r in records if now - r.last_heartbeat > bar}


def late_bar(limits: Limits) -> float:
    """Seconds of silence after which an executor's heartbeats are late."""
    return max(LATE_FLOOR_S, LATE_BEATS * limits.heartbeat_interval_s)


def hedge(
    registry: ExecutorRegistry, now: float, limits: Limits, waiting: Mapping[ExecutorId, float]
) -> list[ExecutorRecord]:
    """Suspect, before the detector does, a silent executor that work waits on,
    once its silence has cost as long as redoing that work would.

    ``waiting``: executor -> seconds it takes to redo what a job waits on there
    (its running attempts, and its outputs that running readers wait on, each
    as long as it last took; the caller's estimate). Waiting for the executor
    and then redoing the work anyway costs at most twice what redoing it at
    once would have: the rule of ski rental, which waits as long as the work
    costs, then buys. The suspicion that follows copies the attempts and makes
    the outputs again (as any suspicion does), and ends when it is heard.

    Only while its heartbeats are late (``late_bar``; a beat or two missed on a
    busy machine is not silence; an executor not heard beating yet is left to
    the detector) and most of the other executors were heard after that: a cut
    of the scheduler's own link silences everyone at once, and work moved then
    would sit on the others' streams as cut as its own.
    Marks the records and returns them.
    """
    if math.isinf(limits.suspect_phi):
        return []
    bar = late_bar(limits)
    judged = [r for r in registry.live_records() if not r.awaiting]
    out = []
    for rec in judged:
        cost = waiting.get(rec.id)
        if (
            cost is None
            or rec.arrivals is None  # no heartbeat yet: no beat to be late
            or rec.suspected_since is not None
            or rec.quarantined_until is not None
        ):
            continue
        if now - rec.last_heartbeat < max(bar, cost):
            continue
        if not _others_heard(judged, rec, rec.last_heartbeat + bar):
            continue
        rec.suspected_since = now
        out.append(rec)
    return out


def relapse_bar(limits: Limits) -> float:
    """Seconds of silence after which an executor that was silent long within
    ``FLAP_WINDOW_S`` is suspected (``judge``)."""
    return max(RELAPSE_FLOOR_S, RELAPSE_BEATS * limits.heartbeat_interval_s)


def _others_heard(judged: Iterable[ExecutorRecord], rec: ExecutorRecord, since: float) -> bool:
    """Whether most of the executors other than ``rec`` were heard at ``since``
    or later: a cut of the scheduler's own link silences everyone at once, and
    work moved then would sit on the others' streams as cut as ``rec``'s."""
    others = [r for r in judged if r is not rec]
    heard = sum(1 for r in others if r.last_heartbeat >= since)
    return 2 * heard > len(others)
