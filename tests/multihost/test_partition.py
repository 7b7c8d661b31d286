"""Network partitions on a cluster whose every process runs on a host of its own.

Cases of issue 14 on one cluster (2 s heartbeat timeout, the default 30 s fetch
timeout): an executor cut off from everyone (below); cut off while a reader on
the other executor fetches its output; cut off from the scheduler only, both
ways and one way. A cut between two executors is in ``test_peer_cut``, with a
short fetch timeout. Each test prints the time from the cut to the answer.

The first case: an executor silently cut off from everyone mid-query
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

import itertools
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, is_stopped, tpch_query, wait_until
from net_support import QueryInBackground, start_cluster

from mangonel import defaults
from mangonel.client.status import ClusterStatus, ExecutorState
from mangonel.testing.netclient import Answer
from mangonel.testing.netcluster import NetCluster
from mangonel.testing.netlab import MOUNT_POINT

HEARTBEAT_TIMEOUT_S = 2.0
SPLIT_ROWS = 50_000  # lineitem in 12 tasks at SF 0.1: both executors run several
QUERY = 12  # lineitem by key range with orders, then a hash exchange to the aggregate
READER_QUERY = 18
"""Its stage 2, six tasks, reads every output of stage 1's six (the IN subquery's
line items): a reader of both executors' outputs on each. q12's stage 2 is the
aggregate after the exchange, which adaptive execution makes one task at SF 0.1,
so it may run on the victim and no reader waits on it."""
VICTIM = 1


@pytest.fixture(scope="module")
def net(lab_root: Path, tpch_tables: dict[str, Path]) -> Iterator[NetCluster]:
    cluster = start_cluster(lab_root, tpch_tables, SPLIT_ROWS, HEARTBEAT_TIMEOUT_S)
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True)
def _healed(net: NetCluster) -> Iterator[None]:
    """Every test ends with the lab healed, even one that failed with a host cut:
    the module's later tests need every host."""
    yield
    net.lab.heal()


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

    running = QueryInBackground(net, sql)
    query, answers = running.thread, running.answers
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


# ------------------------------------------------------- helpers of the cases below


_USES = itertools.count(1)


def _lost_ids(status: ClusterStatus) -> set[str]:
    return {e.id for e in status.executors if e.state is ExecutorState.LOST}


def _query_with_fault(
    net: NetCluster, sql: str, frozen: int, rule: dict[str, object], fault: Callable[[], None]
) -> tuple[Answer, float]:
    """Run ``sql``; when executor ``frozen`` freezes at ``rule``, apply ``fault`` and
    thaw it. Returns the answer and the time of the fault (the client host's clock
    and this one are the same machine's).

    A rule fires once per executor process, known by its position and content,
    and the cluster outlives the tests: never-matching rules in front give each
    use a position of its own.
    """
    padding = [{"action": "fail", "stage": 999}] * next(_USES)
    net.set_faults(frozen, [*padding, rule])
    running = QueryInBackground(net, sql)
    query, answers = running.thread, running.answers
    pid = net.executors[frozen].pid
    try:
        wait_until(lambda: is_stopped(pid) or answers, "the executor froze", timeout=60)
        assert not answers, f"the query ended before the breakpoint: {answers}"
        fault()
        cut_at = time.time()
    finally:
        os.kill(pid, signal.SIGCONT)
        net.set_faults(frozen, [])
    query.join(120)
    assert answers, "no answer within 120 s of the fault"
    answer = answers[0]
    if isinstance(answer, BaseException):
        raise answer
    return answer, cut_at


def _heal_and_rejoin(net: NetCluster, index: int, old_id: str) -> tuple[str, float]:
    """Heal the lab; wait until executor ``index`` is alive under a new id and has
    deleted its old life's directory. Returns the new id and the seconds it took."""
    net.lab.heal()
    healed_at = time.time()
    new_id = wait_until(
        lambda: (
            (i := _alive_ids(net.client.status()).get(net.executors[index].pid)) != old_id and i
        ),
        f"executor {index} rejoined under a new id",
        timeout=60,
    )
    rejoined = time.time() - healed_at
    old_life = net.executor_hosts[index].outside(f"{MOUNT_POINT}/work/{old_id}")
    wait_until(lambda: not old_life.exists(), f"executor {index} deleted its old life {old_life}")
    return new_id, rejoined


# --------------------------------------------- a lost executor's readers stop waiting


