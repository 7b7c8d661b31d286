"""Gray failures with real processes: stragglers copied, executors that keep failing excluded.

Each test starts its own 3-executor ``TestCluster`` (the chaos settings: TPC-H SF
0.01 with small row groups, so q1's lineitem scan, stage 1, is 9 tasks over 6
slots) with the web API on, runs TPC-H q1 and checks DuckDB's answer. The faults
are rules, not sleeps in the test:

* a straggler is a ``delay`` rule on the first executor in line: its stage-1
  attempts 0 (p0 and p3: the scheduler gives it two of the first six) sleep at
  their start. The other seven finish, past the 0.75 quantile, so the two are
  copied onto the other executors, which run them at once;
* a copy is hit by a rule naming attempt 1 (a task's copy: nothing else failed);
* a bad executor fails every stage-1 attempt it starts (``fail`` rules).

That the fault landed is read from the scheduler's job document
(``/api/jobs/ID``: speculative copies launched, won, lost; each attempt with
its kind and why it ended), its executors (``/api/executors``) and ``/metrics``.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from chaos_support import (
    BROADCAST_BYTES,
    PARTITIONS,
    SLOTS,
    SPLIT_ROWS,
    wait_until,
)
from helpers import (
    TPCH_ORDER_BY,
    TPCH_TABLES,
    assert_same_result,
    duckdb_views_sql,
    tpch_query,
)

from mangonel.client.cluster import ExecutorHandle
from mangonel.client.session import Result, Session
from mangonel.client.status import ExecutorState
from mangonel.errors import JobFailedError
from mangonel.testing.cluster import TestCluster

pytestmark = pytest.mark.timeout(120)

QUERY = 1
SCAN = 1
"""q1's stage 1: the lineitem scan, 9 tasks."""
STRAGGLE_S = 20.0
"""How long the straggler's attempts sleep: far more than the whole query takes
when its copies win."""


class Gray:
    """A started cluster, its session, the DuckDB reference and the web API."""

    def __init__(self, cluster: TestCluster, session: Session, data: Path) -> None:
        self.cluster = cluster
        self.session = session
        self.reference = duckdb.connect()
        for statement in duckdb_views_sql({t: data / f"{t}.parquet" for t in TPCH_TABLES}):
            self.reference.execute(statement)

    def in_line(self) -> list[ExecutorHandle]:
        """Executors in the order the scheduler breaks ties between idle ones."""
        alive = [e.pid for e in self.session.status().alive_executors()]
        by_pid = {h.pid: h for h in self.cluster.executors}
        return [by_pid[pid] for pid in alive]

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.cluster.web_url + path, timeout=10) as answer:
            return json.load(answer)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.cluster.web_url + "/metrics", timeout=10) as answer:
            text: str = answer.read().decode()
            return text

    def executor_id(self, handle: ExecutorHandle) -> str:
        for e in self.session.status().executors:
            if e.pid == handle.pid:
                return e.id
        raise AssertionError(f"executor pid {handle.pid} is not listed")

    def run_and_check(self) -> tuple[Result, dict[str, Any]]:
        result = self.session.sql(tpch_query(QUERY))
        expected = self.reference.sql(tpch_query(QUERY)).to_arrow_table()
        assert expected.num_rows > 0
        order_by = TPCH_ORDER_BY[QUERY]
        assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
        job = self.api(f"/api/jobs/{result.job_id}")
        scan = stage(job, SCAN)
        assert scan["num_tasks"] >= 6, "the scan must run distributed for a straggler to matter"
        return result, job


def stage(job: dict[str, Any], number: int) -> dict[str, Any]:
    found: dict[str, Any] = next(s for s in job["stages"] if s["id"] == number)
    return found


def attempts(job: dict[str, Any], **match: object) -> list[dict[str, Any]]:
    return [a for a in job["attempts"] if all(a[k] == v for k, v in match.items())]


def delay(seconds: float, attempt: int) -> dict[str, Any]:
    return {"action": "delay", "seconds": seconds, "stage": SCAN, "attempt": attempt}


@pytest.fixture
def gray(work_dir: Path, chaos_data: Path, request: pytest.FixtureRequest) -> Iterator[Gray]:
    options: dict[str, Any] = {"heartbeat_timeout": 2.0, **getattr(request, "param", {})}
    cluster = TestCluster(
        executors=3,
        work_dir=work_dir / "cluster",
        slots=SLOTS,
        partitions=PARTITIONS,
        broadcast_bytes=BROADCAST_BYTES,
        scheduler_args=("--split-rows", str(SPLIT_ROWS)),
        web_port=0,
        speculation=True,  # off by default in a TestCluster
        **options,
    )
    cluster.start()
    try:
        with cluster.connect() as session:
            for table in TPCH_TABLES:
                session.register_parquet(table, str(chaos_data / f"{table}.parquet"))
            yield Gray(cluster, session, chaos_data)
    finally:
        cluster.stop()


# -------------------------------------------------------------------- stragglers


def test_copies_of_a_straggler_win_and_its_attempts_are_cancelled(gray: Gray) -> None:
    slow = gray.in_line()[0]
    slow_id = gray.executor_id(slow)
    gray.cluster.set_faults(slow.index, [delay(STRAGGLE_S, attempt=0)])

    _, job = gray.run_and_check()

    scan = stage(job, SCAN)
    assert scan["speculated"] >= 1 and scan["speculation_won"] >= 1, scan
    won = attempts(job, stage=SCAN, kind="speculative", state="succeeded")
    assert won and all(a["executor"] != slow_id for a in won), won
    beaten = attempts(job, stage=SCAN, executor=slow_id, attempt=0, state="cancelled")
    assert any("finished first" in a["reason"] for a in beaten), beaten
    # One output per partition: every scan task is done once, by one attempt.
    assert scan["done"] == scan["num_tasks"]
    metrics = gray.metrics()
    assert 'mangonel_speculative_attempts_total{result="won"}' in metrics
    won_total = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith('mangonel_speculative_attempts_total{result="won"}')
    )
    assert won_total >= 1


