"""Bind an optimized sqlglot query into the logical plan (``plan.logical``).

Input: a query that passed ``optimize.optimize_query`` (columns qualified by
their source alias, subqueries decorrelated where sqlglot could, projections
and predicates pushed down). Output: a tree of logical nodes.

What it does per SELECT block, in SQL's order: sources (tables, CTEs, derived
tables) -> joins (inner joins reordered to avoid cross products; WHERE conjuncts
pushed into scans unless a source is the nullable side of an outer join; equi
conjuncts become join keys) -> GROUP BY and aggregates -> HAVING -> window
functions -> QUALIFY -> SELECT list -> DISTINCT -> ORDER BY / LIMIT.

Anything it does not understand raises ``Unsupported``; the planner then runs
the whole query as one gathered stage, so an unusual query is slower, never wrong.

Why it is over 600 lines: ``Binder`` is one walk over a SELECT block in the
order above, and its steps share the scope it holds (the sources in view, their
aliases, the CTEs, the outer references of a subquery); the rewrites that need no
scope run after it, each a module of its own (``pushdown``, ``semi_joins``,
``join_order``, ``eager``, ``prune``, ``union_filters``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from sqlglot import exp
from sqlglot.optimizer.helpers import is_implicit_group_by_all

from mangonel.catalog import Table
from mangonel.plan.logical import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    JoinGroup,
    JoinKind,
    Node,
    Project,
    Scan,
    SetKind,
    SetOp,
    Sort,
    Values,
    Window,
    volatile,
    walk,
)
from mangonel.sql.exprs import (
    PLACEHOLDER_PREFIX,
    VOLATILE,
    and_all,
    col,
    common_factors,
    conjuncts,
    grouping_sets,
    has_placeholder,
    has_subquery,
    is_correlated,
    iter_scope,
    qualifiers,
    source_aliases,
    split_keys,
    substitute,
)
from mangonel.sql.optimize import is_plain_exists


class Unsupported(Exception):
    """A construct the binder does not split; the caller falls back."""


_WHOLE_ONLY = {
    exp.Pivot: "PIVOT / UNPIVOT",
    exp.Columns: "COLUMNS(...)",
    exp.Collate: "COLLATE",
    exp.PositionalColumn: "a column by position (#1)",
}
"""Syntax the query runs whole for, in one task where DuckDB does all of it.

