"""``DROP TABLE`` of a warehouse table: the name goes at once, the files once no
job that may read them runs, a statement still being planned included; what a
stopped scheduler left waiting (a drop's files, a replace's), the next one
deletes once the jobs it recovered end; ``/metrics`` counts what waits.

A ``SchedulerCore`` over a memory store, no executors: a submitted query stays
queued until it is cancelled, which is when its files may go.
"""

from __future__ import annotations

import doctest
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import wait_until

from mangonel import defaults, output
from mangonel.errors import SchedulerStoppingError, StoreFencedError, UnknownTableError
from mangonel.ids import JobId, StageId
from mangonel.output import CommitMode
from mangonel.plan.physical import WriteTarget
from mangonel.scheduler import service, writes
from mangonel.scheduler.commits import CommitThread
from mangonel.scheduler.core import SchedulerCore
from mangonel.scheduler.events import CommitWrite, WriteCommitFailed, WriteCommitted
from mangonel.scheduler.hooks import NO_HOOK
from mangonel.scheduler.persist import StoredDrop, StoredTable, drop_key, encode, table_key
from mangonel.scheduler.service_status import job_status
from mangonel.scheduler.state import Limits, SchedulerState
from mangonel.scheduler.store import MemoryStateStore
from mangonel.task import WriteFormat
from mangonel.web.metrics import make_registry

QUERY = "SELECT sum(a) AS s FROM t"


@pytest.fixture
def store(tmp_path: Path) -> MemoryStateStore:
    """A store that lists table ``t``, the warehouse's, with three rows in one file."""
    location = tmp_path / "warehouse" / "t"
    staged = Path(output.attempt_staging(str(location), "j0", 0, 0))
    staged.mkdir(parents=True)
    pq.write_table(pa.table({"a": [1, 2, 3]}), staged / "data_0.parquet")
    output.commit(str(location), "j0", {0: 0}, "parquet", CommitMode.REPLACE)
    memory = MemoryStateStore()
    memory.acquire("test")
    memory.commit({table_key("t"): encode(StoredTable(str(location), owned=True))})
    return memory


@pytest.fixture
def cores(tmp_path: Path) -> Iterator[Any]:
    """``cores(store)``: a recovered, started core on ``store``, stopped at the end."""
    made: list[SchedulerCore] = []

    def make(store: MemoryStateStore) -> SchedulerCore:
        core = SchedulerCore(SchedulerState(Limits()), store=store)
        core.warehouse = str(tmp_path / "warehouse")
        core.recover()
        core.start()
        made.append(core)
        return core

    yield make
    for core in made:
        core.stop()


def test_the_module_examples_hold() -> None:
    assert doctest.testmod(writes).failed == 0


def data_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "warehouse").rglob("part-*"))


def test_with_nothing_running_the_files_go_before_the_drop_returns(
    tmp_path: Path, store: MemoryStateStore, cores: Any
) -> None:
    core = cores(store)
    assert core.drop_table("t")
    assert core.tables() == [] and not (tmp_path / "warehouse" / "t").exists()
    assert not core.drop_table("t")


def test_the_files_stay_until_a_job_planned_on_them_ends(
    tmp_path: Path, store: MemoryStateStore, cores: Any
) -> None:
    core = cores(store)
    files = data_files(tmp_path)
    reader = core.submit(QUERY)
    assert core.drop_table("t")
    assert core.tables() == []  # the name went at once
    assert files and all(f.exists() for f in files)
    core.cancel(reader.id)
    wait_until(lambda: not (tmp_path / "warehouse" / "t").exists(), "the files deleted", 10)


