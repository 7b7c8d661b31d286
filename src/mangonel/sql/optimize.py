"""Optimizing a parsed query with sqlglot: qualify, decorrelate, push down.

``optimize_query`` runs sqlglot's optimizer rules the planner relies on, in
sqlglot's order, around rewrites of mangonel's own: uncorrelated subqueries kept
out of ``unnest_subqueries`` (the planner runs them as stages of their own), a
correlated ``[NOT] EXISTS`` of the plain form kept for the binder's SEMI (ANTI)
join (``is_semi_join_exists``), named windows written out in full, filters pushed
into the CTEs their readers share, and a shorter path for a query whose only
nesting is derived tables. Its input passed ``frontend.parse``; its output goes to
``plan.bind``.

Why it is just over 600 lines: one pipeline, and each of mangonel's rewrites sits
beside the sqlglot rule it works around, so the order of the steps reads in one file.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes
from sqlglot.optimizer.eliminate_joins import eliminate_joins
from sqlglot.optimizer.eliminate_subqueries import eliminate_subqueries
from sqlglot.optimizer.merge_subqueries import merge_subqueries
from sqlglot.optimizer.normalize import normalize
from sqlglot.optimizer.optimize_joins import optimize_joins
from sqlglot.optimizer.pushdown_predicates import pushdown_predicates
from sqlglot.optimizer.pushdown_projections import pushdown_projections
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.qualify_columns import quote_identifiers
from sqlglot.optimizer.scope import Scope, traverse_scope
from sqlglot.optimizer.simplify import simplify
from sqlglot.optimizer.unnest_subqueries import unnest_subqueries
from sqlglot.schema import ensure_schema

from mangonel.sql.exprs import (
    VOLATILE,
    common_factors,
    conjuncts,
    has_subquery,
    is_correlated,
    qualifiers,
    source_aliases,
)
from mangonel.sql.merged_aggregates import merge_scalar_aggregates
from mangonel.sql.shared_ctes import push_into_shared_ctes, share_repeated_subqueries

# The optimizer rules we rely on are listed in ``optimize_query``, in sqlglot's
# order. Left out on purpose: canonicalize/annotate_types/simplify rewrite
# expressions in ways that do not change what a stage must compute, and they
# cost planning time (``simplify`` runs only where ``pushdown_predicates`` calls
# it, and on constant arithmetic in the conditions of a one-SELECT query).


def optimize_query(
    query: exp.Query, schema: dict[str, object], dialect: str, copy: bool = True
) -> exp.Query:
    """Qualify, decorrelate and push down with sqlglot's optimizer.

    ``schema`` maps table -> column -> DuckDB type. The result is DuckDB-ready.
    Uncorrelated subqueries are kept out of sqlglot's ``unnest_subqueries``: it
    turns ``x IN (SELECT ...)`` into a join whose NULL semantics differ outside a
    WHERE conjunct. The planner runs them as stages of their own instead, and
    DuckDB evaluates IN / EXISTS / scalar semantics over their gathered output.
    A correlated ``[NOT] EXISTS`` of the plain form is kept out too and becomes a
    SEMI (ANTI) join in the binder (``plan.bind``; see ``is_semi_join_exists``).
    With ``copy=False`` the rules rewrite ``query`` itself (a caller that has no
    further use for it saves copying it).
    """
    # One Dialect for every rule: sqlglot makes a new one from a name on each
    # call that takes one (each ``simplify``, each identifier normalized).
    dialect_ = Dialect.get_or_raise(dialect)
    schema_ = ensure_schema(schema, dialect=dialect_)
    qualified = partial(qualify, schema=schema_, dialect=dialect_, quote_identifiers=False)
    quoted = partial(quote_identifiers, dialect=dialect_)
    spelled = _catalog_spelling(schema)
    derived = _derived_tables_only(query)
    if derived is not None:
        # One SELECT, or SELECTs nested only as derived tables: nothing to
        # decorrelate or unnest, nothing to push between scopes (the binder
        # pushes its filters down itself, through derived tables too), and the
        # tables need not be wrapped in subqueries for those rules. Derived
        # tables are still merged into their readers where they can be, as the
        # full path does. Half of TPC-H planned in half the time; the 21 TPC-DS
        # and TPC-H queries whose only nesting is derived tables (q21, q88, ...)
        # planned in 0.55 of the time (the sum of their medians 1038 -> 552 ms
        # CPU; q88 275 -> 117 ms), to the same stages and tasks (EXPLAIN of all
        # 143 plans compared: only the SQL's spelling differs).
        return _apply(
            query,
            copy,
            inline_named_windows,
            partial(qualified, isolate_tables=False),
            normalize,
            optimize_joins,
            *([_merge_subqueries] if derived else []),
            partial(_simplify_conditions, dialect=dialect_),
            *([spelled] if spelled else []),
            quoted,
            merge_scalar_aggregates,
            share_repeated_subqueries,
            push_into_shared_ctes,
        )

    stash: dict[int, exp.Expr] = {}
    ctes: list[exp.CTE] = []

    def hide(expression: exp.Expr) -> exp.Expr:
        _unique_cte_names(expression)
        ctes.extend(c.copy() for w in expression.find_all(exp.With) for c in w.expressions)
        return _hide_uncorrelated(expression, stash)

    def restore(expression: exp.Expr) -> exp.Expr:
        return _restore_ctes(_restore_uncorrelated(expression, stash), ctes)

    # Restored before identifiers are quoted, so that a correlated EXISTS taken
    # as a semi join names outer columns exactly as the outer query does.
    return _apply(
        query,
        copy,
        inline_named_windows,
        partial(qualified, isolate_tables=True),  # the later rules need it
        hide,
        one_row_or_error,  # before unnest_subqueries takes MAX of their rows
        _filter_correlated_sources,  # before normalize writes its ORs in CNF
        pushdown_projections,
        normalize,
        unnest_subqueries,
        partial(_pushdown_predicates, dialect=dialect_),
        optimize_joins,
        eliminate_subqueries,
        _merge_subqueries,
        eliminate_joins,
        eliminate_ctes,
        restore,
        one_row_checked,
        *([spelled] if spelled else []),
        quoted,
        merge_scalar_aggregates,
        share_repeated_subqueries,
        push_into_shared_ctes,
    )


def _pushdown_predicates(expression: exp.Expr, dialect: Dialect) -> exp.Expr:
    """sqlglot's ``pushdown_predicates`` without the WHERE of a SELECT over one table.

    That condition has nowhere to go (a condition moves into a join's ON or into a
    derived table or CTE; a CTE's name is no table here), yet the rule simplifies
    every WHERE whole first: TPC-DS q41's subquery is one big OR over ``item``,
    12.8 of its 60 ms of planning.
    Parked aside, it comes back with its constants folded (what the estimates read
    of the simplification), joined with whatever an outer scope pushed into it.
    """
    parked: list[tuple[exp.Select, exp.Where]] = []
    ctes = {cte.alias_or_name for cte in expression.find_all(exp.CTE)}
    for select in list(expression.find_all(exp.Select)):
        where = select.args.get("where")
        source = select.args.get("from_")
        if (
            where is not None
            and not select.args.get("joins")
            and source is not None
            and isinstance(source.this, exp.Table)
            and source.this.name not in ctes  # a CTE takes conditions its readers push
        ):
            parked.append((select, where))
            select.set("where", None)
    out = pushdown_predicates(expression, dialect=dialect)
    for select, where in parked:
        pushed = select.args.get("where")
        if pushed is not None:
            where = exp.Where(this=exp.and_(where.this, pushed.this, copy=False))
        select.set("where", where)
    return _simplify_conditions(out, dialect)


_DRAWS = (exp.Rand, exp.Randn, exp.Randstr, exp.Uuid)
"""Functions that draw a new value at each call."""

_KEEP_APART = [exp.Literal.string("mangonel: draws random values")]
"""The mark by which ``_merge_subqueries`` keeps a SELECT from being merged: a
value of an argument sqlglot's rule does not merge across (``SETTINGS``)."""


def _merge_subqueries(expression: exp.Expr) -> exp.Expr:
    """sqlglot's ``merge_subqueries``, but not of a SELECT whose list or WHERE
    draws random values (``_DRAWS``).

    Merged, ``FROM (SELECT o_orderkey FROM orders WHERE random() < 0.5) o JOIN
    lineitem ...`` draws once per row of the join where the query drew once per
    order (an order's line items kept or dropped one by one), and an item
    ``random() AS r`` read twice above draws twice. The rule has no test of its
    own for such functions; a SELECT it may not merge is marked for its run.
    """
    marked = [
        select
        for select in expression.find_all(exp.Select)
        if not select.args.get("settings")
        and any(
            part is not None and part.find(*_DRAWS) is not None
            for part in (*select.expressions, select.args.get("where"))
        )
    ]
    for select in marked:
        select.set("settings", [m.copy() for m in _KEEP_APART])
    try:
        return merge_subqueries(expression)
    finally:
        for select in marked:
            select.set("settings", None)


def _catalog_spelling(schema: dict[str, object]) -> Callable[[exp.Expr], exp.Expr] | None:
    """A rule that names each column of a catalog table as the table spells it, or
    ``None`` where every column is in lower case already.

    DuckDB's identifiers ignore case, and sqlglot's qualification writes them in
    lower case (``SELECT Mixed FROM t`` reads ``t.mixed``), but the binder and the
    scans name a table's columns as its files do: a column of ``Mixed`` or
    ``UPPER`` (a Spark or pandas file's ``CamelCase``) was read by no scan, and
    its query failed in DuckDB's binder (``SELECT *`` included).
    """
    spelled = {
        table: {c.lower(): c for c in columns if c != c.lower()}
        for table, columns in schema.items()
        if isinstance(columns, dict)
    }
    spelled = {table: names for table, names in spelled.items() if names}
    if not spelled:
        return None

    def rule(expression: exp.Expr) -> exp.Expr:
        for scope in traverse_scope(expression):
            for column in scope.columns:
                owner: Scope | None = scope
                while owner is not None and column.table not in owner.sources:
                    owner = owner.parent
                source = owner.sources.get(column.table) if owner is not None else None
                names = spelled.get(source.name) if isinstance(source, exp.Table) else None
                actual = names.get(column.name.lower()) if names else None
                if actual is not None and actual != column.name:
                    column.set("this", exp.to_identifier(actual, quoted=True))
        return expression

    return rule


def _derived_tables_only(query: exp.Query) -> bool | None:
    """Whether ``query`` nests SELECTs only as derived tables (``FROM (SELECT ...) x``
    and joins of them); ``None`` where it nests anything else: a subquery
    expression (IN, EXISTS, a scalar), a CTE, a set operation, a LATERAL."""
    derived = False
    for node in query.walk():
        if node is query:
            continue
        if isinstance(node, exp.With):
            return None
        if not isinstance(node, exp.Query):
            continue
        if isinstance(node, exp.Subquery) and isinstance(node.parent, (exp.From, exp.Join)):
            derived = True
        elif not (isinstance(node, exp.Select) and isinstance(node.parent, exp.Subquery)):
            return None
    return derived


def _apply(query: exp.Query, copy: bool, *rules: Callable[[exp.Expr], exp.Expr]) -> exp.Query:
    """sqlglot optimizer rules, in order, over ``query`` or a copy of it.

    Called one by one with their arguments bound, not through
    ``sqlglot.optimizer.optimize``: that looks up each rule's parameters with
    ``inspect`` on every call, which for the compiled rules of ``sqlglot[c]``
    parses their text signatures (a tenth of a trivial query's scheduler time).
    """
    optimized: exp.Expr = query.copy() if copy else query
    for rule in rules:
        optimized = rule(optimized)
    assert isinstance(optimized, exp.Query)  # the rules keep a query a query
    return optimized


def inline_named_windows(expression: exp.Expr) -> exp.Expr:
    """Write each ``OVER w`` / ``OVER (w ORDER BY ...)`` out in full and drop the
    ``WINDOW w AS (...)`` clauses, so that the binder sees only plain windows.

    A named window is only a shorthand: the binder has no use for the name, and
    sqlglot's rules would have to qualify the columns inside the clause too. A
    reference keeps what it states itself (PARTITION BY, ORDER BY, frame) and
    takes the rest from the window it names, which may name another one defined
    before it. DuckDB has bound the query already and refused what the standard
    forbids (overriding an ORDER BY, copying a frame), so every combination met
    here is a valid one. A name is visible only in its own SELECT, not in the
    subqueries inside it.

    >>> import sqlglot
    >>> q = sqlglot.parse_one(
    ...     "SELECT SUM(x) OVER w, MAX(x) OVER (w ORDER BY y) FROM t WINDOW w AS (PARTITION BY g)")
    >>> inline_named_windows(q).sql()
    'SELECT SUM(x) OVER (PARTITION BY g), MAX(x) OVER (PARTITION BY g ORDER BY y) FROM t'
    """
    for select in list(expression.find_all(exp.Select)):
        definitions = select.args.get("windows")
        if not definitions:
            continue
        named: dict[str, exp.Window] = {}
        for definition in definitions:
            named[definition.name] = _merge_window(definition, named)
        for window in list(select.find_all(exp.Window)):
            if window.arg_key == "windows" or window.find_ancestor(exp.Select) is not select:
                continue  # a definition itself, or a window of a nested SELECT
            window.replace(_merge_window(window, named))
        select.set("windows", None)
    return expression


def _merge_window(window: exp.Window, named: dict[str, exp.Window]) -> exp.Window:
    """``window`` with what it leaves out taken from the named window it refers to."""
    ref = window.args.get("alias")
    base = named.get(ref.name) if isinstance(ref, exp.Identifier) else None
    merged = window.copy()
    if base is None:
        return merged
    merged.set("alias", None)
    for arg in ("partition_by", "order", "spec"):
        value = base.args.get(arg)
        if value and not merged.args.get(arg):
            merged.set(arg, [v.copy() for v in value] if isinstance(value, list) else value.copy())
    return merged


_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div)
_CONSTANT = (
    *_ARITHMETIC,
    exp.Paren,
    exp.Neg,
    exp.Literal,
    exp.Cast,
    exp.Interval,
    exp.DataType,
    exp.Var,
)


