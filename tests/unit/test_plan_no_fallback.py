"""Queries the front end used to send to the one-task fallback (``Opaque``).

TPC-DS found them: a CTE read only by ``IN (SELECT ...)`` subqueries (q95's
``ws_wh``, q14's ``cross_items``) was dropped by sqlglot's rules, which do not see
into the subqueries the front end hides from them, and the restored subquery
named a table nothing defined; and a set operation's parenthesized operand
(q87's ``(SELECT ...) EXCEPT (SELECT ...)``) was hidden as if it were a subquery
in an expression. Both ran whole in one task over gathered tables (q87 at SF1:
5.3 s, 0.36 s distributed). Each plan must be distributed (no note, several
stages) and answer like DuckDB, task by task (``plan_runner``). Each reads a table
of several splits: tables of one split each, joined or unioned by one task, are
planned as that one task.

The differential suite found a third: a named window (``OVER w ... WINDOW w AS
(...)``) was refused by the binder, so the query ran whole in one task; the front
end now writes each reference out in full (``optimize.inline_named_windows``).
"""

from __future__ import annotations

import duckdb
import pytest
import sqlglot
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.sql.optimize import inline_named_windows

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=20_000)

QUERIES = {
    "cte_read_only_by_in_subqueries": """
        WITH big AS (
            SELECT o1.o_orderkey, o1.o_custkey
            FROM orders o1, customer
            WHERE o1.o_custkey = c_custkey AND c_acctbal > 9000)
        SELECT COUNT(DISTINCT l_orderkey) AS orders, SUM(l_quantity) AS qty
        FROM lineitem
        WHERE l_shipmode = 'AIR'
          AND l_orderkey IN (SELECT o_orderkey FROM big)
          AND l_orderkey IN (SELECT orders.o_orderkey FROM orders, big
                             WHERE orders.o_orderkey = big.o_orderkey AND o_orderstatus = 'F')""",
    "parenthesized_set_operands": """
        SELECT COUNT(*) AS n FROM (
            (SELECT DISTINCT o_custkey % 25, o_orderpriority FROM orders)
            EXCEPT
            (SELECT DISTINCT s_nationkey, '1-URGENT' FROM supplier WHERE s_acctbal > 0)
            EXCEPT
            (SELECT DISTINCT n_nationkey, '2-HIGH' FROM nation WHERE n_regionkey = 1)
        ) AS t""",
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_plans_distributed_and_answers_like_duckdb(
    name: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = QUERIES[name]
    plan = plan_query(sql, catalog, CONFIG)
    assert not plan.notes, plan.notes
    assert not any("whole query" in s.label for s in plan.stages)
    assert len(plan.stages) > 3
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.column(0)[0].as_py() > 0
    assert_same_result(run_plan(plan), expected, ordered=False)


NAMED_WINDOWS = """
    SELECT o_custkey, o_orderkey,
           FIRST_VALUE(o_orderkey) OVER w AS first_order,
           SUM(o_totalprice) OVER (w ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS last3,
           COUNT(*) OVER p AS orders,
           RANK() OVER (p ORDER BY o_totalprice DESC) AS by_price
    FROM orders
    WHERE o_custkey < 3000
    WINDOW p AS (PARTITION BY o_custkey), w AS (p ORDER BY o_orderdate, o_orderkey)"""


def test_named_windows_plan_distributed(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    plan = plan_query(NAMED_WINDOWS, catalog, CONFIG)
    assert not plan.notes, plan.notes
    assert not any("whole query" in s.label for s in plan.stages)
    assert len(plan.stages) > 1 and plan.stages[0].num_tasks > 1
    expected = duckdb_ref.sql(NAMED_WINDOWS).to_arrow_table()
    assert expected.num_rows > 1000
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_named_window_references_are_written_out_per_select() -> None:
    # A reference keeps its own clauses and takes the rest from the window it
    # names, through a chain of names; a nested SELECT's names are its own.
    query = sqlglot.parse_one(
        "SELECT SUM(x) OVER v, MAX(x) OVER (w PARTITION BY h), "
        "(SELECT MIN(y) OVER w FROM u WINDOW w AS (ORDER BY y)) AS m "
        "FROM t WINDOW w AS (ORDER BY g), v AS (w ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)",
        read="duckdb",
    )
    assert inline_named_windows(query).sql("duckdb") == (
        "SELECT SUM(x) OVER (ORDER BY g ROWS BETWEEN 1 PRECEDING AND CURRENT ROW), "
        "MAX(x) OVER (PARTITION BY h ORDER BY g), "
        "(SELECT MIN(y) OVER (ORDER BY y) FROM u) AS m FROM t"
    )