def test_the_original_wins_over_a_slower_copy_which_is_cancelled(gray: Gray) -> None:
    first, *others = gray.in_line()
    gray.cluster.set_faults(first.index, [delay(2.0, attempt=0)])
    for handle in others:
        gray.cluster.set_faults(handle.index, [delay(6.0, attempt=1)])  # every copy is slower

    _, job = gray.run_and_check()

    scan = stage(job, SCAN)
    assert scan["speculated"] >= 1 and scan["speculation_lost"] >= 1, scan
    lost = attempts(job, stage=SCAN, kind="speculative", state="cancelled")
    assert any("attempt 0 of the task finished first" in a["reason"] for a in lost), lost


IN_LINE = {"heartbeat_timeout": 10.0}
"""For the tests whose copy must go to the next executor in line: heartbeats every
0.5 s, so that one is late (and gets no copy, ``state_liveness.late_beats``) only
after 1.5 s of silence. At the module's 2 s timeout they come every 0.1 s and are
late after 0.5 s, which a busy 2-core machine can make one executor's be, and
then the copy goes to the one after it. The killed executor is lost when its
stream breaks, not by the timeout."""


@pytest.mark.parametrize("gray", [IN_LINE], indirect=True)
def test_a_copy_whose_executor_dies_is_dropped_and_the_query_goes_on(gray: Gray) -> None:
    slow, doomed, _ = gray.in_line()
    doomed_id = gray.executor_id(doomed)
    gray.cluster.set_faults(slow.index, [delay(STRAGGLE_S / 2, attempt=0)])
    # The first copy goes to the next executor in line, which dies as it starts it.
    gray.cluster.set_faults(doomed.index, [{"action": "kill", "stage": SCAN, "attempt": 1}])

    _, job = gray.run_and_check()

    gone = next(e for e in gray.api("/api/executors") if e["id"] == doomed_id)
    assert gone["state"] == ExecutorState.LOST.value, gone
    assert attempts(job, stage=SCAN, kind="speculative", executor=doomed_id), job["attempts"]
    assert stage(job, SCAN)["speculated"] >= 2  # the dead one's, and another
    assert stage(job, SCAN)["outputs_recomputed"] >= 1  # its finished scan tasks


@pytest.mark.parametrize("gray", [IN_LINE], indirect=True)
def test_a_winning_copy_lost_after_it_won_is_made_again(gray: Gray) -> None:
    slow, doomed, _ = gray.in_line()
    doomed_id = gray.executor_id(doomed)
    gray.cluster.set_faults(slow.index, [delay(STRAGGLE_S / 2, attempt=0)])
    # It dies as it starts reading: after its copy of a scan task won.
    gray.cluster.set_faults(doomed.index, [{"action": "kill", "stage": SCAN + 1}])

    _, job = gray.run_and_check()

    won = attempts(job, stage=SCAN, kind="speculative", executor=doomed_id, state="succeeded")
    assert won, f"no copy won on {doomed_id}: {job['attempts']}"
    assert any(a["output_lost"] for a in won), won
    assert stage(job, SCAN)["outputs_recomputed"] >= 1


# ----------------------------------------------------------------- bad executors


def test_an_executor_that_keeps_failing_tasks_is_excluded(gray: Gray) -> None:
    bad = gray.in_line()[0]
    bad_id = gray.executor_id(bad)
    every = [
        {"action": "fail", "stage": SCAN, "partition": p, "attempt": a}
        for p in range(9)
        for a in range(3)
    ]
    gray.cluster.set_faults(bad.index, every)

    _, job = gray.run_and_check()

    entry = next(e for e in gray.api("/api/executors") if e["id"] == bad_id)
    assert entry["excluded_until"] is not None, entry
    assert "tasks failed on it within" in entry["exclusion"], entry
    assert "injected fault" in entry["exclusion"]
    failed = attempts(job, executor=bad_id, state="failed")
    assert len({(a["stage"], a["partition"]) for a in failed}) >= 3, failed
    # Once excluded it got no new task: none of its attempts began after the third failure.
    third = sorted(a["launched_at"] for a in failed)[2]
    later = [a for a in attempts(job, executor=bad_id) if a["launched_at"] > third + 1.0]
    assert later == [], later


@pytest.mark.parametrize("gray", [{"max_task_attempts": 10}], indirect=True)
def test_a_cluster_of_bad_executors_fails_the_job_saying_so(gray: Gray) -> None:
    every = [
        {"action": "fail", "stage": SCAN, "partition": p, "attempt": a}
        for p in range(9)
        for a in range(10)
    ]
    for handle in gray.in_line():
        gray.cluster.set_faults(handle.index, every)

    with pytest.raises(JobFailedError, match="every executor is excluded for failing tasks"):
        gray.session.sql(tpch_query(QUERY))

    def all_excluded() -> bool:
        listed = gray.api("/api/executors")
        return all(e["excluded_until"] is not None for e in listed if e["state"] == "alive")

    wait_until(all_excluded, "every executor is listed as excluded", 10)
