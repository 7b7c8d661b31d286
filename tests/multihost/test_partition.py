"""Network partitions on a cluster whose every process runs on a host of its own.

The first case of issue 14: an executor silently cut off from everyone mid-query
(its switch port stops forwarding: no reset, no error, only silence). The
scheduler must declare it lost after the heartbeat timeout and recompute its
work elsewhere, and the query must give DuckDB's answer. When the link heals,
the executor must find its old life gone, delete that life's files and join
again under a new id.

The moment of the cut is chosen by a fault rule, not by a sleep: the victim
freezes itself (SIGSTOP) at the start of its second task of stage 1 (of 12),
after it finished and reported its first; the test then cuts its port and thaws it. The
victim thus holds a finished output the query needs and runs a task whose report
cannot arrive, and stage 1 cannot finish until the victim is declared lost: no
task of a later stage is ever given an output on the victim to fetch.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, is_stopped, tpch_query, wait_until
from net_support import start_cluster

from mangonel.client.status import ClusterStatus, ExecutorState
from mangonel.testing.netclient import Answer
from mangonel.testing.netcluster import NetCluster
from mangonel.testing.netlab import MOUNT_POINT

HEARTBEAT_TIMEOUT_S = 2.0
SPLIT_ROWS = 50_000  # lineitem in 12 tasks at SF 0.1: both executors run several
QUERY = 12  # lineitem by key range with orders, then a hash exchange to the aggregate
VICTIM = 1


@pytest.fixture(scope="module")
def net(lab_root: Path, tpch_tables: dict[str, Path]) -> Iterator[NetCluster]:
    cluster = start_cluster(lab_root, tpch_tables, SPLIT_ROWS, HEARTBEAT_TIMEOUT_S)
    yield cluster
    cluster.stop()


def _alive_ids(status: ClusterStatus) -> dict[int, str]:
    return {e.pid: e.id for e in status.executors if e.state is ExecutorState.ALIVE}


def test_an_executor_cut_off_from_everyone_is_replaced_and_rejoins(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(QUERY)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    # Once before the fault: every executor warm (a first task on a fresh
    # executor is slow, and its peer would take most of stage 1 meanwhile).
    warm = net.client.sql(sql).result
    assert_same_result(warm.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[QUERY])
    victim = net.executors[VICTIM]
    victim_host = net.executor_hosts[VICTIM]
    old_id = net.executor_ids()[VICTIM]
    old_life = victim_host.outside(f"{MOUNT_POINT}/work/{old_id}")
    assert old_life.is_dir()
    net.set_faults(VICTIM, [{"action": "freeze", "when": "task_started", "stage": 1, "nth": 2}])

    answers: list[Answer | BaseException] = []

    def run_query() -> None:
        try:
            answers.append(net.client.sql(sql))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            answers.append(exc)

    query = threading.Thread(target=run_query, name="query", daemon=True)
    query.start()
    try:
        wait_until(lambda: is_stopped(victim.pid) or answers, "the victim froze", timeout=60)
        assert not answers, f"the query ended before the breakpoint: {answers}"
        net.lab.cut(victim_host)
        cut_at = time.time()
    finally:
        os.kill(victim.pid, signal.SIGCONT)  # alive again, on a dead port
    query.join(120)
    assert answers, "no answer within 120 s of the cut"
    answer = answers[0]
    if isinstance(answer, BaseException):
        raise answer
    cut_to_answer = answer.finished_at - cut_at
    result = answer.result

    assert_same_result(result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[QUERY])
    status = net.client.status()
    lost = status.executor(old_id)
    assert lost is not None and lost.state is ExecutorState.LOST, lost
    assert lost.reason == "heartbeat timeout", lost
    stage1 = result.stages[0]
    assert stage1.tasks_total >= 4, result.stages
    # The victim's running task ran again, and its finished output was made again.
    assert stage1.tasks_rerun >= 1 and stage1.outputs_recomputed >= 1, result.stages
    assert victim.alive()

    net.lab.heal(victim_host)
    healed_at = time.time()
    ids = wait_until(
        lambda: _alive_ids(net.client.status()).get(victim.pid), "the victim rejoined", timeout=60
    )
    rejoined = time.time() - healed_at
    assert ids != old_id
    wait_until(lambda: not old_life.exists(), f"the victim deleted its old life {old_life}")
    print(
        f"q{QUERY}: cut to answer {cut_to_answer:.2f} s (heartbeat timeout "
        f"{HEARTBEAT_TIMEOUT_S:g} s; submit to cut {cut_at - answer.started_at:.2f} s); "
        f"healed to rejoined as {ids}: {rejoined:.2f} s"
    )

    # The cluster goes on with both executors.
    again = net.client.sql(sql).result
    assert_same_result(again.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[QUERY])
