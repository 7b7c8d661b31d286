"""Link probes: this executor times small synthetic Flight fetches from a few peers.

A job's fetches measure a link only once the job reads over it: the first job
behind a slow link pays for finding it. So every ``--link-probe-interval``
seconds the executor fetches ``LINK_PROBE_BYTES`` of synthetic data (no file,
no disk: ``executor.flight``) from each peer the scheduler named in its last
heartbeat's answer (``ProbeTarget``: a few in turn, and any marked or on
trial: ``scheduler.state_probes``), one after the other, and each heartbeat
carries the probes since the last one (``LinkSample``, one per probe) apart
from the fetches' samples: the scheduler weighs them by rules of their own
(``scheduler.state_links``, "Probes").

A probe is timed by the gaps between its batches' arrivals: its bytes after
the first batch over the *median* gap times their number. The call's latency
(a peer slow to answer) is left out, and so is a pause mid-stream (a CPU
throttled or busy with tasks, a GC-like stop) that stretches one or two gaps:
a slow link stretches every gap. (A rate limiter's burst lets the first
batches through at once; the median is past them.) A peer this executor is fetching from
now is not probed: the fetch measures the link, and a probe would share it.
A probe that fails is not a sample (silence is the failure detector's); one
cut off by its deadline counts what it received.

Thread-safe: the prober's thread probes, the heartbeat thread aims and takes.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import pyarrow.flight as flight

from mangonel import defaults
from mangonel.executor.flight_clients import FlightClients
from mangonel.executor.peer_rates import PeerRates
from mangonel.security.tickets import TicketSigner, unsigned_probe
from mangonel.security.tls import TlsMaterial
from mangonel.task import LinkSample, ProbeTarget

log = logging.getLogger(__name__)

__all__ = ["PROBE_TIMEOUT_S", "LinkProber"]

PROBE_TIMEOUT_S = 5.0
"""A probe's call deadline: past it, what arrived is the sample (256 KiB take
about 2 s at 1 mbit)."""


class LinkProber:
    """Probes the peers the scheduler names, and keeps the samples for the heartbeat.

    Args:
        prober: This executor's id (in signed tickets, for the peer's log).
        nbytes: Bytes per probe.
        tls_material: Probe over TLS; ``None``: plaintext.
        signer: Signs probe tickets with the cluster secret; ``None``: unsigned.
        rates: This executor's fetch rates: a peer read from now is skipped.
        clock: Monotonic seconds (tests give their own).
    """

    def __init__(
        self,
        *,
        nbytes: int = defaults.LINK_PROBE_BYTES,
        tls_material: TlsMaterial | None = None,
        signer: TicketSigner | None = None,
        rates: PeerRates | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nbytes = nbytes
        self.prober = ""
        self._signer = signer
        self._rates = rates
        self._clock = clock
        self._lock = threading.Lock()
        self._targets: tuple[ProbeTarget, ...] = ()
        self._samples: list[LinkSample] = []
        self._clients = FlightClients(tls_material)

    def aim(self, targets: Sequence[ProbeTarget]) -> None:
        """The peers to probe from now on (the last heartbeat's answer)."""
        with self._lock:
            self._targets = tuple(targets)

    def take(self) -> list[LinkSample]:
        """The probes since the last call, one sample each."""
        with self._lock:
            samples, self._samples = self._samples, []
        return samples

    def run(self, stop: threading.Event, interval_s: float) -> None:
        """Probe every ``interval_s`` until ``stop`` is set."""
        while not stop.wait(interval_s):
            self.probe_round(stop)
        self.close()

    def probe_round(self, stop: threading.Event | None = None) -> list[LinkSample]:
        """Probe each target once, one after the other; the samples (also kept)."""
        with self._lock:
            targets = self._targets
        got: list[LinkSample] = []
        for target in targets:
            if stop is not None and stop.is_set():
                break
            if self._rates is not None and self._rates.reading(target.executor):
                continue
            sample = self.probe(target)
            if sample is not None:
                got.append(sample)
        with self._lock:
            self._samples.extend(got)
        return got

    def probe(self, target: ProbeTarget) -> LinkSample | None:
        """One probe of ``target``: bytes after the first batch, over the median
        gap between arrivals times their number; ``None`` when it failed or
        brought one batch only."""
        if self._signer is not None:
            ticket = self._signer.sign_probe(self.nbytes, self.prober)
        else:
            ticket = unsigned_probe(self.nbytes)
        arrivals: list[float] = []
        nbytes = 0
        try:
            reader = self._clients.get(target.flight_address).do_get(
                flight.Ticket(ticket), flight.FlightCallOptions(timeout=PROBE_TIMEOUT_S)
            )
            for chunk in reader:
                arrivals.append(self._clock())
                if len(arrivals) > 1:
                    nbytes += chunk.data.nbytes
        except flight.FlightTimedOutError:
            pass  # a very slow link: what arrived is the sample
        except (flight.FlightError, OSError) as exc:
            log.debug("link probe of %s failed: %s", target.executor, exc)
            self._clients.drop(target.flight_address)
            return None
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        busy = statistics.median(gaps) * len(gaps) if gaps else 0.0
        if busy <= 0:
            return None
        return LinkSample(target.executor, nbytes, busy)

    def close(self) -> None:
        self._clients.close()
