"""Exact row counts of tiny tables under their filters, for the estimates.

The footers say little about a table of a few rows: TPC-H's ``region`` has five,
and its ``r_name`` column's dictionary page (compressed) made the estimate of
``r_name = 'ASIA'`` 2.2 rows where one passes. That error multiplies through every
join the region cuts (q5's suppliers and customers, at SF10 the choice of what
``lineitem`` meets first). A table this small is cheaper to evaluate than to
guess: ``Tiny`` counts its rows under the scan's filter with the plan-time probe
(``probe.Probe.count``), and the estimates take that count
(``estimate.Estimator``).

Only a Parquet table of at most ``EXACT_ROWS`` rows, under a filter whose every
expression is deterministic (``dynamic_pruning.deterministic``: no subquery, no
``random()``). Anything else, or a count the probe cannot give, keeps the
footers' estimate. The count only steers the plan: the answer never depends on
it, so a table changed since (a cached plan) costs speed, not correctness.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from mangonel.catalog import Table
from mangonel.plan.dynamic_pruning import deterministic
from mangonel.plan.fragment import Renderer
from mangonel.plan.logical import Scan
from mangonel.plan.probe import RELATION

EXACT_ROWS = 1_000
"""The most rows a table may have to be counted exactly while planning: TPC-H's
``region`` (5) and ``nation`` (25); TPC-DS's ``store``, ``warehouse``,
``ship_mode``, ``reason``, ``income_band``, ``call_center``, ``web_site``,
``web_page`` and ``promotion`` (at most 300 at SF1). A count over them takes well
under a millisecond once read, and the probe keeps the columns."""


class Counter(Protocol):
    """Where the counts come from (``probe.Probe``)."""

    def count(self, table: Table, columns: list[str], sql: str) -> int | None:
        """The rows of ``sql`` over ``columns`` of ``table``; None when unknown."""
        ...


class Tiny:
    """Exact rows of filtered scans of tiny tables (``estimate.ExactRows``)."""

    def __init__(self, catalog: Mapping[str, Table], counter: Counter) -> None:
        self._catalog = catalog
        self._counter = counter
        self._known: dict[int, tuple[Scan, object, int | None]] = {}
        """By the scan's ``id``, with the scan and its filter as counted: the binder
        grows a scan's filter while it pushes conditions, and the count of an older
        filter is stale. Both held, so their ids are not reused."""

    def rows(self, scan: Scan, table: Table) -> int | None:
        """The rows of ``table`` that pass ``scan``'s filter, where it is counted
        exactly (see the module's doc); else None."""
        if scan.filter is None or table.rows > EXACT_ROWS or table.text is not None:
            return None
        if not table.files:
            return 0  # an empty table (the scheduler's warm-up plans over one)
        known = self._known.get(id(scan))
        if known is not None and known[0] is scan and known[1] is scan.filter:
            return known[2]
        count = None
        if deterministic(scan.filter):
            sql = Renderer({id(scan): RELATION}).render(scan)
            count = self._counter.count(table, list(scan.columns), sql)
        self._known[id(scan)] = (scan, scan.filter, count)
        return count
