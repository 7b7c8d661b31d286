"""Suspicion, quarantine, loss and the scheduler's own isolation in the pure
state machine (``scheduler.state_liveness``).

Same style as ``test_state_machine.py``: hand-built events at hand-set times;
heartbeats are sent as a healthy executor sends them (every
``Limits.heartbeat_interval_s``), and the ``Tick``s come as the shell sends
them (``CoreConfig.tick_s``: half a beat, 0.25 s at most), so the times the
tests find are the ones a cluster would see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from test_state_machine import (
    E1,
    E2,
    E3,
    J1,
    J2,
    Harness,
    att,
    finish_maps,
    launches,
    three_stage_plan,
)

from mangonel.ids import ExecutorId
from mangonel.scheduler.core import MAX_TICK_S, CoreConfig
from mangonel.scheduler.detector import silence_for_phi
from mangonel.scheduler.events import (
    Command,
    DeclareExecutorLost,
    ExecutorHeartbeat,
    HealthChange,
    Limits,
    LogExecutorHealth,
    LossReason,
)
from mangonel.scheduler.state import StageView
from mangonel.scheduler.state_liveness import (
    FLAP_GAPS,
    FLAP_WINDOW_S,
    QUARANTINE_S,
    STREAM_LAG_S,
    relapse_bar,
)
from mangonel.task import CancelTask, LaunchTask

TICK = MAX_TICK_S
"""The longest wait between two ticks: the tolerance of the times found."""


def run(
    h: Harness,
    until: float,
    beating: Callable[[ExecutorId, float], bool],
    executors: Iterable[ExecutorId] = (E1, E2, E3),
) -> list[tuple[float, Command]]:
    """From ``h.now`` to ``until``: heartbeats of ``executors`` every interval
    while ``beating(executor, t)``, a ``Tick`` as the shell sends them; the
    commands with their times."""
    interval = h.state.limits.heartbeat_interval_s
    tick = CoreConfig(limits=h.state.limits).tick_s
    live = [e for e in executors if h.state.executor(e) is not None]
    out: list[tuple[float, Command]] = []
    next_beat = {e: h.now for e in live}
    next_tick = h.now
    while True:
        t = min([next_tick, *next_beat.values()])
        if t >= until:
            h.now = until
            return out
        h.now = t
        for e in live:
            if next_beat[e] <= t:
                next_beat[e] = t + interval
                view = h.state.executor(e)
                if beating(e, t) and view is not None and view.reason is None:
                    out += [(t, c) for c in h.send(ExecutorHeartbeat, e)]
        if next_tick <= t:
            next_tick = t + tick
            out += [(t, c) for c in h.tick(t)]


def maps_view(h: Harness) -> StageView:
    view = h.state.job(J1)
    assert view is not None
    return view.stages[0]


def losses(cmds: list[tuple[float, Command]]) -> list[tuple[float, ExecutorId]]:
    return [(t, c.executor) for t, c in cmds if isinstance(c, DeclareExecutorLost)]


def copies(cmds: list[tuple[float, Command]]) -> list[tuple[str, str]]:
    return [(c.executor, str(c.task.attempt)) for _, c in cmds if isinstance(c, LaunchTask)]


def two_running() -> Harness:
    """e1 and e2 (2 slots each, default limits); j1's four map tasks run, two on each."""
    h = Harness()
    h.register(E1, 2)
    h.register(E2, 2)
    assert sorted(launches(h.submit(three_stage_plan(maps=4, reducers=1)))) == [
        ("e1", "j1/s1/p0/a0"),
        ("e1", "j1/s1/p2/a0"),
        ("e2", "j1/s1/p1/a0"),
        ("e2", "j1/s1/p3/a0"),
    ]
    return h


def test_a_silent_executor_is_suspected_in_about_two_seconds_and_its_attempts_copied() -> None:
    h = two_running()
    run(h, 10.0, lambda e, t: True, (E1, E2))
    assert h.state.executor(E2).suspected_since is None
    h.complete(att(1, 0), E1)  # e1 has a free slot for a copy
    cmds = run(h, 14.0, lambda e, t: e == E1 or t < 10.0, (E1, E2))
    suspected = h.state.executor(E2).suspected_since
    assert suspected is not None and 2.0 <= suspected - 9.5 <= 2.5  # last beat at 9.5
    # Its running attempts are copied onto e1 at once (one free slot there);
    # nothing is lost, and no output is made again.
    assert copies(cmds) == [("e1", "j1/s1/p1/a1")]
    assert [t for t, c in cmds if isinstance(c, LaunchTask)] == [suspected]
    assert losses(cmds) == []
    # Heard from again, it is trusted again.
    cmds = run(h, 15.0, lambda e, t: True, (E1, E2))
    assert h.state.executor(E2).suspected_since is None and losses(cmds) == []


