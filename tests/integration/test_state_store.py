"""The ``StateStore`` contract, run against every store: SQLite, a real etcd, memory.

One suite for all stores, so that none of them drifts from the contract the
scheduler relies on: atomic commits, deletes of absent keys, values of any text,
persistence across reopening, one leader at a time, and fencing (a scheduler that
lost the lead writes nothing, even before it noticed).

The etcd server is real (``mangonel.testing.etcd.EtcdServer``, one per module);
each test works under its own key prefix. Memory stores take part where one store
instance is enough (they share nothing between instances).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from etcd3gw.client import Etcd3Client
from etcd3gw.lease import Lease
from helpers import safe_name

from mangonel.errors import StateStoreError, StateStoreUnreachableError, StoreFencedError
from mangonel.scheduler.persist import StateWriter, encode
from mangonel.scheduler.store import StateStore, open_store
from mangonel.scheduler.store.etcd import EtcdStateStore
from mangonel.scheduler.store.sqlite import SqliteStateStore
from mangonel.testing.etcd import EtcdServer

# The shortest lease etcd grants with its default election timeout (it raises 1 s to 2 s):
# keeps the expiry tests short.
SHORT_TTL_S = 2


@pytest.fixture(scope="module")
def etcd_server(module_dir: Path) -> Iterator[EtcdServer]:
    with EtcdServer(module_dir / "etcd") as server:
        yield server


class Backend:
    """Opens stores of one kind on one place (a file, an etcd prefix); closes them all."""

    def __init__(self, kind: str, url: str, etcd: EtcdServer | None = None) -> None:
        self.kind = kind
        self.url = url
        self.etcd = etcd
        self.opened: list[StateStore] = []

    def open(self, url: str | None = None) -> StateStore:
        store = open_store(url or self.url)
        self.opened.append(store)
        return store

    def depose_behind_its_back(self, store: StateStore) -> None:
        """Take the lead from ``store`` without telling it, as a pause or partition would."""
        if isinstance(store, SqliteStateStore):
            assert store._lock_fd is not None
            fcntl.flock(store._lock_fd, fcntl.LOCK_UN)  # as if the lock were lost
        elif isinstance(store, EtcdStateStore):
            assert store._lease_id is not None and self.etcd is not None
            store._pause_keepalive_for_test()  # a frozen leader refreshes nothing
            host, port = self.etcd.endpoint.split(":")
            Lease(store._lease_id, Etcd3Client(host, int(port), timeout=5)).revoke()
        else:
            raise AssertionError(f"no way to depose a {type(store).__name__}")

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


def _backend(kind: str, request: pytest.FixtureRequest, work_dir: Path) -> Iterator[Backend]:
    if kind == "sqlite":
        backend = Backend(kind, f"sqlite://{work_dir / 'state.db'}")
    elif kind == "etcd":
        etcd = request.getfixturevalue("etcd_server")
        prefix = f"/test/{safe_name(request.node.name)}/"
        backend = Backend(kind, etcd.url(prefix) + f"?ttl_s={SHORT_TTL_S}", etcd)
    else:
        backend = Backend(kind, "memory://")
    try:
        yield backend
    finally:
        backend.close_all()


@pytest.fixture(params=["memory", "sqlite", "etcd"])
def any_store(request: pytest.FixtureRequest, work_dir: Path) -> Iterator[Backend]:
    """Every store kind, for tests that use one store instance."""
    yield from _backend(request.param, request, work_dir)


@pytest.fixture(params=["sqlite", "etcd"])
def shared_store(request: pytest.FixtureRequest, work_dir: Path) -> Iterator[Backend]:
    """The durable store kinds, for tests that open one place twice."""
    yield from _backend(request.param, request, work_dir)


@pytest.fixture
def etcd_store(request: pytest.FixtureRequest, work_dir: Path) -> Iterator[Backend]:
    yield from _backend("etcd", request, work_dir)


def _leading(backend: Backend, owner: str = "A") -> StateStore:
    store = backend.open()
    assert store.acquire(owner, timeout_s=10)
    return store


# ---------------------------------------------------------------------- data


def test_commit_then_load_round_trips(any_store: Backend) -> None:
    store = _leading(any_store)
    assert store.load() == {}
    store.commit({"jobs/1/plan": '{"a": 1}', "jobs/1/state": "RUNNING"})
    store.commit({"jobs/1/state": "DONE", "executors/e1": "{}"})
    assert store.load() == {
        "jobs/1/plan": '{"a": 1}',
        "jobs/1/state": "DONE",
        "executors/e1": "{}",
    }


def test_deletes_apply_and_absent_keys_are_fine(any_store: Backend) -> None:
    store = _leading(any_store)
    store.commit({"a": "1", "b": "2", "c": "3"})
    store.commit({"d": "4"}, deletes=["a", "never-there", "c"])
    assert store.load() == {"b": "2", "d": "4"}
    store.commit({}, deletes=["b"])
    assert store.load() == {"d": "4"}


def test_a_key_put_and_deleted_in_one_commit_is_put(any_store: Backend) -> None:
    store = _leading(any_store)
    store.commit({"k": "old"})
    store.commit({"k": "new"}, deletes=["k"])
    assert store.load() == {"k": "new"}


def test_unicode_and_large_values_survive(any_store: Backend) -> None:
    store = _leading(any_store)
    large = "".join(chr(32 + i % 90) for i in range(500_000))  # ~500 KB of text
    values = {
        "text/unicode": "naïve café ☃ 日本語 🚀 \u0000 nul",
        "text/ключ-ü": "ключ in the key too",
        "text/empty": "",
        "text/json": '{"quote": "\\"", "newline": "\\n"}\n',
        "blob/large": large,
    }
    store.commit(values)
    assert store.load() == values


def test_many_keys_over_many_commits(any_store: Backend) -> None:
    store = _leading(any_store)
    expected = {}
    for batch in range(12):  # 100 puts per commit: under etcd's 128 operations
        puts = {f"tasks/{batch:02d}/{i:03d}": f"attempt {batch}.{i}" for i in range(100)}
        store.commit(puts)
        expected.update(puts)
    # More keys than one etcd range page holds: load must page through all of them.
    assert store.load() == expected


def test_reopened_store_has_the_state(shared_store: Backend) -> None:
    first = _leading(shared_store)
    first.commit({"jobs/1": "x", "jobs/2": "y"}, deletes=["jobs/3"])
    first.close()
    second = _leading(shared_store, "B")
    assert second.load() == {"jobs/1": "x", "jobs/2": "y"}


# ---------------------------------------------------------------- leadership


def test_nobody_leads_before_acquire(any_store: Backend) -> None:
    store = any_store.open()
    assert store.leader() is None


def test_commit_without_acquire_is_fenced(any_store: Backend) -> None:
    store = any_store.open()
    with pytest.raises(StoreFencedError, match="no longer leads"):
        store.commit({"k": "v"})
    assert store.deposed.is_set()
    assert store.load() == {}


def test_acquire_is_exclusive_and_leader_names_the_owner(shared_store: Backend) -> None:
    first = _leading(shared_store, "scheduler-a:50050")
    second = shared_store.open()
    assert second.acquire("scheduler-b:50050", timeout_s=0.5) is False
    assert second.leader() == "scheduler-a:50050"
    assert first.leader() == "scheduler-a:50050"
    with pytest.raises(StoreFencedError):
        second.commit({"k": "from the follower"})
    first.commit({"k": "from the leader"})
    assert second.load() == {"k": "from the leader"}


def test_resign_lets_another_acquire(shared_store: Backend) -> None:
    first = _leading(shared_store, "A")
    first.commit({"k": "1"})
    second = shared_store.open()
    first.resign()
    assert first.deposed.is_set()
    assert second.acquire("B", timeout_s=10)
    assert second.leader() == "B"
    with pytest.raises(StoreFencedError):
        first.commit({"k": "stale"})
    second.commit({"k": "2"})
    assert first.load() == {"k": "2"}


def test_close_releases_the_lead(shared_store: Backend) -> None:
    first = _leading(shared_store, "A")
    first.close()
    second = shared_store.open()
    assert second.acquire("B", timeout_s=10)


def test_a_resigned_store_can_lead_again(shared_store: Backend) -> None:
    store = _leading(shared_store, "A")
    store.resign()
    assert store.acquire("A", timeout_s=10)
    assert not store.deposed.is_set()
    store.commit({"k": "again"})
    assert store.load() == {"k": "again"}


def test_deposed_writer_is_fenced_and_writes_nothing(shared_store: Backend) -> None:
    old = _leading(shared_store, "old")
    old.commit({"jobs/1": "v1", "jobs/2": "v1"})
    shared_store.depose_behind_its_back(old)
    new = shared_store.open()
    assert new.acquire("new", timeout_s=10)
    new.commit({"jobs/1": "v2"})
    # The old leader has not noticed: only the store's own check can stop its write.
    assert not old.deposed.is_set()
    with pytest.raises(StoreFencedError, match="no longer leads"):
        old.commit({"jobs/1": "stale", "jobs/9": "stale"}, deletes=["jobs/2"])
    assert old.deposed.is_set()
    assert new.load() == {"jobs/1": "v2", "jobs/2": "v1"}


# --------------------------------------------------------------- etcd leases


def test_etcd_lease_of_a_killed_leader_runs_out(etcd_store: Backend, work_dir: Path) -> None:
    with open(work_dir / "holder.log", "wb") as holder_log:
        _run_and_kill_a_leader(etcd_store, holder_log)


def _run_and_kill_a_leader(etcd_store: Backend, holder_log: IO[bytes]) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time
                from mangonel.scheduler.store import open_store
                store = open_store({etcd_store.url!r})
                assert store.acquire("doomed", timeout_s=10)
                store.commit({{"jobs/1": "from the doomed leader"}})
                print("leading", flush=True)
                time.sleep(120)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        stderr=holder_log,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "leading\n"
        follower = etcd_store.open()
        assert follower.acquire("follower", timeout_s=0.5) is False
        assert follower.leader() == "doomed"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        # The lease (TTL 2 s) runs out without keep-alives; the follower takes over.
        assert follower.acquire("follower", timeout_s=SHORT_TTL_S + 8)
        assert follower.leader() == "follower"
        assert follower.load() == {"jobs/1": "from the doomed leader"}
        follower.commit({"jobs/1": "from the follower"})
    finally:
        holder.kill()
        holder.wait()


def test_etcd_lost_lease_sets_deposed(etcd_store: Backend) -> None:
    store = _leading(etcd_store, "A")
    assert isinstance(store, EtcdStateStore) and store._lease_id is not None
    host, port = etcd_store.etcd.endpoint.split(":")  # type: ignore[union-attr]
    Lease(store._lease_id, Etcd3Client(host, int(port), timeout=5)).revoke()
    # The keep-alive thread hears that the lease is gone at its next refresh.
    assert store.deposed.wait(timeout=SHORT_TTL_S + 5)
    other = etcd_store.open()
    assert other.acquire("B", timeout_s=10)
    with pytest.raises(StoreFencedError):
        store.commit({"k": "stale"})
    assert other.load() == {}


def test_etcd_unreachable_while_leading_deposes(work_dir: Path) -> None:
    with EtcdServer(work_dir / "etcd") as etcd:
        store = open_store(etcd.url("/p/") + f"?ttl_s={SHORT_TTL_S}")
        try:
            assert store.acquire("A", timeout_s=10)
            etcd.pause()
            try:
                # No refresh gets through before the lease would run out: deposed.
                assert store.deposed.wait(timeout=SHORT_TTL_S + 8)
                with pytest.raises(StoreFencedError):
                    store.commit({"k": "v"})
            finally:
                etcd.resume()
        finally:
            store.close()


def test_etcd_restarted_within_the_lease_takes_the_write_that_waited_for_it(
    work_dir: Path,
) -> None:
    """A commit sent while etcd restarts waits for it, as long as the lease may
    hold: etcd keeps its leases across a restart, so the scheduler still leads
    and its write goes through. It failed at once before, and a failed write
    stops the scheduler (``scripts/soak.py --etcd-faults``)."""
    with EtcdServer(work_dir / "etcd") as etcd:
        store = open_store(etcd.url("/p/") + "?ttl_s=5")
        try:
            assert store.acquire("A", timeout_s=10)
            etcd.kill()
            outcome: dict[str, object] = {}

            def write() -> None:
                try:
                    store.commit({"k": "v"})
                    outcome["done"] = time.monotonic()
                except StateStoreError as exc:
                    outcome["error"] = exc

            writer = threading.Thread(target=write)
            writer.start()
            time.sleep(1.0)
            assert writer.is_alive(), outcome  # waiting, not failed
            etcd.start()
            writer.join(10)
            assert "done" in outcome, outcome
            assert not store.deposed.is_set()
            assert store.load() == {"k": "v"}
            assert store.leader() == "A"
        finally:
            store.close()


def test_etcd_away_past_the_lease_fails_the_write_that_waited(work_dir: Path) -> None:
    with EtcdServer(work_dir / "etcd") as etcd:
        store = open_store(etcd.url("/p/") + f"?ttl_s={SHORT_TTL_S}")
        try:
            assert store.acquire("A", timeout_s=10)
            etcd.kill()
            started = time.monotonic()
            with pytest.raises(StateStoreError):
                store.commit({"k": "v"})
            # Not at once, and not much past the lease (a grant of 2 s, counted from
            # the last refresh sent; each try of a refused connection is quick).
            assert 0.2 < time.monotonic() - started < SHORT_TTL_S + 4
        finally:
            etcd.start()
            store.close()


def test_etcd_leader_wait_times_out_then_succeeds(etcd_store: Backend) -> None:
    first = _leading(etcd_store, "A")
    second = etcd_store.open()
    started = time.monotonic()
    assert second.acquire("B", timeout_s=0.6) is False
    assert time.monotonic() - started >= 0.6
    first.resign()
    assert second.acquire("B", timeout_s=10)
    assert first.leader() == "B"


def test_etcd_a_standby_waits_through_etcd_out_of_reach_then_leads(work_dir: Path) -> None:
    """etcd stopped and started again under a standby waiting for the lead: the standby
    keeps waiting (it said so once), and leads once the old leader's lease runs out."""
    with EtcdServer(work_dir / "etcd") as etcd:
        url = etcd.url("/p/") + f"?ttl_s={SHORT_TTL_S}"
        leader, standby = open_store(url), open_store(url)
        try:
            assert leader.acquire("A", timeout_s=10)
            outcome: dict[str, object] = {}

            def wait_for_the_lead() -> None:
                try:
                    outcome["acquired"] = standby.acquire("B")  # no timeout: a standby
                except BaseException as exc:  # noqa: BLE001 - checked below
                    outcome["error"] = exc

            waiting = threading.Thread(target=wait_for_the_lead, daemon=True)
            waiting.start()
            etcd.stop()
            time.sleep(2)  # ten polls of the standby meet no etcd
            assert waiting.is_alive(), outcome
            leader.close()  # as a leader that died meanwhile: its lease is not refreshed
            etcd.start()
            waiting.join(timeout=SHORT_TTL_S + 20)
            assert outcome == {"acquired": True}
            assert standby.leader() == "B"
            standby.commit({"k": "from the standby"})
        finally:
            leader.close()
            standby.close()


