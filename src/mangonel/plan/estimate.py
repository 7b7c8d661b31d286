"""Row estimates from Parquet footers: filter selectivity and join sizes.

The planner needs sizes for two choices: the order in which a block's inner joins
run (``plan.join_order``), and whether a join side is broadcast or both sides are
hashed (``plan.distribute``). The footers give row counts, each column's range
and width; from them:

* a filter's selectivity is the product of its conjuncts' (independence assumed):
  ``col = v`` keeps 1/distinct (distinct from an integer or date range when there
  is one, else 1/10), a range keeps the part of ``[low, high]`` it covers, IN
  keeps n/distinct, and what cannot be read keeps a third;
* a join on a key that is unique on one side (its range has as many values as
  the table has rows: ``o_orderkey``, ``n_nationkey``) keeps each row of the other
  side at most once, times the fraction of the unique side that survived its
  filters; a join on keys unique on neither side multiplies the rows and divides
  by the larger number of distinct keys (``c_nationkey = s_nationkey``: 25),
  neither side counted with more distinct keys than it has rows;
* where the other side's key spans fewer values than the unique side's table
  holds (a fact table's date keys cover 5 of date_dim's 200 years), the unique
  side's surviving keys are assumed to lie within that span ("containment"):
  ``d_year = 2001`` keeps 1/201 of date_dim but a fifth of store_sales.

Crude, and meant to be: the estimates only have to rank choices correctly, and
DuckDB plans each stage's own joins with its own statistics.

Why it is over 600 lines: it is one model. ``Estimator`` and the selectivity
rules it applies (equality, ranges, IN, OR, joint conditions, containment) are
calibrated against each other, and a change to one is read with the rest.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Protocol

from sqlglot import exp

from mangonel.catalog import ColumnStats, Table
from mangonel.plan.logical import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    JoinKind,
    Keep,
    Node,
    Project,
    Ref,
    Scan,
    SetOp,
    Sort,
    StageRead,
    scan_table,
)

UNKNOWN = 1 / 3
"""Selectivity of a condition the estimator cannot read."""
EQUAL_UNKNOWN = 0.1
"""Selectivity of ``col = value`` when the column's distinct count is unknown."""
FILTERED = 0.5
"""Rows kept by a filter above a join or an aggregate, where columns have no footers."""
ANTI_KEEPS = 0.1
"""The least an anti join is taken to keep of its left side (``semi_kept``)."""


@dataclass
class Size:
    """Estimated rows of a plan part, and the key columns unique in it.

    ``unique`` maps a column that holds each value at most once to the fraction of
    its table's rows still present (1.0 unfiltered): joining on it keeps the other
    side's rows at most once each, and only that fraction of them finds a match.
    """

    rows: float
    unique: dict[Ref, float] = field(default_factory=dict)
    distinct: dict[Ref, float] = field(default_factory=dict)
    """Upper bounds of distinct values per column, where known."""
    domain: dict[Ref, float] = field(default_factory=dict)
    """Distinct values per column in its whole table (the footers' count, before
    any filter), where known: how much of a unique key's table a join key spans."""


class ExactRows(Protocol):
    """Where a scan's rows under its filter are known exactly (``plan.tiny``)."""

    def rows(self, scan: Scan, table: Table) -> int | None:
        """The rows of ``table`` that pass ``scan``'s filter, or None: estimate them."""
        ...


