"""Two queries at once on real processes: the short one is not stuck behind the long one.

TPC-DS SF 0.1 on a ``TestCluster`` of two executors with two slots each (four
slots). The long job is q72 with exchanges of ``PARTITIONS`` partitions: its
first hash-partitioned stage (the join with catalog_returns, ``PARTITIONS``
tasks) is made long deterministically by a ``delay`` fault rule on every
executor, so that stage alone keeps every slot busy for several waves of
``DELAY_S``. The short job, q96 (four stages, each of at most three tasks), is
submitted once q72 holds all four slots, and a rule names a stage by its number
only, so the delay is put on a stage number q96 does not have.

Under fair shares (``SchedulerState._assign``) each slot that frees goes to the
job holding fewer, so q96 runs as q72's slots free one by one, and finishes
before q72 has even launched all of the delayed stage's tasks. Under the old
submission-order assignment, q96 got no slot while q72 had a pending task: its
first attempt could not launch before q72's last attempt of that stage. The
ordering is read from the scheduler's own record of attempts (``/api/jobs/ID``,
launch times on the scheduler's clock), not from wall-clock thresholds.

With ``--max-job-share 0.5`` (the second test), q72 never holds more than two of
the four slots, alone or not, and q96 starts before any delayed task of q72 ends.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import (
    TPCDS_TABLES,
    assert_same_result,
    duckdb_views_sql,
    ensure_tpcds,
    explain_stage_count,
    most_at_once,
    order_by_outputs,
    tpcds_query,
)

from mangonel.client.session import Session
from mangonel.client.status import JobState
from mangonel.testing.cluster import TestCluster

pytestmark = pytest.mark.timeout(240)

LONG, SHORT = 72, 96
EXECUTORS, SLOTS = 2, 2
PARTITIONS = 24
"""Tasks of each hash-partitioned stage: six waves over the four slots."""
DELAY_S = 2.0
"""How long each task of q72's delayed stage sleeps at its start, holding its slot."""
SPLIT_ROWS = 50_000
INLINE_SCAN_BYTES = 256 << 10
"""As in ``test_tpcds.py``: fact tables are read by several tasks."""

_STAGE_LINE = re.compile(r"^Stage (\d+)\b.*— (\d+) task\(s\)$", re.MULTILINE)


class Pair:
    """A started cluster with the TPC-DS tables, its web API and the DuckDB reference."""

    def __init__(self, cluster: TestCluster, session: Session, data: Path) -> None:
        self.cluster = cluster
        self.session = session
        self.reference = duckdb.connect()
        tables = {t: data / f"{t}.parquet" for t in TPCDS_TABLES}
        for statement in duckdb_views_sql(dict(tables)):
            self.reference.execute(statement)

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.cluster.web_url + path, timeout=10) as answer:
            return json.load(answer)

    def check(self, number: int, actual: Any) -> None:
        sql = tpcds_query(number)
        expected = self.reference.sql(sql).to_arrow_table()
        assert expected.num_rows > 0, f"q{number}: an empty reference proves little"
        order_by = order_by_outputs(sql, expected.column_names)
        assert_same_result(
            actual,
            expected,
            ordered=bool(order_by),
            order_by=order_by or (),
        )


@pytest.fixture
def pair(work_dir: Path, request: pytest.FixtureRequest) -> Iterator[Pair]:
    data = ensure_tpcds(0.1)
    extra: tuple[str, ...] = getattr(request, "param", ())
    cluster = TestCluster(
        executors=EXECUTORS,
        slots=SLOTS,
        work_dir=work_dir / "cluster",
        partitions=PARTITIONS,
        scheduler_args=(
            ("--split-rows", str(SPLIT_ROWS))
            + ("--inline-scan-bytes", str(INLINE_SCAN_BYTES))
            + extra
        ),
        web_port=0,
    )
    cluster.start()
    try:
        with cluster.connect() as session:
            for table in TPCDS_TABLES:
                session.register_parquet(table, str(data / f"{table}.parquet"))
            yield Pair(cluster, session, data)
    finally:
        cluster.stop()


def wide_stage(explain: str) -> int:
    """The number of the plan's first stage of ``PARTITIONS`` tasks."""
    for number, tasks in _STAGE_LINE.findall(explain):
        if int(tasks) == PARTITIONS:
            return int(number)
    raise AssertionError(f"no stage of {PARTITIONS} tasks in the plan:\n{explain}")


