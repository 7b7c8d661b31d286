"""The distributed planner on the 22 TPC-H queries, without processes.

Each plan is run task by task in one process (``plan_runner``) and its answer
compared with single-process DuckDB, under two planner configurations: every
join hash-partitioned (no broadcast), and broadcast of small sides with an odd
partition count. The EXPLAIN text of each plan is kept as golden text in
``golden/tpch/qNN.txt``; regenerate with ``MANGONEL_UPDATE_GOLDEN=1 pytest
tests/unit/test_plan_tpch.py`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.explain import render
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import InputMode, OutputKind

GOLDEN = Path(__file__).parent / "golden" / "tpch"
QUERIES = range(1, 23)

CONFIGS = {
    "hash-joins": PlannerConfig(
        partitions=4, partition_bytes=0, broadcast_bytes=0, split_rows=100_000
    ),
    "broadcast": PlannerConfig(
        partitions=3, partition_bytes=0, broadcast_bytes=4 << 20, split_rows=100_000
    ),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("number", QUERIES, ids=lambda n: f"q{n:02d}")
def test_plan_answers_like_duckdb(
    number: int, config: str, catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    plan = plan_query(sql, catalog, CONFIGS[config])
    assert not plan.notes, f"q{number} fell back: {plan.notes}"
    actual = run_plan(plan)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)


@pytest.mark.parametrize("number", QUERIES, ids=lambda n: f"q{n:02d}")
def test_hash_join_plans_exchange_on_both_sides(number: int, catalog: dict[str, Table]) -> None:
    """With broadcast off, every stage that scans a big table feeds a hash exchange or
    a gather, and every multi-task reduce stage reads its inputs partition-wise."""
    plan = plan_query(tpch_query(number), catalog, CONFIGS["hash-joins"])
    for stage in plan.stages:
        if stage.output.kind is OutputKind.HASH:
            assert stage.output.partitions == 4
        partitioned = [i for i in stage.inputs if i.mode is InputMode.PARTITION]
        if partitioned:
            assert stage.num_tasks == 4
            assert stage.scan is None, "a stage cannot read a scan and a hash partition"


@pytest.mark.parametrize("number", QUERIES, ids=lambda n: f"q{n:02d}")
def test_plan_golden_text(number: int, catalog: dict[str, Table]) -> None:
    text = render(plan_query(tpch_query(number), catalog, PlannerConfig())) + "\n"
    path = GOLDEN / f"q{number:02d}.txt"
    if os.environ.get("MANGONEL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden plan {path}; run with MANGONEL_UPDATE_GOLDEN=1 and review"
    assert text == path.read_text(), (
        f"the plan of q{number} changed; if intended, regenerate with "
        "MANGONEL_UPDATE_GOLDEN=1 and review the diff"
    )
