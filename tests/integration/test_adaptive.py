"""Adaptive execution on real processes: a hash exchange's reader stage coalesced
from the real sizes of its partitions, with the right answer, through an
executor's death and through a scheduler's restart.

The query is TPC-H q12 on SF 0.1 with hash joins only (``broadcast_bytes=0``, and
``orders`` in a random order of its rows, so that its row groups cannot be joined
into the ``lineitem`` tasks by key range) and 8 partitions per exchange::

    stage 1  scan orders               ─┐ hash(orderkey), 8 partitions
    stage 2  scan lineitem, 6 tasks    ─┤
    stage 3  join + partial agg, 8     ◀┘ coalesced: each task a range of partitions
    stage 4  final agg, 8              ◀─ coalesced too (a few hundred bytes)
    stage 5  sort, 1 task (the result)

Two of the tests set the coalesced tasks' size past anything SF 0.1 holds
(``--adaptive-partition-bytes``, ``--adaptive-min-partition-bytes``), so each
coalesced stage runs exactly one task: a fault aimed at "the join's first
attempt" then hits exactly one executor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, shuffled_orders, tpch_query

from mangonel.client.session import Result, Session
from mangonel.client.status import StageStatus
from mangonel.testing.cluster import TestCluster

Q12 = tpch_query(12)
SCAN_ORDERS, SCAN_LINEITEM, JOIN, FINAL_AGG = 1, 2, 3, 4
PARTITIONS = 8
ONE_TASK = (
    "--adaptive-partition-bytes",
    str(1 << 40),
    "--adaptive-min-partition-bytes",
    str(1 << 40),
)
"""Scheduler options that make every coalesced stage one task."""
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def start(
    work_dir: Path, tpch_tables: dict[str, Path]
) -> Iterator[Callable[..., tuple[TestCluster, Session]]]:
    """Start a cluster with lineitem and orders registered (stopped after the test)."""
    started: list[tuple[TestCluster, Session]] = []

    def make(*scheduler_args: str, **kwargs: Any) -> tuple[TestCluster, Session]:
        directory = work_dir / f"cluster{len(started)}"
        directory.mkdir(parents=True)
        # Where ``test_scheduler_restart.crash_file`` looks: beside the work directory.
        crash = directory / "crash.json"
        crash.write_text("[]")
        options: dict[str, Any] = {"executors": 2, "slots": 2, "partitions": PARTITIONS}
        options.update(broadcast_bytes=0, heartbeat_timeout=2.0, adaptive=True)
        options.update(
            scheduler_args=("--split-rows", "100000", "--crash-file", str(crash), *scheduler_args)
        )
        options.update(kwargs)
        cluster = TestCluster(work_dir=directory / "cluster", **options)
        cluster.start()
        session = cluster.connect()
        started.append((cluster, session))
        session.register_parquet("lineitem", str(tpch_tables["lineitem"]))
        session.register_parquet("orders", str(shuffled_orders(tpch_tables["orders"], directory)))
        return cluster, session

    yield make
    for cluster, session in started:
        session.close()
        cluster.stop()


def check_q12(result: Result, reference: duckdb.DuckDBPyConnection) -> None:
    expected = reference.sql(Q12).to_arrow_table()
    assert_same_result(result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[12])


def stage(result: Result, number: int) -> StageStatus:
    (found,) = [s for s in result.stages if s.stage == number]
    return found


def test_a_reader_of_small_partitions_runs_fewer_tasks_with_the_same_answer(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    _, session = start()
    result = session.sql(Q12)
    check_q12(result, duckdb_ref)
    assert len(result.stages) == 5, result.stages
    # The scans ran as planned: they read splits, not partitions.
    assert stage(result, SCAN_LINEITEM).tasks_total == 6
    assert stage(result, SCAN_LINEITEM).tasks_planned is None
    # SF 0.1's exchanges hold a few MiB at most: each reader ran fewer tasks than
    # the 8 planned, and every one of those tasks finished.
    for number in (JOIN, FINAL_AGG):
        s = stage(result, number)
        assert s.tasks_planned == PARTITIONS, s
        assert 1 <= s.tasks_total < PARTITIONS, s
        assert s.tasks_done == s.tasks_total, s


def test_adaptive_off_runs_the_planned_tasks(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    _, session = start(adaptive=False)
    result = session.sql(Q12)
    check_q12(result, duckdb_ref)
    for number in (JOIN, FINAL_AGG):
        s = stage(result, number)
        assert (s.tasks_total, s.tasks_planned, s.tasks_done) == (PARTITIONS, None, PARTITIONS)


def test_an_executor_killed_in_a_coalesced_stage_has_its_outputs_made_again_for_it(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The join runs as one task; its first attempt kills the executor it starts on,
    # which dies holding scan outputs the join reads (both executors ran scan
    # tasks). The scans it held are made again on the survivor, which writes the
    # same 8 partitions, and the join's one task reads all of them again.
    cluster, session = start(*ONE_TASK)
    kill = {"action": "kill", "when": "task_started", "stage": JOIN, "attempt": 0}
    cluster.set_faults_all([kill])
    result = session.sql(Q12)
    check_q12(result, duckdb_ref)
    dead = [e for e in cluster.executors if not e.alive()]
    assert len(dead) == 1, "exactly the executor that started the join must have died"
    join = stage(result, JOIN)
    assert (join.tasks_total, join.tasks_planned, join.tasks_done) == (1, PARTITIONS, 1)
    assert join.tasks_rerun >= 1, result.stages
    recomputed = sum(stage(result, n).outputs_recomputed for n in (SCAN_ORDERS, SCAN_LINEITEM))
    assert recomputed >= 1, result.stages


def test_coalesced_ranges_survive_a_scheduler_restart_mid_stage(
    start: Callable[..., tuple[TestCluster, Session]], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The scheduler kills itself once it sent the coalesced join's task. The
    # restarted one reads the stage's ranges back from its store: had it lost
    # them, the stage would come back as 8 tasks as planned.
    from test_scheduler_restart import run_through_crash

    cluster, session = start(*ONE_TASK, heartbeat_timeout=3.0)
    rule = {"event": "*", "commands": "LaunchTask", "stage": JOIN, "point": "executed"}
    result, _ = run_through_crash(cluster, session, Q12, rule)
    check_q12(result, duckdb_ref)
    join = stage(result, JOIN)
    assert (join.tasks_total, join.tasks_planned, join.tasks_done) == (1, PARTITIONS, 1)
    # Its attempt died with the scheduler's view of it and ran again.
    assert join.tasks_rerun >= 1, result.stages


# ------------------------------------------------------------ every TPC-H answer


@pytest.fixture(scope="module")
def adaptive_session(module_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[Session]:
    """A cluster that never broadcasts (every join a hash exchange of both sides)
    and plans 8 partitions an exchange, with adaptive execution on: at SF 0.1
    nearly every reader stage is coalesced."""
    import mangonel

    with (
        mangonel.LocalCluster(
            executors=2,
            work_dir=str(module_dir / "cluster"),
            partitions=PARTITIONS,
            broadcast_bytes=0,
            adaptive=True,
        ) as cluster,
        cluster.connect() as client,
    ):
        for name, path in tpch_tables.items():
            client.register_parquet(name, str(path))
        yield client


QUERIES = list(range(1, 23))


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_tpch_answers_with_coalesced_stages_match_duckdb(
    number: int, adaptive_session: Session, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0  # an empty reference would prove nothing
    result = adaptive_session.sql(sql)
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
    for s in result.stages:
        assert s.tasks_done == s.tasks_total, s
        assert s.tasks_planned is None or 1 <= s.tasks_total < s.tasks_planned, s
    if number in (3, 12, 18):  # joins of two big tables: hash exchanges, coalesced
        assert any(s.tasks_planned == PARTITIONS for s in result.stages), result.stages
