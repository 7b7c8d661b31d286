"""How the client reads a result partition when the read fails: again while the
scheduler counts its executor alive, at once ``ResultUnavailableError`` when the
executor refused or is lost, and ``QueryTimeoutError`` once the deadline passed.

No network: a ``Session`` connects lazily, and its Flight pool and its question
to the scheduler are replaced by fakes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from mangonel.client import session as session_module
from mangonel.client.fetch import ResultUnavailableError
from mangonel.client.session import Session, _Deadline
from mangonel.errors import QueryTimeoutError
from mangonel.ids import ExecutorId, StageId
from mangonel.task import PartitionLocation

LOC = PartitionLocation(
    executor=ExecutorId("exec-1"),
    host="executor-0",
    flight_address="10.0.0.2:4000",
    stage=StageId(3),
    map_partition=0,
    partition=0,
    path="/srv/work/exec-1/j1/3/0.arrow",
    rows=1,
    bytes=8,
    checksum="0",
)
TABLE = pa.table({"n": [1]})


class FakePool:
    """Fails the first ``failures`` reads (refused or unreachable), then answers."""

    def __init__(self, failures: int, refused: bool = False) -> None:
        self.failures = failures
        self.refused = refused
        self.reads = 0

    def read(self, loc: PartitionLocation, timeout_s: float | None = None) -> pa.Table:
        self.reads += 1
        if self.reads <= self.failures:
            raise ResultUnavailableError("could not be read", loc, refused=self.refused)
        return TABLE

    def close(self) -> None:
        pass


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[Session]:
    monkeypatch.setattr(session_module, "_FETCH_RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(session_module, "_FETCH_RETRY_MAX_S", 0.002)
    s = Session("127.0.0.1:1", reconnect_s=5.0)
    yield s
    s.close()


def _fake(
    s: Session, monkeypatch: pytest.MonkeyPatch, pool: FakePool, lost: bool = False
) -> list[str]:
    asked: list[str] = []

    def executor_lost(executor: str, deadline: _Deadline) -> bool:
        asked.append(executor)
        return lost

    monkeypatch.setattr(s, "_flight", pool)
    monkeypatch.setattr(s, "_executor_lost", executor_lost)
    return asked


def test_an_unreachable_executor_the_scheduler_counts_alive_is_read_again(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = FakePool(failures=3)
    asked = _fake(session, monkeypatch, pool)
    assert session._read_partition("j1", LOC, _Deadline(None)) is TABLE
    assert pool.reads == 4 and asked == ["exec-1"] * 3


def test_a_refused_ticket_is_given_up_at_once(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = FakePool(failures=1, refused=True)
    asked = _fake(session, monkeypatch, pool)
    with pytest.raises(ResultUnavailableError):
        session._read_partition("j1", LOC, _Deadline(None))
    assert pool.reads == 1 and asked == []  # the file is gone: the query runs again


def test_an_executor_the_scheduler_counts_lost_is_given_up_at_once(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = FakePool(failures=5)
    asked = _fake(session, monkeypatch, pool, lost=True)
    with pytest.raises(ResultUnavailableError):
        session._read_partition("j1", LOC, _Deadline(None))
    assert pool.reads == 1 and asked == ["exec-1"]


def test_reads_end_at_the_query_deadline(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = FakePool(failures=10**9)
    _fake(session, monkeypatch, pool)
    with pytest.raises(QueryTimeoutError, match="within its timeout of 0.05 s"):
        session._read_partition("j1", LOC, _Deadline(0.05))
    assert pool.reads > 1


def test_without_a_deadline_reads_end_after_reconnect_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "_FETCH_RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(session_module, "_FETCH_RETRY_MAX_S", 0.002)
    with Session("127.0.0.1:1", reconnect_s=0.05) as s:
        pool = FakePool(failures=10**9)
        _fake(s, monkeypatch, pool)
        with pytest.raises(ResultUnavailableError):  # then the query runs again
            s._read_partition("j1", LOC, _Deadline(None))
    assert pool.reads > 1
