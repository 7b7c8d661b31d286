"""The object store cut off mid-query (issue 14, part 3): unreachable for a few
seconds, the store reads are retried and the query finishes; unreachable for
good, the query fails with an error naming the object and the store, in a time
bounded by the store timeouts, and never hangs.

The cluster reads TPC-H from the store host (``NetCluster(object_store=True)``)
with short store timeouts (``--s3-*``), so that one read's tries span a few
seconds. The cut is silent (the store's switch port forwards nothing): a
connection attempt times out, a request in flight goes without data. It lands
while scan tasks are about to read: both executors freeze at the start of their
first task of stage 1 (the scan of lineitem); the test cuts the store and thaws
them. Each test prints the time from the cut to the answer (or the error).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, is_stopped, tpch_query, wait_until
from net_support import QueryInBackground, start_cluster

from mangonel.testing.netclient import Answer
from mangonel.testing.netcluster import NetCluster

SPLIT_ROWS = 250_000  # lineitem in a few tasks at SF 0.1: both executors get one
QUERY = 6  # a scan of lineitem (stage 1) and an aggregate
CONNECT_TIMEOUT_S = 1.0
REQUEST_TIMEOUT_S = 2.0
ATTEMPTS = 4
BACKOFF_S = 0.2
MAX_TASK_ATTEMPTS = 4
CUT_S = 3.0
STORE_ARGS = (
    "--s3-connect-timeout", str(CONNECT_TIMEOUT_S),
    "--s3-request-timeout", str(REQUEST_TIMEOUT_S),
    "--s3-attempts", str(ATTEMPTS),
    "--s3-backoff", str(BACKOFF_S),
)  # fmt: skip
# One read given up: every try waits out at most the request timeout, and the
# backoff doubles between tries.
READ_GIVEN_UP_S = ATTEMPTS * REQUEST_TIMEOUT_S + sum(BACKOFF_S * 2**i for i in range(ATTEMPTS - 1))


@pytest.fixture(scope="module")
def net(lab_root: Path, tpch_tables: dict[str, Path]) -> Iterator[NetCluster]:
    cluster = start_cluster(
        lab_root,
        {name: tpch_tables[name] for name in ("lineitem",)},
        SPLIT_ROWS,
        executor_args=STORE_ARGS,
        object_store=True,
        scheduler_args=(*STORE_ARGS, "--max-task-attempts", str(MAX_TASK_ATTEMPTS)),
    )
    yield cluster
    cluster.stop()


_CUTS = itertools.count()
NO_TASK = {"action": "fail", "stage": 99}  # q6 has two stages


def _retries_logged(net: NetCluster) -> int:
    """The executors' log lines of a store read tried again (``storage.retrying``)."""
    logs = [net.lab.log_dir / f"{host.name}.log" for host in net.executor_hosts]
    return sum(
        1
        for path in logs
        if path.exists()
        for line in path.read_text(errors="replace").splitlines()
        if "object storage: " in line and " failed (" in line and "; try " in line
    )


def _cut_store_mid_scan(
    net: NetCluster, sql: str
) -> tuple[threading.Thread, list[Answer | BaseException], float]:
    """Start ``sql``, freeze both executors at their first scan task, cut the
    store, thaw them; return the query's thread, its answer list and the cut time."""
    assert net.store is not None
    net.wait_for_executors(2)
    # A rule fires once per executor, known by its position and content: each
    # cut's rule goes one position further, after rules that match no task.
    cut = next(_CUTS)
    rules = [*[NO_TASK] * cut, {"action": "freeze", "when": "task_started", "stage": 1, "nth": 1}]
    for index in range(2):
        net.set_faults(index, rules)
    running = QueryInBackground(net, sql)
    query, answers = running.thread, running.answers
    pids = [e.pid for e in net.executors]
    try:
        wait_until(
            lambda: all(is_stopped(pid) for pid in pids) or answers,
            "both executors froze at their first scan task",
            timeout=60,
        )
        assert not answers, f"the query ended before the breakpoint: {answers}"
        net.lab.cut(net.store.host)
        cut_at = time.time()
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        for index in range(2):
            net.set_faults(index, [])
    return query, answers, cut_at


