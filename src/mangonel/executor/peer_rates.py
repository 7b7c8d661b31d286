"""The rate at which this executor's Flight fetches receive bytes from each peer.

Every slot's ``ShuffleReader`` tells one ``PeerRates`` when a fetch from a peer
opens, each batch it receives, and when it ends; each heartbeat takes what
accumulated since the last (``take``) and sends it to the scheduler as
``LinkSample``s, which estimates each executor's outbound link from them
(``scheduler.state_links``).

A peer counts as *busy* while at least one fetch from it is open: two slots
reading from one peer at once share its link, so their seconds count once and
``bytes / busy_s`` is what the link gave this executor, not half of it.

Thread-safe: the readers' fetch threads and the heartbeat thread call it. The
clock is passed in (``time.monotonic`` by default), so a test drives it.

>>> now = [0.0]
>>> rates = PeerRates(clock=lambda: now[0])
>>> rates.opened(ExecutorId("e2")); rates.opened(ExecutorId("e2"))
>>> rates.received(ExecutorId("e2"), 1000)
>>> now[0] = 2.0
>>> rates.closed(ExecutorId("e2")); rates.received(ExecutorId("e2"), 1000)
>>> now[0] = 3.0
>>> rates.take()
[LinkSample(peer='e2', bytes=2000, busy_s=3.0)]
>>> rates.take()  # nothing open, nothing received since
[]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mangonel.ids import ExecutorId
from mangonel.task import LinkSample

__all__ = ["PeerRates"]


@dataclass
class _Peer:
    open: int = 0
    """Fetches from it open now."""
    since: float = 0.0
    """When the current busy stretch (or its part since the last ``take``) began."""
    busy_s: float = 0.0
    """Busy seconds since the last ``take``, the current stretch not yet included."""
    bytes: int = 0


class PeerRates:
    """Per-peer bytes received and busy time, since the last heartbeat took them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._peers: dict[ExecutorId, _Peer] = {}

    def opened(self, peer: ExecutorId) -> None:
        """A fetch from ``peer`` began."""
        with self._lock:
            p = self._peers.setdefault(peer, _Peer())
            if p.open == 0:
                p.since = self._clock()
            p.open += 1

    def received(self, peer: ExecutorId, nbytes: int) -> None:
        """A fetch from ``peer`` received ``nbytes``."""
        with self._lock:
            self._peers.setdefault(peer, _Peer()).bytes += nbytes

    def closed(self, peer: ExecutorId) -> None:
        """A fetch from ``peer`` ended (done, failed or abandoned)."""
        with self._lock:
            p = self._peers.get(peer)
            if p is None or p.open == 0:
                return
            p.open -= 1
            if p.open == 0:
                p.busy_s += self._clock() - p.since

    def reading(self, peer: ExecutorId) -> bool:
        """Whether a fetch from ``peer`` is open now (a link probe then waits:
        the fetch measures the link, and the probe would share it)."""
        with self._lock:
            p = self._peers.get(peer)
            return p is not None and p.open > 0

    def take(self) -> list[LinkSample]:
        """What each peer gave since the last call (peers that gave nothing and
        were not read from are left out); the counts start again."""
        now = self._clock()
        samples: list[LinkSample] = []
        with self._lock:
            for peer, p in list(self._peers.items()):
                busy = p.busy_s + (now - p.since if p.open else 0.0)
                if p.bytes or busy > 0:
                    samples.append(LinkSample(peer, p.bytes, busy))
                if p.open:
                    p.since, p.busy_s, p.bytes = now, 0.0, 0
                else:
                    del self._peers[peer]
        return samples