class Estimator:
    """Sizes of logical plan nodes (see ``Size``), computed once per node."""

    def __init__(
        self,
        catalog: Mapping[str, Table],
        subqueries: Mapping[str, Node] | None = None,
        exact: ExactRows | None = None,
    ) -> None:
        self._catalog = catalog
        self._exact = exact
        """Counts of tiny tables under their filters, taken over the footers' guess."""
        self._subqueries = subqueries if subqueries is not None else {}
        """Uncorrelated subqueries by placeholder name (``bind.Binder.subqueries``)."""
        self._memo: dict[int, tuple[Node, Size]] = {}
        """By ``id``, with the node itself: it stays alive, so its id is not reused."""

    def forget(self) -> None:
        """Drop the sizes computed so far: a rule changed nodes in place (a join's
        kind, ``plan.semi_joins``), and the sizes of those and of every node above
        them are stale."""
        self._memo.clear()

    def table(self, scan: Scan) -> Table:
        """The catalog table ``scan`` reads, less its pruned row groups."""
        return scan_table(self._catalog, scan)

    def size(self, node: Node) -> Size:
        if isinstance(node, Scan):  # its filter grows while the binder pushes conditions
            table = scan_table(self._catalog, node)
            size = scan_size(table, node.alias, node.filter)
            counted = self._exact.rows(node, table) if self._exact is not None else None
            return size if counted is None else _counted(size, counted, table.rows)
        known = self._memo.get(id(node))
        if known is None or known[0] is not node:
            known = self._memo[id(node)] = (node, self._size(node))
        return known[1]

    def _size(self, node: Node) -> Size:
        if isinstance(node, Filter):
            child = self.size(node.child)
            sel = self._filter_selectivity(node.condition, child)
            return Size(
                max(1.0, child.rows * sel),
                {k: f * sel for k, f in child.unique.items()},
                child.distinct,
                child.domain,
            )
        if isinstance(node, Join):
            return self._join(node)
        if isinstance(node, Aggregate):
            return self._aggregate(node)
        if isinstance(node, Project):
            child = self.size(node.child)
            unique: dict[Ref, float] = {}
            distinct: dict[Ref, float] = {}
            domain: dict[Ref, float] = {}
            for name, e in node.items:
                ref = _ref(e) if isinstance(e, exp.Column) else None
                if ref in child.unique:
                    unique[(node.qualifier, name)] = child.unique[ref]
                if ref in child.distinct:
                    distinct[(node.qualifier, name)] = child.distinct[ref]
                if ref in child.domain:
                    domain[(node.qualifier, name)] = child.domain[ref]
            return Size(child.rows, unique, distinct, domain)
        if isinstance(node, Sort):
            child = self.size(node.child)
            if node.limit is None:
                return child
            return Size(
                min(child.rows, float(node.limit)), child.unique, child.distinct, child.domain
            )
        if isinstance(node, Distinct):
            return Size(max(1.0, self.size(node.child).rows / 2))
        if isinstance(node, SetOp):
            return Size(self.size(node.left).rows + self.size(node.right).rows)
        if isinstance(node, StageRead):
            return self.size(node.source)
        if isinstance(node, Keep):
            return self.size(node.child)
        kids = node.children()
        return Size(max((self.size(k).rows for k in kids), default=1.0))

    def known_groups(self, node: Aggregate) -> float | None:
        """Distinct values of an aggregate's group keys together, bounded by the
        footers (the product of each key's count, at most the input's rows); None
        where a key's count is unknown (an expression, a column without a footer
        count), which ``size`` guesses as a quarter of the rows."""
        child = self.size(node.child)
        bound = 1.0
        for _, e in node.groups:
            ref = _ref(e)
            if ref is None or ref not in child.distinct:
                return None
            bound *= child.distinct[ref]
        return max(1.0, min(child.rows, bound))

    def _filter_selectivity(self, condition: exp.Expr, child: Size) -> float:
        """``FILTERED`` a condition, except that ``col IN (subquery)`` keeps at most
        as many of ``col``'s distinct values as the subquery has rows (and counts as
        ``FILTERED`` when that bound says more: q18's HAVING keeps 57 of 1.5M)."""
        sel, other = 1.0, False
        for c in _flatten(condition):
            query = c.args.get("query") if isinstance(c, exp.In) else None
            table = query.find(exp.Table) if query is not None else None
            sub = self._subqueries.get(table.name) if table is not None else None
            ref = _ref(c.this) if sub is not None else None
            if sub is None or ref is None:
                other = True
                continue
            distinct = child.distinct.get(ref, child.rows)
            sel *= min(FILTERED, self.size(sub).rows / max(1.0, distinct))
        return sel * FILTERED if other else sel

    def _join(self, node: Join) -> Size:
        left, right = self.size(node.left), self.size(node.right)
        keys = list(zip(node.left_keys, node.right_keys, strict=True))
        if node.kind in (JoinKind.SEMI, JoinKind.ANTI):
            kept = semi_kept(left, right, keys, node.kind is JoinKind.ANTI, node.residual)
            return Size(
                max(1.0, left.rows * kept),
                {k: f * kept for k, f in left.unique.items()},
                left.distinct,
                left.domain,
            )
        if node.kind is JoinKind.FULL:
            return Size(left.rows + right.rows)
        inner = join_size(left, right, keys)
        if node.residual is not None:
            inner = Size(max(1.0, inner.rows * UNKNOWN), inner.unique, inner.distinct, inner.domain)
        if node.kind is JoinKind.LEFT:
            if inner.rows <= left.rows:
                return Size(
                    left.rows,
                    left.unique,
                    {**right.distinct, **left.distinct},
                    inner.domain,
                )
            return Size(inner.rows, {}, inner.distinct, inner.domain)
        return inner

    def _aggregate(self, node: Aggregate) -> Size:
        child = self.size(node.child)
        if not node.groups:
            return Size(1.0)
        bound = 1.0
        for _, e in node.groups:
            ref = _ref(e)
            bound *= child.distinct.get(ref, child.rows / 4) if ref is not None else child.rows / 4
        rows = max(1.0, min(child.rows, bound))
        outs = [(node.qualifier, name) for name, _ in node.groups]
        unique = {outs[0]: 1.0} if len(outs) == 1 else {}
        return Size(rows, unique, {r: rows for r in outs} if len(outs) == 1 else {})


