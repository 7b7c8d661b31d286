"""Slow links in the pure state machine (``scheduler.state_links``): heartbeats
carry what each executor's fetches received from each peer; a job reading a
producer so slow that making its outputs again elsewhere is sooner stops using it.

Same style as ``test_state_machine.py`` (whose ``Harness`` and plans it reuses):
hand-built events at hand-set times in, exact commands out.

The usual start (``reading``): e1, e2, e3 with two slots each; stage 1's six map
tasks run two on each and finish at t=1 (1 s each); each wrote two 64 MiB
partitions, so e3 holds 256 MiB the two reducers of stage 2 (launched at t=1)
read. At t=1.5 the heartbeats say what the reducers' fetches got from each peer.
"""

from __future__ import annotations

import doctest
import math

import pytest
from test_state_machine import E1, E2, E3, J1, J2, S1, Harness, att, launches, three_stage_plan

from mangonel.executor import peer_rates
from mangonel.ids import ExecutorId
from mangonel.scheduler import state_link_marks, state_links
from mangonel.scheduler.events import (
    Command,
    ExecutorHeartbeat,
    HealthChange,
    JobSucceeded,
    Limits,
    LogExecutorHealth,
)
from mangonel.scheduler.invariants import StateInvariantError
from mangonel.scheduler.state import SchedulerState
from mangonel.scheduler.state_executors import LinkMarked
from mangonel.scheduler.state_links import FRESH_S, Compared, LinkRates
from mangonel.task import CancelTask, FetchFailed, FetchProblem, LaunchTask, LinkSample

# No silence plays a part (no detector suspicion, no timeout); speculation is
# what turns the rule on, and no straggler's copy muddles the commands (the
# minimum run time is out of reach).
LIMITS = Limits(heartbeat_timeout_s=1000.0, suspect_phi=math.inf, speculation_min_s=1000.0)
MB = 1_000_000


def reading() -> tuple[Harness, dict[int, ExecutorId]]:
    """The map stage done, the reducers running; map partition -> executor."""
    h = Harness(LIMITS)
    for e in (E1, E2, E3):
        h.register(e, 2)
    where = {
        int(attempt.split("/p")[1].split("/")[0]): ExecutorId(e)
        for e, attempt in launches(h.submit(three_stage_plan(maps=6, reducers=2)))
    }
    assert sorted(where.values()).count(E3) == 2
    h.now = 1.0
    for p, e in where.items():
        h.complete(att(1, p), e)
    return h, where


def beat(h: Harness, reader: ExecutorId, rates: dict[ExecutorId, float]) -> list[Command]:
    """``reader``'s heartbeat: one busy second from each peer at its rate."""
    samples = tuple(LinkSample(p, int(rate), 1.0) for p, rate in rates.items())
    return h.send(ExecutorHeartbeat, reader, "", samples)


def slow_link_logs(commands: list[Command]) -> list[ExecutorId | None]:
    return [
        c.executor
        for c in commands
        if isinstance(c, LogExecutorHealth) and c.change is HealthChange.SLOW_LINK
    ]


def reducers_running(h: Harness) -> dict[str, ExecutorId]:
    job = h.state._jobs[J1]
    return {
        str(t.state.attempt): t.state.executor  # type: ignore[union-attr]
        for t in job.stages[att(2, 0).task.stage].running_tasks()
    }


def e3_slow(h: Harness, slow: float = 2.5 * MB, fast: float = 100 * MB) -> None:
    """Every reducer executor reads e3 at ``slow``, the others at ``fast``;
    every executor heartbeats (the rules judge no silent one)."""
    h.now = 1.5
    readers = {*reducers_running(h).values()}
    for reader in (E1, E2, E3):
        rates = {p: (slow if p == E3 else fast) for p in (E1, E2, E3) if p != reader}
        beat(h, reader, rates if reader in readers else {})


