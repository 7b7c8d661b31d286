"""Plan-time dynamic pruning: a table's row groups dropped by the key range of a small
filtered dimension it joins.

TPC-DS writes ``inventory`` and ``catalog_sales`` in date order: each row group holds
a week or two of ``inv_date_sk``. q21 joins ``inventory`` (96 row groups, 11.7M rows)
with the 61 days of ``date_dim`` around 2000-03-11. Those days' ``d_date_sk`` lie in
four of the row groups; DuckDB skips the others inside each task (its join filter),
but the planner sized the scan from all 96: three tasks on two slots, two waves, and
estimates 20 times too big. Here the dimension's key range is evaluated on its real
rows while planning (``probe``), and the row groups whose footer range of the join
key lies outside it are dropped from the scan before tasks are sized: one task.

When a row may be dropped: the scan's rows reach an inner or semi join on
``fact_key = dim_key`` through filters, projections that pass the key on, inner
joins and the kept side of other joins, and no node on the way is read by another
parent (a shared CTE: its other readers need every row). A row whose key is outside
the range of the dimension's keys, or NULL, meets no dimension row, and every row
made from it carries its key to the join, which drops it. An outer join that keeps
the fact side never lets the rule apply (its rows stay, with NULLs).

When the dimension is evaluated: it is a scan of a table of at most
``DIMENSION_BYTES`` (the columns it reads, from the footers) under filters and
projections, with a filter somewhere, whose every expression is deterministic (an
allow-list: ``random()`` or ``current_date`` must not decide which rows a plan can
ever read, and a cached plan would keep the answer) and reads no subquery. And only
where the footers and estimates say pruning could drop something: two row groups
of the table hold disjoint ranges of the key (``could_drop``: a table whose every
row group spans every key, as ``store_sales``, is never evaluated), and the
dimension's filters keep at most ``DIMENSION_KEEPS`` of its rows.

At least one row group is kept: the scan's columns keep their types, and rows that
no dimension row meets change nothing (an empty filtered dimension, an empty join).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlglot import exp

from mangonel.catalog import RowGroup, Table
from mangonel.plan.estimate import Estimator
from mangonel.plan.fragment import Renderer
from mangonel.plan.logical import (
    Filter,
    Join,
    JoinGroup,
    JoinKind,
    Keep,
    Node,
    Project,
    Pruned,
    Ref,
    Scan,
    phys,
    walk_once,
)
from mangonel.plan.probe import RELATION, FileIdentity, KeyRange

DIMENSION_BYTES = 8 * 1024 * 1024
"""The biggest dimension evaluated while planning: in-memory bytes of the columns its
scan reads, from the footers. Reading and filtering that much takes a few
milliseconds on one thread, on every plan that misses the probe's cache; TPC-DS's
``date_dim`` reads 0.6 to 1.2 MB (two to four columns of 73k rows) at any scale.
Bigger is a fact table in its own right (TPC-H's ``orders`` at SF1, 18 MB of two
columns, filtered by date: its keys span the whole of ``lineitem`` anyway)."""

DIMENSION_KEEPS = 0.25
"""The largest fraction of a dimension's rows its filters may keep, by the estimates,
for it to be evaluated. A filter that keeps most of a dimension keeps keys from all
over its range, unless it is correlated with the key (dates are: ``d_year = 2000``
keeps 1/200 of ``date_dim``, one run of its keys). TPC-DS q18's customers born in
six months of the twelve (half of them) were evaluated for nothing: their
``c_current_cdemo_sk`` span all of ``customer_demographics`` (0.1 s on a first plan,
reading 100k customers)."""

DETERMINISTIC = (
    exp.Connector,  # AND, OR: sqlglot's functions too
    exp.Cast,
    exp.TryCast,
    exp.Case,
    exp.If,
    exp.Coalesce,
    exp.Nullif,
    exp.Abs,
    exp.Round,
    exp.Floor,
    exp.Ceil,
    exp.Upper,
    exp.Lower,
    exp.Length,
    exp.Substring,
    exp.Trim,
    exp.Concat,
    exp.Extract,
    exp.Year,
    exp.Month,
    exp.Day,
    exp.DateAdd,
    exp.DateSub,
    exp.DateDiff,
    exp.DateTrunc,
    exp.Greatest,
    exp.Least,
)
"""The functions a dimension's filter may call to be evaluated while planning (any
operator may be used: comparisons, arithmetic, AND/OR/NOT, IN lists, LIKE, BETWEEN,
IS NULL). Whatever else, an unknown function included, stops the rule."""


class RangeSource(Protocol):
    """Where the rule gets a filtered dimension's key range (``probe.Probe``)."""

    def key_range(
        self, table: Table, columns: Sequence[str], sql: str, key: str
    ) -> KeyRange | None:
        """The range of column ``key`` of ``sql`` over ``columns`` of ``table``; None
        when it cannot be known."""
        ...


