"""Real executor processes against a real scheduler: register, run a job, stop cleanly.

The scheduler runs in this process (its core is inspected directly); each
executor is a ``python -m mangonel.executor.main`` subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from mangonel.executor.memory import set_huge_pages
from mangonel.scheduler.jobs import JobWatch
from mangonel.scheduler.main import SchedulerConfig, SchedulerServer, start_scheduler
from mangonel.scheduler.state_views import ExecutorState, JobState

QUERY = """
SELECT c.c_segment, count(*) AS orders, sum(o.o_total) AS total
FROM orders o JOIN customer c ON o.o_custkey = c.c_custkey
WHERE o.o_total > 10
GROUP BY c.c_segment
ORDER BY total DESC
"""


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(0.05)


@pytest.fixture()
def tables(tmp_path: Path) -> dict[str, str]:
    n = 40_000
    orders = pa.table(
        {
            "o_orderkey": pa.array(range(n), pa.int64()),
            "o_custkey": pa.array([(i * 7) % 1000 for i in range(n)], pa.int64()),
            "o_total": pa.array([(i * 13) % 997 / 10 for i in range(n)]),
        }
    )
    customer = pa.table(
        {
            "c_custkey": pa.array(range(1000), pa.int64()),
            "c_segment": pa.array(
                [["AUTO", "BUILDING", "MACHINERY"][i % 3] for i in range(1000)], pa.string_view()
            ),
        }
    )
    paths = {"orders": str(tmp_path / "orders.parquet"), "customer": str(tmp_path / "c.parquet")}
    pq.write_table(orders, paths["orders"], row_group_size=5_000)
    pq.write_table(customer, paths["customer"])
    return paths


@pytest.fixture()
def scheduler(tmp_path: Path) -> Iterator[SchedulerServer]:
    # Small splits and no broadcast so the job really shuffles between executors.
    server = start_scheduler(
        SchedulerConfig(
            port=0,
            partitions=3,
            split_rows=10_000,
            broadcast_bytes=0,
            state=f"sqlite://{tmp_path / 'scheduler.db'}",
        )
    )
    yield server
    server.stop()


def spawn(
    scheduler: SchedulerServer, work_dir: Path, host: str, *extra: str
) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "mangonel.executor.main",
        "--scheduler", scheduler.address, "--slots", "2", "--threads", "1",
        "--memory-limit", "512MB", "--work-dir", str(work_dir), "--host-id", host, *extra,
    ]  # fmt: skip
    log = open(work_dir.parent / f"{work_dir.name}.log", "w")  # noqa: SIM115 (the child owns it)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)


@pytest.fixture()
def executors(scheduler: SchedulerServer, tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    # Two "hosts", so partitions move over Flight as well as by memory map.
    procs = [spawn(scheduler, tmp_path / f"exec{i}", f"host{i}") for i in range(2)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert "registered with" in proc.stdout.readline()
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def alive(scheduler: SchedulerServer) -> int:
    return sum(e.view.state is ExecutorState.ALIVE for e in scheduler.core.executors())


def finished(record: JobWatch) -> bool:
    return record.state.finished


def fetch(record: JobWatch) -> pa.Table:
    tables = []
    for loc in record.result:
        client = flight.FlightClient(f"grpc://{loc.flight_address}")
        tables.append(client.do_get(flight.Ticket(loc.path.encode())).read_all())
        client.close()
    return pa.concat_tables(tables)


def test_a_job_runs_on_two_executor_processes(
    scheduler: SchedulerServer,
    executors: list[subprocess.Popen[str]],
    tables: dict[str, str],
    tmp_path: Path,
) -> None:
    wait_for(lambda: alive(scheduler) == 2, what="two executors alive")
    for name, path in tables.items():
        scheduler.core.register_table(name, path)
    record = scheduler.core.submit(QUERY)
    wait_for(lambda: finished(record), what="job finished")
    assert record.state is JobState.SUCCEEDED, record.error
    got = fetch(record)
    con = duckdb.connect()
    for name, path in tables.items():
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
    expected = con.sql(QUERY).fetchall()
    rows = list(zip(*(c.to_pylist() for c in got.columns), strict=True))
    assert [r[:2] for r in rows] == [r[:2] for r in expected]
    assert [r[2] for r in rows] == pytest.approx([r[2] for r in expected])
    # Both executors ran tasks.
    for i in range(2):
        assert "done in" in (tmp_path / f"exec{i}.log").read_text()


def huge_pages_allowed(pid: int) -> bool:
    """Whether the kernel may give process ``pid`` transparent huge pages
    (``/proc/PID/status``'s ``THP_enabled``, Linux 5.0 and later)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("THP_enabled:"):
            return line.split()[1] == "1"
    raise AssertionError(f"/proc/{pid}/status says nothing of THP_enabled (Linux before 5.0?)")


def test_an_executor_keeps_huge_pages_from_itself_unless_told(
    scheduler: SchedulerServer, executors: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    # The executor told to allow them is the control; it allows them even where its
    # parent kept them from itself (an executor another test started in this
    # process does that for the whole process, and children inherit it).
    set_huge_pages(False)
    assert not any(huge_pages_allowed(proc.pid) for proc in executors)
    proc = spawn(scheduler, tmp_path / "exec-huge", "host-huge", "--huge-pages")
    try:
        assert proc.stdout is not None
        assert "registered with" in proc.stdout.readline()
        assert huge_pages_allowed(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)


def test_sigterm_stops_an_executor_cleanly(
    scheduler: SchedulerServer, executors: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    wait_for(lambda: alive(scheduler) == 2, what="two executors alive")
    proc = executors[0]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    wait_for(lambda: alive(scheduler) == 1, what="the scheduler noticed")
    lost = [e for e in scheduler.core.executors() if e.view.state is ExecutorState.LOST]
    assert len(lost) == 1 and lost[0].pid == proc.pid
    assert not os.path.exists(tmp_path / "exec0" / "spill")