def test_a_suspected_executor_gets_no_new_task_and_is_lost_only_if_the_silence_lasts() -> None:
    h = Harness(Limits(speculation=False))
    h.register(E1, 1)
    h.register(E2, 1)
    run(h, 5.0, lambda e, t: e == E1, (E1, E2))  # e2 silent from the start
    assert h.state.executor(E2).suspected_since is not None
    cmds = h.submit(three_stage_plan(maps=2, reducers=1))
    assert launches(cmds) == [("e1", "j1/s1/p0/a0")]  # p1 waits rather than go to e2
    cmds = run(h, 10.5, lambda e, t: e == E1, (E1, E2))
    assert losses(cmds) == [(10.25, E2)]  # silent past the 10 s timeout
    lost = h.state.executor(E2)
    assert lost.reason is LossReason.HEARTBEAT_TIMEOUT
    # The evidence is in the detail (and in the scheduler's log).
    assert "phi" in lost.detail and "0 long silence(s)" in lost.detail


def test_pauses_of_one_to_two_seconds_and_a_saturated_cpu_lose_no_executor() -> None:
    # e2 pauses 1.5 s or 2 s (a GC, a frozen runtime) every 12 s for a minute,
    # and a third of its beats come a beat late besides, as on a saturated CPU;
    # e1 is healthy. Neither lost nor quarantined.
    h = two_running()

    def beating(e: ExecutorId, t: float) -> bool:
        if e == E1:
            return True
        phase = t % 12.0
        pause = 2.0 if int(t // 12) % 2 else 1.5
        late = int(t * 4) % 3 == 0  # a third of the beats are dropped (come late)
        return not (5.0 <= phase < 5.0 + pause) and not late

    cmds = run(h, 60.0, beating, (E1, E2))
    assert losses(cmds) == []
    assert h.state.executor(E2).quarantined_until is None


def test_a_flapping_executor_is_quarantined_and_never_lost() -> None:
    # The lab's flapping link: a 3 s heartbeat timeout, e2's link cut for 1.5 s
    # every 3 s for 20 s; each silence runs up to 2.5 s (TCP's retries after
    # the heal). e2 holds map outputs the running reducers need.
    h = Harness(Limits(heartbeat_timeout_s=3.0))
    h.register(E1, 2)
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=4, reducers=2))
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    run(h, 5.0, lambda e, t: True, (E1, E2))

    def beating(e: ExecutorId, t: float) -> bool:
        return e == E1 or t < 5.0 or t >= 25.0 or (t - 5.0) % 3.0 >= 2.5

    cmds = run(h, 26.0, beating, (E1, E2))
    view = h.state.executor(E2)
    assert losses(cmds) == []
    assert view.quarantined_until is not None and "3 times" in view.quarantine
    gaps = h.state._executors.live(E2).gaps
    assert len(gaps) >= FLAP_GAPS
    # Its outputs were made again on e1 once it was quarantined, for good: the
    # reducers no longer wait on the flapping link, and e2, heard between the
    # cuts, got them back (no recompute cancelled) nor any new task.
    quarantined = next(
        t
        for t, c in cmds
        if isinstance(c, LogExecutorHealth) and c.change is HealthChange.QUARANTINED
    )
    moved = [
        c for t, c in cmds if isinstance(c, LogExecutorHealth) and c.change is HealthChange.MOVED
    ]
    assert [c.executor for c in moved] == [E2], moved
    assert maps_view(h).outputs_recomputed == 2
    remade = sorted(
        (c.executor, c.task.attempt.task.partition)
        for t, c in cmds
        if t >= quarantined and isinstance(c, LaunchTask) and c.task.attempt.task.stage == 1
    )
    assert remade == [(E1, 1), (E1, 3)], remade
    assert not [
        c for t, c in cmds if t >= quarantined and isinstance(c, LaunchTask) and c.executor == E2
    ]
    cancelled = [
        c
        for t, c in cmds
        if t >= quarantined and isinstance(c, CancelTask) and c.attempt.task.stage == 1
    ]
    assert not cancelled, cancelled
    # The quarantine ends a while after its last suspicion.
    run(h, gaps[-1] + QUARANTINE_S + 1.0, lambda e, t: True, (E1, E2))
    view = h.state.executor(E2)
    assert view.quarantined_until is None and view.quarantine.startswith("was quarantined")


