"""The scheduler's cache of recent plans (``plan.planner.PlanCache``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import tpch_query

from mangonel.catalog import Table, load_table
from mangonel.errors import QueryError
from mangonel.plan.planner import PlanCache, PlannerConfig


def test_the_same_query_against_the_same_tables_is_planned_once(
    catalog: dict[str, Table],
) -> None:
    cache = PlanCache()
    first = cache.plan(tpch_query(3), catalog)
    assert cache.plan(tpch_query(3), dict(catalog)) is first
    assert (cache.hits, cache.misses) == (1, 1)
    # another dialect, other settings, other text: planned on their own
    assert cache.plan(tpch_query(3), catalog, dialect="postgres") is not first
    assert cache.plan(tpch_query(3), catalog, PlannerConfig(partitions=3)) is not first
    assert cache.plan(tpch_query(3) + " ", catalog) is not first
    assert (cache.hits, cache.misses) == (1, 4)


def test_a_table_registered_again_or_dropped_makes_plans_anew(
    catalog: dict[str, Table], tpch_dir: Path
) -> None:
    cache = PlanCache()
    first = cache.plan(tpch_query(3), catalog)
    again = {**catalog, "orders": load_table("orders", str(tpch_dir / "orders.parquet"))}
    second = cache.plan(tpch_query(3), again)
    assert second is not first and second == first  # the same files: the same plan
    smaller = {name: t for name, t in again.items() if name != "region"}
    assert cache.plan(tpch_query(3), smaller) is not second
    assert cache.misses == 3


def test_the_least_recently_used_plan_goes_first(catalog: dict[str, Table]) -> None:
    cache = PlanCache(size=2)
    one, two = cache.plan(tpch_query(1), catalog), cache.plan(tpch_query(6), catalog)
    assert cache.plan(tpch_query(1), catalog) is one
    cache.plan(tpch_query(12), catalog)  # evicts q6, the least recently used
    assert cache.plan(tpch_query(1), catalog) is one
    assert cache.plan(tpch_query(6), catalog) is not two
    none = PlanCache(size=0)
    assert none.plan(tpch_query(1), catalog) is not none.plan(tpch_query(1), catalog)


def test_a_query_that_fails_to_plan_fails_every_time(catalog: dict[str, Table]) -> None:
    cache = PlanCache()
    for _ in range(2):
        with pytest.raises(QueryError, match="nosuchtable"):
            cache.plan("SELECT * FROM nosuchtable", catalog)
    assert cache.misses == 2 and cache.hits == 0


def test_plans_are_immutable_and_safe_to_share(catalog: dict[str, Table]) -> None:
    plan = PlanCache().plan(tpch_query(3), catalog)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.stages[0].sql = "SELECT 1"  # type: ignore[misc]
    assert isinstance(plan.stages, tuple)
