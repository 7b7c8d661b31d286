"""A table read again while a query was planned is found, not unknown
(``SchedulerCore._on_catalog``): put back into the catalog between the planner's
look and its error, it was in neither the catalog nor the unreadable tables."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from mangonel.errors import UnknownTableError
from mangonel.scheduler.core import SchedulerCore


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
