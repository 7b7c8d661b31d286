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


# TPC-DS q04's shape: a CTE of one aggregate per channel, each naming its channel
# with a constant, read by self-joins that each keep one month of one channel and
# a positive total.
CHANNELS = """
WITH totals AS (
  SELECT item, month, sum(qty) AS total, 'a' AS channel
  FROM sales JOIN dates ON sales.day = dates.day
  GROUP BY item, month
  UNION ALL
  SELECT item, month, sum(qty) AS total, 'b' AS channel
  FROM sales JOIN dates ON sales.day = dates.day
  WHERE item % 2 = 0
  GROUP BY item, month
)
SELECT a1.item, a1.total, a2.total AS total2, b1.total AS total3
FROM totals a1 JOIN totals a2 ON a1.item = a2.item JOIN totals b1 ON a1.item = b1.item
WHERE a1.channel = 'a' AND a1.month = 1 AND a1.total > 0
  AND a2.channel = 'a' AND a2.month = 2
  AND b1.channel = 'b' AND b1.month = 1
"""


def test_the_readers_months_reach_every_branch_of_a_shared_union(data: Path) -> None:
    plan = plan_query(CHANNELS, _catalog(data), CONFIG)
    assert len(plan.stages) > 2 and not plan.notes
    dates = _scan_sql(plan, "dates")
    # the channel (a constant of each branch) and the total (an aggregate) stay
    # with the readers; the months go down into both branches
    assert dates.count('"month" = 1') == 2 and dates.count('"month" = 2') == 2, dates
    _check_answer(data, plan, CHANNELS)


def test_a_filter_the_branch_keeps_already_is_not_added_again(data: Path) -> None:
    # as TPC-DS q74's CTE keeps its two years itself: the readers' months add
    # nothing, and the estimates would count them twice
    sql = CHANNELS.replace("GROUP BY item, month", "AND month IN (1, 2) GROUP BY item, month")
    plan = plan_query(sql, _catalog(data), CONFIG)
    dates = _scan_sql(plan, "dates")
    assert '"month" IN (1, 2)' in dates and '"month" = 1' not in dates, dates
    _check_answer(data, plan, sql)


@pytest.mark.parametrize(
    "sql",
    [
        # a union that keeps its first rows: a filter first would keep others
        CHANNELS.replace(
            "WHERE item % 2 = 0\n  GROUP BY item, month",
            "WHERE item % 2 = 0\n  GROUP BY item, month ORDER BY item, month, channel LIMIT 40",
        ),
        # a reader that keeps every row of the union
        CHANNELS.replace("AND b1.channel = 'b' AND b1.month = 1", ""),
    ],
    ids=["union-limit", "unfiltered-reader"],
)
def test_the_months_stay_above_a_union_where_they_may_not_go(data: Path, sql: str) -> None:
    plan = plan_query(sql, _catalog(data), CONFIG)
    dates = _scan_sql(plan, "dates")
    assert dates.count('"month" = 2') < 2, dates
    _check_answer(data, plan, sql)


def test_the_months_stay_above_a_union_whose_branches_take_them_from_unlike_columns(
    data: Path,
) -> None:
    # The union's column has the type its branches' types meet in, and a condition
    # may mean another thing in a branch's own type (a VARCHAR union of an INTEGER
    # branch: k = '01' holds for the integer 1); the same column name in every
    # branch is the mark of one type.
    sql = CHANNELS.replace(
        "SELECT item, month, sum(qty) AS total, 'b' AS channel",
        "SELECT item, dates.day AS month, sum(qty) AS total, 'b' AS channel",
    ).replace(
        "WHERE item % 2 = 0\n  GROUP BY item, month",
        "WHERE item % 2 = 0\n  GROUP BY item, dates.day",
    )
    # days of a month: the even items sold on them are few
    sql = sql.replace("b1.month = 1", "b1.month IN (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)")
    plan = plan_query(sql, _catalog(data), CONFIG)
    text = "\n".join(s.sql for s in plan.stages)
    assert '"month" = 1' not in text and '"day" = 1' not in text, text
    _check_answer(data, plan, sql)
