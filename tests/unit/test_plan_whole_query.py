"""A plan that falls back runs the query whole in one task, which scans its tables
itself and has DuckDB order its joins (``Distributor._opaque``, ``Stage.whole_query``)."""

from __future__ import annotations

import duckdb
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.planner import PlannerConfig, plan_query

ASOF = """
SELECT o.o_orderkey, l.l_linenumber, n_name
FROM orders o
     ASOF JOIN lineitem l ON o.o_orderkey = l.l_orderkey AND o.o_totalprice >= l.l_extendedprice,
     customer, nation
WHERE o.o_custkey = c_custkey AND c_nationkey = n_nationkey AND o.o_orderkey < 2000
ORDER BY 1, 2, 3"""
"""An ASOF join (which the planner does not split: it falls back) joined with two more
tables, written as a comma list: DuckDB must order those joins itself."""


def test_a_fallen_back_query_is_one_task_that_scans_every_table_whole(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Splits of 2,000 rows: lineitem, orders and customer are several splits each,
    # which the planner would scan in several tasks.
    config = PlannerConfig(split_rows=2000, slots=4, parallel=4)
    assert len(catalog["lineitem"].splits(2000)) > 1
    plan = plan_query(ASOF, catalog, config)
    assert plan.fallback is not None
    (stage,) = plan.stages
    assert stage.num_tasks == 1 and stage.whole_query and not stage.inputs
    assert "whole query" in stage.label, stage.label
    scanned = {side.table: side for side in stage.side_scans}
    assert sorted(scanned) == ["customer", "lineitem", "nation", "orders"]
    for name, side in scanned.items():
        (group,) = side.task_splits  # one group, read whole by the one task
        rows = sum(s.rows for s in group)
        assert rows == catalog[name].rows, (name, rows)
    expected = duckdb_ref.sql(ASOF).to_arrow_table()
    assert expected.num_rows > 0
    assert_same_result(run_plan(plan), expected, ordered=True)


def test_a_planned_query_has_no_whole_query_stage(catalog: dict[str, Table]) -> None:
    plan = plan_query(
        "SELECT n_name, count(*) FROM customer, nation WHERE c_nationkey = n_nationkey GROUP BY 1",
        catalog,
        PlannerConfig(split_rows=2000, slots=4, parallel=4),
    )
    assert plan.fallback is None
    assert not any(s.whole_query for s in plan.stages)
