"""A set operation that drops duplicates drops each task's own before the exchange.

TPC-DS q14's ``cross_items`` intersects the (brand, class, category) of what each
channel sold: 2.5M joined rows were hashed whole into the set operation's tasks
(58 MB) to make 3.8k distinct rows. Each side's tasks now keep only their
distinct rows, as a partial aggregate would; INTERSECT ALL and UNION ALL keep
every row. Each plan runs task by task (``plan_runner``) against
single-process DuckDB.
"""

from __future__ import annotations

import duckdb
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.plan.planner import PlannerConfig, plan_query

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, split_rows=20_000)


def _scan_stage(plan: DistributedPlan, table: str) -> Stage:
    return next(s for s in plan.stages if s.scan and s.scan.table == table)


@pytest.mark.parametrize("op", ["INTERSECT", "EXCEPT", "UNION"])
def test_each_task_drops_its_duplicates_first(
    op: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = f"""
        SELECT l_suppkey % 50 AS s, l_linestatus AS st FROM lineitem
        {op}
        SELECT ps_suppkey % 40, 'F' FROM partsupp WHERE ps_availqty > 5000"""
    plan = plan_query(sql, catalog, CONFIG)
    for table in ("lineitem", "partsupp"):
        stage = _scan_stage(plan, table)
        assert stage.num_tasks > 1 and "distinct" in stage.label, stage.label
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 5
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_all_keeps_every_row(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """
        SELECT l_suppkey % 50 AS s FROM lineitem
        INTERSECT ALL
        SELECT ps_suppkey % 40 FROM partsupp"""
    plan = plan_query(sql, catalog, CONFIG)
    assert "distinct" not in _scan_stage(plan, "lineitem").label
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 1000
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_side_already_distinct_is_not_hashed_again(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q87's branches are SELECT DISTINCT: their rows are distinct already.
    sql = """
        SELECT DISTINCT l_suppkey % 50 AS s, l_linestatus AS st FROM lineitem
        EXCEPT
        SELECT ps_suppkey % 40, 'F' FROM partsupp WHERE ps_availqty > 5000"""
    plan = plan_query(sql, catalog, CONFIG)
    labels = [s.label for s in plan.stages]
    assert not any("distinct → distinct" in label for label in labels), labels
    assert any(s.scan and s.scan.table == "partsupp" and "distinct" in s.label for s in plan.stages)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 5
    assert_same_result(run_plan(plan), expected, ordered=False)
