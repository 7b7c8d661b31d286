"""A join that only filters a UNION ALL, moved into each of its branches.

TPC-DS q05 unions each channel's sales and returns (``store_sales`` and
``store_returns``: 3.2M rows) and joins the union with 15 days of ``date_dim``,
which keeps 1 % of them; ``date_dim``'s columns are read by no one above. A union
of two scans of several tasks each has no task that holds both: the planner
hashes both sides into the union's partitions (``Distributor._union_all_on``), so
all 3.2M rows crossed the executors before the join dropped 99 % of them. On two
hosts of one core q05 ran 15 stages in 0.81 s, against 0.19 s on one host (a
quiet machine, 2026-12-05, ``benchmarks/scaleout.py``).

An inner join distributes over a UNION ALL: each union row meets the same rows
of ``D`` in its branch as above it. Where no column of ``D`` is read above the
join, each branch joins ``D`` and keeps only its own columns::

    (A ∪ B) ⋈ D   ->   π_A(A ⋈ D) ∪ π_B(B ⋈ D)

The rows are the same, with the same multiplicities, whatever ``D``'s keys (a
key that repeats in ``D`` repeats union rows either way: the footers' estimate
of a key's distinct values is an upper bound, not a proof of uniqueness, so a
semi join is not used).

Each branch reads a copy of ``D`` of its own (``D`` is a scan under filters and
projections: a filtered dimension, scanned again by each branch's tasks; one node
read by both would be a shared node, a stage of its own and a stage that reads
it), broadcast into its scan tasks (``Join.broadcast_right``), which keep their
1 % where they are: the union hashes the rows that are left.

The union may sit under the projection that names a derived table's columns
(``FROM (... UNION ALL ...) AS salesreturns``); the keys are the union's columns
by position, through it. Nested UNION ALLs take the join into every branch.

Nodes are changed in place, after ``semi_joins`` and before eager aggregation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, MutableMapping

from sqlglot import exp

from mangonel.catalog import Table
from mangonel.plan.estimate import Estimator
from mangonel.plan.logical import (
    Filter,
    Join,
    JoinKind,
    Node,
    Project,
    Ref,
    Scan,
    SetKind,
    SetOp,
    required_columns,
    scan_table,
    walk,
    walk_once,
)
from mangonel.sql.exprs import VOLATILE, col

__all__ = ["union_filters"]


def union_filters(
    root: Node,
    subqueries: MutableMapping[str, Node],
    estimator: Estimator,
    catalog: Mapping[str, Table],
    broadcast_bytes: float,
) -> Node:
    """Move each inner join that only filters a UNION ALL into its branches (see
    the module), where the other side is estimated within ``broadcast_bytes``.

    Returns the root (a new node where the root itself was such a join);
    ``subqueries`` are updated in place, and the estimator forgets its sizes
    where anything changed.
    """
    roots = {"": root, **subqueries}
    parents: dict[int, int] = {}
    for node in walk_once(list(roots.values())):
        for child in node.children():
            parents[id(child)] = parents.get(id(child), 0) + 1
    needs: dict[Node, set[Ref]] = {}
    for tree in roots.values():
        for node, cols in required_columns(tree).items():
            needs[node] = needs.get(node, set()) | cols
    changed: dict[int, Node] = {}
    names = itertools.count(1)
    """Qualifiers of the branches' projections (``_ufN``), one series a plan."""
    for node in walk_once(list(roots.values())):
        if isinstance(node, Join) and parents.get(id(node), 0) <= 1:
            moved = _into_branches(node, needs, parents, estimator, catalog, broadcast_bytes, names)
            if moved is not None:
                changed[id(node)] = moved
    if not changed:
        return root
    estimator.forget()
    for node in walk_once(list(roots.values())):
        for attr in ("child", "left", "right"):
            child = getattr(node, attr, None)
            if child is not None and id(child) in changed:
                setattr(node, attr, changed[id(child)])
    for name, tree in roots.items():
        if name and id(tree) in changed:
            subqueries[name] = changed[id(tree)]
    return changed.get(id(root), root)


