"""A correlated subquery whose WHERE repeats its correlation inside an OR.

TPC-DS q41 counts, for each item, the items of the same manufacturer that meet one
of eight attribute combinations, writing ``i_manufact = i1.i_manufact`` inside both
branches of the OR. sqlglot decorrelates only a WHERE without OR, so q41 ran whole
in one task. The front end takes the shared correlation out of the OR and moves the
table's own OR-ed filters into a derived table of it; then the subquery becomes a
grouped aggregate joined back. Each plan runs task by task (``plan_runner``)
against single-process DuckDB.
"""

from __future__ import annotations

import duckdb
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.planner import PlannerConfig, plan_query

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, split_rows=20_000)

DECORRELATED = {
    # q41's shape: the correlation in every branch, a count compared with 0
    "count_in_where": """
        SELECT DISTINCT (p1.p_name) FROM part p1
        WHERE p1.p_size BETWEEN 10 AND 20
          AND (SELECT COUNT(*) FROM part p2
               WHERE (p2.p_mfgr = p1.p_mfgr AND p2.p_brand = 'Brand#13'
                      AND p2.p_container = 'JUMBO BOX')
                  OR (p2.p_mfgr = p1.p_mfgr AND (p2.p_type LIKE '%BRASS' OR p2.p_size = 7))) > 0
        ORDER BY p1.p_name LIMIT 40""",
    "sum_in_select": """
        SELECT o_orderkey, (SELECT SUM(l_quantity) FROM lineitem
                            WHERE (l_orderkey = o_orderkey AND l_shipmode = 'AIR')
                               OR (l_orderkey = o_orderkey AND l_returnflag = 'R')) AS q
        FROM orders WHERE o_orderkey < 2000""",
}

UNCHANGED = {
    # the correlation in one branch only: nothing to take out of the OR
    "correlation_in_one_branch": """
        SELECT COUNT(*) AS n FROM part p1
        WHERE (SELECT COUNT(*) FROM part p2
               WHERE (p2.p_mfgr = p1.p_mfgr AND p2.p_size = 7) OR p2.p_brand = 'Brand#13') > 3""",
}


@pytest.mark.parametrize("case", sorted(DECORRELATED))
def test_the_repeated_correlation_is_decorrelated(
    case: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = DECORRELATED[case]
    plan = plan_query(sql, catalog, CONFIG)
    assert plan.notes == ()  # distributed, not run whole
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    assert_same_result(run_plan(plan), expected, ordered=False)


@pytest.mark.parametrize("case", sorted(UNCHANGED))
def test_other_ors_keep_their_meaning(
    case: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = UNCHANGED[case]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert_same_result(run_plan(plan_query(sql, catalog, CONFIG)), expected, ordered=False)


def test_distinct_ordered_by_its_parenthesized_column(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = "SELECT DISTINCT (n_name) FROM nation WHERE n_regionkey = 1 ORDER BY n_name"
    plan = plan_query(sql, catalog, CONFIG)
    assert plan.notes == ()
    assert_same_result(run_plan(plan), duckdb_ref.sql(sql).to_arrow_table(), ordered=True)
