"""Aggregates over one source, written as several subqueries, computed in one pass.

TPC-DS q09 asks 15 scalar subqueries of ``store_sales``, each a COUNT or an AVG over
one range of ``ss_quantity``; q88 joins eight one-row derived tables of
``store_sales`` joined with three dimensions, each of one half hour.
DuckDB scans the table once for each; so did every plan here. Where such
subqueries read the same FROM and joins, word for word, and differ only in their
WHERE, they become one CTE that aggregates each with a ``FILTER`` of its own
conditions, over the rows any of them keeps, and each subquery reads its columns
of that one row (a CTE read more than once is computed once: ``plan.bind``):

    (SELECT COUNT(*) FROM t WHERE t.q BETWEEN 1 AND 20)   -- and 21 AND 40, ...
    -- becomes (SELECT m.m1_0 FROM merged_aggregates_1 AS m), with
    WITH merged_aggregates_1 AS (SELECT COUNT(*) FILTER (WHERE t.q BETWEEN 1 AND 20)
        AS m1_0, ... FROM t WHERE t.q BETWEEN 1 AND 20 OR t.q BETWEEN 21 AND 40 ...)

An aggregate over no row is the same either way (COUNT 0, the others NULL), and a
subquery of aggregates with no GROUP BY gives exactly one row either way. Where no
row can meet two subqueries' own conditions (``_apart``), the rows are grouped by
the bucket their conditions name instead, and the buckets' rows pivoted into the
one row (``_bucketed``): a ``FILTER`` costs DuckDB a check per aggregate and row. The
conditions every subquery shares stay the CTE's own (q88's joins and store).
Only subqueries that aggregate and nothing more: no GROUP BY, HAVING, DISTINCT,
ORDER BY, LIMIT, window or nested query, no aggregate with a FILTER already, no
call-by-call function, every column of their own sources and inside an
aggregate; a DISTINCT aggregate only where the rows are grouped by bucket.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from sqlglot import exp

from mangonel.sql.exprs import VOLATILE, and_all, conjuncts
from mangonel.sql.shared_ctes import add_cte, open_to_ctes, self_contained

__all__ = ["merge_scalar_aggregates"]

_NOT_PLAIN = ("group", "having", "limit", "offset", "distinct", "order", "qualify", "windows")


def merge_scalar_aggregates(query: exp.Expr) -> exp.Expr:
    """``query`` (qualified) with the aggregating subqueries of one source merged
    into one CTE (see the module's docstring), in place."""
    if not isinstance(query, exp.Select) or not open_to_ctes(query):
        return query
    with_ = _arg(query, "with")
    ctes = {c.alias_or_name for c in with_.expressions} if with_ is not None else set()
    groups: dict[str, list[exp.Subquery]] = {}
    for sub in query.find_all(exp.Subquery):
        body = sub.this
        if _mergeable(sub, body, ctes):
            key = " ".join(p.sql() for p in [_arg(body, "from"), *body.args.get("joins", [])])
            groups.setdefault(key, []).append(sub)
    taken: set[str] | None = None
    made = 0
    for subs in groups.values():
        if len(subs) < 2 or len({s.this.sql() for s in subs}) < 2:
            continue  # one subquery, maybe written twice (a GROUP BY key): as it is
        if taken is None:
            taken = {t.name for t in query.find_all(exp.Table)} | ctes
        made += 1
        while f"merged_aggregates_{made}" in taken:
            made += 1
        name = f"merged_aggregates_{made}"
        cte = _merged(subs, name)
        if cte is None:
            made -= 1
            continue
        taken.add(name)
        # First: the subqueries read only tables (``_mergeable``), no CTE.
        add_cte(query, cte, 0)
    return query


def _arg(node: exp.Expr, name: str) -> exp.Expr | None:
    """``node``'s argument ``name`` (sqlglot spells some with a trailing ``_``)."""
    value = node.args.get(f"{name}_")
    return value if value is not None else node.args.get(name)


def _mergeable(sub: exp.Subquery, body: exp.Expr, ctes: set[str]) -> bool:
    """Whether ``sub`` is a subquery that aggregates and nothing more, of tables
    only (no CTE of ``ctes``: the merged one goes first in the WITH)."""
    if not isinstance(body, exp.Select) or _arg(body, "with") is not None:
        return False
    if any(body.args.get(k) for k in _NOT_PLAIN) or _arg(body, "from") is None:
        return False
    if any(t.name in ctes or t.args.get("db") for t in body.find_all(exp.Table)):
        return False
    parent = sub.parent
    if isinstance(parent, (exp.In, exp.Exists)) or not body.expressions:
        return False
    if isinstance(parent, (exp.From, exp.Join)) and not sub.alias:
        return False
    inner = list(body.walk())
    # A DISTINCT aggregate only in an aggregate's arguments (``_merged`` merges it
    # only into buckets).
    if any(
        isinstance(n, (exp.Subquery, exp.Window, exp.Filter, exp.Lateral, *VOLATILE))
        or (isinstance(n, exp.Distinct) and not isinstance(n.parent, exp.AggFunc))
        for n in inner[1:]
    ):
        return False
    if any(isinstance(n, exp.Select) and n is not body for n in inner):
        return False
    for projection in body.expressions:
        if projection.find(exp.AggFunc) is None or isinstance(projection, exp.Star):
            return False
        # Every column of the result inside an aggregate: one row, whatever the rows.
        for column in projection.find_all(exp.Column):
            if not _in_aggregate(column, projection):
                return False
    return self_contained(body)


def _in_aggregate(node: exp.Expr, top: exp.Expr) -> bool:
    """Whether an aggregate holds ``node``, looking no higher than ``top``."""
    at: exp.Expr | None = node
    while at is not None:
        if isinstance(at, exp.AggFunc):
            return True
        if at is top:
            return False
        at = at.parent
    return False


def _filtered(value: exp.Expr, cond: exp.Expr) -> exp.Expr:
    """``value`` with each aggregate in it counting only the rows ``cond`` keeps."""

    def only(agg: exp.Expr) -> exp.Expr:
        return exp.Filter(this=agg, expression=exp.Where(this=cond.copy()))

    if isinstance(value, exp.AggFunc):
        return only(value)
    for agg in list(value.find_all(exp.AggFunc)):
        if agg.find_ancestor(exp.AggFunc) is None:
            agg.replace(only(agg.copy()))
    return value


def _merged(subs: list[exp.Subquery], name: str) -> exp.CTE | None:
    """The CTE that computes every aggregate of ``subs`` in one pass; each subquery
    then reads its columns of its one row, the same columns where it is written
    the same (a select item and the GROUP BY key it repeats stay equal). None
    where a DISTINCT aggregate would be filtered: TPC-DS q28's six
    ``COUNT(DISTINCT)``s, each over its own rows, took 1.08-1.10 of the time
    merged with FILTERs (DuckDB keeps a set per aggregate either way, and the
    merged pass reads every row into each); grouped by bucket, 0.80 (one core)."""
    bodies: dict[str, exp.Subquery] = {}
    for sub in subs:
        bodies.setdefault(sub.this.sql(), sub)
    merged = _aggregates(list(bodies.values()))
    if any(f.this.find(exp.Distinct) is not None for f in merged.find_all(exp.Filter)):
        return None
    index = {text: i for i, text in enumerate(bodies)}
    readers = {text: _reader(sub.this, index[text], name) for text, sub in bodies.items()}
    for sub in subs:
        sub.set("this", readers[sub.this.sql()].copy())
    return exp.CTE(this=merged, alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True)))


