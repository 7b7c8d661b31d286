"""Inner joins that only filter one side, run as semi joins where duplicates do not matter.

TPC-DS q95 reads ``ws_wh``, ``web_sales`` joined with itself on the order number
where the warehouses differ, only as ``x IN (SELECT ws_order_number FROM ws_wh)``:
the join made 8.7M rows (each order's line items times each other's) to keep 60k
distinct order numbers, 0.3 s in each of the two subqueries' tasks. Where only the
*set* of a join's rows matters and the join's reader reads columns of one side
alone, ``L ⋈ R`` keeps the same set as ``L ⋉ R`` (each row of ``L`` that meets
``R`` at least once), which DuckDB stops probing at the first match: the same
60k orders in half the time (DuckDB alone, one thread: 0.19 → 0.09 s). Calcite's
``SemiJoinRule`` does the same under an aggregate without aggregate calls.

*Where only the set matters* (the rows' multiplicities do not reach the result):

* the rows of a subquery read only as the list of an ``IN`` (``NOT IN`` too: both
  ask whether a value, or a NULL, is in the list);
* the input of a DISTINCT, of an aggregate with group keys and no aggregate call,
  of a set operation that drops duplicates, and the far side of a semi or anti join;
* and, below one of those, the input of a projection or a filter (the same set in,
  the same set out), both inputs of a join (duplicates of one side make duplicates
  of the output rows, never new ones), both sides of a UNION ALL, and the kept
  side of a semi or anti join; a sort without LIMIT or OFFSET.

An expression whose value may change call by call (``VOLATILE``) stops it, as
does a node read by several parents (a shared CTE: its other readers may count
rows), a window, an aggregate call, a LIMIT.

*When*: the side whose columns are all the join's reader reads is kept, and only

* where the other side's key is not known unique (a footer's distinct count equal
  to its rows: ``d_date_sk``): a join on a unique key meets each kept row once
  already, as many rows as a semi join keeps, for the same work in DuckDB;
* and where the kept side is at least as big as the other, both by its estimated
  rows and by the bytes of tables it scans (rows times the columns' width, as
  splits are sized). An inner join broadcasts whichever side is smaller, a semi
  join only its far side; and a join runs in the tasks of the side that scans the
  most, where the other's small scan is read by each task (TPC-DS q54's 100k
  ``customer`` rows, kept from a join of them with two sales tables, became a
  stage of its own that the sales' task read). q95's second list, ``web_returns
  ⋈ ws_wh``, keeps the 72k returns: it stays an inner join, and the ``ws_wh``
  under it becomes the semi join.

Nodes are changed in place, before eager aggregation and the distributor.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from mangonel.catalog import Table
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
    Sort,
    Values,
    Window,
    required_columns,
    scan_table,
    walk,
    walk_once,
)
from mangonel.sql.exprs import VOLATILE

__all__ = ["membership", "semi_joins"]


def semi_joins(
    root: Node,
    subqueries: Mapping[str, Node],
    estimator: Estimator,
    catalog: Mapping[str, Table],
) -> int:
    """Turn the inner joins under ``root`` and ``subqueries`` whose reader needs only
    the set of one side's rows into semi joins (see the module), in place.

    Returns how many joins changed; the estimator forgets the sizes it had of them
    and of the nodes above.
    """
    roots = [root, *subqueries.values()]
    parents: dict[int, int] = {}
    for node in walk_once(roots):
        for child in node.children():
            parents[id(child)] = parents.get(id(child), 0) + 1
    for r in roots:
        parents[id(r)] = parents.get(id(r), 0) + 1
    needs: dict[Node, set[Ref]] = {}
    for tree in roots:
        for node, cols in required_columns(tree).items():
            needs[node] = needs.get(node, set()) | cols
    lists = _list_only(roots, subqueries)
    rule = _Rule(parents, needs, estimator, catalog)
    rule.visit(root, False)
    for name, sub in subqueries.items():
        rule.visit(sub, name in lists)
    if rule.changed:
        estimator.forget()
    return rule.changed


class _Rule:
    def __init__(
        self,
        parents: dict[int, int],
        needs: dict[Node, set[Ref]],
        estimator: Estimator,
        catalog: Mapping[str, Table],
    ) -> None:
        self._parents = parents
        self._needs = needs
        self._estimator = estimator
        self._catalog = catalog
        self._seen: set[int] = set()
        self.changed = 0

    def visit(self, node: Node, as_set: bool) -> None:
        """``node``, whose reader needs only the set of its rows when ``as_set``."""
        if id(node) in self._seen:
            return  # a shared node: reached from another parent, not as a set
        self._seen.add(id(node))
        as_set = as_set and self._parents.get(id(node), 0) <= 1
        if isinstance(node, Join) and as_set and node.kind is JoinKind.INNER:
            self._to_semi(node)
        for child, child_as_set in self._children(node, as_set):
            self.visit(child, child_as_set)

    def _to_semi(self, n: Join) -> None:
        if not n.left_keys or not _fixed(*n.left_keys, *n.right_keys, n.residual):
            return
        need = self._needs.get(n, set(n.outputs()))
        if need <= set(n.left.outputs()) and self._keeps(n.left, n.right, n.right_keys):
            n.kind = JoinKind.SEMI
        elif need <= set(n.right.outputs()) and self._keeps(n.right, n.left, n.left_keys):
            n.left, n.right = n.right, n.left
            n.left_keys, n.right_keys = n.right_keys, n.left_keys
            n.kind = JoinKind.SEMI
        else:
            return
        self.changed += 1

    def _keeps(self, kept: Node, other: Node, other_keys: list[exp.Expr]) -> bool:
        """Whether a semi join may keep ``kept``'s rows that meet ``other`` (see
        "When" in the module's docstring)."""
        size = self._estimator.size(other)
        if any(isinstance(k, exp.Column) and (k.table, k.name) in size.unique for k in other_keys):
            return False
        no_fewer_rows = self._estimator.size(kept).rows >= size.rows
        return no_fewer_rows and self._scanned(kept) >= self._scanned(other)

    def _scanned(self, node: Node) -> float:
        """Bytes of tables the scans under ``node`` read."""
        return sum(
            scan_table(self._catalog, s).rows * scan_table(self._catalog, s).row_width(s.columns)
            for s in walk(node)
            if isinstance(s, Scan)
        )

    def _children(self, node: Node, as_set: bool) -> list[tuple[Node, bool]]:
        """Each child of ``node``, and whether only the set of its rows matters."""
        if isinstance(node, Distinct):
            return [(node.child, True)]
        if isinstance(node, Aggregate):
            plain = not node.aggs and node.grouping is None and node.groups
            return [(node.child, bool(plain) and _fixed(*(e for _, e in node.groups)))]
        if isinstance(node, SetOp):
            # UNION, INTERSECT and EXCEPT that drop duplicates are operations on
            # sets; a UNION ALL passes each side's rows on as they are.
            sides = node.distinct or (as_set and node.kind is SetKind.UNION)
            return [(node.left, sides), (node.right, sides)]
        if isinstance(node, Join):
            fixed = _fixed(*node.left_keys, *node.right_keys, node.residual)
            if node.kind in (JoinKind.SEMI, JoinKind.ANTI):
                return [(node.left, as_set and fixed), (node.right, fixed)]
            return [(node.left, as_set and fixed), (node.right, as_set and fixed)]
        if isinstance(node, Project):
            return [(node.child, as_set and _fixed(*(e for _, e in node.items)))]
        if isinstance(node, Filter):
            return [(node.child, as_set and _fixed(node.condition))]
        if isinstance(node, Sort):
            whole = node.limit is None and not node.offset
            return [(node.child, as_set and whole)]
        return [(c, False) for c in node.children()]  # a window, a Keep, ...