def _simplify_conditions(expression: exp.Expr, dialect: Dialect) -> exp.Expr:
    """Fold constant arithmetic in every SELECT's WHERE and JOIN ON (``DATE '1994-01-01' + INTERVAL
    1 YEAR`` becomes a date the planner's estimates can use), as the
    ``simplify`` inside ``pushdown_predicates`` does for queries of several scopes;
    only the constant parts are simplified (all of a big OR costs 40 ms)."""
    clauses = [
        clause
        for select in expression.find_all(exp.Select)
        for clause in [select.args.get("where"), *(select.args.get("joins") or [])]
    ]
    for node in clauses:
        cond = node.args.get("this" if isinstance(node, exp.Where) else "on") if node else None
        if cond is None:
            continue
        for part in list(cond.walk(bfs=True)):
            if (
                isinstance(part, _ARITHMETIC)
                and all(isinstance(n, _CONSTANT) for n in part.walk())
                and not isinstance(part.parent, _ARITHMETIC)
            ):
                part.replace(simplify(part.copy(), dialect=dialect))
    return expression


_MARKER = "__mangonel_subquery"


def _subquery_of(node: exp.Expr) -> exp.Query | None:
    if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Query):
        if isinstance(node.parent, (exp.From, exp.Join, exp.SetOperation)) or node.parent is None:
            # a derived table, or a set operation's parenthesized operand (TPC-DS
            # q87's ``(SELECT ...) EXCEPT (SELECT ...)``), not an expression
            return None
        return node.this
    if isinstance(node, exp.Exists) and isinstance(node.this, exp.Query):
        return node.this
    if isinstance(node, exp.In) and node.args.get("query") is not None:
        q = node.args["query"]
        inner = q.this if isinstance(q, exp.Subquery) else q
        return inner if isinstance(inner, exp.Query) else None
    return None