PIVOT, ``COLUMNS(...)`` and ``#1``, which sqlglot's rules pass through unchanged,
name columns the binder cannot see. A collation (``s COLLATE nocase``) makes values
equal that differ: hashed as they are, ``'a'`` and ``'A'`` would go to different
tasks and never meet in a join, a group or a window's partition, and a partial
aggregate's rows lose the collation in Arrow, so the final one would group them
apart."""


def check_supported(query: exp.Expr) -> None:
    """Raise ``Unsupported`` for syntax in ``_WHOLE_ONLY``, or a star matched against
    a pattern (``SELECT * LIKE 'l_%'``), before any rule rewrites it."""
    for node in query.find_all(*_WHOLE_ONLY):
        raise Unsupported(_WHOLE_ONLY[type(node)])
    for star in query.find_all(exp.Star):
        if star.args.get("ilike") or isinstance(star.parent, _PATTERNS):
            raise Unsupported("* matched against a pattern")


_PATTERNS = (exp.Like, exp.ILike, exp.SimilarTo, exp.Glob, exp.RegexpLike)
"""Predicates that, over ``*``, pick the columns whose names match (DuckDB's)."""


def check_rewritten(query: exp.Expr) -> None:
    """Raise ``Unsupported`` for what sqlglot's rules leave that no stage can run;
    the query then runs whole, where DuckDB does all of it:

    - a table's whole row as a value (``SELECT o FROM orders o``, ``list(orders
      ORDER BY o_orderkey)``; qualified, a ``TableColumn``): DuckDB makes a struct
      of the row, of columns no stage holds under that name;
    - ``x > ALL (SELECT ... correlated)``, decorrelated into an ``ARRAY_ALL`` that
      DuckDB has no function for (and that an empty set would make NULL, where
      ALL of nothing is true).
    """
    if query.find(exp.TableColumn) is not None:
        raise Unsupported("a table's row as a value")
    if query.find(exp.ArrayAll) is not None:
        raise Unsupported("a correlated ALL (subquery)")


def factor_or(cond: exp.Expr) -> list[exp.Expr]:
    """A WHERE / inner-join conjunct as conjuncts that filter sooner.

    ``(a AND b) OR (a AND c)`` has the common factor ``a`` (TPC-H q19's join
    equality and shipping filters sit in each of its three branches):
    ``a AND (b OR c)``, and ``a`` alone where a branch is nothing but the common
    factors. Then, for every alias that each remaining branch filters on its
    own, the OR of those single-alias parts is implied and added (q19:
    ``part`` matches one of three brand/container/size triples, ``lineitem``
    one of three quantity ranges; q7: each nation is FRANCE or GERMANY), so
    that the binder can push it into that alias's scan. The original OR stays
    as a residual. Both rewrites hold in SQL's three-valued logic.
    """
    if has_subquery(cond) or any(isinstance(n, VOLATILE) for n in cond.walk()):
        return [cond]
    common, rest = common_factors(cond)
    if len(rest) < 2:
        return [cond]
    if any(not r for r in rest):
        return common  # a branch of common factors only: the others add nothing
    residual: exp.Expr = cond
    if common:
        residual = exp.or_(*(exp.paren(exp.and_(*(c.copy() for c in r))) for r in rest))
    out = [c.copy() for c in common] + [residual]
    if len(qualifiers(residual)) > 1:
        # Implied single-alias filters (a one-alias residual is pushed down whole).
        per_alias = [
            {a: [c for c in r if qualifiers(c) == {a}] for a in set().union(*map(qualifiers, r))}
            for r in rest
        ]
        shared = set.intersection(*({a for a, cs in pa.items() if cs} for pa in per_alias))
        for alias in sorted(shared):
            out.append(
                exp.or_(*(exp.paren(exp.and_(*(c.copy() for c in pa[alias]))) for pa in per_alias))
            )
    return out


class _Source:
    """A FROM item while joins are planned: its node and the aliases it covers."""

    def __init__(self, node: Node, aliases: set[str]) -> None:
        self.node = node
        self.aliases = aliases


class Binder:
    """Turns optimized sqlglot queries into logical plans.

    Args:
        catalog: the tables a query may name (columns, and footers for the estimates
            that order joins).
    """

    def __init__(self, catalog: Mapping[str, Table]) -> None:
        self._tables = {name: list(t.columns) for name, t in catalog.items()}
        self._ids = itertools.count(1)
        self.subqueries: dict[str, Node] = {}
        """Uncorrelated subqueries used inside expressions, by placeholder name."""
        self._lifted: dict[str, str] = {}
        """Placeholder names by the text of the subquery they stand for, for those
        that read only catalog tables: a subquery written several times is one
        stage (TPC-DS q83's three channels each filter ``date_dim`` by the same
        two nested subqueries: 6 of its 12 stages)."""
        self._ctes: dict[int, tuple[Node, list[str]]] = {}
        """Bound CTEs worth computing once (``_worth_sharing``: they aggregate, or
        join with a filter), by their query's id: read twice, such a CTE is one node
        under two names, which the distributor computes once. Others are bound again
        for each reader, so that each reader's filters reach its scans."""

    def _qualifier(self, prefix: str) -> str:
        return f"_{prefix}{next(self._ids)}"

    # ----------------------------------------------------------------- queries

    def bind(self, query: exp.Query) -> tuple[Node, list[str]]:
        """Bind a whole query; returns the plan and its visible output names.

        The node may have extra trailing (hidden) columns used only for ORDER BY.
        """
        return self._query(query, {})

    def _query(self, query: exp.Query, ctes: dict[str, exp.Query]) -> tuple[Node, list[str]]:
        with_ = query.args.get("with_") or query.args.get("with")
        if with_ is not None:
            ctes = dict(ctes)
            for cte in with_.expressions:
                if with_.args.get("recursive"):
                    raise Unsupported("recursive CTE")
                ctes[cte.alias_or_name] = cte.this
        if isinstance(query, exp.Select):
            return self._select(query, ctes)
        if isinstance(query, exp.SetOperation):
            return self._setop(query, ctes)
        if isinstance(query, exp.Subquery):
            return self._query(query.this, ctes)
        raise Unsupported(f"query type {type(query).__name__}")

    def _setop(self, q: exp.SetOperation, ctes: dict[str, exp.Query]) -> tuple[Node, list[str]]:
        if q.args.get("by_name"):
            # Columns met by name, a name one side lacks NULL on it: DuckDB does it.
            raise Unsupported("a set operation BY NAME")
        left, lnames = self._query(q.this, ctes)
        right, rnames = self._query(q.expression, ctes)
        if len(lnames) != len(rnames):
            raise Unsupported("set operation sides differ in width")
        left = self._visible(left, len(lnames))
        right = self._visible(right, len(rnames))
        kind = {
            exp.Union: SetKind.UNION,
            exp.Intersect: SetKind.INTERSECT,
            exp.Except: SetKind.EXCEPT,
        }[type(q)]
        qual = self._qualifier("set")
        unique = [f"c{i}" for i in range(len(lnames))]
        node: Node = SetOp(kind, bool(q.args.get("distinct")), left, right, qual, unique)
        outputs = node.outputs()

        def resolve(e: exp.Expr) -> exp.Expr:
            if isinstance(e, exp.Column) and not e.table and e.name in lnames:
                return col(outputs[lnames.index(e.name)])
            if isinstance(e, exp.Literal) and e.is_int:
                return col(outputs[int(e.this) - 1])
            raise Unsupported("ORDER BY of a set operation on an expression")

        keys = [
            exp.Ordered(
                this=resolve(o.this), desc=o.args.get("desc"), nulls_first=o.args.get("nulls_first")
            )
            for o in (q.args["order"].expressions if q.args.get("order") else [])
        ]
        limit, offset = _limit(q)
        if keys or limit is not None or offset:
            node = Sort(node, keys, limit, offset)
        return node, lnames

    def _visible(self, node: Node, width: int) -> Node:
        outs = node.outputs()
        if len(outs) == width:
            return node
        qual = self._qualifier("p")
        return Project(node, qual, [(f"c{i}", col(r)) for i, r in enumerate(outs[:width])])

    # ------------------------------------------------------------------ select

    def _source(self, item: exp.Expr, ctes: dict[str, exp.Query]) -> _Source:
        alias = item.alias_or_name
        if item.args.get("sample"):
            # ``t TABLESAMPLE ...`` (a CTE's name or a derived table too): the
            # whole query runs in one task, where DuckDB samples it.
            raise Unsupported("TABLESAMPLE on a FROM item")
        if isinstance(item, exp.Table):
            if item.name in ctes:
                query = ctes[item.name]
                if id(query) in self._ctes:
                    node, names = self._ctes[id(query)]
                else:
                    node, names = self._query(query, ctes)
                    # One that draws in a subquery of its own draws there too:
                    # its lifted subqueries are not under ``node``.
                    if _worth_sharing(node) or query.find(*VOLATILE) is not None:
                        self._ctes[id(query)] = (node, names)
                return _Source(self._rename(node, names, alias), {alias})
            if item.name not in self._tables:
                raise Unsupported(f"unknown source {item.name}")
            if item.args.get("joins") or item.args.get("pivots") or item.args.get("laterals"):
                raise Unsupported("table with pivots/laterals")
            scan = Scan(item.name, alias, [])
            return _Source(scan, {alias})
        if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Query):
            node, names = self._query(item.this, ctes)
            return _Source(self._rename(node, names, alias), {alias})
        raise Unsupported(f"FROM item {type(item).__name__}")

    def _rename(self, node: Node, names: list[str], alias: str) -> Node:
        outs = node.outputs()
        items: list[tuple[str, exp.Expr]] = []
        seen: set[str] = set()
        for name, ref in zip(names, outs, strict=False):
            if name in seen:
                continue  # an ambiguous duplicate cannot be referenced from outside anyway
            seen.add(name)
            items.append((name, col(ref)))
        return Project(node, alias, items)

    def _select(self, sel: exp.Select, ctes: dict[str, exp.Query]) -> tuple[Node, list[str]]:
        for key in (
            "laterals",
            "pivots",
            "windows",
            "prewhere",
            "connect",
            "match",
            "sample",
            "into",
        ):
            if sel.args.get(key):
                raise Unsupported(f"SELECT with {key}")
        distinct = sel.args.get("distinct")
        if distinct is not None and distinct.args.get("on"):
            raise Unsupported("DISTINCT ON")
        from_ = sel.args.get("from_") or sel.args.get("from")
        if from_ is None:
            if sel.args.get("where") or sel.args.get("group") or sel.args.get("order"):
                raise Unsupported("clauses without FROM")
            names = [e.alias_or_name for e in sel.expressions]
            values = sel.copy()
            # Its subqueries run as stages, like any other's: the task has no tables.
            values.set(
                "expressions",
                [self._lift_subqueries(e, ctes, set()) for e in values.expressions],
            )
            return Values(self._qualifier("v"), names, values), names

        sources = [self._source(from_.this, ctes)]
        joins: list[tuple[JoinKind, exp.Expr | None]] = []
        for j in sel.args.get("joins") or []:
            if j.args.get("using"):
                raise Unsupported("JOIN USING left after qualification")
            kind = _join_kind(j)
            src = self._source(j.this, ctes)
            on = j.args.get("on")
            if kind is JoinKind.CROSS and on is not None:
                kind = JoinKind.INNER
            sources.append(src)
            joins.append((kind, on))

        # Column pruning: a scan reads only the columns the block mentions.
        aliases = {a for s in sources for a in s.aliases}
        mentioned: dict[str, set[str]] = {a: set() for a in aliases}
        for part in _block_parts(sel):
            for c in iter_scope(part):
                if isinstance(c, exp.Column) and c.table in mentioned:
                    mentioned[c.table].add(c.name)
        for q in (n for n in sel.find_all(exp.Select) if n is not sel):
            for c in iter_scope(q):
                if isinstance(c, exp.Column) and c.table in mentioned:
                    mentioned[c.table].add(c.name)  # a correlated reference (refused later)
        for s in sources:
            if isinstance(s.node, Scan):
                cols = self._tables[s.node.table]
                used = [c for c in cols if c in mentioned[s.node.alias]]
                s.node.columns = used or [cols[0]]

        where: list[exp.Expr] = []
        semi_joins: list[tuple[exp.Select, bool]] = []
        for c in conjuncts(sel.args["where"].this if sel.args.get("where") else None):
            exists = _correlated_exists(c, aliases)
            if exists is not None:
                semi_joins.append(exists)
            else:
                for f in factor_or(c):
                    if f not in where:
                        where.append(self._lift_subqueries(f, ctes, aliases))
        tree = self._join_tree(sources, joins, where, ctes, aliases)
        for query, negated in semi_joins:
            tree = self._semi_join(tree, aliases, query, negated, ctes)
        return self._after_from(sel, tree, ctes, aliases)

    def _semi_join(
        self,
        node: Node,
        aliases: set[str],
        query: exp.Select,
        negated: bool,
        ctes: dict[str, exp.Query],
    ) -> Node:
        """``node`` filtered by a correlated ``[NOT] EXISTS (query)``: a SEMI (ANTI) join.

        The inner query's WHERE conjuncts that name the outer sources become the
        join's condition (equalities its keys); the rest stay inside. The front end
        (``optimize.is_semi_join_exists``) let only such plain subqueries through.
        """
        inner = source_aliases(query)
        where = conjuncts(query.args["where"].this if query.args.get("where") else None)
        correlation = [c for c in where if qualifiers(c) - inner]
        local = [c for c in where if not qualifiers(c) - inner]
        if not correlation or any(not qualifiers(c) <= inner | aliases for c in correlation):
            raise Unsupported("EXISTS correlated with a query further out")
        needed = sorted(
            {
                (c.table, c.name)
                for cond in correlation
                for c in iter_scope(cond)
                if isinstance(c, exp.Column) and c.table in inner
            }
        )
        names = [f"k{i}" for i in range(len(needed))]
        sub = query.copy()
        sub.set("where", exp.Where(this=and_all([c.copy() for c in local])) if local else None)
        sub.set("order", None)
        sub.set("distinct", None)
        sub.set(
            "expressions",
            [
                exp.alias_(col(ref), name, quoted=True)
                for ref, name in zip(needed, names, strict=True)
            ],
        )
        sub_node, sub_names = self._query(sub, ctes)
        alias = self._qualifier("ex")
        right = _Source(self._rename(sub_node, sub_names, alias), {alias})
        renamed = {ref: col((alias, name)) for ref, name in zip(needed, names, strict=True)}

        def rename(n: exp.Expr) -> exp.Expr | None:
            if isinstance(n, exp.Column) and (n.table, n.name) in renamed:
                return renamed[(n.table, n.name)].copy()
            return None

        on = and_all([substitute(c, rename) for c in correlation])
        kind = JoinKind.ANTI if negated else JoinKind.SEMI
        return self._outer_join(_Source(node, set(aliases)), right, kind, on).node

    # ------------------------------------------------------------------- joins

    def _join_tree(
        self,
        sources: list[_Source],
        joins: list[tuple[JoinKind, exp.Expr | None]],
        where: list[exp.Expr],
        ctes: dict[str, exp.Query],
        aliases: set[str],
    ) -> Node:
        # A source on the nullable side of an outer join may not take WHERE filters
        # before the join: "x.a IS NULL" after LEFT JOIN x means "no match".
        nullable: set[str] = set()
        for (kind, _), src in zip(joins, sources[1:], strict=True):
            if kind is JoinKind.LEFT:
                nullable |= src.aliases
            elif kind is JoinKind.RIGHT:
                nullable |= aliases - src.aliases
            elif kind is JoinKind.FULL:
                nullable |= aliases
        pending_conds: list[exp.Expr] = []
        for cond in where:
            if not self._push_into(sources, cond, nullable):
                pending_conds.append(cond)

        group: list[_Source] = [sources[0]]
        for (kind, on), src in zip(joins, sources[1:], strict=True):
            if kind in (JoinKind.INNER, JoinKind.CROSS):
                for c in (f for part in conjuncts(on) for f in factor_or(part)):
                    if c in where:
                        continue  # sqlglot copies a WHERE condition into ON as well
                    c = self._lift_subqueries(c, ctes, aliases)
                    if not self._push_into([src] + group, c, nullable):
                        pending_conds.append(c)
                group.append(src)
                continue
            left = _inner_joins(group, pending_conds)
            if kind is JoinKind.RIGHT:
                group = [self._outer_join(src, left, JoinKind.LEFT, on)]
            else:
                group = [self._outer_join(left, src, kind, on)]
        node = _inner_joins(group, pending_conds).node
        if pending_conds:
            node = Filter(node, and_all(pending_conds))  # type: ignore[arg-type]
        return node

    def _push_into(self, sources: list[_Source], cond: exp.Expr, nullable: set[str]) -> bool:
        quals = qualifiers(cond)
        if len(quals) != 1 or has_placeholder(cond):
            return False
        (alias,) = quals
        if alias in nullable:
            return False
        for s in sources:
            if alias in s.aliases and isinstance(s.node, Scan):
                s.node.filter = and_all([f for f in [s.node.filter, cond] if f is not None])
                return True
            if alias in s.aliases and s.aliases == {alias}:
                s.node = Filter(s.node, cond)
                return True
        return False

    def _outer_join(
        self, left: _Source, right: _Source, kind: JoinKind, on: exp.Expr | None
    ) -> _Source:
        conds = conjuncts(on)
        if kind is JoinKind.LEFT or kind in (JoinKind.SEMI, JoinKind.ANTI):
            # Conditions on the right side alone filter the right side first.
            keep = []
            for c in conds:
                q = qualifiers(c)
                if q and q <= right.aliases and not has_placeholder(c):
                    right.node = Filter(right.node, c)
                else:
                    keep.append(c)
            conds = keep
        for c in conds:
            if has_subquery(c):
                raise Unsupported("subquery in an outer join condition")
        lk, rk, residual = split_keys(conds, left.aliases, right.aliases)
        node = Join(left.node, right.node, kind, lk, rk, and_all(residual))
        aliases = (
            left.aliases if kind in (JoinKind.SEMI, JoinKind.ANTI) else left.aliases | right.aliases
        )
        return _Source(node, aliases)

    # -------------------------------------------------- aggregates and the rest

    def _after_from(
        self, sel: exp.Select, node: Node, ctes: dict[str, exp.Query], aliases: set[str]
    ) -> tuple[Node, list[str]]:
        items = [
            (e.alias_or_name, e.this if isinstance(e, exp.Alias) else e) for e in sel.expressions
        ]
        if any(
            isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
            for _, e in items
        ):
            raise Unsupported("star left after qualification")
        items = [(n, self._lift_subqueries(e, ctes, aliases)) for n, e in items]
        having = (
            self._lift_subqueries(sel.args["having"].this, ctes, aliases)
            if sel.args.get("having")
            else None
        )
        qualify_ = sel.args["qualify"].this if sel.args.get("qualify") else None
        order = list(sel.args["order"].expressions) if sel.args.get("order") else []
        distinct = sel.args.get("distinct")
        names = [n for n, _ in items]
        if len(order) == 1 and _is_all(order[0].this):
            # DuckDB's ORDER BY ALL: every select item, left to right, each as ALL says.
            order = [
                exp.Ordered(
                    this=exp.Literal.number(i + 1),
                    desc=order[0].args.get("desc"),
                    nulls_first=order[0].args.get("nulls_first"),
                )
                for i in range(len(items))
            ]

        # ORDER BY may name a select alias or a position; resolve those first.
        order_exprs: list[exp.Expr | int] = []
        for o in order:
            e = o.this
            if isinstance(e, exp.Column) and not e.table and e.name in names:
                order_exprs.append(names.index(e.name))
            elif isinstance(e, exp.Literal) and e.is_int:
                order_exprs.append(int(e.this) - 1)
            else:
                # An expression may name select aliases too (sqlglot leaves them
                # unqualified): ORDER BY CASE WHEN ... THEN alias END.
                order_exprs.append(
                    substitute(
                        e,
                        lambda n: (
                            items[names.index(n.name)][1].copy()
                            if isinstance(n, exp.Column) and not n.table and n.name in names
                            else None
                        ),
                    )
                )

        group_clause = sel.args.get("group")
        group_exprs: list[exp.Expr] = []
        grouping: exp.Expr | None = None
        if group_clause is not None:
            for key in ("rollup", "cube", "grouping_sets", "totals"):
                if group_clause.args.get(key):
                    raise Unsupported("GROUP BY modifiers")
            if is_implicit_group_by_all(sel):
                group_exprs = _group_by_all_keys([e for _, e in items])
            for g in group_clause.expressions:
                if isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                    if grouping is not None:
                        raise Unsupported("several grouping clauses")
                    if has_subquery(g):
                        raise Unsupported("a subquery in grouping sets")
                    grouping = g
                    members = [e for s in grouping_sets(g) for e in s]
                else:
                    # Lifted as the select's items were: the same subquery text is
                    # the same placeholder, so an item still matches its group key
                    # (left in, the stage's SQL named a table no task has).
                    members = [self._lift_subqueries(g, ctes, aliases)]
                for m in members:
                    if m not in group_exprs:
                        group_exprs.append(m)
        parts = [e for _, e in items] + ([having] if having is not None else [])
        parts += [e for e in order_exprs if isinstance(e, exp.Expr)]
        aggs = _find_aggs(parts)
        if group_exprs or aggs or having is not None:
            qual = self._qualifier("agg")
            groups = [(f"g{i}", g) for i, g in enumerate(group_exprs)]
            agg_items = [(f"a{i}", a) for i, a in enumerate(aggs)]
            agg_node = Aggregate(node, qual, groups, agg_items, grouping)
            node = agg_node

            def lift(e: exp.Expr) -> exp.Expr:
                return _replace_aggs(e, agg_items, groups, qual)

            items = [(n, lift(e)) for n, e in items]
            having = lift(having) if having is not None else None
            order_exprs = [lift(e) if isinstance(e, exp.Expr) else e for e in order_exprs]
            qualify_ = lift(qualify_) if qualify_ is not None else None
            if having is not None:
                node = Filter(node, having)

        windows = _find_windows(
            [e for _, e in items]
            + [e for e in order_exprs if isinstance(e, exp.Expr)]
            + ([qualify_] if qualify_ is not None else [])
        )
        if windows:
            wqual = self._qualifier("w")
            funcs = [(f"w{i}", w) for i, w in enumerate(windows)]
            node = Window(node, wqual, funcs)

            def lift_w(e: exp.Expr) -> exp.Expr:
                return substitute(
                    e, lambda n: next((col((wqual, name)) for name, w in funcs if n == w), None)
                )

            items = [(n, lift_w(e)) for n, e in items]
            order_exprs = [lift_w(e) if isinstance(e, exp.Expr) else e for e in order_exprs]
            qualify_ = lift_w(qualify_) if qualify_ is not None else None
        if qualify_ is not None:
            node = Filter(node, qualify_)

        pqual = self._qualifier("p")
        unique = [f"c{i}" for i in range(len(items))]
        proj_items = [(u, e) for u, (_, e) in zip(unique, items, strict=True)]
        keys: list[exp.Ordered] = []
        for o, e in zip(order, order_exprs, strict=True):
            if isinstance(e, int):
                if not 0 <= e < len(items):
                    raise Unsupported("ORDER BY position out of range")
                ref = (pqual, unique[e])
            else:
                # ``SELECT DISTINCT (x) ... ORDER BY x`` (TPC-DS q41): parentheses
                # change no value.
                bare = e.unnest()
                match = next((u for u, pe in proj_items if pe.unnest() == bare), None)
                if match is None:
                    if distinct is not None:
                        raise Unsupported("ORDER BY a hidden column with DISTINCT")
                    match = f"o{len(proj_items)}"
                    proj_items.append((match, e))
                ref = (pqual, match)
            keys.append(
                exp.Ordered(
                    this=col(ref), desc=o.args.get("desc"), nulls_first=o.args.get("nulls_first")
                )
            )
        node = Project(node, pqual, proj_items)
        if distinct is not None:
            node = Distinct(node)
        limit, offset = _limit(sel)
        if keys or limit is not None or offset:
            node = Sort(node, keys, limit, offset)
        return node, names

    # -------------------------------------------------------------- subqueries

    def _lift_subqueries(
        self, expr: exp.Expr, ctes: dict[str, exp.Query], aliases: set[str]
    ) -> exp.Expr:
        """Replace uncorrelated subqueries by placeholders ``(SELECT * FROM __sqN)``."""

        def repl(node: exp.Expr) -> exp.Expr | None:
            query: exp.Expr | None = None
            if isinstance(node, (exp.Subquery, exp.Exists)):
                query = node.this
            elif isinstance(node, exp.All) and isinstance(node.this, exp.Query):
                query = node.this  # ``x > ALL (SELECT ...)``; ANY holds a Subquery
            elif isinstance(node, exp.Query):
                # Any other place a query may stand (``ARRAY(SELECT ...)``, whose
                # rows keep their order, which a stage's output does not): the
                # task would read tables only a task of the whole query has.
                raise Unsupported("subquery form")
            elif isinstance(node, exp.In) and node.args.get("query") is not None:
                q = node.args["query"]
                query = q.this if isinstance(q, exp.Subquery) else q
            if query is None:
                return None
            if not isinstance(query, exp.Query):
                raise Unsupported("subquery form")
            if is_correlated(query):
                raise Unsupported("correlated subquery")
            # Not shared: a subquery over a CTE (a name other scopes may bind
            # otherwise) or with a function that differs call by call.
            private = any(t.name in ctes for t in query.find_all(exp.Table)) or (
                query.find(*VOLATILE) is not None
            )
            text = None if private else query.sql()
            name = self._lifted.get(text) if text is not None else None
            if name is None:
                sub, names = self._query(query, ctes)
                sub = self._visible(sub, len(names))
                name = f"{PLACEHOLDER_PREFIX}{next(self._ids)}"
                self.subqueries[name] = sub
                if text is not None:
                    self._lifted[text] = name
            placeholder = exp.select(exp.Star()).from_(exp.to_table(name))
            if isinstance(node, exp.Subquery):
                return exp.Subquery(this=placeholder)
            if isinstance(node, exp.Exists):
                return exp.Exists(this=placeholder)
            if isinstance(node, exp.All):
                return exp.All(this=placeholder)
            new = node.copy()
            new.set("query", exp.Subquery(this=placeholder))
            # Returning the IN ends the walk below it: its left side may hold a
            # scalar subquery of its own, ``(SELECT min(k) FROM u) IN (SELECT ...)``.
            new.set("this", self._lift_subqueries(node.this, ctes, aliases))
            return new

        return substitute(expr, repl)


