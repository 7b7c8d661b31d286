"""The garbage collector's long pauses are logged by the process they stopped."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator

import pytest

from mangonel import pauses


@pytest.fixture
def watched(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> Iterator[pytest.LogCaptureFixture]:
    """This process's collections timed, their pauses logged within 20 ms into caplog."""
    caplog.set_level(logging.WARNING, logger="mangonel.pauses")
    monkeypatch.setattr(pauses, "LOG_EVERY_S", 0.02)
    pauses.watch()
    yield caplog
    # The rest of the test run unwatched (its collections are no test's business).
    gc.callbacks.remove(pauses._on_collection)
    pauses._watching = False


def _collect_until_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        for _ in range(100):  # cycles only the collector frees
            node: dict[str, object] = {}
            node["self"] = node
        gc.collect()
        time.sleep(0.05)
        found = [r.getMessage() for r in caplog.records if r.name == "mangonel.pauses"]
        if found:
            return found
    return []


def test_a_slow_collection_is_logged_with_its_generation_and_what_it_freed(
    watched: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses.watch()  # a second call adds no second callback
    assert gc.callbacks.count(pauses._on_collection) == 1
    monkeypatch.setattr(pauses, "SLOW_COLLECTION_S", 0.0)  # every collection is "slow"
    messages = _collect_until_logged(watched)
    assert messages, "no collection was logged within 5 s"
    assert any(
        m.startswith("garbage collection of generation 2 took ") and "it freed" in m
        for m in messages
    ), messages


def test_a_quick_collection_is_not_logged(
    watched: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pauses, "SLOW_COLLECTION_S", 3600.0)
    gc.collect()
    time.sleep(0.2)
    assert not [r for r in watched.records if r.name == "mangonel.pauses"]


def test_settle_freezes_what_the_start_left_and_is_no_pause_to_report(
    watched: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Noted(list[tuple[float, int, float, int]]):
        """What the callback notes, kept from the logging thread (it sees nothing to log)."""

        def __bool__(self) -> bool:
            return False

    noted = Noted()
    monkeypatch.setattr(pauses, "_noted", noted)
    monkeypatch.setattr(pauses, "SLOW_COLLECTION_S", 0.0)
    try:
        gc.collect()
        assert [n for n in noted if n[1] == 2], "a full collection not asked by settle is noted"
        noted.clear()
        pauses.settle()
        assert gc.get_freeze_count() > 0
        assert not [n for n in noted if n[1] == 2], noted
    finally:
        gc.unfreeze()  # the rest of this test process as it was
