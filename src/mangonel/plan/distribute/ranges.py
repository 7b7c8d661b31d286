"""Key ranges of scan tasks, from the Parquet footers of the row groups they read.

Tables written in the order of a key (TPC-H ``lineitem`` and ``orders`` by order
key, a fact table by time) give each scan task a narrow range of that key. Two
uses: rows equal on a key whose task ranges do not overlap already share a task
(``KeyRanges.clustered_on``: no exchange before an aggregate or a window), and a
table joined on that key can be scanned by each task of the other side, only the
row groups whose range meets the task's (``KeyRanges.range_join``: no exchange,
no stage).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from mangonel.catalog import RowGroup, Table
from mangonel.plan.distribute.costs import BROADCAST_COST, RANGE_COPIES
from mangonel.plan.distribute.keys import column_ref, stripped
from mangonel.plan.distribute.stages import Frag
from mangonel.plan.logical import (
    Filter,
    Join,
    JoinKind,
    Keep,
    Node,
    Project,
    Ref,
    Scan,
    Sort,
    scan_table,
    volatile,
    walk,
)
from mangonel.task import FileSplit, InputMode

Bounds = tuple[Any, Any] | None
"""The smallest and largest value of a column in a task's row groups; None: no rows."""


@dataclass
class Sliced:
    """A fragment to be scanned by another one's tasks, each its own row groups."""

    source: Frag
    splits: tuple[tuple[FileSplit, ...], ...]
    """Per task of the fragment that joins it."""
    equal: dict[Ref, Ref]
    """The source's key column -> the joining fragment's (an inner join's equality)."""

    @property
    def node(self) -> Node:
        return self.source.node