# ------------------------------------------------------------------- helpers

_COMPUTED = (Aggregate, Distinct, Window, SetOp)
"""Operators whose result a CTE read twice is worth computing once."""


def _worth_sharing(node: Node) -> bool:
    """Whether a CTE's plan is computed once for all of its readers.

    One that aggregates (or the like, ``_COMPUTED``) is; so is one that joins where
    a filtered scan keeps few of its rows: TPC-DS q27 (DuckDB's text) reads a join
    of ``store_sales`` with four filtered dimensions three times, and computed it
    three times. A join with no filter (q95's self-join of ``web_sales``) may give
    more rows than it reads: each reader computes its own, where its own filters
    reach. One that draws random values (``volatile``) is one draw for all of its
    readers, as DuckDB computes a CTE read twice once.
    """
    if volatile(node):
        return True
    nodes = list(walk(node))
    if any(isinstance(n, _COMPUTED) for n in nodes):
        return True
    joins = any(isinstance(n, (Join, JoinGroup)) for n in nodes)
    return joins and any(
        isinstance(n, Filter) or (isinstance(n, Scan) and n.filter is not None) for n in nodes
    )


def _join_kind(j: exp.Join) -> JoinKind:
    method = (j.args.get("method") or "").upper()
    if method:
        # ASOF (each row meets its nearest match) and POSITIONAL (row i meets
        # row i) are no joins of keys; a NATURAL one was written out by
        # qualification already.
        raise Unsupported(f"{method} JOIN")
    side = (j.args.get("side") or "").upper()
    kind = (j.args.get("kind") or "").upper()
    if kind == "SEMI":
        return JoinKind.SEMI
    if kind == "ANTI":
        return JoinKind.ANTI
    if kind == "CROSS" or (not side and not kind and j.args.get("on") is None):
        return JoinKind.CROSS
    if side == "LEFT":
        return JoinKind.LEFT
    if side == "FULL":
        return JoinKind.FULL
    if side == "RIGHT":
        return JoinKind.RIGHT
    if kind in ("", "INNER", "OUTER"):
        return JoinKind.INNER
    raise Unsupported(f"join kind {kind}")


