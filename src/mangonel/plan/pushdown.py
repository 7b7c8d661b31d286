"""Filter pushdown over the bound plan: every condition as close to its scan as it may go.

The binder already puts a condition that names one FROM item on that item. What
it leaves above a node is what sqlglot's rules do not move and the binder cannot:

* through a projection, a derived table's or a CTE's, by writing the condition
  over the expressions the projection computes;
* below an aggregate, when the condition names only GROUP BY keys (a group keeps
  or loses all of its rows together): ``WITH ss AS (SELECT d_year, ..., sum(x) ...
  GROUP BY d_year, ...) SELECT ... FROM ss WHERE ss.d_year = 2000`` aggregates one
  year, not five (TPC-DS q78: sqlglot moves a WHERE into a grouped select only as
  a HAVING, which the binder runs after the aggregate);
* to the preserved side of an outer join, and to either side of an inner one;
* across a join's equality keys: rows that meet on ``l.k = r.k`` where ``l.k =
  2000`` holds can only be those where ``r.k = 2000`` does, so the other side is
  filtered too (q78's three channels join on the sale's year: the web and catalog
  aggregates keep one year as well). From the preserved side of an outer or anti
  join to the other only; both ways for inner and semi joins.

It stops at what it may not cross: a node read twice (a CTE the binder shares;
each reader has its own filters, see ``sql.shared_ctes``), grouping sets, windows,
sort/limit, set operations, a full join, and conditions that hold a subquery or a
function whose value may change call by call (``VOLATILE``). Nodes are changed in
place; the plan computes the same rows, over fewer of them.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from sqlglot import exp

from mangonel.plan.logical import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    JoinGroup,
    JoinKind,
    Node,
    Project,
    Ref,
    Scan,
    walk_once,
)
from mangonel.sql.exprs import VOLATILE, and_all, col, conjuncts, has_subquery, substitute

__all__ = ["push_filters"]

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
"""Comparisons that may cross a join key: ``key <op> constant`` (either way round)."""


def push_filters(root: Node, subqueries: MutableMapping[str, Node]) -> Node:
    """``root`` and the subqueries (``bind.Binder.subqueries``, replaced in place)
    with their filters pushed down. Returns the new root."""
    pusher = _Pusher([root, *subqueries.values()])
    for name in list(subqueries):
        subqueries[name] = pusher.sink(subqueries[name], [])
    return pusher.sink(root, [])


def _refs(e: exp.Expr) -> set[Ref]:
    return {(c.table, c.name) for c in e.find_all(exp.Column)}


def _movable(cond: exp.Expr) -> bool:
    """A condition that may be evaluated anywhere its columns are: no subquery, no
    call-by-call function, no aggregate or window, and a column at least."""
    return (
        not has_subquery(cond)
        and not any(isinstance(n, (*VOLATILE, exp.AggFunc, exp.Window)) for n in cond.walk())
        and bool(_refs(cond))
    )


def _computable(e: exp.Expr) -> bool:
    """A projected expression a condition may be written over below its projection."""
    return not has_subquery(e) and not any(
        isinstance(n, (*VOLATILE, exp.AggFunc, exp.Window)) for n in e.walk()
    )


def _over(cond: exp.Expr, mapping: dict[Ref, exp.Expr]) -> exp.Expr | None:
    """``cond`` written over ``mapping``'s expressions, or None when it names a
    column the mapping does not compute."""
    refs = _refs(cond)
    if not refs or not refs <= mapping.keys() or not all(_computable(mapping[r]) for r in refs):
        return None

    def repl(n: exp.Expr) -> exp.Expr | None:
        if isinstance(n, exp.Column):
            return mapping[(n.table, n.name)].copy()
        return None

    return substitute(cond, repl)


def _key_column(e: exp.Expr) -> Ref | None:
    while isinstance(e, exp.Paren):
        e = e.this
    return (e.table, e.name) if isinstance(e, exp.Column) and e.table else None


def _constant(e: exp.Expr) -> bool:
    return not any(isinstance(n, (exp.Column, exp.Query, *VOLATILE)) for n in e.walk())


def _key_filter(cond: exp.Expr) -> Ref | None:
    """The column of a condition ``column <op> constant``, ``column IN (constants)``
    or ``column BETWEEN constants``, which a join key equal to it meets as well."""
    while isinstance(cond, exp.Paren):
        cond = cond.this
    if isinstance(cond, _COMPARISONS):
        for this, other in ((cond.left, cond.right), (cond.right, cond.left)):
            ref = _key_column(this)
            if ref is not None and _constant(other):
                return ref
        return None
    if isinstance(cond, exp.In) and not cond.args.get("query") and cond.expressions:
        ref = _key_column(cond.this)
        return ref if ref is not None and all(_constant(e) for e in cond.expressions) else None
    if isinstance(cond, exp.Between):
        ref = _key_column(cond.this)
        if ref is not None and _constant(cond.args["low"]) and _constant(cond.args["high"]):
            return ref
    return None


def _across(conds: Iterable[exp.Expr], pairs: list[tuple[Ref, Ref]]) -> list[exp.Expr]:
    """The key filters among ``conds`` written over the other column of each key
    pair ``(this side's column, other side's column)``."""
    out: list[exp.Expr] = []
    for cond in conds:
        ref = _key_filter(cond)
        for mine, theirs in pairs:
            copy = _over(cond, {mine: col(theirs)}) if ref == mine else None
            if copy is not None:
                out.append(copy)
    return out


class _Pusher:
    def __init__(self, roots: list[Node]) -> None:
        self._readers: dict[int, int] = {}
        for node in walk_once(roots):
            for child in node.children():
                self._readers[id(child)] = self._readers.get(id(child), 0) + 1
        self._done: dict[int, Node] = {}

    def sink(self, node: Node, conds: list[exp.Expr]) -> Node:
        """``node`` under ``conds``, each pushed as far down as it may go, and every
        filter under ``node`` pushed too."""
        if self._readers.get(id(node), 0) > 1:
            done = self._done.get(id(node))
            if done is None:
                done = self._done[id(node)] = self.sink_owned(node, [])
            return _wrap(done, conds)
        return self.sink_owned(node, conds)

    def sink_owned(self, node: Node, conds: list[exp.Expr]) -> Node:
        stay = [c for c in conds if not _movable(c)]
        move = [c for c in conds if _movable(c)]
        if isinstance(node, Filter):
            return _wrap(self.sink(node.child, [*conjuncts(node.condition), *move]), stay)
        if isinstance(node, Scan):
            if move:
                node.filter = and_all([*conjuncts(node.filter), *move])
            return _wrap(node, stay)
        if isinstance(node, Project):
            mapping = {(node.qualifier, n): e for n, e in node.items}
            node.child = self._sink_through(node.child, move, mapping, stay)
            return _wrap(node, stay)
        if isinstance(node, Aggregate) and node.grouping is None and node.groups:
            mapping = {(node.qualifier, n): e for n, e in node.groups}
            node.child = self._sink_through(node.child, move, mapping, stay)
            return _wrap(node, stay)
        if isinstance(node, Distinct):
            node.child = self.sink(node.child, move)
            return _wrap(node, stay)
        if isinstance(node, Join):
            return _wrap(self._join(node, move, stay), stay)
        if isinstance(node, JoinGroup):
            return _wrap(self._group(node, move, stay), stay)
        for child_field in ("child", "left", "right"):
            child = getattr(node, child_field, None)
            if isinstance(child, Node):
                setattr(node, child_field, self.sink(child, []))
        return _wrap(node, [*stay, *move])

    def _sink_through(
        self, child: Node, conds: list[exp.Expr], mapping: dict[Ref, exp.Expr], stay: list[exp.Expr]
    ) -> Node:
        down = []
        for c in conds:
            below = _over(c, mapping)
            if below is None:
                stay.append(c)
            else:
                down.append(below)
        return self.sink(child, down)

    def _known(self, node: Node) -> list[exp.Expr]:
        """Conditions every row of ``node`` meets, from the filters at its top (and
        under the joins there: a join keeps its left rows' values, and an inner
        join its right rows' too)."""
        if isinstance(node, Filter):
            return [*conjuncts(node.condition), *self._known(node.child)]
        if isinstance(node, Scan):
            return conjuncts(node.filter)
        if isinstance(node, Join) and node.kind is not JoinKind.FULL:
            inner = node.kind in (JoinKind.INNER, JoinKind.CROSS)
            return [*self._known(node.left), *(self._known(node.right) if inner else [])]
        return []

    def _join(self, node: Join, conds: list[exp.Expr], stay: list[exp.Expr]) -> Node:
        left_refs, right_refs = set(node.left.outputs()), set(node.right.outputs())
        left: list[exp.Expr] = []
        right: list[exp.Expr] = []
        for c in conds:
            refs = _refs(c)
            if refs <= left_refs and node.kind is not JoinKind.FULL:
                left.append(c)
            elif refs <= right_refs and node.kind in (JoinKind.INNER, JoinKind.CROSS):
                right.append(c)
            else:
                stay.append(c)
        pairs = [
            (lk, rk)
            for lk, rk in zip(
                map(_key_column, node.left_keys), map(_key_column, node.right_keys), strict=True
            )
            if lk is not None and rk is not None
        ]
        if pairs and node.kind is not JoinKind.FULL:
            # Left to right: the right rows a left row can meet are those of its keys.
            known_right = {c.sql() for c in self._known(node.right)}
            for c in _across([*left, *self._known(node.left)], pairs):
                if c.sql() not in known_right:
                    right.append(c)
                    known_right.add(c.sql())
        if pairs and node.kind in (JoinKind.INNER, JoinKind.SEMI):
            # Right to left: a left row is kept only where it meets a right row.
            flipped = [(rk, lk) for lk, rk in pairs]
            known_left = {c.sql() for c in [*left, *self._known(node.left)]}
            for c in _across([*right, *self._known(node.right)], flipped):
                if c.sql() not in known_left:
                    left.append(c)
                    known_left.add(c.sql())
        node.left = self.sink(node.left, left)
        node.right = self.sink(node.right, right)
        return node

    def _group(self, node: JoinGroup, conds: list[exp.Expr], stay: list[exp.Expr]) -> Node:
        outputs = [set(n.outputs()) for n in node.inputs]
        extra: list[list[exp.Expr]] = [[] for _ in node.inputs]
        for c in conds:
            refs = _refs(c)
            owner = next((i for i, o in enumerate(outputs) if refs <= o), None)
            if owner is not None:
                extra[owner].append(c)
            elif any(refs & o for o in outputs):
                node.conditions.append(c)  # inner joins: ON and WHERE are the same
            else:
                stay.append(c)
        # Across the group's column equalities, each way (all joins are inner).
        pairs: list[tuple[Ref, Ref]] = []
        for c in node.conditions:
            if isinstance(c, exp.EQ):
                a, b = _key_column(c.left), _key_column(c.right)
                if a is not None and b is not None and a != b:
                    pairs += [(a, b), (b, a)]
        if pairs:
            known = [
                {c.sql() for c in [*self._known(n), *extra[i]]} for i, n in enumerate(node.inputs)
            ]
            sources = [[*self._known(n), *extra[i]] for i, n in enumerate(node.inputs)]
            for i, have in enumerate(sources):
                for c in _across(have, pairs):
                    refs = _refs(c)
                    j = next((k for k, o in enumerate(outputs) if refs <= o), None)
                    if j is not None and j != i and c.sql() not in known[j]:
                        extra[j].append(c)
                        known[j].add(c.sql())
        node.inputs = [self.sink(n, extra[i]) for i, n in enumerate(node.inputs)]
        return node


def _wrap(node: Node, conds: list[exp.Expr]) -> Node:
    return Filter(node, and_all(conds)) if conds else node  # type: ignore[arg-type]
