"""Aggregates in two phases: which split into a partial and a final aggregate, and
how each final expression combines the partial ones (AVG as SUM / COUNT)."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from mangonel.sql.exprs import col, grouping_sets

FinalOf = Callable[[str, str], exp.Expr]
"""(aggregate output name, partial aggregate's qualifier) -> the final expression."""


def split_aggs(
    aggs: list[tuple[str, exp.Expr]],
) -> tuple[list[tuple[str, exp.Expr]], FinalOf] | None:
    """Partial aggregate items and a function that builds each final expression.

    Returns None when some aggregate does not split into partial and final.
    """
    partial: list[tuple[str, exp.Expr]] = []
    plans: dict[str, tuple[str, list[str]]] = {}
    casts: dict[str, exp.DataType] = {}
    for name, a in aggs:
        # An aggregate of the rows a FILTER keeps: its partials keep the same rows,
        # and the final merges them as it would unfiltered partials (a COUNT of no
        # row is 0, a SUM NULL).
        where = a.expression if isinstance(a, exp.Filter) else None
        if where is not None:
            a = a.this
        if isinstance(a, exp.Filter) or a.args.get("distinct") or isinstance(a.this, exp.Distinct):
            return None
        start = len(partial)
        if isinstance(a, exp.Count):
            partial.append((f"{name}_c", a.copy()))
            plans[name] = ("count", [f"{name}_c"])
        elif isinstance(a, exp.Sum) and len(a.expressions) == 0:
            partial.append((f"{name}_s", a.copy()))
            plans[name] = ("sum", [f"{name}_s"])
        elif type(a) in (exp.Min, exp.Max) and not a.expressions:
            partial.append((f"{name}_m", a.copy()))
            plans[name] = ("min" if isinstance(a, exp.Min) else "max", [f"{name}_m"])
        elif isinstance(a, exp.Cast) and isinstance(a.this, exp.Sum) and not a.this.expressions:
            # A COUNT's final form (``CAST(SUM(c) AS BIGINT)``) over partial rows that
            # an eager aggregate made (``plan.eager``): a sum again, cast the same.
            partial.append((f"{name}_s", a.this.copy()))
            plans[name] = ("cast", [f"{name}_s"])
            casts[name] = a.to.copy()
        elif isinstance(a, exp.Avg):
            partial.append((f"{name}_s", exp.Sum(this=a.this.copy())))
            partial.append((f"{name}_c", exp.Count(this=a.this.copy())))
            plans[name] = ("avg", [f"{name}_s", f"{name}_c"])
        else:
            return None
        if where is not None:
            partial[start:] = [
                (n, exp.Filter(this=p, expression=where.copy())) for n, p in partial[start:]
            ]

    def final(name: str, pq: str) -> exp.Expr:
        how, parts = plans[name]
        cols = [col((pq, p)) for p in parts]
        if how == "count":
            return exp.cast(exp.Sum(this=cols[0]), "BIGINT")
        if how == "sum":
            return exp.Sum(this=cols[0])
        if how == "cast":
            return exp.Cast(this=exp.Sum(this=cols[0]), to=casts[name].copy())
        if how == "min":
            return exp.Min(this=cols[0])
        if how == "max":
            return exp.Max(this=cols[0])
        total = exp.cast(exp.Sum(this=cols[0]), "DOUBLE")
        count = exp.Nullif(this=exp.Sum(this=cols[1]), expression=exp.Literal.number(0))
        return exp.Div(this=total, expression=count)

    return partial, final


def common_grouping_keys(grouping: exp.Expr) -> list[exp.Expr]:
    """Expressions present in every grouping set (rows equal on them share a task)."""
    sets = grouping_sets(grouping)
    if not sets:
        return []
    common = sets[0]
    for s in sets[1:]:
        common = [e for e in common if e in s]
    return common
