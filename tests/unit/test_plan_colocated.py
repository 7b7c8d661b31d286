"""Joins of two sides that are already hash-partitioned on the join keys."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import load_table
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import InputMode

# Two aggregates joined back on their group keys (the shape of TPC-H q21's
# decorrelated EXISTS): each aggregate ends hash-partitioned on k.
SQL = """
SELECT a.k, a.n, b.m
FROM (SELECT k, count(*) AS n FROM t GROUP BY k) AS a
LEFT JOIN (SELECT k, sum(v) AS m FROM u GROUP BY k) AS b ON a.k = b.k
"""


def test_partitioned_sides_join_task_by_task_without_broadcast(tmp_path: Path) -> None:
    for name, n in (("t", 3000), ("u", 2000)):
        table = pa.table({"k": [i % 700 for i in range(n)], "v": list(range(n))})
        pq.write_table(table, tmp_path / f"{name}.parquet", row_group_size=500)
    catalog = {t: load_table(t, str(tmp_path / f"{t}.parquet")) for t in ("t", "u")}
    # Both sides are far below the broadcast threshold: before, the right one
    # was copied whole into every task of the join stage.
    config = PlannerConfig(
        partitions=3, partition_bytes=0, broadcast_bytes=64 << 20, split_rows=1000
    )
    plan = plan_query(SQL, catalog, config)

    join = plan.final
    assert join.num_tasks == 3
    assert len(join.inputs) == 2
    assert all(i.mode is InputMode.PARTITION for i in join.inputs)
    assert not any(i.mode is InputMode.ALL for s in plan.stages for i in s.inputs)

    con = duckdb.connect()
    for t in ("t", "u"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{tmp_path / t}.parquet')")
    expected = con.sql(SQL).to_arrow_table()
    assert_same_result(run_plan(plan), expected, ordered=False)


# An aggregate on (k, j) runs in place over a join hashed on k alone; the other
# side ends hashed on (k, j). The first was taken as hashed on (k, j) too and the
# two joined task by task, rows equal on (k, j) in different tasks (found by the
# differential suite: a correlated EXISTS on two keys over a join, hash joins only).
# Both group in the order the join lists its keys, so that the keys compare equal.
SUBSET_SQL = """
SELECT a.k, a.j, a.n, b.m
FROM (SELECT t.k, t.j, count(*) AS n FROM t JOIN u ON t.k = u.k GROUP BY t.j, t.k) AS a
JOIN (SELECT k, j, sum(v) AS m FROM t GROUP BY j, k) AS b ON a.k = b.k AND a.j = b.j
"""


def test_aggregate_hashed_on_some_group_keys_is_not_hashed_on_all(tmp_path: Path) -> None:
    for name, n in (("t", 3000), ("u", 2000)):
        table = pa.table(
            {"k": [i % 700 for i in range(n)], "j": [i % 3 for i in range(n)], "v": list(range(n))}
        )
        pq.write_table(table, tmp_path / f"{name}.parquet", row_group_size=500)
    catalog = {t: load_table(t, str(tmp_path / f"{t}.parquet")) for t in ("t", "u")}
    config = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=1000)
    plan = plan_query(SUBSET_SQL, catalog, config)

    con = duckdb.connect()
    for t in ("t", "u"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{tmp_path / t}.parquet')")
    expected = con.sql(SUBSET_SQL).to_arrow_table()
    assert expected.num_rows > 1000
    assert_same_result(run_plan(plan), expected, ordered=False)
