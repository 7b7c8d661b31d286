"""No stage boundary between two one-task stages.

A fragment that would be a stage of one task (one split, or reading other stages
whole) and whose only reader runs as one task is planned inside that reader: TPC-H
q13's customer and orders scans were a stage each, hashed into the one partition
of the join's one task, and q22's subquery, semi join and anti join four stages
in a row. A producer of several tasks and a reader of several tasks keep their
exchange. A producer read by several stages, or broadcast into a reader's several
tasks, keeps its stage unless each reader (each task) may compute it again
(``StageBuilder.recomputable``: it reads little, ``PlannerConfig.recompute_bytes``).
Each plan runs task by task (``plan_runner``) against single-process DuckDB.
"""

from __future__ import annotations

import duckdb
import pytest
from helpers import assert_same_result, tpch_query
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan import tiny
from mangonel.plan.distribute import distributor
from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import InputMode

# Every TPC-H table at SF 0.1 one split; exchanges sized from the estimates (one
# partition for these small ones), as the default planner does.
ONE_SPLIT = PlannerConfig(split_rows=10_000_000)
# lineitem in six tasks, orders in two (one per row group).
SEVERAL = PlannerConfig(split_rows=20_000)


def _tables(stage: Stage) -> set[str]:
    return {s.table for s in ([stage.scan] if stage.scan else []) + list(stage.side_scans)}