def test_the_last_trusted_executor_is_never_quarantined() -> None:
    h = Harness(Limits(heartbeat_timeout_s=3.0))
    h.register(E1, 1)
    h.register(E2, 1)
    run(h, 2.0, lambda e, t: True, (E1, E2))

    # e1 is down for good (a cut of 2.9 s, every time), e2 flaps.
    def beating(e: ExecutorId, t: float) -> bool:
        return (t - 2.0) % 3.0 >= 2.5

    cmds = run(h, 20.0, beating, (E1, E2))
    assert losses(cmds) == []
    assert [h.state.executor(e).quarantined_until for e in (E1, E2)] == [None, None]


def isolated_cluster() -> Harness:
    """e1, e2, e3 (one slot each, the lab's 3 s timeout); j1's maps done on all
    three, its reducer running on e1."""
    h = Harness(Limits(heartbeat_timeout_s=3.0))
    for e in (E1, E2, E3):
        h.register(e, 1)
    h.submit(three_stage_plan(maps=3, reducers=1))
    finish_maps(h, {0: E1, 1: E2, 2: E3})
    run(h, 5.0, lambda e, t: True)
    return h


def test_a_scheduler_cut_off_from_everyone_for_6_s_loses_no_one_and_recomputes_nothing() -> None:
    h = isolated_cluster()
    cmds = run(h, 15.0, lambda e, t: not 5.0 <= t < 11.0)
    assert losses(cmds) == []
    assert [c for _, c in cmds if isinstance(c, LaunchTask)] == []
    assert maps_view(h).outputs_recomputed == 0 and maps_view(h).done == 3
    assert h.state._executors.isolated_since is None  # over once they were heard again


