"""The logical plan: a small typed tree of relational operators.

Every node produces columns named by a ``Ref`` = (qualifier, name), e.g.
``("lineitem", "l_orderkey")`` for a scan or ``("_agg1", "_a0")`` for an
aggregate's output. Expressions are sqlglot trees whose ``exp.Column`` nodes use
``table=qualifier, this=name``; they refer only to the node's input columns.
In a stage's SQL each Ref becomes one column named ``"qualifier.name"``.

::

    Scan ── Filter ── Join ── Aggregate ── Window ── Project ── Distinct ── Sort
                                   SetOp, Values, StageRead (an exchange's far side)

``JoinGroup`` (inner joins not yet ordered) exists only between ``plan.bind`` and
``plan.join_order``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from mangonel.catalog import Table
from mangonel.sql.exprs import VOLATILE

Ref = tuple[str, str]


def phys(ref: Ref) -> str:
    """The column name a Ref has inside a stage's SQL."""
    return f"{ref[0]}.{ref[1]}"


class JoinKind(enum.Enum):
    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    """Only while binding: a RIGHT join becomes a LEFT join with its sides swapped."""
    FULL = "full"
    SEMI = "semi"
    ANTI = "anti"
    CROSS = "cross"


class Node:
    """Base of the logical operators."""

    def outputs(self) -> list[Ref]:
        raise NotImplementedError

    def children(self) -> list[Node]:
        return []


@dataclass(frozen=True)
class Pruned:
    """The row groups of a scan's table that may meet a row of the result, where a
    rule proved the others cannot (``plan.dynamic_pruning``)."""

    table: Table
    """The catalog table with only those row groups, and its statistics narrowed to
    them: the scan's splits and estimates are made from it (``scan_table``)."""
    why: str
    """What EXPLAIN says, e.g. ``92 of 96 row groups dropped: ...``."""


@dataclass(eq=False)
class Scan(Node):
    table: str
    alias: str
    columns: list[str]
    filter: exp.Expr | None = None
    pruned: Pruned | None = None
    """Row groups that cannot meet the result, dropped at plan time; None: all read."""

    def outputs(self) -> list[Ref]:
        return [(self.alias, c) for c in self.columns]


def scan_table(catalog: Mapping[str, Table], scan: Scan) -> Table:
    """The table a scan reads: its catalog table, less the row groups pruned from it."""
    return scan.pruned.table if scan.pruned is not None else catalog[scan.table]


@dataclass(eq=False)
class Values(Node):
    """A literal relation (``VALUES`` or a SELECT without FROM): one stage, one task."""

    qualifier: str
    names: list[str]
    query: exp.Expr

    def outputs(self) -> list[Ref]:
        return [(self.qualifier, n) for n in self.names]


@dataclass(eq=False)
class Filter(Node):
    child: Node
    condition: exp.Expr

    def outputs(self) -> list[Ref]:
        return self.child.outputs()

    def children(self) -> list[Node]:
        return [self.child]


@dataclass(eq=False)
class Join(Node):
    left: Node
    right: Node
    kind: JoinKind
    left_keys: list[exp.Expr] = field(default_factory=list)
    right_keys: list[exp.Expr] = field(default_factory=list)
    residual: exp.Expr | None = None
    broadcast_right: bool = False
    """Broadcast the right side whenever it fits (a semi-join reduction: the point
    is to filter the left side where it is, before it moves)."""

    def outputs(self) -> list[Ref]:
        if self.kind in (JoinKind.SEMI, JoinKind.ANTI):
            return self.left.outputs()
        return self.left.outputs() + self.right.outputs()

    def children(self) -> list[Node]:
        return [self.left, self.right]


@dataclass(eq=False)
class JoinGroup(Node):
    """Sources inner-joined in the order the query wrote them, and the conditions
    that name only their aliases (in the query's order).

    Only between binding and join ordering: the binder emits one for each run of
    inner joins, and ``plan.join_order`` replaces it by a tree of ``Join`` nodes
    chosen by the estimates. Nothing after that sees one.
    """

    inputs: list[Node]
    conditions: list[exp.Expr]

    def outputs(self) -> list[Ref]:
        return [r for n in self.inputs for r in n.outputs()]

    def children(self) -> list[Node]:
        return list(self.inputs)


@dataclass(eq=False)
class Aggregate(Node):
    """GROUP BY. ``groups`` and ``aggs`` are (output name, expression)."""

    child: Node
    qualifier: str
    groups: list[tuple[str, exp.Expr]]
    aggs: list[tuple[str, exp.Expr]]
    grouping: exp.Expr | None = None
    """A GROUPING SETS / ROLLUP / CUBE clause over the group expressions, if any."""
    local: bool = False
    """Each task may aggregate only the rows it has (no exchange): an aggregate
    above merges its partial rows (``plan.eager``)."""

    def outputs(self) -> list[Ref]:
        return [(self.qualifier, n) for n, _ in self.groups + self.aggs]

    def children(self) -> list[Node]:
        return [self.child]


@dataclass(eq=False)
class Window(Node):
    child: Node
    qualifier: str
    funcs: list[tuple[str, exp.Expr]]

    def outputs(self) -> list[Ref]:
        return self.child.outputs() + [(self.qualifier, n) for n, _ in self.funcs]

    def children(self) -> list[Node]:
        return [self.child]


@dataclass(eq=False)
class Project(Node):
    child: Node
    qualifier: str
    items: list[tuple[str, exp.Expr]]

    def outputs(self) -> list[Ref]:
        return [(self.qualifier, n) for n, _ in self.items]

    def children(self) -> list[Node]:
        return [self.child]