def test_a_statement_being_planned_when_the_table_is_dropped_is_waited_for(
    tmp_path: Path, store: MemoryStateStore, cores: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning runs outside the core's lock, on the catalog as it was: a drop (or a
    replace) committed meanwhile must keep the files for the job it becomes."""
    core = cores(store)
    files = data_files(tmp_path)
    planned, go_on = threading.Event(), threading.Event()
    plan = core.plans.plan

    def slow_plan(*args: Any, **kwargs: Any) -> Any:
        made = plan(*args, **kwargs)  # on the catalog with t in it
        planned.set()
        assert go_on.wait(10)
        return made

    monkeypatch.setattr(core.plans, "plan", slow_plan)
    jobs: list[Any] = []
    submitter = threading.Thread(target=lambda: jobs.append(core.submit(QUERY)))
    submitter.start()
    assert planned.wait(10)
    assert core.drop_table("t")
    go_on.set()
    submitter.join(10)
    (reader,) = jobs
    assert all(f.exists() for f in files), "deleted under a job planned on them"
    core.cancel(reader.id)
    wait_until(lambda: not any(f.exists() for f in files), "the files deleted", 10)


def test_a_drop_left_waiting_by_a_stopped_scheduler_is_finished_by_the_next(
    tmp_path: Path, store: MemoryStateStore, cores: Any
) -> None:
    first = cores(store)
    files = data_files(tmp_path)
    reader = first.submit(QUERY)
    assert first.drop_table("t")
    first.stop()  # as if it crashed: its reader is recovered, still queued
    second = cores(store)
    assert second.tables() == []
    assert all(f.exists() for f in files)
    second.cancel(reader.id)
    wait_until(lambda: not (tmp_path / "warehouse" / "t").exists(), "the files deleted", 10)


def test_a_drop_whose_name_was_not_forgotten_before_a_crash_took_effect(
    tmp_path: Path, store: MemoryStateStore, cores: Any
) -> None:
    """The drop's manifest landed, the store still lists the table: a restarted
    scheduler forgets it (the manifest says it was dropped) and deletes its files."""
    output.drop(str(tmp_path / "warehouse" / "t"), "drop-1")
    core = cores(store)
    assert core.tables() == [] and core.unreadable.entries() == []
    assert table_key("t") not in store.load()
    wait_until(lambda: not (tmp_path / "warehouse" / "t").exists(), "the files deleted", 10)


def test_a_replace_s_files_left_by_a_stopped_scheduler_go_once_its_jobs_end(
    tmp_path: Path, store: MemoryStateStore, cores: Any
) -> None:
    location = str(tmp_path / "warehouse" / "t")
    old = data_files(tmp_path)
    first = cores(store)
    reader = first.submit(QUERY)
    # CREATE OR REPLACE TABLE t committed, then the scheduler stopped: its reader
    # is recovered, and nothing in memory says the old files wait for it.
    staged = Path(output.attempt_staging(location, "j1", 0, 0))
    staged.mkdir(parents=True)
    pq.write_table(pa.table({"a": [4]}), staged / "data_0.parquet")
    assert output.commit(location, "j1", {0: 0}, "parquet", CommitMode.REPLACE).retired
    first.stop()
    second = cores(store)
    assert all(f.exists() for f in old)
    second.cancel(reader.id)
    wait_until(lambda: not any(f.exists() for f in old), "the replaced files deleted", 10)
    assert len(data_files(tmp_path)) == 1


def test_an_insert_committed_before_the_drop_goes_with_the_table_one_after_fails(
    tmp_path: Path, store: MemoryStateStore
) -> None:
    """The drop runs on the commit thread, in order with the commits to its table."""
    location = str(tmp_path / "warehouse" / "t")
    tables, events = {"t"}, []

    def forget(name: str) -> bool:
        there = name in tables
        tables.discard(name)
        return there

    def emit(make: Any) -> list[Any]:
        events.append(make(1, 0.0))
        return []

    thread = CommitThread(
        threading.RLock(),
        emit,
        frozenset,
        lambda name: name in tables,
        lambda table: None,
        lambda *args: None,
        forget,
        lambda: NO_HOOK,
        time.time,
    )
    target = WriteTarget(
        location, WriteFormat.PARQUET, StageId(1), ("a",), CommitMode.APPEND, table="t"
    )

    def insert(job: str) -> None:
        staged = Path(output.attempt_staging(location, job, 0, 0))
        staged.mkdir(parents=True)
        pq.write_table(pa.table({"a": [4]}), staged / "data_0.parquet")
        thread.put(CommitWrite(0, JobId(job), target, ((0, 0),)))

    insert("j1")
    assert thread.drop("t", location, readable=True)  # after j1's commit: both go
    assert [type(e) for e in events] == [WriteCommitted]
    assert not Path(location).exists()
    insert("j2")
    wait_until(lambda: len(events) == 2, "the second insert's outcome", 10)
    assert isinstance(events[1], WriteCommitFailed)
    assert "was dropped while this INSERT ran" in events[1].message
    thread.stop()


def test_metrics_count_tables_by_state_and_the_drops_that_wait(
    tmp_path: Path, store: MemoryStateStore, cores: Any
) -> None:
    gone = tmp_path / "gone.parquet"
    pq.write_table(pa.table({"b": [1]}), gone)
    store.commit({table_key("gone"): encode(StoredTable(str(gone)))})
    gone.unlink()  # its file is away when the scheduler starts: kept, unreadable
    core = cores(store)
    registry = make_registry(core)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("mangonel_tables", state="readable") == 1
    assert sample("mangonel_tables", state="unreadable") == 1
    assert sample("mangonel_retirements_waiting") == 0
    reader = core.submit(QUERY)
    assert core.drop_table("t")
    assert sample("mangonel_tables", state="readable") == 0
    assert sample("mangonel_retirements_waiting") == 1
    core.cancel(reader.id)
    wait_until(lambda: sample("mangonel_retirements_waiting") == 0, "the drop's files go", 10)


def test_the_statuses_of_a_drop_and_a_write_say_they_took_effect_a_query_s_does_not(
    store: MemoryStateStore, cores: Any
) -> None:
    # What keeps a client from running them again when their answer is lost
    # (``Session.sql``; tests/integration/test_write_restart.py runs that).
    core = cores(store)
    query = core.submit(QUERY)
    insert = core.submit("INSERT INTO t VALUES (4)")
    drop = core.submit("DROP TABLE t")
    took = {
        name: job_status(core.job(job.id), core.now(), with_result=False).took_effect
        for name, job in (("query", query), ("insert", insert), ("drop", drop))
    }
    assert took == {"query": False, "insert": True, "drop": True}
    assert drop.plan.dropped == "t" and insert.plan.write is not None
    for job in (query, insert, drop):
        core.cancel(job.id)


def test_the_same_drop_sent_again_while_it_is_planned_gets_the_first_s_job(
    tmp_path: Path, store: MemoryStateStore, cores: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose submission timed out (the scheduler frozen) sends it again
    with the same request id; the scheduler, thawed, has both. The second waits
    for the first's answer: planned on its own, it found the table dropped and
    failed a statement that succeeded (CI, 2026-12-07: the randomized fault run)."""
    core = cores(store)
    dropping, go_on = threading.Event(), threading.Event()
    drop_table = core.drop_table

    def held_drop(*args: Any) -> bool:
        if not dropping.is_set():
            dropping.set()
            assert go_on.wait(10)
        return drop_table(*args)

    monkeypatch.setattr(core, "drop_table", held_drop)
    answers: list[Any] = []

    def submit() -> None:
        try:
            answers.append(core.submit("DROP TABLE t", request_id="s.1", owner="ann"))
        except Exception as exc:  # noqa: BLE001 - the assertion names it
            answers.append(exc)

    first = threading.Thread(target=submit)
    first.start()
    assert dropping.wait(10)
    again = threading.Thread(target=submit)
    again.start()
    again.join(0.5)
    assert again.is_alive(), "the second was planned beside the first"
    go_on.set()
    first.join(10)
    again.join(10)
    assert len(answers) == 2 and answers[0] is answers[1], answers
    assert answers[0].plan.dropped == "t" and core.tables() == []
    # Another submission of the same text is a statement of its own.
    with pytest.raises(UnknownTableError, match="no table 't' to drop"):
        core.submit("DROP TABLE t", request_id="s.2", owner="ann")