def test_a_job_reading_a_slow_producer_makes_its_outputs_again_elsewhere_and_ends_once() -> None:
    h, where = reading()
    readers = reducers_running(h)
    assert len(readers) == 2
    e3_slow(h)
    cmds = h.tick(2.0)
    assert slow_link_logs(cmds) == [E3]
    # Every reducer reads e3's outputs: all cancelled (uncharged), and e3's two
    # map outputs made again on the others, never on e3.
    cancelled = {str(c.attempt) for c in cmds if isinstance(c, CancelTask)}
    assert cancelled == set(readers)
    again = launches(cmds)
    assert sorted(a for _, a in again) == sorted(
        f"j1/s1/p{p}/a1" for p, e in where.items() if e == E3
    )
    assert all(e != E3 for e, _ in again)
    job = h.state.job(J1)
    assert job is not None and job.stages[0].outputs_recomputed == 2
    # The rule acts once: e3 is out of this job.
    assert slow_link_logs(h.tick(2.5)) == []
    # A late report of a cancelled reducer changes nothing (exactly once).
    stale = next(iter(readers))
    assert h.complete(att(2, int(stale.split("/p")[1][0])), readers[stale]) == []
    h.now = 3.0
    second: list[Command] = []
    for e, a in again:
        second += h.complete(att(1, int(a.split("/p")[1][0]), 1), ExecutorId(e))
    relaunched = [c for c in second if isinstance(c, LaunchTask)]
    assert sorted(str(c.task.attempt) for c in relaunched) == ["j1/s2/p0/a1", "j1/s2/p1/a1"]
    for c in relaunched:
        assert c.executor != E3
        assert all(loc.executor != E3 for i in c.task.inputs for loc in i.locations)
    h.now = 4.0
    third: list[Command] = []
    for c in relaunched:
        third += h.complete(c.task.attempt, c.executor)
    (sort,) = [c for c in third if isinstance(c, LaunchTask)]
    assert sort.executor != E3
    h.now = 5.0
    done = h.complete(sort.task.attempt, sort.executor)
    assert [c.job for c in done if isinstance(c, JobSucceeded)] == [J1]


@pytest.mark.parametrize(
    ("slow", "why"),
    [
        (100 * MB, "as fast as the others"),
        (30 * MB, "slower, but not 3 times"),
    ],
)
def test_no_action_when_the_producer_is_not_slow_enough(slow: float, why: str) -> None:
    h, _ = reading()
    e3_slow(h, slow=slow)
    cmds = h.tick(2.0)
    assert slow_link_logs(cmds) == [], why
    assert not any(isinstance(c, CancelTask) for c in cmds)


def test_no_action_when_recomputing_would_not_finish_sooner() -> None:
    # 20 MB/s against 100: slow, but reading e3's 134 MB left (two running
    # readers, each taken as halfway) at that rate, two readers at once, takes
    # 3.4 s; making them again (one wave of 1 s) and reading the readers' 402 MB
    # again at the fast rate 3 s: a saving under the margin (half of 3 s).
    h, _ = reading()
    e3_slow(h, slow=20 * MB)
    assert slow_link_logs(h.tick(2.0)) == []


@pytest.mark.parametrize(
    "limits",
    [
        Limits(heartbeat_timeout_s=1000.0, suspect_phi=math.inf, speculation=False),
        Limits(heartbeat_timeout_s=1000.0, suspect_phi=math.inf, slow_link_ratio=0.0),
    ],
    ids=["no-speculation", "ratio-0"],
)
def test_no_action_with_speculation_off_or_a_ratio_of_0(limits: Limits) -> None:
    h, _ = reading()
    h.state.limits = limits
    e3_slow(h)
    assert slow_link_logs(h.tick(2.0)) == []


def test_a_ratio_below_1_is_refused() -> None:
    with pytest.raises(ValueError, match="slow_link_ratio must be over 1, or 0"):
        Limits(slow_link_ratio=0.5)


def test_a_silent_producer_is_left_to_the_failure_detector() -> None:
    # e3 stopped heartbeating 1.5 s ago: whatever its readers measured, it is
    # the detector's to suspect, not the slow-link rule's to exclude.
    h, _ = reading()
    e3_slow(h)
    h.now = 2.6
    beat(h, E1, {})
    beat(h, E2, {})
    assert slow_link_logs(h.tick(3.0)) == []


def test_rates_older_than_the_freshness_window_are_forgotten() -> None:
    h, _ = reading()
    e3_slow(h)
    assert slow_link_logs(h.tick(1.5 + FRESH_S + 0.1)) == []