def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def test_a_short_query_runs_while_a_long_one_holds_every_slot(pair: Pair) -> None:
    session = pair.session
    long_sql, short_sql = tpcds_query(LONG), tpcds_query(SHORT)
    delayed = wide_stage(session.explain(long_sql))
    short_stages = explain_stage_count(session.explain(short_sql))
    assert short_stages > 1, "the short query must run distributed too"
    assert short_stages < delayed, "the delay would slow the short query's stages as well"
    pair.cluster.set_faults_all([{"action": "delay", "seconds": DELAY_S, "stage": delayed}])

    long_id = session.submit(long_sql)

    def long_holds_every_slot() -> bool:
        job = session.status().job(long_id)
        assert job is not None and job.state is not JobState.FAILED, job
        stage = next(s for s in job.stages if s.stage == delayed)
        return stage.tasks_running == EXECUTORS * SLOTS and stage.tasks_pending > 0

    wait_for(long_holds_every_slot, f"q{LONG}'s stage {delayed} to hold every slot")
    short_id = session.submit(short_sql)
    short = session.wait(short_id, timeout_s=120)
    long = session.wait(long_id, timeout_s=180)
    pair.check(SHORT, short.to_arrow())
    pair.check(LONG, long.to_arrow())

    long_doc, short_doc = pair.api(f"/api/jobs/{long_id}"), pair.api(f"/api/jobs/{short_id}")
    assert long_doc["attempts_not_kept"] == 0 and short_doc["attempts_not_kept"] == 0
    wide = [a for a in long_doc["attempts"] if a["stage"] == delayed]
    assert len(wide) == PARTITIONS, "every task of the delayed stage ran once"
    last_wide_launch = max(a["launched_at"] for a in wide)
    short_attempts = short_doc["attempts"]
    assert {a["stage"] for a in short_attempts} == set(range(1, short_stages + 1))
    assert all(a["state"] == "succeeded" for a in short_attempts)
    # Every attempt of the short query, its final stage's included, was launched and
    # ended while the long one still had tasks of its delayed stage waiting for a
    # slot: under submission order, none could even start before that.
    short_end = max(a["launched_at"] + a["elapsed_s"] for a in short_attempts)
    assert short_end < last_wide_launch, (
        f"q{SHORT} ended {short_end - last_wide_launch:.2f} s after q{LONG} launched the "
        f"last task of its stage {delayed}: it waited behind the long job"
    )
    finished = {
        j.job_id: j.submitted_at + j.elapsed_s
        for j in session.status().jobs
        if j.job_id in (long_id, short_id)
    }
    assert finished[short_id] < finished[long_id]


@pytest.mark.parametrize("pair", [("--max-job-share", "0.5")], indirect=True)
def test_with_a_cap_a_job_alone_keeps_half_the_slots_free_for_the_next(pair: Pair) -> None:
    session = pair.session
    long_sql, short_sql = tpcds_query(LONG), tpcds_query(SHORT)
    delayed = wide_stage(session.explain(long_sql))
    assert explain_stage_count(session.explain(short_sql)) < delayed
    pair.cluster.set_faults_all([{"action": "delay", "seconds": DELAY_S, "stage": delayed}])
    cap = EXECUTORS * SLOTS // 2

    long_id = session.submit(long_sql)

    def long_at_its_cap() -> bool:
        job = session.status().job(long_id)
        assert job is not None and job.state is not JobState.FAILED, job
        stage = next(s for s in job.stages if s.stage == delayed)
        return stage.tasks_running == cap and stage.tasks_pending > 0

    wait_for(long_at_its_cap, f"q{LONG}'s stage {delayed} to run {cap} tasks")
    short_id = session.submit(short_sql)
    short = session.wait(short_id, timeout_s=120)
    long = session.wait(long_id, timeout_s=180)
    pair.check(SHORT, short.to_arrow())
    pair.check(LONG, long.to_arrow())

    long_doc, short_doc = pair.api(f"/api/jobs/{long_id}"), pair.api(f"/api/jobs/{short_id}")
    wide = [a for a in long_doc["attempts"] if a["stage"] == delayed]
    assert len(wide) == PARTITIONS
    # Never more than half the slots, though q72 was alone before q96 came and after
    # it left; without the cap it takes all four (the test above).
    assert most_at_once(long_doc["attempts"]) == cap
    assert most_at_once(wide) == cap
    # q96 found free slots at once: it started before any delayed task of q72 ended.
    first_short = min(a["launched_at"] for a in short_doc["attempts"])
    first_wide_end = min(a["launched_at"] + a["elapsed_s"] for a in wide)
    assert first_short < first_wide_end