class Crash(BaseException):
    """The scheduler dies here."""


def test_a_drop_that_took_effect_before_a_crash_answers_its_client_s_retry(
    tmp_path: Path, store: MemoryStateStore, cores: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table is dropped, then the scheduler dies before the statement's job is
    written: the restarted one answers the client's retry (same request id) as
    done, once, instead of "there is no table"."""
    first = cores(store)
    plan = first.plans.plan

    def die_on_the_answer(sql: str, *args: Any, **kwargs: Any) -> Any:
        if sql == writes.DROPPED:
            raise Crash
        return plan(sql, *args, **kwargs)

    monkeypatch.setattr(first.plans, "plan", die_on_the_answer)
    with pytest.raises(Crash):
        first.submit("DROP TABLE t", request_id="s.1", owner="ann")
    first.stop()
    held = store.load()
    assert table_key("t") not in held
    assert drop_key("ann", "s.1") in held
    second = cores(store)
    # Another user's id, or another id: statements of their own.
    for owner, request_id in (("bob", "s.1"), ("ann", "s.2")):
        with pytest.raises(UnknownTableError, match="no table 't' to drop"):
            second.submit("DROP TABLE t", request_id=request_id, owner=owner)
    answered = second.submit("DROP TABLE t", request_id="s.1", owner="ann")
    assert answered.plan.dropped == "t"
    assert drop_key("ann", "s.1") not in store.load()
    assert second.submit("DROP TABLE t", request_id="s.1", owner="ann") is answered
    second.stop()
    third = cores(store)  # the answer's job is what a retry finds now
    assert third.submit("DROP TABLE t", request_id="s.1", owner="ann").id == answered.id


@pytest.mark.parametrize("case", ["before the drop", "answer never asked for"])
def test_a_drop_kept_across_a_restart_answers_only_where_it_took_effect(
    tmp_path: Path, store: MemoryStateStore, cores: Any, case: str
) -> None:
    """One that died before dropping (its table still there) is forgotten and the
    retry drops; one kept longer than a client retries is forgotten too."""
    now = time.time()
    at = now - defaults.DROP_RETRY_KEEP_S - 60 if case == "answer never asked for" else now
    if case == "answer never asked for":
        store.commit({}, [table_key("t")])
    store.commit({drop_key("ann", "s.1"): encode(StoredDrop("ann", "s.1", "t", at))})
    core = cores(store)
    assert drop_key("ann", "s.1") not in store.load()
    if case == "before the drop":
        assert core.submit("DROP TABLE t", request_id="s.1", owner="ann").plan.dropped == "t"
        assert core.tables() == []
    else:
        with pytest.raises(UnknownTableError, match="no table 't' to drop"):
            core.submit("DROP TABLE t", request_id="s.1", owner="ann")


def test_a_drop_that_fails_leaves_nothing_for_a_retry(
    store: MemoryStateStore, cores: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = cores(store)

    def unwritable(*args: Any) -> None:
        raise OSError("the disk is read-only")

    monkeypatch.setattr(output, "drop", unwritable)
    with pytest.raises(OSError, match="read-only"):
        core.submit("DROP TABLE t", request_id="s.1", owner="ann")
    with pytest.raises(UnknownTableError):
        core.submit("DROP TABLE nothing", request_id="s.2", owner="ann")
    assert [t.name for t in core.tables()] == ["t"]
    assert not [k for k in store.load() if k.startswith("drops/")]


def test_the_admins_drop_call_sent_again_is_answered_once_before_and_after_a_restart(
    store: MemoryStateStore, cores: Any
) -> None:
    """``DropTable`` (the admins' call, ``Session.drop_table``): the call sent again
    after its answer was lost is answered as done, by the scheduler that dropped
    and, from the ``StoredDrop`` the call left, by the one after a restart; a call
    of another id or user says there is no table."""
    first = cores(store)
    assert first.drop_table_once("t", ("ann", "d.1"))
    assert first.tables() == []
    assert first.drop_table_once("T", ("ann", "d.1"))  # its answer lost: the same call
    assert not first.drop_table_once("t", ("ann", "d.2"))
    assert not first.drop_table_once("t", ("bob", "d.1"))
    assert not first.drop_table_once("t", None)  # a client that sends no id
    assert [k for k in store.load() if k.startswith("drops/")] == [drop_key("ann", "d.1")]
    first.stop()
    second = cores(store)
    assert second.drop_table_once("t", ("ann", "d.1"))
    assert not second.drop_table_once("t", ("ann", "d.3"))


def test_the_admins_drop_calls_are_kept_for_their_retries_an_hour_at_most(
    store: MemoryStateStore, cores: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = cores(store)
    assert core.drop_table_once("t", ("ann", "d.1"))
    assert not core.drop_table_once("nothing", ("ann", "d.2"))  # nothing kept for it
    later = time.time() + defaults.DROP_RETRY_KEEP_S + 60
    monkeypatch.setattr(core, "_clock", lambda: later)
    assert not core.drop_table_once("t", ("ann", "d.3"))
    assert not [k for k in store.load() if k.startswith("drops/")]
    assert not core.drop_table_once("t", ("ann", "d.1"))  # forgotten: the table's gone


def test_a_drop_planned_while_the_scheduler_begins_to_stop_is_answered_unavailable(
    store: MemoryStateStore, cores: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store deposed the scheduler while a ``DROP TABLE`` was planned: the
    commit thread, stopping, refused the drop ("was not dropped"). That error
    reached the client as the statement's own, which it does not send again; the
    store's error, which the service answers UNAVAILABLE, sends it to the leader
    (``scripts/soak.py --etcd-faults``, seed 107)."""
    core = cores(store)
    drop = core._commits.drop

    def deposed_meanwhile(*args: Any, **kwargs: Any) -> bool:
        core.fatal = StoreFencedError("this scheduler no longer leads the state store")
        core._commits.stop()
        return drop(*args, **kwargs)

    monkeypatch.setattr(core._commits, "drop", deposed_meanwhile)
    with pytest.raises(StoreFencedError, match="no longer leads") as caught:
        core.submit("DROP TABLE t", request_id="s.1", owner="ann")
    assert "was not dropped" in str(caught.value.__cause__)
    assert [t.name for t in core.tables()] == ["t"]


class _Aborted(Exception):
    pass


class _Context:
    """What ``service.abort`` needs of a gRPC context: it records the code."""

    code: grpc.StatusCode | None = None

    def set_trailing_metadata(self, metadata: object) -> None:
        pass

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def abort(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        raise _Aborted(message)


def test_a_drop_met_by_a_graceful_stop_is_answered_unavailable_and_drops_nothing(
    store: MemoryStateStore, cores: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler stopped on SIGTERM (no store error: ``fatal`` stays unset) while
    a ``DROP TABLE`` was planned: its commit thread refuses the drop. The call did
    nothing, so it is answered UNAVAILABLE, as the store's errors are, and the
    client sends it again once a scheduler answers; it was the statement's own
    failure (FAILED_PRECONDITION), which the client does not send again."""
    core = cores(store)
    drop = core._commits.drop

    def stopped_meanwhile(*args: Any, **kwargs: Any) -> bool:
        core._commits.stop()
        return drop(*args, **kwargs)

    monkeypatch.setattr(core._commits, "drop", stopped_meanwhile)
    with pytest.raises(SchedulerStoppingError, match="was not dropped") as caught:
        core.submit("DROP TABLE t", request_id="s.1", owner="ann")
    assert core.fatal is None
    assert [t.name for t in core.tables()] == ["t"]
    context = _Context()
    with pytest.raises(_Aborted, match="was not dropped"):
        service.abort(context, caught.value)  # type: ignore[arg-type]
    assert context.code is grpc.StatusCode.UNAVAILABLE
