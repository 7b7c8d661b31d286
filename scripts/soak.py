"""A randomized fault run: concurrent clients, executors and the scheduler killed at random.

The chaos suite and the restart tests each try one fault at one chosen moment;
this mixes them the way a bad day does. A ``LocalCluster`` (state in SQLite or
etcd) serves ``--clients`` client threads, each running TPC-H queries picked at
random, one after another, for ``--minutes``; every answer is compared with
single-process DuckDB's on the same data. ``--writers`` more threads each write
a table of their own and read it back (``Writer``): every write must succeed,
its count be DuckDB's, and the table hold each batch written exactly once, whole.
Meanwhile a fault thread, every
``--fault-every`` seconds or so, does one of (at random, all from ``--seed``):

* ``kill_executor``: SIGKILL an executor; a new one starts a moment later;
* ``freeze_executor``: SIGSTOP an executor for 1 to 6 s (past the heartbeat
  timeout, sometimes), then SIGCONT it;
* ``drain_executor``: SIGTERM an executor (it finishes its tasks and leaves); a
  new one starts;
* ``kill_scheduler``: SIGKILL the scheduler and start it again 0 to 3 s later,
  on the same port and state store;
* ``freeze_scheduler``: SIGSTOP the scheduler for 1 to 6 s (past the heartbeat
  timeout, sometimes: thawed, it hears from no executor at once, which its own
  pause explains), then SIGCONT it. With etcd state, a freeze past the lease's TTL
  makes it stop with status 3 once thawed (it no longer leads its store): the run
  then starts it again, as its supervisor would (``scheduler_restarts``); any other
  exit of its own is a failure.

With ``--etcd-faults`` (etcd state) the store itself fails too:

* ``kill_etcd``: SIGKILL etcd and start it again 0 to 3 s later, on the same
  ports and data (leases and all);
* ``freeze_etcd``: SIGSTOP etcd for 1 to 6 s (past the leader's lease, sometimes:
  the leader's refreshes and writes wait, then fail), then SIGCONT it.

A scheduler that loses its lead meanwhile stops with status 3 and is started
again, as for a freeze of its own; one started while etcd is away waits for it.

With ``--schedulers N`` (etcd state) the cluster runs N schedulers, one leading
and the others standing by, and each scheduler fault hits the leader or a
standby, as the seed says: a kill or a freeze past the lease of the leader is a
failover, under whatever the clients and writers were doing (``leader_faults``
counts those that hit the scheduler leading then). A killed one starts again as
a standby.

At least one executor is always left running, so every query can finish: the
promise checked is that every query ends with DuckDB's answer, and every write
lands exactly once, whatever else happened meanwhile. It prints a summary (and
``--json`` writes it): queries run and correct, writes and read-backs, faults
done, every failure with its error. Exits 1 when any answer was wrong or any
statement failed.

Usage::

    .venv/bin/python scripts/soak.py --minutes 5 --seed 7
    .venv/bin/python scripts/soak.py --minutes 5 --seed 7 --writers 2
    .venv/bin/python scripts/soak.py --state etcd --minutes 3 --json soak.json
    .venv/bin/python scripts/soak.py --state etcd --schedulers 2 --writers 3 --minutes 5
    .venv/bin/python scripts/soak.py --state etcd --schedulers 2 --etcd-faults --minutes 5

The random choices come from the seed; the processes' timing does not, so a
run is repeated by its seed only as far as the machine's timing allows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from decimal import Decimal
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

LOST_LEAD_STATUS = 3
"""``mangonel scheduler``'s exit status when it no longer leads its state store."""
LEASE_CHECK_S = 2.0
"""How long a thawed scheduler is given to find out whether it still leads (the
lease refresh after a pause comes at once; the exit follows within a second)."""

QUERIES = (1, 3, 4, 5, 6, 9, 10, 12, 13, 14, 18, 19)
"""TPC-H queries of several stages (joins, aggregates, sorts) and a few of one."""

FAULTS = (
    "kill_executor",
    "freeze_executor",
    "drain_executor",
    "kill_scheduler",
    "freeze_scheduler",
)
ETCD_FAULTS = ("kill_etcd", "freeze_etcd")
"""Faults of the state store, with ``--etcd-faults`` (after ``FAULTS``: a seed's
other kinds come in their order without it)."""

