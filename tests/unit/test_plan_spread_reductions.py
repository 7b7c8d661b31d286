"""A reduced semi / anti join spread over the hosts' tasks.

The far side of a semi / anti join much bigger than its kept side is first reduced
by the kept side's keys (``reductions.reduce_by_keys``): the kept side is a stage
that the far side's tasks read whole. The join itself read both whole in one task,
while the other hosts waited (TPC-H SF10 on two hosts of one core: q21's anti join
0.42 s, q04's semi join 0.22 s). Where hosts run tasks side by side (``parallel``
over 1) and an exchange of both sides would be spread, the kept side's stage hashes
its rows by the join keys, the reduced far side is hashed alike, and the join runs
task by task. One host plans as before.

The planner's floors are scaled from SF10 to the SF 0.1 data (by 100: the spread
of a scan and of an exchange), so that these are SF10's plans in miniature. Each
plan runs task by task (``plan_runner``) against single-process DuckDB.
"""

from __future__ import annotations

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query
from plan_runner import run_plan

from mangonel.catalog import Table
from mangonel.plan.distribute import stages
from mangonel.plan.distribute.joins import JoinPlacer
from mangonel.plan.explain import render
from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import InputMode

SCALE_DOWN = 100
"""SF10 to SF 0.1."""
TWO_HOSTS = PlannerConfig(slots=2, parallel=2, spread_bytes=(32 << 20) // SCALE_DOWN)
ONE_HOST = PlannerConfig(slots=2, parallel=1, spread_bytes=(32 << 20) // SCALE_DOWN)


@pytest.fixture(autouse=True)
def _sf10_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stages, "SPREAD_PARTITION_BYTES", (4 << 20) // SCALE_DOWN)


def _shape(plan: DistributedPlan) -> list[tuple[int, str, int, list[str]]]:
    """Each stage's tasks, output and inputs (``s<id>:<mode>``), for a readable assert."""
    return [
        (
            s.num_tasks,
            s.output.kind.value,
            s.output.partitions,
            [f"s{i.stage}:{i.mode.value}" for i in s.inputs],
        )
        for s in plan.stages
    ]


def _spread_joins(plan: DistributedPlan) -> list[Stage]:
    """Stages of several tasks that read, by partition, a stage that another
    stage reads whole: a kept side, spread."""
    whole = {i.stage for s in plan.stages for i in s.inputs if i.mode is InputMode.ALL}
    return [
        s
        for s in plan.stages
        if s.num_tasks > 1
        and any(i.mode is InputMode.PARTITION and i.stage in whole for i in s.inputs)
    ]


def _check(plan: DistributedPlan, number: int, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(run_plan(plan), expected, ordered=bool(order_by), order_by=order_by)


def test_q21_anti_join_runs_in_a_task_per_host_and_the_semi_join_after_it_in_one(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    plan = plan_query(tpch_query(21), catalog, TWO_HOSTS)
    # s1: l1 of one nation's suppliers' late orders, the kept side, hashed by
    # order key; s2: lineitem l3 reduced by it, hashed alike; s3: the anti join,
    # task by task, itself the kept side of the semi join with l2 (s4). The anti
    # join keeps about a tenth of l1 (an order's other late line items are found
    # for most of them; ``estimate.semi_kept``), too little for the semi join to
    # pay a stage of its own: it reads both whole in the final task.
    assert _shape(plan) == [
        (2, "hash", 2, []),
        (2, "hash", 2, ["s1:all"]),
        (2, "single", 1, ["s1:partition", "s2:partition"]),
        (2, "single", 1, ["s3:all"]),
        (1, "single", 1, ["s3:all", "s4:all"]),
    ], [s.label for s in plan.stages]
    assert plan.stages[2].label == "anti join"
    assert plan.stages[4].label.startswith("semi join")
    assert plan.stages[0].output.keys == ('"l1.l_orderkey"',)
    _check(plan, 21, duckdb_ref)


def test_q04_semi_join_runs_in_a_task_per_host(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    plan = plan_query(tpch_query(4), catalog, TWO_HOSTS)
    # s1: the quarter's orders, hashed by order key; s2: the late line items
    # reduced by them, hashed alike; s3: the semi join in two tasks.
    assert _shape(plan) == [
        (2, "hash", 2, []),
        (2, "hash", 2, ["s1:all"]),
        (2, "hash", 1, ["s1:partition", "s2:partition"]),
        (1, "single", 1, ["s3:partition"]),
    ], [s.label for s in plan.stages]
    assert plan.stages[2].label == "semi join → partial aggregate"
    _check(plan, 4, duckdb_ref)


def test_q22_anti_join_is_spread_and_answers_like_duckdb(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The third TPC-H plan this changes at SF10: the rich customers without
    # orders, the orders reduced by the customers' keys.
    plan = plan_query(tpch_query(22), catalog, TWO_HOSTS)
    (join,) = _spread_joins(plan)
    assert join.num_tasks == 2 and join.label.startswith("anti join")
    _check(plan, 22, duckdb_ref)


def test_one_host_plans_do_not_change(
    catalog: dict[str, Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Exchanges of several partitions by their bytes (``partition_bytes`` small),
    # so that a reduced join would be spread if one host spread it.
    small = {"partitions": 2, "partition_bytes": 1 << 16}
    one_host = PlannerConfig(slots=2, parallel=1, **small)
    two_hosts = PlannerConfig(slots=2, parallel=2, **small)
    planned = {n: render(plan_query(tpch_query(n), catalog, one_host)) for n in range(1, 23)}
    assert _spread_joins(plan_query(tpch_query(21), catalog, two_hosts))
    monkeypatch.setattr(JoinPlacer, "_spread_reduced", lambda *_: None)
    unspread = {n: render(plan_query(tpch_query(n), catalog, one_host)) for n in range(1, 23)}
    assert planned == unspread
    assert not _spread_joins(plan_query(tpch_query(21), catalog, one_host))
