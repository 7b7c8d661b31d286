"""A table read again while a query was planned is found, not unknown
(``SchedulerCore._on_catalog``): put back into the catalog between the planner's
look and its error, it was in neither the catalog nor the unreadable tables. For
an EXPLAIN, a result's schema and a submission."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mangonel.catalog import load_table
from mangonel.errors import UnknownTableError
from mangonel.scheduler.core import SchedulerCore
from mangonel.scheduler.state import Limits, SchedulerState


class _Catalog:
    def __init__(self) -> None:
        self.tables: dict[str, Any] = {}

    def snapshot(self) -> Mapping[str, Any]:
        return dict(self.tables)


class _Unreadable:
    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        yield


class _Core:
    def __init__(self) -> None:
        self.catalog = _Catalog()
        self.unreadable = _Unreadable()


def test_a_table_put_back_during_planning_is_planned_again_on_it() -> None:
    core = _Core()
    seen: list[Mapping[str, Any]] = []

    def plan(catalog: Mapping[str, Any]) -> str:
        seen.append(catalog)
        if "kept" not in catalog:
            core.catalog.tables["kept"] = object()  # read again meanwhile
            raise UnknownTableError("table 'kept' is not in the catalog", table="kept")
        return "planned"

    assert SchedulerCore._on_catalog(core, plan) == "planned"  # type: ignore[arg-type]
    assert len(seen) == 2


def test_a_table_that_is_nowhere_stays_unknown() -> None:
    core = _Core()

    def plan(catalog: Mapping[str, Any]) -> str:
        raise UnknownTableError("table 'gone' is not in the catalog", table="gone")

    with pytest.raises(UnknownTableError):
        SchedulerCore._on_catalog(core, plan)  # type: ignore[arg-type]


def test_a_submission_planned_as_its_table_is_put_back_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same race met by a submission, not an EXPLAIN (CI, 2026-12-07:
    # tests/objectstore/test_s3_writes.py, a table read again as the object store
    # came back): ``submit`` planned on its own look at the catalog.
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "kept.parquet")
    core = SchedulerCore(SchedulerState(Limits()))
    core.recover()
    plan = core.plans.plan
    looks: list[bool] = []

    def planned_as_put_back(sql: str, catalog: Mapping[str, Any], *args: Any) -> Any:
        looks.append("kept" in catalog)
        if "kept" not in catalog:
            core.catalog.put(load_table("kept", str(tmp_path / "kept.parquet")))
        return plan(sql, catalog, *args)

    monkeypatch.setattr(core.plans, "plan", planned_as_put_back)
    job = core.submit("SELECT sum(a) AS s FROM kept")
    assert looks == [False, True] and job.plan.columns == ("s",)
