"""A task's SQL reads the files of the catalog's tables and no other, on real executors.

User SQL reaches the executors' DuckDB, so the executors do not trust the front end
alone: a slot's scan database may read exactly the files of the tables in the catalog
the query was planned against (``DistributedPlan.readable_files``, sent as
``TaskSpec.job_files``), which its user may query anyway, and one database serves
every scan task of every query over that catalog. These tests stand in for a fragment
that escaped the front end: the scheduler (in this process) plans the query as
usual, then its stages' SQL is swapped for one that reads a file directly, and real
executor processes run it.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from mangonel.plan.physical import DistributedPlan
from mangonel.scheduler.jobs import JobWatch
from mangonel.scheduler.main import SchedulerConfig, SchedulerServer, start_scheduler
from mangonel.scheduler.state_views import ExecutorState, JobState

JOIN = "SELECT count(*) AS n FROM orders o JOIN customer c ON o.o_custkey = c.c_custkey"


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(0.05)


@pytest.fixture()
def tables(tmp_path: Path) -> dict[str, str]:
    """orders and customer, and ``secret``: a file beside them no table names."""
    data = tmp_path / "data"
    data.mkdir()
    n = 20_000
    paths = {name: str(data / f"{name}.parquet") for name in ("orders", "customer", "secret")}
    orders = {
        "o_orderkey": pa.array(range(n), pa.int64()),
        "o_custkey": pa.array([(i * 7) % 1000 for i in range(n)], pa.int64()),
    }
    pq.write_table(pa.table(orders), paths["orders"], row_group_size=2_000)
    pq.write_table(pa.table({"c_custkey": pa.array(range(0, 1000, 2), pa.int64())}),
                   paths["customer"])  # fmt: skip
    pq.write_table(pa.table({"s": pa.array(range(42), pa.int64())}), paths["secret"])
    return paths


@pytest.fixture()
def scheduler(tmp_path: Path) -> Iterator[SchedulerServer]:
    # Small splits, no broadcast and no inline scans: orders is scanned in a stage of
    # its own, so a task scanning orders alone belongs to a job that also scans
    # customer (in the join's task).
    server = start_scheduler(
        SchedulerConfig(
            port=0,
            partitions=2,
            split_rows=5_000,
            broadcast_bytes=0,
            inline_scan_bytes=0,
            state=f"sqlite://{tmp_path / 'scheduler.db'}",
        )
    )
    yield server
    server.stop()


@pytest.fixture()
def executors(scheduler: SchedulerServer, tmp_path: Path) -> Iterator[list[Path]]:
    """Two executor processes of one slot each, so every task of a job meets the
    scan databases the earlier ones left; yields their log files."""
    procs, logs = [], []
    try:
        for i in range(2):
            work, log_path = tmp_path / f"exec{i}", tmp_path / f"exec{i}.log"
            cmd = [
                sys.executable, "-m", "mangonel.executor.main",
                "--scheduler", scheduler.address, "--slots", "1", "--threads", "1",
                "--memory-limit", "256MB", "--work-dir", str(work), "--host-id", f"host{i}",
            ]  # fmt: skip
            log = open(log_path, "w")  # noqa: SIM115 (the child owns it)
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True))
            logs.append(log_path)
        for proc in procs:
            assert proc.stdout is not None
            assert "registered with" in proc.stdout.readline()
        wait_for(
            lambda: (
                sum(e.view.state is ExecutorState.ALIVE for e in scheduler.core.executors()) == 2
            ),
            what="two executors alive",
        )
        yield logs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def run(scheduler: SchedulerServer, sql: str) -> JobWatch:
    record = scheduler.core.submit(sql)
    wait_for(lambda: record.state.finished, what="job finished")
    return record


def fetch(record: JobWatch) -> list[tuple[Any, ...]]:
    tables = []
    for loc in record.result:
        client = flight.FlightClient(f"grpc://{loc.flight_address}")
        tables.append(client.do_get(flight.Ticket(loc.path.encode())).read_all())
        client.close()
    got = pa.concat_tables(tables)
    return list(zip(*(c.to_pylist() for c in got.columns), strict=True))


def reference(tables: dict[str, str], sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    for name, path in tables.items():
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
    return con.sql(sql).fetchall()


def reading(monkeypatch: pytest.MonkeyPatch, scheduler: SchedulerServer, path: str) -> None:
    """Plan the next queries as usual, then make each stage that scans ``orders`` count
    ``path``'s rows instead (read directly, not through the task's scan)."""
    plans = scheduler.core.plans
    real = plans.plan

    def plan(*args: Any, **kwargs: Any) -> DistributedPlan:
        planned = real(*args, **kwargs)
        stages = []
        for stage in planned.stages:
            if stage.scan is not None and stage.scan.table == "orders":
                # The stage's own output column names; its type is BIGINT as the
                # original's first column, o_orderkey or a count.
                cols = ", ".join(f'count(*) AS "{c}"' for c in stage.columns)
                stage = dataclasses.replace(stage, sql=f"SELECT {cols} FROM read_parquet('{path}')")
            stages.append(stage)
        return dataclasses.replace(planned, stages=tuple(stages))

    monkeypatch.setattr(plans, "plan", plan)


def opened(logs: list[Path]) -> int:
    return sum(log.read_text().count("opens scan database") for log in logs)


def test_a_fragment_reads_only_the_files_of_the_catalogs_tables(
    scheduler: SchedulerServer,
    executors: list[Path],
    tables: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("orders", "customer"):
        scheduler.core.register_table(name, tables[name])
    # The join as written: orders scanned in a stage of several tasks, customer (one
    # task's worth) in the join's one task; every slot's scan database then may read
    # both tables' files.
    join = run(scheduler, JOIN)
    assert join.state is JobState.SUCCEEDED, join.error
    assert fetch(join) == reference(tables, JOIN)
    stages = join.plan.stages
    scans = {s.scan.table: s.num_tasks for s in stages if s.scan is not None}
    side = {side.table for s in stages for side in s.side_scans}
    assert scans.get("orders", 0) >= 2 and "customer" in scans.keys() | side, (scans, side)
    first = opened(executors)
    assert 1 <= first <= 2, first  # one per slot at most: both tables' tasks shared it

    # A query of orders alone runs in the same databases (no new one opened) ...
    only_orders = "SELECT count(*) AS n FROM orders"
    plain = run(scheduler, only_orders)
    assert plain.state is JobState.SUCCEEDED, plain.error
    assert fetch(plain) == reference(tables, only_orders)
    assert opened(executors) == first
    # ... and may read customer's file, a table its user may query anyway: each
    # orders task counts customer's rows instead, and the final count sums them.
    orders_tasks = next(s.num_tasks for s in plain.plan.stages if s.scan is not None)
    reading(monkeypatch, scheduler, tables["customer"])
    allowed = run(scheduler, only_orders)
    assert allowed.state is JobState.SUCCEEDED, allowed.error
    customers = reference(tables, "SELECT count(*) FROM customer")[0][0]
    assert fetch(allowed) == [(customers * orders_tasks,)]
    # A file beside the tables that no table names stays out of reach.
    reading(monkeypatch, scheduler, tables["secret"])
    secret = run(scheduler, JOIN)
    assert secret.state is JobState.FAILED
    assert "secret.parquet" in (secret.error or ""), secret.error
    # Registered as a table, it is part of the catalog: a new set of files, so a new
    # database that may read it.
    scheduler.core.register_table("secret", tables["secret"])
    now_a_table = run(scheduler, JOIN)
    assert now_a_table.state is JobState.SUCCEEDED, now_a_table.error
    assert opened(executors) > first
