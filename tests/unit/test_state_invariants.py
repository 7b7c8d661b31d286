"""``SchedulerState.validate`` catches each invariant broken on purpose.

Every other state-machine test runs ``validate`` after each event (``Harness.send``),
so a state that breaks an invariant fails them; this proves that each check can
fail at all: one bug planted per invariant, in a state that was valid a moment
before, and the error names that invariant. The invariants are listed once, in
docs/architecture.md ("Invariants of the state"); the last test keeps that list,
the names the code raises and the cases here the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from test_state_machine import (
    E1,
    E2,
    E3,
    J1,
    S1,
    S2,
    Harness,
    att,
    finish_maps,
    started,
    three_stage_plan,
)
from test_state_restart import restarted

from mangonel.ids import ExecutorId, StageId
from mangonel.scheduler.events import CancelRequested, LossReason, SchedulerRecovered
from mangonel.scheduler.invariants import StateInvariantError
from mangonel.scheduler.state import JobState
from mangonel.scheduler.state_executors import ExecutorRegistry
from mangonel.scheduler.state_jobs import JobRecord
from mangonel.scheduler.state_stages import Done, TaskRecord
from mangonel.task import ExecutorInfo

ROOT = Path(__file__).resolve().parents[2]


def job(h: Harness) -> JobRecord:
    return h.state._jobs[J1]


def task(h: Harness, stage: StageId, partition: int) -> TaskRecord:
    return job(h).stages[stage].tasks[partition]


def registry(h: Harness) -> ExecutorRegistry:
    return h.state._executors


def maps_done() -> Harness:
    """e1, e2 (4 slots each); stage 1 done (p0, p2 on e1; p1, p3 on e2); both
    reducers of stage 2 running, one on each."""
    h = started(maps=4, reducers=2)
    finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    return h


def half_done() -> Harness:
    """e1, e2 (4 slots each); map 1 done on e2, map 0 still running on e1."""
    h = Harness()
    h.register(E1)
    h.register(E2)
    h.submit(three_stage_plan(maps=2, reducers=1))
    h.complete(att(1, 1), E2)
    return h


def queued() -> Harness:
    """e1, e2 of one slot each, four maps: two running, two pending."""
    return started(maps=4, reducers=2, slots=1)


def add_idle_executor(h: Harness, executor: ExecutorId) -> None:
    """An executor alive with free slots, bypassing ``handle`` (no assignment ran)."""
    registry(h).register(ExecutorInfo(executor, "h3", "h3:1", 4), h.now)
    registry(h).connected(executor, h.now)


def finished() -> Harness:
    h = maps_done()
    h.send(CancelRequested, J1, "no longer wanted")
    return h


def _set_outputs_unsorted(h: Harness) -> None:
    done = task(h, S1, 0)
    assert isinstance(done.state, Done)
    done.state = replace(done.state, outputs=done.state.outputs[::-1])


def _set_count(h: Harness, stage: StageId, name: str, value: int) -> None:
    """Set one task's count, and its stage's total with it: only the task's own
    invariant is broken (a transition never sets a count like this)."""
    t = task(h, stage, 0)
    job(h).stages[stage].totals[name] += value - getattr(t, name)
    setattr(t, name, value)


def _forget_e2_ran(h: Harness) -> None:
    job(h).ran_on.discard(E2)
    job(h).ran_on_sorted()  # the cache follows, so only ``job-ran-on`` is wrong


def _idle_drain(h: Harness) -> None:
    add_idle_executor(h, E3)
    registry(h).drain(E3, h.now)


def _lose_quietly(h: Harness, executor: ExecutorId) -> None:
    """Mark an executor lost in the registry without the recovery a loss runs."""
    registry(h).mark_lost(executor, LossReason.CONNECTION_LOST, "", h.now)


def _stale_snapshot(h: Harness) -> None:
    registry(h).snapshot()
    # Not through the registry (``set_detail``), which would drop the cached snapshot.
    rec = registry(h).live(E1)
    assert rec is not None
    rec.detail = "changed behind the cache"


def _too_few_slots(h: Harness) -> None:
    rec = registry(h).live(E1)
    assert rec is not None
    rec.info = replace(rec.info, slots=0)  # and it runs a reducer
    registry(h).stored_changed()  # what the registry's transitions would say
    registry(h).rank_changed(rec)


def _too_many_held(h: Harness) -> None:
    registry(h)._held[J1] += 1


def _marks_said_to_hold(h: Harness) -> None:
    """The registry says the slow-link marks hold with no executor marked."""
    registry(h).marks_hold = True


def _one_executor() -> Harness:
    h = Harness()
    h.register(E1, 1)
    return h


CASES: list[tuple[str, Callable[[], Harness], Callable[[Harness], object]]] = [
    ("task-attempts", maps_done, lambda h: _set_count(h, S2, "attempts_launched", 0)),
    ("task-outputs", maps_done, _set_outputs_unsorted),
    ("task-limits", maps_done, lambda h: _set_count(h, S1, "recomputes", 99)),
    ("stage-tasks", maps_done, lambda h: job(h).stages[S1].tasks.reverse()),
    ("stage-counts", maps_done, lambda h: setattr(job(h).stages[S1], "done", 3)),
    ("stage-counts", maps_done, lambda h: job(h).stages[S2].running.clear()),
    ("job-shape", maps_done, lambda h: setattr(job(h), "scan_files", ())),
    ("job-state", maps_done, lambda h: setattr(job(h), "state", JobState.QUEUED)),
    ("job-ran-on", maps_done, _forget_e2_ran),
    ("job-progress", maps_done, lambda h: _lose_quietly(h, E1)),
    # A commit of winners on a job that writes nothing.
    ("job-commit", maps_done, lambda h: setattr(job(h), "commit", {0: 0})),
    ("needed-outputs-held", half_done, lambda h: job(h).excluded.add(E2)),
    ("executor-sets", maps_done, lambda h: registry(h)._draining.add(E1)),
    ("executor-index", maps_done, _stale_snapshot),
    ("executor-index", maps_done, _too_many_held),
    ("executor-index", maps_done, lambda h: registry(h)._ranks.clear()),
    ("executor-health", maps_done, lambda h: setattr(registry(h).live(E1), "gaps", [2, 1])),
    ("executor-health", _one_executor, lambda h: setattr(registry(h), "isolated_since", 0.0)),
    ("slow-link-marks", maps_done, _marks_said_to_hold),
    ("stream-current", maps_done, lambda h: setattr(registry(h).live(E1), "stream", 0)),
    ("running-placed", maps_done, _too_few_slots),
    ("running-placed", maps_done, lambda h: job(h).excluded.add(E1)),
    ("nothing-launchable", queued, lambda h: add_idle_executor(h, E3)),
    ("drains-finish", maps_done, _idle_drain),
    ("finished-jobs", finished, lambda h: setattr(h.state._finished[J1], "result_read", True)),
    ("no-executor-since", maps_done, lambda h: setattr(h.state, "_no_executor_since", 0.0)),
    ("unreachable-reports", maps_done, lambda h: h.state._unreachable.setdefault(E3, {})),
]


@pytest.mark.parametrize(
    ("invariant", "setup", "plant"),
    CASES,
    ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)],
)
def test_each_invariant_broken_on_purpose_is_caught_and_named(
    invariant: str, setup: Callable[[], Harness], plant: Callable[[Harness], object]
) -> None:
    h = setup()
    h.state.validate()  # valid before
    plant(h)
    with pytest.raises(StateInvariantError) as caught:
        h.state.validate()
    assert caught.value.invariant == invariant, caught.value


def test_a_restored_state_is_valid_once_recovered_not_before() -> None:
    # Restored, the tasks that were running still say so while no executor runs
    # anything: ``SchedulerRecovered`` sends them back to pending. ``validate``
    # holds between events, and a restore is half of one.
    r = restarted(maps_done())
    with pytest.raises(StateInvariantError) as caught:
        r.state.validate()
    assert caught.value.invariant == "running-placed"
    r.send(SchedulerRecovered)  # ``Harness.send`` validates


def _documented() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### Invariants of the state", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([a-z-]+)` \|", section, flags=re.MULTILINE)


def test_the_invariants_are_listed_once_and_each_is_checked_and_tested() -> None:
    documented = _documented()
    assert len(documented) == len(set(documented)), "an invariant listed twice"
    source = "\n".join(
        p.read_text() for p in (ROOT / "src" / "mangonel" / "scheduler").glob("state*.py")
    )
    raised = set(re.findall(r'StateInvariantError\(\s*"([a-z-]+)"', source))
    assert raised == set(documented)
    assert {name for name, _, _ in CASES} == set(documented)
