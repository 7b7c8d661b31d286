"""An aggregate grouped by a dimension's columns is first grouped by the join key.

TPC-DS q04/q11's ``year_total`` grouped 2.9M sales joined with ``customer`` by seven
customer columns (strings) and the year: the wide hash aggregate was three quarters
of the task. Now the sales are grouped by the customer key and the year first
(``plan.eager``), and only those partial rows meet ``customer``. The shapes here
are TPC-H's: orders grouped by customer columns. Each plan runs task by task
(``plan_runner``) against single-process DuckDB; where the orders are in several
tasks, the partial aggregate runs in each of them and the aggregate above merges.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table, load_table
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlannerConfig, plan_query

ONE_TASK = PlannerConfig(split_rows=10_000_000)
SEVERAL_TASKS = PlannerConfig(partitions=3, partition_bytes=0, split_rows=4_000)


def _grouped_early(plan: DistributedPlan) -> bool:
    """True when some stage groups before a join (``_eaN`` is the eager aggregate)."""
    return any('"_ea' in stage.sql for stage in plan.stages)


def _grouped_early_and_right(
    sql: str,
    config: PlannerConfig,
    catalog: dict[str, Table],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> pa.Table:
    """Plan ``sql``, check that it groups early and answers as DuckDB does, task by
    task; DuckDB's answer, for the caller to check the data meant what it says."""
    plan = plan_query(sql, catalog, config)
    assert _grouped_early(plan), [s.sql for s in plan.stages]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert_same_result(run_plan(plan), expected, ordered=False)
    return expected


WIDE_CUSTOMER_KEYS = """
    SELECT c_name, c_address, c_phone, c_mktsegment,
           SUM(o_totalprice) AS total, COUNT(*) AS n, MIN(o_orderdate) AS first,
           MAX(o_shippriority) AS p, AVG(o_totalprice) AS mean
    FROM orders JOIN customer ON o_custkey = c_custkey
    GROUP BY c_name, c_address, c_phone, c_mktsegment"""


