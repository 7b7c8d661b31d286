"""A highly available pair of schedulers on a real etcd: the standby takes over.

Two scheduler processes share one etcd state store; the first leads (it holds
an etcd lease), the second waits as the standby. Executors and the client are
given both addresses. The tests kill the leader in the middle of a TPC-H query
(deterministically, with a crash rule: ``mangonel.testing.crash``) and check
that the standby finishes the same job with DuckDB's answer; that a restarted
old leader stays a standby; and that a leader frozen past its lease, once
thawed, finds itself deposed and stops without writing.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import requests
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query

from mangonel.client.cluster import LocalCluster, ProcessHandle
from mangonel.client.session import Result, Session
from mangonel.client.status import ExecutorState, JobState
from mangonel.testing.cluster import TestCluster
from mangonel.testing.etcd import EtcdServer

pytestmark = pytest.mark.timeout(180)

LEASE_TTL_S = 2
MID_QUERY = {"event": "TaskCompleted", "nth": 3}


@pytest.fixture(scope="module")
def etcd(module_dir: Path) -> Iterator[EtcdServer]:
    with EtcdServer(module_dir / "etcd") as server:
        yield server


@pytest.fixture
def pair(work_dir: Path, etcd: EtcdServer, tpch_tables: dict[str, Path]) -> Iterator[LocalCluster]:
    state = etcd.url(f"/mangonel/{work_dir.name}/") + f"?ttl_s={LEASE_TTL_S}"
    with LocalCluster(
        executors=2,
        slots=2,
        work_dir=work_dir / "cluster",
        heartbeat_timeout=5.0,
        state=state,
        schedulers=2,
        # Small splits: at SF 0.1 every table is one task's worth, and one-task stages
        # are planned as one; q9 then ran as one task, with no middle to crash in.
        scheduler_args=(
            "--crash-file",
            str(work_dir / "crash.json"),
            "--broadcast-bytes",
            "0",
            "--split-rows",
            "100000",
        ),
    ) as cluster:
        with cluster.connect() as session:
            for name, path in tpch_tables.items():
                session.register_parquet(name, str(path))
        yield cluster


def wait_for_log(proc: ProcessHandle, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.log_tail():
        assert proc.alive(), proc.log_tail()
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{proc.log_tail()}"
        time.sleep(0.1)


def wait_until_running(session: Session, timeout: float = 30.0) -> None:
    """Until a job of the session's scheduler runs tasks."""
    deadline = time.monotonic() + timeout
    while not any(j.state is JobState.RUNNING for j in session.status().jobs):
        assert time.monotonic() < deadline, "no job ran"
        time.sleep(0.05)


def check(result: Result, number: int, reference: duckdb.DuckDBPyConnection) -> None:
    expected = reference.sql(tpch_query(number)).to_arrow_table()
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)