def test_etcd_not_answering_yet_is_waited_for_at_open(work_dir: Path) -> None:
    with EtcdServer(work_dir / "etcd") as etcd:
        url = etcd.url("/p/")
        etcd.stop()
        said: list[str] = []
        threading.Timer(2.0, etcd.start).start()
        store = open_store(url, wait_s=30, on_wait=said.append)
        try:
            assert store.acquire("A", timeout_s=10)
        finally:
            store.close()
        assert len(said) == 1 and said[0].startswith("waiting up to 30 s for the state store: "), (
            said
        )
        assert "cannot reach the etcd state store" in said[0]
    # Given no time to wait, it fails at once, as it did before there was a wait.
    started = time.monotonic()
    with pytest.raises(StateStoreUnreachableError, match="cannot reach the etcd state store"):
        open_store(f"etcd://127.0.0.1:{_dead_port()}")
    assert time.monotonic() - started < 5


def test_etcd_that_never_answers_fails_the_open_after_the_wait() -> None:
    started = time.monotonic()
    with pytest.raises(StateStoreUnreachableError, match=r"waited 1.5 s for it \(--state-wait\)"):
        open_store(f"etcd://127.0.0.1:{_dead_port()}", wait_s=1.5)
    assert 1.5 <= time.monotonic() - started < 10


