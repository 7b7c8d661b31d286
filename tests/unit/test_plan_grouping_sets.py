"""Grouping sets aggregate partially in the scan tasks, by all their group columns.

TPC-DS q22 (a ROLLUP of four ``item`` columns over 2.3M inventory rows) gathered
its joined rows whole into the one task of the ROLLUP: 153 MB. Each scan task now
aggregates its rows by the finest grouping first, and only those rows move: to
one task when the sets share no column, else hashed on the columns they share.
Each plan runs task by task (``plan_runner``) against single-process DuckDB.
"""

from __future__ import annotations

import duckdb
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import OutputKind

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, split_rows=20_000)

QUERIES = {
    # No column in every set: partial rows gathered into one task.
    "rollup": """
        SELECT l_returnflag, l_linestatus, l_shipmode,
               AVG(l_quantity) AS q, COUNT(*) AS n, MIN(l_shipdate) AS first,
               GROUPING(l_returnflag) + 2 * GROUPING(l_shipmode) AS g
        FROM lineitem
        GROUP BY ROLLUP (l_returnflag, l_linestatus, l_shipmode)""",
    # l_returnflag in every set: partial rows hashed on it.
    "grouping_sets_with_a_common_column": """
        SELECT l_returnflag, l_linestatus, YEAR(l_shipdate) AS y, SUM(l_extendedprice) AS s
        FROM lineitem
        GROUP BY GROUPING SETS ((l_returnflag, l_linestatus), (l_returnflag, YEAR(l_shipdate)))""",
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_grouping_sets_move_partial_rows(
    name: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = QUERIES[name]
    plan = plan_query(sql, catalog, CONFIG)
    assert not plan.notes, plan.notes
    scan = next(s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem")
    assert scan.num_tasks > 1
    # The scan tasks aggregate: their output is partial aggregate rows, not lineitem's.
    assert scan.label.endswith("partial aggregate"), scan.label
    if name == "rollup":
        assert scan.output.kind is OutputKind.SINGLE
    else:
        assert scan.output.kind is OutputKind.HASH and len(scan.output.keys) == 1
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 5
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_distinct_aggregate_still_moves_rows(catalog: dict[str, Table]) -> None:
    # COUNT(DISTINCT) does not split into partial and final: rows move as they are.
    sql = """
        SELECT l_returnflag, l_linestatus, COUNT(DISTINCT l_suppkey) AS n
        FROM lineitem GROUP BY ROLLUP (l_returnflag, l_linestatus)"""
    plan = plan_query(sql, catalog, CONFIG)
    scan = next(s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem")
    assert "aggregate" not in scan.label, scan.label