def _hide_uncorrelated(expression: exp.Expr, stash: dict[int, exp.Expr]) -> exp.Expr:
    for node in list(expression.walk()):
        query = _subquery_of(node)
        if query is None or node.find_ancestor(exp.Anonymous):
            continue
        if is_correlated(query) and not is_semi_join_exists(node):
            continue
        if isinstance(node, exp.In) and _is_where_conjunct(node):
            continue  # sqlglot's semi-join rewrite is right here, and distributes better
        if any(is_correlated(q) for q in query.find_all(exp.Select) if q is not query):
            continue  # sqlglot must see it to decorrelate what is inside
        key = len(stash)
        stash[key] = node.copy()
        args: list[exp.Expr] = [exp.Literal.number(key)]
        if isinstance(node, exp.In):
            args.append(node.this.copy())
        node.replace(exp.Anonymous(this=_MARKER, expressions=args))
    return expression


SCALAR_ROWS_ERROR = (
    "More than one row returned by a subquery used as an expression - scalar "
    "subqueries can only return a single row."
)
"""DuckDB's own words for a scalar subquery of several rows."""

_NOT_SCALAR = (exp.From, exp.Join, exp.In, exp.Exists, exp.Any, exp.All, exp.Lateral)


ONE_ROW = "mangonel_one_row"
"""The mark (in a node's ``meta``) of a correlated scalar subquery's value,
written as ``MAX`` of the one row it must have.

sqlglot's ``unnest_subqueries`` joins a correlated scalar subquery that does not
aggregate as ``MAX`` of its rows per correlation key (``ARRAY_AGG`` in a
comparison): where DuckDB fails the query (a nation's subquery finding five
suppliers' names), the plan answered with one of them. Marked before the rule
(``one_row_or_error``), the value is an aggregate that sqlglot decorrelates as
any ``MAX``; afterwards (``one_row_checked``) it becomes ``CASE WHEN COUNT(*) > 1
THEN error(...) ELSE ANY_VALUE(e) END``: ``e`` for one row, NULL for none,
DuckDB's own error for more. (sqlglot's expression classes are compiled and
cannot be subclassed for a mark of their own.)"""