# ----------------------------------------------------------------- etcd limits


def test_etcd_refuses_a_commit_over_the_operation_limit_and_writes_nothing(
    etcd_store: Backend,
) -> None:
    store = _leading(etcd_store)
    store.commit({f"k/{i:03d}": "x" for i in range(128)})  # exactly the limit: fine
    with pytest.raises(StateStoreError, match=r"limit of 128 operations.*--max-txn-ops"):
        store.commit({f"n/{i:03d}": "y" for i in range(100)}, deletes=[f"k/{i}" for i in range(29)])
    assert store.load() == {f"k/{i:03d}": "x" for i in range(128)}
    assert not store.deposed.is_set()


def test_etcd_refuses_a_commit_over_the_size_limit_and_writes_nothing(
    etcd_store: Backend,
) -> None:
    store = _leading(etcd_store)
    with pytest.raises(StateStoreError, match=r"limit of 1572864 bytes.*--max-request-bytes"):
        store.commit({"a": "x" * 800_000, "b": "y" * 800_000})
    assert store.load() == {}


def test_etcd_size_check_is_not_laxer_than_etcd(etcd_store: Backend) -> None:
    store = _leading(etcd_store)
    assert isinstance(store, EtcdStateStore)
    # The largest single value the store's own check lets through: etcd must take it.
    # (If the check's overhead estimate were too small, etcd would refuse this.)
    from mangonel.scheduler.store import etcd as store_etcd

    key = "blob"
    room = store.max_request_bytes - store_etcd._TXN_OVERHEAD - store_etcd._OP_OVERHEAD
    value = "z" * (room - len(store._state_key(key)))
    store.commit({key: value})
    assert store.load() == {key: value}
    with pytest.raises(StateStoreError, match="--max-request-bytes"):
        store.commit({key: value + "z"})