def test_no_action_once_nothing_reads_the_slow_producers_outputs() -> None:
    # The reducers finished before the rates came: the sort reads only their
    # outputs, none of which is on e3, so e3's link costs the job nothing more.
    h, _ = reading()
    readers = reducers_running(h)
    assert E3 not in readers.values()
    h.now = 1.2
    for attempt, e in readers.items():
        h.complete(att(2, int(attempt.split("/p")[1][0])), e)
    h.now = 1.5
    for reader in (E1, E2):
        beat(
            h, reader, {p: (2.5 * MB if p == E3 else 100 * MB) for p in (E1, E2, E3) if p != reader}
        )
    assert slow_link_logs(h.tick(2.0)) == []


def reducers_on_each() -> tuple[Harness, dict[int, ExecutorId], dict[str, ExecutorId]]:
    """e1, e2, e3 of two slots; six maps done at 1 s, then three reducers, one on
    each executor: the harness, each map's executor, each reducer attempt's."""
    h = Harness(LIMITS)
    for e in (E1, E2, E3):
        h.register(e, 2)
    where = {
        int(a.split("/p")[1].split("/")[0]): ExecutorId(e)
        for e, a in launches(h.submit(three_stage_plan(maps=6, reducers=3)))
    }
    h.now = 1.0
    reducers: list[Command] = []
    for p, e in where.items():
        reducers += h.complete(att(1, p), e)
    on = {str(c.task.attempt): c.executor for c in reducers if isinstance(c, LaunchTask)}
    return h, where, on


def test_a_reader_on_a_host_whose_own_link_is_slow_gets_one_copy_on_a_fast_one() -> None:
    # Three reducers, one on each executor: the one on e3 reads everyone at
    # 2.5 MB/s while e1 and e2 read everyone (e3 too) fast: e3's own link is
    # slow inward only, so its reader, not its outputs, is the problem.
    h, _, on = reducers_on_each()
    (slow_one,) = [a for a, e in on.items() if e == E3]
    h.now = 1.5
    beat(h, E1, {E2: 100 * MB, E3: 100 * MB})
    beat(h, E2, {E1: 100 * MB, E3: 100 * MB})
    beat(h, E3, {E1: 2.5 * MB, E2: 2.5 * MB})
    cmds = h.tick(2.0)
    copies = [(c.executor, str(c.task.attempt)) for c in cmds if isinstance(c, LaunchTask)]
    assert [a for _, a in copies] == [slow_one.replace("/a0", "/a1")]
    assert copies[0][0] != E3
    assert all(c.speculative for c in cmds if isinstance(c, LaunchTask))
    assert slow_link_logs(cmds) == [E3]
    # One copy per attempt: not again.
    assert [c for c in h.tick(2.5) if isinstance(c, LaunchTask)] == []
    # The copy wins; the original on e3 is cancelled, its late report stale.
    copy_attempt = att(2, int(slow_one.split("/p")[1][0]), 1)
    won = h.complete(copy_attempt, ExecutorId(copies[0][0]))
    assert [str(c.attempt) for c in won if isinstance(c, CancelTask)] == [slow_one]
    assert h.complete(att(2, int(slow_one.split("/p")[1][0])), E3) == []
    view = h.state.job(J1)
    assert view is not None and view.stages[1].speculated == 1