def _reader(body: exp.Select, i: int, name: str) -> exp.Select:
    """What the ``i``-th subquery becomes: its columns of the merged row."""
    readers = [
        exp.alias_(exp.column(f"m{i}_{j}", table="m", quoted=True), p.alias_or_name, quoted=True)
        for j, p in enumerate(body.expressions)
    ]
    source = exp.Table(
        this=exp.to_identifier(name, quoted=True),
        alias=exp.TableAlias(this=exp.to_identifier("m", quoted=True)),
    )
    return exp.Select(expressions=readers).from_(source, copy=False)


def _aggregates(subs: list[exp.Subquery]) -> exp.Select:
    """One SELECT of every aggregate of ``subs`` (each of its own rows, ``m{i}_{j}``)."""
    wheres = [conjuncts(w.this) if (w := s.this.args.get("where")) else [] for s in subs]
    texts = [[c.sql() for c in w] for w in wheres]
    common = [
        c
        for c, t in zip(wheres[0], texts[0], strict=True)
        if all(t in other for other in texts[1:])
    ]
    shared = {c.sql() for c in common}
    own = [[c for c in w if c.sql() not in shared] for w in wheres]
    first = subs[0].this
    items: list[exp.Expr] = []
    for i, (sub, keep) in enumerate(zip(subs, own, strict=True)):
        cond = and_all([c.copy() for c in keep])
        for j, projection in enumerate(sub.this.expressions):
            value = projection.unalias().copy()
            if cond is not None:
                value = _filtered(value, cond)
            items.append(exp.alias_(value, f"m{i}_{j}", quoted=True))
    merged = exp.Select(expressions=items)
    merged.set("from_" if "from_" in merged.arg_types else "from", _arg(first, "from").copy())
    for join in first.args.get("joins", []):
        merged.append("joins", join.copy())
    distinct = {" AND ".join(c.sql() for c in keep): keep for keep in own}
    if all(own):
        # Each subquery's own conditions, once each (q09 asks three aggregates of
        # each range).
        terms: list[exp.Expr] = [
            exp.paren(exp.and_(*[c.copy() for c in keep], copy=False), copy=False)
            for keep in distinct.values()
        ]
        anyone = terms[0] if len(terms) == 1 else exp.or_(*terms, copy=False)
        where = and_all([*(c.copy() for c in common), anyone])
    else:
        where = and_all([c.copy() for c in common])
    if where is not None:
        merged.set("where", exp.Where(this=where))
    groups = list(distinct.values())
    if all(own) and len(groups) > 1 and _apart(groups):
        bucketed = _bucketed(subs, own, groups, merged)
        if bucketed is not None:
            return bucketed
    return merged


