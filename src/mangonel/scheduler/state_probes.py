"""Link probe targets: which peers each executor is to probe, named in the answer to its heartbeat.

An executor times small fetches from the peers named here (``executor.probes``)
so that the scheduler knows a slow link before a job reads over it
(``state_link_marks``). Bounded cost on a big cluster: each executor probes
every peer marked or on trial (a trial is decided by probes, not by a job's
luck in reading enough from it), and ``defaults.LINK_PROBE_PEERS`` of the
others, in turn: a window over the others in id order that moves on every
``defaults.LINK_PROBE_INTERVAL_S``, starting at a place of the executor's own
(a CRC of its id), so different executors probe different peers at once and
each pair is probed about every ``others / LINK_PROBE_PEERS`` rounds. Pure:
the time comes with the call; no randomness, so a run can be replayed.

>>> _window(["a", "b", "c", "d"], start=3, count=2)
['d', 'a']
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TypeVar

from mangonel import defaults
from mangonel.ids import ExecutorId
from mangonel.scheduler.state_executors import ExecutorRegistry
from mangonel.task import ProbeTarget

__all__ = ["probe_targets"]

T = TypeVar("T")


def probe_targets(
    registry: ExecutorRegistry,
    executor: ExecutorId,
    now: float,
    peers: int = defaults.LINK_PROBE_PEERS,
) -> tuple[ProbeTarget, ...]:
    """The peers ``executor`` is to probe: every live one marked or on trial,
    and ``peers`` of the others in turn; none for an executor not live."""
    if not registry.is_live(executor):
        return ()
    live = [r for r in registry.live_records() if r.id != executor]
    flagged = [r for r in live if r.link is not None]
    rest = sorted((r for r in live if r.link is None), key=lambda r: r.id)
    turn = int(now // defaults.LINK_PROBE_INTERVAL_S)
    start = (zlib.crc32(executor.encode()) + turn) % len(rest) if rest else 0
    chosen = flagged + _window(rest, start, min(peers, len(rest)))
    return tuple(ProbeTarget(r.id, r.info.flight_address) for r in chosen)


def _window(items: Sequence[T], start: int, count: int) -> list[T]:
    """``count`` items from ``start`` on, wrapping around."""
    return [items[(start + i) % len(items)] for i in range(count)]