def test_etcd_prefixes_keep_pairs_apart(etcd_server: EtcdServer) -> None:
    one = open_store(etcd_server.url("/pair/one/"))
    other = open_store(etcd_server.url("/pair/one2/"))
    try:
        assert one.acquire("A", timeout_s=10) and other.acquire("B", timeout_s=10)
        one.commit({"k": "one"})
        other.commit({"k": "other"})
        assert one.load() == {"k": "one"} and other.load() == {"k": "other"}
        assert one.leader() == "A" and other.leader() == "B"
    finally:
        one.close()
        other.close()


# ----------------------------------------------------- reaching and opening


def _dead_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nobody listens once the socket is closed


def test_etcd_falls_over_to_the_next_endpoint(etcd_server: EtcdServer) -> None:
    url = f"etcd://127.0.0.1:{_dead_port()},{etcd_server.endpoint}/failover/"
    store = open_store(url)
    try:
        assert store.acquire("A", timeout_s=10)
        store.commit({"k": "v"})
        assert store.load() == {"k": "v"}
    finally:
        store.close()


def test_unreachable_etcd_is_a_clear_error_at_open() -> None:
    port_a, port_b = _dead_port(), _dead_port()
    with pytest.raises(StateStoreError) as caught:
        open_store(f"etcd://127.0.0.1:{port_a},127.0.0.1:{port_b}")
    message = str(caught.value)
    assert f"127.0.0.1:{port_a}" in message and f"127.0.0.1:{port_b}" in message
    assert "cannot reach" in message and "etcd runs" in message