@dataclass(frozen=True)
class Candidate:
    """A scan whose rows meet a filtered dimension on one key, and that dimension."""

    fact: Scan
    fact_column: str
    dimension: Node
    """The dimension's side of the join: a scan under filters and projections."""
    dim_scan: Scan
    dim_key: Ref
    """The key among ``dimension``'s outputs."""
    dim_column: str
    """The key's column in the dimension's table."""


def prune_row_groups(
    roots: list[Node], catalog: Mapping[str, Table], source: RangeSource | None
) -> tuple[FileIdentity, ...]:
    """Set ``Scan.pruned`` on the scans under ``roots`` (the query and its subqueries)
    whose row groups a filtered dimension's key range rules out. Returns the files
    of the dimensions that pruned something, as they were read: the plan holds only
    while they are the same (``DistributedPlan.pruned_by``)."""
    if source is None:
        return ()
    read: dict[FileIdentity, None] = {}
    kept: dict[int, tuple[Scan, set[int], list[str]]] = {}
    for c in candidates(roots, catalog):
        table = catalog[c.fact.table]
        dim_table = catalog[c.dim_scan.table]
        sql = Renderer({id(c.dim_scan): RELATION}).render(c.dimension)
        found = source.key_range(dim_table, c.dim_scan.columns, sql, phys(c.dim_key))
        if found is None:
            continue
        ids = {id(g) for g in kept_groups(table.row_groups, c.fact_column, found)}
        if len(ids) == len(table.row_groups):
            continue
        entry = kept.setdefault(id(c.fact), (c.fact, set(range(len(table.row_groups))), []))
        entry[1].intersection_update(i for i, g in enumerate(table.row_groups) if id(g) in ids)
        entry[2].append(_reason(c, found))
        read.update(dict.fromkeys(found.files))
    for scan, indexes, reasons in kept.values():
        table = catalog[scan.table]
        groups = [g for i, g in enumerate(table.row_groups) if i in indexes]
        groups = groups or [min(table.row_groups, key=lambda g: g.rows)]
        dropped = len(table.row_groups) - len(groups)
        why = f"{dropped} of {len(table.row_groups)} row groups dropped at plan time: " + "; ".join(
            reasons
        )
        scan.pruned = Pruned(narrowed(table, groups), why)
    return tuple(read)


def _reason(c: Candidate, found: KeyRange) -> str:
    dim = f"{c.dim_scan.table}'s {c.dim_column}"
    if found.keys == 0:
        return f"{dim} is empty after its filter"
    return f"{c.fact_column} outside {dim} range {found.low}..{found.high} after its filter"


def candidates(roots: list[Node], catalog: Mapping[str, Table]) -> Iterator[Candidate]:
    """The scans a filtered dimension may prune, and those dimensions (pure: footers
    and the plan only)."""
    parents = _parents(roots)
    estimator = Estimator(catalog)
    for node in walk_once(roots):
        for fact_side, fact_ref, dim_side, dim_ref in _equalities(node):
            fact = _fact_column(fact_side, fact_ref, parents)
            if fact is None or not could_drop(catalog[fact[0].table].row_groups, fact[1]):
                continue
            dim = _dimension(dim_side, dim_ref)
            if dim is None or dim[0] is fact[0]:
                continue
            dim_scan, dim_column = dim
            dim_table = catalog[dim_scan.table]
            if dim_table.text is not None:
                continue  # the probe reads Parquet only; a CSV or JSON dimension prunes nothing
            if dim_table.column_bytes(dim_scan.columns) > DIMENSION_BYTES:
                continue
            if estimator.size(dim_side).rows > DIMENSION_KEEPS * max(1, dim_table.rows):
                continue
            yield Candidate(fact[0], fact[1], dim_side, dim_scan, dim_ref, dim_column)


