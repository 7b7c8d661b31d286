"""The phi accrual failure detector: how surprising an executor's silence is.

A fixed heartbeat timeout must be long enough for the slowest heartbeat a
healthy executor ever sends (a saturated CPU, a queue on a busy link, a pause
of its runtime), so it is slow to see a real cut. The phi accrual detector
(Hayashibara et al., 2004; used by Cassandra and Akka) learns instead how the
heartbeats of each executor arrive: it keeps the last ``WINDOW`` intervals
between them and, given the silence so far, gives

    phi = -log10(P(an interval at least this long))

under a normal distribution of the intervals' mean and standard deviation. A
phi of 8 means a healthy executor stays this silent once in 10^8 heartbeats.
Heartbeats that arrive late but arrive (an executor under load) widen the
distribution, so the same silence then says less: the detector adapts to the
host instead of the operator guessing a timeout for the worst one.

Two floors keep it from being too eager where it has seen little: each interval
is taken ``PAUSE_MARGIN`` longer than it was (one beat may always come late),
and the deviation is never below ``MIN_STD``. Both are half the heartbeat
interval the scheduler asked for, and at least 0.25 s, so the defaults (a beat
every 0.5 s, ``SUSPECT_PHI`` 8) suspect a cut executor after about 2.1 s of
silence, and a cluster with a 2 s heartbeat timeout (0.1 s beats) after about
1.75 s: a thread that misses a few short beats on a busy machine is not
suspected for it.

Pure and clock-free: every time is an argument.

>>> window = ArrivalWindow(expected_s=0.5)
>>> for t in (0.0, 0.5, 1.0, 1.5, 2.0):
...     window.heard(t)
>>> round(window.phi(2.5), 1), window.phi(4.2) > SUSPECT_PHI
(0.1, True)
"""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass, field

from mangonel import defaults

__all__ = ["SUSPECT_PHI", "WINDOW", "ArrivalWindow", "Evidence", "silence_for_phi"]

WINDOW = 64
"""Intervals kept: about half a minute of heartbeats at the default rate, so a
burst of late ones (a busy minute) is soon forgotten, and one odd beat barely
moves the mean."""

SUSPECT_PHI = defaults.SUSPECT_PHI
"""Phi at which an executor is suspected (``Limits.suspect_phi``)."""

PAUSE_MARGIN = 0.5
"""Each interval is counted this many heartbeat intervals longer (Akka's
``acceptable-heartbeat-pause``, scaled to the beat) ..."""

MIN_STD = 0.5
"""The deviation is never taken below this many heartbeat intervals (Akka's
``min-std-deviation``): a perfectly regular history must not make the first
late beat a failure ..."""

FLOOR_S = 0.25
"""... and neither floor below this many seconds: beats far shorter than a
machine's scheduling hiccups must not make the detector that much more eager."""

_PHI_CAP = 100.0
"""Phi once the normal tail underflows (``erfc`` is 0 beyond about z = 27)."""


@dataclass(frozen=True)
class Evidence:
    """What the detector saw when it judged an executor: the log of a loss
    carries this, so that a false loss can be told from a real one."""

    silence_s: float
    phi: float
    mean_s: float
    """Mean interval between its heartbeats (the window's)."""
    std_s: float
    samples: int

    def __str__(self) -> str:
        return (
            f"silent {self.silence_s:.2f} s, phi {self.phi:.1f}; its heartbeats came every "
            f"{self.mean_s:.2f} s ± {self.std_s:.2f} s (last {self.samples})"
        )


@dataclass
class ArrivalWindow:
    """The recent intervals between one executor's heartbeats.

    Args:
        expected_s: The heartbeat interval the executor was told to keep: the
            distribution until it has heartbeated a few times, and the unit of
            the floors (``PAUSE_MARGIN``, ``MIN_STD``).
        cap_s: Intervals are counted at most this long: a silence long enough
            to have the executor suspected (a cut, an isolation of the
            scheduler) is judged once, and must not teach the detector to
            tolerate the next one (measured: after a 6 s cut of the scheduler,
            a silent executor was suspected after 5.6 s instead of 2.2 s).
            ``None``: no cap.
    """

    expected_s: float
    cap_s: float | None = None
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    last: float | None = None
    """When the last heartbeat arrived."""
    _sum: float = 0.0
    _sumsq: float = 0.0

    def heard(self, now: float) -> None:
        """A heartbeat arrived at ``now`` (out-of-order times are ignored)."""
        if self.last is not None:
            if now < self.last:
                return
            interval = now - self.last
            if self.cap_s is not None:
                interval = min(interval, self.cap_s)
            if len(self.intervals) == self.intervals.maxlen:
                old = self.intervals[0]
                self._sum -= old
                self._sumsq -= old * old
            self.intervals.append(interval)
            self._sum += interval
            self._sumsq += interval * interval
        self.last = now

    def stats(self) -> tuple[float, float]:
        """Mean and standard deviation of the intervals, floors applied."""
        n = len(self.intervals)
        if n < 3:
            mean, std = self.expected_s, 0.0
        else:
            mean = self._sum / n
            std = math.sqrt(max(0.0, self._sumsq / n - mean * mean))
        floor = max(FLOOR_S, MIN_STD * self.expected_s)
        return mean + max(FLOOR_S, PAUSE_MARGIN * self.expected_s), max(std, floor)

    def phi(self, now: float, since: float | None = None) -> float:
        """Phi of the silence from ``since`` (default: the last heartbeat) to ``now``."""
        start = since if since is not None else self.last
        if start is None:
            return 0.0
        mean, std = self.stats()
        tail = 0.5 * math.erfc((now - start - mean) / (std * math.sqrt(2.0)))
        return _PHI_CAP if tail <= 0.0 else min(_PHI_CAP, -math.log10(tail))

    def evidence(self, now: float, since: float) -> Evidence:
        """What the window says about a silence from ``since`` to ``now``."""
        mean, std = self.stats()
        return Evidence(
            silence_s=max(0.0, now - since),
            phi=self.phi(now, since),
            mean_s=mean - max(FLOOR_S, PAUSE_MARGIN * self.expected_s),
            std_s=std,
            samples=len(self.intervals),
        )


@functools.lru_cache(maxsize=64)
def silence_for_phi(expected_s: float, phi: float = SUSPECT_PHI) -> float:
    """The silence at which a regular executor (beats every ``expected_s``) reaches ``phi``.

    >>> round(silence_for_phi(0.5), 2)
    2.15
    """
    # Inverse of the normal tail by bisection: the stdlib has no erfcinv. Kept
    # per argument: every new state machine asks (the simulator makes one for
    # each check that the store restores into the live state), and 60 steps of
    # erfc were a tenth of that check.
    window = ArrivalWindow(expected_s)
    low, high = 0.0, 1000.0 * expected_s
    for _ in range(60):
        mid = (low + high) / 2
        if window.phi(mid, 0.0) < phi:
            low = mid
        else:
            high = mid
    return high
