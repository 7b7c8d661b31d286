"""``x IN (subquery)``: the subquery's stage drops duplicate values in each task.

Every task of the reading stage holds the subquery's whole output; an IN list
means the same with one copy of each value, so the subquery stage ships a set
(TPC-DS q95 shipped 8.7M order numbers of which 72k were distinct). A scalar
subquery keeps its rows as they are, and so does a list already known distinct.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table, load_table
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlannerConfig, plan_query

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=500)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    # t.k repeats (50 values over 2000 rows); u.id is a key, u.k repeats and has NULLs.
    pq.write_table(
        pa.table({"k": [i % 50 for i in range(2000)], "v": list(range(2000))}),
        tmp_path / "t.parquet",
        row_group_size=250,
    )
    pq.write_table(
        pa.table(
            {
                "id": list(range(1500)),
                "k": [i % 30 if i % 11 else None for i in range(1500)],
                "w": [i % 7 for i in range(1500)],
            }
        ),
        tmp_path / "u.parquet",
        row_group_size=300,
    )
    return tmp_path


def _catalog(data: Path) -> dict[str, Table]:
    return {n: load_table(n, str(data / f"{n}.parquet")) for n in ("t", "u")}


def _subquery_sql(plan: DistributedPlan) -> list[str]:
    return [s.sql for s in plan.stages if s.label == "subquery"]


def _check_answer(data: Path, plan: DistributedPlan, sql: str) -> None:
    con = duckdb.connect()
    for n in ("t", "u"):
        con.execute(f"CREATE VIEW {n} AS SELECT * FROM read_parquet('{data / n}.parquet')")
    assert_same_result(run_plan(plan), con.sql(sql).to_arrow_table(), ordered=False)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT k, count(*) AS n FROM t WHERE k IN (SELECT k FROM u WHERE w < 5) GROUP BY k",
        # NOT IN over a list with a NULL: one NULL left is as good as many
        "SELECT count(*) AS n FROM t WHERE k NOT IN (SELECT k FROM u WHERE w > 2)",
        "SELECT count(*) AS n FROM t WHERE k NOT IN (SELECT k FROM u WHERE k IS NOT NULL)",
    ],
)
def test_in_list_subquery_drops_duplicates_in_each_task(data: Path, sql: str) -> None:
    plan = plan_query(sql, _catalog(data), CONFIG)
    (sub,) = _subquery_sql(plan)
    subquery_stage = next(s for s in plan.stages if s.label == "subquery")
    assert subquery_stage.num_tasks > 1, "the subquery should run in several tasks"
    assert "SELECT DISTINCT" in sub, sub
    assert not plan.notes
    _check_answer(data, plan, sql)


@pytest.mark.parametrize(
    "sql",
    [
        # a key column: distinct already
        "SELECT count(*) AS n FROM t WHERE v IN (SELECT id FROM u WHERE w < 5)",
        # a GROUP BY of the one output: distinct already
        "SELECT count(*) AS n FROM t WHERE k IN (SELECT k FROM u GROUP BY k HAVING sum(w) > 40)",
        # a scalar subquery, alone and beside an IN list
        "SELECT count(*) AS n FROM t WHERE v > (SELECT max(w) FROM u WHERE k > 3)",
        "SELECT count(*) AS n FROM t WHERE v > (SELECT max(w) FROM u) AND k IN (SELECT k FROM u)",
        # a scalar subquery as the left side of an IN list is lifted too
        "SELECT count(*) AS n FROM t WHERE (SELECT min(k) FROM u) IN (SELECT w FROM u)",
    ],
)
def test_subqueries_known_distinct_or_scalar_keep_their_rows(data: Path, sql: str) -> None:
    plan = plan_query(sql, _catalog(data), CONFIG)
    subs = _subquery_sql(plan)
    assert subs
    in_list = "IN (SELECT k FROM u)" in sql or "IN (SELECT w FROM u)" in sql
    # Only the IN lists of the last two are deduplicated, not the scalars beside them.
    assert sum("SELECT DISTINCT" in s for s in subs) == (1 if in_list else 0), subs
    _check_answer(data, plan, sql)