def _parents(roots: list[Node]) -> dict[int, int]:
    """How many times each node is read (a shared CTE's node: once per reader)."""
    count: dict[int, int] = {}
    for node in walk_once(roots):
        for child in node.children():
            count[id(child)] = count.get(id(child), 0) + 1
    return count


def _equalities(node: Node) -> Iterator[tuple[Node, Ref, Node, Ref]]:
    """(fact side, its key, dimension side, its key) for each equality of two columns
    that ``node`` joins on and that drops the fact side's rows without a match: an
    inner join's either way, a semi join's with the fact on its kept (left) side."""
    if isinstance(node, JoinGroup):
        for cond in node.conditions:
            pair = _column_pair(cond)
            if pair is None:
                continue
            a, b = pair
            side_a = next((i for i in node.inputs if a in i.outputs()), None)
            side_b = next((i for i in node.inputs if b in i.outputs()), None)
            if side_a is None or side_b is None or side_a is side_b:
                continue
            yield side_a, a, side_b, b
            yield side_b, b, side_a, a
    elif isinstance(node, Join) and node.kind in (JoinKind.INNER, JoinKind.SEMI):
        for lk, rk in zip(node.left_keys, node.right_keys, strict=True):
            left, right = _column(lk), _column(rk)
            if left is None or right is None:
                continue
            yield node.left, left, node.right, right
            if node.kind is JoinKind.INNER:
                yield node.right, right, node.left, left


def _column_pair(cond: exp.Expr) -> tuple[Ref, Ref] | None:
    while isinstance(cond, exp.Paren):
        cond = cond.this
    if not isinstance(cond, exp.EQ):
        return None
    a, b = _column(cond.this), _column(cond.expression)
    return (a, b) if a is not None and b is not None else None


def _column(e: exp.Expr) -> Ref | None:
    """A bare column (no cast: a cast may order values otherwise than the footers)."""
    while isinstance(e, exp.Paren):
        e = e.this
    return (e.table, e.name) if isinstance(e, exp.Column) and e.table else None


def _fact_column(node: Node, ref: Ref, parents: Mapping[int, int]) -> tuple[Scan, str] | None:
    """The scan and column whose values ``ref`` carries unchanged, where every row of
    that scan reaches ``node``'s output only with its value there (filters,
    projections that pass it on, inner joins, the kept side of outer, semi and anti
    joins), and no node on the way has another reader."""
    while True:
        if parents.get(id(node), 0) > 1:
            return None
        if isinstance(node, Scan):
            return (node, ref[1]) if node.alias == ref[0] and ref[1] in node.columns else None
        if isinstance(node, (Filter, Keep)):
            node = node.child
        elif isinstance(node, Project):
            inner = _passed(node, ref)
            if inner is None:
                return None
            node, ref = node.child, inner
        elif isinstance(node, JoinGroup):
            sides = [i for i in node.inputs if ref in i.outputs()]
            if len(sides) != 1:
                return None
            node = sides[0]
        elif isinstance(node, Join):
            if ref in node.left.outputs() and ref not in node.right.outputs():
                if node.kind not in (
                    JoinKind.INNER,
                    JoinKind.CROSS,
                    JoinKind.LEFT,
                    JoinKind.SEMI,
                    JoinKind.ANTI,
                ):
                    return None
                node = node.left
            elif ref in node.right.outputs() and ref not in node.left.outputs():
                if node.kind not in (JoinKind.INNER, JoinKind.CROSS):
                    return None  # the NULL-filled side of an outer join
                node = node.right
            else:
                return None
        else:
            # An aggregate, a window, a LIMIT, a set operation: rows there depend
            # on rows the join would drop.
            return None


