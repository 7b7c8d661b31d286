"""Planning with Python's cyclic garbage collector paused (``planner._gc_paused``)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
from helpers import tpch_query

from mangonel.catalog import Table
from mangonel.errors import QueryError
from mangonel.plan import planner


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    """Each test starts with the collector on, and leaves it as it found it."""
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_off_while_a_query_is_planned_and_on_after(
    catalog: dict[str, Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    parse = planner.parse

    def watching_parse(*args: object, **kwargs: object) -> object:
        seen.append(gc.isenabled())
        return parse(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(planner, "parse", watching_parse)
    planner.plan_query(tpch_query(3), catalog)
    assert seen == [False]
    assert gc.isenabled()


def test_a_query_that_fails_to_plan_turns_the_collector_back_on(
    catalog: dict[str, Table],
) -> None:
    with pytest.raises(QueryError, match="nosuchtable"):
        planner.plan_query("SELECT * FROM nosuchtable", catalog)
    assert gc.isenabled()


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
            states["after the first ended"] = gc.isenabled()
        states["after both ended"] = gc.isenabled()

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
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off(catalog: dict[str, Table]) -> None:
    gc.disable()
    planner.plan_query(tpch_query(6), catalog)
    assert not gc.isenabled()