@dataclass(eq=False)
class Distinct(Node):
    child: Node

    def outputs(self) -> list[Ref]:
        return self.child.outputs()

    def children(self) -> list[Node]:
        return [self.child]


@dataclass(eq=False)
class Sort(Node):
    """ORDER BY and/or LIMIT/OFFSET (either may be absent)."""

    child: Node
    keys: list[exp.Ordered]
    limit: int | None = None
    offset: int = 0

    def outputs(self) -> list[Ref]:
        return self.child.outputs()

    def children(self) -> list[Node]:
        return [self.child]


class SetKind(enum.Enum):
    UNION = "UNION"
    INTERSECT = "INTERSECT"
    EXCEPT = "EXCEPT"


@dataclass(eq=False)
class SetOp(Node):
    kind: SetKind
    distinct: bool
    left: Node
    right: Node
    qualifier: str
    names: list[str]

    def outputs(self) -> list[Ref]:
        return [(self.qualifier, n) for n in self.names]

    def children(self) -> list[Node]:
        return [self.left, self.right]


@dataclass(eq=False)
class StageRead(Node):
    """The output of a finished stage, read as a stage input named ``name``."""

    name: str
    refs: list[Ref]
    source: Node
    """The logical subtree that stage computes (for types and EXPLAIN)."""

    def outputs(self) -> list[Ref]:
        return list(self.refs)


@dataclass(eq=False)
class Keep(Node):
    """Only some of the child's columns: those the rest of the plan reads, kept
    where a stage ends so that no other column crosses the exchange."""

    child: Node
    refs: list[Ref]

    def outputs(self) -> list[Ref]:
        return list(self.refs)

    def children(self) -> list[Node]:
        return [self.child]


def walk(node: Node) -> Iterator[Node]:
    """``node`` and every node under it, parents first."""
    yield node
    for child in node.children():
        yield from walk(child)


def expressions(node: Node) -> Iterator[exp.Expr]:
    """The expressions ``node`` itself holds: its fields that are expressions, or
    lists of them, or of (name, expression) pairs."""
    for value in vars(node).values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            for part in item if isinstance(item, tuple) else (item,):
                if isinstance(part, exp.Expr):
                    yield part


def volatile(node: Node) -> bool:
    """True when ``node`` or a node under it (not past a stage's read) holds an
    expression whose value may change call by call (``random()``, ``VOLATILE``):
    computed twice, it may give other rows, so it is computed once, in one
    place, and its rows read from there (a sample of ``ORDER BY random() LIMIT
    10`` joined by two tasks is one sample, not two)."""
    return any(e.find(*VOLATILE) is not None for n in walk(node) for e in expressions(n))


def walk_once(roots: list[Node]) -> Iterator[Node]:
    """Every node under ``roots`` once, a node read by several parents (a shared
    CTE) included. A node's children are taken when the walk moves on from it, so
    a caller may replace them meanwhile and the walk goes into the new ones."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(node.children())


def required_columns(root: Node) -> dict[Node, set[Ref]]:
    """For each node under ``root``, the columns of it that the nodes
    above read: all of the root's, and for every other node what its parent's
    expressions name or pass on."""
    needs: dict[Node, set[Ref]] = {}

    def refs(*exprs: exp.Expr | None) -> set[Ref]:
        return {
            (c.table, c.name)
            for e in exprs
            if e is not None
            for c in e.find_all(exp.Column)
            if c.table
        }

    def visit(node: Node, need: set[Ref]) -> None:
        need = needs.get(node, set()) | need  # a node read twice: what both read
        needs[node] = need
        if isinstance(node, Filter):
            visit(node.child, need | refs(node.condition))
        elif isinstance(node, Join):
            used = need | refs(*node.left_keys, *node.right_keys, node.residual)
            for side in (node.left, node.right):
                mine = set(side.outputs())
                visit(side, {r for r in used if r in mine})
        elif isinstance(node, JoinGroup):
            used = need | refs(*node.conditions)
            for side in node.inputs:
                mine = set(side.outputs())
                visit(side, {r for r in used if r in mine})
        elif isinstance(node, Aggregate):
            visit(node.child, refs(*(e for _, e in node.groups + node.aggs), node.grouping))
        elif isinstance(node, Project):
            visit(node.child, refs(*(e for n, e in node.items if (node.qualifier, n) in need)))
        elif isinstance(node, Window):
            mine = set(node.child.outputs())
            visit(node.child, {r for r in need if r in mine} | refs(*(e for _, e in node.funcs)))
        elif isinstance(node, Sort):
            visit(node.child, need | refs(*node.keys))
        elif isinstance(node, Keep):
            visit(node.child, set(node.refs))
        else:  # Distinct and set operations compare whole rows; Opaque runs whole
            for child in node.children():
                visit(child, set(child.outputs()))

    visit(root, set(root.outputs()))
    return needs


@dataclass(eq=False)
class Opaque(Node):
    """A query the planner does not split: its SQL runs whole, in one task that
    scans its tables (``Distributor._opaque``).

    ``query`` refers to catalog tables by name; ``tables`` maps each name to the
    Scan of all its columns that the task reads whole.
    """

    query: exp.Query
    qualifier: str
    names: list[str]
    tables: dict[str, Node]

    def outputs(self) -> list[Ref]:
        return [(self.qualifier, n) for n in self.names]

    def children(self) -> list[Node]:
        return list(self.tables.values())
