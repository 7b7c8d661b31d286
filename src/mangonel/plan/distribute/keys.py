"""Join and exchange keys: their DuckDB types, and the casts that make two sides'
keys hash alike.

DuckDB's ``hash()`` depends on a value's type, so two sides hashed on keys of
different types (``INTEGER`` and ``BIGINT``) would send equal values to different
partitions: ``KeyTypes.cast_keys`` casts each pair to its common supertype first.
A key that is a table column passed up unchanged takes the catalog's type;
anything else is bound by DuckDB over the rendered subtree.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from mangonel.errors import BindError
from mangonel.plan.bind import Unsupported
from mangonel.plan.fragment import Renderer, rewrite, sql
from mangonel.plan.logical import Filter, Join, Keep, Node, Ref, Scan, Sort, StageRead, phys
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
        when each is a table column passed up unchanged (the catalog's type);
        None when any is computed. Most stages a join reads are scans of a
        dimension, filtered: no DuckDB round trip for them."""
        types: list[tuple[str, str]] = []
        for ref in node.outputs():
            scan = _providing_scan(node, ref)
            t = self._oracle.table_types(scan.table).get(ref[1]) if scan is not None else None
            if t is None:
                return None
            types.append((phys(ref), t))
        return types

    def expr_types(self, node: Node, exprs: list[exp.Expr]) -> list[str]:
        """DuckDB types of expressions over ``node``'s outputs.

        Join keys are mostly table columns passed up unchanged; their types are
        the catalog's. Anything else is bound by DuckDB over the rendered subtree.
        """
        known = [self._scan_column_type(node, e) for e in exprs]
        if all(t is not None for t in known):
            return [t for t in known if t is not None]
        mapping = {r: exp.column(phys(r), table="t", quoted=True) for r in node.outputs()}
        cols = ", ".join(
            f"{sql(rewrite(e, mapping), copy=False)} AS k{i}" for i, e in enumerate(exprs)
        )
        inner = self._renderer.render(node)
        return [t for _, t in self._oracle.describe(f"SELECT {cols} FROM ({inner}) AS t")]

    def _scan_column_type(self, node: Node, e: exp.Expr) -> str | None:
        ref = column_ref(e)
        scan = _providing_scan(node, ref) if ref is not None else None
        if scan is None or ref is None:
            return None
        return self._oracle.table_types(scan.table).get(ref[1])

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


def _providing_scan(node: Node, ref: Ref) -> Scan | None:
    """The scan whose column ``ref`` reaches ``node``'s outputs unchanged (through
    filters, sorts, joins, kept columns and stage reads), if any."""
    while True:
        if isinstance(node, Scan):
            return node if node.alias == ref[0] and ref[1] in node.columns else None
        if isinstance(node, StageRead):
            node = node.source
        elif isinstance(node, (Filter, Sort)):
            node = node.child
        elif isinstance(node, Keep):
            if ref not in node.refs:
                return None
            node = node.child
        elif isinstance(node, Join):
            sides = [c for c in (node.left, node.right) if ref in c.outputs()]
            if len(sides) != 1 or ref not in node.outputs():
                return None
            node = sides[0]
        else:
            return None
