"""An executor cut off from one peer only: fetches between the two fail, the
scheduler still hears both (issue 14, network partitions).

Both executors heartbeat, so the scheduler must not take either for lost: that
would only make it register again under a new id, and the cut would fail the
next fetch across it the same way (flapping, re-runs without end). What
mangonel does instead (``SchedulerState``): the first reader that cannot reach
a holder makes one side of the cut give way *for that job*: the job stops using
it and makes its outputs again on the other side; the executor stays alive
under its id. With two executors the job finishes on one of them.

The cut needs a fetch to fail before anything happens, so this module's
executors have a short fetch timeout (``--fetch-timeout``); the time from the
cut to the answer is about that timeout plus the re-runs. The cut lands while
a reader is about to fetch: executor 0 freezes at the start of its first task
of stage 2 (which reads every map output of stage 1, some on executor 1); the
test cuts the two apart and thaws it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, is_stopped, tpch_query, wait_until
from net_support import QueryInBackground, start_cluster

from mangonel.client.status import ExecutorState
from mangonel.testing.netcluster import NetCluster

HEARTBEAT_TIMEOUT_S = 2.0
FETCH_TIMEOUT_S = 4.0
SPLIT_ROWS = 50_000  # lineitem in 12 tasks at SF 0.1: both executors run several
QUERY = 18
"""Its stage 2, six tasks, reads every output of stage 1's six (the IN subquery's
line items), on both executors. (q12's stage 2 is an aggregate after an exchange,
one task at SF 0.1 with adaptive execution: it may run on executor 1 alone.)"""


@pytest.fixture(scope="module")
def net(lab_root: Path, tpch_tables: dict[str, Path]) -> Iterator[NetCluster]:
    cluster = start_cluster(
        lab_root,
        tpch_tables,
        SPLIT_ROWS,
        HEARTBEAT_TIMEOUT_S,
        executor_args=("--fetch-timeout", str(FETCH_TIMEOUT_S)),
    )
    yield cluster
    cluster.stop()


def test_a_cut_between_two_executors_loses_neither(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(QUERY)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    order_by = TPCH_ORDER_BY[QUERY]
    warm = net.client.sql(sql).result
    assert_same_result(warm.to_arrow(), expected, ordered=True, order_by=order_by)
    ids = net.wait_for_executors(2)
    a, b = net.executor_hosts
    net.set_faults(0, [{"action": "freeze", "when": "task_started", "stage": 2, "nth": 1}])
    running = QueryInBackground(net, sql)
    query, answers = running.thread, running.answers
    pid = net.executors[0].pid
    try:
        wait_until(lambda: is_stopped(pid) or answers, "executor 0 froze", timeout=60)
        assert not answers, f"the query ended before the breakpoint: {answers}"
        net.lab.cut_between(a, b, both=True)
        cut_at = time.time()
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        query.join(120)
        assert answers, "no answer within 120 s of the cut"
        answer = answers[0]
        if isinstance(answer, BaseException):
            raise answer
        cut_to_answer = answer.finished_at - cut_at
        result = answer.result
        assert_same_result(result.to_arrow(), expected, ordered=True, order_by=order_by)
        status = net.client.status()
        # No executor was lost or registered again: the bound on flapping is zero.
        assert net.executor_ids(status) == ids, status.executors
        assert not [e for e in status.executors if e.state is ExecutorState.LOST], status
        stage1, stage2 = result.stages[0], result.stages[1]
        # The fault landed mid-query: a reader ran again, and outputs of the
        # side that gave way were made again.
        assert stage1.tasks_total >= 4 and stage2.tasks_total >= 2, result.stages
        assert stage2.tasks_rerun >= 1 and stage1.outputs_recomputed >= 1, result.stages
        print(
            f"q{QUERY}, two executors cut apart: cut to answer {cut_to_answer:.2f} s "
            f"(fetch timeout {FETCH_TIMEOUT_S:g} s, heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s); "
            f"stage 1 outputs recomputed {stage1.outputs_recomputed}, stage 2 tasks re-run "
            f"{stage2.tasks_rerun}; executors lost 0"
        )
        # While the cut lasts, a new query runs too (it pays one fetch timeout to
        # find the cut), and still nobody is lost.
        during = net.client.sql(sql).result
        assert_same_result(during.to_arrow(), expected, ordered=True, order_by=order_by)
        assert net.executor_ids() == ids
    finally:
        net.lab.heal()
        net.set_faults(0, [])
    healed = net.client.sql(sql).result
    assert_same_result(healed.to_arrow(), expected, ordered=True, order_by=order_by)
    assert net.executor_ids() == ids