def test_a_file_that_is_not_sqlite_is_a_clear_error(work_dir: Path) -> None:
    path = work_dir / "state.db"
    path.write_bytes(b"this is no database\n" * 500)
    with pytest.raises(StateStoreError, match="not a readable SQLite database.*move it aside"):
        open_store(f"sqlite://{path}")


def test_a_truncated_sqlite_file_is_a_clear_error(work_dir: Path) -> None:
    path = work_dir / "state.db"
    store = open_store(f"sqlite://{path}")
    assert store.acquire("A", timeout_s=1)
    store.commit({f"k/{i}": "v" * 1000 for i in range(200)})
    store.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(StateStoreError, match="state.db"):
        open_store(f"sqlite://{path}").load()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("etcd://", "not an etcd URL"),
        ("etcd://127.0.0.1:port", "no valid port"),
        ("etcd://127.0.0.1:99999", "out of range"),
        ("etcd://127.0.0.1:2379,,127.0.0.1:2380", "empty host"),
        ("etcd://127.0.0.1:2379/p?ttl_s=soon", "whole number"),
        ("etcd://127.0.0.1:2379/p?lease=3", "unknown option"),
        ("etcd://127.0.0.1:2379/p?ttl_s=0", "TTL must be"),
        ("zookeeper://127.0.0.1:2181", "unknown state store"),
        ("sqlite://", "names no file"),
    ],
)
def test_a_bad_url_is_a_clear_error(url: str, says: str) -> None:
    with pytest.raises(StateStoreError, match=says):
        open_store(url)


def test_the_scheduler_writes_a_change_over_etcds_limits_in_several_commits(
    etcd_store: Backend,
) -> None:
    """The store refuses a commit over its limits (above); the scheduler's writer
    splits such a change (every document whole) so that etcd takes all of it."""
    store = _leading(etcd_store)
    writer = StateWriter(store, {})
    docs: dict[str, object] = {f"jobs/{i:03d}/progress": {"n": i} for i in range(300)}
    docs |= {"jobs/big/plan": "p" * 900_000, "executors": [], "meta": {}}
    writer.commit(docs)
    assert store.load() == {k: encode(v) for k, v in docs.items()}
    writer.commit({}, [f"jobs/{i:03d}/progress" for i in range(200)])
    assert len(store.load()) == 103