def one_row_or_error(expression: exp.Expr) -> exp.Expr:
    """Write the value of each correlated scalar subquery that does not aggregate
    as a ``MAX`` marked ``ONE_ROW`` (see there)."""
    for node in list(expression.find_all(exp.Subquery)):
        select = node.this
        if isinstance(node.parent, _NOT_SCALAR) or not isinstance(select, exp.Select):
            continue
        if len(select.expressions) != 1 or not is_correlated(select):
            continue
        if any(
            select.args.get(key)
            for key in ("group", "having", "limit", "offset", "distinct", "qualify", "windows")
        ):
            continue
        item = select.expressions[0]
        if item.find(exp.AggFunc, exp.Window, exp.Query) is not None or item.is_star:
            continue
        value = exp.Max(this=item.unalias().copy())
        value.meta[ONE_ROW] = True
        item.replace(exp.alias_(value, item.alias_or_name))
    return expression


def one_row_checked(expression: exp.Expr) -> exp.Expr:
    """Write each ``MAX`` marked ``ONE_ROW`` out as the aggregates that check it."""
    for node in list(expression.find_all(exp.Max)):
        if not node.meta.get(ONE_ROW):
            continue
        many = exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(1))
        fail = exp.Anonymous(this="error", expressions=[exp.Literal.string(SCALAR_ROWS_ERROR)])
        node.replace(
            exp.Case(ifs=[exp.If(this=many, true=fail)], default=exp.AnyValue(this=node.this))
        )
    return expression


