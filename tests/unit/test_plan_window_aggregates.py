"""Windows over aggregates, and join conditions in parentheses, planned right.

TPC-DS found these: a window whose function, PARTITION BY or ORDER BY holds
an aggregate (``SUM(SUM(x)) OVER``, ``rank() OVER (PARTITION BY grouping(a)
ORDER BY sum(x))``, q36/q51/q70/q86) left the aggregate out of the GROUP BY
stage and failed in DuckDB; an ORDER BY expression naming a select alias
(``CASE WHEN ... THEN alias END``) was not resolved; and ``JOIN t ON (a = b)``
hid its key in parentheses, so the join orderer planned cross products (q72).
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

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=20_000)

QUERIES = {
    "sum_of_sums": """
        SELECT o_orderpriority, o_orderstatus,
               SUM(SUM(o_totalprice)) OVER (PARTITION BY o_orderstatus
                   ORDER BY o_orderpriority
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cume
        FROM orders GROUP BY o_orderpriority, o_orderstatus""",
    "rank_by_aggregate_over_rollup": """
        SELECT n_name, r_name,
               RANK() OVER (PARTITION BY GROUPING(n_name) + GROUPING(r_name),
                                CASE WHEN GROUPING(n_name) = 0 THEN r_name END
                            ORDER BY SUM(s_acctbal) DESC) AS rank_within_parent
        FROM supplier JOIN nation ON (s_nationkey = n_nationkey)
             JOIN region ON (n_regionkey = r_regionkey)
        GROUP BY ROLLUP (r_name, n_name)""",
    "order_by_alias_in_expression": """
        SELECT n_name, COUNT(*) AS suppliers, GROUPING(n_name) AS g
        FROM supplier JOIN nation ON (s_nationkey = n_nationkey)
        GROUP BY ROLLUP (n_name)
        ORDER BY CASE WHEN GROUPING(n_name) = 0 THEN n_name END NULLS FIRST, suppliers""",
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_window_over_aggregates_answers_like_duckdb(
    name: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = QUERIES[name]
    plan = plan_query(sql, catalog, CONFIG)
    assert not plan.notes, plan.notes
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_join_key_in_parentheses_is_a_key(catalog: dict[str, Table]) -> None:
    sql = """
        SELECT COUNT(*) FROM lineitem
        JOIN orders ON (l_orderkey = o_orderkey)
        JOIN customer ON (o_custkey = c_custkey)
        JOIN nation ON (c_nationkey = n_nationkey)"""
    plan = plan_query(sql, catalog, CONFIG)
    assert all("CROSS JOIN" not in s.sql.upper() for s in plan.stages)
    # Every join is a hash join of exchanged sides: keys were found.
    assert sum(s.output.kind is OutputKind.HASH for s in plan.stages) >= 4