_BUCKETED = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
"""The aggregates ``_bucketed`` computes by bucket: each gives one value a bucket,
and over no row COUNT gives 0 (the pivot's COALESCE), the others NULL."""


def _bucketed(
    subs: list[exp.Subquery],
    own: list[list[exp.Expr]],
    groups: list[list[exp.Expr]],
    filtered: exp.Select,
) -> exp.Select | None:
    """``filtered`` (one pass, each aggregate with a FILTER of its subquery's own
    conditions) as a GROUP BY of the bucket each row falls in, where no row can
    meet two subqueries' own conditions (``_apart``), and a pivot of the buckets'
    rows into the one row; None where an aggregate is not one of ``_BUCKETED``.

    DuckDB checks a FILTER per aggregate and row: q09's 15 filtered aggregates
    over ``store_sales`` took 0.33 s at SF1, its three aggregates grouped by
    ``ss_quantity``'s five ranges 0.10 s (one core, the same answer).
    """
    aggregates: dict[str, exp.Expr] = {}
    for sub in subs:
        for projection in sub.this.expressions:
            for agg in _outermost_aggregates(projection):
                if not isinstance(agg, _BUCKETED):
                    return None
                aggregates.setdefault(agg.sql(), agg)
    names = {text: f"a{k}" for k, text in enumerate(aggregates)}
    keys = [" AND ".join(c.sql() for c in keep) for keep in groups]
    bucket = exp.Case(
        ifs=[
            exp.If(this=and_all([c.copy() for c in keep]), true=exp.Literal.number(k))
            for k, keep in enumerate(groups)
        ]
    )
    inner = filtered.copy()
    inner.set(
        "expressions",
        [
            exp.alias_(bucket, "b", quoted=True),
            *(exp.alias_(agg.copy(), names[text], quoted=True) for text, agg in aggregates.items()),
        ],
    )
    inner.set("group", exp.Group(expressions=[bucket.copy()]))

    def pivot(agg: exp.Expr, k: int) -> exp.Expr:
        value = exp.column(names[agg.sql()], table="g", quoted=True)
        mine = exp.column("b", table="g", quoted=True).eq(exp.Literal.number(k))
        picked: exp.Expr = exp.Filter(this=exp.Max(this=value), expression=exp.Where(this=mine))
        if isinstance(agg, exp.Count):
            picked = exp.Coalesce(this=picked, expressions=[exp.Literal.number(0)])
        return picked

    items: list[exp.Expr] = []
    for i, (sub, keep) in enumerate(zip(subs, own, strict=True)):
        k = keys.index(" AND ".join(c.sql() for c in keep))
        for j, projection in enumerate(sub.this.expressions):
            value = projection.unalias().copy()
            if isinstance(value, exp.AggFunc):
                value = pivot(value, k)
            else:
                for agg in list(_outermost_aggregates(value)):
                    agg.replace(pivot(agg, k))
            items.append(exp.alias_(value, f"m{i}_{j}", quoted=True))
    source = exp.Subquery(
        this=inner, alias=exp.TableAlias(this=exp.to_identifier("g", quoted=True))
    )
    return exp.Select(expressions=items).from_(source, copy=False)


