"""Render a logical subtree as the DuckDB SQL one task runs.

Every node renders to a SELECT whose columns are its ``outputs()`` named
``"qualifier.name"`` (``logical.phys``). A node over a child renders as a SELECT
over the child's SQL as a derived table, so fragments nest; DuckDB's optimizer
flattens them. Leaves are scans (a stage's scan input, or the catalog table for
the type oracle) and stage reads (a stage input registered by the executor).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect

from mangonel.plan.logical import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    JoinKind,
    Keep,
    Node,
    Opaque,
    Project,
    Ref,
    Scan,
    SetOp,
    Sort,
    StageRead,
    Values,
    Window,
    phys,
)
from mangonel.sqltext import identifier

DIALECT = "duckdb"

_DUCKDB = Dialect.get_or_raise(DIALECT)
"""One instance for every expression rendered: ``e.sql(dialect="duckdb")`` makes a
new one per call (thousands a TPC-DS query). It holds only the dialect's settings;
each call still gets a generator of its own."""


def sql(e: exp.Expr, copy: bool = True) -> str:
    """DuckDB SQL of ``e``; ``copy=False`` for a tree nothing else holds (the
    generator rewrites the tree it is given)."""
    return _DUCKDB.generate(e, copy=copy)


def rewrite(e: exp.Expr, mapping: Mapping[Ref, exp.Expr]) -> exp.Expr:
    """Replace qualified column refs by their physical columns."""

    def repl(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table:
            target = mapping.get((node.table, node.name))
            if target is not None:
                return target.copy()
        return node

    return e.copy().transform(repl, copy=False)


class _Columns(Mapping[Ref, exp.Expr]):
    """The outputs of one or more child nodes as columns of their derived tables
    (``t."qualifier.name"``), each made only when an expression names it.

    Made eagerly, a node over a wide child built a column for each of the child's
    outputs every time it rendered, and most were never read. A ref that two
    children output is the last child's, as a dict merged from the children's
    would give.
    """

    def __init__(self, *children: tuple[Node, str]) -> None:
        self._children = [(set(node.outputs()), table) for node, table in children]

    def __getitem__(self, ref: Ref) -> exp.Expr:
        for outputs, table in reversed(self._children):
            if ref in outputs:
                return exp.column(phys(ref), table=table, quoted=True)
        raise KeyError(ref)

    def get(self, ref: Ref, default: exp.Expr | None = None) -> exp.Expr | None:  # type: ignore[override]
        for outputs, table in reversed(self._children):
            if ref in outputs:
                return exp.column(phys(ref), table=table, quoted=True)
        return default

    def __iter__(self) -> Iterator[Ref]:
        return iter({r: None for outputs, _ in self._children for r in outputs})

    def __len__(self) -> int:
        return len(set().union(*(outputs for outputs, _ in self._children)))


def _refs_of(node: Node, table: str) -> Mapping[Ref, exp.Expr]:
    return _Columns((node, table))


class Renderer:
    """Renders subtrees. ``scan_name`` maps a Scan to the relation it reads.

    With ``expand_reads`` a StageRead renders its source subtree instead of the
    stage input (used by the type oracle, which has no stage inputs), or, where
    ``read_types`` gives its columns' types, an empty relation of those types.
    ``inline`` names the subquery placeholders a task computes itself (the subquery
    planned inside its one reading task): each renders as its subtree's SQL in
    place of the stage input of that name, in any mode.
    """

    def __init__(
        self,
        scan_name: Mapping[int, str] | None = None,
        expand_reads: bool = False,
        subqueries: Mapping[str, Node] | None = None,
        read_types: Callable[[StageRead], list[tuple[str, str]]] | None = None,
        inline: Mapping[str, Node] | None = None,
    ) -> None:
        self._scan_name = scan_name or {}
        self._expand = expand_reads
        expanded = (subqueries or {}) if expand_reads else {}
        self._subqueries = {**expanded, **(inline or {})}
        self._read_types = read_types
        self._subquery_sql: dict[str, str] = {}
        """Each subquery's SQL, rendered once (TPC-DS q14 names its two in six
        filters, each big), and spliced in as text: copied and generated again
        as sqlglot trees, they took a third of q14's planning."""

    def _x(self, e: exp.Expr, mapping: Mapping[Ref, exp.Expr]) -> str:
        """An expression's SQL over a child's columns (subquery placeholders expanded
        in the type oracle's mode, where no stage input exists, and those inlined)."""
        out = rewrite(e, mapping)
        spliced: dict[str, str] = {}
        if self._subqueries:
            for table in list(out.find_all(exp.Table)):
                sub = self._subqueries.get(table.name)
                if sub is not None:
                    if table.name not in self._subquery_sql:
                        self._subquery_sql[table.name] = self.render(sub)
                    marker = f"__mangonel_expanded_{len(spliced)}"
                    spliced[marker] = (
                        f"({self._subquery_sql[table.name]}) AS {identifier(table.name)}"
                    )
                    table.replace(exp.to_table(marker))
        text = sql(out, copy=False)  # ``out`` is this call's own copy
        for marker, subquery in spliced.items():
            text = text.replace(marker, subquery)
        return text

    def render(self, node: Node) -> str:
        method = getattr(self, f"_{type(node).__name__.lower()}")
        result: str = method(node)
        return result

    def _sub(self, node: Node, alias: str) -> str:
        return f"({self.render(node)}) AS {alias}"

    def _scan(self, n: Scan) -> str:
        source = self._scan_name.get(id(n), n.table)
        cols = ", ".join(f"{identifier(c)} AS {identifier(phys((n.alias, c)))}" for c in n.columns)
        text = f"SELECT {cols} FROM {identifier(source)}"
        if n.filter is not None:
            mapping = {(n.alias, c): exp.column(c, quoted=True) for c in n.columns}
            text += f" WHERE {self._x(n.filter, mapping)}"
        return text

    def _stageread(self, n: StageRead) -> str:
        if self._expand and self._read_types is not None:
            cols = ", ".join(
                f"CAST(NULL AS {t}) AS {identifier(c)}" for c, t in self._read_types(n)
            )
            return f"SELECT {cols} LIMIT 0"
        if self._expand:
            return self.render(n.source)
        return f"SELECT * FROM {identifier(n.name)}"

    def _keep(self, n: Keep) -> str:
        cols = ", ".join(f"t.{identifier(phys(r))}" for r in n.refs)
        return f"SELECT {cols} FROM {self._sub(n.child, 't')}"

    def _values(self, n: Values) -> str:
        cols = ", ".join(identifier(phys(r)) for r in n.outputs())
        return f"SELECT * FROM ({self._x(n.query, {})}) AS t({cols})"

    def _filter(self, n: Filter) -> str:
        cond = self._x(n.condition, _refs_of(n.child, "t"))
        return f"SELECT * FROM {self._sub(n.child, 't')} WHERE {cond}"

    def _project(self, n: Project) -> str:
        mapping = _refs_of(n.child, "t")
        cols = ", ".join(
            f"{self._x(e, mapping)} AS {identifier(phys((n.qualifier, name)))}"
            for name, e in n.items
        )
        return f"SELECT {cols} FROM {self._sub(n.child, 't')}"

    def _join(self, n: Join) -> str:
        mapping = _Columns((n.left, "l"), (n.right, "r"))
        conds = [
            f"{self._x(lk, mapping)} = {self._x(rk, mapping)}"
            for lk, rk in zip(n.left_keys, n.right_keys, strict=True)
        ]
        if n.residual is not None:
            conds.append(self._x(n.residual, mapping))
        on = " AND ".join(f"({c})" for c in conds) or "TRUE"
        left, right = self._sub(n.left, "l"), self._sub(n.right, "r")
        if n.kind is JoinKind.CROSS:
            return f"SELECT l.*, r.* FROM {left} CROSS JOIN {right}"
        if n.kind in (JoinKind.SEMI, JoinKind.ANTI):
            return f"SELECT l.* FROM {left} {n.kind.value.upper()} JOIN {right} ON {on}"
        word = {JoinKind.INNER: "JOIN", JoinKind.LEFT: "LEFT JOIN", JoinKind.FULL: "FULL JOIN"}[
            n.kind
        ]
        return f"SELECT l.*, r.* FROM {left} {word} {right} ON {on}"

    def _aggregate(self, n: Aggregate) -> str:
        mapping = _refs_of(n.child, "t")
        cols = [
            f"{self._x(e, mapping)} AS {identifier(phys((n.qualifier, name)))}"
            for name, e in n.groups + n.aggs
        ]
        text = f"SELECT {', '.join(cols)} FROM {self._sub(n.child, 't')}"
        if n.grouping is not None:
            text += f" GROUP BY {self._x(n.grouping, mapping)}"
        elif n.groups:
            text += " GROUP BY " + ", ".join(self._x(e, mapping) for _, e in n.groups)
        return text

    def _window(self, n: Window) -> str:
        mapping = _refs_of(n.child, "t")
        cols = ", ".join(
            f"{self._x(e, mapping)} AS {identifier(phys((n.qualifier, name)))}"
            for name, e in n.funcs
        )
        return f"SELECT t.*, {cols} FROM {self._sub(n.child, 't')}"

    def _distinct(self, n: Distinct) -> str:
        return f"SELECT DISTINCT * FROM {self._sub(n.child, 't')}"

    def _sort(self, n: Sort) -> str:
        mapping = _refs_of(n.child, "t")
        text = f"SELECT * FROM {self._sub(n.child, 't')}"
        if n.keys:
            text += " ORDER BY " + ", ".join(self._x(k, mapping) for k in n.keys)
        if n.limit is not None:
            text += f" LIMIT {n.limit}"
        if n.offset:
            text += f" OFFSET {n.offset}"
        return text

    def _setop(self, n: SetOp) -> str:
        def side(child: Node) -> str:
            cols = ", ".join(
                f"t.{identifier(phys(src))} AS {identifier(phys(dst))}"
                for src, dst in zip(child.outputs(), n.outputs(), strict=True)
            )
            return f"SELECT {cols} FROM {self._sub(child, 't')}"

        op = n.kind.value + ("" if n.distinct else " ALL")
        return f"SELECT * FROM (({side(n.left)}) {op} ({side(n.right)})) AS s"

    def _opaque(self, n: Opaque) -> str:
        query = n.query.copy()
        ctes = {c.alias_or_name for c in query.find_all(exp.CTE)}
        for table in list(query.find_all(exp.Table)):
            if table.name in ctes or table.name not in n.tables:
                continue
            source = n.tables[table.name]
            cols = ", ".join(
                f"{identifier(phys(r))} AS {identifier(r[1])}" for r in source.outputs()
            )
            derived = f"(SELECT {cols} FROM ({self.render(source)}) AS x)"
            alias = table.alias_or_name
            table.replace(
                exp.Subquery(
                    this=sqlglot.parse_one(derived[1:-1], read=DIALECT),
                    alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)),
                    # ``t TABLESAMPLE ...``: the sample goes with the table.
                    sample=table.args.get("sample"),
                )
            )
        cols = ", ".join(identifier(phys(r)) for r in n.outputs())
        return f"SELECT * FROM ({sql(query)}) AS t({cols})"