def test_link_rates_compare_a_producer_with_the_others_each_reader_reads() -> None:
    rates = LinkRates()
    p, q = ExecutorId("p"), ExecutorId("q")
    a, b, c = ExecutorId("a"), ExecutorId("b"), ExecutorId("c")
    rates.observe(a, (LinkSample(p, 1 * MB, 1.0), LinkSample(q, 10 * MB, 1.0)), now=0.0)
    rates.observe(b, (LinkSample(p, 3 * MB, 1.0), LinkSample(q, 20 * MB, 1.0)), now=0.0)
    rates.observe(c, (LinkSample(p, 9 * MB, 1.0), LinkSample(q, 90 * MB, 1.0)), now=5.0)
    assert rates.compare(p, now=5.0) == Compared(3 * MB, 20 * MB, 3, busy_s=3.0)
    # Per reader and producer, bytes over busy seconds, the older ones weighing
    # 3/4: (0.75 x 1 + 3) MB over (0.75 + 0.5) s, and 12.5 MB over 1.25 s.
    rates.observe(a, (LinkSample(p, 3 * MB, 0.5), LinkSample(q, 5 * MB, 0.5)), now=6.0)
    # Later, only a's measures are fresh, over 1.5 s of reading.
    assert rates.compare(p, now=6.0 + FRESH_S - 0.5) == Compared(3 * MB, 10 * MB, 1, 1.5)
    assert rates.compare(p, now=6.0 + FRESH_S + 1) is None
    assert rates.producers(now=6.0 + FRESH_S + 1) == []
    # Too short a sample and one's own reads say nothing.
    rates.observe(a, (LinkSample(p, 1 * MB, 0.001), LinkSample(q, 10 * MB, 1.0)), now=30.0)
    rates.observe(p, (LinkSample(p, 10 * MB, 1.0),), now=30.0)
    assert rates.compare(p, now=30.0) is None
    # A beat busy on p with nothing received (a batch still on its way) counts:
    # 2 MB over 0.5 s, then nothing over 0.5 s: (0.75 x 2) MB over 0.875 s.
    rates.observe(a, (LinkSample(p, 2 * MB, 0.5),), now=31.0)
    rates.observe(a, (LinkSample(p, 0, 0.5),), now=31.5)
    compared = rates.compare(p, now=31.5)
    assert compared is not None and compared.rate == pytest.approx(1.5 * MB / 0.875)
    # A reader of p alone has nothing to compare it with.
    rates.observe(b, (LinkSample(p, 10 * MB, 1.0),), now=60.0)
    assert rates.compare(p, now=60.0) is None


def test_a_short_slow_blip_is_not_enough_evidence() -> None:
    # A freshly started executor serves its first fetches slowly for a moment:
    # a quarter of a second of reading it slowly decides nothing.
    h, _ = reading()
    h.now = 1.5
    for reader in (E1, E2):
        samples = tuple(
            LinkSample(p, int((2.5 if p == E3 else 100) * MB * 0.25), 0.25)
            for p in (E1, E2, E3)
            if p != reader
        )
        h.send(ExecutorHeartbeat, reader, "", samples)
    h.send(ExecutorHeartbeat, E3, "", ())
    assert slow_link_logs(h.tick(2.0)) == []
    # A second more of reading it so slowly, from each reader, is enough.
    e3_slow(h)
    assert slow_link_logs(h.tick(2.1)) == [E3]


def test_a_reader_behind_a_slow_link_of_its_own_finds_no_producer_slow() -> None:
    # e3's own link is slow both ways: it reads e1 and e2 slowly, and e1 and
    # e2 read it slowly. Only e3 is judged slow, never e1 or e2.
    h, _ = reading()
    h.now = 1.5
    for reader in (E1, E2, E3):
        beat(
            h,
            reader,
            {p: (2.5 * MB if E3 in (p, reader) else 100 * MB) for p in (E1, E2, E3) if p != reader},
        )
    rates = h.state._links
    for producer in (E1, E2):
        compared = rates.compare(producer, 1.5)
        # Its readers: e2 (gets it fast, e3 slowly), e3 (gets everyone slowly).
        assert compared == Compared(51.25 * MB, 2.5 * MB, 2, busy_s=2.0)
    assert rates.compare(E3, 1.5) == Compared(2.5 * MB, 100 * MB, 2, busy_s=2.0)
    assert slow_link_logs(h.tick(2.0)) == [E3]


def test_the_modules_examples_hold() -> None:
    assert doctest.testmod(state_links).failed == 0
    assert doctest.testmod(state_link_marks).failed == 0
    assert doctest.testmod(peer_rates).failed == 0


# ---------------------------------------------------------------- slow-link marks
# The cluster's memory (``state_link_marks``): an executor found behind a slow
# link gets no new task of any job until its back-off ends, then is tried again.


def link_logs(commands: list[Command]) -> list[tuple[HealthChange, ExecutorId | None]]:
    marks = (HealthChange.LINK_MARKED, HealthChange.LINK_ON_TRIAL, HealthChange.LINK_HEALED)
    return [
        (c.change, c.executor)
        for c in commands
        if isinstance(c, LogExecutorHealth) and c.change in marks
    ]


