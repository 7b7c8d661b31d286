"""Tables for the tests of plan-time pruning (``plan.dynamic_pruning``), shared by the
unit, integration and object-storage suites.

``sales`` is written in date order, as TPC-DS writes ``inventory`` and
``catalog_sales``: 20 row groups of 1 000 rows, each holding 50 consecutive date
keys (0 to 999), except that row group 7 holds some NULL keys among its dates and
row group 19 only NULL keys (no footer range: it may hold any key, so it is never
dropped). ``dates`` has a row per key from 0 to 1 199 (more than the sales span, as
``date_dim`` does), a date and a year, and one row with a NULL key in 2001.
``items`` is a small unfiltered dimension.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUPS = 20
ROWS_PER_GROUP = 1_000
FIRST_DAY = dt.date(2000, 1, 1)

INNER = """
    SELECT d_year, i_class, count(*) AS n, sum(s_qty) AS q
    FROM sales JOIN dates ON s_date_sk = d_date_sk JOIN items ON s_item = i_item
    WHERE d_date BETWEEN DATE '2000-03-01' AND DATE '2000-04-15'
    GROUP BY d_year, i_class"""
"""46 days: date keys 60 to 105, in row groups 1 and 2 of ``sales``."""


def write_tables(directory: Path) -> dict[str, Path]:
    """Write the three tables as Parquet under ``directory``; name -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    keys: list[int | None] = []
    for group in range(ROW_GROUPS):
        for row in range(ROWS_PER_GROUP):
            key: int | None = group * 50 + row // 20
            if (group == 7 and row % 10 == 0) or group == ROW_GROUPS - 1:
                key = None
            keys.append(key)
    n = len(keys)
    sales = pa.table(
        {
            "s_date_sk": pa.array(keys, pa.int32()),
            "s_item": pa.array([i % 7 for i in range(n)], pa.int32()),
            "s_qty": pa.array([(i * 13) % 100 for i in range(n)], pa.int32()),
        }
    )
    days = 1_200
    dates = pa.table(
        {
            "d_date_sk": pa.array([*range(days), None], pa.int32()),
            "d_date": pa.array(
                [FIRST_DAY + dt.timedelta(days=d) for d in range(days)] + [dt.date(2001, 6, 1)],
                pa.date32(),
            ),
            "d_year": pa.array(
                [(FIRST_DAY + dt.timedelta(days=d)).year for d in range(days)] + [2001],
                pa.int32(),
            ),
        }
    )
    items = pa.table(
        {
            "i_item": pa.array(range(7), pa.int32()),
            "i_class": pa.array([f"class{i % 3}" for i in range(7)]),
        }
    )
    paths = {name: directory / f"{name}.parquet" for name in ("sales", "dates", "items")}
    pq.write_table(sales, paths["sales"], row_group_size=ROWS_PER_GROUP)
    pq.write_table(dates, paths["dates"])
    pq.write_table(items, paths["items"])
    return paths