def _block_parts(sel: exp.Select) -> list[exp.Expr]:
    parts: list[exp.Expr] = list(sel.expressions)
    for key in ("where", "group", "having", "qualify", "order"):
        if sel.args.get(key) is not None:
            parts.append(sel.args[key])
    for j in sel.args.get("joins") or []:
        if j.args.get("on") is not None:
            parts.append(j.args["on"])
    return parts


def _correlated_exists(cond: exp.Expr, aliases: set[str]) -> tuple[exp.Select, bool] | None:
    """``(query, negated)`` for a ``[NOT] EXISTS`` conjunct over a correlated SELECT
    that is a semi join (``is_plain_exists``); others are left to fail as before."""
    negated = isinstance(cond, exp.Not)
    node = cond.this if negated else cond
    if isinstance(node, exp.Paren):
        node = node.this
    query = node.this if isinstance(node, exp.Exists) else None
    if isinstance(query, exp.Select) and is_correlated(query) and is_plain_exists(query, aliases):
        return query, negated
    return None


def _inner_joins(group: list[_Source], pending: list[exp.Expr]) -> _Source:
    """The sources of a run of inner (and cross) joins as one source, in the order
    written, with the pending conditions that name only their aliases (taken out
    of ``pending``; the others wait for sources joined later). A single source is
    filtered by them; several become a ``JoinGroup``, which ``plan.join_order``
    orders by the estimates."""
    aliases = {a for s in group for a in s.aliases}
    taken = [c for c in pending if qualifiers(c) and qualifiers(c) <= aliases]
    pending[:] = [c for c in pending if not any(c is t for t in taken)]
    if len(group) == 1:
        node = group[0].node
        if taken:
            node = Filter(node, and_all(taken))  # type: ignore[arg-type]
        return _Source(node, aliases)
    return _Source(JoinGroup([s.node for s in group], taken), aliases)