def _into_branches(
    n: Join,
    needs: dict[Node, set[Ref]],
    parents: dict[int, int],
    estimator: Estimator,
    catalog: Mapping[str, Table],
    broadcast_bytes: float,
    names: Iterator[int],
) -> Node | None:
    """The node that replaces ``n`` with its filter moved into the branches of the
    union it joins, or None where it does not only filter one."""
    if n.kind is not JoinKind.INNER or not n.left_keys or n.residual is not None:
        return None
    if any(e.find(*VOLATILE) is not None for e in (*n.left_keys, *n.right_keys)):
        return None
    need = needs.get(n, set(n.outputs()))
    for kept, other, kept_keys, other_keys in (
        (n.left, n.right, n.left_keys, n.right_keys),
        (n.right, n.left, n.right_keys, n.left_keys),
    ):
        if not need <= set(kept.outputs()) or not _scan_chain(other):
            continue
        union, positions = _union_under(kept, kept_keys, parents)
        if union is None or positions is None:
            continue
        size = estimator.size(other)
        width = sum(
            scan_table(catalog, s).row_width(s.columns) for s in walk(other) if isinstance(s, Scan)
        )
        if size.rows * width > broadcast_bytes:
            continue
        _filter_branches(union, positions, other, other_keys, names, parents)
        return kept
    return None


def _union_under(
    node: Node, keys: list[exp.Expr], parents: dict[int, int]
) -> tuple[SetOp | None, list[int] | None]:
    """The UNION ALL that ``node`` is (or names the columns of, as a derived
    table's projection of plain columns), and the positions of its columns that
    ``keys`` (plain columns of ``node``) are; None where it is not one or is read
    by another parent too."""
    items: dict[Ref, exp.Expr] = {}
    union: Node = node
    if isinstance(node, Project):
        items = {(node.qualifier, name): e for name, e in node.items}
        union = node.child
    if not _union_all(union) or parents.get(id(union), 0) > 1:
        return None, None
    assert isinstance(union, SetOp)
    positions: list[int] = []
    for key in keys:
        if not isinstance(key, exp.Column):
            return union, None
        ref: Ref = (key.table, key.name)
        if items:
            inner = items.get(ref)
            if not isinstance(inner, exp.Column):
                return union, None
            ref = (inner.table, inner.name)
        if ref[0] != union.qualifier or ref[1] not in union.names:
            return union, None
        positions.append(union.names.index(ref[1]))
    return union, positions


def _filter_branches(
    union: SetOp,
    positions: list[int],
    other: Node,
    other_keys: list[exp.Expr],
    names: Iterator[int],
    parents: dict[int, int],
) -> None:
    """Join each branch of ``union`` (nested UNION ALLs included, unless another
    parent reads one: it is a branch whole) with a copy of ``other`` on its
    columns at ``positions``, keeping the branch's columns."""
    for side in ("left", "right"):
        branch: Node = getattr(union, side)
        if _union_all(branch) and parents.get(id(branch), 0) <= 1:
            assert isinstance(branch, SetOp)
            _filter_branches(branch, positions, other, other_keys, names, parents)
            continue
        outputs = branch.outputs()
        keys: list[exp.Expr] = [col(outputs[p]) for p in positions]
        joined = Join(
            branch,
            _copy(other),
            JoinKind.INNER,
            keys,
            [k.copy() for k in other_keys],
            broadcast_right=True,
        )
        qualifier = f"_uf{next(names)}"
        items = [(f"c{i}", col(ref)) for i, ref in enumerate(outputs)]
        setattr(union, side, Project(joined, qualifier, items))


def _scan_chain(node: Node) -> bool:
    """True when ``node`` is a scan under filters and projections only."""
    while isinstance(node, (Project, Filter)):
        node = node.child
    return isinstance(node, Scan)


def _copy(node: Node) -> Node:
    """A copy of a scan chain (``_scan_chain``): new nodes, the same columns."""
    if isinstance(node, Project):
        return Project(_copy(node.child), node.qualifier, [(n, e.copy()) for n, e in node.items])
    if isinstance(node, Filter):
        return Filter(_copy(node.child), node.condition.copy())
    assert isinstance(node, Scan)
    condition = node.filter.copy() if node.filter is not None else None
    return Scan(node.table, node.alias, list(node.columns), condition, node.pruned)


def _union_all(node: Node) -> bool:
    return isinstance(node, SetOp) and node.kind is SetKind.UNION and not node.distinct
