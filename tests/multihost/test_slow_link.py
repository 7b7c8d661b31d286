"""A slow link on the multi-host lab (issue 37): the executors' heartbeats carry
the rates their fetches get from each peer, and the scheduler's slow-link rules
(``scheduler.state_links``) act on them.

A scheduler, three two-slot executors and a client, each on a host of its own
(the issue's lab: heartbeat timeout 3 s, executors' ``--fetch-timeout 4``),
speculation on, TPC-H q9 at SF 1 (its join stage reads a 24 MB scan of
partsupp and 24 MB of joined lineitem). Executor 0's link is limited to 20
mbit both ways (``tc``) for ``RUNS`` runs: every answer is DuckDB's, the plan
ran as several stages, no executor is lost (a fetch that keeps receiving is
never failed for being slow, and the rules only cancel, copy and recompute),
and a rule acted on executor 0 (the scheduler's log names it: a job stopped
reading it, or a reader behind its link was copied). Times are printed
(``-s``), never asserted: ``benchmarks/slow_link.py`` measures them, rules off
against on, side by side.

Needs root for the lab's network namespaces: without them it fails, saying
why; it never skips.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import (
    TPCH_ORDER_BY,
    TPCH_TABLES,
    assert_same_result,
    duckdb_over,
    ensure_tpch,
    tpch_query,
)
from net_support import require_lab

from mangonel.testing.netclient import Answer
from mangonel.testing.netcluster import NetCluster

QUERY = 9
RUNS = 2
SLOW = 0  # the executor whose link is slowed
RATE = "20mbit"


@pytest.fixture(scope="module")
def sf1() -> dict[str, Path]:
    tables = ensure_tpch(1)
    return {t: tables / f"{t}.parquet" for t in TPCH_TABLES}


@pytest.fixture(scope="module")
def expected(sf1: dict[str, Path]) -> pa.Table:
    con = duckdb_over(sf1)
    table = con.sql(tpch_query(QUERY)).to_arrow_table()
    con.close()
    assert table.num_rows > 0  # an empty reference would prove nothing
    return table


@pytest.fixture(scope="module")
def net(lab_root: Path, sf1: dict[str, Path]) -> Iterator[NetCluster]:
    require_lab()
    cluster = NetCluster(
        lab_root,
        executors=3,
        slots=2,
        heartbeat_timeout=3.0,
        executor_args=("--fetch-timeout", "4"),
        speculation=True,
    ).start()
    try:
        for name, path in sf1.items():
            cluster.client.register_parquet(name, str(path))
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


def _check(answer: Answer, expected: pa.Table) -> None:
    assert_same_result(
        answer.result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[QUERY]
    )


def _lost(net: NetCluster) -> float:
    return sum(v for k, v in net.metrics().items() if k.startswith("mangonel_executors_lost_total"))


def _took(answer: Answer) -> float:
    return answer.finished_at - answer.started_at


def test_a_slow_link_loses_no_executor_and_every_answer_is_right(
    net: NetCluster, expected: pa.Table
) -> None:
    assert net.scheduler is not None
    slow_id = net.wait_for_executors(3)[SLOW]
    _check(net.client.sql(tpch_query(QUERY)), expected)  # warm
    time.sleep(2.0)  # a few heartbeats: the detectors learn their rhythm
    healthy = net.client.sql(tpch_query(QUERY))
    _check(healthy, expected)
    lost_before = _lost(net)
    log = net.scheduler.log_path
    net.lab.slow(net.executor_hosts[SLOW], RATE)
    runs: list[Answer] = []
    seen = len(log.read_text())
    try:
        for _ in range(RUNS):
            answer = net.client.sql(tpch_query(QUERY))
            _check(answer, expected)
            runs.append(answer)
    finally:
        net.lab.heal(net.executor_hosts[SLOW])
    assert len(runs[-1].result.stages) >= 4  # distributed: q9 runs as several stages
    assert _lost(net) == lost_before, "an executor was lost behind a slow link"
    acted = [
        line.split(": ", 1)[-1]
        for line in log.read_text()[seen:].splitlines()
        if f"executor {slow_id} slow link, a job stops reading it" in line
    ]
    assert acted, f"no slow-link rule acted on executor {slow_id} in {RUNS} runs at {RATE}"
    # It cancelled readers and made outputs again, or copied a reader: more
    # attempts than the stages have tasks.
    assert any(
        sum(s.attempts for s in a.result.stages) > sum(s.tasks_total for s in a.result.stages)
        for a in runs
    )
    print(
        f"q{QUERY} at {RATE}: {', '.join(f'{_took(a):.2f} s' for a in runs)} against "
        f"{_took(healthy):.2f} s healthy; outputs recomputed "
        f"{sum(a.result.outputs_recomputed for a in runs)}; the rules acted "
        f"{len(acted)} time(s){': ' + acted[0] if acted else ''}"
    )