def rates_at(h: Harness, at: float, e3: float, unhealthy: str = "") -> None:
    """At ``at``, e1 and e2 each read a busy second from every peer: e3 at
    ``e3``, the other at 100 MB/s; e3 heartbeats too (the rules judge no
    silent executor)."""
    h.now = at
    for reader in (E1, E2):
        rates = {p: (e3 if p == E3 else 100 * MB) for p in (E1, E2, E3) if p != reader}
        samples = tuple(LinkSample(p, int(rate), 1.0) for p, rate in rates.items())
        h.send(ExecutorHeartbeat, reader, unhealthy, samples)
    h.send(ExecutorHeartbeat, E3, "", ())


def marked_e3(h: Harness, at: float = 1.5) -> list[Command]:
    """e3's readers get it at 20 MB/s against 100 from the others: slow (under
    a third), though not enough for job 1 to gain by leaving it
    (``test_no_action_when_recomputing_would_not_finish_sooner``)."""
    rates_at(h, at, 20 * MB)
    return h.tick(at + 0.5)


def test_a_slow_producer_is_marked_and_a_new_job_places_no_task_on_it() -> None:
    h, _ = reading()
    readers = reducers_running(h)
    assert h.state.job_slots() == 6
    cmds = marked_e3(h)
    assert link_logs(cmds) == [(HealthChange.LINK_MARKED, E3)]
    assert slow_link_logs(cmds) == []  # job 1 does not gain by leaving it
    # The mark itself touches nothing running: no cancel, the readers go on.
    assert not any(isinstance(c, CancelTask) for c in cmds)
    assert reducers_running(h) == readers
    view = h.state.executor(E3)
    assert view is not None
    assert (view.slow_link_since, view.slow_link_until) == (2.0, 2.0 + LIMITS.slow_link_backoff_s)
    assert "20.00 MB/s from it against 100.00 MB/s" in view.slow_link
    assert h.state.job_slots() == 4  # the planner sizes new jobs without it
    # e3 has both its slots free, e1 and e2 one each (a reducer): job 2's four
    # map tasks take e1's and e2's, and wait rather than go to e3.
    new = launches(h.submit(three_stage_plan(maps=4), J2))
    assert sorted(e for e, _ in new) == [E1, E2]
    # Job 1's sort stage, once runnable, avoids it too.
    h.now = 3.0
    after: list[Command] = []
    for attempt, e in readers.items():
        after += h.complete(att(2, int(attempt.split("/p")[1][0])), e)
    assert all(c.executor != E3 for c in after if isinstance(c, LaunchTask))


def test_after_the_back_off_it_is_tried_and_marked_again_for_twice_as_long() -> None:
    h, _ = reading()
    marked_e3(h)
    h.submit(three_stage_plan(maps=4), J2)
    backoff = LIMITS.slow_link_backoff_s
    assert link_logs(h.tick(2.0 + backoff - 0.1)) == []
    # The back-off over: on trial, and the tick that ends it gives e3 the tasks
    # that waited for a slot.
    cmds = h.tick(2.0 + backoff)
    assert link_logs(cmds) == [(HealthChange.LINK_ON_TRIAL, E3)]
    assert [e for e, _ in launches(cmds)] == [E3, E3]
    view = h.state.executor(E3)
    assert view is not None and view.slow_link_since is None and view.slow_link
    # What its readers measured before the trial is forgotten: only fresh
    # fetches judge it, and a tick without them decides nothing.
    assert h.state._links.compare(E3, h.now) is None
    assert link_logs(h.tick(22.5)) == []
    # Still slow: marked again, the back-off doubled.
    cmds = marked_e3(h, at=23.0)
    assert link_logs(cmds) == [(HealthChange.LINK_MARKED, E3)]
    view = h.state.executor(E3)
    assert view is not None and view.slow_link_until == 23.5 + 2 * backoff
    assert "mark 2 in a row" in next(c.detail for c in cmds if isinstance(c, LogExecutorHealth))


