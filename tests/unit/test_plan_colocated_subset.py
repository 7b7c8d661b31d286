"""A side hashed on some of a join's keys joins where it is.

Rows equal on all of a join's keys are equal on any of them: a side already
hash-partitioned on some of the keys (an aggregate's groups, a window's
partition) holds them in one task, and the other side need only be hashed on
the same keys (``joins._staying``). TPC-DS q47 joins a window's rows with
themselves on its partition keys and a rank, twice; before, the planner copied
the whole window output into a stage of its own and broadcast it into each
join. An inner join's rows are hashed on the other side's keys too
(``Frag.hash_equal``): q47's second join names v1's columns, not v1_lag's.
Each plan runs task by task (``plan_runner``) against single-process DuckDB.
"""

from __future__ import annotations

import duckdb
from helpers import assert_same_result
from plan_runner import run_plan
from sqlglot import exp

from mangonel.catalog import Table
from mangonel.plan.distribute.joins import _hashed_within
from mangonel.plan.distribute.stages import Frag
from mangonel.plan.logical import Values
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.sql.exprs import col
from mangonel.task import InputMode, OutputKind

CONFIG = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=20_000)

LAG_AND_LEAD = """
    WITH v1 AS (
        SELECT o_custkey, o_orderpriority, YEAR(o_orderdate) AS yr,
               SUM(o_totalprice) AS total,
               RANK() OVER (PARTITION BY o_custkey, o_orderpriority
                            ORDER BY YEAR(o_orderdate)) AS rn
        FROM orders
        GROUP BY o_custkey, o_orderpriority, YEAR(o_orderdate))
    SELECT v1.o_custkey, v1.o_orderpriority, v1.yr, v1.total,
           lag.total AS before, lead.total AS after
    FROM v1
    JOIN v1 AS lag ON v1.o_custkey = lag.o_custkey
        AND v1.o_orderpriority = lag.o_orderpriority AND v1.rn = lag.rn + 1
    JOIN v1 AS lead ON v1.o_custkey = lead.o_custkey
        AND v1.o_orderpriority = lead.o_orderpriority AND v1.rn = lead.rn - 1"""


def _moved_whole(plan: DistributedPlan) -> list[int]:
    """Stages, the final one aside, that read some input whole (a broadcast)."""
    final = plan.stages[-1].id
    return [
        s.id
        for s in plan.stages
        if s.id != final and any(i.mode is InputMode.ALL for i in s.inputs)
    ]


def test_a_window_joined_with_itself_on_its_partition_and_rank_stays_where_it_is(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    plan = plan_query(LAG_AND_LEAD, catalog, CONFIG)
    assert not _moved_whole(plan), [(s.id, s.label) for s in plan.stages]
    # Both joins in one stage, task by task over the window's own partitions:
    # its rows are not hashed again on the rank (three stages more before).
    (window,) = [s for s in plan.stages if "window" in s.label]
    (joins,) = [s for s in plan.stages if "inner join → inner join" in s.label]
    assert [(i.stage, i.mode) for i in joins.inputs] == [(window.id, InputMode.PARTITION)]
    expected = duckdb_ref.sql(LAG_AND_LEAD).to_arrow_table()
    assert expected.num_rows > 1000
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_the_other_side_is_hashed_on_the_keys_the_aggregate_is(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The orders' aggregate is hashed on its group key alone; the join adds a key.
    sql = """
        SELECT c_custkey, c_name, t.n, t.total
        FROM (SELECT o_custkey, COUNT(*) AS n, SUM(o_totalprice) AS total
              FROM orders GROUP BY o_custkey) AS t
        JOIN customer ON c_custkey = t.o_custkey AND c_nationkey = t.n % 25"""
    plan = plan_query(sql, catalog, CONFIG)
    assert not _moved_whole(plan)
    hashed = [s.output.keys for s in plan.stages if s.output.kind is OutputKind.HASH]
    # The orders' partial counts, then customer: each on the customer key alone.
    assert len(hashed) == 2 and all(len(k) == 1 for k in hashed), hashed
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 100
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_full_join_on_more_keys_than_a_side_is_hashed_on_answers_like_duckdb(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q51's shape (there by item): running totals by customer and date on
    # each side, then a FULL join on both; each side is hashed on the customer alone.
    sql = """
        WITH o AS (
            SELECT o_custkey AS k, o_orderdate AS d,
                   SUM(SUM(o_totalprice)) OVER (PARTITION BY o_custkey ORDER BY o_orderdate
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cume
            FROM orders WHERE o_orderpriority = '1-URGENT' GROUP BY o_custkey, o_orderdate),
        p AS (
            SELECT o_custkey AS k, o_orderdate AS d,
                   SUM(SUM(o_totalprice)) OVER (PARTITION BY o_custkey ORDER BY o_orderdate
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cume
            FROM orders WHERE o_orderpriority = '2-HIGH' GROUP BY o_custkey, o_orderdate)
        SELECT COALESCE(o.k, p.k) AS k, COALESCE(o.d, p.d) AS d, o.cume, p.cume
        FROM o FULL JOIN p ON o.k = p.k AND o.d = p.d"""
    plan = plan_query(sql, catalog, CONFIG)
    assert not _moved_whole(plan)
    # Each side's window and the join in one stage (before: each window's rows
    # hashed again on the key and the date, two stages more).
    assert [s.label for s in plan.stages if "full join" in s.label] == [
        "window → window → full join → result"
    ], [s.label for s in plan.stages]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 1000
    assert_same_result(run_plan(plan), expected, ordered=False)


def _frag(tasks: int, keys: list[str]) -> Frag:
    return Frag(
        Values("v", ["a", "b"], exp.select("1")),
        tasks,
        1000.0,
        hash_keys=[col(("v", k)) for k in keys],
    )


def test_which_keys_a_side_is_hashed_within() -> None:
    a, b, c = col(("v", "a")), col(("v", "b")), col(("w", "c"))
    # Hashed on a, joined on (b, a): it stays, the join runs on a.
    assert _hashed_within(_frag(3, ["a"]), [b, a]) == (1,)
    assert _hashed_within(_frag(3, ["b", "a"]), [a, b]) == (1, 0)
    assert _hashed_within(_frag(3, ["a"]), [b]) is None
    # One task is hashed on any keys, but counts only on all of the join's: on
    # some, the other side would be hashed into that one task.
    assert _hashed_within(_frag(1, ["a"]), [b, a]) is None
    assert _hashed_within(_frag(1, ["a", "b"]), [a, b]) == (0, 1)
    # An inner join's other keys count while the fragment keeps that key list.
    f = _frag(3, ["a"])
    assert f.hash_keys is not None
    f.hash_equal = (f.hash_keys, (c,))
    assert _hashed_within(f, [b, c]) == (1,)
    f.hash_keys = [k.copy() for k in f.hash_keys]  # hashed anew, or rewritten
    assert _hashed_within(f, [b, c]) is None