def in_background(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def finished(thread: threading.Thread, outcome: dict[str, Any]) -> Any:
    thread.join(120)
    assert not thread.is_alive(), "the query did not finish after the failover"
    if "error" in outcome:
        raise AssertionError(f"the query failed across the failover: {outcome['error']!r}")
    return outcome["result"]


def test_leader_killed_mid_query_the_standby_finishes_it_and_the_old_leader_stays_standby(
    pair: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection, work_dir: Path
) -> None:
    leader = pair.schedulers[0]
    standby = pair.schedulers[1]
    assert leader is not None and standby is not None
    wait_for_log(standby, "waiting as the standby")
    with pair.connect() as session:
        (work_dir / "crash.json").write_text(json.dumps([MID_QUERY]))
        thread, outcome = in_background(lambda: session.sql(tpch_query(9)))
        try:
            code = leader.process.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the crash rule never fired:\n{leader.log_tail()}")
        died = time.monotonic()
        assert code == -signal.SIGKILL
        (work_dir / "crash.json").write_text("[]")
        assert pair.wait_for_leader(timeout=30, exclude=0) == 1
        took_over_s = time.monotonic() - died
        result = finished(thread, outcome)
        check(result, 9, duckdb_ref)
        # Within a few seconds: the lease's TTL plus starting to serve.
        assert took_over_s < LEASE_TTL_S + 10, f"the standby took {took_over_s:.1f} s"
        # The same job, finished by the new leader, with both executors reattached.
        status = session.status()
        job = next(j for j in status.jobs if j.job_id == result.job_id)
        assert job.state is JobState.SUCCEEDED
        assert len([j for j in status.jobs if j.sql == tpch_query(9)]) == 1, status.jobs
        alive = {e.id for e in status.executors if e.state is ExecutorState.ALIVE}
        assert alive == {h.id for h in pair.executors}, status.executors

        # The old leader comes back: it waits as the standby, it does not serve.
        offset = leader.log_path.stat().st_size  # the restarted one appends to the same log
        pair.restart_scheduler(0, wait=False)
        restarted = pair.schedulers[0]
        assert restarted is not None
        wait_for_log(restarted, "waiting as the standby")
        again = session.sql(tpch_query(3))
        check(again, 3, duckdb_ref)
        assert restarted.alive()
        assert not (pair.work_dir / "scheduler-0.address").exists()
        assert "listening" not in restarted.log_path.read_text()[offset:]


def test_a_frozen_leader_is_deposed_and_stops_without_writing_when_thawed(
    pair: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    leader = pair.schedulers[0]
    assert leader is not None
    with pair.connect() as session:
        first = session.sql(tpch_query(12))
        check(first, 12, duckdb_ref)
        pair.kill_scheduler(0, signal.SIGSTOP)  # frozen: its lease runs out
        assert pair.wait_for_leader(timeout=30, exclude=0) == 1
        leader.signal(signal.SIGCONT)
        # Thawed, it finds its lease gone: it stops with status 3, having written nothing.
        assert leader.process.wait(30) == 3, leader.log_tail()
        assert "lost the lead of its state store: " in leader.log_tail(), leader.log_tail()
        # The client follows the new leader, which knows the finished job.
        jobs = {j.job_id: j.state for j in session.status().jobs}
        assert jobs.get(first.job_id) is JobState.SUCCEEDED, jobs
        result = session.sql(tpch_query(12))
        check(result, 12, duckdb_ref)


def test_a_standby_deposed_while_it_recovers_stops_as_a_deposed_leader_does(
    pair: LocalCluster, duckdb_ref: duckdb.DuckDBPyConnection, work_dir: Path
) -> None:
    """The standby takes the lead and is frozen while it reads the store back,
    past its lease; the other scheduler, started again, takes the lead. Thawed,
    the first finds its first write refused: it stops with status 3, as a
    deposed leader does, not 1 as for an error of its own (a randomized run,
    ``scripts/soak.py`` seed 101, froze a standby that had just taken the lead)."""
    standby = pair.schedulers[1]
    assert standby is not None
    wait_for_log(standby, "waiting as the standby")
    with pair.connect() as session:
        check(session.sql(tpch_query(12)), 12, duckdb_ref)  # the store holds a job
        rule = {"event": "*", "point": "recovering", "action": "freeze"}
        (work_dir / "crash.json").write_text(json.dumps([rule]))
        pair.kill_scheduler(0)
        wait_for_log(standby, "freezing the scheduler")
        (work_dir / "crash.json").write_text("[]")
        pair.restart_scheduler(0, wait=False)
        assert pair.wait_for_leader(timeout=30, exclude=1) == 0
        standby.signal(signal.SIGCONT)
        assert standby.process.wait(30) == 3, standby.log_tail()
        log_text = standby.log_tail()
        assert "the scheduler stops: this scheduler no longer leads" in log_text, log_text
        assert "it no longer leads its state store; started again (status 3)" in log_text
        check(session.sql(tpch_query(12)), 12, duckdb_ref)


def revoke_leader_lease(etcd: EtcdServer, prefix: str) -> None:
    """Revoke the lease the leader key is bound to, as etcd does to a lease whose
    refreshes stopped getting through: the key goes with it."""
    base = f"{etcd.scheme}://{etcd.endpoint}/v3"
    key = base64.b64encode(f"{prefix}leader".encode()).decode()
    kvs = requests.post(f"{base}/kv/range", json={"key": key}, timeout=10).json()["kvs"]
    lease = kvs[0]["lease"]
    requests.post(f"{base}/lease/revoke", json={"ID": lease}, timeout=10).raise_for_status()


def test_a_lone_scheduler_that_lost_its_lease_is_started_again_and_the_client_waits_for_it(
    work_dir: Path,
    etcd: EtcdServer,
    tpch_tables: dict[str, Path],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    """No standby: the scheduler whose lease ran out finds it out at its next write,
    which is a client's call. That call must not fail the client with the store's
    error: the scheduler stops (status 3), its supervisor starts it again, and the
    client's call goes through to it."""
    prefix = f"/mangonel/{work_dir.name}/"
    # A long lease: its refresh (every 20 s) does not find the revoke before the write does.
    state = etcd.url(prefix) + "?ttl_s=60"
    with LocalCluster(executors=1, slots=2, work_dir=work_dir / "cluster", state=state) as cluster:
        scheduler = cluster.schedulers[0]
        assert scheduler is not None
        with cluster.connect() as session:
            for name in ("lineitem", "orders"):
                session.register_parquet(name, str(tpch_tables[name]))
            revoke_leader_lease(etcd, prefix)
            # The call that finds the lease gone: registering the rest of the tables.
            rest = {n: p for n, p in tpch_tables.items() if n not in ("lineitem", "orders")}
            thread, outcome = in_background(
                lambda: [session.register_parquet(n, str(p)) for n, p in rest.items()]
            )
            assert scheduler.process.wait(30) == 3, scheduler.log_tail()
            log_text = scheduler.log_tail()
            assert "the scheduler stops: this scheduler no longer leads" in log_text, log_text
            assert "lost the lead of its state store: its lease on" in log_text, log_text
            cluster.restart_scheduler(0)  # as its supervisor would (compose, systemd, k8s)
            finished(thread, outcome)
            assert {t.name for t in session.tables()} >= set(tpch_tables)
            check(session.sql(tpch_query(12)), 12, duckdb_ref)
            check(session.sql(tpch_query(3)), 3, duckdb_ref)


def test_a_scheduler_started_before_its_etcd_answers_waits_for_it_then_serves(
    work_dir: Path, tpch_tables: dict[str, Path], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """A scheduler starting while etcd does not answer yet (compose starts them
    together; a restarted container's name may not resolve for a moment) waits for
    it, saying so once, instead of exiting: it serves once etcd is there."""
    with EtcdServer(work_dir / "etcd") as etcd:
        state = etcd.url("/mangonel/late/")
        etcd.stop()
        timer = threading.Timer(3.0, etcd.start)  # while the scheduler waits for it
        timer.start()
        try:
            with LocalCluster(
                executors=1, slots=2, work_dir=work_dir / "cluster", state=state
            ) as cluster:
                scheduler = cluster.schedulers[0]
                assert scheduler is not None
                log_text = scheduler.log_tail()
                assert log_text.count("waiting up to 60 s for the state store: ") == 1, log_text
                assert "cannot reach the etcd state store" in log_text, log_text
                with cluster.connect() as session:
                    for name, path in tpch_tables.items():
                        session.register_parquet(name, str(path))
                    check(session.sql(tpch_query(3)), 3, duckdb_ref)
        finally:
            timer.join()


def test_etcd_restarted_under_a_submission_the_scheduler_goes_on_leading(
    work_dir: Path, tpch_tables: dict[str, Path], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """etcd dies and comes back within the scheduler's lease while a query is
    submitted: the submission's write waits for it, and the scheduler goes on
    leading, the same process, instead of stopping for a failed write and
    recovering everything (``scripts/soak.py --etcd-faults``)."""
    with EtcdServer(work_dir / "etcd") as etcd:
        state = etcd.url("/mangonel/blip/") + "?ttl_s=5"
        with LocalCluster(
            executors=2, slots=1, work_dir=work_dir / "cluster", state=state
        ) as cluster:
            scheduler = cluster.schedulers[0]
            assert scheduler is not None
            with cluster.connect() as session:
                for name, path in tpch_tables.items():
                    session.register_parquet(name, str(path))
                etcd.kill()
                thread, outcome = in_background(lambda: session.sql(tpch_query(12)))
                wait_for_log(scheduler, "the write waits while this scheduler's lease holds")
                etcd.start()
                check(finished(thread, outcome), 12, duckdb_ref)
                assert scheduler.alive(), scheduler.log_tail()
                assert cluster.schedulers[0] is scheduler
                log_text = scheduler.log_tail()
                assert "answers again: the write went through" in log_text, log_text
                assert "the scheduler stops" not in log_text, log_text


def test_etcd_gone_mid_query_the_scheduler_started_again_waits_for_it_and_finishes_the_job(
    work_dir: Path, tpch_tables: dict[str, Path], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """The state store goes away under a running job: the scheduler's next write
    fails, so it stops (status 3); its supervisor starts it again while etcd is
    still down, and it waits for etcd (``--state-wait``) instead of failing again;
    etcd back, it takes the lead, recovers the job, the executors reattach, and
    the client gets DuckDB's answer."""
    with EtcdServer(work_dir / "etcd") as etcd:
        state = etcd.url("/mangonel/gone/") + f"?ttl_s={LEASE_TTL_S}"
        with TestCluster(
            executors=2, slots=1, work_dir=work_dir / "cluster", state=state
        ) as cluster:
            scheduler = cluster.schedulers[0]
            assert scheduler is not None
            with cluster.connect() as session:
                for name, path in tpch_tables.items():
                    session.register_parquet(name, str(path))
                # Stage 1's tasks wait 2 s at their start: etcd goes while they run.
                cluster.set_faults_all([{"action": "delay", "seconds": 2.0, "stage": 1}])
                thread, outcome = in_background(lambda: session.sql(tpch_query(9)))
                wait_until_running(session)
                etcd.stop()
                assert scheduler.process.wait(30) == 3, scheduler.log_tail()
                cluster.set_faults_all([])
                cluster.restart_scheduler(0, wait=False)
                restarted = cluster.schedulers[0]
                assert restarted is not None
                wait_for_log(restarted, "waiting up to 60 s for the state store: ")
                etcd.start()
                cluster.wait_for_leader(60)
                check(finished(thread, outcome), 9, duckdb_ref)
                assert "recovered 1 unfinished jobs" in restarted.log_tail(), restarted.log_tail()
