"""Network partitions of the control paths: the client, or the scheduler, cut off.

Cases of issue 14, on a cluster whose every process runs on a host of its own:

* the client's host silently cut off (its switch port stops forwarding) while
  its query runs, then healed: it gets its one, correct answer, and the result
  waited for it on the executors. A short cut (the client's defaults), and one
  longer than every client-side time limit it is given (unary calls, the
  reconnect window, the keepalive), under a query timeout longer than the cut;
* the client cut off from the executors only, when it reads the result: the
  read is tried again (the scheduler still counts them alive) and the query is
  not run again;
* a query whose timeout passes while the client is cut off: ``QueryTimeoutError``
  at its timeout, not a hang;
* the scheduler cut off from everyone for longer than the heartbeat timeout but
  shorter than the isolation grace: it hears no executor at once, takes itself
  for the one cut off and loses none; healed, they go on under their ids with
  their outputs, and the query submitted right before the cut is answered
  once, correctly, with nothing made again;
* the scheduler cut off for longer than the grace: the job fails saying that
  no executor was alive, and the cluster serves the next query.

The moment of each cut is chosen by a fault rule, not a sleep: an executor
freezes itself (SIGSTOP) at the start of a task of stage 1, the test cuts, then
thaws it, so the cut lands while the query runs. Times from the cut to the
answer are printed (``-s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query, wait_until
from net_support import fault_mid_query, start_cluster

from mangonel.client.status import ClusterStatus
from mangonel.errors import ClusterError
from mangonel.testing.netclient import Answer
from mangonel.testing.netcluster import NetCluster
from mangonel.testing.netlab import Host

HEARTBEAT_TIMEOUT_S = 2.0
GRACE_S = 8.0  # no executor alive for this long fails a job: longer than the short cuts
ISOLATION_GRACE_S = 6.0  # losses wait this much more while both executors are silent
SPLIT_ROWS = 50_000  # lineitem in 12 tasks at SF 0.1: both executors run several
QUERY = 12
FREEZER = 0  # the executor that freezes itself to time the cut

BIG_RESULT = "SELECT l_orderkey, l_linenumber, l_comment FROM lineitem WHERE l_orderkey < 20000"
"""A result too big to come with the job's final status (``executor.service.
INLINE_OUTPUT_BYTES``, where QUERY's does): the client reads it from the executors."""

# A client whose every own time limit is shorter than the cut it must survive.
IMPATIENT = {"timeout_s": 2.0, "reconnect_s": 3.0, "keepalive_s": 1.0}


@pytest.fixture(scope="module")
def net(lab_root: Path, tpch_tables: dict[str, Path]) -> Iterator[NetCluster]:
    cluster = start_cluster(
        lab_root,
        tpch_tables,
        SPLIT_ROWS,
        HEARTBEAT_TIMEOUT_S,
        scheduler_args=(
            "--no-executor-grace",
            str(GRACE_S),
            "--isolation-grace",
            str(ISOLATION_GRACE_S),
        ),  # fmt: skip
    )
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def expected(net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection) -> pa.Table:
    """DuckDB's answer, after one run on the cluster warmed both executors."""
    sql = tpch_query(QUERY)
    table = duckdb_ref.sql(sql).to_arrow_table()
    assert table.num_rows > 0  # an empty reference would prove nothing
    _check(net.client.sql(sql), table)
    return table


def _check(answer: Answer, expected: pa.Table) -> None:
    actual = answer.result.to_arrow()
    assert_same_result(actual, expected, ordered=True, order_by=TPCH_ORDER_BY[QUERY])


def _check_big(answer: Answer, expected: pa.Table) -> None:
    assert_same_result(answer.result.to_arrow(), expected, ordered=False)


class _Query:
    """The test's query, run on the client host from a thread of the test."""

    def __init__(self, net: NetCluster, sql: str | None = None, **options: Any) -> None:
        self.outcome: list[Answer | BaseException] = []
        self.ended_at = 0.0

        def run() -> None:
            try:
                self.outcome.append(net.client.sql(sql or tpch_query(QUERY), **options))
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                self.outcome.append(exc)
            self.ended_at = time.time()

        self._thread = threading.Thread(target=run, name="query", daemon=True)
        self._thread.start()

    def wait(self, timeout: float = 120.0) -> Answer | BaseException:
        self._thread.join(timeout)
        assert self.outcome, f"no answer within {timeout:g} s"
        return self.outcome[0]

    def answer(self, timeout: float = 120.0) -> Answer:
        outcome = self.wait(timeout)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _jobs(status: ClusterStatus) -> set[str]:
    return {j.job_id for j in status.jobs}


