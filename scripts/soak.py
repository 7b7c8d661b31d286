"""A randomized fault run: concurrent clients, executors and the scheduler killed at random.

The chaos suite and the restart tests each try one fault at one chosen moment;
this mixes them the way a bad day does. A ``LocalCluster`` (state in SQLite or
etcd) serves ``--clients`` client threads, each running TPC-H queries picked at
random, one after another, for ``--minutes``; every answer is compared with
single-process DuckDB's on the same data. Meanwhile a fault thread, every
``--fault-every`` seconds or so, does one of (at random, all from ``--seed``):

* ``kill_executor``: SIGKILL an executor; a new one starts a moment later;
* ``freeze_executor``: SIGSTOP an executor for 1 to 6 s (past the heartbeat
  timeout, sometimes), then SIGCONT it;
* ``drain_executor``: SIGTERM an executor (it finishes its tasks and leaves); a
  new one starts;
* ``kill_scheduler``: SIGKILL the scheduler and start it again 0 to 3 s later,
  on the same port and state store.

At least one executor is always left running, so every query can finish: the
promise checked is that every query ends with DuckDB's answer, exactly once,
whatever else happened meanwhile. It prints a summary (and ``--json`` writes
it): queries run and correct, faults done, every failure with its error.
Exits 1 when any answer was wrong or any query failed.

Usage::

    .venv/bin/python scripts/soak.py --minutes 5 --seed 7
    .venv/bin/python scripts/soak.py --state etcd --minutes 3 --json soak.json

The random choices come from the seed; the processes' timing does not, so a
run is repeated by its seed only as far as the machine's timing allows.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import (  # noqa: E402 - after the path to tests/
    TPCH_ORDER_BY,
    TPCH_TABLES,
    assert_same_result,
    duckdb_views_sql,
    ensure_tpch,
    tpch_query,
)

from mangonel.client.cluster import LocalCluster  # noqa: E402
from mangonel.testing.etcd import EtcdServer  # noqa: E402

QUERIES = (1, 3, 4, 5, 6, 9, 10, 12, 13, 14, 18, 19)
"""TPC-H queries of several stages (joins, aggregates, sorts) and a few of one."""

FAULTS = ("kill_executor", "freeze_executor", "drain_executor", "kill_scheduler")


@dataclass
class Report:
    seed: int
    seconds: float
    state: str
    queries: int = 0
    correct: int = 0
    by_query: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    """Every query that failed or answered wrongly, and every fault that could not
    be carried out, with what was said."""

    @property
    def ok(self) -> bool:
        return not self.failures and self.queries > 0 and self.correct == self.queries


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.stop_at = time.monotonic() + args.minutes * 60
        self.work = work
        self.lock = threading.Lock()
        self.report = Report(args.seed, args.minutes * 60, args.state)
        self.faults: Counter[str] = Counter()
        self.queries: Counter[str] = Counter()

    def expected(self, tables: dict[str, Path]) -> dict[int, Any]:
        ref = duckdb.connect()
        for statement in duckdb_views_sql(dict(tables)):
            ref.execute(statement)
        return {n: ref.sql(tpch_query(n)).to_arrow_table() for n in QUERIES}

    def run(self) -> Report:
        directory = ensure_tpch(self.args.scale)
        tables = {name: directory / f"{name}.parquet" for name in TPCH_TABLES}
        expected = self.expected(tables)
        etcd = None
        state = None
        if self.args.state == "etcd":
            etcd = EtcdServer(self.work / "etcd").__enter__()
            state = etcd.url("/mangonel/soak/")
        try:
            with LocalCluster(
                executors=self.args.executors,
                slots=1,
                work_dir=self.work / "cluster",
                heartbeat_timeout=3.0,
                state=state,
                # Small splits: queries of several tasks a stage at small scales.
                scheduler_args=("--split-rows", "100000"),
            ) as cluster:
                with cluster.connect() as session:
                    for name, path in tables.items():
                        session.register_parquet(name, str(path))
                clients = [
                    threading.Thread(target=self.client, args=(cluster, i, expected))
                    for i in range(self.args.clients)
                ]
                for t in clients:
                    t.start()
                self.inject(cluster)
                for t in clients:
                    t.join(600)
                    if t.is_alive():
                        self.fail("a client still waited 10 minutes after the run ended")
        finally:
            if etcd is not None:
                etcd.__exit__(None, None, None)
        self.report.faults = dict(self.faults)
        self.report.by_query = {k: v for k, v in sorted(self.queries.items())}
        return self.report

    def fail(self, what: str) -> None:
        with self.lock:
            self.report.failures.append(what)
        print(f"FAILED: {what}", flush=True)

    # ----------------------------------------------------------------- clients

    def client(self, cluster: LocalCluster, index: int, expected: dict[int, Any]) -> None:
        rng = random.Random(f"{self.args.seed}-{index}")
        with cluster.connect() as session:
            while time.monotonic() < self.stop_at:
                number = rng.choice(QUERIES)
                started = time.monotonic()
                try:
                    result = session.sql(tpch_query(number)).to_arrow()
                except Exception as exc:  # noqa: BLE001 - every failure is reported
                    self.count(number, False)
                    self.fail(f"client {index}: q{number} failed: {type(exc).__name__}: {exc}")
                    continue
                order_by = TPCH_ORDER_BY[number]
                try:
                    assert_same_result(
                        result, expected[number], ordered=bool(order_by), order_by=order_by
                    )
                except AssertionError as exc:
                    self.count(number, False)
                    self.fail(f"client {index}: q{number} answered wrongly: {exc}")
                    continue
                self.count(number, True)
                print(
                    f"client {index}: q{number} correct in {time.monotonic() - started:.1f} s",
                    flush=True,
                )

    def count(self, number: int, correct: bool) -> None:
        with self.lock:
            self.report.queries += 1
            self.report.correct += correct
            self.queries[f"q{number}"] += 1

    # ------------------------------------------------------------------ faults

    def inject(self, cluster: LocalCluster) -> None:
        while time.monotonic() < self.stop_at:
            time.sleep(self.args.fault_every * self.rng.uniform(0.5, 1.5))
            if time.monotonic() >= self.stop_at:
                break
            fault = self.rng.choice(FAULTS)
            try:
                getattr(self, fault)(cluster)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                # A process's error carries its log's tail: its end says why.
                said = str(exc)[-1500:]
                self.fail(f"fault {fault} could not be carried out: {type(exc).__name__}: {said}")
            else:
                self.faults[fault] += 1
                print(f"fault: {fault}", flush=True)
        # Whatever is still frozen is thawed, so that the clients' last queries end.
        for handle in cluster.executors:
            if handle.alive():
                handle.signal(signal.SIGCONT)

    def live(self, cluster: LocalCluster) -> list[int]:
        return [i for i, h in enumerate(cluster.executors) if h.alive()]

    def victim(self, cluster: LocalCluster) -> int | None:
        """A running executor to hit, never the last one."""
        live = self.live(cluster)
        return self.rng.choice(live) if len(live) > 1 else None

    def kill_executor(self, cluster: LocalCluster) -> None:
        index = self.victim(cluster)
        if index is None:
            return self.replace(cluster)
        cluster.kill_executor(index)
        time.sleep(self.rng.uniform(0.0, 2.0))
        self.replace(cluster)

    def drain_executor(self, cluster: LocalCluster) -> None:
        index = self.victim(cluster)
        if index is None:
            return self.replace(cluster)
        cluster.kill_executor(index, signal.SIGTERM)
        self.replace(cluster)

    def freeze_executor(self, cluster: LocalCluster) -> None:
        index = self.victim(cluster)
        if index is None:
            return
        cluster.freeze_executor(index)
        time.sleep(self.rng.uniform(1.0, 6.0))
        cluster.thaw_executor(index)

    def kill_scheduler(self, cluster: LocalCluster) -> None:
        cluster.kill_scheduler()
        time.sleep(self.rng.uniform(0.0, 3.0))
        cluster.restart_scheduler()

    def replace(self, cluster: LocalCluster) -> None:
        """Start executors until ``--executors`` run (a new one registers in the background)."""
        for _ in range(self.args.executors - len(self.live(cluster))):
            cluster.add_executor(wait=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Run TPC-H queries from concurrent clients while executors and the scheduler "
            "are killed, frozen and drained at random; check every answer against DuckDB. "
            "Exits 1 when any query failed or answered wrongly."
        )
    )
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to run (5)")
    parser.add_argument("--seed", type=int, default=1, help="of every random choice (1)")
    parser.add_argument("--clients", type=int, default=3, help="client threads (3)")
    parser.add_argument(
        "--executors", type=int, default=3, help="executors of one slot each, kept running (3)"
    )
    parser.add_argument(
        "--fault-every",
        type=float,
        default=6.0,
        help="seconds between faults, on average (6; each wait is 0.5x to 1.5x of it)",
    )
    parser.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor (0.1)")
    parser.add_argument(
        "--state",
        choices=("sqlite", "etcd"),
        default="sqlite",
        help="the scheduler's state store: SQLite (default) or a real etcd this starts",
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--work-dir", type=Path, help="keep the cluster's files and logs here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mangonel-soak-") as tmp:
        work = args.work_dir or Path(tmp)
        report = Soak(args, work).run()
    summary = {**asdict(report), "ok": report.ok}
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
