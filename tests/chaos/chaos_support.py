"""The chaos suite's machinery: its data, its cluster, fault rules and breakpoints.

Every chaos test runs one TPC-H query on a real 3-executor ``TestCluster`` while
a fault hits an executor at a deterministic point, then checks the answer against
single-process DuckDB and that the fault really happened.

* ``chaos_tpch``: TPC-H SF 0.01 rewritten with small Parquet row groups. The planner
  splits scans by row group, and the generator writes one per file at this scale:
  without the rewrite every scan would be a single task and most queries a single
  stage, with no shuffle for a fault to hit.
* ``ChaosCluster``: the module's cluster and session, plus ``restore()``, which
  brings it back to exactly ``EXECUTORS`` registered, unfrozen, fault-free
  executors after each test (replacing the dead, thawing the frozen).
* Fault rules (``kill_rule``, ``freeze_rule``, ``corrupt_rule``) in the format of
  the executor's ``--faults-file`` (see ``TestCluster.set_faults``).
* ``Breakpoints``: "the first executor to reach point P" as a deterministic trigger
  when which executor gets a task is up to the scheduler. Every candidate gets a
  freeze rule for P; the first one that stops is the victim, the rules are cleared,
  the others are thawed, and the test acts on the stopped victim (kill it, leave it
  frozen, send it SIGTERM). A rule that killed directly would fire on every
  executor the re-run task moves to.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import (
    CACHE_DIR,
    TPCH_ORDER_BY,
    TPCH_TABLES,
    assert_same_result,
    duckdb_views_sql,
    ensure_tpch,
    tpch_dir_name,
    tpch_query,
)

from mangonel.client.cluster import ExecutorHandle
from mangonel.client.session import Result, Session
from mangonel.client.status import ExecutorState, ExecutorStatus, JobState
from mangonel.testing.cluster import TestCluster

# ----------------------------------------------------------------------- settings

CHAOS_SCALE = 0.01
ROW_GROUP_ROWS = 2500
"""lineitem (60k rows at SF 0.01) gets 25 row groups, orders 6, partsupp 4."""
SPLIT_ROWS = 7500
"""So a lineitem scan is 9 tasks, orders 2, partsupp 2; small tables stay 1."""
EXECUTORS = 3
SLOTS = 2
PARTITIONS = 4
BROADCAST_BYTES = 100_000
"""Low enough that the bigger join sides are hash-shuffled and the small ones
broadcast: every query reads shuffle output, most in both ways."""
HEARTBEAT_TIMEOUT_S = 2.0
GRACE_S = 4.0
"""A job waits this long with no executor alive before it fails."""
QUERIES = tuple(range(1, 23))
QUERY_IDS = tuple(f"q{n:02d}" for n in QUERIES)

_POLL_S = 0.005
_STEP_TIMEOUT_S = 20.0
"""Bound on each wait of a test step, far above what a step takes on 2 cores."""
_SPAWN_TRIES = 3
_EXEC_S = 2.0
"""A forked child execs within milliseconds, even on 2 busy cores."""


def chaos_tpch(cache_dir: Path = CACHE_DIR) -> Path:
    """TPC-H SF 0.01 with ``ROW_GROUP_ROWS``-row groups; written once, then reused.

    Built from ``ensure_tpch(0.01)`` into a temporary directory that is renamed
    into place, so the cache exists only when complete.
    """
    target = cache_dir / f"{tpch_dir_name(CHAOS_SCALE)}-rg{ROW_GROUP_ROWS}"
    if all((target / f"{t}.parquet").is_file() for t in TPCH_TABLES):
        return target
    source = ensure_tpch(CHAOS_SCALE, cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir))
    tmp.chmod(0o755)
    try:
        for table in TPCH_TABLES:
            data = pq.read_table(source / f"{table}.parquet")
            pq.write_table(data, tmp / f"{table}.parquet", row_group_size=ROW_GROUP_ROWS)
        shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another run renamed its copy first; complete by construction.
            if not all((target / f"{t}.parquet").is_file() for t in TPCH_TABLES):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def start_chaos_cluster(work_dir: Path, secure: bool = False) -> TestCluster:
    """A started 3-executor cluster with the chaos settings (the caller stops it);
    with ``secure``, TLS on every channel and signed tickets, and executors that
    report hosts of their own, so that shuffle partitions cross over Flight."""
    cluster = TestCluster(
        executors=EXECUTORS,
        work_dir=work_dir,
        slots=SLOTS,
        partitions=PARTITIONS,
        broadcast_bytes=BROADCAST_BYTES,
        heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
        no_executor_grace=GRACE_S,
        # On, though every exchange is forced to PARTITIONS (which leaves it off by
        # default): the chaos suite must hold with coalesced reader stages too.
        adaptive=True,
        scheduler_args=("--split-rows", str(SPLIT_ROWS)),
        secure=secure,
        executor_args_for=(lambda i: ["--host-id", f"chaos-host-{i}"]) if secure else None,
    )
    return cluster.start()


# -------------------------------------------------------------------- fault rules


def kill_rule(
    when: str, stage: int | None = None, nth: int = 1, before_report: bool = False
) -> dict[str, Any]:
    """The executor SIGKILLs itself when it starts/finished its ``nth`` task of ``stage``."""
    rule: dict[str, Any] = {"action": "kill", "when": when, "nth": nth}
    if stage is not None:
        rule["stage"] = stage
    if before_report:
        rule["before_report"] = True
    return rule


def freeze_rule(
    when: str, stage: int | None = None, nth: int = 1, before_report: bool = False
) -> dict[str, Any]:
    """Like ``kill_rule``, but the executor SIGSTOPs itself."""
    return {**kill_rule(when, stage, nth, before_report), "action": "freeze"}


def lost_machine_rules(stage: int) -> list[dict[str, Any]]:
    """The executor reports its first task of ``stage``, then dies with its disk.

    Its output files of that task are deleted right before the report and it
    SIGKILLs itself right after: the scheduler counted on an output that is gone.
    Without the deletion, a consumer on this one host could still read the dead
    executor's files by path before the loss was noticed (some 10 to 50 ms), and
    whether stage ``stage`` had to be recomputed would depend on that race.
    """
    return [{"action": "delete", "stage": stage}, kill_rule("task_finished", stage=stage)]


def corrupt_rule(stage: int, map_partition: int, partition: int) -> dict[str, Any]:
    """Flip bytes in that shuffle file right after it is written."""
    return {
        "action": "corrupt",
        "stage": stage,
        "map_partition": map_partition,
        "partition": partition,
    }


# ------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class PlanPoints:
    """Stages of a plan where a fault is placed (numbers as in EXPLAIN)."""

    stages: int
    first_reader: int
    """The first stage that reads shuffle output: its tasks are reduce tasks."""
    final: int


_STAGE_BLOCK = re.compile(r"^Stage (\d+)\b.*?(?=^Stage \d+\b|\Z)", re.MULTILINE | re.DOTALL)
_READS_STAGE = re.compile(r"^\s+reads\s+stage \d+", re.MULTILINE)


def plan_points(explain_text: str) -> PlanPoints:
    """Find the stages a fault is aimed at from ``session.explain(query)``."""
    blocks = [(int(m.group(1)), m.group(0)) for m in _STAGE_BLOCK.finditer(explain_text)]
    if not blocks:
        raise ValueError(f"no stages in the explain text:\n{explain_text}")
    readers = [n for n, text in blocks if _READS_STAGE.search(text)]
    if not readers:
        raise ValueError(f"no stage reads shuffle output:\n{explain_text}")
    final = max(n for n, _ in blocks)
    return PlanPoints(stages=len(blocks), first_reader=min(readers), final=final)


# -------------------------------------------------------------------- processes


def process_state(pid: int) -> str:
    """The one-letter state of a process (``T`` stopped, ``Z`` zombie), ``""`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name is in parentheses and may hold spaces: split after it.
    return stat.rsplit(")", 1)[1].split()[0]


def is_stopped(pid: int) -> bool:
    return process_state(pid) == "T"


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = _STEP_TIMEOUT_S) -> None:
    """Poll ``predicate`` until true; fail the test saying ``what`` did not happen."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting until {what}")
        time.sleep(_POLL_S * 4)


def wait_exit(handle: ExecutorHandle, timeout: float = _STEP_TIMEOUT_S) -> float:
    """Wait for an executor process to exit; return when (``time.monotonic()``)."""
    try:
        handle.process.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"executor {handle.index} (pid {handle.pid}) did not exit in {timeout:g} s; "
            f"state {process_state(handle.pid)!r}, log ends:\n{handle.log_tail(1500)}"
        ) from None
    return time.monotonic()


def _execd(handle: ExecutorHandle) -> bool:
    """Whether the child runs the executor yet (a fork runs this program until exec)."""
    try:
        cmdline = Path(f"/proc/{handle.pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.split(b"\0")[:-1] == [os.fsencode(arg) for arg in handle.args]


# ---------------------------------------------------------------------- cluster


class ChaosCluster:
    """A started chaos cluster, a session with the tables, and the DuckDB reference."""

    def __init__(
        self, cluster: TestCluster, session: Session, reference: duckdb.DuckDBPyConnection
    ) -> None:
        self.cluster = cluster
        self.session = session
        self.reference = reference
        self.failed_spawns: list[tuple[int, int]] = []
        """(index, exit code) of executor starts that died before registering."""
        self.spent: set[int] = set()
        """Pids of running executors that a fault rule fired in. An executor fires
        a rule at most once in its life (known by position and content), so the
        same rule given to it again would never fire: ``restore`` replaces them."""

    @classmethod
    @contextlib.contextmanager
    def running(cls, work_dir: Path, data: Path, secure: bool = False) -> Iterator[ChaosCluster]:
        tables = {t: data / f"{t}.parquet" for t in TPCH_TABLES}
        reference = duckdb.connect()
        for statement in duckdb_views_sql(dict(tables)):
            reference.execute(statement)
        cluster = start_chaos_cluster(work_dir, secure)
        try:
            with cluster.connect() as session:
                for name, path in tables.items():
                    session.register_parquet(name, str(path))
                yield cls(cluster, session, reference)
        finally:
            cluster.stop()
            reference.close()

    # -- executors ----------------------------------------------------------------

    def live(self) -> list[ExecutorHandle]:
        """Our executor processes that are still running, in start order."""
        return [h for h in self.cluster.executors if h.alive()]

    def registered(self) -> list[ExecutorStatus]:
        """ALIVE executors as the scheduler lists them (in the order they connected)."""
        return list(self.session.status().alive_executors())

    def handle_of(self, pid: int) -> ExecutorHandle:
        for handle in self.cluster.executors:
            if handle.pid == pid:
                return handle
        raise AssertionError(f"pid {pid} is not one of this cluster's executors")

    def first_in_line(self) -> ExecutorHandle:
        """The executor that gets the first task of the next job on an idle cluster.

        The scheduler gives each task to the least loaded executor and breaks ties
        by registration order, so on an idle cluster stage 1's first task (map
        partition 0) goes to the earliest registered one.
        """
        alive = self.registered()
        assert alive, "no executor is registered"
        return self.handle_of(alive[0].pid)

    def executor_status(self, executor_id: str) -> ExecutorStatus:
        for entry in self.session.status().executors:
            if entry.id == executor_id:
                return entry
        raise AssertionError(f"executor {executor_id} is not in the scheduler's status")

    def wait_lost(self, executor_id: str, timeout: float = _STEP_TIMEOUT_S) -> ExecutorStatus:
        """Wait until the scheduler lists ``executor_id`` as LOST; return its entry."""
        wait_until(
            lambda: self.executor_status(executor_id).state is ExecutorState.LOST,
            f"the scheduler declared executor {executor_id} lost",
            timeout,
        )
        return self.executor_status(executor_id)

    def set_faults(self, handle: ExecutorHandle, rules: list[dict[str, Any]]) -> None:
        """Give one executor these rules; it is replaced at the next ``restore``."""
        self.cluster.set_faults(handle.index, rules)
        if rules:
            self.spent.add(handle.pid)

    def clear_faults(self) -> None:
        for handle in self.live():
            self.cluster.set_faults(handle.index, [])

    def spawn(self, count: int = 1) -> list[ExecutorHandle]:
        """Start ``count`` more executors (without waiting for them to register).

        About one start in a hundred goes wrong between fork and exec: a gRPC
        poller thread that the fork copied from this process fails ("epoll_wait
        error: Bad file descriptor") and the child hangs or aborts, before it
        runs the executor (``LocalCluster`` forks with a ``preexec_fn``; reported
        to the lead). So a start counts once the child has exec'd (its command
        line is the executor's); one that has not within ``_EXEC_S`` is killed
        and started again.
        """
        started: list[ExecutorHandle] = []
        for _ in range(_SPAWN_TRIES):
            pending = [self.cluster.add_executor(wait=False) for _ in range(count - len(started))]
            deadline = time.monotonic() + _EXEC_S
            while pending and time.monotonic() < deadline:
                for handle in list(pending):
                    if _execd(handle):
                        started.append(handle)
                        pending.remove(handle)
                    elif handle.process.poll() is not None:
                        self.failed_spawns.append((handle.index, handle.process.returncode))
                        pending.remove(handle)
                time.sleep(_POLL_S)
            for handle in pending:
                handle.signal(signal.SIGKILL)
                wait_exit(handle)
                self.failed_spawns.append((handle.index, handle.process.returncode))
            if len(started) == count:
                return started
        raise AssertionError(f"executor starts keep failing: {self.failed_spawns}")

    def spawn_registered(self, timeout: float = _STEP_TIMEOUT_S) -> ExecutorHandle:
        """Start one executor and wait until it is registered ALIVE."""
        (handle,) = self.spawn()
        wait_until(
            lambda: handle.pid in self._refresh_ids(),
            f"the new executor {handle.index} registered",
            timeout,
        )
        return handle

    def _refresh_ids(self) -> set[int]:
        """Give running handles the ids they are ALIVE under; return those pids."""
        alive = {e.pid: e.id for e in self.session.status().alive_executors()}
        for handle in self.live():
            if handle.pid in alive:
                handle.id = alive[handle.pid]
        return set(alive)

    def restore(self) -> None:
        """Back to exactly ``EXECUTORS`` registered, running, fault-free executors.

        Clears every rule, replaces the executors a rule fired in and the dead,
        thaws what is stopped (a thawed executor registers again under a new id),
        and waits until each running process is registered ALIVE and no job runs.
        Raises when the cluster cannot be brought back: the next test must not
        start on a cluster that is not the one it expects.
        """
        self.clear_faults()
        for handle in self.live():
            if handle.pid in self.spent:
                # SIGKILL, not a drain: the process is healthy, only done with.
                handle.signal(signal.SIGKILL)
                wait_exit(handle)
            else:
                handle.signal(signal.SIGCONT)
        self.spent.clear()
        for surplus in self.live()[EXECUTORS:]:
            surplus.signal(signal.SIGKILL)
            wait_exit(surplus)
        if len(self.live()) < EXECUTORS:
            self.spawn(EXECUTORS - len(self.live()))

        def settled() -> bool:
            registered = self._refresh_ids()
            running = [j for j in self.session.status().jobs if j.state is JobState.RUNNING]
            live = {h.pid for h in self.live()}
            return len(live) == EXECUTORS and registered == live and not running

        wait_until(settled, f"exactly {EXECUTORS} executors are registered and no job runs")

    # -- queries ------------------------------------------------------------------

    @cache  # noqa: B019 - one instance per module, and plans do not change
    def points(self, number: int) -> PlanPoints:
        return plan_points(self.session.explain(tpch_query(number)))

    @cache  # noqa: B019 - one instance per module, and answers do not change
    def expected(self, number: int) -> pa.Table:
        table = self.reference.sql(tpch_query(number)).to_arrow_table()
        assert table.num_rows > 0, f"q{number:02d} is empty at SF {CHAOS_SCALE}: proves nothing"
        return table

    def check(self, number: int, result: Result) -> None:
        """Fail unless ``result`` is DuckDB's answer to TPC-H query ``number``."""
        order_by = TPCH_ORDER_BY[number]
        assert_same_result(
            result.to_arrow(), self.expected(number), ordered=bool(order_by), order_by=order_by
        )


def tasks_rerun(result: Result, stage: int | None = None) -> int:
    """Attempts (of ``stage``, or of any) that made no output and were run again."""
    return sum(s.tasks_rerun for s in result.stages if stage is None or s.stage == stage)


def outputs_recomputed(result: Result, stage: int | None = None) -> int:
    """Finished outputs (of ``stage``, or of any) that were lost and made again."""
    return sum(s.outputs_recomputed for s in result.stages if stage is None or s.stage == stage)


# ------------------------------------------------------------------ breakpoints

Action = Callable[[ExecutorHandle], None]


def kill(handle: ExecutorHandle) -> None:
    handle.signal(signal.SIGKILL)


def leave_frozen(handle: ExecutorHandle) -> None:
    """Keep the victim stopped: the scheduler must notice by heartbeat timeout."""


def terminate(handle: ExecutorHandle) -> None:
    """SIGTERM the stopped victim, then let it run so that it handles the signal."""
    handle.signal(signal.SIGTERM)
    handle.signal(signal.SIGCONT)


@dataclass
class Hit:
    """One breakpoint reached: by which executor, when, and its id at the time."""

    handle: ExecutorHandle
    at: float
    executor_id: str | None


class FirstToReach:
    """Act on the first executor that reaches one point of a query (a breakpoint).

    Every running executor gets the freeze ``rule`` (plus its ``extra`` rules);
    the first to stop is the victim: the freeze rules are cleared (``extra`` ones
    stay), then ``action`` runs on it. Executors that stopped at the same point
    are thawed, now and until ``stop()``. Use it as a context manager around the
    query; ``hit`` says who was hit and when.
    """

    def __init__(
        self,
        chaos: ChaosCluster,
        rule: dict[str, Any],
        action: Action,
        extra: dict[int, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.chaos = chaos
        self.rule = rule
        self.action = action
        self.extra = extra or {}
        """Handle index -> rules that executor gets besides the freeze rule."""
        self.hit: Hit | None = None
        self.actions: list[str] = []
        """What this breakpoint did, in order (the hit, each thaw), for failure messages."""
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="first-to-reach", daemon=True)

    def __enter__(self) -> FirstToReach:
        self._arm(with_freeze=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        if self.error is not None:
            raise AssertionError(f"the breakpoint thread failed: {self.error!r}") from self.error

    def _arm(self, with_freeze: bool) -> None:
        for handle in self.chaos.live():
            rules = list(self.extra.get(handle.index, []))
            if with_freeze:
                rules.append(self.rule)
            # Not chaos.set_faults: only the executors that stop are spent.
            self.chaos.cluster.set_faults(handle.index, rules)
            if handle.index in self.extra:
                self.chaos.spent.add(handle.pid)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for handle in self.chaos.live():
                    if not is_stopped(handle.pid):
                        continue
                    self.chaos.spent.add(handle.pid)
                    if self.hit is None:
                        self.hit = Hit(handle, time.monotonic(), handle.id)
                        self._note(f"hit pid {handle.pid} ({handle.id})")
                        self._arm(with_freeze=False)
                        self.action(handle)
                    elif handle.pid != self.hit.handle.pid:
                        # Reached the point too, or had loaded the rule before it
                        # was cleared: it is not the victim.
                        self._note(f"thawed pid {handle.pid} ({handle.id})")
                        handle.signal(signal.SIGCONT)
                time.sleep(_POLL_S)
        except BaseException as exc:  # reported by stop() in the test's thread
            self.error = exc

    def _note(self, what: str) -> None:
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now))
        self.actions.append(f"{stamp}.{int(now * 1000) % 1000:03d} {what}")

    def require_hit(self) -> Hit:
        """The hit; fails the test when no executor reached the point."""
        assert self.hit is not None, (
            f"no executor reached the breakpoint {self.rule}: the fault never fired, "
            f"so this run tested nothing"
        )
        return self.hit
