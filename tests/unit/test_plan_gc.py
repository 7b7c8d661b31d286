"""Planning with Python's cyclic garbage collector paused (``planner._gc_paused``)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from helpers import tpch_query

from mangonel.catalog import Table
from mangonel.errors import QueryError
from mangonel.plan import planner


def _eventually(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    """Each test starts with the collector on and no pause pending, and leaves it
    as it found it."""
    was = gc.isenabled()
    assert _eventually(lambda: not planner._gc_paused_now)
    gc.enable()
    yield
    assert _eventually(lambda: not planner._gc_paused_now)
    for thread in threading.enumerate():
        if thread.name == "gc-resume":  # a resume made obsolete by a later plan
            thread.join(10)
    if was:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_off_while_a_query_is_planned_and_on_a_moment_after(
    catalog: dict[str, Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    parse = planner.parse

    def watching_parse(*args: object, **kwargs: object) -> object:
        seen.append(gc.isenabled())
        return parse(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(planner, "parse", watching_parse)
    monkeypatch.setattr(planner, "GC_RESUME_DELAY_S", 1.0)
    planner.plan_query(tpch_query(3), catalog)
    # Still off as the plan returns: the scheduler commits and launches first.
    assert seen == [False]
    assert not gc.isenabled()
    assert _eventually(gc.isenabled)


def test_a_query_that_fails_to_plan_turns_the_collector_back_on(
    catalog: dict[str, Table],
) -> None:
    with pytest.raises(QueryError, match="nosuchtable"):
        planner.plan_query("SELECT * FROM nosuchtable", catalog)
    assert _eventually(gc.isenabled)


def test_a_plan_that_starts_before_the_resume_keeps_the_collector_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(planner, "GC_RESUME_DELAY_S", 0.05)
    with planner._gc_paused():
        pass
    with planner._gc_paused():
        time.sleep(0.2)  # the first plan's resume comes and goes meanwhile
        assert not gc.isenabled()
    assert _eventually(gc.isenabled)


def test_the_collector_stays_off_until_the_last_of_two_plans_ends() -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    states: dict[str, bool] = {}

    def first() -> None:
        with planner._gc_paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with planner._gc_paused():
            second_in.set()
            first_out.wait(5)
            time.sleep(planner.GC_RESUME_DELAY_S * 2)  # the first one's resume, had it one
            states["after the first ended"] = gc.isenabled()
        states["after both ended"] = _eventually(gc.isenabled)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert states == {"after the first ended": False, "after both ended": True}


def test_plans_that_overlap_without_a_gap_still_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    # Many clients planning at once may never leave a moment with no plan running:
    # the trees earlier plans dropped must not pile up for ever.
    clock = [1000.0]
    monkeypatch.setattr(planner.time, "monotonic", lambda: clock[0])
    collections: list[int] = []
    monkeypatch.setattr(planner.gc, "collect", lambda *a: collections.append(1) or 0)
    with planner._gc_paused():  # a plan that runs throughout
        for _ in range(3):
            with planner._gc_paused():  # plans that start and end under it
                clock[0] += planner.GC_PAUSE_LIMIT_S / 2 + 0.01
        assert not gc.isenabled()
    assert len(collections) == 1  # once past the limit, then the clock starts again
    monkeypatch.undo()
    assert _eventually(gc.isenabled)


def test_plans_that_follow_each_other_without_a_gap_still_collect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Plans back to back (each starting before the last one's resume) keep the
    # collector paused; the one that ends past the limit turns it on at once.
    clock = [1000.0]
    monkeypatch.setattr(planner.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(planner, "GC_RESUME_DELAY_S", 0.5)
    with planner._gc_paused():
        clock[0] += planner.GC_PAUSE_LIMIT_S / 2
    assert not gc.isenabled()
    with planner._gc_paused():
        clock[0] += planner.GC_PAUSE_LIMIT_S / 2 + 0.01
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off(
    catalog: dict[str, Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(planner, "GC_RESUME_DELAY_S", 0.01)
    gc.disable()
    planner.plan_query(tpch_query(6), catalog)
    assert _eventually(lambda: not planner._gc_paused_now)
    assert not gc.isenabled()