def test_executors_heard_one_by_one_after_the_heal_are_all_kept() -> None:
    # The link heals for e1 first; e2 and e3 are heard 2.5 s and 2.9 s later. The
    # first one heard ends the isolation, and must not lose the others at once.
    h = isolated_cluster()
    back = {E1: 11.0, E2: 13.5, E3: 13.9}
    cmds = run(h, 20.0, lambda e, t: not 5.0 <= t < back[e])
    assert losses(cmds) == []
    logged = [(c.change, c.executor) for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert logged[3:5] == [(HealthChange.ISOLATED, None), (HealthChange.TRUSTED, E1)]
    assert (HealthChange.RECONNECTED, None) in logged
    assert maps_view(h).outputs_recomputed == 0


def test_executors_silent_since_the_isolation_have_nothing_made_again_on_suspicion() -> None:
    # e1 is heard first and ends the isolation; e2, still suspected, holds an
    # output the reducer on e1 reads, but its silence is the scheduler's cut:
    # nothing is set aside, cancelled or launched before it is heard at 13.5 s.
    h = isolated_cluster()
    back = {E1: 11.0, E2: 13.5, E3: 13.5}
    cmds = run(h, 13.4, lambda e, t: not 5.0 <= t < back[e])
    logged = [(c.change, c.executor) for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert (HealthChange.RECONNECTED, None) in logged
    assert h.state.executor(E2).suspected_since is not None
    assert (HealthChange.SET_ASIDE, E2) not in logged, logged
    assert [c for _, c in cmds if isinstance(c, CancelTask | LaunchTask)] == []
    assert maps_view(h).outputs_recomputed == 0


def test_a_straggler_after_the_heal_is_lost_a_timeout_after_the_isolation_ended() -> None:
    h = isolated_cluster()
    # e1 and e2 are heard again at the heal; e3 never is (it died during the cut).
    cmds = run(h, 30.0, lambda e, t: t < 5.0 or (e != E3 and t >= 11.0))
    ended = next(t for t, c in cmds if isinstance(c, LogExecutorHealth)
                 and c.change is HealthChange.RECONNECTED)  # fmt: skip
    assert losses(cmds) == [(losses(cmds)[0][0], E3)]
    assert 0.0 < losses(cmds)[0][0] - (ended + 3.0) <= TICK


def test_executors_that_really_died_are_lost_once_the_isolation_grace_is_over() -> None:
    h = isolated_cluster()
    grace = h.state.limits.isolation_grace_s
    cmds = run(h, 5.0 + 3.0 + grace + 1.0, lambda e, t: t < 5.0)
    assert sorted(e for _, e in losses(cmds)) == [E1, E2, E3]
    (when,) = {t for t, _ in losses(cmds)}  # all in one step
    assert 5.0 + 3.0 + grace <= when <= 5.0 + 3.0 + grace + TICK, when
    assert "most executors were silent at once" in h.state.executor(E1).detail


def test_two_of_three_silent_is_not_the_schedulers_cut() -> None:
    # e3 still heartbeats: the scheduler's link works, e1 and e2 are lost at the timeout.
    h = isolated_cluster()
    cmds = run(h, 9.0, lambda e, t: e == E3 or t < 5.0)
    assert sorted(e for _, e in losses(cmds)) == [E1, E2]
    (when,) = {t for t, _ in losses(cmds)}
    last_beat = h.state.executor(E1).last_heartbeat
    assert 3.0 < when - last_beat <= 3.0 + TICK


def test_a_long_silence_does_not_teach_the_detector_to_tolerate_the_next() -> None:
    # After the scheduler's 6 s cut, the detector would suspect a silent e2 as
    # soon as before: the cut's intervals count only up to the suspicion bar.
    # (Within 20 s of that long silence, a relapse is suspected sooner still.)
    h = isolated_cluster()
    run(h, 20.0, lambda e, t: not 5.0 <= t < 11.0)
    h.complete(att(2, 0), E1)  # the job ends: nothing waits on e2 (no ``hedge``)
    bar = h.state._executors.long_gap_s  # a regular executor's suspicion time
    rec = h.state._executors.live(E2)
    assert rec.arrivals is not None and rec.gaps
    last = rec.last_heartbeat
    assert rec.arrivals.phi(last + bar + TICK, last) >= h.state.limits.suspect_phi
    cmds = run(h, 30.0, lambda e, t: e != E2 or t < 20.0)
    (when,) = [
        t
        for t, c in cmds
        if isinstance(c, LogExecutorHealth)
        and c.executor == E2
        and c.change in (HealthChange.SUSPECTED, HealthChange.RELAPSED)
    ]
    assert when - 20.0 <= bar + 2 * TICK, (when, bar)


def beats_counting(
    h: Harness, until: float, running: Callable[[ExecutorId, float], int]
) -> list[tuple[float, Command]]:
    """Heartbeats of e1 and e2 every interval up to ``until``, each counting
    ``running(executor, t)`` attempts, with a ``Tick`` every 0.25 s."""
    interval = h.state.limits.heartbeat_interval_s
    out: list[tuple[float, Command]] = []
    t, next_tick = h.now, h.now
    while t < until:
        h.now = t
        for e in (E1, E2):
            out += [(t, c) for c in h.send(ExecutorHeartbeat, e, running=running(e, t))]
        if next_tick <= t:
            next_tick += TICK
            out += [(t, c) for c in h.tick(t)]
        t += interval
    h.now = until
    return out


def health(cmds: list[tuple[float, Command]], change: HealthChange) -> list[tuple[float, str]]:
    return [
        (t, c.executor or "")
        for t, c in cmds
        if isinstance(c, LogExecutorHealth) and c.change is change
    ]


def test_an_executor_whose_launches_do_not_arrive_lags_its_attempts_copied() -> None:
    # e2's heartbeats get through (a new connection each time, executor.link),
    # but the launches of p1 and p3 sit on its command stream behind a cut:
    # it counts none of them.
    h = two_running()
    h.complete(att(1, 0), E1)  # e1 has a free slot for a copy
    cmds = beats_counting(h, 3.0, lambda e, t: 1 if e == E1 else 0)
    lagging = health(cmds, HealthChange.LAGGING)
    # Not before the launches are STREAM_LAG_S old, and two beats in a row.
    assert [e for _, e in lagging] == [E2], lagging
    assert STREAM_LAG_S < lagging[0][0] <= STREAM_LAG_S + 2 * h.state.limits.heartbeat_interval_s
    assert h.state.executor(E2).suspected_since is None  # heard all along
    # No new task for it, its attempts copied onto e1 the moment it lags.
    assert copies(cmds) == [("e1", "j1/s1/p1/a1")]
    assert [t for t, c in cmds if isinstance(c, LaunchTask)] == [lagging[0][0]]
    # Its commands get through: it counts them, and takes tasks again.
    cmds = beats_counting(h, 3.5, lambda e, t: 1 if e == E1 else 2)
    assert [e for _, e in health(cmds, HealthChange.CAUGHT_UP)] == [E2]
    view = h.state.executor(E2)
    assert view is not None and h.state._executors.live(E2).lagging_since is None
    assert losses(cmds) == []


def test_a_report_on_its_way_when_the_heartbeat_arrives_is_no_lag() -> None:
    # p1 finished on e2 long after its launch: one heartbeat counts one attempt
    # fewer before the report (on another connection) arrives.
    h = two_running()
    cmds = beats_counting(h, 2.0, lambda e, t: 2)
    cmds += beats_counting(h, 2.1, lambda e, t: 1 if e == E2 else 2)  # one beat
    h.complete(att(1, 1), E2)
    cmds += beats_counting(h, 4.0, lambda e, t: 1 if e == E2 else 2)
    assert health(cmds, HealthChange.LAGGING) == []
    assert copies(cmds) == []


def flapping_briefly(failed_beats: bool, waited_on: bool = False) -> Harness:
    """The lab's settings (3 s timeout, 0.15 s beats): e2 silent for 1.6 s of
    every 3 s from t=5 to t=20 (its heartbeats renewed after each failure
    arrive right after the heal: silences shorter than a suspicion); e1 healthy.
    With ``failed_beats``, each beat after a silence says how many failed.
    ``waited_on``: j1's reducers run from the start, reading e2's map outputs."""
    h = Harness(Limits(heartbeat_timeout_s=3.0))
    h.register(E1, 2)
    h.register(E2, 2)
    if waited_on:
        h.submit(three_stage_plan(maps=4, reducers=2))
        h.now = 0.2
        finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    interval = h.state.limits.heartbeat_interval_s
    t, next_tick, missed = 0.0, 0.0, 0
    while t < 21.0:
        h.now = t
        h.send(ExecutorHeartbeat, E1)
        if 5.0 <= t < 20.0 and (t - 5.0) % 3.0 < 1.6:
            missed += 1
        else:
            h.send(ExecutorHeartbeat, E2, failed_beats=missed if failed_beats else 0)
            missed = 0
        if next_tick <= t:
            next_tick += TICK
            h.tick(t)
        t += interval
    return h


def test_a_link_down_briefly_again_and_again_is_quarantined_a_pause_as_long_is_not() -> None:
    # Silences of 1.6 s stay under the 1.8 s of a suspicion (no long gap), but
    # the executor's own failed heartbeats say its link was down: a flap.
    assert h_quarantined(flapping_briefly(failed_beats=True))
    # The same silences with no failed heartbeat are pauses of the executor.
    assert not h_quarantined(flapping_briefly(failed_beats=False))


def test_silences_suspected_while_work_waited_are_long_ones_whatever_the_beats_say() -> None:
    # A heartbeat sent into a cut and carried through by TCP after the heal
    # says nothing failed. Work waits on e2, so each silence is suspected (the
    # hedge) while e1 is heard: each is a long silence, and three quarantine it.
    h = flapping_briefly(failed_beats=False, waited_on=True)
    assert h_quarantined(h)
    assert len(h.state._executors.live(E2).gaps) >= FLAP_GAPS


def h_quarantined(h: Harness) -> bool:
    view = h.state.executor(E2)
    assert view is not None and view.reason is None  # never lost
    return view.quarantined_until is not None


def test_a_straggler_is_not_copied_onto_an_executor_whose_heartbeats_are_late() -> None:
    # The first seconds of a cut of the scheduler's own link: attempts
    # straggle, and nobody is suspected yet. e1 has room for a copy of e2's
    # last map when it straggles (3.2 s), but its beats are late by then (none
    # since 1.5 s; the bar: 3 beats, at least 0.5 s; a suspicion would take
    # about 2.1 s): a copy would sit on its command stream.
    h = Harness(Limits(speculation_min_s=3.2))
    h.register(E1, 2)
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=4, reducers=1))
    run(h, 1.0, lambda e, t: True, (E1, E2))
    for p, executor in ((0, E1), (1, E2), (2, E1)):
        h.complete(att(1, p), executor)
    cmds = run(h, 3.5, lambda e, t: e == E2 or t < 2.0, (E1, E2))
    assert h.state.executor(E1).suspected_since is None
    assert copies(cmds) == []
    # Heard again, e1 gets the copy.
    cmds = run(h, 4.5, lambda e, t: True, (E1, E2))
    assert copies(cmds) == [("e1", "j1/s1/p3/a1")]


