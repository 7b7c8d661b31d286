"""A small filtering source reduces the sources equal to it through a chain of
equalities (``plan.join_order._reduce_by``), and two sources equal through a chain
join on the equality it implies where that cuts one (``_implied``).

TPC-H q5: ``c_nationkey = s_nationkey`` and ``s_nationkey = n_nationkey`` make
``customer`` meet only the nations of the filtered region; a copy of nation ⋈ region
semi-joins ``customer`` before its join with the orders is built, where every
``lineitem`` task hashed all of it. Each answer is compared with DuckDB's.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result, tpch_query
from plan_runner import run_plan

from mangonel.catalog import Table, load_table
from mangonel.plan import join_order
from mangonel.plan.explain import render
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlannerConfig, plan_query

CUSTOMER_REDUCED = "scan customer → scan nation → scan region (filtered) → inner join → semi join"
PARTSUPP_CUT = "scan partsupp → scan part (filtered) → inner join"


def _semi_joins(plan: DistributedPlan) -> int:
    return sum(s.sql.count("SEMI JOIN") for s in plan.stages)


def _tpch_plan(
    number: int, catalog: dict[str, Table], parallel: int
) -> tuple[str, DistributedPlan, str]:
    """TPC-H query ``number``, its plan over SF 0.1 in several tasks, and its text."""
    sql = tpch_query(number)
    plan = plan_query(sql, catalog, PlannerConfig(slots=2, parallel=parallel, split_rows=150_000))
    text = render(plan, with_sql=False)
    assert sum(s.num_tasks for s in plan.stages) > len(plan.stages), text  # several tasks
    return sql, plan, text


@pytest.mark.parametrize("parallel", [1, 2])
def test_q5_reduces_customer_by_the_nations_of_the_region(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection, parallel: int
) -> None:
    sql, plan, text = _tpch_plan(5, catalog, parallel)
    assert CUSTOMER_REDUCED in text, text
    assert _semi_joins(plan) == 1
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows == 5  # the five nations of ASIA
    assert_same_result(run_plan(plan), expected, ordered=True)


@pytest.mark.parametrize("parallel", [1, 2])
def test_q9_joins_partsupp_with_the_green_parts_on_the_key_the_chain_implies(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection, parallel: int
) -> None:
    # q9 writes ps_partkey = l_partkey and p_partkey = l_partkey: the parts cut
    # partsupp to a twentieth before it meets lineitem, instead of all of partsupp
    # being hashed against the line items that met a part.
    sql, plan, text = _tpch_plan(9, catalog, parallel)
    assert PARTSUPP_CUT in text, text
    assert 'hash("partsupp.' not in text, text
    # One key of the chain where lineitem meets them: the join of the parts with
    # partsupp made p_partkey and ps_partkey equal already.
    fragments = "\n".join(s.sql for s in plan.stages)
    assert fragments.count('"lineitem.l_partkey" =') == 1, fragments
    assert_same_result(run_plan(plan), duckdb_ref.sql(sql).to_arrow_table(), ordered=True)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    # f: 6000 facts, g: 3000 rows, both with a key d into dm (40 rows, 4 tags);
    # d repeats and is NULL in every 17th row of f and every 13th of g.
    pq.write_table(
        pa.table(
            {
                "k": [i % 1000 for i in range(6000)],
                "d": [i % 40 if i % 17 else None for i in range(6000)],
                "v": list(range(6000)),
            }
        ),
        tmp_path / "f.parquet",
        row_group_size=1000,
    )
    pq.write_table(
        pa.table(
            {
                "k": [i % 1000 for i in range(3000)],
                "d": [(i + 13 * (i // 1000)) % 40 if i % 13 else None for i in range(3000)],
                "w": [i % 5 for i in range(3000)],
            }
        ),
        tmp_path / "g.parquet",
        row_group_size=500,
    )
    pq.write_table(
        pa.table({"d": list(range(40)), "tag": [f"t{i % 4}" for i in range(40)]}),
        tmp_path / "dm.parquet",
    )
    return tmp_path


def _check(data: Path, sql: str, plan: DistributedPlan, groups: int = 5) -> None:
    con = duckdb.connect()
    for n in ("f", "g", "dm"):
        con.execute(f"CREATE VIEW {n} AS SELECT * FROM read_parquet('{data / n}.parquet')")
    expected = con.sql(sql).to_arrow_table()
    assert expected.num_rows == groups  # e.g. a group per value of g.w, each of many rows
    assert_same_result(run_plan(plan), expected, ordered=False)


def _plan(data: Path, sql: str) -> DistributedPlan:
    catalog = {n: load_table(n, str(data / f"{n}.parquet")) for n in ("f", "g", "dm")}
    return plan_query(sql, catalog, PlannerConfig(split_rows=2000, broadcast_bytes=10**8))


def test_a_source_equal_to_a_filtered_one_through_another_is_reduced(data: Path) -> None:
    # g.d meets dm.d only through f.d: g is semi-joined with a copy of dm's filter.
    sql = (
        "SELECT g.w, dm.tag, COUNT(*) AS n, SUM(f.v) AS s FROM f, g, dm "
        "WHERE f.k = g.k AND f.d = g.d AND f.d = dm.d AND dm.tag = 't1' GROUP BY g.w, dm.tag"
    )
    plan = _plan(data, sql)
    text = render(plan, with_sql=False)
    assert _semi_joins(plan) == 1, text
    assert "scan g → scan dm (filtered) → semi join" in text
    # Cut by the copy, g is not joined with dm on the key the chain implies as well
    # (``_implied``): that join would cut nothing more.
    assert "semi join → scan dm" not in text, text
    _check(data, sql, plan)


def test_a_source_joined_to_the_filter_directly_is_not_reduced_again(data: Path) -> None:
    # Each of f and g names dm.d itself: both join dm, no copy is added.
    sql = (
        "SELECT g.w, COUNT(*) AS n FROM f, g, dm "
        "WHERE f.k = g.k AND f.d = dm.d AND g.d = dm.d AND dm.tag = 't1' GROUP BY g.w"
    )
    plan = _plan(data, sql)
    assert _semi_joins(plan) == 0, render(plan, with_sql=False)
    _check(data, sql, plan)


def test_a_filter_that_keeps_most_values_reduces_nothing(data: Path) -> None:
    # Three of the four tags keep three quarters of the keys: above ``REDUCES``.
    sql = (
        "SELECT g.w, COUNT(*) AS n FROM f, g, dm "
        "WHERE f.k = g.k AND f.d = g.d AND f.d = dm.d AND dm.tag <> 't1' GROUP BY g.w"
    )
    plan = _plan(data, sql)
    assert _semi_joins(plan) == 0, render(plan, with_sql=False)
    _check(data, sql, plan)


def test_a_copy_that_scans_more_than_a_tenth_of_what_it_removes_is_not_added(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # g filtered to one of 5 values of w and 3 of 10 keys (about 180 rows by the
    # estimates): a copy of dm (40 rows) would remove about 135 of them, and
    # scans more than a tenth of that.
    sql = (
        "SELECT dm.tag, COUNT(*) AS n FROM f, g, dm WHERE f.k = g.k AND f.d = g.d "
        "AND f.d = dm.d AND dm.tag = 't1' AND g.w = 0 AND g.k < 300 GROUP BY dm.tag"
    )
    plan = _plan(data, sql)
    assert _semi_joins(plan) == 0, render(plan, with_sql=False)
    _check(data, sql, plan, groups=1)
    # The same query where copies may cost anything: the semi join is there.
    monkeypatch.setattr(join_order, "COPY_SHARE", 1.0)
    plan = _plan(data, sql)
    assert _semi_joins(plan) == 1
    _check(data, sql, plan, groups=1)