def _fixed(*exprs: exp.Expr | None) -> bool:
    """No expression whose value may change call by call (``random()``): over the
    same set of rows, the same set of results."""
    return not any(e is not None and e.find(*VOLATILE) is not None for e in exprs)


def _list_only(roots: list[Node], subqueries: Mapping[str, Node]) -> set[str]:
    """The subqueries every reader of which reads as the list of an ``IN``."""
    uses: dict[str, list[bool]] = {}
    for node in walk_once(roots):
        for e in _expressions(node):
            for t in e.find_all(exp.Table):
                if t.name in subqueries:
                    uses.setdefault(t.name, []).append(membership(t))
    return {name for name, kinds in uses.items() if kinds and all(kinds)}


def _expressions(node: Node) -> list[exp.Expr]:
    """The expressions of ``node`` that may read a subquery's placeholder."""
    if isinstance(node, Filter):
        return [node.condition]
    if isinstance(node, Scan):
        return [node.filter] if node.filter is not None else []
    if isinstance(node, Join):
        return [*node.left_keys, *node.right_keys] + ([node.residual] if node.residual else [])
    if isinstance(node, Project):
        return [e for _, e in node.items]
    if isinstance(node, Aggregate):
        extra = [node.grouping] if node.grouping is not None else []
        return [e for _, e in node.groups + node.aggs] + extra
    if isinstance(node, Window):
        return [e for _, e in node.funcs]
    if isinstance(node, Sort):
        return list(node.keys)
    if isinstance(node, Values):
        return [node.query]
    return []


def membership(placeholder: exp.Table) -> bool:
    """True when the subquery read as ``placeholder`` is the list of an ``IN``:
    ``x IN (SELECT * FROM __sqN)``, as the binder lifts it, not a scalar subquery
    on either side of one."""
    select = placeholder.find_ancestor(exp.Select)
    wrapper = select.parent if select is not None else None
    owner = wrapper.parent if isinstance(wrapper, exp.Subquery) else None
    return isinstance(owner, exp.In) and owner.args.get("query") is wrapper