def test_readers_of_a_lost_executor_stop_waiting_for_it(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """The victim is cut off while a reader on the other executor is about to
    fetch its output: the reader is frozen at the start of its first task of
    stage 2 (which reads every map output of stage 1, some on the victim), the
    victim's port is cut, the reader thawed. Its fetch from the victim would wait
    out the whole fetch timeout (30 s); the scheduler cancels it once it suspects
    the victim (before the heartbeat timeout, 2 s, when a reader waits on it) and
    it runs again once the victim's outputs are made again. The answer may come
    before the loss; the victim, still cut, is lost at the heartbeat timeout."""
    sql = tpch_query(READER_QUERY)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    reader, victim = 1 - VICTIM, VICTIM
    ids = net.wait_for_executors(2)
    before = _lost_ids(net.client.status())
    rule = {"action": "freeze", "when": "task_started", "stage": 2, "nth": 1}
    victim_host = net.executor_hosts[victim]
    answer, cut_at = _query_with_fault(net, sql, reader, rule, lambda: net.lab.cut(victim_host))
    cut_to_answer = answer.finished_at - cut_at
    result = answer.result
    assert_same_result(
        result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[READER_QUERY]
    )
    # Still cut: lost at the heartbeat timeout if the answer came first.
    wait_until(
        lambda: ids[victim] in _lost_ids(net.client.status()), "the cut victim was lost", timeout=30
    )
    status = net.client.status()
    assert _lost_ids(status) - before == {ids[victim]}, status.executors
    lost = status.executor(ids[victim])
    assert lost is not None and lost.reason == "heartbeat timeout", lost
    stage1, stage2 = result.stages[0], result.stages[1]
    assert stage1.tasks_total >= 4 and stage2.tasks_total >= 2, result.stages
    # The victim's stage 1 outputs were made again, and the frozen reader ran again.
    assert stage1.outputs_recomputed >= 1 and stage2.tasks_rerun >= 1, result.stages
    print(
        f"q{READER_QUERY}, reader fetching from a cut-off executor: cut to answer "
        f"{cut_to_answer:.2f} s (heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s, fetch "
        f"timeout {defaults.FETCH_TIMEOUT_S:g} s)"
    )
    # Not a benchmark: the one bound that tells a cancelled reader from one that
    # waited its fetch out.
    assert cut_to_answer < defaults.FETCH_TIMEOUT_S, cut_to_answer
    _heal_and_rejoin(net, victim, ids[victim])


# ------------------------------------- an executor cut off from the scheduler only


@pytest.mark.parametrize("way", ["both-ways", "executor-to-scheduler", "scheduler-to-executor"])
def test_an_executor_cut_off_from_the_scheduler_only_is_replaced_and_rejoins(
    way: str, net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """Its peers still reach it, the scheduler does not hear it (both ways: nor
    can it command it; one way, executor to scheduler: its heartbeats are lost,
    the scheduler's orders still arrive; the other way: the scheduler's orders
    and answers are lost, and with them every new connection's handshake, so
    its heartbeats after the first that failed are never made). The scheduler
    cannot tell this from a dead executor, and must not wait: it is lost at the
    heartbeat timeout, its work made again; healed, it finds its life gone and
    rejoins under a new id. One loss, no flapping. The cut lands as in the first
    test: the victim frozen at its second task of stage 1."""
    sql = tpch_query(QUERY)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    ids = net.wait_for_executors(2)
    # Warm again: the victim is back under a new id, and its first tasks are slow.
    net.client.sql(sql)
    before = _lost_ids(net.client.status())
    victim_host = net.executor_hosts[VICTIM]
    rule = {"action": "freeze", "when": "task_started", "stage": 1, "nth": 2}
    ends = (net.scheduler_host, victim_host) if way == "scheduler-to-executor" else None
    src, dst = ends or (victim_host, net.scheduler_host)
    answer, cut_at = _query_with_fault(
        net, sql, VICTIM, rule, lambda: net.lab.cut_between(src, dst, way == "both-ways")
    )
    cut_to_answer = answer.finished_at - cut_at
    result = answer.result
    assert_same_result(result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[QUERY])
    # Still cut: lost at the heartbeat timeout if the answer came first.
    wait_until(
        lambda: ids[VICTIM] in _lost_ids(net.client.status()), "the cut victim was lost", timeout=30
    )
    lost = net.client.status().executor(ids[VICTIM])
    assert lost is not None, ids
    assert lost.reason == "heartbeat timeout", lost
    stage1 = result.stages[0]
    if way != "scheduler-to-executor":
        assert stage1.tasks_rerun >= 1 and stage1.outputs_recomputed >= 1, result.stages
    # Cut the other way, the victim's reports of what it finished may still
    # arrive, on a connection made before the cut: its work can stand.
    new_id, rejoined = _heal_and_rejoin(net, VICTIM, ids[VICTIM])
    status = net.client.status()
    # One loss (the victim's old life), the peer never lost: no flapping.
    assert _lost_ids(status) - before == {ids[VICTIM]}, status.executors
    assert net.executor_ids(status) == {1 - VICTIM: ids[1 - VICTIM], VICTIM: new_id}
    print(
        f"q{QUERY}, executor cut off from the scheduler ({way}): cut to answer "
        f"{cut_to_answer:.2f} s, {stage1.tasks_rerun} task(s) of stage 1 run again; "
        f"healed to rejoined as {new_id}: {rejoined:.2f} s"
    )
    again = net.client.sql(sql).result
    assert_same_result(again.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[QUERY])
