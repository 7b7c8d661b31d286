"""The plan spread finer, weighed against the default one by their estimated spans.

Where hosts run several tasks at full speed at once (``PlannerConfig.parallel``), a
table below ``spread_bytes`` that a stage of one task scans beside another stage's
output keeps every other host idle while it runs: TPC-H q12's ``orders`` is read
by the final task, which joins the filtered ``lineitem`` gathered from two tasks.
The planner then also plans the query with scans spread down to
``fine_spread_bytes`` and runs the plan whose span (``StageBuilder.span_bytes``) is
shorter, if it adds no stage: q12's ``orders`` spread over both hosts meets
``lineitem`` by key ranges in each task, and the final task only merges the
partial aggregates.

SF 0.1 here, with the byte settings scaled down ten times from their defaults.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from helpers import assert_same_result, tpch_query
from plan_runner import run_plan

from mangonel.catalog import Table, load_table
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlannerConfig, _shorter, plan_query

_MIB = 1 << 20
SCALED = {
    "spread_bytes": int(1.6 * _MIB),
    "fine_spread_bytes": 400_000,
    "stage_bytes": int(1.2 * _MIB),
}
"""The defaults (16 MiB, 4 MiB, 12 MiB) over ten, for SF 0.1's tables."""


@pytest.fixture(scope="module")
def catalog(tpch_tables: dict[str, Path]) -> dict[str, Table]:
    return {name: load_table(name, str(path)) for name, path in tpch_tables.items()}


def _plan(catalog: dict[str, Table], query: int, **settings: int) -> DistributedPlan:
    config = PlannerConfig(slots=2, **{**SCALED, "parallel": 2, **settings})
    return plan_query(tpch_query(query), catalog, config)


def _shape(plan: DistributedPlan) -> list[tuple[int, str | None]]:
    return [(s.num_tasks, s.scan.table if s.scan else None) for s in plan.stages]


def test_by_default_the_final_task_scans_orders_while_the_other_host_idles(
    catalog: dict[str, Table],
) -> None:
    """The premise: without the finer plan, q12's final stage of one task scans
    ``orders`` (two row groups, below ``spread_bytes``)."""
    assert _shape(_plan(catalog, 12, fine_spread_bytes=0)) == [(2, "lineitem"), (1, "orders")]


def test_the_finer_plan_spreads_orders_and_leaves_the_final_task_no_scan(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    plan = _plan(catalog, 12)
    assert _shape(plan) == [(2, "orders"), (1, None)]
    # ``lineitem`` is read by key ranges beside ``orders``, in the same two tasks.
    scan_stage = plan.stages[0]
    assert [s.table for s in scan_stage.side_scans] == ["lineitem"]
    assert len(scan_stage.side_scans[0].task_splits) == 2
    expected = duckdb_ref.sql(tpch_query(12)).to_arrow_table()
    assert_same_result(run_plan(plan), expected, ordered=True)


def test_one_task_at_full_speed_plans_once_as_before(catalog: dict[str, Table]) -> None:
    """On one host the finer plan is not weighed (its spread would not apply)."""
    for query in (4, 12, 20):
        once = _plan(catalog, query, parallel=1)
        without = _plan(catalog, query, parallel=1, fine_spread_bytes=0)
        assert [s.sql for s in once.stages] == [s.sql for s in without.stages], query


class _Planned:
    """What ``_shorter`` reads of a distributor: its stages and its span."""

    def __init__(self, stages: int, span: float) -> None:
        self.stages = [object()] * stages
        self._span = span

    def span_bytes(self, stage_bytes: float) -> float:
        return self._span


@pytest.mark.parametrize(
    ("finer", "default", "taken"),
    [
        ((2, 90.0), (2, 100.0), True),  # shorter by 10 %, no stage more
        ((2, 96.0), (2, 100.0), False),  # within the estimate's noise
        ((3, 50.0), (2, 100.0), False),  # a stage more: TPC-H q02's case
        ((2, 90.0), (3, 100.0), True),  # a stage fewer
    ],
)
def test_the_finer_plan_runs_only_where_it_is_clearly_shorter_and_adds_no_stage(
    finer: tuple[int, float], default: tuple[int, float], taken: bool
) -> None:
    assert _shorter(_Planned(*finer), _Planned(*default), 1.0) is taken  # type: ignore[arg-type]
