"""Interesting partitionings: the keys a node's readers would have it hashed on.

An aggregate is hashed on its group keys so that each group is made in one task;
any subset of them does as well, since rows equal on all the group keys are equal
on the subset. Which subset is a choice, and the best one is the key its readers
join on: the join then reads the aggregate partition by partition instead of
hashing it again. TPC-DS q04's ``year_total`` (three channels UNION ALL, each
grouped by seven customer columns and the year) is read six times, each reader
joining on ``customer_id``: hashed on all eight group keys, the union was written
whole and each of six one-task stages read all of it to hash its channel and year
again on ``customer_id``.

``wanted_keys`` walks the query from its roots down and gives each node the
columns its readers want it hashed on: a join wants each side hashed on that
side's keys; a filter, a projection that passes the columns through, and a UNION
ALL (by position) pass the want on to their inputs; a node read by several
parents (a shared CTE) has a want only when all of them want the same columns.
Any other reader wants nothing, and neither does a root (the client reads it).
The distributor consults the want where it chooses keys freely: an aggregate's
exchange (``Distributor._aggregate``) and a UNION ALL's (``Distributor._setop``).
"""

from __future__ import annotations

from sqlglot import exp

from mangonel.plan.distribute.keys import column_ref
from mangonel.plan.logical import (
    Aggregate,
    Filter,
    Join,
    JoinKind,
    Node,
    Project,
    Ref,
    SetKind,
    SetOp,
    walk_once,
)

Want = tuple[Ref, ...]
"""Columns of a node's outputs, in the order a join lists its keys (the hash of
(a, b) is not the hash of (b, a))."""


def wanted_keys(roots: list[Node]) -> dict[Node, Want]:
    """For each node under ``roots`` that its readers agree on, the columns of its
    outputs they want it hashed on. A node absent wants nothing."""
    parents: dict[Node, int] = {}
    for node in walk_once(roots):
        for child in node.children():
            parents[child] = parents.get(child, 0) + 1
    # Each node is decided once every parent has passed it its want: parents
    # first (Kahn's order over the DAG the shared nodes make).
    asked: dict[Node, list[Want | None]] = {}
    ready = list(dict.fromkeys(r for r in roots if parents.get(r, 0) == 0))
    for root in roots:
        # A root is read by the client (or by the expression a subquery sits
        # in): it wants nothing of it.
        asked.setdefault(root, []).append(None)
    out: dict[Node, Want] = {}
    while ready:
        node = ready.pop()
        wants = asked.pop(node, [])
        want = wants[0] if wants and all(w == wants[0] for w in wants) else None
        if want is not None:
            out[node] = want
        for child, child_want in _passed_on(node, want):
            asked.setdefault(child, []).append(child_want)
            parents[child] -= 1
            if parents[child] == 0:
                ready.append(child)
    return out


def _passed_on(node: Node, want: Want | None) -> list[tuple[Node, Want | None]]:
    """Each child of ``node`` with what ``node`` wants of it, given what is
    wanted of ``node``."""
    if isinstance(node, Join):
        if node.kind is JoinKind.CROSS or not node.left_keys:
            return [(node.left, None), (node.right, None)]
        return [(node.left, _refs(node.left_keys)), (node.right, _refs(node.right_keys))]
    if isinstance(node, Filter):
        return [(node.child, want)]
    if isinstance(node, Project):
        return [(node.child, _through_project(node, want))]
    if isinstance(node, SetOp) and node.kind is SetKind.UNION and not node.distinct:
        positions = _positions(node.outputs(), want)
        return [
            (side, tuple(side.outputs()[i] for i in positions) if positions else None)
            for side in (node.left, node.right)
        ]
    return [(child, None) for child in node.children()]


def _refs(keys: list[exp.Expr]) -> Want | None:
    """The columns a join's keys name, when each key is a plain column."""
    refs = [column_ref(k) for k in keys]
    if any(r is None for r in refs):
        return None
    return tuple(r for r in refs if r is not None)


def _through_project(node: Project, want: Want | None) -> Want | None:
    """The child's columns that ``node`` passes through as the wanted ones."""
    if want is None:
        return None
    items = {(node.qualifier, name): e for name, e in node.items}
    refs = [column_ref(items[r]) if r in items else None for r in want]
    if any(r is None for r in refs):
        return None
    return tuple(r for r in refs if r is not None)


def _positions(outputs: list[Ref], want: Want | None) -> list[int] | None:
    if want is None or any(r not in outputs for r in want):
        return None
    return [outputs.index(r) for r in want]


def aggregate_keys(n: Aggregate, want: Want | None) -> list[str] | None:
    """The names of ``n``'s group columns to hash it on, as its readers want: a
    subset of them (in the readers' order), or None to hash on all of them.

    Grouping sets keep their own keys (the keys common to every set), and a
    local aggregate (eager, under a join) does not hash.
    """
    if want is None or n.grouping is not None or n.local or not n.groups:
        return None
    names = {(n.qualifier, name): name for name, _ in n.groups}
    if any(r not in names for r in want):
        return None
    return [names[r] for r in want]


def union_positions(n: SetOp, want: Want | None) -> list[int] | None:
    """The positions of a UNION ALL's columns to hash both sides on, as its
    readers want; None for any other set operation (they hash on all columns)."""
    if n.kind is not SetKind.UNION or n.distinct:
        return None
    return _positions(n.outputs(), want)