def scan_size(table: Table, alias: str, condition: exp.Expr | None) -> Size:
    sel = selectivity(condition, table.stats, table.rows) if condition is not None else 1.0
    rows = max(1.0, table.rows * sel)
    unique: dict[Ref, float] = {}
    distinct: dict[Ref, float] = {}
    domain: dict[Ref, float] = {}
    for name, (d, nulls) in table.distinct_counts.items():
        distinct[(alias, name)] = min(d, rows)
        domain[(alias, name)] = d
        if table.rows > 1 and d >= table.rows and nulls == 0:
            unique[(alias, name)] = sel
    if condition is not None:
        for name, n in _values_kept(condition).items():
            ref = (alias, name)
            distinct[ref] = min(distinct.get(ref, rows), n)
    return Size(rows, unique, distinct, domain)


def _counted(size: Size, counted: int, table_rows: int) -> Size:
    """``size`` of a scan with its rows counted: the footers' guess of what its filter
    keeps replaced by the count (each unique key keeps that share of its table)."""
    rows = max(1.0, float(counted))
    kept = counted / max(1, table_rows)
    return Size(
        rows,
        dict.fromkeys(size.unique, kept),
        {r: min(d, rows) for r, d in size.distinct.items()},
        size.domain,
    )


def _values_kept(cond: exp.Expr) -> dict[str, float]:
    """Per column that a conjunct of ``cond`` holds to a few literals (``=``,
    ``IN``, an OR of them on that column): how many, a bound on its distinct values
    after the filter. ``d_year IN (2001, 2002)`` leaves two years of date_dim's 201,
    so an aggregate by the year over the filtered dates makes two groups per key
    of the other columns, not 201 (TPC-DS q04's ``year_total`` by customer and year
    was estimated at as many groups as rows, 27 MB for 2 MB)."""
    kept: dict[str, float] = {}
    for c in _flatten(cond):
        found = _literal_set(c)
        if found is not None:
            name, n = found
            kept[name] = min(kept.get(name, n), n)
    return kept


def _literal_set(cond: exp.Expr) -> tuple[str, float] | None:
    """``(column, n)`` where ``cond`` holds only if the column is one of n literals."""
    if isinstance(cond, exp.Paren):
        return _literal_set(cond.this)
    if isinstance(cond, exp.Or):
        left, right = _literal_set(cond.left), _literal_set(cond.right)
        if left is None or right is None or left[0] != right[0]:
            return None
        return left[0], left[1] + right[1]
    if isinstance(cond, exp.EQ):
        for column, other in ((cond.this, cond.expression), (cond.expression, cond.this)):
            if isinstance(column, exp.Column) and _value(other) is not None:
                return column.name, 1.0
        return None
    if (
        isinstance(cond, exp.In)
        and isinstance(cond.this, exp.Column)
        and not cond.args.get("query")
    ):
        values = [_value(e) for e in cond.expressions]
        if values and all(v is not None for v in values):
            return cond.this.name, float(len(set(map(repr, values))))
    return None