def _check(plan: DistributedPlan, sql: str, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_two_one_task_scans_joined_by_one_task_are_one_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(13)
    plan = plan_query(sql, catalog, ONE_SPLIT)
    assert len(plan.stages) == 1, [s.label for s in plan.stages]
    assert _tables(plan.final) == {"customer", "orders"}
    assert plan.final.num_tasks == 1 and not plan.final.inputs
    _check(plan, sql, duckdb_ref)


def test_a_scan_of_several_tasks_keeps_its_exchange(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # orders in two tasks: its rows move to the join's task; customer, one task
    # hashed into that one partition, is scanned by the join's task itself.
    sql = tpch_query(13)
    plan = plan_query(sql, catalog, SEVERAL)
    orders = next(s for s in plan.stages if s.scan is not None and s.scan.table == "orders")
    assert orders.num_tasks == 2
    (reader,) = [s for s in plan.stages if orders.id in s.upstream]
    assert reader is plan.final and len(plan.stages) == 2
    assert _tables(reader) == {"customer"}
    _check(plan, sql, duckdb_ref)


# The filtered, aggregated part side is one task (part at SF 0.1: 20k rows, 0.5 MiB
# of the columns read); lineitem's six tasks each read it whole (small tables are
# not scanned by each task here: ``inline_scan_bytes=0``).
BROADCAST_SIDE = """
    SELECT p_brand, SUM(l_extendedprice) AS revenue
    FROM lineitem JOIN (SELECT p_partkey, MIN(p_brand) AS p_brand FROM part
                        WHERE p_size < 5 GROUP BY p_partkey) p ON l_partkey = p_partkey
    GROUP BY p_brand"""


def test_a_one_task_side_broadcast_into_several_tasks_keeps_its_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Its five copies beyond the first would scan 2.5 MiB, over the bound.
    config = PlannerConfig(split_rows=20_000, inline_scan_bytes=0, recompute_bytes=MIB)
    plan = plan_query(BROADCAST_SIDE, catalog, config)
    lineitem = next(s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem")
    assert lineitem.num_tasks == 6
    broadcast = [i for i in lineitem.inputs if i.mode is InputMode.ALL]
    assert len(broadcast) == 1
    (part,) = [s for s in plan.stages if s.id == broadcast[0].stage]
    assert part.num_tasks == 1 and _tables(part) == {"part"}
    _check(plan, BROADCAST_SIDE, duckdb_ref)


def test_a_cheap_one_task_side_is_computed_by_each_task_of_a_scan(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Within the bound (default: 32 MiB), each lineitem task, which reads no other
    # stage, scans part and aggregates it itself: no stage before lineitem's.
    config = PlannerConfig(split_rows=20_000, inline_scan_bytes=0)
    plan = plan_query(BROADCAST_SIDE, catalog, config)
    lineitem = next(s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem")
    assert lineitem.num_tasks == 6
    assert not lineitem.inputs and _tables(lineitem) == {"lineitem", "part"}
    assert not any(s.scan is not None and s.scan.table == "part" for s in plan.stages)
    assert "MIN(" in lineitem.sql and "p_size" in lineitem.sql
    _check(plan, BROADCAST_SIDE, duckdb_ref)


def test_a_one_task_side_of_a_scan_that_reads_another_stage_keeps_its_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The lineitem tasks wait for the subquery's stage anyway: part's stage runs
    # meanwhile, and is not computed again by each of them.
    sql = """
        SELECT p_brand, SUM(l_extendedprice) AS revenue
        FROM lineitem JOIN (SELECT p_partkey, MIN(p_brand) AS p_brand FROM part
                            WHERE p_size < 5 GROUP BY p_partkey) p ON l_partkey = p_partkey
        WHERE l_suppkey IN (SELECT s_suppkey FROM supplier WHERE s_acctbal > 0)
        GROUP BY p_brand"""
    config = PlannerConfig(split_rows=20_000, inline_scan_bytes=0)
    plan = plan_query(sql, catalog, config)
    lineitem = next(s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem")
    assert lineitem.num_tasks == 6
    assert _tables(lineitem) == {"lineitem"}
    sources = [s for s in plan.stages if s.id in {i.stage for i in lineitem.inputs}]
    assert sorted(table for s in sources for table in _tables(s)) == ["part", "supplier"]
    _check(plan, sql, duckdb_ref)


# ``small`` (one task) is read by both sides of the union, whose orders scans are
# two tasks each.
SHARED_SMALL = """
    WITH small AS (SELECT n_nationkey AS k, MIN(n_name) AS name FROM nation
                   WHERE n_regionkey < 3 GROUP BY n_nationkey)
    SELECT 'high' AS side, COUNT(*) AS n FROM orders JOIN small ON o_custkey % 25 = k
    WHERE o_totalprice > 200000
    UNION ALL
    SELECT 'low', COUNT(*) FROM orders JOIN small ON o_custkey % 25 = k
    WHERE o_totalprice < 10000"""


def test_a_one_task_stage_read_by_two_stages_stays_a_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Computed once, read by each: a shared node that scans a table is not
    # computed again by its readers, small as it is (a CTE and the correlated
    # subquery over it meet in one task: TPC-DS q01, q30, q81).
    plan = plan_query(SHARED_SMALL, catalog, SEVERAL)
    nation = [s for s in plan.stages if "nation" in _tables(s)]
    assert len(nation) == 1 and nation[0].num_tasks == 1, [s.label for s in plan.stages]
    readers = [s for s in plan.stages if nation[0].id in s.upstream]
    assert len(readers) == 2, [s.label for s in plan.stages]
    _check(plan, SHARED_SMALL, duckdb_ref)


def test_a_subquery_read_by_one_task_is_computed_in_that_task(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(22)
    plan = plan_query(sql, catalog, ONE_SPLIT)
    assert not any(s.label == "subquery" for s in plan.stages), [s.label for s in plan.stages]
    # The average balance is computed where the customers are filtered by it.
    (customers,) = [s for s in plan.stages if s.scan is not None and s.scan.table == "customer"]
    assert [s.table for s in customers.side_scans] == ["customer"]
    assert "AVG(" in customers.sql and not customers.inputs
    # The customers are read twice (the semi join of orders and the anti join):
    # one stage, read by the final task, which scans orders itself.
    assert len(plan.stages) == 2 and _tables(plan.final) == {"orders"}
    _check(plan, sql, duckdb_ref)


def test_a_subquery_read_by_several_tasks_is_a_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """
        SELECT o_orderpriority, COUNT(*) AS n FROM orders
        WHERE o_totalprice > (SELECT AVG(c_acctbal) * 30 FROM customer)
        GROUP BY o_orderpriority"""
    plan = plan_query(sql, catalog, SEVERAL)
    (subquery,) = [s for s in plan.stages if s.label == "subquery"]
    orders = next(s for s in plan.stages if s.scan is not None and s.scan.table == "orders")
    assert orders.num_tasks == 2 and subquery.id in orders.upstream
    _check(plan, sql, duckdb_ref)


def test_a_subquery_read_by_a_table_each_task_scans_is_a_stage_again(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # customer (one task) filtered by the subquery is scanned by each orders task
    # (``inline_scan_bytes``): the subquery, planned inside customer's task, is a
    # stage those tasks read when customer joins them, not computed in each where
    # each may not (``recompute_bytes=0``; by default each computes these 25 rows
    # of nation: ``test_plan_inline_filtered``).
    sql = """
        SELECT c_mktsegment, COUNT(*) AS n
        FROM orders JOIN customer ON o_custkey = c_custkey
        WHERE c_nationkey IN (SELECT n_nationkey FROM nation WHERE n_regionkey = 1)
        GROUP BY c_mktsegment"""
    plan = plan_query(sql, catalog, PlannerConfig(split_rows=20_000, recompute_bytes=0))
    orders = next(s for s in plan.stages if s.scan is not None and s.scan.table == "orders")
    assert orders.num_tasks == 2 and "customer" in _tables(orders)
    (subquery,) = [s for s in plan.stages if s.label == "subquery"]
    assert [(i.stage, i.mode) for i in orders.inputs] == [(subquery.id, InputMode.ALL)]
    _check(plan, sql, duckdb_ref)


def test_a_big_in_list_read_by_one_task_is_a_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Every table one split, but the list (the order keys of 600k line items,
    # estimated over ``INLINE_SUBQUERY_BYTES``) is a join DuckDB sizes exactly only
    # from a stage's input (TPC-DS q95's lists): it stays a stage.
    sql = """
        SELECT o_orderpriority, COUNT(*) AS n FROM orders
        WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem WHERE l_quantity > 10)
        GROUP BY o_orderpriority"""
    plan = plan_query(sql, catalog, ONE_SPLIT)
    (subquery,) = [s for s in plan.stages if s.label == "subquery"]
    assert subquery.num_tasks == 1 and subquery.id in plan.final.upstream
    _check(plan, sql, duckdb_ref)


# ---------------------------------------------------------------- the bound

MIB = 1024 * 1024
# Each lineitem scan of two columns below is about 18 MiB (600k rows of 32 bytes);
# with a bound of 30 MiB, a task holds one of them and the smaller ones alongside.
BOUND = 30 * MIB


def _scanned(stage: Stage, catalog: dict[str, Table], small: float) -> float:
    """Bytes of tables one task of ``stage`` scans, as the bound counts them: rows
    times the columns' width, scans of at most ``small`` bytes aside."""
    total = 0.0
    for scan in ([stage.scan] if stage.scan else []) + list(stage.side_scans):
        table = catalog[scan.table]
        rows = max(sum(s.rows for s in splits) for splits in scan.task_splits)
        read = rows * table.row_width(scan.columns)
        total += read if read > small else 0.0
    return total


def _within_bound(plan: DistributedPlan, catalog: dict[str, Table], config: PlannerConfig) -> None:
    for stage in plan.stages:
        # A stage of one scan may be any size (its split); one that fused others'
        # scans stays within the bound.
        scans = len(stage.side_scans) + (stage.scan is not None)
        if scans > 1:
            scanned = _scanned(stage, catalog, config.inline_scan_bytes)
            assert scanned <= config.fuse_bytes, (stage.id, scanned / MIB)


SCALARS = """
    SELECT
      (SELECT AVG(l_extendedprice) FROM lineitem AS l1 WHERE l_quantity BETWEEN 1 AND 10) AS a,
      (SELECT AVG(l_discount) FROM lineitem AS l2 WHERE l_quantity BETWEEN 11 AND 20) AS b,
      (SELECT AVG(l_tax) FROM lineitem AS l3 WHERE l_quantity BETWEEN 21 AND 30) AS c,
      (SELECT COUNT(*) FROM lineitem AS l4 WHERE l_quantity > 30) AS d
    FROM region WHERE r_regionkey = 0"""
"""Four scans of ``lineitem``, each under a name of its own: subqueries of one
FROM, word for word, would be one pass (``sql.merged_aggregates``), and these are
here for the scans' sizes against the bound."""


def test_subqueries_over_the_bound_are_stages_that_run_side_by_side(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q09's shape: fifteen scans of store_sales, one task at SF1 without a
    # bound, where many executors could scan them at once.
    unbounded = plan_query(SCALARS, catalog, PlannerConfig(split_rows=10_000_000, fuse_bytes=0))
    assert len(unbounded.stages) == 1
    assert _scanned(unbounded.final, catalog, 8 * MIB) > 60 * MIB
    config = PlannerConfig(split_rows=10_000_000, fuse_bytes=BOUND)
    plan = plan_query(SCALARS, catalog, config)
    apart = [s for s in plan.stages if s.label == "subquery"]
    assert len(apart) == 2 and len(plan.stages) == 3, [s.label for s in plan.stages]
    # Each is read by the final task alone, so they run at the same time.
    assert all(s.num_tasks == 1 and s.id in plan.final.upstream for s in apart)
    assert not any(s.id in other.upstream for s in apart for other in apart)
    # The final task still computes what fits: the other two subqueries.
    assert [s.table for s in plan.final.side_scans] == ["lineitem", "lineitem"]
    _within_bound(plan, catalog, config)
    for s in apart:
        assert any(f"stage {s.id} is not fused" in note for note in plan.notes), plan.notes
    _check(plan, SCALARS, duckdb_ref)


def test_a_one_task_side_over_the_bound_is_a_stage(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Filtered orders broadcast into lineitem's one task: 34 + 11 MiB together.
    sql = """
        SELECT o_orderpriority, COUNT(*) AS n, SUM(l_extendedprice) AS s
        FROM orders JOIN lineitem ON o_orderkey = l_orderkey
        WHERE l_comment LIKE '%fur%' AND o_comment LIKE '%special%'
        GROUP BY o_orderpriority"""
    assert len(plan_query(sql, catalog, PlannerConfig(split_rows=10_000_000)).stages) == 1
    config = PlannerConfig(split_rows=10_000_000, fuse_bytes=BOUND)
    plan = plan_query(sql, catalog, config)
    (orders,) = [s for s in plan.stages if _tables(s) == {"orders"}]
    assert len(plan.stages) == 2 and orders.id in plan.final.upstream
    assert _tables(plan.final) == {"lineitem"}
    assert any(f"stage {orders.id} is not fused" in note for note in plan.notes), plan.notes
    _within_bound(plan, catalog, config)
    _check(plan, sql, duckdb_ref)


def test_set_operation_sides_over_the_bound_are_stages_side_by_side(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """
        SELECT COUNT(*) AS n, SUM(k) AS s FROM (
          SELECT l_orderkey AS k FROM lineitem WHERE l_comment LIKE '%fur%'
          UNION ALL
          SELECT o_orderkey FROM orders WHERE o_comment LIKE '%special%') u"""
    assert len(plan_query(sql, catalog, PlannerConfig(split_rows=10_000_000)).stages) == 1
    config = PlannerConfig(split_rows=10_000_000, fuse_bytes=BOUND)
    plan = plan_query(sql, catalog, config)
    # Neither side is scanned by the union's task: both run at once, before it.
    assert len(plan.stages) == 3 and not _tables(plan.final), [s.label for s in plan.stages]
    sides = {frozenset(_tables(s)) for s in plan.stages if s.id in plan.final.upstream}
    assert sides == {frozenset({"lineitem"}), frozenset({"orders"})}
    for stage in plan.final.upstream:
        assert any(f"stage {stage} is not fused" in note for note in plan.notes), plan.notes
    _check(plan, sql, duckdb_ref)


def test_small_tables_do_not_count_against_the_bound(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # q13's orders (10 MB of the columns read) with customer (120 kB): customer is
    # within ``inline_scan_bytes``, as a table a join scans in each of its tasks
    # anyway, so even a bound of one byte leaves the two in one task ...
    sql = tpch_query(13)
    plan = plan_query(sql, catalog, PlannerConfig(split_rows=10_000_000, fuse_bytes=1))
    assert len(plan.stages) == 1 and _tables(plan.final) == {"customer", "orders"}
    assert not plan.notes
    _check(plan, sql, duckdb_ref)
    # ... where, counted (nothing is small), the orders side is a stage of its own.
    config = PlannerConfig(split_rows=10_000_000, fuse_bytes=1, inline_scan_bytes=0)
    plan = plan_query(sql, catalog, config)
    assert len(plan.stages) == 2 and _tables(plan.final) == {"customer"}
    assert _tables(plan.stages[0]) == {"orders"}
    assert len(plan.notes) == 1 and "is not fused" in plan.notes[0]
    _check(plan, sql, duckdb_ref)


def test_an_exchange_costs_a_stage_so_a_small_side_joins_into_spread_scan_tasks(
    catalog: dict[str, Table],
    duckdb_ref: duckdb.DuckDBPyConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # TPC-H q08 on two hosts of one core, spread as at SF1 (``orders`` in two
    # tasks). Costed by bytes alone, hashing ``orders`` and the customers of one
    # region into the join cost about what broadcasting the customers into both
    # ``orders`` tasks does, and the joined rows went to a last stage of one task
    # that scanned ``customer`` (and, at SF10 for q05, hashed all of
    # ``lineitem`` to meet them). With an exchange's stage counted
    # (``costs.EXCHANGE_FIXED``), the customers join into the spread tasks and the
    # one-task stage only merges their partial aggregates.
    sql = tpch_query(8)
    config = PlannerConfig(slots=2, parallel=2, spread_bytes=1 << 20)
    plan = plan_query(sql, catalog, config)
    assert [s.num_tasks for s in plan.stages] == [2, 1], [s.label for s in plan.stages]
    assert "customer" in _tables(plan.stages[0])
    assert _tables(plan.final) == set(), plan.final.label
    _check(plan, sql, duckdb_ref)

    # Where the customers of the region are counted exactly (one region of five,
    # ``plan.tiny``), bytes alone pick this too; with the footers' guess (2.2
    # regions), only the exchange's stage does.
    monkeypatch.setattr(tiny, "EXACT_ROWS", 0)
    guessed = plan_query(sql, catalog, config)
    assert [s.num_tasks for s in guessed.stages] == [2, 1], [s.label for s in guessed.stages]
    assert "customer" in _tables(guessed.stages[0])
    monkeypatch.setattr(distributor, "EXCHANGE_FIXED", 0.0)
    bytes_only = plan_query(sql, catalog, config)
    assert "customer" in _tables(bytes_only.final), [s.label for s in bytes_only.stages]