def _is_window_function(n: exp.Expr) -> bool:
    """Whether ``n`` is the function a window computes (``SUM(x)`` of ``SUM(x) OVER (...)``).

    Aggregates elsewhere in a window (its function's arguments, PARTITION BY,
    ORDER BY) are the query's own: ``SUM(SUM(x)) OVER (...)`` sums per-group sums.
    """
    child, parent = n, n.parent
    while isinstance(parent, (exp.Filter, exp.IgnoreNulls, exp.RespectNulls)):
        child, parent = parent, parent.parent
    return isinstance(parent, exp.Window) and parent.this is child


def _is_all(e: exp.Expr) -> bool:
    """``ALL`` as an ORDER BY item (sqlglot reads it as a bare word)."""
    return isinstance(e, exp.Var) and e.name.upper() == "ALL"


def _group_by_all_keys(items: list[exp.Expr]) -> list[exp.Expr]:
    """The keys of a bare ``GROUP BY ALL``, as DuckDB infers them: every select item
    that reads a column and holds no aggregate (an item of constants alone is no
    key: over no rows the query still answers its one row)."""
    keys: list[exp.Expr] = []
    for item in items:
        if _find_aggs([item]) or item.find(exp.Column) is None:
            continue
        if _find_windows([item]) or has_subquery(item):
            raise Unsupported("GROUP BY ALL beside a window function or a subquery")
        if item not in keys:
            keys.append(item)
    return keys