def test_a_trial_that_finds_the_link_fast_trusts_it_and_the_back_off_starts_again() -> None:
    h, _ = reading()
    marked_e3(h)
    assert link_logs(h.tick(22.0)) == [(HealthChange.LINK_ON_TRIAL, E3)]
    rates_at(h, 22.5, 90 * MB)  # healed: about as fast as the others
    assert link_logs(h.tick(23.0)) == [(HealthChange.LINK_HEALED, E3)]
    view = h.state.executor(E3)
    assert view is not None and view.slow_link == "" and view.slow_link_since is None
    # Slow again later: a first mark, the first back-off.
    cmds = marked_e3(h, at=40.0)
    assert link_logs(cmds) == [(HealthChange.LINK_MARKED, E3)]
    view = h.state.executor(E3)
    assert view is not None and view.slow_link_until == 40.5 + LIMITS.slow_link_backoff_s


def test_no_mark_when_no_other_executor_would_take_tasks() -> None:
    # e1 and e2 say their work directories are full: they take no task, so
    # marking e3 would leave none to run work.
    h, _ = reading()
    rates_at(h, 1.5, 20 * MB, unhealthy="work directory full")
    assert link_logs(h.tick(2.0)) == []
    view = h.state.executor(E3)
    assert view is not None and view.slow_link_since is None


def test_the_marks_are_ignored_while_no_unmarked_executor_takes_tasks() -> None:
    h, _ = reading()
    marked_e3(h)
    # e1 and e2 lost: e3, marked, is the only executor left. The mark stays
    # (the executors page still says why), but it holds no more: the tasks
    # the losses sent back run on e3.
    h.now = 3.0
    h.lose(E1)
    cmds = h.lose(E2)
    assert launches(cmds) and all(e == E3 for e, _ in launches(cmds))
    view = h.state.executor(E3)
    assert view is not None and view.slow_link_since == 2.0
    assert not h.state._executors.marks_hold


def test_validate_finds_a_mark_kept_out_of_the_registry() -> None:
    h, _ = reading()
    rec = h.state._executors.live(E3)
    assert rec is not None
    rec.link = LinkMarked(since=1.0, until=21.0, marks=1, why="set behind the registry's back")
    with pytest.raises(StateInvariantError, match="slow-link-marks"):
        h.state.validate()


def test_marks_live_in_memory_only_a_restarted_scheduler_trusts_every_link() -> None:
    h, _ = reading()
    marked_e3(h)
    snapshot = h.state.export_executors()
    assert [r.link for r in snapshot.live] == [None, None, None]
    restored = SchedulerState(LIMITS)
    restored.restore(snapshot, [], [], None)
    view = restored.executor(E3)
    assert view is not None and view.slow_link_since is None and view.slow_link == ""


def test_a_trial_not_found_slow_for_as_long_as_its_back_off_ends_trusted() -> None:
    # Nothing reads e3 during its trial: no verdict from rates; once the trial
    # lasted its back-off, e3 is trusted and a later mark starts over.
    h, _ = reading()
    marked_e3(h)
    backoff = LIMITS.slow_link_backoff_s
    assert link_logs(h.tick(2.0 + backoff)) == [(HealthChange.LINK_ON_TRIAL, E3)]
    h.send(ExecutorHeartbeat, E3, "", ())
    assert link_logs(h.tick(2.0 + 2 * backoff - 0.1)) == []
    cmds = h.tick(2.0 + 2 * backoff)
    assert link_logs(cmds) == [(HealthChange.LINK_HEALED, E3)]
    assert "not found slow" in next(c.detail for c in cmds if isinstance(c, LogExecutorHealth))
    view = h.state.executor(E3)
    assert view is not None and view.slow_link == ""


def test_a_producer_that_sent_nothing_is_not_marked() -> None:
    # Its readers were busy on it for a second each and got no byte: a frozen
    # or cut-off process in its last heard second, for the failure detector.
    h, _ = reading()
    rates_at(h, 1.5, 0.0)
    assert link_logs(h.tick(2.0)) == []


