"""A CTE read twice takes the OR of its readers' filters (``sql.shared_ctes``).

TPC-DS q39's shape: an aggregating CTE computed once for two readers that keep
one month each; the OR of the months reaches the scan below the aggregate. The
forms where it may not go are left as they were, and every answer is DuckDB's.
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
from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.plan.planner import PlannerConfig, plan_query

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=500)

MONTHS = """
WITH inv AS (
  SELECT item, month, avg(qty) AS mean, count(*) AS n
  FROM sales JOIN dates ON sales.day = dates.day
  WHERE year = 2001
  GROUP BY item, month
)
SELECT a.item, a.mean, b.mean AS mean2, a.n, b.n AS n2
FROM inv a JOIN inv b ON a.item = b.item AND b.month = 2
WHERE a.month = 1
"""


@pytest.fixture
def data(tmp_path: Path) -> Path:
    pq.write_table(
        pa.table(
            {
                "day": list(range(730)),
                "year": [2000 + d // 365 for d in range(730)],
                "month": [1 + (d % 365) // 31 for d in range(730)],
            }
        ),
        tmp_path / "dates.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "day": [(i * 7) % 730 for i in range(3000)],
                "item": [i % 13 for i in range(3000)],
                "qty": [(i * 31) % 101 if i % 17 else None for i in range(3000)],
            }
        ),
        tmp_path / "sales.parquet",
        row_group_size=500,
    )
    return tmp_path


def _catalog(data: Path) -> dict[str, Table]:
    return {n: load_table(n, str(data / f"{n}.parquet")) for n in ("dates", "sales")}


def _check_answer(data: Path, plan: DistributedPlan, sql: str) -> None:
    con = duckdb.connect()
    for n in ("dates", "sales"):
        con.execute(f"CREATE VIEW {n} AS SELECT * FROM read_parquet('{data / n}.parquet')")
    expected = con.sql(sql).to_arrow_table()
    assert expected.num_rows > 0, "an empty answer would prove little here"
    assert_same_result(run_plan(plan), expected, ordered=False)


def _tables(stage: Stage) -> set[str]:
    scans = [stage.scan] if stage.scan is not None else []
    return {s.table for s in [*scans, *stage.side_scans]}


def _scan_sql(plan: DistributedPlan, table: str) -> str:
    """The SQL of the stages that read ``table``, as a scan or a side scan."""
    return "\n".join(s.sql for s in plan.stages if table in _tables(s))


def test_the_readers_months_reach_the_scan_below_the_shared_aggregate(data: Path) -> None:
    plan = plan_query(MONTHS, _catalog(data), CONFIG)
    assert len(plan.stages) > 2 and not plan.notes
    # the aggregate is computed once (one stage reads its input), and only over
    # the two months read
    readers = [s for s in plan.stages if "dates" in _tables(s)]
    assert len(readers) == 1, [s.label for s in plan.stages]
    dates = _scan_sql(plan, "dates")
    assert '"month" = 1' in dates and '"month" = 2' in dates, dates
    _check_answer(data, plan, MONTHS)


@pytest.mark.parametrize(
    "sql",
    [
        # one reader keeps every row: nothing to push
        MONTHS.replace("WHERE a.month = 1", ""),
        # a reader on the nullable side of an outer join: its filter may not go first
        MONTHS.replace("JOIN inv b ON", "LEFT JOIN inv b ON"),
        # the filtered column is an aggregate's output, not a group key
        MONTHS.replace("b.month = 2", "b.n > 3").replace("WHERE a.month = 1", "WHERE a.n > 4"),
        # rolled-up rows mix months
        MONTHS.replace("GROUP BY item, month", "GROUP BY ROLLUP (item, month)"),
    ],
)
def test_filters_stay_with_their_readers_where_they_may_not_go_down(data: Path, sql: str) -> None:
    plan = plan_query(sql, _catalog(data), CONFIG)
    dates = _scan_sql(plan, "dates")
    assert '"month" = 1' not in dates and '"month" = 2' not in dates, dates
    _check_answer(data, plan, sql)