def join_size(left: Size, right: Size, keys: list[tuple[exp.Expr, exp.Expr]]) -> Size:
    """The estimated size of an inner equi-join of ``left`` and ``right`` on ``keys``.

    No keys: the cross product.
    """
    if not keys:
        return Size(left.rows * right.rows)
    left_refs = [_ref(a) for a, _ in keys]
    right_refs = [_ref(b) for _, b in keys]
    right_unique = _matched(right, left, right_refs, left_refs)
    left_unique = _matched(left, right, left_refs, right_refs)
    domain = {**left.domain, **right.domain}
    if right_unique and (not left_unique or left.rows >= right.rows):
        frac = min(right_unique)
        return Size(
            max(1.0, left.rows * frac),
            {k: f * frac for k, f in left.unique.items()},
            {**right.distinct, **left.distinct},
            domain,
        )
    if left_unique:
        frac = min(left_unique)
        return Size(
            max(1.0, right.rows * frac),
            {k: f * frac for k, f in right.unique.items()},
            {**left.distinct, **right.distinct},
            domain,
        )
    ndv = 1.0
    for a, b in zip(left_refs, right_refs, strict=True):
        # A side holds no more distinct values than rows: d2.d_date_sk after d1 ⋈ d2
        # on d_week_seq (q72) is 2,544 rows, not the 73,049 dates of its scan, and
        # inventory ⋈ that on the date keeps every inventory row of those dates.
        da = min(left.distinct.get(a, left.rows), left.rows) if a is not None else left.rows
        db = min(right.distinct.get(b, right.rows), right.rows) if b is not None else right.rows
        ndv *= max(da, db, 1.0)
    ndv = min(ndv, max(left.rows, right.rows))
    rows = max(1.0, left.rows * right.rows / ndv)
    distinct = {r: min(d, rows) for r, d in {**left.distinct, **right.distinct}.items()}
    return Size(rows, {}, distinct, domain)


def semi_kept(
    left: Size,
    right: Size,
    keys: list[tuple[exp.Expr, exp.Expr]],
    anti: bool = False,
    residual: exp.Expr | None = None,
) -> float:
    """The fraction of ``left``'s rows a semi join (or, with ``anti``, an anti join)
    with ``right`` on ``keys`` keeps: the share of ``left``'s key values that
    ``right``'s rows cover, and for an anti join the rest.

    The share of one key is ``right``'s distinct values over ``left``'s (each at
    most its rows), at most 1: the side with fewer values is taken to hold only
    values of the other ("containment", as for inner joins). ``right``'s values:
    where it holds each value of a table's column once, the part of that table
    that survived (``_matched``: q5's customers cut by a copy of the region's 5
    nations keep 5 of their 25), else its distinct count. q21's late line items of
    one nation's suppliers all find their order among all late line items. The
    keys of a multi-key join each bound the share. Where no key is a column,
    ``FILTERED``, as before any of this was read.

    A condition beyond the keys (``residual``) must hold for some right row of the
    key: each of the key's ``right.rows / values`` rows meets it independently
    (``_residual``). Distinct counts from ranges err high, so an anti join is not
    trusted to drop every row: it keeps at least ``ANTI_KEEPS``.
    """
    share: float | None = None
    per_key = 1.0
    for a, b in keys:
        la, rb = _ref(a), _ref(b)
        if la is None or rb is None:
            continue
        matched = _matched(right, left, [rb], [la]) if rb in right.domain else []
        if matched:
            values = matched[0] * right.domain[rb]
        else:
            values = min(right.distinct.get(rb, right.rows), right.rows)
        theirs = min(left.distinct.get(la, left.rows), left.rows)
        part = min(1.0, values / max(1.0, theirs))
        per_key = max(per_key, right.rows / max(1.0, values))
        share = part if share is None else min(share, part)
    if share is None:
        return FILTERED
    if residual is not None:
        share *= 1.0 - (1.0 - _residual(residual, right)) ** per_key
    return max(ANTI_KEEPS, 1.0 - share) if anti else share


def _residual(cond: exp.Expr, right: Size) -> float:
    """The chance that one right row meets a semi / anti join's ``cond`` beyond the
    keys: a column that differs from another (q21's ``l3.l_suppkey <>
    l1.l_suppkey``) almost always, one in its distinct values not; anything else
    ``UNKNOWN`` each conjunct."""
    p = 1.0
    for c in _flatten(cond):
        if isinstance(c, exp.NEQ) and isinstance(c.this, exp.Column):
            refs = [_ref(c.this), _ref(c.expression)]
            values = max((right.distinct.get(r, 0.0) for r in refs if r is not None), default=0)
            p *= 1.0 - 1.0 / values if values > 1 else 1.0 - EQUAL_UNKNOWN
        else:
            p *= UNKNOWN
    return p