def is_semi_join_exists(node: exp.Expr) -> bool:
    """True for ``[NOT] EXISTS (SELECT ... FROM ... WHERE <correlation> AND ...)`` in a
    WHERE conjunct that the binder turns into a SEMI (ANTI) join.

    sqlglot's decorrelation turns such an EXISTS into a LEFT JOIN with an aggregate
    that collects the inner rows of every outer key into lists and filters them
    row by row (TPC-H q21 spent 1.2 s of its 1.8 s there); a semi join is what the
    query means and what DuckDB runs best. Only the plain form is taken: the inner
    query is one SELECT without GROUP BY, HAVING, LIMIT, aggregates, windows or
    nested subqueries, and its correlation is in top-level WHERE conjuncts that
    name only its own sources and the enclosing SELECT's. Everything else is left
    to sqlglot, as before.
    """
    if not isinstance(node, exp.Exists) or not isinstance(node.this, exp.Select):
        return False
    anchor = node.parent if isinstance(node.parent, exp.Not) else node
    if not _is_where_conjunct(anchor):
        return False
    outer = anchor.find_ancestor(exp.Select)
    return outer is not None and is_plain_exists(node.this, source_aliases(outer))


def is_plain_exists(query: exp.Select, outer_aliases: set[str]) -> bool:
    """True when ``EXISTS (query)`` in a SELECT over ``outer_aliases`` is a semi join.

    ``query`` is one SELECT without GROUP BY, HAVING, LIMIT, aggregates (an
    aggregate without GROUP BY always has a row), windows or nested queries, its
    sources' aliases are its own, and the columns of the outer query appear only
    in top-level WHERE conjuncts that name nothing further out.
    """
    for key in ("group", "having", "limit", "offset", "qualify", "windows", "laterals"):
        if query.args.get(key):
            return False
    if query.find(exp.AggFunc, exp.Window) is not None:
        return False
    if any(q is not query for q in query.find_all(exp.Query)):
        return False
    inner = source_aliases(query)
    if not inner or inner & outer_aliases:
        return False
    where = query.args.get("where")
    correlation = [
        c
        for c in conjuncts(where.this if where is not None else None)
        if any(col.table not in inner for col in c.find_all(exp.Column))
    ]
    if any(
        not {col.table for col in c.find_all(exp.Column)} <= inner | outer_aliases
        for c in correlation
    ):
        return False  # it names a query further out
    outside = [c for c in query.find_all(exp.Column) if c.table not in inner]
    inside = [c for cond in correlation for c in cond.find_all(exp.Column) if c.table not in inner]
    return bool(correlation) and len(outside) == len(inside)