class KeyRanges:
    """Reads the key ranges of a fragment's scan tasks in the catalog's footers."""

    def __init__(self, catalog: Mapping[str, Table]) -> None:
        self._catalog = catalog

    def clustered_on(self, f: Frag, keys: list[exp.Expr]) -> bool:
        """True when some key is a column of the fragment's scan (or made equal to one
        by an inner join) without NULLs whose ranges in the tasks' row groups do not
        overlap: rows equal on it, so on all keys, are read by one task.

        Tables written in the order of a key (TPC-H ``lineitem`` and ``orders`` by
        order key, a fact table by time) group on it without an exchange: q18
        aggregated 6M line items by order in two phases, 1.5M groups crossing a
        shuffle in between, where the scan tasks hold whole orders.
        """
        if f.scan is None or f.tasks < 2 or len(f.splits) != f.tasks:
            return False
        for key in keys:
            ref = column_ref(stripped(key))
            if ref is None:
                continue
            ref = f.equal.get(ref, ref)
            column = _scan_column(f.node, ref)
            if column is None or column[0] is not f.scan:
                continue
            ranges = self._task_ranges(f, column[1], null_free=True)
            if ranges is not None and _disjoint(ranges):
                return True
        return False

    def spans(self, f: Frag, key: exp.Expr) -> list[float] | None:
        """Per task of ``f``, the part of the range of ``key`` over all its table's row
        groups that the task's row groups span (a task of no rows spans none), where
        ``key`` is a column of the fragment's scan with footer ranges; else None.

        A task meets only the values in its span: a table roughly in the key's order
        gives each task a narrow one, where a NULL or an overlap of row groups keeps
        the aggregate from running in place (``clustered_on``).
        """
        if f.scan is None or len(f.splits) != f.tasks:
            return None
        ref = column_ref(stripped(key))
        if ref is None:
            return None
        column = _scan_column(f.node, f.equal.get(ref, ref))
        if column is None or column[0] is not f.scan:
            return None
        ranges = self._task_ranges(f, column[1])
        whole = [g.ranges.get(column[1]) for g in scan_table(self._catalog, f.scan).row_groups]
        if ranges is None or not whole or any(r is None for r in whole):
            return None
        low = min(_number(r[0]) for r in whole if r is not None)
        high = max(_number(r[1]) for r in whole if r is not None)
        if high <= low:
            return None
        return [
            0.0 if r is None else (_number(r[1]) - _number(r[0]) + 1) / (high - low + 1)
            for r in ranges
        ]

    def _task_ranges(self, f: Frag, column: str, null_free: bool = False) -> list[Bounds] | None:
        """Per task of ``f``, the range of its scan's ``column`` over the row groups
        the task reads (``None`` for a task of no rows); ``None`` when a row group's
        footer gives none (or, with ``null_free``, holds NULLs)."""
        assert f.scan is not None
        table = scan_table(self._catalog, f.scan)
        out: list[Bounds] = []
        for split in f.splits:
            low: Any = None
            high: Any = None
            for group in table.groups_of(split):
                r = group.ranges.get(column)
                if r is None or (null_free and r[2]):
                    return None
                low = r[0] if low is None else min(low, r[0])
                high = r[1] if high is None else max(high, r[1])
            out.append(None if low is None else (low, high))
        return out

    def range_join(
        self,
        target: Frag,
        source: Frag,
        target_keys: list[exp.Expr],
        source_keys: list[exp.Expr],
        inner: bool = False,
    ) -> tuple[float, Sliced] | None:
        """Join ``source`` into the tasks of ``target`` by key ranges, if it can be.

        Each task of ``target`` (a scan split into tasks) reads its key column from
        row groups whose footers give that column's range; a row can only meet
        ``source`` rows whose key lies in its task's range, and those lie in the
        row groups of ``source``'s table whose own range of the key overlaps it. So
        each task scans those row groups of ``source`` itself and joins them: no
        exchange, no stage. Any layout gives the right answer (a row group read by
        two tasks only adds rows no key of the other task meets); the layout
        decides the cost: two tables written in the order of the key (TPC-H
        ``lineitem`` and ``orders``) read each row group of ``source`` about once,
        an unordered one reads all of it in every task, like a broadcast.

        ``source`` must be a scan whose rows map one to one to its table's rows
        (filters, projections, joins that keep its side) and whose other inputs
        every task reads whole. Returns the cost (the bytes of ``source`` read
        more than once) and how to join it, or ``None``.

        ``inner``: the join is an inner one, so ``source`` may be the bigger side
        where ``target`` has at least its tasks (below).
        """
        if target.scan is None or target.tasks < 2 or len(target.splits) != target.tasks:
            return None
        if target.tasks < source.tasks or (source.est > target.est and not inner):
            # The bigger side, in more tasks, keeps them; each task builds a hash
            # table of its part of the smaller side (TPC-H q21 joined the kept
            # line items of one nation's suppliers to every line item of their
            # orders, a semi join: 0.37 -> 0.66 s; reduced by keys, they meet a
            # few). An inner join of a filtered scan in more tasks (TPC-H q12's
            # line items, 4 tasks at SF10) with a bigger table in fewer (its
            # orders, 2) joins the table's ranges into those tasks: the other
            # choice broadcasts the filtered scan into the table's tasks, a stage
            # and a barrier more for the same rows hashed and probed.
            return None
        if not _sliceable(source):
            return None
        assert source.scan is not None
        source_table = scan_table(self._catalog, source.scan)
        groups = [g for split in source.splits for g in source_table.groups_of(split)]
        total = sum(g.rows for g in groups)
        if not groups or total == 0:
            return None
        best: tuple[float, Sliced] | None = None
        for tk, sk in zip(target_keys, source_keys, strict=True):
            tref, sref = column_ref(stripped(tk)), column_ref(stripped(sk))
            if tref is None or sref is None:
                continue
            tcol = _scan_column(target.node, tref)
            scol = _scan_column(source.node, sref)
            if tcol is None or scol is None or tcol[0] is not target.scan:
                continue
            if scol[0] is not source.scan:
                continue
            ranges = self._task_ranges(target, tcol[1])
            if ranges is None:
                continue
            per_task = [_overlapping(groups, scol[1], r) for r in ranges]
            read = sum(g.rows for task in per_task for g in task) / total
            if read - 1.0 > RANGE_COPIES * (target.tasks - 1):
                continue  # about a broadcast: the planner's other choices know its costs
            whole = sum(
                scan_table(self._catalog, s).column_bytes(s.columns) for s, _ in source.side_scans
            )
            cost = BROADCAST_COST * (
                source.est * max(0.0, read - 1.0) + whole * max(0, target.tasks - source.tasks)
            )
            if best is None or cost < best[0]:
                splits = tuple(source_table.split_of(task) for task in per_task)
                best = (cost, Sliced(source, splits, {sref: tref}))
        return best


def join_sliced(target: Frag, sliced: Sliced) -> None:
    """Make ``target``'s tasks scan their row groups of ``sliced.source``."""
    source = sliced.source
    assert source.scan is not None
    target.side_scans += [(source.scan, sliced.splits), *source.side_scans]
    target.inputs.update(source.inputs)
    target.subqueries.update(source.subqueries)
    target.equal.update(sliced.equal)