def test_the_first_suspected_in_a_cut_of_the_schedulers_link_has_nothing_made_again() -> None:
    # The cut reaches the detectors apart: e2's last beat came 0.4 s before
    # the others', so it is suspected a tick or two before the isolation. The
    # others' beats are late by then: nothing of e2's is made again on them
    # (it would sit on their command streams, as cut as e2's). Its output took
    # no time to make, but it is not suspected early either (``hedge``): no
    # other executor was heard after its beats were late.
    h = isolated_cluster()
    last = {E1: 5.4, E2: 5.0, E3: 5.4}
    cmds = run(h, 10.0, lambda e, t: not last[e] <= t < 11.0)
    logged = [(c.change, c.executor) for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert logged[0] == (HealthChange.SUSPECTED, E2), logged
    assert (HealthChange.ISOLATED, None) in logged
    assert (HealthChange.SET_ASIDE, E2) not in logged, logged
    assert [c for _, c in cmds if isinstance(c, CancelTask | LaunchTask)] == []
    assert maps_view(h).outputs_recomputed == 0


def test_a_lag_is_not_stored_and_leaves_the_stored_snapshot_true() -> None:
    # The registry's snapshot (what the store keeps) is cached until a stored
    # field changes. A lag begins and ends with heartbeats: it is of the
    # current stream, which a restart ends, so the snapshot leaves it out and
    # the cached one stays equal to a fresh one (``validate`` after every
    # event). Found by the whole-cluster simulation once its heartbeats
    # counted running attempts: ``executor-index``, a stale cache.
    h = two_running()
    h.complete(att(1, 0), E1)
    cached = h.state.export_executors()
    cmds = beats_counting(h, 3.0, lambda e, t: 1 if e == E1 else 0)
    assert [e for _, e in health(cmds, HealthChange.LAGGING)] == [E2]
    assert h.state._executors.live(E2).lagging_since is not None
    assert h.state.export_executors() is cached  # nothing stored changed
    (stored,) = [r for r in cached.live if r.id == E2]
    assert stored.lagging_since is None and stored.behind_since is None


def reducer_waits_on_e2(map_s: float) -> Harness:
    """``isolated_cluster``'s shape, with maps that took ``map_s`` each: j1's
    reducer runs on e1 from 5.0 s and reads e2's output among the others."""
    h = Harness(Limits(heartbeat_timeout_s=3.0))
    for e in (E1, E2, E3):
        h.register(e, 1)
    h.submit(three_stage_plan(maps=3, reducers=1))
    h.now = map_s
    finish_maps(h, {0: E1, 1: E2, 2: E3})
    run(h, 5.0, lambda e, t: True)
    return h


def suspicion(cmds: list[tuple[float, Command]], executor: ExecutorId) -> tuple[float, str]:
    return next(
        (t, c.detail)
        for t, c in cmds
        if isinstance(c, LogExecutorHealth)
        and c.change in (HealthChange.SUSPECTED, HealthChange.HEDGED, HealthChange.RELAPSED)
        and c.executor == executor
    )


def test_a_silent_executor_that_cheap_work_waits_on_is_suspected_when_its_beats_are_late() -> None:
    # e2 falls silent at 5.0 (its last beat 4.95) while the reducer on e1 needs
    # its output, which took 0.2 s to make: waiting 0.5 s for it (the late bar:
    # three beats of 0.15 s, at least 0.5 s) costs more than making it again, so
    # it is suspected then and its output made again, not at about 2 s (phi).
    h = reducer_waits_on_e2(0.2)
    last = h.state.executor(E2).last_heartbeat
    cmds = run(h, 6.5, lambda e, t: e != E2 or t < 5.0)
    at, why = suspicion(cmds, E2)
    assert 0.5 <= at - last <= 0.5 + TICK, (at, last)
    assert "as long as redoing what waits on it takes (about 0.20 s)" in why and "phi" in why
    logged = [(c.change, c.executor) for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert logged[0] == (HealthChange.HEDGED, E2)
    assert (HealthChange.SET_ASIDE, E2) in logged
    assert maps_view(h).outputs_recomputed == 1
    # Heard again before the loss, it is trusted again: nothing is lost.
    cmds = run(h, 8.0, lambda e, t: True)
    assert h.state.executor(E2).suspected_since is None and losses(cmds) == []


def test_the_hedge_waits_as_long_as_the_work_would_take_to_redo() -> None:
    # The output took 1.2 s to make: e2 is suspected after 1.2 s of silence
    # (the detector alone: about 2 s).
    h = reducer_waits_on_e2(1.2)
    last = h.state.executor(E2).last_heartbeat
    at, _ = suspicion(run(h, 8.0, lambda e, t: e != E2 or t < 5.0), E2)
    assert 1.2 <= at - last <= 1.2 + TICK, (at, last)


def test_a_silent_executor_nothing_waits_on_is_left_to_the_detector() -> None:
    # The same silence with no job at all: suspected by phi alone.
    h = Harness(Limits(heartbeat_timeout_s=3.0))
    for e in (E1, E2, E3):
        h.register(e, 1)
    run(h, 5.0, lambda e, t: True)
    last = h.state.executor(E2).last_heartbeat
    at, why = suspicion(run(h, 8.0, lambda e, t: e != E2 or t < 5.0), E2)
    phi_s = silence_for_phi(h.state.limits.heartbeat_interval_s)
    assert phi_s <= at - last <= phi_s + TICK and "redoing" not in why, (at, last, why)


def test_a_first_wave_is_taken_to_cost_what_the_last_tasks_took() -> None:
    # j2's maps run on e1 and e2 and neither has finished: its own stage says
    # nothing of their cost, so the last tasks to finish stand for it (j1's,
    # 0.2 s or less). e2 falls silent: suspected at the late bar, its attempt
    # copied onto e3.
    h = reducer_waits_on_e2(0.2)
    h.complete(att(2, 0), E1)
    h.complete(att(3, 0), E1)  # j1 is done
    assert launches(h.submit(three_stage_plan(maps=2, reducers=1), J2)) == [
        ("e1", "j2/s1/p0/a0"),
        ("e2", "j2/s1/p1/a0"),
    ]
    start = h.now
    cmds = run(h, 7.0, lambda e, t: e != E2 or t < start + 0.01)
    last = h.state.executor(E2).last_heartbeat
    at, why = suspicion(cmds, E2)
    assert 0.5 <= at - last <= 0.5 + TICK and "(about 0.20 s)" in why, (at, last, why)
    assert copies(cmds) == [("e3", "j2/s1/p1/a1")]


def test_before_any_task_finished_a_silence_is_the_detectors() -> None:
    # A scheduler that saw no task finish yet knows no cost: phi alone.
    h = Harness(Limits(heartbeat_timeout_s=3.0))
    for e in (E1, E2, E3):
        h.register(e, 1)
    run(h, 5.0, lambda e, t: True)
    h.submit(three_stage_plan(maps=3, reducers=1))
    last = h.state.executor(E2).last_heartbeat
    at, why = suspicion(run(h, 8.0, lambda e, t: e != E2 or t < 5.0), E2)
    phi_s = silence_for_phi(h.state.limits.heartbeat_interval_s)
    assert at - last >= phi_s and "redoing" not in why, (at, last, why)


def relapse_cluster() -> Harness:
    """e1, e2, e3 (the lab's 3 s timeout), no job; e2 was silent from 5.0 to
    7.5 s (suspected, heard again: a long silence in its record)."""
    h = Harness(Limits(heartbeat_timeout_s=3.0))
    for e in (E1, E2, E3):
        h.register(e, 1)
    run(h, 10.0, lambda e, t: e != E2 or not 5.0 <= t < 7.5)
    rec = h.state._executors.live(E2)
    assert rec.gaps and rec.suspected_since is None
    return h


def test_an_executor_silent_again_soon_after_a_long_silence_is_suspected_at_once() -> None:
    # Nothing waits on e2, so the hedge has no say, and phi, which learnt its
    # long silence, would wait about 2 s; a relapse is suspected after 2.5
    # beats (0.375 s).
    h = relapse_cluster()
    last = h.state.executor(E2).last_heartbeat
    cmds = run(h, 12.0, lambda e, t: e != E2 or t < 10.0)
    at, why = suspicion(cmds, E2)
    bar = relapse_bar(h.state.limits)
    assert bar == 2.5 * h.state.limits.heartbeat_interval_s
    assert bar < at - last <= bar + TICK, (at, last, why)
    assert "after a long silence ended" in why, why
    changes = [c.change for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert changes[0] is HealthChange.RELAPSED, changes
    # Heard again, trusted again; nothing lost. Outside the window of its long
    # silences (this one too: 2 s), the same silence is the detector's again.
    cmds += run(h, 12.0 + FLAP_WINDOW_S + 1.0, lambda e, t: True)
    assert h.state.executor(E2).suspected_since is None and losses(cmds) == []
    last = h.state.executor(E2).last_heartbeat
    at, why = suspicion(run(h, h.now + 3.0, lambda e, t: e != E2 or t < last + 0.01), E2)
    phi_s = silence_for_phi(h.state.limits.heartbeat_interval_s)
    assert at - last >= phi_s and "long silence" not in why, (at, last, why)


def test_a_beat_missed_after_a_long_silence_is_no_relapse() -> None:
    # One beat of e2 missed (a saturated CPU delays it): 2 intervals of
    # silence, under the bar.
    h = relapse_cluster()
    missed = h.now + 0.05
    cmds = run(h, 12.0, lambda e, t: e != E2 or not missed <= t < missed + 0.1)
    assert not [c for _, c in cmds if isinstance(c, LogExecutorHealth)], cmds


def test_everyone_silent_again_after_a_long_silence_is_no_relapse() -> None:
    # The scheduler's link cut after a first cut of it: every executor has a
    # long silence in its record, and every one falls silent again. Nobody was
    # heard meanwhile, so no relapse is suspected: the isolation decides.
    h = relapse_cluster()
    run(h, 15.0, lambda e, t: not 10.0 <= t < 12.5)
    for e in (E1, E2, E3):
        assert h.state._executors.live(e).gaps
    cmds = run(h, 17.0, lambda e, t: t < 15.0)
    whys = [c.detail for _, c in cmds if isinstance(c, LogExecutorHealth)]
    assert not [w for w in whys if "long silence ended" in w], whys


def test_an_output_made_again_takes_its_inputs_on_the_suspect_with_it() -> None:
    # e2 holds map output 1 and reducer output 1; the final sort runs on e1 and
    # reads the reducers. e2 falls silent: its reducer output is made again,
    # and the map output that re-run reads, on e2 too, goes back with it (not
    # fetched from the silent host: the re-run would wait for the heal).
    h = Harness(Limits(heartbeat_timeout_s=3.0))
    for e in (E1, E2, E3):
        h.register(e, 1)
    h.submit(three_stage_plan(maps=3, reducers=2))
    h.now = 0.2
    assert launches(finish_maps(h, {0: E1, 1: E2, 2: E3})) == [
        ("e1", "j1/s2/p0/a0"),
        ("e2", "j1/s2/p1/a0"),
    ]
    h.now = 0.4
    h.complete(att(2, 1), E2)
    assert launches(h.complete(att(2, 0), E1)) == [("e1", "j1/s3/p0/a0")]
    run(h, 5.0, lambda e, t: True)
    cmds = run(h, 6.0, lambda e, t: e != E2 or t < 5.0)
    suspicion(cmds, E2)
    assert copies(cmds)[0] == ("e1", "j1/s1/p1/a1"), copies(cmds)
    view = h.state.job(J1)
    assert view is not None
    assert [view.stages[i].outputs_recomputed for i in range(3)] == [1, 1, 0]
    # Heard again before the recompute ends: both outputs are its again, and
    # the sort runs again on them.
    cmds = run(h, 7.0, lambda e, t: True)
    view = h.state.job(J1)
    assert view is not None and h.state.executor(E2).suspected_since is None
    assert [view.stages[i].done for i in range(2)] == [3, 2], view.stages
    assert [a for _, a in copies(cmds)] == ["j1/s3/p0/a1"], copies(cmds)


def test_a_suspected_silence_ended_by_a_report_is_one_long_silence() -> None:
    # e2 relapses at 10 s; after the heal its first word is a task's report
    # (another connection than its heartbeats'), then its beats. The silence
    # counts once, as a long one, whichever word came first.
    h = relapse_cluster()
    assert ("e2", "j1/s1/p1/a0") in launches(h.submit(three_stage_plan(maps=3, reducers=1)))
    gaps = len(h.state._executors.live(E2).gaps)
    run(h, 11.0, lambda e, t: e != E2 or t < 10.0)
    assert h.state.executor(E2).suspected_since is not None
    h.complete(att(1, 1), E2)
    assert h.state.executor(E2).suspected_since is None
    run(h, 12.0, lambda e, t: True)
    assert len(h.state._executors.live(E2).gaps) == gaps + 1