def test_a_reader_behind_a_marked_link_judges_no_other_producer() -> None:
    # e3, marked, reads e1 at 2 MB/s and e2 at 50 (a rate limiter's burst let
    # e2's small files through); e2 reads e1 fast but nothing else lately, so
    # e3 alone would judge e1, and find it slow. A reader known to be behind a
    # slow link judges no one: e1 is not marked (the lab saw this after a heal).
    h, _ = reading()
    marked_e3(h)
    h.now = 13.0  # e2's reads of e3 are stale; e3's mark holds until 22
    h.send(ExecutorHeartbeat, E1, "", ())
    h.send(ExecutorHeartbeat, E2, "", (LinkSample(E1, 100 * MB, 1.0),))
    samples = (LinkSample(E1, 2 * MB, 1.0), LinkSample(E2, 50 * MB, 1.0))
    h.send(ExecutorHeartbeat, E3, "", samples)
    assert link_logs(h.tick(13.5)) == []
    view = h.state.executor(E1)
    assert view is not None and view.slow_link_since is None


@pytest.mark.parametrize("flapped", [True, False])
def test_a_reader_whose_own_link_failed_lately_marks_no_producer(flapped: bool) -> None:
    # e3's link was cut a moment ago (a long silence that ended at t=0.5, within
    # the flap window): it read e1 across a cut, at 2 MB/s, and e2 between two, at
    # 50. e2 reads e1 fast but nothing else lately, so e3 alone would judge e1.
    # A flapping reader marks no one for the cluster (the lab's flapping host
    # marked a healthy peer so, which took no task of any job for 20 s); job 1's
    # own rule still hears it, and leaves e1 for this job only
    # (``state_links.slow_links``).
    h, _ = reading()
    h.now = 1.5
    if flapped:
        h.state._executors.live(E3).gaps.append(0.5)
    h.send(ExecutorHeartbeat, E1, "", ())
    h.send(ExecutorHeartbeat, E2, "", (LinkSample(E1, 100 * MB, 1.0),))
    samples = (LinkSample(E1, 2 * MB, 1.0), LinkSample(E2, 50 * MB, 1.0))
    h.send(ExecutorHeartbeat, E3, "", samples)
    cmds = h.tick(2.0)
    assert slow_link_logs(cmds) == [E1]
    if flapped:
        assert link_logs(cmds) == []
        view = h.state.executor(E1)
        assert view is not None and view.slow_link_since is None
    else:  # the same rates from a reader whose link held: e1 is marked
        assert link_logs(cmds) == [(HealthChange.LINK_MARKED, E1)]


def test_no_copy_of_a_slow_reader_while_an_output_it_reads_is_made_again() -> None:
    # As above, but before the copy is due another reducer finds a map output
    # on e2 lost, and it is made again. A copy's spec names the outputs there
    # are: launched now it would read five of six and give a wrong answer
    # (simulation seed 714366). It waits until the map output is back, and
    # then reads all six.
    h, where, on = reducers_on_each()
    (slow_one,) = [a for a, e in on.items() if e == E3]
    (other,) = [a for a, e in on.items() if e == E1]
    lost_map = min(p for p, e in where.items() if e == E2)
    h.now = 1.2
    lost = FetchFailed(E2, S1, lost_map, "bad checksum", FetchProblem.OUTPUT_LOST)
    remade = launches(h.fail(att(2, int(other.split("/p")[1][0])), E1, lost))
    assert f"j1/s1/p{lost_map}/a1" in [a for _, a in remade]
    h.now = 1.5
    beat(h, E1, {E2: 100 * MB, E3: 100 * MB})
    beat(h, E2, {E1: 100 * MB, E3: 100 * MB})
    beat(h, E3, {E1: 2.5 * MB, E2: 2.5 * MB})
    assert [c for c in h.tick(2.0) if isinstance(c, LaunchTask)] == []
    (map_executor,) = [e for e, a in remade if a == f"j1/s1/p{lost_map}/a1"]
    h.complete(att(1, lost_map, 1), ExecutorId(map_executor))
    beat(h, E3, {E1: 2.5 * MB, E2: 2.5 * MB})
    cmds = h.tick(2.5)
    copies = [c for c in cmds if isinstance(c, LaunchTask) and c.speculative]
    assert [str(c.task.attempt) for c in copies] == [slow_one.replace("/a0", "/a1")]
    assert [len(i.locations) for i in copies[0].task.inputs] == [6]
