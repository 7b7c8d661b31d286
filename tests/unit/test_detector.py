"""The phi accrual failure detector (``scheduler.detector``): pure arithmetic on
heartbeat arrival times."""

from __future__ import annotations

import random

from mangonel.scheduler.detector import SUSPECT_PHI, WINDOW, ArrivalWindow, silence_for_phi
from mangonel.scheduler.events import Limits


def beats(window: ArrivalWindow, times: list[float]) -> None:
    for t in times:
        window.heard(t)


def first_suspected(window: ArrivalWindow, step: float = 0.01) -> float:
    """The silence after the last beat at which phi reaches the threshold."""
    assert window.last is not None
    silence = 0.0
    while window.phi(window.last + silence) < SUSPECT_PHI:
        silence += step
    return silence


def test_the_default_heartbeat_is_suspected_after_about_two_seconds() -> None:
    interval = Limits().heartbeat_interval_s
    assert interval == 0.5
    window = ArrivalWindow(interval)
    beats(window, [i * interval for i in range(40)])
    assert 2.0 <= first_suspected(window) <= 2.2
    assert 2.0 <= silence_for_phi(interval) <= 2.2
    # One beat late by half an interval means nothing.
    assert window.phi(window.last + 0.75) < 1.0


def test_a_detector_that_heard_nothing_yet_uses_the_interval_it_asked_for() -> None:
    window = ArrivalWindow(0.5)
    assert window.phi(100.0) == 0.0  # never heard: nothing to judge
    window.heard(0.0)
    assert 2.0 <= first_suspected(window) <= 2.2


def test_jittery_heartbeats_of_a_loaded_host_widen_the_distribution() -> None:
    # A saturated CPU: beats every 0.5 s, each up to 1.2 s late, now and then a
    # 2 s gap. The same silence that suspects a regular executor says little.
    rng = random.Random(7)
    t, times = 0.0, []
    for i in range(WINDOW):
        t += 0.5 + rng.uniform(0.0, 1.2) + (1.5 if i % 16 == 5 else 0.0)
        times.append(t)
    loaded = ArrivalWindow(0.5)
    beats(loaded, times)
    assert loaded.phi(loaded.last + 2.2) < 2.0
    assert first_suspected(loaded) > 3.5


def test_the_window_forgets_old_intervals() -> None:
    window = ArrivalWindow(0.5)
    beats(window, [0.0, 5.0, 10.0])  # two 5 s gaps, long ago
    beats(window, [10.0 + 0.5 * i for i in range(1, WINDOW + 1)])
    assert len(window.intervals) == WINDOW
    mean, std = window.stats()
    assert abs(mean - 0.75) < 1e-9  # 0.5 s, plus the pause margin
    assert std == 0.25  # the floor: the beats are perfectly regular
    assert first_suspected(window) < 2.2


def test_a_beat_out_of_order_is_ignored_and_evidence_says_what_was_seen() -> None:
    window = ArrivalWindow(0.5)
    beats(window, [0.0, 0.5, 1.0, 1.5, 1.2])
    assert window.last == 1.5 and len(window.intervals) == 3
    evidence = window.evidence(4.0, 1.5)
    assert evidence.silence_s == 2.5 and evidence.samples == 3
    assert evidence.phi > SUSPECT_PHI
    assert "silent 2.50 s" in str(evidence) and "every 0.50 s" in str(evidence)
