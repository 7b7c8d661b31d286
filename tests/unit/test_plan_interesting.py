"""Interesting partitioning: an aggregate (and a UNION ALL of aggregates) hashed
on the group keys all of its readers join on, so that the joins read it where
it is (TPC-DS q04/q11/q74's ``year_total``)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import assert_same_result
from plan_runner import run_plan
from sqlglot import exp

from mangonel.catalog import load_table
from mangonel.plan.distribute.interesting import aggregate_keys
from mangonel.plan.logical import Aggregate, Scan
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.sql.exprs import col
from mangonel.task import InputMode, OutputKind

# q04's shape: each channel grouped by the customer and more, UNION ALL, read
# three times, every reader joining on the customer.
SHARED_SQL = """
WITH tot AS (
  SELECT cust, region, yr, 's' AS kind, sum(v) AS total FROM s GROUP BY cust, region, yr
  UNION ALL
  SELECT cust, region, yr, 'w' AS kind, sum(v) AS total FROM w GROUP BY cust, region, yr
)
SELECT a.cust, a.region, a.total, b.total AS t2, c.total AS t3
FROM tot a JOIN tot b ON a.cust = b.cust JOIN tot c ON a.cust = c.cust
WHERE a.kind = 's' AND a.yr = 1 AND b.kind = 's' AND b.yr = 2 AND c.kind = 'w' AND c.yr = 2
"""

# One reader joins on another group key: the readers do not agree, and the
# union is hashed on all of its columns as before, each join hashing again.
DISAGREE_SQL = """
WITH tot AS (
  SELECT cust, region, yr, 's' AS kind, sum(v) AS total FROM s GROUP BY cust, region, yr
  UNION ALL
  SELECT cust, region, yr, 'w' AS kind, sum(v) AS total FROM w GROUP BY cust, region, yr
)
SELECT a.cust, a.region, a.total, b.total AS t2, c.total AS t3
FROM tot a JOIN tot b ON a.cust = b.cust JOIN tot c ON a.region = c.region
WHERE a.kind = 's' AND a.yr = 1 AND b.kind = 's' AND b.yr = 2 AND c.kind = 'w' AND c.yr = 2
  AND c.cust < 20
"""


# The readers join on the year alone (3 values): hashed on it, each aggregate
# would run in 3 tasks at most, so it keeps all its keys; the union, which the
# readers hash on the year anyway, is hashed on it.
FEW_VALUES_SQL = """
WITH tot AS (
  SELECT cust, region, yr, 's' AS kind, sum(v) AS total FROM s GROUP BY cust, region, yr
  UNION ALL
  SELECT cust, region, yr, 'w' AS kind, sum(v) AS total FROM w GROUP BY cust, region, yr
)
SELECT a.cust, a.region, a.total, b.total AS t2
FROM tot a JOIN tot b ON a.yr = b.yr
WHERE a.kind = 's' AND a.cust < 5 AND b.kind = 'w' AND b.cust < 3
"""


def _plan(tmp_path: Path, sql: str) -> tuple[DistributedPlan, pa.Table]:
    for name, n in (("s", 4000), ("w", 3000)):
        table = pa.table(
            {
                "cust": [i % 500 for i in range(n)],
                "region": [(i % 500) % 7 for i in range(n)],
                "yr": [i % 3 for i in range(n)],
                "v": list(range(n)),
            }
        )
        pq.write_table(table, tmp_path / f"{name}.parquet", row_group_size=1000)
    catalog = {t: load_table(t, str(tmp_path / f"{t}.parquet")) for t in ("s", "w")}
    # Every side hashed, never broadcast: the shape of q04 at SF1.
    config = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=1000)
    plan = plan_query(sql, catalog, config)
    con = duckdb.connect()
    for t in ("s", "w"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{tmp_path / t}.parquet')")
    return plan, con.sql(sql).to_arrow_table()


def test_shared_union_of_aggregates_is_hashed_on_the_join_key(tmp_path: Path) -> None:
    plan, expected = _plan(tmp_path, SHARED_SQL)
    hashed = [s for s in plan.stages if s.output.kind is OutputKind.HASH]
    # The partial aggregates hash on the customer alone, and the union that
    # their final aggregates make is written hashed on it too.
    assert [len(s.output.keys) for s in hashed] == [1, 1, 1]
    union = hashed[-1]
    assert "setop" in union.label
    # All three readers join in one stage, partition by partition: nothing
    # reads the union whole, nothing hashes it again.
    join = plan.final
    assert join.num_tasks == 3
    assert [(i.stage, i.mode) for i in join.inputs] == [(union.id, InputMode.PARTITION)]
    assert join.sql.count(f'"s{union.id}"') == 3
    assert len(plan.stages) == 4
    assert expected.num_rows > 100
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_readers_joining_on_other_keys_keep_the_full_hash(tmp_path: Path) -> None:
    plan, expected = _plan(tmp_path, DISAGREE_SQL)
    partials = [s for s in plan.stages if s.scan is not None]
    assert all(len(s.output.keys) == 3 for s in partials)
    assert expected.num_rows > 100
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_keys_of_few_values_do_not_narrow_the_aggregate(tmp_path: Path) -> None:
    plan, expected = _plan(tmp_path, FEW_VALUES_SQL)
    partials = [s for s in plan.stages if s.scan is not None]
    assert [len(s.output.keys) for s in partials] == [3, 3]
    union = next(s for s in plan.stages if "setop" in s.label)
    assert len(union.output.keys) == 1
    assert expected.num_rows > 10
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_grouping_sets_and_local_aggregates_keep_their_keys() -> None:
    scan = Scan("t", "t", ["k", "j"])
    groups = [("g0", col(("t", "k"))), ("g1", col(("t", "j")))]
    plain = Aggregate(scan, "_agg", groups, [])
    assert aggregate_keys(plain, (("_agg", "g1"),)) == ["g1"]
    assert aggregate_keys(plain, (("t", "k"),)) is None
    rollup = Aggregate(scan, "_agg", groups, [], grouping=exp.Rollup())
    assert aggregate_keys(rollup, (("_agg", "g0"),)) is None
    local = Aggregate(scan, "_agg", groups, [], local=True)
    assert aggregate_keys(local, (("_agg", "g0"),)) is None