def note_equal(f: Frag, scan_keys: list[exp.Expr], other_keys: list[exp.Expr]) -> None:
    """Record that an inner join made the other side's key columns equal to ``f``'s."""
    for a, b in zip(scan_keys, other_keys, strict=True):
        ra, rb = column_ref(stripped(a)), column_ref(stripped(b))
        if ra is not None and rb is not None:
            f.equal[rb] = f.equal.get(ra, ra)


def in_key_order(node: Node, ref: Ref, catalog: Mapping[str, Table]) -> bool:
    """True when ``ref`` carries a column of a scan under ``node`` whose table's row
    groups hold disjoint ranges of it: the table is written in that column's order,
    so its scan tasks hold whole runs of each value (an aggregate on it runs in
    place, a join on it by key range)."""
    found = _scan_column(node, ref)
    if found is None:
        return False
    scan, column = found
    groups = scan_table(catalog, scan).row_groups
    ranges: list[Bounds] = []
    for g in groups:
        r = g.ranges.get(column)
        if r is None:
            return False
        ranges.append((r[0], r[1]))
    return len(ranges) > 1 and _disjoint(ranges)


def _number(value: Any) -> float:
    """An integer or a date of a footer's range as a number: days for a date."""
    return float(value.toordinal()) if hasattr(value, "toordinal") else float(value)


def _disjoint(ranges: list[Bounds]) -> bool:
    """True when no two of the ranges share a value."""
    known = sorted((r for r in ranges if r is not None), key=lambda r: r[0])
    try:
        return all(a[1] < b[0] for a, b in itertools.pairwise(known))
    except TypeError:  # values of different kinds
        return False


def _overlapping(groups: list[RowGroup], column: str, bounds: Bounds) -> list[RowGroup]:
    """The row groups whose ``column`` may hold a value within ``bounds`` (groups
    without a range of it may hold any); at least one: a task of no rows still
    needs the table's columns, and rows it cannot meet change nothing."""
    if bounds is None:
        return groups[:1]
    low, high = bounds
    kept = []
    for g in groups:
        r = g.ranges.get(column)
        try:
            if r is None or (r[1] >= low and r[0] <= high):
                kept.append(g)
        except TypeError:  # values of different kinds: keep it
            kept.append(g)
    return kept or groups[:1]


def _sliceable(f: Frag) -> bool:
    """True when ``f`` is a scan whose rows come one each from rows of its table
    (``KeyRanges.range_join``): filtered, projected, joined only where its side
    is kept, every other input read whole by each task."""
    if f.scan is None or f.hash_keys is not None or not f.splits:
        return False
    if f.subqueries:
        return False  # each task that read it would compute them again
    if volatile(f.node):
        return False  # a row group read by two tasks would be two draws of ``random()``
    if any(i.mode is not InputMode.ALL for i in f.inputs.values()):
        return False
    if any(len(splits) != 1 for _, splits in f.side_scans):
        return False
    node = f.node
    while node is not f.scan:
        if isinstance(node, (Filter, Project, Keep)):
            node = node.child
        elif isinstance(node, Join):
            on_left = any(x is f.scan for x in walk(node.left))
            if on_left and node.kind in (
                JoinKind.INNER,
                JoinKind.CROSS,
                JoinKind.LEFT,
                JoinKind.SEMI,
                JoinKind.ANTI,
            ):
                node = node.left
            elif not on_left and node.kind in (JoinKind.INNER, JoinKind.CROSS):
                node = node.right
            else:
                return False
        else:
            return False
    return True


def _scan_column(node: Node, ref: Ref) -> tuple[Scan, str] | None:
    """The scan and its column whose values ``ref`` carries unchanged (through
    filters, projections that pass a column on, inner joins and the kept side of
    other joins), if any; stage reads end the search."""
    while True:
        if isinstance(node, Scan):
            return (node, ref[1]) if node.alias == ref[0] and ref[1] in node.columns else None
        if isinstance(node, (Filter, Sort, Keep)):
            node = node.child
        elif isinstance(node, Project):
            if node.qualifier != ref[0]:
                return None
            items = dict(node.items)
            inner = column_ref(items[ref[1]]) if ref[1] in items else None
            if inner is None:
                return None
            node, ref = node.child, inner
        elif isinstance(node, Join):
            sides = [c for c in (node.left, node.right) if ref in c.outputs()]
            if len(sides) != 1 or ref not in node.outputs():
                return None
            kept = {JoinKind.INNER, JoinKind.CROSS}
            if sides[0] is node.left:
                kept |= {JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI}
            if node.kind not in kept:
                return None  # NULLs where no row matched
            node = sides[0]
        else:
            return None