def _filter_correlated_sources(expression: exp.Expr) -> exp.Expr:
    """Give sqlglot a correlated subquery it can decorrelate although its WHERE has ORs.

    sqlglot decorrelates a subquery only when its WHERE holds no OR at all, and
    on correlating equalities among its top-level conjuncts. TPC-DS q41's
    subquery over one table repeats ``i_manufact = i1.i_manufact`` inside both
    branches of a big OR of the table's own filters, so the query ran whole in one
    task. Here, in a correlated subquery over a single table: what every branch of
    an OR shares is taken out of it (``(a AND b) OR (a AND c)`` is ``a AND (b OR
    c)``, in three-valued logic too), and the conjuncts that name only the table
    and hold an OR move into a derived table of it, with the columns the subquery
    reads. Only when the WHERE left then has no OR; otherwise nothing changes.
    """
    for select in list(expression.find_all(exp.Select)):
        where = select.args.get("where")
        from_key = "from_" if "from_" in type(select).arg_types else "from"
        from_ = select.args.get(from_key)
        if (
            select is expression
            or where is None
            or from_ is None
            or not isinstance(from_.this, exp.Table)
            or select.args.get("joins")
            or select.args.get("laterals")
            or where.find(exp.Or) is None
            or not is_correlated(select)
        ):
            continue
        alias = from_.this.alias_or_name
        parts: list[exp.Expr] = []
        for cond in conjuncts(where.this):
            common, rest = common_factors(cond)
            if not common or len(rest) < 2 or cond.find(*VOLATILE) is not None:
                parts.append(cond)
                continue
            parts.extend(common)
            if all(rest):  # a branch of common factors only: the others add nothing
                parts.append(exp.paren(exp.or_(*(exp.paren(exp.and_(*r)) for r in rest))))
        local = [
            p
            for p in parts
            if qualifiers(p) == {alias}
            and not has_subquery(p)
            and p.find(*VOLATILE) is None
            and p.find(exp.Or) is not None
        ]
        kept = [p for p in parts if not any(p is q for q in local)]
        if not local or not kept or any(p.find(exp.Or) is not None for p in kept):
            continue
        columns = sorted({c.name for c in select.find_all(exp.Column) if c.table == alias})
        derived = (
            exp.select(*(exp.alias_(exp.column(c, table=alias), c) for c in columns))
            .from_(from_.this.copy())
            .where(exp.and_(*(p.copy() for p in local)))
        )
        from_.set("this", derived.subquery(alias))
        where.set("this", exp.and_(*(p.copy() for p in kept)))
    return expression


def _is_where_conjunct(node: exp.Expr) -> bool:
    parent = node.parent
    while isinstance(parent, (exp.And, exp.Paren)):
        parent = parent.parent
    return isinstance(parent, exp.Where)


def _restore_uncorrelated(expression: exp.Expr, stash: dict[int, exp.Expr]) -> exp.Expr:
    def repl(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous) and str(node.this) == _MARKER:
            original = stash[int(node.expressions[0].this)].copy()
            if isinstance(original, exp.In):
                original.set("this", node.expressions[1].copy())
            return original
        return node

    return expression.transform(repl, copy=False)