def _lost(net: NetCluster) -> float:
    """Executors the scheduler has lost since it started, for any reason."""
    samples = net.metrics()
    return sum(v for k, v in samples.items() if k.startswith("mangonel_executors_lost_total"))


def _scheduler_log(net: NetCluster) -> str:
    assert net.scheduler is not None
    return net.scheduler.log_path.read_text()


def _client_log(net: NetCluster) -> str:
    """What the client host's session logged (how it rode out each fault)."""
    assert net.agent is not None
    return net.agent.log_path.read_text()


def _heal_at(net: NetCluster, at: float, *hosts: Host) -> None:
    time.sleep(max(0.0, at - time.time()))
    net.lab.heal(*hosts)


# ------------------------------------------------------------------- the client


def test_the_client_cut_off_mid_query_gets_its_answer_when_healed(
    net: NetCluster, expected: pa.Table
) -> None:
    """A short silent cut, the client's defaults: the job finishes during the cut,
    its result waits on the executors, and the client reads it once healed."""
    jobs_before = _jobs(net.client.status())
    query, cut_at = fault_mid_query(
        net, FREEZER, lambda: _Query(net), lambda: net.lab.cut(net.client_host)
    )
    _heal_at(net, cut_at + 4.0, net.client_host)
    healed_at = time.time()
    answer = query.answer()
    _check(answer, expected)
    job_finished = answer.started_at + answer.result.scheduler_elapsed_s
    # It finished while the client was cut off: the answer waited for the heal.
    assert job_finished < healed_at < answer.finished_at, (job_finished, healed_at)
    new_jobs = _jobs(net.client.status()) - jobs_before
    assert new_jobs == {answer.result.job_id}, new_jobs  # submitted once, answered once
    print(
        f"client cut 4 s: cut to answer {answer.finished_at - cut_at:.2f} s, "
        f"heal to answer {answer.finished_at - healed_at:.2f} s"
    )


def test_a_cut_longer_than_every_client_time_limit_is_survived_within_the_query_timeout(
    net: NetCluster, expected: pa.Table
) -> None:
    """The client pings every second, gives a call 2 s and the scheduler 3 s to
    answer again; cut off for 8 s, it keeps trying until the query's timeout."""
    jobs_before = _jobs(net.client.status())
    query, cut_at = fault_mid_query(
        net,
        FREEZER,
        lambda: _Query(net, timeout_s=60.0, session=IMPATIENT),
        lambda: net.lab.cut(net.client_host),
    )
    _heal_at(net, cut_at + 8.0, net.client_host)
    healed_at = time.time()
    answer = query.answer()
    _check(answer, expected)
    assert answer.started_at + answer.result.scheduler_elapsed_s < healed_at
    assert _jobs(net.client.status()) - jobs_before == {answer.result.job_id}
    # The silent watch was found dead by its pings, and watched again once healed.
    assert f"watching job {answer.result.job_id} again" in _client_log(net)
    print(
        f"client cut 8 s (keepalive 1 s, calls 2 s, reconnect 3 s): cut to answer "
        f"{answer.finished_at - cut_at:.2f} s, "
        f"heal to answer {answer.finished_at - healed_at:.2f} s"
    )