SLOWEST = 5
"""How many of the slowest statements the report lists (``Report.slowest``)."""

WRITE_MODULUS = 97
"""A written batch is the line items of one residue of ``l_orderkey`` modulo this
(about 6,200 rows at SF 0.1): every scan task of ``lineitem`` writes part of it, so
each statement commits several tasks' files."""

VALUES = ((1, Decimal("1.50")), (2, Decimal("2.25")), (3, None))
"""The rows (k, v) an ``INSERT ... VALUES`` batch writes: 3 rows, their v's sum 3.75."""

Batch = tuple[int, Decimal]
"""What a batch is read back as: its rows and the sum of their v's."""


@dataclass
class Report:
    seed: int
    seconds: float
    state: str
    schedulers: int = 1
    queries: int = 0
    correct: int = 0
    by_query: dict[str, int] = field(default_factory=dict)
    writes: int = 0
    """Write statements that succeeded with DuckDB's count of rows."""
    by_write: dict[str, int] = field(default_factory=dict)
    answers_lost: int = 0
    """Of ``writes``, those whose answer (the count) was lost after they took effect
    (``Result.answer_lost``): NULL, and not run again."""
    writes_met_faults: int = 0
    """Of ``writes``, those that ran while a fault was done (begun before they ended,
    not ended before they began)."""
    checks: int = 0
    """Read-backs of a writer's table that found each of its batches exactly once."""
    faults: dict[str, int] = field(default_factory=dict)
    scheduler_restarts: int = 0
    """Times the run, as the scheduler's supervisor, started it again after it stopped
    on its own for having lost the lead of its store (status 3: a freeze past an etcd
    lease; ``restart: on-failure`` in ``deploy/compose.yaml`` does the same)."""
    leader_faults: dict[str, int] = field(default_factory=dict)
    """Scheduler faults (kills, freezes) that hit the scheduler leading at the time, by kind:
    with ``--schedulers`` above 1, a kill of one, or a freeze past its lease, is a
    failover to a standby."""
    slowest: list[dict[str, Any]] = field(default_factory=list)
    """The slowest statements that succeeded (``SLOWEST`` of them): what, how long,
    when they began (seconds into the run), their job: where a run stalls."""
    failures: list[str] = field(default_factory=list)
    """Every query that failed or answered wrongly, and every fault that could not
    be carried out, with what was said."""

    @property
    def ok(self) -> bool:
        return not self.failures and self.queries + self.writes > 0 and self.correct == self.queries


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.kinds = random.Random(f"{args.seed}-faults")
        """Which fault comes next, and when: apart from ``rng``, whose draws (which
        executor, how long) depend on how many executors run, so the seed alone
        fixes the order of the kinds."""
        self.stop_at = time.monotonic() + args.minutes * 60
        self.work = work
        self.lock = threading.Lock()
        self.report = Report(args.seed, args.minutes * 60, args.state, args.schedulers)
        self.faults: Counter[str] = Counter()
        self.leader_faults: Counter[str] = Counter()
        self.queries: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.faults_begun = 0
        self.faults_ended = 0
        self.began = time.monotonic()
        self.took: list[dict[str, Any]] = []
        self.etcd: EtcdServer | None = None
        self.kinds_drawn = FAULTS + (ETCD_FAULTS if args.etcd_faults else ())

    def expected(self, tables: dict[str, Path]) -> dict[int, Any]:
        ref = duckdb.connect()
        for statement in duckdb_views_sql(dict(tables)):
            ref.execute(statement)
        return {n: ref.sql(tpch_query(n)).to_arrow_table() for n in QUERIES}

    def expected_batches(self, tables: dict[str, Path]) -> dict[int, Batch]:
        """Residue -> (rows, sum of ``l_extendedprice``) of the batch it selects."""
        ref = duckdb.connect()
        for statement in duckdb_views_sql(dict(tables)):
            ref.execute(statement)
        rows = ref.execute(
            f"SELECT l_orderkey % {WRITE_MODULUS}, count(*), sum(l_extendedprice) "
            "FROM lineitem GROUP BY 1"
        ).fetchall()
        return {int(r): (int(n), Decimal(s)) for r, n, s in rows}

    def run(self) -> Report:
        directory = ensure_tpch(self.args.scale)
        tables = {name: directory / f"{name}.parquet" for name in TPCH_TABLES}
        expected = self.expected(tables)
        batches = self.expected_batches(tables)
        etcd = None
        state = None
        if self.args.state == "etcd":
            etcd = self.etcd = EtcdServer(self.work / "etcd").__enter__()
            state = etcd.url("/mangonel/soak/")
        try:
            with LocalCluster(
                executors=self.args.executors,
                slots=1,
                work_dir=self.work / "cluster",
                heartbeat_timeout=3.0,
                state=state,
                schedulers=self.args.schedulers,
                # Small splits: queries of several tasks a stage at small scales.
                scheduler_args=(
                    "--split-rows",
                    "100000",
                    "--warehouse",
                    str(self.work / "warehouse"),
                ),
            ) as cluster:
                with cluster.connect() as session:
                    for name, path in tables.items():
                        session.register_parquet(name, str(path))
                clients = [
                    threading.Thread(target=self.client, args=(cluster, i, expected))
                    for i in range(self.args.clients)
                ] + [
                    threading.Thread(target=Writer(self, cluster, i, batches).run)
                    for i in range(self.args.writers)
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
        self.report.leader_faults = dict(self.leader_faults)
        self.report.by_query = {k: v for k, v in sorted(self.queries.items())}
        self.report.by_write = {k: v for k, v in sorted(self.writes.items())}
        self.report.slowest = sorted(self.took, key=lambda t: -t["seconds"])[:SLOWEST]
        return self.report

    def timed(self, what: str, started: float, job_id: str) -> float:
        """Note a statement that succeeded, begun at ``started``; its seconds."""
        seconds = time.monotonic() - started
        began_s = round(started - self.began, 1)
        with self.lock:
            self.took.append(
                {"what": what, "seconds": round(seconds, 2), "began_s": began_s, "job": job_id}
            )
        return seconds

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
                    answer = session.sql(tpch_query(number))
                    result = answer.to_arrow()
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
                took = self.timed(f"client {index}: q{number}", started, answer.job_id)
                print(f"client {index}: q{number} correct in {took:.1f} s", flush=True)

    def count(self, number: int, correct: bool) -> None:
        with self.lock:
            self.report.queries += 1
            self.report.correct += correct
            self.queries[f"q{number}"] += 1

    def fault_marks(self) -> tuple[int, int]:
        """Faults begun and ended so far (``count_write`` compares two of these)."""
        with self.lock:
            return self.faults_begun, self.faults_ended

    def count_write(self, kind: str, before: tuple[int, int], answer_lost: bool) -> None:
        """A write that succeeded; ``before``: ``fault_marks()`` as it began."""
        with self.lock:
            self.report.writes += 1
            self.writes[kind] += 1
            self.report.answers_lost += answer_lost
            # A fault under way as it began, or one begun before it ended.
            if before[0] != before[1] or self.faults_begun != before[0]:
                self.report.writes_met_faults += 1

    def count_check(self) -> None:
        with self.lock:
            self.report.checks += 1

    # ------------------------------------------------------------------ faults

    def inject(self, cluster: LocalCluster) -> None:
        while time.monotonic() < self.stop_at:
            time.sleep(self.args.fault_every * self.kinds.uniform(0.5, 1.5))
            if time.monotonic() >= self.stop_at:
                break
            fault = self.kinds.choice(self.kinds_drawn)
            with self.lock:
                self.faults_begun += 1
            try:
                self.supervise(cluster)
                getattr(self, fault)(cluster)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                # A process's error carries its log's tail: its end says why.
                said = str(exc)[-1500:]
                self.fail(f"fault {fault} could not be carried out: {type(exc).__name__}: {said}")
            else:
                self.faults[fault] += 1
                print(f"fault: {fault}", flush=True)
            finally:
                with self.lock:
                    self.faults_ended += 1
        # Whatever is still frozen is thawed, so that the clients' last queries end.
        if self.etcd is not None:
            self.etcd.resume()
        for handle in [*cluster.executors, *cluster.schedulers]:
            if handle is not None and handle.alive():
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

    def scheduler_victim(self, cluster: LocalCluster, fault: str) -> int:
        """Which scheduler a fault hits, counted in ``leader_faults`` when it leads
        now. Of a group, the leader or a standby as the seed says (``kinds``: the
        faults that cause a failover are the seed's, whoever leads by then)."""
        if cluster.num_schedulers == 1:
            self.leader_faults[fault] += 1
            return 0
        hit_leader = self.kinds.random() < 0.5
        leading = [
            i
            for i, handle in enumerate(cluster.schedulers)
            if handle is not None
            and handle.alive()
            and (cluster.work_dir / f"scheduler-{i}.address").exists()
        ]
        if hit_leader and leading:
            self.leader_faults[fault] += 1
            return leading[0]
        others = [i for i in range(cluster.num_schedulers) if i not in leading]
        return self.rng.choice(others or list(range(cluster.num_schedulers)))

    def start_scheduler(self, cluster: LocalCluster, index: int) -> None:
        """Start scheduler ``index`` again; alone, once it serves (a standby of a
        group serves only once it takes the lead)."""
        cluster.restart_scheduler(index, wait=cluster.num_schedulers == 1)

    def kill_scheduler(self, cluster: LocalCluster) -> None:
        index = self.scheduler_victim(cluster, "kill_scheduler")
        cluster.kill_scheduler(index)
        time.sleep(self.rng.uniform(0.0, 3.0))
        self.start_scheduler(cluster, index)

    def freeze_scheduler(self, cluster: LocalCluster) -> None:
        index = self.scheduler_victim(cluster, "freeze_scheduler")
        scheduler = cluster.schedulers[index]
        if scheduler is None or not scheduler.alive():
            return
        scheduler.signal(signal.SIGSTOP)
        try:
            time.sleep(self.rng.uniform(1.0, 6.0))
        finally:
            scheduler.signal(signal.SIGCONT)
        # Thawed, it finds at its next lease refresh whether it still leads.
        with contextlib.suppress(subprocess.TimeoutExpired):
            scheduler.process.wait(LEASE_CHECK_S)
        self.supervise(cluster)

    def kill_etcd(self, cluster: LocalCluster) -> None:
        assert self.etcd is not None
        self.etcd.kill()
        time.sleep(self.rng.uniform(0.0, 3.0))
        self.etcd.start()
        self.after_store_fault(cluster)

    def freeze_etcd(self, cluster: LocalCluster) -> None:
        assert self.etcd is not None
        self.etcd.pause()
        try:
            time.sleep(self.rng.uniform(1.0, 6.0))
        finally:
            self.etcd.resume()
        self.after_store_fault(cluster)

    def after_store_fault(self, cluster: LocalCluster) -> None:
        """Give the schedulers the time to find out whether they still lead, then
        start again those that stopped for it."""
        time.sleep(LEASE_CHECK_S)
        self.supervise(cluster)

    def supervise(self, cluster: LocalCluster) -> None:
        """Start a scheduler again if it stopped on its own for having lost the lead
        of its store (status 3), as its supervisor would; any other exit of its own
        is a failure (and it is started again, so that the run goes on)."""
        for index, scheduler in enumerate(cluster.schedulers):
            if scheduler is None or scheduler.alive():
                continue
            status = scheduler.process.returncode
            if status != LOST_LEAD_STATUS:
                self.fail(
                    f"scheduler {index} exited by itself with status {status}: "
                    f"{scheduler.log_tail()[-1500:]}"
                )
            else:
                with self.lock:
                    self.report.scheduler_restarts += 1
            print(
                f"supervisor: scheduler {index} stopped (status {status}); started again",
                flush=True,
            )
            self.start_scheduler(cluster, index)

    def replace(self, cluster: LocalCluster) -> None:
        """Start executors until ``--executors`` run (a new one registers in the background)."""
        for _ in range(self.args.executors - len(self.live(cluster))):
            cluster.add_executor(wait=False)


class Writer:
    """One writer thread: a table of its own, batches written into it, read back.

    Each batch has an id of its own (the ``batch`` column), and this writer knows
    what each one it wrote must read back as. A statement that succeeds must
    answer DuckDB's count (or NULL where its answer was lost after it took
    effect: ``Result.answer_lost``, counted), and its batch must then be in the
    table exactly once, whole. A statement that fails is reported as a failure
    (a live executor was always left: nothing excuses it), and its batch must be
    in the table whole or not at all, for the rest of the run (a commit may
    still land after the client's error). A batch the writer never wrote must
    never appear. Each step is one of, at random:

    * ``INSERT INTO t SELECT`` a batch of ``lineitem`` (every scan task writes a
      file of it, committed together);
    * ``INSERT INTO t VALUES`` three rows (one task);
    * ``CREATE TABLE AS`` a batch as a table of its own, read back, then dropped;
    * ``CREATE OR REPLACE TABLE t AS`` a batch: ``t`` then holds that batch alone
      (and whatever failed writes land after it);
    * a read-back of ``t``: every batch's rows and sum, against what it must hold.

    The run ends with one more read-back, after the last fault.
    """

    def __init__(
        self, soak: Soak, cluster: LocalCluster, index: int, batches: dict[int, Batch]
    ) -> None:
        self.soak = soak
        self.cluster = cluster
        self.index = index
        self.batches = batches
        self.rng = random.Random(f"{soak.args.seed}-w{index}")
        self.table = f"soak_w{index}"
        self.held: dict[int, Batch] = {}
        """Batch -> what it reads back as: written, so in the table exactly once."""
        self.doubtful: dict[int, Batch] = {}
        """Batches whose statement failed: in the table whole, or not at all."""
        self.next_batch = 0

    def run(self) -> None:
        with self.cluster.connect() as session:
            create = f"CREATE TABLE {self.table} (batch BIGINT, k BIGINT, v DECIMAL(15, 2))"
            if not self.write(session, "create", create, None):
                return  # no table to write (the failure is reported)
            while time.monotonic() < self.soak.stop_at:
                step = self.rng.random()
                if step < 0.45:
                    self.insert_select(session)
                elif step < 0.6:
                    self.insert_values(session)
                elif step < 0.72:
                    self.create_table_as(session)
                elif step < 0.77:
                    self.replace(session)
                else:
                    self.check(session)
            self.check(session)

    def batch(self) -> int:
        self.next_batch += 1
        return self.next_batch

    def selected(self, batch: int) -> tuple[str, Batch]:
        """The SELECT of a batch's ``lineitem`` rows (batch, k, v), and its figures."""
        residue = batch % WRITE_MODULUS
        sql = (
            f"SELECT CAST({batch} AS BIGINT) AS batch, l_orderkey AS k, l_extendedprice AS v "
            f"FROM lineitem WHERE l_orderkey % {WRITE_MODULUS} = {residue}"
        )
        return sql, self.batches.get(residue, (0, Decimal(0)))

    def insert_select(self, session: Any) -> None:
        batch = self.batch()
        select, figures = self.selected(batch)
        self.written(session, "insert_select", f"INSERT INTO {self.table} {select}", batch, figures)

    def insert_values(self, session: Any) -> None:
        batch = self.batch()
        rows = ", ".join(f"({batch}, {k}, {'NULL' if v is None else v})" for k, v in VALUES)
        total = sum((v for _, v in VALUES if v is not None), Decimal(0))
        sql = f"INSERT INTO {self.table} VALUES {rows}"
        self.written(session, "insert_values", sql, batch, (len(VALUES), total))

    def written(self, session: Any, kind: str, sql: str, batch: int, figures: Batch) -> None:
        if self.write(session, kind, sql, figures[0]):
            self.held[batch] = figures
        else:
            self.doubtful[batch] = figures

    def replace(self, session: Any) -> None:
        """``t`` replaced by one batch: what it held goes, unless the replace failed
        (then it may or may not have gone, whole)."""
        batch = self.batch()
        select, figures = self.selected(batch)
        sql = f"CREATE OR REPLACE TABLE {self.table} AS {select}"
        if self.write(session, "replace", sql, figures[0]):
            self.held = {batch: figures}
        else:
            self.doubtful.update(self.held)
            self.doubtful[batch] = figures
            self.held = {}

    def create_table_as(self, session: Any) -> None:
        """A batch as a table of its own: its count, its rows read back, dropped."""
        batch = self.batch()
        select, (rows, total) = self.selected(batch)
        name = f"soak_c{self.index}_{batch}"
        if not self.write(session, "create_table_as", f"CREATE TABLE {name} AS {select}", rows):
            return
        where = f"client w{self.index}: {name}"
        try:
            got = session.sql(f"SELECT count(*) AS n, sum(v) AS s FROM {name}").to_arrow()
        except Exception as exc:  # noqa: BLE001 - every failure is reported
            self.soak.fail(f"{where} could not be read back: {type(exc).__name__}: {exc}")
            return
        figures = (got["n"][0].as_py(), got["s"][0].as_py() or Decimal(0))
        if figures != (rows, total):
            self.soak.fail(f"{where} read back {figures}, not DuckDB's {(rows, total)}")
            return
        self.soak.count_check()
        self.write(session, "drop", f"DROP TABLE {name}", None)

    def write(self, session: Any, kind: str, sql: str, rows: int | None) -> bool:
        """Run a write statement; whether it succeeded with ``rows`` as its count."""
        started = time.monotonic()
        marks = self.soak.fault_marks()
        where = f"client w{self.index}: {kind} ({sql[:80]}...)"
        try:
            result = session.sql(sql)
        except Exception as exc:  # noqa: BLE001 - every failure is reported
            self.soak.fail(f"{where} failed: {type(exc).__name__}: {exc}")
            return False
        table = result.to_arrow()
        if rows is not None and not result.answer_lost:
            count = table["Count"].to_pylist() if "Count" in table.column_names else None
            if count != [rows]:
                self.soak.fail(f"{where} answered the count {count}, not DuckDB's {rows}")
                return False
        # An answer lost after the statement took effect is NULL, and the statement
        # is not run again: the read-backs check that it took effect once.
        self.soak.count_write(kind, marks, result.answer_lost)
        took = self.soak.timed(f"client w{self.index}: {kind}", started, result.job_id)
        print(f"client w{self.index}: {kind} done in {took:.1f} s", flush=True)
        return True

    def check(self, session: Any) -> None:
        """Every batch of the table read back: exactly what was written, once."""
        where = f"client w{self.index}: {self.table}"
        started = time.monotonic()
        try:
            answer = session.sql(
                f"SELECT batch, count(*) AS n, sum(v) AS s FROM {self.table} GROUP BY batch"
            )
            got = answer.to_arrow()
        except Exception as exc:  # noqa: BLE001 - every failure is reported
            self.soak.fail(f"{where} could not be read back: {type(exc).__name__}: {exc}")
            return
        found = {
            b: (n, s or Decimal(0))
            for b, n, s in zip(
                got["batch"].to_pylist(), got["n"].to_pylist(), got["s"].to_pylist(), strict=True
            )
        }
        wrong = []
        for batch, figures in sorted(self.held.items()):
            if found.get(batch) != figures:
                wrong.append(f"batch {batch}: {found.get(batch)}, written as {figures}")
        for batch, figures in sorted(self.doubtful.items()):
            if batch in found and found[batch] != figures:
                wrong.append(f"batch {batch} (its write failed): {found[batch]}, not {figures}")
        for batch in sorted(set(found) - set(self.held) - set(self.doubtful)):
            wrong.append(f"batch {batch}, never written: {found[batch]}")
        if wrong:
            self.soak.fail(f"{where} holds the wrong rows: " + "; ".join(wrong))
            return
        self.soak.count_check()
        took = self.soak.timed(f"client w{self.index}: check", started, answer.job_id)
        print(f"client w{self.index}: check done in {took:.1f} s", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Run TPC-H queries (and, with --writers, writes) from concurrent clients while "
            "executors and the scheduler are killed, frozen and drained at random; check "
            "every answer against DuckDB and every written batch is there exactly once. "
            "Exits 1 when any statement failed or answered wrongly."
        )
    )
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to run (5)")
    parser.add_argument("--seed", type=int, default=1, help="of every random choice (1)")
    parser.add_argument("--clients", type=int, default=3, help="client threads (3)")
    parser.add_argument(
        "--writers",
        type=int,
        default=0,
        help="threads more that each write a table of their own and read it back (0)",
    )
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
    parser.add_argument(
        "--schedulers",
        type=int,
        default=1,
        help="schedulers, one leading and the others standing by (1; more need --state etcd)",
    )
    parser.add_argument(
        "--etcd-faults",
        action="store_true",
        help="kill and freeze etcd too, now and then (needs --state etcd)",
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--work-dir", type=Path, help="keep the cluster's files and logs here")
    args = parser.parse_args(argv)
    if args.schedulers < 1:
        parser.error("--schedulers is at least 1")
    if args.etcd_faults and args.state != "etcd":
        parser.error("--etcd-faults needs --state etcd")
    if args.schedulers > 1 and args.state != "etcd":
        parser.error("--schedulers above 1 needs --state etcd: the group shares its store there")
    return args


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
