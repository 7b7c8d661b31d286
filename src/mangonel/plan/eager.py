"""Eager aggregation: a partial aggregate under the join that brings the wide group keys.

TPC-DS's ``year_total`` (q04, q11) joins 2.9M ``store_sales`` rows with ``customer``
and groups them by seven of the customer's columns (ids, names, e-mail: strings)
and the year. The hash aggregate over those wide keys was three quarters of its
task (0.67 of 0.89 s, DuckDB's profile). Grouped first by the customer's key and
the year (two integers), the sales become about 190k partial rows; only those
meet ``customer``, and the aggregate over the wide keys merges them:

    Aggregate[c_id, c_name, ..., d_year](sales ⋈ date_dim ⋈ customer)
    ->
    Aggregate[c_id, c_name, ..., d_year](
        Aggregate*[ss_customer_sk, d_year](sales ⋈ date_dim) ⋈ customer)

DuckDB's own ``partial_aggregate_pushdown`` does this, but whatever the sizes:
it grouped TPC-H q18's 3M lineitem rows before a join that keeps 217 of them, so
it is off in the executors (``executor.databases``) and the planner decides here,
from the estimates.

The inner aggregate (``Aggregate.local``) may run in each task over the rows it
has, without an exchange: the outer one merges partial rows (a SUM of SUMs, of
COUNTs, a MIN of MINs), so it is right however many partial rows a group has.

The join may be a LEFT join that keeps the dimension's rows (TPC-H q13: every
customer, with its orders counted): a dimension row no fact row met is one row of
NULLs either way, which adds nothing to an aggregate of a fact column, and whose
COUNT the final aggregate makes 0 again.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping

from sqlglot import exp

from mangonel.catalog import Table
from mangonel.plan.distribute.aggregates import split_aggs
from mangonel.plan.distribute.ranges import in_key_order
from mangonel.plan.estimate import Estimator
from mangonel.plan.logical import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    JoinKind,
    Node,
    Project,
    Ref,
    Scan,
    SetKind,
    SetOp,
    scan_table,
    walk,
    walk_once,
)
from mangonel.sql.exprs import col, has_placeholder, substitute

KEY_REPEATS = 4
"""The fact side's join key must repeat this many times on average (its distinct
values at most its rows / 4): each partial row then stands for several rows, and
a key near unique (an order's number) would group without reducing."""

WIDE_KEYS = 8
"""... unless the aggregate's keys are at least this many times as wide as the
partial aggregate's (its fact-side keys and the join key): grouping each fact row
by one narrow key then costs a fraction of grouping it by the wide ones, so the
partial aggregate pays for itself even where the key barely repeats. TPC-H q10's
shape, DuckDB on one thread (line items grouped by six of the customer's columns,
strings among them, and the nation's name, or first by the customer's key): 0.058
and 0.055 s with each key once, 0.065 and 0.063 s at 1.4 rows a key, 0.114 and
0.070 s at 4.6. The estimates are rough there: q10's 115k line items of 38k
customers (3.0 a key) are estimated as 77k of 57k (1.3)."""

NARROWER = 0.5
"""Where the aggregate groups by some of the fact side's columns, the partial
aggregate's keys (those and its join key) must be at most half as wide as the
aggregate's: the point is to group by narrow keys. TPC-H q10 groups by six
customer columns and a nation's name over a join with ``nation``: grouped first by
the customer's columns and nation key, it would group by wide keys twice. Grouped
by the join key alone, each fact row is grouped once, by one key, as the aggregate
would have; the join and the aggregate above then meet a row per key and task
(TPC-H q13: 1.5M orders, 100k customers who have some)."""

MIN_DIMENSION_ROWS = 1000
"""The dimension must have at least this many rows (estimated): a few rows (TPC-DS
q66's 5 warehouses) make a few groups, whose wide keys a hash aggregate handles
cheaply, and a join with them costs little; grouping early measured no faster."""

JOIN_KEEPS = 0.5
"""The join must keep at least this fraction of the fact side's rows (estimated):
a join that drops most of them (q18's 57 orders) is cheaper before the grouping."""


def aggregate_early(roots: list[Node], estimator: Estimator, catalog: Mapping[str, Table]) -> int:
    """Rewrite, in place, each aggregate under ``roots`` (the query and its
    subqueries) that groups by a dimension's columns over a join to that
    dimension on its unique key; returns how many were rewritten.

    In place, so that an aggregate read by two parents (a CTE read twice) stays
    one node: its outputs do not change, only what it reads.
    """
    names = itertools.count(1)
    done = 0
    for node in walk_once(roots):  # into the nodes a rewrite puts under ``node``, too
        if isinstance(node, Aggregate) and (
            _rewrite(node, estimator, catalog, names) or _through_union(node, names)
        ):
            done += 1
    return done


def _refs(e: exp.Expr) -> set[Ref]:
    return {(c.table, c.name) for c in e.find_all(exp.Column) if c.table}


def _rewrite(
    agg: Aggregate, estimator: Estimator, catalog: Mapping[str, Table], names: Iterator[int]
) -> bool:
    """Group ``agg``'s input early when it is a join with one key, each group
    expression reads one side (or none), the aggregates read only the fact side
    and split into partial and final (``split_aggs``), and the sizes say it pays
    (``NARROWER``, ``_worth_it``). Either side of an inner join may be the fact
    side; the right side of a LEFT join, where each aggregate reads one column of
    it (``_of_a_column``). Not where the partial aggregate would group by the join
    key alone and the fact table is written in its order (``_in_key_order``).

    The join may also lie under other inner joins that read none of the fact
    side's columns (``_join_paths``): TPC-H q10 groups its line items by six
    columns of ``customer`` and the name of the customer's nation, joined above.
    The partial aggregate then takes the fact side's place in its join, and
    everything else in the tree of joins is the dimension's."""
    top = agg.child
    if agg.grouping is not None or agg.local or not agg.groups or not isinstance(top, Join):
        return False
    split = split_aggs(agg.aggs)
    if split is None:
        return False
    partial_items, final_of = split
    widths = _Widths(top, catalog)
    wide = sum(widths.of(e) for _, e in agg.groups)
    for path in _join_paths(top):
        join = path[-1]
        if (
            join.kind not in (JoinKind.INNER, JoinKind.LEFT)
            or join.residual is not None
            or len(join.left_keys) != 1
        ):
            continue
        outer = join.kind is JoinKind.LEFT
        sides = (
            (join.left, join.right, join.left_keys[0], join.right_keys[0], True),
            (join.right, join.left, join.right_keys[0], join.left_keys[0], False),
        )
        # A LEFT join keeps every row of the dimension (its left side); the fact
        # side must be the one it extends with NULLs.
        for fact, dim, fact_key, dim_key, fact_left in sides[1:] if outer else sides:
            fact_refs = set(fact.outputs())
            dim_refs = set(top.outputs()) - fact_refs
            if not all(_refs(a) <= fact_refs for _, a in agg.aggs):
                continue
            if outer and not all(_of_a_column(a) for _, a in agg.aggs):
                continue
            if any(_refs(c) & fact_refs for j in path[:-1] for c in _conditions(j)):
                continue  # a join above reads the fact side's columns
            # Each group expression is the fact side's, the dimension's or a constant.
            sides_of = [_side(e, fact_refs, dim_refs) for _, e in agg.groups]
            if "dim" not in sides_of or None in sides_of:
                continue
            on_fact = [s == "fact" for s in sides_of]
            narrow = sum(widths.of(e) for (_, e), f in zip(agg.groups, on_fact, strict=True) if f)
            if narrow and narrow + widths.of(fact_key) > NARROWER * wide:
                continue
            if not narrow and _in_key_order(fact, fact_key, catalog):
                continue
            repeats = 1 if wide >= WIDE_KEYS * (narrow + widths.of(fact_key)) else KEY_REPEATS
            if not _worth_it(estimator, join, fact, dim, fact_key, dim_key, repeats):
                continue
            qualifier = f"_ea{next(names)}"
            groups: list[tuple[str, exp.Expr]] = []
            for (_, e), f in zip(agg.groups, on_fact, strict=True):
                if f and e not in [g for _, g in groups]:
                    groups.append((f"g{len(groups)}", e.copy()))
            key_name = next((n for n, g in groups if g == fact_key), None)
            if key_name is None:
                key_name = f"g{len(groups)}"
                groups.append((key_name, fact_key.copy()))
            inner = Aggregate(fact, qualifier, groups, partial_items, local=True)
            key = col((qualifier, key_name))
            early = (
                Join(inner, dim, join.kind, [key], [dim_key.copy()])
                if fact_left
                else Join(dim, inner, join.kind, [dim_key.copy()], [key])
            )
            agg.child = _replaced(path, early)
            by_expr = {g: n for n, g in groups}
            agg.groups = [
                (name, col((qualifier, by_expr[e])) if f else e)
                for (name, e), f in zip(agg.groups, on_fact, strict=True)
            ]
            agg.aggs = [
                (
                    name,
                    _zero_if_unmatched(a, final_of(name, qualifier))
                    if outer
                    else final_of(name, qualifier),
                )
                for name, a in agg.aggs
            ]
            return True
    return False


def _join_paths(top: Join) -> Iterator[list[Join]]:
    """``[top]``, then each path from ``top`` down through inner joins to a join
    under it: a fact side under those joins may be grouped in its place, the
    inner joins above passing each of its rows on once per row they meet."""
    yield [top]
    if top.kind is not JoinKind.INNER:
        return
    for child in (top.left, top.right):
        if isinstance(child, Join):
            for path in _join_paths(child):
                yield [top, *path]


def _conditions(join: Join) -> list[exp.Expr]:
    """What a join reads of its inputs' columns."""
    return [*join.left_keys, *join.right_keys, *([join.residual] if join.residual else [])]


def _replaced(path: list[Join], new: Join) -> Join:
    """The top of ``path`` with its last join replaced by ``new``; the joins between
    are copies (the originals may be read elsewhere: a view read twice)."""
    for parent, old in zip(reversed(path[:-1]), reversed(path[1:]), strict=True):
        side = "left" if parent.left is old else "right"
        new = dataclasses.replace(parent, **{side: new})
    return new


def _in_key_order(fact: Node, key: exp.Expr, catalog: Mapping[str, Table]) -> bool:
    """True when the fact side's table is written in the order of the join key: its
    scan tasks then join the dimension by key range and aggregate in place, no
    exchange at all (``distribute.ranges``), which an aggregate between the scan
    and the join would stop."""
    return isinstance(key, exp.Column) and in_key_order(fact, (key.table, key.name), catalog)


def _of_a_column(a: exp.Expr) -> bool:
    """True for an aggregate of one column (``COUNT(o_orderkey)``, ``SUM(x)``):
    NULL in a row a LEFT join made up, so that row adds nothing to it, as it adds
    nothing to the partial rows. Not ``COUNT(*)`` or ``SUM(COALESCE(x, 1))``,
    which count that row."""
    inner = a.this.this if isinstance(a, exp.Cast) else a.this
    return isinstance(inner, exp.Column)


def _zero_if_unmatched(original: exp.Expr, final: exp.Expr) -> exp.Expr:
    """A final aggregate over a LEFT join of partial rows: a dimension row that met
    none has one NULL partial row, whose SUM of counts is NULL; the COUNT it stands
    for is 0 (TPC-H q13's customers without orders)."""
    if isinstance(original, exp.Count):
        return exp.Coalesce(this=final, expressions=[exp.Literal.number(0)])
    return final


def _through_union(agg: Aggregate, names: Iterator[int]) -> bool:
    """Aggregate each branch of a UNION ALL under ``agg`` first (locally), and
    merge the branches' partial rows above.

    TPC-DS q14's ``avg_sales`` is one AVG over the three channels' sales unioned:
    2.5M rows (58 MB) were hashed into the union's tasks to make one number;
    each task of each channel now sends a SUM and a COUNT. The union may sit
    under a projection (a derived table's select list): its expressions are
    written into the branches' aggregates.
    """
    child: Node = agg.child
    items: dict[Ref, exp.Expr] = {}
    if isinstance(child, Project):
        items = {(child.qualifier, n): x for n, x in child.items}
        child = child.child
    if agg.grouping is not None or not isinstance(child, SetOp) or not _union_all(child):
        return False
    if not all(_raw(b) for b in _branches(child)):
        # A branch that aggregates has few rows already (q33, q56, q60: each
        # channel grouped by item): one aggregate more would only add work.
        return False
    split = split_aggs(agg.aggs)
    if split is None:
        return False
    partial_items, final_of = split

    def over_union(e: exp.Expr) -> exp.Expr:
        return _over(e, items) if items else e

    group_items = [(f"g{i}", over_union(e)) for i, (_, e) in enumerate(agg.groups)]
    partial = [(n, over_union(e)) for n, e in partial_items]
    if any(has_placeholder(e) for _, e in group_items + partial):
        # A subquery's stage is attached where its expression is planned; a
        # group expression that moved into the branches would find none.
        return False
    qualifier = f"_ea{next(names)}"
    agg.child = _partials(child, group_items, partial, qualifier, names)
    agg.groups = [
        (name, col((qualifier, g)))
        for (name, _), (g, _) in zip(agg.groups, group_items, strict=True)
    ]
    agg.aggs = [(name, final_of(name, qualifier)) for name, _ in agg.aggs]
    return True


def _branches(union: SetOp) -> list[Node]:
    """The inputs of a tree of UNION ALLs."""
    return [
        b
        for side in (union.left, union.right)
        for b in (_branches(side) if isinstance(side, SetOp) and _union_all(side) else [side])
    ]


def _raw(node: Node) -> bool:
    """True unless ``node`` aggregates (under filters and projections)."""
    while isinstance(node, (Project, Filter)):
        node = node.child
    return not isinstance(node, (Aggregate, Distinct))


def _union_all(node: Node) -> bool:
    return isinstance(node, SetOp) and node.kind is SetKind.UNION and not node.distinct


def _over(e: exp.Expr, columns: Mapping[Ref, exp.Expr]) -> exp.Expr:
    """``e`` with each column of ``columns`` replaced by its expression."""
    return substitute(e, lambda c: _lookup(c, columns))


def _lookup(e: exp.Expr, items: Mapping[Ref, exp.Expr]) -> exp.Expr | None:
    if isinstance(e, exp.Column) and (e.table, e.name) in items:
        return items[(e.table, e.name)].copy()
    return None


def _partials(
    union: SetOp,
    groups: list[tuple[str, exp.Expr]],
    aggs: list[tuple[str, exp.Expr]],
    qualifier: str,
    names: Iterator[int],
) -> SetOp:
    """The union of each branch's local aggregate, its columns the groups' and
    aggregates' names; ``groups`` and ``aggs`` are over ``union``'s columns."""
    mine = [(union.qualifier, n) for n in union.names]
    sides: list[Node] = []
    for branch in (union.left, union.right):
        by_position = dict(zip(mine, branch.outputs(), strict=True))
        to_branch: dict[Ref, exp.Expr] = {r: col(b) for r, b in by_position.items()}
        g = [(n, _over(e, to_branch)) for n, e in groups]
        a = [(n, _over(e, to_branch)) for n, e in aggs]
        if _union_all(branch):
            # A union of three channels is two unions: the same, one level down.
            assert isinstance(branch, SetOp)
            sides.append(_partials(branch, g, a, f"_ea{next(names)}", names))
        else:
            sides.append(Aggregate(branch, f"_ea{next(names)}", g, a, local=True))
    out = [n for n, _ in groups] + [n for n, _ in aggs]
    return SetOp(SetKind.UNION, False, sides[0], sides[1], qualifier, out)


def _side(e: exp.Expr, fact: set[Ref], dim: set[Ref]) -> str | None:
    """Which side a group expression reads: ``fact``, ``dim``, ``const`` (neither),
    None (both)."""
    refs = _refs(e)
    if not refs:
        return "const"
    if refs <= fact:
        return "fact"
    return "dim" if refs <= dim else None


class _Widths:
    """Bytes per row of an expression over a join: a column's from its table's
    footers, anything else 8."""

    def __init__(self, node: Node, catalog: Mapping[str, Table]) -> None:
        self._tables = {n.alias: scan_table(catalog, n) for n in walk(node) if isinstance(n, Scan)}

    def of(self, e: exp.Expr) -> float:
        if isinstance(e, exp.Column) and e.table in self._tables:
            return self._tables[e.table].row_width([e.name])
        return 8.0


def _worth_it(
    estimator: Estimator,
    join: Join,
    fact: Node,
    dim: Node,
    fact_key: exp.Expr,
    dim_key: exp.Expr,
    repeats: float,
) -> bool:
    """The dimension's key is unique (each partial row meets one row at most), the
    fact side's key is not and repeats ``repeats`` times on average (``KEY_REPEATS``
    or, for wide keys, ``WIDE_KEYS``), and the join keeps most of the fact side's
    rows (``JOIN_KEEPS``)."""
    if not isinstance(fact_key, exp.Column) or not isinstance(dim_key, exp.Column):
        return False
    fref: Ref = (fact_key.table, fact_key.name)
    dref: Ref = (dim_key.table, dim_key.name)
    fact_size, dim_size = estimator.size(fact), estimator.size(dim)
    if dref not in dim_size.unique or fref in fact_size.unique:
        return False
    if dim_size.rows < MIN_DIMENSION_ROWS:
        return False
    distinct = fact_size.distinct.get(fref, fact_size.rows)
    if distinct * repeats > fact_size.rows:
        return False
    return estimator.size(join).rows >= fact_size.rows * JOIN_KEEPS