@pytest.mark.parametrize("config", [ONE_TASK, SEVERAL_TASKS], ids=["one-task", "several-tasks"])
def test_orders_are_grouped_by_customer_key_before_the_join(
    config: PlannerConfig, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    plan = plan_query(WIDE_CUSTOMER_KEYS, catalog, config)
    assert _grouped_early(plan), [s.sql for s in plan.stages]
    if config is SEVERAL_TASKS:
        orders_stage = next(s for s in plan.stages if s.scan and s.scan.table == "orders")
        assert orders_stage.num_tasks > 1
    expected = duckdb_ref.sql(WIDE_CUSTOMER_KEYS).to_arrow_table()
    assert expected.num_rows > 100
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_fact_side_group_key_stays_in_the_early_grouping(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The year is the orders' own: grouped by (customer key, year) first, as
    # year_total groups sales by customer key and d_year.
    sql = """
        SELECT c_name, c_address, c_phone, EXTRACT(year FROM o_orderdate) AS y,
               SUM(o_totalprice) AS total, COUNT(*) AS n
        FROM orders JOIN customer ON o_custkey = c_custkey
        GROUP BY c_name, c_address, c_phone, EXTRACT(year FROM o_orderdate)"""
    plan = plan_query(sql, catalog, SEVERAL_TASKS)
    assert _grouped_early(plan)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 100
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_join_that_drops_most_rows_comes_first(catalog: dict[str, Table]) -> None:
    # A few customers of one segment and balance: the join keeps a small part of
    # the orders, cheaper to group after it (TPC-H q18's shape).
    sql = """
        SELECT c_name, c_address, c_phone, SUM(o_totalprice) AS total
        FROM orders JOIN customer ON o_custkey = c_custkey
        WHERE c_acctbal > 9000 AND c_mktsegment = 'BUILDING'
        GROUP BY c_name, c_address, c_phone"""
    assert not _grouped_early(plan_query(sql, catalog, ONE_TASK))


def test_wide_keys_on_both_sides_are_grouped_once(catalog: dict[str, Table]) -> None:
    # TPC-H q10's shape: the customer's columns are the group keys, nation adds its
    # name. Grouping by the customer's columns and nation key first would group by
    # the wide keys twice.
    sql = """
        SELECT c_name, c_address, c_phone, n_name, SUM(c_acctbal) AS total
        FROM customer JOIN nation ON c_nationkey = n_nationkey
        GROUP BY c_name, c_address, c_phone, n_name"""
    assert not _grouped_early(plan_query(sql, catalog, ONE_TASK))


LINE_ITEMS_BY_CUSTOMER_AND_NATION = """
    SELECT c_custkey, c_name, c_address, c_phone, c_comment, n_name,
           SUM(l_extendedprice * (1 - l_discount)) AS revenue, COUNT(*) AS n
    FROM lineitem JOIN orders ON l_orderkey = o_orderkey
         JOIN customer ON o_custkey = c_custkey
         JOIN nation ON c_nationkey = n_nationkey
    WHERE l_returnflag = 'R' AND o_orderdate >= DATE '1993-10-01'
          AND o_orderdate < DATE '1994-01-01'
    GROUP BY c_custkey, c_name, c_address, c_phone, c_comment, n_name"""


@pytest.mark.parametrize("config", [ONE_TASK, SEVERAL_TASKS], ids=["one-task", "several-tasks"])
def test_line_items_are_grouped_by_customer_under_the_join_with_nation(
    config: PlannerConfig, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-H q10's shape: the join with customer lies under the join with nation,
    # which reads only the customer's columns; the keys are wide (strings), so
    # the line items are grouped by their customer's key first though a customer
    # has a few of them (``WIDE_KEYS``).
    expected = _grouped_early_and_right(
        LINE_ITEMS_BY_CUSTOMER_AND_NATION, config, catalog, duckdb_ref
    )
    assert expected.num_rows > 100
    assert max(expected.column("n").to_pylist()) > 1, "customers of several line items"


@pytest.mark.parametrize("config", [ONE_TASK, SEVERAL_TASKS], ids=["one-task", "several-tasks"])
def test_a_join_above_that_reads_the_line_items_keeps_them_whole_below_it(
    config: PlannerConfig, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The join with ``part``, above the join with customer, reads the line items'
    # part key: grouped by their customer's key alone below it, they would have
    # lost it (DuckDB refused the SQL: no column ``l_partkey``).
    sql = """
        SELECT c_name, c_address, c_comment, SUM(l_extendedprice) AS total, COUNT(*) AS n
        FROM lineitem JOIN orders ON l_orderkey = o_orderkey
             JOIN customer ON o_custkey = c_custkey
             JOIN part ON l_partkey = p_partkey
        WHERE p_size < 40
        GROUP BY c_name, c_address, c_comment"""
    plan = plan_query(sql, catalog, config)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 100
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_an_aggregate_that_does_not_split_is_left_alone(catalog: dict[str, Table]) -> None:
    sql = """
        SELECT c_name, c_address, c_phone, COUNT(DISTINCT o_orderstatus) AS kinds
        FROM orders JOIN customer ON o_custkey = c_custkey
        GROUP BY c_name, c_address, c_phone"""
    assert not _grouped_early(plan_query(sql, catalog, ONE_TASK))


UNION_AVG = """
    SELECT AVG(q * p) AS mean, COUNT(*) AS n, SUM(q) AS total
    FROM (SELECT l_quantity AS q, l_extendedprice AS p FROM lineitem
          UNION ALL
          SELECT ps_availqty, ps_supplycost FROM partsupp
          UNION ALL
          SELECT o_shippriority, o_totalprice FROM orders WHERE o_orderstatus = 'F') u"""

UNION_GROUPED = """
    SELECT k, SUM(v) AS s, COUNT(*) AS n, MIN(v) AS lo, MAX(v) AS hi, AVG(v) AS mean
    FROM (SELECT l_suppkey % 10 AS k, l_quantity AS v FROM lineitem
          UNION ALL
          SELECT ps_suppkey % 10, ps_availqty FROM partsupp) u
    GROUP BY k"""


@pytest.mark.parametrize("sql", [UNION_AVG, UNION_GROUPED], ids=["global", "grouped"])
def test_each_branch_of_a_union_all_aggregates_before_the_union(
    sql: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q14's avg_sales: one AVG over three channels unioned.
    plan = plan_query(sql, catalog, SEVERAL_TASKS)
    for table in ("lineitem", "partsupp"):
        stage = next(s for s in plan.stages if s.scan and s.scan.table == table)
        assert stage.num_tasks > 1 and "partial aggregate" in stage.label, stage.label
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows >= 1 and expected.column("n")[0].as_py() > 0
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_union_that_drops_duplicates_is_aggregated_after_it(catalog: dict[str, Table]) -> None:
    sql = UNION_GROUPED.replace("UNION ALL", "UNION")
    plan = plan_query(sql, catalog, SEVERAL_TASKS)
    lineitem = next(s for s in plan.stages if s.scan and s.scan.table == "lineitem")
    assert "aggregate" not in lineitem.label, lineitem.label


def test_a_union_whose_aggregate_reads_a_subquery_is_aggregated_after_it(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The aggregate's argument reads a subquery: it stays above the union, where
    # the subquery's stage is attached (in a branch it would find none).
    sql = """
        SELECT SUM(q * (SELECT AVG(l_quantity) FROM lineitem)) AS s, COUNT(*) AS n
        FROM (SELECT l_quantity AS q FROM lineitem
              UNION ALL
              SELECT ps_availqty / 200 FROM partsupp) u"""
    plan = plan_query(sql, catalog, SEVERAL_TASKS)
    partsupp = next(s for s in plan.stages if s.scan and s.scan.table == "partsupp")
    assert "aggregate" not in partsupp.label, partsupp.label
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.column("n")[0].as_py() > 0
    assert_same_result(run_plan(plan), expected, ordered=False)


def test_a_dimension_of_a_few_rows_is_joined_first(catalog: dict[str, Table]) -> None:
    # 25 nations make 25 groups: their wide keys cost the aggregate little, and
    # the join with them little (TPC-DS q66's 5 warehouses).
    sql = """
        SELECT n_name, n_comment, SUM(c_acctbal) AS total, COUNT(*) AS n
        FROM customer JOIN nation ON c_nationkey = n_nationkey
        GROUP BY n_name, n_comment"""
    assert not _grouped_early(plan_query(sql, catalog, ONE_TASK))


def test_branches_that_aggregate_are_not_aggregated_again(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-DS q33/q56/q60: each channel is grouped by item already.
    sql = """
        SELECT k, SUM(n) AS n
        FROM (SELECT l_suppkey AS k, COUNT(*) AS n FROM lineitem GROUP BY l_suppkey
              UNION ALL
              SELECT ps_suppkey, COUNT(*) FROM partsupp GROUP BY ps_suppkey) u
        GROUP BY k"""
    plan = plan_query(sql, catalog, SEVERAL_TASKS)
    assert not _grouped_early(plan), [s.label for s in plan.stages]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 100
    assert_same_result(run_plan(plan), expected, ordered=False)


LEFT_JOIN_AGGREGATES = """
    SELECT c_custkey, c_name, COUNT(o_orderkey) AS n, SUM(o_totalprice) AS total,
           MIN(o_orderdate) AS first, MAX(o_orderdate) AS last, AVG(o_totalprice) AS mean
    FROM customer LEFT JOIN orders
      ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%'
    GROUP BY c_custkey, c_name"""


@pytest.mark.parametrize("config", [ONE_TASK, SEVERAL_TASKS], ids=["one-task", "several-tasks"])
def test_orders_are_counted_by_customer_before_a_left_join(
    config: PlannerConfig, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-H q13's shape: every customer, with the count of its orders (0 for a third
    # of them). The orders are grouped by their customer key first, one row per
    # customer per task; a customer no order met keeps one row of NULLs, whose COUNT
    # is 0 and whose SUM, MIN, MAX and AVG are NULL, as without the rewrite.
    expected = _grouped_early_and_right(LEFT_JOIN_AGGREGATES, config, catalog, duckdb_ref)
    counts = expected.column("n").to_pylist()
    assert 0 in counts and max(counts) > 1, "customers without orders and with several"


@pytest.mark.parametrize(
    "aggregate",
    ["COUNT(*)", "SUM(COALESCE(o_totalprice, 1))"],
    ids=["count-star", "an-expression"],
)
def test_a_left_join_whose_aggregate_counts_the_unmatched_row_is_grouped_after_it(
    aggregate: str, catalog: dict[str, Table]
) -> None:
    # A customer without orders is one row of NULLs that COUNT(*) counts and
    # COALESCE turns into 1: no partial row of orders can stand for it.
    sql = f"""
        SELECT c_custkey, {aggregate} AS n
        FROM customer LEFT JOIN orders ON c_custkey = o_custkey
        GROUP BY c_custkey"""
    assert not _grouped_early(plan_query(sql, catalog, ONE_TASK))


def test_orders_are_grouped_by_the_join_key_alone_for_a_dimensions_key(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Grouped by the customer's own key, as wide as the orders' key (``NARROWER``
    # does not hold): the partial aggregate groups each order once, by one key, as
    # the aggregate would have, and the join meets a row per customer and task
    # instead of every order.
    sql = """
        SELECT c_custkey, SUM(o_totalprice) AS total, COUNT(*) AS n
        FROM orders JOIN customer ON o_custkey = c_custkey
        GROUP BY c_custkey"""
    plan = plan_query(sql, catalog, SEVERAL_TASKS)
    assert _grouped_early(plan), [s.sql for s in plan.stages]
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 100
    assert_same_result(run_plan(plan), expected, ordered=False)


YEAR_TOTAL = """
    SELECT c_name, c_addr, d_year, SUM(s_amount) AS total, COUNT(*) AS n
    FROM sales JOIN dates ON s_day = d_day JOIN customers ON s_cust = c_id
    WHERE d_year IN (2001, 2002)
    GROUP BY c_name, c_addr, d_year"""


@pytest.fixture(scope="module")
def year_total_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TPC-DS ``year_total``'s shape: 2M sales over five years, a customer's lines
    together as in a ticket, and 20k customers of wide strings (2 MiB)."""
    d = tmp_path_factory.mktemp("year_total")
    days, customers, sales = 5 * 365, 20_000, 2_000_000
    pq.write_table(
        pa.table({"d_day": np.arange(days), "d_year": 2000 + np.arange(days) // 365}),
        d / "dates.parquet",
    )
    ids = np.arange(customers)
    pq.write_table(
        pa.table(
            {
                "c_id": ids,
                "c_name": [f"customer name {i:08d}" for i in ids],
                "c_addr": [
                    f"{i:06d} a long street name, a city, a country {i % 977:04d}" for i in ids
                ],
            }
        ),
        d / "customers.parquet",
    )
    ticket = np.arange(sales) // 10
    pq.write_table(
        pa.table(
            {
                "s_day": ticket * 7 % days,
                "s_cust": ticket * 13 % customers,
                "s_amount": (np.arange(sales) * 31 % 1000) / 10,
            }
        ),
        d / "sales.parquet",
        row_group_size=250_000,
    )
    return d


def test_the_early_groups_meet_the_dimension_in_its_own_task(year_total_data: Path) -> None:
    # The sales grouped by customer key and year in each of two tasks are 80k
    # narrow rows, fewer bytes than the customers: they move to the task that
    # scans the customers, where the flat quarter of the input once estimated
    # them at four times the customers' bytes and broadcast the customers into
    # both tasks, to group by the wide strings twice.
    catalog = {
        n: load_table(n, str(year_total_data / f"{n}.parquet"))
        for n in ("sales", "dates", "customers")
    }
    plan = plan_query(YEAR_TOTAL, catalog, PlannerConfig(split_rows=1_000_000))
    assert _grouped_early(plan), [s.sql for s in plan.stages]
    (sales,) = [s for s in plan.stages if s.scan is not None and s.scan.table == "sales"]
    assert sales.num_tasks == 2
    assert "customers" not in {s.table for s in sales.side_scans}
    assert not any(
        "customers" in {s.table for s in [*([u.scan] if u.scan else []), *u.side_scans]}
        for u in plan.stages
        if u.id in {i.stage for i in sales.inputs}
    )
    con = duckdb.connect()
    for n in catalog:
        con.execute(
            f"CREATE VIEW {n} AS SELECT * FROM read_parquet('{year_total_data / n}.parquet')"
        )
    expected = con.sql(YEAR_TOTAL).to_arrow_table()
    assert expected.num_rows > 1000
    assert_same_result(run_plan(plan), expected, ordered=False)