def test_a_store_cut_for_a_few_seconds_is_retried(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    assert net.store is not None
    sql = tpch_query(QUERY)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    order_by = TPCH_ORDER_BY[QUERY]
    warm = net.client.sql(sql).result
    assert_same_result(warm.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
    assert warm.stages[0].tasks_total >= 2, warm.stages
    retries_before = _retries_logged(net)
    query, answers, cut_at = _cut_store_mid_scan(net, sql)
    try:
        time.sleep(CUT_S)
    finally:
        net.lab.heal(net.store.host)
    healed_at = time.time()
    query.join(120)
    assert answers, "no answer within 120 s of the cut"
    answer = answers[0]
    if isinstance(answer, BaseException):
        raise answer
    result = answer.result
    assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
    retries = _retries_logged(net) - retries_before
    rerun = sum(s.tasks_rerun for s in result.stages)
    print(
        f"q{QUERY}, the store cut for {healed_at - cut_at:.1f} s mid-scan: cut to answer "
        f"{answer.finished_at - cut_at:.2f} s "
        f"(heal to answer {answer.finished_at - healed_at:.2f} s); "
        f"store reads tried again {retries} times, tasks re-run {rerun} "
        f"(connect timeout {CONNECT_TIMEOUT_S:g} s, request timeout {REQUEST_TIMEOUT_S:g} s, "
        f"{ATTEMPTS} tries, backoff {BACKOFF_S:g} s)"
    )
    assert retries >= 1, "no store read was tried again"


def test_a_store_cut_for_good_fails_the_query_in_bounded_time(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    assert net.store is not None
    sql = tpch_query(QUERY)
    # Each attempt of a task gives up after one read's tries (plus a little to
    # report and launch again); the job fails when MAX_TASK_ATTEMPTS attempts of
    # its tasks in a row did so (the message says it), and the two executors'
    # attempts run side by side: half as many rounds as one task's attempts one
    # after another (the rule before), and one more for attempts that do not
    # line up.
    bound = (MAX_TASK_ATTEMPTS // 2 + 1) * (READ_GIVEN_UP_S + 2.0)
    retries_before = _retries_logged(net)
    query, answers, cut_at = _cut_store_mid_scan(net, sql)
    try:
        query.join(bound + 30)
        assert answers, f"no answer within {bound + 30:.0f} s of the cut: the query hangs"
        failed_at = time.time()
        answer = answers[0]
        assert isinstance(answer, BaseException), "the query answered with the store cut off"
        message = str(answer)
        print(
            f"q{QUERY}, the store cut for good: cut to error {failed_at - cut_at:.2f} s "
            f"(bound {bound:.0f} s; one read gives up after at most {READ_GIVEN_UP_S:.1f} s, "
            f"{MAX_TASK_ATTEMPTS} task attempts); error: {message.strip().splitlines()[-1]}"
        )
        # Typed as the store's error (a JobFailedError too: JobObjectStoreUnavailableError).
        assert "ObjectStoreUnavailableError" in message, message
        assert "s3://tpch/lineitem.parquet" in message, message
        assert net.store.url in message, message
        assert "did not answer" in message, message
        assert f"{MAX_TASK_ATTEMPTS} attempts in a row of the job's tasks" in message, message
        assert failed_at - cut_at < bound, (failed_at - cut_at, bound)
        # Each task attempt tried its read ATTEMPTS times before it gave up.
        retries = _retries_logged(net) - retries_before
        print(f"store reads tried again {retries} times")
        assert retries >= MAX_TASK_ATTEMPTS * (ATTEMPTS - 1), retries
    finally:
        net.lab.heal(net.store.host)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    healed = net.client.sql(sql).result
    order_by = TPCH_ORDER_BY[QUERY]
    assert_same_result(healed.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
