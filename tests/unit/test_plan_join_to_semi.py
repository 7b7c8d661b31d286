"""Inner joins whose reader needs only the set of one side's rows run as semi joins.

``plan.semi_joins``: under an ``IN`` list, a DISTINCT, a GROUP BY without
aggregates or a set operation that drops duplicates, ``L ⋈ R`` read for ``L``'s
columns alone keeps the same set of rows as ``L ⋉ R`` (TPC-DS q95's ``ws_wh``).
Each case is checked against DuckDB on data with NULL and repeated join keys, and
the cases where rows are counted, or the kept side is the smaller one, keep their
inner join.
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
ONE_TASK = PlannerConfig()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    # t: 2000 rows, k repeats (50 values) and is NULL in every 13th row; keys 35
    # to 49 have one w each (no other row of their key differs). u: 1500 rows, k
    # repeats (30 values) and is NULL in every 11th, w has 7 values and NULLs.
    pq.write_table(
        pa.table(
            {
                "k": [i % 50 if i % 13 else None for i in range(2000)],
                "v": list(range(2000)),
                "w": [i % 7 if i % 50 < 35 else 1 for i in range(2000)],
            }
        ),
        tmp_path / "t.parquet",
        row_group_size=250,
    )
    pq.write_table(
        pa.table(
            {
                "id": list(range(1500)),
                "k": [i % 30 if i % 11 else None for i in range(1500)],
                "w": [i % 7 if i % 17 else None for i in range(1500)],
            }
        ),
        tmp_path / "u.parquet",
        row_group_size=300,
    )
    return tmp_path


def _catalog(data: Path) -> dict[str, Table]:
    return {n: load_table(n, str(data / f"{n}.parquet")) for n in ("t", "u")}


def _joins(plan: DistributedPlan) -> tuple[int, int]:
    """Semi joins and inner joins over all the plan's stages."""
    semi = sum(s.sql.count("SEMI JOIN") for s in plan.stages)
    text = " ".join(s.sql for s in plan.stages).replace("SEMI JOIN", "")
    inner = text.count(" JOIN ") - text.count("LEFT JOIN") - text.count("ANTI JOIN")
    return semi, inner


def _check_answer(data: Path, plan: DistributedPlan, sql: str) -> None:
    con = duckdb.connect()
    for n in ("t", "u"):
        con.execute(f"CREATE VIEW {n} AS SELECT * FROM read_parquet('{data / n}.parquet')")
    expected = con.sql(sql).to_arrow_table()
    assert expected.num_rows > 0 and expected.column(0).to_pylist() != [0]
    assert_same_result(run_plan(plan), expected, ordered=False)


SELF_JOIN = "SELECT a.k FROM t a JOIN t b ON a.k = b.k AND a.w <> b.w"
"""q95's ``ws_wh``: rows of ``t`` whose key has a row of another ``w``."""


@pytest.mark.parametrize("config", [CONFIG, ONE_TASK], ids=["tasks", "one-task"])
@pytest.mark.parametrize(
    ("sql", "semi"),
    [
        # an IN list of a self-join, q95's shape (NULL keys meet nothing)
        (f"SELECT count(*) AS n, sum(v) AS s FROM t WHERE k IN ({SELF_JOIN})", 1),
        # NOT IN asks the same of the list
        (f"SELECT count(*) AS n, sum(v) AS s FROM t WHERE k NOT IN ({SELF_JOIN})", 1),
        # q95's second list: the returns (the smaller side) stay an inner join,
        # the self-join under it becomes a semi join
        (
            "SELECT count(*) AS n FROM t WHERE k IN (SELECT u.k FROM u JOIN "
            f"({SELF_JOIN}) AS j ON u.k = j.k)",
            1,
        ),
        # DISTINCT over the kept side's columns
        ("SELECT DISTINCT t.k, t.w FROM t JOIN u ON t.k = u.k AND t.w < u.w", 1),
        # a GROUP BY without aggregates
        ("SELECT t.w, t.k FROM t JOIN u ON t.k = u.k GROUP BY t.w, t.k", 1),
        # a UNION that drops duplicates, one side a join
        ("SELECT t.k FROM t JOIN u ON t.w = u.w UNION SELECT id FROM u WHERE id < 40", 1),
        # through a projection that computes
        ("SELECT DISTINCT x FROM (SELECT t.v % 7 AS x FROM t JOIN u ON t.k = u.k)", 1),
    ],
)
def test_joins_read_as_sets_become_semi_joins(
    data: Path, sql: str, semi: int, config: PlannerConfig
) -> None:
    plan = plan_query(sql, _catalog(data), config)
    assert not plan.notes, plan.notes
    assert _joins(plan)[0] == semi, [s.sql for s in plan.stages]
    if config is CONFIG:
        assert max(s.num_tasks for s in plan.stages) > 1
    _check_answer(data, plan, sql)


@pytest.mark.parametrize(
    "sql",
    [
        # rows counted: the multiplicities reach the result
        "SELECT t.k, count(*) AS n FROM t JOIN u ON t.k = u.k GROUP BY t.k",
        "SELECT sum(t.v) AS s FROM t JOIN u ON t.k = u.k",
        # both sides' columns read
        "SELECT DISTINCT t.k, u.w FROM t JOIN u ON t.k = u.k",
        # the kept side (u, 1500 rows) is smaller than the other: an inner join may
        # broadcast it, a semi join could not
        "SELECT DISTINCT u.w FROM u JOIN t ON u.k = t.k",
        # the far side's key is unique: each kept row meets one row at most already
        "SELECT DISTINCT t.k FROM t JOIN u ON t.v = u.id",
        # the kept side has more rows, but the far side scans more bytes (q54's
        # customers kept from a join of the sales tables): the join runs there
        "SELECT DISTINCT t.k FROM t JOIN (SELECT a.k, a.w FROM u AS a JOIN u AS b "
        "ON a.id = b.id WHERE a.w = 1 AND b.w IS NOT NULL) AS x ON t.k = x.k AND t.w < x.w",
        # a LIMIT below the DISTINCT picks rows, not values
        "SELECT DISTINCT k FROM (SELECT t.k FROM t JOIN u ON t.k = u.k ORDER BY t.v LIMIT 500)",
        # a function that may differ call by call
        "SELECT DISTINCT x FROM (SELECT t.k + floor(random() * 0) AS x FROM t JOIN u ON t.k = u.k)",
        # a join read twice (a CTE computed once): one reader counts its rows
        "WITH j AS (SELECT t.k, t.v FROM t JOIN u ON t.k = u.k WHERE u.w < 3) "
        "SELECT DISTINCT k AS x FROM j UNION ALL SELECT count(*) FROM j",
        # the same subquery read as an IN list and as a scalar
        f"SELECT count(*) AS n FROM t WHERE k IN ({SELF_JOIN} ORDER BY 1 LIMIT 1) "
        f"AND k = ({SELF_JOIN} ORDER BY 1 LIMIT 1)",
    ],
)
def test_joins_whose_rows_count_stay_inner(data: Path, sql: str) -> None:
    plan = plan_query(sql, _catalog(data), CONFIG)
    assert not plan.notes, plan.notes
    semi, inner = _joins(plan)
    assert semi == 0 and inner >= 1, [s.sql for s in plan.stages]
    _check_answer(data, plan, sql)