def _matched(
    unique: Size, other: Size, unique_refs: list[Ref | None], other_refs: list[Ref | None]
) -> list[float]:
    """For each key unique in ``unique``: the fraction of ``other``'s rows that find
    a match, its surviving fraction of the table, or more where ``other``'s key
    spans fewer values than that table has (containment, see the module's doc).

    Where the spans are equal (TPC-H's keys: ``l_orderkey`` spans all of
    ``o_orderkey``), this is the surviving fraction, as without the rule.
    """
    fractions = []
    for u, o in zip(unique_refs, other_refs, strict=True):
        if u is None or u not in unique.unique:
            continue
        frac = unique.unique[u]
        whole, span = unique.domain.get(u), other.domain.get(o) if o is not None else None
        if whole is not None and span is not None and 0 < span < whole:
            frac = min(1.0, max(frac, frac * whole / span))
        fractions.append(frac)
    return fractions


def selectivity(cond: exp.Expr, stats: Mapping[str, ColumnStats], rows: int) -> float:
    """The estimated fraction of rows that pass ``cond`` (columns looked up by name)."""
    return max(1.0 / max(1, rows), min(1.0, _sel(cond, stats, rows)))


def _sel(cond: exp.Expr, stats: Mapping[str, ColumnStats], rows: int) -> float:
    if isinstance(cond, exp.Paren):
        return _sel(cond.this, stats, rows)
    if isinstance(cond, exp.And):
        return _conjunction(cond, stats, rows)
    if isinstance(cond, exp.Or):
        a, b = _sel(cond.left, stats, rows), _sel(cond.right, stats, rows)
        return a + b - a * b
    if isinstance(cond, exp.Not):
        return 1.0 - _sel(cond.this, stats, rows)
    if isinstance(cond, exp.Between):
        column, st = _column(cond.this, stats)
        low, high = _value(cond.args.get("low")), _value(cond.args.get("high"))
        if st is not None and low is not None and high is not None:
            part = _fraction(st, low, high)
            if part is not None:
                return part
        return 0.25
    if isinstance(cond, exp.In) and not cond.args.get("query"):
        _, st = _column(cond.this, stats)
        n = len(cond.expressions)
        distinct = st.distinct(rows) if st is not None else None
        return min(1.0, n / distinct) if distinct else min(0.5, n * EQUAL_UNKNOWN)
    if isinstance(cond, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
        return _compare(cond, stats, rows)
    if isinstance(cond, (exp.Like, exp.ILike)):
        # sqlglot parses ``x NOT LIKE p`` as a LIKE with ``negate`` set, not as a
        # NOT over it: it keeps what the LIKE drops (TPC-H q13's orders: nine
        # tenths, once taken for a tenth).
        sel = EQUAL_UNKNOWN if isinstance(cond, exp.Like) else UNKNOWN
        return 1.0 - sel if cond.args.get("negate") else sel
    if isinstance(cond, exp.Is):
        _, st = _column(cond.this, stats)
        if st is not None and isinstance(cond.expression, exp.Null):
            return st.nulls / max(1, rows)
    return UNKNOWN


def _conjunction(cond: exp.And, stats: Mapping[str, ColumnStats], rows: int) -> float:
    """Conjuncts multiply, except that bounds on one column make one interval
    (``d >= '1993-07-01' AND d < '1993-10-01'`` keeps three months, not the
    product of two halves), and that ORs of equalities are counted together
    (``_joint``)."""
    bounds: dict[str, list[object | None]] = {}
    total = 1.0
    conjuncts = _flatten(cond)
    # Conjuncts of equalities: counted together where two or more are ORs (one
    # OR of ANDs in normal form), with the plain equalities beside them, which
    # may name the same columns.
    values = [c for c in conjuncts if _joint([c], stats, rows) is not None]
    if sum(isinstance(_unparen(c), exp.Or) for c in values) >= 2:
        joint = _joint(values, stats, rows)
        if joint is not None:
            total = joint
            taken = {id(c) for c in values}
            conjuncts = [c for c in conjuncts if id(c) not in taken]
    for c in conjuncts:
        bound = _bound(c, stats)
        if bound is None:
            total *= _sel(c, stats, rows)
            continue
        name, low, high = bound
        pair = bounds.setdefault(name, [None, None])
        if low is not None:
            pair[0] = low if pair[0] is None else max(pair[0], low)  # type: ignore[call-overload]
        if high is not None:
            pair[1] = high if pair[1] is None else min(pair[1], high)  # type: ignore[call-overload]
    for name, (low, high) in bounds.items():
        part = _fraction(stats[name], low, high)
        total *= part if part is not None else UNKNOWN
    return total


JOINT_STATES = 256
"""The most combinations of values ``_joint`` enumerates."""

_Formula = tuple[str, object, object]
"""``("and" | "or", left, right)`` or ``("in", column, values)``."""


def _joint(conds: list[exp.Expr], stats: Mapping[str, ColumnStats], rows: int) -> float | None:
    """The fraction of rows that pass all of ``conds`` together, when they are made
    of ``column = constant`` and ``column IN (constants)`` under AND and OR: each
    column either holds one of the constants named or another value, columns are
    independent, and the formula is evaluated for each combination (at most
    ``JOINT_STATES``). None for any other condition.

    sqlglot writes a WHERE in conjunctive normal form: TPC-DS q47's ``d_year = 1999
    OR (d_year = 1998 AND d_moy = 12) OR (d_year = 2000 AND d_moy = 1)`` becomes
    four ORs, each true of a tenth of the rows or fewer, whose product kept 2 rows
    of ``date_dim`` where 427 pass (this count: 425). The 650k sales that met
    them were taken for 2.4k, smaller than ``item``'s 18k rows, and built the
    join's hash table: 0.33 s of the query's 0.4.

    >>> import sqlglot
    >>> stats = {"y": ColumnStats(4.0, 1900, 2099), "m": ColumnStats(4.0, 1, 12)}
    >>> conds = [sqlglot.parse_one(c) for c in ("m = 1 OR m = 12 OR y = 1999",
    ...     "m = 1 OR y = 1998 OR y = 1999", "m = 12 OR y = 1999 OR y = 2000",
    ...     "y = 1998 OR y = 1999 OR y = 2000")]
    >>> round(_joint(conds, stats, 10_000) * 200 * 12, 1)  # one year, two months
    14.0
    """
    columns: dict[str, set[object]] = {}

    def parse(e: exp.Expr) -> _Formula | None:
        e = _unparen(e)
        if isinstance(e, (exp.And, exp.Or)):
            left, right = parse(e.left), parse(e.right)
            if left is None or right is None:
                return None
            return ("and" if isinstance(e, exp.And) else "or", left, right)
        values: list[object | None] = []
        name: str | None = None
        if isinstance(e, exp.EQ):
            name, _ = _column(e.this, stats)
            values = [_value(e.expression)]
            if name is None:
                name, _ = _column(e.expression, stats)
                values = [_value(e.this)]
        elif isinstance(e, exp.In) and not e.args.get("query") and not e.args.get("unnest"):
            name, _ = _column(e.this, stats)
            values = [_value(v) for v in e.expressions]
        if name is None or not values or any(v is None for v in values):
            return None
        columns.setdefault(name, set()).update(values)
        return ("in", name, frozenset(values))

    formulas = [parse(c) for c in conds]
    if any(f is None for f in formulas):
        return None
    states: list[list[tuple[object | None, float]]] = []
    count = 1
    for name, values in columns.items():
        st = stats.get(name)
        distinct = st.distinct(rows) if st is not None else None
        each = min(1.0 / distinct if distinct else EQUAL_UNKNOWN, 1.0 / len(values))
        states.append([(v, each) for v in values] + [(None, 1.0 - each * len(values))])
        count *= len(values) + 1
    if count > JOINT_STATES:
        return None
    names = list(columns)

    def holds(f: _Formula, row: dict[str, object | None]) -> bool:
        kind, a, b = f
        if kind == "in":
            return row[a] in b  # type: ignore[index, operator]
        if kind == "and":
            return holds(a, row) and holds(b, row)  # type: ignore[arg-type]
        return holds(a, row) or holds(b, row)  # type: ignore[arg-type]

    total = 0.0
    for combo in itertools.product(*states):
        row = {n: v for n, (v, _) in zip(names, combo, strict=True)}
        if all(holds(f, row) for f in formulas if f is not None):
            total += math.prod(p for _, p in combo)
    return total


def _unparen(e: exp.Expr) -> exp.Expr:
    while isinstance(e, exp.Paren):
        e = e.this
    return e


def _flatten(cond: exp.Expr) -> list[exp.Expr]:
    if isinstance(cond, exp.And):
        return _flatten(cond.left) + _flatten(cond.right)
    if isinstance(cond, exp.Paren) and isinstance(cond.this, exp.And):
        return _flatten(cond.this)
    return [cond]


def _bound(
    cond: exp.Expr, stats: Mapping[str, ColumnStats]
) -> tuple[str, object | None, object | None] | None:
    """``(column, low, high)`` for a range comparison of a column with stats and a
    literal of a comparable kind, else None."""
    if not isinstance(cond, (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between)):
        return None
    if isinstance(cond, exp.Between):
        name, st = _column(cond.this, stats)
        low, high = _value(cond.args.get("low")), _value(cond.args.get("high"))
        ok = name is not None and st is not None and _number(st.low) is not None
        if ok and _number(low) is not None and _number(high) is not None:
            return name, low, high  # type: ignore[return-value]
        return None
    name, st = _column(cond.this, stats)
    value = _value(cond.expression)
    below = isinstance(cond, (exp.LT, exp.LTE))
    if name is None or value is None:
        name, st = _column(cond.expression, stats)
        value = _value(cond.this)
        below = not below
    if name is None or st is None or _number(st.low) is None or _number(value) is None:
        return None
    return (name, None, value) if below else (name, value, None)


def _compare(cond: exp.Expr, stats: Mapping[str, ColumnStats], rows: int) -> float:
    left, right = cond.args["this"], cond.args["expression"]
    column, st = _column(left, stats)
    value = _value(right)
    flipped = False
    if st is None or value is None:
        column, st = _column(right, stats)
        value = _value(left)
        flipped = True
    if st is None or value is None:
        return EQUAL_UNKNOWN if isinstance(cond, exp.EQ) and column is not None else UNKNOWN
    if isinstance(cond, (exp.EQ, exp.NEQ)):
        distinct = st.distinct(rows)
        eq = 1.0 / distinct if distinct else EQUAL_UNKNOWN
        return eq if isinstance(cond, exp.EQ) else 1.0 - eq
    below = isinstance(cond, (exp.LT, exp.LTE)) != flipped
    part = _fraction(st, None, value) if below else _fraction(st, value, None)
    return part if part is not None else UNKNOWN


def _column(e: exp.Expr, stats: Mapping[str, ColumnStats]) -> tuple[str | None, ColumnStats | None]:
    while isinstance(e, (exp.Cast, exp.Paren)):
        e = e.this
    if isinstance(e, exp.Column):
        return e.name, stats.get(e.name)
    return None, None


def _value(e: exp.Expr | None) -> object | None:
    """A literal's value (numbers, strings, DATE casts), or None."""
    if e is None:
        return None
    if isinstance(e, exp.Paren):
        return _value(e.this)
    if isinstance(e, exp.Cast) and isinstance(e.this, exp.Literal) and e.this.is_string:
        kind = e.to.this
        try:
            if kind == exp.DataType.Type.DATE:
                return dt.date.fromisoformat(e.this.this)
            if kind in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.DATETIME):
                return dt.datetime.fromisoformat(e.this.this)
        except ValueError:
            return None
        return None
    if isinstance(e, exp.Literal):
        if e.is_string:
            return str(e.this)
        try:
            return Decimal(e.this)
        except InvalidOperation:
            return None
    if isinstance(e, exp.Neg):
        inner = _value(e.this)
        return -inner if isinstance(inner, Decimal) else None
    return None


def _fraction(st: ColumnStats, low: object | None, high: object | None) -> float | None:
    """The part of ``[st.low, st.high]`` inside ``[low, high]`` (None: open end)."""
    lo, hi = _number(st.low), _number(st.high)
    a = lo if low is None else _number(low)
    b = hi if high is None else _number(high)
    if lo is None or hi is None or a is None or b is None:
        return None
    if hi <= lo:
        return 1.0 if a <= lo <= b else 0.0
    return max(0.0, min(b, hi) - max(a, lo)) / (hi - lo)


def _number(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float, Decimal)):
        return float(v)
    if isinstance(v, dt.datetime):
        return v.timestamp()
    if isinstance(v, dt.date):
        return float(v.toordinal())
    return None


def _ref(e: exp.Expr) -> Ref | None:
    while isinstance(e, (exp.Cast, exp.Paren)):
        e = e.this
    if isinstance(e, exp.Column) and e.table:
        return (e.table, e.name)
    return None
