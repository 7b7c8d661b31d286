"""Link probes judged by the scheduler (``state_links``, "Probes"; ``state_link_marks``)
and aimed by it (``state_probes``), and the tickets that authorise them
(``security.tickets``): pure, driven through ``SchedulerState.handle``.

The false marks are the danger: a healthy link must never be marked on a noisy
probe (one slow probe, a pause that hits every reader's probe at once, a busy
CPU that slows every probe a little, a link busy with jobs' bytes), while a
20 mbit link is marked after a couple of rounds, before any job reads over it.
"""

from __future__ import annotations

import doctest
import math

import pytest
from test_state_machine import E1, E2, E3, Harness, launches, three_stage_plan

from mangonel import defaults
from mangonel.ids import ExecutorId
from mangonel.scheduler import state_probes
from mangonel.scheduler.events import (
    Command,
    ExecutorHeartbeat,
    HealthChange,
    Limits,
    LogExecutorHealth,
)
from mangonel.scheduler.state_links import PROBE_EVIDENCE, PROBE_MIN_S, LinkRates
from mangonel.scheduler.state_probes import probe_targets
from mangonel.security import tickets
from mangonel.security.tickets import (
    MAX_PROBE_BYTES,
    PROBE_TICKET_TTL_S,
    TicketClaims,
    TicketError,
    TicketSigner,
    read_unsigned_probe,
    unsigned_probe,
)
from mangonel.task import LinkSample

LIMITS = Limits(heartbeat_timeout_s=1000.0, suspect_phi=math.inf, speculation_min_s=1000.0)
KIB = 1024
PROBE = 240 * KIB  # what a 256 KiB probe counts: the bytes after its first batch
HEALTHY_S = 0.002  # a healthy link moves it in a couple of milliseconds
SLOW_S = PROBE / 2.5e6  # 20 mbit: about 0.1 s


def idle() -> Harness:
    h = Harness(LIMITS)
    for e in (E1, E2, E3):
        h.register(e, 2)
    return h


def marks(commands: list[Command]) -> list[tuple[HealthChange, ExecutorId | None]]:
    changes = (HealthChange.LINK_MARKED, HealthChange.LINK_ON_TRIAL, HealthChange.LINK_HEALED)
    return [
        (c.change, c.executor)
        for c in commands
        if isinstance(c, LogExecutorHealth) and c.change in changes
    ]


def probe_round(h: Harness, at: float, seconds: dict[tuple[ExecutorId, ExecutorId], float]) -> None:
    """At ``at`` every executor heartbeats with one probe of each peer:
    ``seconds[(reader, producer)]`` long, else ``HEALTHY_S`` (e3's own probes
    cross its link: as slow as its peers' of it when that is slow)."""
    h.now = at
    for reader in (E1, E2, E3):
        probes = tuple(
            LinkSample(p, PROBE, seconds.get((reader, p), HEALTHY_S))
            for p in (E1, E2, E3)
            if p != reader
        )
        h.send(ExecutorHeartbeat, reader, "", (), probes)


def e3_at(s: float) -> dict[tuple[ExecutorId, ExecutorId], float]:
    """Every probe over e3's link lasts ``s``."""
    return {(E1, E3): s, (E2, E3): s, (E3, E1): s, (E3, E2): s}


def test_a_20_mbit_link_is_marked_by_probes_before_any_job_reads_over_it() -> None:
    h = idle()
    probe_round(h, 1.0, e3_at(SLOW_S))
    assert marks(h.tick(1.1)) == []  # two probes of it: not yet evidence
    probe_round(h, 3.0, e3_at(SLOW_S))
    cmds = h.tick(3.1)
    assert marks(cmds) == [(HealthChange.LINK_MARKED, E3)]  # only e3: not the peers it read slowly
    why = next(c.detail for c in cmds if isinstance(c, LogExecutorHealth))
    assert "link probes get 2.50 MB/s from it against" in why
    # The first job places nothing on it.
    assert {e for e, _ in launches(h.submit(three_stage_plan(maps=4)))} == {E1, E2}


def test_one_slow_probe_a_gc_like_pause_or_busy_moment_marks_nothing() -> None:
    h = idle()
    # Every round, one reader's probe of e3 lands in a 1.5 s pause: each
    # reader's best of its last probes is fast.
    for n in range(8):
        reader = (E1, E2)[n % 2]
        probe_round(h, 1.0 + 2 * n, {(reader, E3): 1.5})
        assert marks(h.tick(1.1 + 2 * n)) == []


def test_a_pause_that_slows_every_readers_probe_at_once_marks_nothing() -> None:
    h = idle()
    probe_round(h, 1.0, {(E1, E3): 1.5, (E2, E3): 1.5})  # e3 paused during both
    probe_round(h, 3.0, {})
    probe_round(h, 5.0, {})
    for at in (3.1, 5.1):
        assert marks(h.tick(at)) == []


def test_a_busy_cpu_that_slows_every_probe_a_little_marks_nothing() -> None:
    # Ten times slower than its peers, but each probe still under PROBE_MIN_S:
    # timed by the host's scheduling, not by the link.
    quick = PROBE_MIN_S * 0.8
    h = idle()
    for n in range(4):
        probe_round(h, 1.0 + 2 * n, {(E1, E3): quick, (E2, E3): quick})
        assert marks(h.tick(1.1 + 2 * n)) == []
    # The same ratio with probes that last: marked.
    for n in range(2):
        probe_round(h, 20.0 + 2 * n, e3_at(10 * quick))
    assert marks(h.tick(22.1)) == [(HealthChange.LINK_MARKED, E3)]


