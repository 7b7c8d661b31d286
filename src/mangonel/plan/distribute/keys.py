"""Join and exchange keys: their DuckDB types, and the casts that make two sides'
keys hash alike.

DuckDB's ``hash()`` depends on a value's type, so two sides hashed on keys of
different types (``INTEGER`` and ``BIGINT``) would send equal values to different
partitions: ``KeyTypes.cast_keys`` casts each pair to its common supertype first.
A key that is a table column passed up unchanged (``KeyTypes.ref_type``: through
filters, joins, renaming projections, group keys and set operations) takes the
catalog's type; anything else is bound by DuckDB over the rendered subtree.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from mangonel.errors import BindError
from mangonel.plan.bind import Unsupported
from mangonel.plan.fragment import Renderer, rewrite, sql
from mangonel.plan.logical import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    Keep,
    Node,
    Project,
    Ref,
    Scan,
    SetKind,
    SetOp,
    Sort,
    StageRead,
    Window,
    phys,
)
from mangonel.plan.types import TypeOracle


class KeyTypes:
    """Types of key expressions, from the catalog or from DuckDB.

    Args:
        oracle: DuckDB over empty tables, which binds expressions.
        subqueries: uncorrelated subqueries by placeholder name, rendered inline
            where a bound expression reads one.
    """

    def __init__(self, oracle: TypeOracle, subqueries: Mapping[str, Node]) -> None:
        self._oracle = oracle
        self._subqueries = subqueries
        self._read_types: dict[int, tuple[StageRead, list[tuple[str, str]]]] = {}
        """The columns' types of each stage read bound so far, by ``id`` (with the
        read itself, alive meanwhile): each stage's subtree is bound once, and
        the stages that read it bind an empty relation of those types in its
        place. Rendered whole at every level, a chain of set operations (TPC-DS
        q14) cost 3 of its 3.6 s of planning."""
        self._renderer = Renderer(
            expand_reads=True, subqueries=self._subqueries, read_types=self._stage_read_types
        )

    def _stage_read_types(self, read: StageRead) -> list[tuple[str, str]]:
        known = self._read_types.get(id(read))
        if known is None or known[0] is not read:
            types = self._passed_through_types(read.source)
            if types is None:
                inner = self._renderer.render(read.source)
                types = self._oracle.describe(f"SELECT * FROM ({inner}) AS t")
            known = self._read_types[id(read)] = (read, types)
        return known[1]

    def _passed_through_types(self, node: Node) -> list[tuple[str, str]] | None:
        """(column, type) of ``node``'s outputs, as DuckDB would describe its SQL,
        when each is a table column passed up unchanged (``ref_type``); None when
        any is computed. Most stages a join reads are scans of a dimension,
        filtered, or their rows grouped: no DuckDB round trip for them."""
        types: list[tuple[str, str]] = []
        for ref in node.outputs():
            t = self.ref_type(node, ref)
            if t is None:
                return None
            types.append((phys(ref), t))
        return types

    def expr_types(self, node: Node, exprs: list[exp.Expr]) -> list[str]:
        """DuckDB types of expressions over ``node``'s outputs.

        Join keys are mostly table columns passed up unchanged; their types are
        the catalog's. Anything else is bound by DuckDB over the rendered subtree.
        """
        known = [self._column_type(node, e) for e in exprs]
        if all(t is not None for t in known):
            return [t for t in known if t is not None]
        mapping = {r: exp.column(phys(r), table="t", quoted=True) for r in node.outputs()}
        cols = ", ".join(
            f"{sql(rewrite(e, mapping), copy=False)} AS k{i}" for i, e in enumerate(exprs)
        )
        inner = self._renderer.render(node)
        return [t for _, t in self._oracle.describe(f"SELECT {cols} FROM ({inner}) AS t")]

    def _column_type(self, node: Node, e: exp.Expr) -> str | None:
        ref = column_ref(e)
        return self.ref_type(node, ref) if ref is not None else None

    def ref_type(self, node: Node, ref: Ref) -> str | None:
        """The DuckDB type of ``node``'s output ``ref`` where it is a table column
        passed up unchanged (the catalog's type), else None (DuckDB binds it).

        Followed through filters, sorts, DISTINCT, kept columns, stage reads, a
        window's own input columns, the side of a join that has it, a projection
        or a group key that names a column of its input (a ROLLUP's NULLs keep
        the type), and a set operation's two sides: a UNION's column takes the
        type DuckDB gives the two (``TypeOracle.supertype``), an INTERSECT's or
        EXCEPT's one they share. A computed value (an aggregate, a window
        function, an expression) is DuckDB's to type: 2 to 4 ms a DESCRIBE of the
        rendered subtree, 0.2 s of the distributor's time over TPC-DS's 99 on two
        hosts when only filters, joins and stage reads were followed.
        """
        while True:
            if isinstance(node, Scan):
                if node.alias != ref[0] or ref[1] not in node.columns:
                    return None
                return self._oracle.table_types(node.table).get(ref[1])
            if isinstance(node, StageRead):
                node = node.source
            elif isinstance(node, (Filter, Sort, Distinct)):
                node = node.child
            elif isinstance(node, Keep):
                if ref not in node.refs:
                    return None
                node = node.child
            elif isinstance(node, Window):
                if ref not in node.child.outputs():
                    return None
                node = node.child
            elif isinstance(node, Join):
                sides = [c for c in (node.left, node.right) if ref in c.outputs()]
                if len(sides) != 1 or ref not in node.outputs():
                    return None
                node = sides[0]
            elif isinstance(node, (Project, Aggregate)):
                items = node.items if isinstance(node, Project) else node.groups
                inner = _named_column(items, node.qualifier, ref)
                if inner is None:
                    return None
                node, ref = node.child, inner
            elif isinstance(node, SetOp):
                return self._set_column_type(node, ref)
            else:
                return None

    def _set_column_type(self, node: SetOp, ref: Ref) -> str | None:
        if ref[0] != node.qualifier or ref[1] not in node.names:
            return None
        i = node.names.index(ref[1])
        left = self.ref_type(node.left, node.left.outputs()[i])
        right = self.ref_type(node.right, node.right.outputs()[i])
        if left is None or right is None:
            return None
        if node.kind is SetKind.UNION:
            try:
                return self._oracle.supertype(left, right, union=True)
            except BindError:
                return None
        return left if left == right else None

    def cast_keys(
        self,
        left: Node,
        lk: list[exp.Expr],
        right: Node,
        rk: list[exp.Expr],
        *,
        union: bool = False,
    ) -> tuple[list[exp.Expr], list[exp.Expr]]:
        """Both sides' keys, each pair cast to the type DuckDB compares them in (with
        ``union``, the type a set operation's column of them takes) where they differ.

        Raises:
            Unsupported: DuckDB names no such type for a pair (the query runs whole).
        """
        lt, rt = self.expr_types(left, lk), self.expr_types(right, rk)
        out_l, out_r = [], []
        for le, re_, a, b in zip(lk, rk, lt, rt, strict=True):
            try:
                t = self._oracle.supertype(a, b, union=union)
            except BindError as err:
                raise Unsupported(f"keys of types {a} and {b}") from err
            out_l.append(le.copy() if a == t else exp.cast(le.copy(), t))
            out_r.append(re_.copy() if b == t else exp.cast(re_.copy(), t))
        return out_l, out_r


def stripped(e: exp.Expr) -> exp.Expr:
    """A key without the cast ``cast_keys`` may have put around it."""
    return e.this if isinstance(e, exp.Cast) else e


def column_ref(e: exp.Expr) -> Ref | None:
    """The Ref of a qualified column; None for any other expression."""
    if isinstance(e, exp.Column) and e.table:
        return (e.table, e.name)
    return None


def same_keys(a: list[exp.Expr], b: list[exp.Expr]) -> bool:
    """True when both lists hold equal expressions in the same order."""
    return len(a) == len(b) and all(x == y for x, y in zip(a, b, strict=True))


def _named_column(items: list[tuple[str, exp.Expr]], qualifier: str, ref: Ref) -> Ref | None:
    """The input column that a projection's (or grouping's) output ``ref`` names
    unchanged, if it is one."""
    if ref[0] != qualifier:
        return None
    for name, e in items:
        if name == ref[1]:
            return column_ref(e)
    return None