def _outermost_aggregates(value: exp.Expr) -> list[exp.Expr]:
    """The aggregate calls in ``value`` that no other aggregate in it holds."""
    found = []
    for agg in value.find_all(exp.AggFunc):
        at = agg.parent
        while at is not None and at is not value.parent and not isinstance(at, exp.AggFunc):
            at = at.parent
        if not isinstance(at, exp.AggFunc):
            found.append(agg)
    return found


_Bound = tuple[Decimal | None, bool, Decimal | None, bool]
"""An interval of a column's values: low, low included, high, high included."""


def _apart(groups: list[list[exp.Expr]]) -> bool:
    """Whether no row can meet two of ``groups`` (each a conjunction): each pair
    bounds some column to ranges that do not meet, by comparisons with numbers
    (``q BETWEEN 1 AND 20`` and ``q BETWEEN 21 AND 40``; ``h = 8 AND m >= 30`` and
    ``h = 9 AND m < 30``). A NULL meets no comparison, so it is in neither."""
    bounds = [_bounds(keep) for keep in groups]
    for x, a in enumerate(bounds):
        for b in bounds[x + 1 :]:
            if not any(_empty([*a[c], *b[c]]) for c in a.keys() & b.keys()):
                return False
    return True


def _bounds(conds: list[exp.Expr]) -> dict[str, list[_Bound]]:
    out: dict[str, list[_Bound]] = {}
    for cond in conds:
        found = _bound(cond)
        if found is not None:
            out.setdefault(found[0], []).append(found[1])
    return out


_FLIPPED: dict[type[exp.Expr], type[exp.Expr]] = {
    exp.EQ: exp.EQ,
    exp.LT: exp.GT,
    exp.LTE: exp.GTE,
    exp.GT: exp.LT,
    exp.GTE: exp.LTE,
}


def _bound(cond: exp.Expr) -> tuple[str, _Bound] | None:
    """(column, interval) where ``cond`` compares a column with numbers."""
    if isinstance(cond, exp.Paren):
        return _bound(cond.this)
    if isinstance(cond, exp.Between) and isinstance(cond.this, exp.Column):
        low, high = _number(cond.args.get("low")), _number(cond.args.get("high"))
        if low is None or high is None:
            return None
        return cond.this.sql(), (low, True, high, True)
    op = type(cond)
    if op not in _FLIPPED:
        return None
    column, other = cond.this, cond.expression
    if not isinstance(column, exp.Column):
        column, other, op = other, column, _FLIPPED[op]
    value = _number(other)
    if not isinstance(column, exp.Column) or value is None:
        return None
    name = column.sql()
    if op is exp.EQ:
        return name, (value, True, value, True)
    if op in (exp.LT, exp.LTE):
        return name, (None, False, value, op is exp.LTE)
    return name, (value, op is exp.GTE, None, False)


def _number(e: exp.Expr | None) -> Decimal | None:
    """The value of a numeric literal (negated or not); None for anything else."""
    if isinstance(e, exp.Neg):
        inner = _number(e.this)
        return -inner if inner is not None else None
    if isinstance(e, exp.Literal) and e.is_number:
        try:
            return Decimal(e.this)
        except InvalidOperation:
            return None
    return None


def _empty(intervals: list[_Bound]) -> bool:
    """Whether no value lies in every one of ``intervals``."""
    low, low_in, high, high_in = None, False, None, False
    for lo, lo_in, hi, hi_in in intervals:
        if lo is not None and (low is None or lo > low or (lo == low and not lo_in)):
            low, low_in = lo, lo_in
        if hi is not None and (high is None or hi < high or (hi == high and not hi_in)):
            high, high_in = hi, hi_in
    if low is None or high is None:
        return False
    return low > high or (low == high and not (low_in and high_in))