def _find_aggs(parts: list[exp.Expr]) -> list[exp.Expr]:
    found: list[exp.Expr] = []
    for p in parts:
        for n in iter_scope(p):
            if isinstance(n, exp.AggFunc) and not _is_window_function(n):
                outer = n.parent
                while outer is not None and not (
                    isinstance(outer, exp.AggFunc) and not _is_window_function(outer)
                ):
                    outer = outer.parent
                if outer is not None:
                    continue  # inside another aggregate: part of that one
                # FILTER (WHERE ...) and WITHIN GROUP (ORDER BY ...) belong to
                # their aggregate.
                item = n
                while isinstance(item.parent, (exp.Filter, exp.WithinGroup)):
                    item = item.parent
                if item not in found:
                    found.append(item)
    return found


def _find_windows(parts: list[exp.Expr]) -> list[exp.Expr]:
    found: list[exp.Expr] = []
    for p in parts:
        for n in iter_scope(p):
            if isinstance(n, exp.Window) and n not in found:
                found.append(n)
    return found


def _replace_aggs(
    e: exp.Expr,
    aggs: list[tuple[str, exp.Expr]],
    groups: list[tuple[str, exp.Expr]],
    qual: str,
) -> exp.Expr:
    def repl(n: exp.Expr) -> exp.Expr | None:
        for name, a in aggs:
            if n == a:
                return col((qual, name))
        for name, g in groups:
            if n == g:
                return col((qual, name))
        return None

    return substitute(e, repl)


def _limit(q: exp.Query) -> tuple[int | None, int]:
    limit: int | None = None
    offset = 0
    if q.args.get("limit") is not None:
        lim = q.args["limit"]
        val = lim.args.get("expression")
        if not (isinstance(val, exp.Literal) and val.is_int) or lim.args.get("limit_options"):
            raise Unsupported("non-constant LIMIT")
        limit = int(val.this)
    if q.args.get("offset") is not None:
        val = q.args["offset"].args.get("expression")
        if not (isinstance(val, exp.Literal) and val.is_int):
            raise Unsupported("non-constant OFFSET")
        offset = int(val.this)
    return limit, offset