def _restore_ctes(expression: exp.Expr, ctes: list[exp.CTE]) -> exp.Expr:
    """Put back the query's CTEs that only hidden subqueries read.

    sqlglot's rules do not see into a hidden subquery, so a CTE only such a
    subquery reads looks unused to them, and ``pushdown_projections`` drops it
    (TPC-DS q95's ``ws_wh``, read by two ``IN (SELECT ...)``; q14's
    ``cross_items``): the restored subquery then names a table nothing defines.
    Those CTEs come back as they were after qualifying, ahead of the others (they
    read only tables and each other). A name sqlglot has given to a CTE of its
    own meanwhile is left alone.
    """
    if not ctes or not isinstance(expression, exp.Query):
        return expression
    key = "with_" if "with_" in type(expression).arg_types else "with"  # sqlglot renamed it
    with_ = expression.args.get(key)
    defined = {c.alias for w in expression.find_all(exp.With) for c in w.expressions}
    named = {t.name for t in expression.find_all(exp.Table) if not t.args.get("db")}
    wanted = {c.alias for c in ctes if c.alias in named and c.alias not in defined}
    # and the CTEs those read, transitively
    by_name = {c.alias: c for c in ctes}
    todo = list(wanted)
    while todo:
        cte = by_name[todo.pop()]
        for t in cte.find_all(exp.Table):
            if t.name in by_name and t.name not in wanted and t.name not in defined:
                wanted.add(t.name)
                todo.append(t.name)
    if not wanted:
        return expression
    restored = [c.copy() for c in ctes if c.alias in wanted]
    existing = list(with_.expressions) if with_ is not None else []
    expression.set(key, exp.With(expressions=_readers_last(restored + existing)))
    return expression


def _readers_last(ctes: list[exp.CTE]) -> list[exp.CTE]:
    """``ctes`` in an order where each comes after the CTEs it reads (DuckDB binds a
    CTE against those before it only); otherwise in the order given.

    A restored CTE may read one sqlglot kept, or one lifted out of a subquery.
    """
    names = {c.alias for c in ctes}
    reads = {
        id(c): {t.name for t in c.this.find_all(exp.Table) if not t.args.get("db")}
        & names - {c.alias}
        for c in ctes
    }
    ordered: list[exp.CTE] = []
    placed: set[str] = set()
    pending = list(ctes)
    while pending:
        ready = [c for c in pending if reads[id(c)] <= placed] or pending[:1]  # a cycle: as given
        first = ready[0]
        ordered.append(first)
        placed.add(first.alias)
        pending.remove(first)
    return ordered


def _unique_cte_names(expression: exp.Expr) -> None:
    """Rename CTEs so that no two in the query share a name, and their readers with them.

    A CTE in a subquery may shadow one of the same name outside it. The hidden
    subqueries (``_hide_uncorrelated``) are out of sight of sqlglot's rules, which
    lift nested CTEs to the top and rename a clashing one there, so a hidden
    reader kept the old name and read the outer CTE (a wrong answer), and a CTE
    only hidden readers read was dropped and not restored. With one name per CTE
    neither can happen. Runs after ``qualify``: every table reference has an alias,
    which stays, so column qualifiers still resolve. Queries without a clash are
    left as they are.
    """
    defined = [c.alias for w in expression.find_all(exp.With) for c in w.expressions]
    if len(defined) == len(set(defined)):
        return
    taken = set(defined) | {t.name for t in expression.find_all(exp.Table)}
    seen: set[str] = set()

    def fresh(name: str) -> str:
        if name not in seen:
            seen.add(name)
            return name
        n = 2
        while f"{name}_{n}" in taken:
            n += 1
        taken.add(f"{name}_{n}")
        return f"{name}_{n}"

    def visit(node: exp.Expr, scope: dict[str, str]) -> None:
        with_ = node.args.get("with_") or node.args.get("with")
        if isinstance(with_, exp.With):
            scope = dict(scope)
            recursive = bool(with_.args.get("recursive"))
            for cte in with_.expressions:
                new = fresh(cte.alias)
                if recursive:
                    scope[cte.alias] = new
                visit(cte.this, scope)
                scope[cte.alias] = new
                cte.set("alias", exp.TableAlias(this=exp.to_identifier(new)))
        if isinstance(node, exp.Table) and not node.args.get("db") and node.name in scope:
            if not node.alias:
                node.set("alias", exp.TableAlias(this=exp.to_identifier(node.name)))
            node.set("this", exp.to_identifier(scope[node.name]))
        for child in node.iter_expressions():
            if child is not with_:
                visit(child, scope)

    visit(expression, {})
