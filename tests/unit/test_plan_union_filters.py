"""A join that only filters a UNION ALL runs in each of its branches.

``plan.union_filters``: ``(A ∪ B) ⋈ D`` with no column of ``D`` read above is
``π_A(A ⋈ D) ∪ π_B(B ⋈ D)`` (TPC-DS q05's sales and returns, unioned, then joined
with 15 days of ``date_dim``). Each case is checked against DuckDB on data with
NULL and repeated keys in the branches, and keys that repeat in ``D`` (one of them
where the footers' range says it cannot); a join that reads ``D``'s columns stays
over the union.
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

CONFIG = PlannerConfig(partitions=3, split_rows=500)
UNION = "(SELECT k AS key, v FROM a UNION ALL SELECT k, v FROM b) AS u"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    # a, b: 2000 and 1500 rows, k repeats (60 and 45 values) and is NULL in every
    # 13th and 11th row. d: k unique (0..39), x its tenth; e: k repeated twice;
    # f: k spans 0..80 over 40 rows (the footers' distinct estimate: unique) and
    # yet 6 and 8 appear twice.
    pq.write_table(
        pa.table(
            {
                "k": [i % 60 if i % 13 else None for i in range(2000)],
                "v": list(range(2000)),
            }
        ),
        tmp_path / "a.parquet",
        row_group_size=250,
    )
    pq.write_table(
        pa.table(
            {
                "k": [i % 45 if i % 11 else None for i in range(1500)],
                "v": [i * 3 for i in range(1500)],
            }
        ),
        tmp_path / "b.parquet",
        row_group_size=300,
    )
    pq.write_table(
        pa.table({"k": list(range(40)), "x": [i // 10 for i in range(40)]}), tmp_path / "d.parquet"
    )
    pq.write_table(
        pa.table({"k": [i % 20 for i in range(40)], "x": list(range(40))}), tmp_path / "e.parquet"
    )
    f_keys = [6, 8, *range(0, 74, 2), 80]
    assert len(f_keys) == 40 and len(set(f_keys)) == 38
    pq.write_table(pa.table({"k": f_keys, "x": list(range(40))}), tmp_path / "f.parquet")
    return tmp_path


def _catalog(data: Path) -> dict[str, Table]:
    return {n: load_table(n, str(data / f"{n}.parquet")) for n in ("a", "b", "d", "e", "f")}


def _joined_in_branches(plan: DistributedPlan, other: str) -> int:
    """How many of the branches' scan stages (of ``a`` and ``b``) scan ``other``
    and join it themselves."""
    return sum(
        1
        for s in plan.stages
        if s.scan is not None
        and s.scan.table in ("a", "b")
        and other in [x.table for x in s.side_scans]
        and " JOIN " in s.sql
    )


def _check(data: Path, sql: str) -> DistributedPlan:
    """``sql``'s plan, its answer checked against DuckDB's on the same files."""
    plan = plan_query(sql, _catalog(data), CONFIG)
    con = duckdb.connect()
    for name in ("a", "b", "d", "e", "f"):
        con.sql(f"CREATE VIEW {name} AS SELECT * FROM '{data / f'{name}.parquet'}'")
    expected = con.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    assert_same_result(run_plan(plan), expected, ordered=False)
    return plan


def test_a_filtering_join_runs_in_each_branch(data: Path) -> None:
    sql = (
        f"SELECT u.key, sum(u.v) AS s, count(*) AS n FROM {UNION}, d "
        "WHERE u.key = d.k AND d.x = 2 GROUP BY u.key"
    )
    plan = _check(data, sql)
    # Each branch's scan tasks filter their rows where they are.
    assert _joined_in_branches(plan, "d") == 2, [s.sql for s in plan.stages]


def test_nested_unions_take_it_into_every_branch(data: Path) -> None:
    three = (
        "(SELECT k AS key, v FROM a UNION ALL SELECT k, v FROM b UNION ALL SELECT k, v FROM a) AS u"
    )
    sql = f"SELECT sum(u.v) AS s, count(*) AS n FROM {three}, d WHERE u.key = d.k AND d.x < 2"
    plan = _check(data, sql)
    joined = [s for s in plan.stages if s.scan is not None and s.scan.table in ("a", "b")]
    assert sum(s.sql.count(" JOIN ") for s in joined) == 3, [s.sql for s in plan.stages]


def test_a_join_that_reads_the_other_sides_columns_stays_over_the_union(data: Path) -> None:
    sql = f"SELECT d.x, sum(u.v) AS s FROM {UNION}, d WHERE u.key = d.k GROUP BY d.x"
    assert _joined_in_branches(_check(data, sql), "d") == 0


@pytest.mark.parametrize("other", ["e", "f"])
def test_a_key_repeated_on_the_other_side_repeats_the_rows_in_the_branches_too(
    data: Path, other: str
) -> None:
    """Each union row meets two rows of ``e`` (and some of ``f``, whose footers
    say its key is unique): counted twice, as over the union."""
    sql = (
        f"SELECT sum(u.v) AS s, count(*) AS n FROM {UNION}, {other} "
        f"WHERE u.key = {other}.k AND {other}.x < 30"
    )
    assert _joined_in_branches(_check(data, sql), other) == 2
