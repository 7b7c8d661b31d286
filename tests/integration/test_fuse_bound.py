"""One-task stages past the fusion bound run side by side on several executors.

TPC-DS q09's shape, on TPC-H SF 0.1: a one-task reader of four scalar subqueries,
each a scan of ``lineitem`` (one split here). Without a bound they are all computed
in the reader's one task, on one executor (what a cluster of many hosts cannot
spread); with ``--fuse-bytes`` below their sum, those that do not fit are stages of
their own, which the scheduler launches at once on the free slots of different
executors. A ``TestCluster`` of four executors of one slot each, each as a host of
its own (``--host-id``: on one host of two cores, one task at a time runs at full
speed, and the planner fuses without a bound, ``PlannerConfig.parallel``); the spread is
read from the scheduler's record of attempts (``/api/jobs/ID``: executors and
launch times), not from wall time, as the host has only two cores.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import assert_same_result, explain_stage_count, most_at_once

from mangonel.catalog import Table
from mangonel.client.session import Session
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.testing.cluster import TestCluster

pytestmark = pytest.mark.timeout(240)

EXECUTORS = 4
SPLIT_ROWS = 10_000_000
"""Every table one split: each subquery is one task."""
FUSE_BYTES = 20 * 1024 * 1024
"""Each subquery's scan of two lineitem columns is about 18 MiB: the reader's task
holds one of them, and the other three are stages of their own."""

SCALARS = """
    SELECT
      (SELECT AVG(l_extendedprice) FROM lineitem AS l1 WHERE l_quantity BETWEEN 1 AND 10) AS a,
      (SELECT AVG(l_discount) FROM lineitem AS l2 WHERE l_quantity BETWEEN 11 AND 20) AS b,
      (SELECT AVG(l_tax) FROM lineitem AS l3 WHERE l_quantity BETWEEN 21 AND 30) AS c,
      (SELECT COUNT(*) FROM lineitem AS l4 WHERE l_quantity > 30) AS d
    FROM region WHERE r_regionkey = 0"""
"""Each scan under a name of its own: subqueries of one FROM, word for word, would be
one pass (``sql.merged_aggregates``), and these are here for four scans."""


class Bounded:
    """A started cluster with the TPC-H tables, and its web API."""

    def __init__(self, cluster: TestCluster, session: Session) -> None:
        self.cluster = cluster
        self.session = session

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.cluster.web_url + path, timeout=10) as answer:
            return json.load(answer)


@pytest.fixture
def bounded(work_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[Bounded]:
    cluster = TestCluster(
        executors=EXECUTORS,
        slots=1,
        work_dir=work_dir / "cluster",
        scheduler_args=("--split-rows", str(SPLIT_ROWS), "--fuse-bytes", str(FUSE_BYTES)),
        executor_args_for=lambda i: ("--host-id", f"host-{i}"),
        web_port=0,
    )
    cluster.start()
    try:
        with cluster.connect() as session:
            for name, path in tpch_tables.items():
                session.register_parquet(name, str(path))
            yield Bounded(cluster, session)
    finally:
        cluster.stop()


def test_subqueries_past_the_bound_run_at_once_on_several_executors(
    bounded: Bounded, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Without the bound, the whole query is the reader's one task.
    unbounded = plan_query(SCALARS, catalog, PlannerConfig(split_rows=SPLIT_ROWS, fuse_bytes=0))
    assert len(unbounded.stages) == 1

    text = bounded.session.explain(SCALARS)
    assert explain_stage_count(text) == 4, text
    assert text.count("is not fused into the one task that reads it") == 3, text

    job_id = bounded.session.submit(SCALARS)
    result = bounded.session.wait(job_id, timeout_s=120)
    expected = duckdb_ref.sql(SCALARS).to_arrow_table()
    assert expected.num_rows == 1
    assert_same_result(result.to_arrow(), expected, ordered=False)

    doc = bounded.api(f"/api/jobs/{job_id}")
    assert doc["attempts_not_kept"] == 0
    final = max(a["stage"] for a in doc["attempts"])
    apart = [a for a in doc["attempts"] if a["stage"] != final]
    assert len(apart) == 3 and all(a["state"] == "succeeded" for a in apart), apart
    # The three read nothing: launched together, each on a free slot of its own
    # executor (one slot each), running at the same time.
    assert len({a["executor"] for a in apart}) == 3, apart
    assert most_at_once(apart) == 3, apart