def test_a_link_busy_with_jobs_bytes_is_judged_by_the_fetches_not_the_probes() -> None:
    h = idle()
    for n in range(3):
        at = 1.0 + n
        # The probes of e3 share its link with the jobs' fetches: slow...
        probe_round(h, at, e3_at(SLOW_S))
        # ... but the fetches from e3 get it as fast as the others.
        for reader in (E1, E2):
            peers = [p for p in (E1, E2, E3) if p != reader]
            h.send(
                ExecutorHeartbeat, reader, "", tuple(LinkSample(p, 50_000_000, 0.5) for p in peers)
            )
        assert marks(h.tick(at + 0.1)) == []


def test_a_trial_is_judged_by_probes_healed_or_marked_again() -> None:
    backoff = LIMITS.slow_link_backoff_s
    for healed in (True, False):
        h = idle()
        probe_round(h, 1.0, e3_at(SLOW_S))
        probe_round(h, 3.0, e3_at(SLOW_S))
        assert marks(h.tick(3.1)) == [(HealthChange.LINK_MARKED, E3)]
        # Marked and on trial, e3 is a probe target of every peer.
        assert E3 in {t.executor for t in probe_targets(h.state._executors, E1, 4.0, peers=0)}
        assert marks(h.tick(3.1 + backoff)) == [(HealthChange.LINK_ON_TRIAL, E3)]
        # What was probed before the trial is forgotten: fresh probes decide,
        # long before the trial's own back-off would end it.
        at = 3.2 + backoff
        probe_round(h, at, {} if healed else e3_at(SLOW_S))
        assert marks(h.tick(at + 0.1)) == []
        probe_round(h, at + 2, {} if healed else e3_at(SLOW_S))
        verdict = HealthChange.LINK_HEALED if healed else HealthChange.LINK_MARKED
        assert marks(h.tick(at + 2.1)) == [(verdict, E3)]


def test_probes_older_than_the_freshness_window_count_for_nothing() -> None:
    rates = LinkRates()
    for n, reader in enumerate((E1, E2, E1)):
        other = E2 if reader == E1 else E1
        probes = (LinkSample(E3, PROBE, SLOW_S), LinkSample(other, PROBE, HEALTHY_S))
        rates.observe_probes(reader, probes, float(n))
    probed = rates.probed(E3, 2.0)
    assert probed is not None and probed.probes == PROBE_EVIDENCE and probed.slow(3.0)
    assert rates.probed(E3, 30.0) is None


def test_probe_targets_are_bounded_and_take_every_peer_in_turn() -> None:
    h = Harness(LIMITS)
    everyone = [ExecutorId(f"e{n}") for n in range(1, 11)]
    for e in everyone:
        h.register(e, 2)
    registry = h.state._executors
    seen: set[ExecutorId] = set()
    for turn in range(9):
        targets = probe_targets(registry, E1, turn * defaults.LINK_PROBE_INTERVAL_S)
        assert len(targets) == defaults.LINK_PROBE_PEERS
        assert E1 not in {t.executor for t in targets}
        seen |= {t.executor for t in targets}
        assert all(t.flight_address == f"h{t.executor[1:]}:50{t.executor[1:]}" for t in targets)
    assert seen == set(everyone) - {E1}
    assert probe_targets(registry, ExecutorId("nobody"), 0.0) == ()


def test_a_probe_ticket_is_the_cluster_members_alone() -> None:
    now = [1000.0]
    member = TicketSigner(b"s" * 32, clock=lambda: now[0])
    raw = member.sign_probe(256 * KIB, "e1")
    claims = member.verify_probe(raw)
    assert (claims.nbytes, claims.prober) == (256 * KIB, "e1")
    refusals = {
        "unsigned": unsigned_probe(256 * KIB),
        "another secret": TicketSigner(b"x" * 32, clock=lambda: now[0]).sign_probe(1024, "e9"),
        "a file ticket": member.sign(TicketClaims("/w/f.arrow", "j1", 0, 0, 0, 2000.0)),
        "altered": raw[:-3] + (b"AAA" if raw[-3:] != b"AAA" else b"BBB"),
    }
    for what, ticket in refusals.items():
        with pytest.raises(TicketError):
            member.verify_probe(ticket)
        assert what
    # A file ticket's key never signs a probe, nor a probe's a file.
    with pytest.raises(TicketError):
        member.verify(raw)
    with pytest.raises(TicketError, match="1 to"):
        member.sign_probe(MAX_PROBE_BYTES + 1, "e1")
    now[0] += PROBE_TICKET_TTL_S + 1
    with pytest.raises(TicketError, match="expired"):
        member.verify_probe(raw)
    # Without a secret, a probe is bounded alike.
    assert read_unsigned_probe(unsigned_probe(1024)).nbytes == 1024
    for bad in (unsigned_probe(MAX_PROBE_BYTES + 1), b"probe:", b"probe:-1", b"probe:1e9"):
        with pytest.raises(TicketError):
            read_unsigned_probe(bad)


def test_the_modules_examples_hold() -> None:
    assert doctest.testmod(state_probes).failed == 0
    assert doctest.testmod(tickets).failed == 0