def _passed(node: Project, ref: Ref) -> Ref | None:
    """The child's column a projection passes on unchanged as ``ref``, if any."""
    if node.qualifier != ref[0]:
        return None
    item = dict(node.items).get(ref[1])
    return _column(item) if item is not None else None


def _dimension(node: Node, ref: Ref) -> tuple[Scan, str] | None:
    """The scan and column of a dimension side the planner may evaluate (see the
    module's doc), and ``ref``'s column in it."""
    filtered = False
    while True:
        if isinstance(node, Scan):
            if node.filter is not None:
                filtered = filtered or True
                if not deterministic(node.filter):
                    return None
            if node.alias != ref[0] or ref[1] not in node.columns or not filtered:
                return None
            return node, ref[1]
        if isinstance(node, Filter):
            if not deterministic(node.condition):
                return None
            filtered = True
            node = node.child
        elif isinstance(node, Keep):
            node = node.child
        elif isinstance(node, Project):
            if not all(deterministic(e) for _, e in node.items):
                return None
            inner = _passed(node, ref)
            if inner is None:
                return None
            node, ref = node.child, inner
        else:
            return None


def deterministic(e: exp.Expr) -> bool:
    """True when ``e`` gives the same answer on the same row every time, and reads
    nothing but the row: its functions are all in ``DETERMINISTIC`` and it holds no
    subquery (a placeholder's table, a SELECT)."""
    for node in e.walk():
        if isinstance(node, (exp.Table, exp.Query, exp.Subquery, exp.Placeholder)):
            return False
        if isinstance(node, exp.Func) and not isinstance(node, DETERMINISTIC):
            return False
    return True


def could_drop(groups: Sequence[RowGroup], column: str) -> bool:
    """True when some key range could drop row groups of a table: two of its row
    groups hold ranges of ``column`` that do not overlap (a table roughly in the
    key's order). Where every row group spans a common value, as in a table of no
    order, no dimension is evaluated for it."""
    known = [r for r in (g.ranges.get(column) for g in groups) if r is not None]
    if len(known) < 2:
        return False
    try:
        return bool(max(r[0] for r in known) > min(r[1] for r in known))  # type: ignore[operator]
    except TypeError:  # values of different kinds
        return False


def kept_groups(groups: Sequence[RowGroup], column: str, found: KeyRange) -> list[RowGroup]:
    """The row groups whose ``column`` may hold a key in ``found``: those whose footer
    range meets it, and those without a range (NULLs only, or no statistics). At
    least one (see the module's doc)."""
    low, high = found.low, found.high
    if found.keys == 0 or low is None or high is None:
        kept: list[RowGroup] = []
    else:
        kept = [g for g in groups if _may_meet(g, column, low, high)]
    return kept or [min(groups, key=lambda g: g.rows)] if groups else []


def _may_meet(group: RowGroup, column: str, low: object, high: object) -> bool:
    r = group.ranges.get(column)
    if r is None:
        return True
    try:
        return bool(r[1] >= low and r[0] <= high)  # type: ignore[operator]
    except TypeError:  # values of different kinds: keep it
        return True


def narrowed(table: Table, groups: Sequence[RowGroup]) -> Table:
    """``table`` with only ``groups``, its statistics narrowed to them: each integer
    and date column's range from their footers, NULL counts in proportion to the
    rows (none where no kept row group holds one). Widths and dictionary sizes stay.
    """
    rows = sum(g.rows for g in groups)
    stats = {}
    for name, st in table.stats.items():
        ranges = [g.ranges.get(name) for g in groups]
        low, high, nulls = st.low, st.high, round(st.nulls * rows / max(1, table.rows))
        if ranges and all(r is not None for r in ranges):
            known = [r for r in ranges if r is not None]
            with contextlib.suppress(TypeError):  # values of different kinds: the table's
                low, high = min(r[0] for r in known), max(r[1] for r in known)
            if not any(r[2] for r in known):
                nulls = 0
        stats[name] = dataclasses.replace(st, low=low, high=high, nulls=nulls)
    return dataclasses.replace(table, row_groups=tuple(groups), stats=stats)
