"""The 22 TPC-H queries on a real 2-executor cluster, each answer checked against DuckDB.

Runs on SF 0.1 with 4 partitions per exchange, so every query's plan has shuffles and
several tasks per stage; the explain test makes sure the plan really is distributed
(but for the queries in ``ONE_STAGE``, whose every table is one split here) and that the
planner did not fall back to running the whole query in one task (``FALLBACK``): a
fallback plan has several stages too, a scan stage per table of several splits.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
from helpers import (
    TPCH_ORDER_BY,
    assert_fallback_as_listed,
    assert_same_result,
    explain_stage_count,
    tpch_query,
)

QUERIES = list(range(1, 23))


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_tpch_answer_matches_duckdb(
    number: int, session: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    # Every TPC-H query returns rows at SF 0.1; an empty reference would prove nothing.
    assert expected.num_rows > 0
    actual = session.sql(sql).to_arrow()
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)


FALLBACK: dict[int, str] = {}
"""Queries the planner runs whole in one task (``DistributedPlan.fallback``), with the
reason: none. A query moving in or out of this list fails."""

ONE_STAGE = {
    2: "partsupp (80k rows), part, supplier, nation and region are one split each, and "
    "its subquery's semi join keeps the partsupps of the parts of one size and type (a "
    "few hundred; estimate.semi_kept): every stage would be one task",
    11: "partsupp (80k rows), supplier and nation are one split each, and its subquery "
    "(the same join, summed) is one task read by one task: every stage would be one task",
    16: "partsupp, part and supplier (the NOT IN subquery) are one split each: every stage "
    "would be one task",
}
"""Queries that plan to one stage on this cluster, with the reason: no boundary is cut
between one-task stages (``plan.distribute.stages.one_task``). One moving in or out of
this list fails."""


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_tpch_plan_has_several_stages(number: int, session: Any) -> None:
    text = session.explain(tpch_query(number))
    assert_fallback_as_listed(f"q{number:02d}", text, FALLBACK, number)
    stages = explain_stage_count(text)
    if number in ONE_STAGE:
        assert stages == 1, f"q{number:02d} planned as {stages} stages now: {ONE_STAGE[number]}"
    else:
        assert stages > 1, f"q{number:02d} planned as {stages} stage(s):\n{text}"


@pytest.mark.parametrize("number", [3, 18])
def test_tpch_lineitem_tasks_read_their_orders_by_key_range(number: int, session: Any) -> None:
    """``lineitem`` and ``orders`` are written in order-key order: each lineitem task
    scans the row groups of orders its keys may meet, and joins and aggregates by
    order where it reads (the answers are checked above)."""
    text = session.explain(tpch_query(number))
    assert "orders" in text and "by join key range: each task its row groups" in text, text


@pytest.fixture(scope="module")
def hash_join_session(module_dir: Any, tpch_tables: dict[str, Any]) -> Any:
    """A second cluster whose planner never broadcasts: every join is a hash shuffle
    of both sides, so rows cross between the two executors by Flight and memory map."""
    import mangonel

    with (
        mangonel.LocalCluster(
            executors=2, work_dir=str(module_dir / "hash-cluster"), partitions=4, broadcast_bytes=0
        ) as cluster,
        cluster.connect() as client,
    ):
        for name, path in tpch_tables.items():
            client.register_parquet(name, str(path))
        yield client


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_tpch_with_hash_joins_only(
    number: int, hash_join_session: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    actual = hash_join_session.sql(sql).to_arrow()
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)
    # The plan the job ran (the plan cache's, keyed by the same text and tables).
    text = hash_join_session.explain(sql)
    assert_fallback_as_listed(f"q{number:02d}", text, FALLBACK, number)
    if number in (3, 12, 18):  # queries whose plan joins two big tables
        assert "hash(" in text and "partition i of each map task" in text, text