def test_a_result_on_executors_the_client_cannot_reach_is_read_again_not_rerun(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """Cut between the client and both executors (the scheduler still hears them
    and the client): the result's read fails, the scheduler says its executors
    are alive, the client reads again until the heal. No second job."""
    expected = duckdb_ref.sql(BIG_RESULT).to_arrow_table()
    assert expected.num_rows > 10_000
    _check_big(net.client.sql(BIG_RESULT), expected)  # warm: the cut is the only delay
    jobs_before = _jobs(net.client.status())
    seen = len(_client_log(net))
    client = net.client_host
    for host in net.executor_hosts:
        net.lab.cut_between(client, host)
    cut_at = time.time()
    query = _Query(net, BIG_RESULT, timeout_s=60.0, session=IMPATIENT)
    wait_until(
        lambda: "reading it again" in _client_log(net)[seen:] or query.outcome,
        "the client failed to read the result",
        60,
    )
    time.sleep(2.0)  # a few more tries
    assert not query.outcome, query.outcome
    for host in net.executor_hosts:
        net.lab.heal_between(client, host)
    healed_at = time.time()
    answer = query.answer()
    _check_big(answer, expected)
    assert answer.started_at + answer.result.scheduler_elapsed_s < healed_at
    assert _jobs(net.client.status()) - jobs_before == {answer.result.job_id}
    log = _client_log(net)[seen:]
    assert f"job {answer.result.job_id}: result partition" in log, log[-2000:]
    assert "running the query again" not in log, log[-2000:]
    print(
        f"client cut from the executors {healed_at - cut_at:.1f} s: "
        f"cut to answer {answer.finished_at - cut_at:.2f} s, "
        f"heal to answer {answer.finished_at - healed_at:.2f} s"
    )


def test_a_query_whose_timeout_passes_while_the_client_is_cut_off_fails_at_its_timeout(
    net: NetCluster, expected: pa.Table
) -> None:
    try:
        query, cut_at = fault_mid_query(
            net,
            FREEZER,
            lambda: _Query(net, timeout_s=5.0, session=IMPATIENT),
            lambda: net.lab.cut(net.client_host),
        )
        outcome = query.wait(30)
    finally:
        net.lab.heal(net.client_host)
    assert isinstance(outcome, ClusterError), outcome
    text = str(outcome)
    assert "QueryTimeoutError" in text and "within its timeout of 5 s" in text, text
    assert "could not be cancelled" in text, text  # the scheduler was out of reach
    print(f"query timeout 5 s, client cut: failed {query.ended_at - cut_at:.2f} s after the cut")
    _check(net.client.sql(tpch_query(QUERY)), expected)


# ---------------------------------------------------------------- the scheduler


def test_the_scheduler_cut_off_past_the_heartbeat_timeout_keeps_its_executors_and_their_work(
    net: NetCluster, expected: pa.Table
) -> None:
    """Cut for 5 s (heartbeat timeout 2 s, isolation grace 6 s): both executors
    fall silent at once, so the scheduler takes itself for the one cut off and
    loses neither; healed, they go on under their ids with their outputs, and
    the job runs to its one, correct answer with nothing made again."""
    status = net.client.status()
    jobs_before = _jobs(status)
    old = net.executor_ids(status)
    lost_before = _lost(net)
    query, cut_at = fault_mid_query(
        net, FREEZER, lambda: _Query(net), lambda: net.lab.cut(net.scheduler_host)
    )
    _heal_at(net, cut_at + 5.0, net.scheduler_host)
    healed_at = time.time()
    answer = query.answer()
    _check(answer, expected)

    status = net.client.status()
    assert _jobs(status) - jobs_before == {answer.result.job_id}  # one job, one answer
    assert net.executor_ids(status) == old  # the same lives, none lost
    assert _lost(net) == lost_before
    assert answer.result.outputs_recomputed == 0, answer.result.stages
    assert "most executors are silent at once" in _scheduler_log(net)
    print(
        f"scheduler cut 5 s: cut to answer {answer.finished_at - cut_at:.2f} s, heal to "
        f"answer {answer.finished_at - healed_at:.2f} s; executors kept {sorted(old.values())}"
    )
    _check(net.client.sql(tpch_query(QUERY)), expected)


def test_the_scheduler_cut_off_past_the_grace_fails_the_job_saying_so(
    net: NetCluster, expected: pa.Table
) -> None:
    query, cut_at = fault_mid_query(
        net, FREEZER, lambda: _Query(net), lambda: net.lab.cut(net.scheduler_host)
    )
    # Lost at the heartbeat timeout and the isolation grace (or when keepalive
    # finds the streams dead), failed a grace later: heal a little after.
    _heal_at(net, cut_at + HEARTBEAT_TIMEOUT_S + ISOLATION_GRACE_S + GRACE_S + 2.0,
             net.scheduler_host)  # fmt: skip
    healed_at = time.time()
    outcome = query.wait()
    assert isinstance(outcome, ClusterError), outcome  # the client host's error, as text
    text = str(outcome)
    assert "JobFailedError" in text and "no executor was alive" in text, text
    print(
        f"scheduler cut {healed_at - cut_at:.1f} s (grace {GRACE_S:g} s): job failed; the "
        f"client heard it {query.ended_at - healed_at:.2f} s after the heal"
    )
    net.wait_for_executors(2)
    _check(net.client.sql(tpch_query(QUERY)), expected)
