"""Helpers over sqlglot expressions, shared by the front end, the binder and the
distributor: splitting and joining conditions, the aliases an expression names,
column references, top-down substitution, grouping sets, and the placeholder by
which a bound expression refers to an uncorrelated subquery planned on its own.

Nothing here knows the logical plan: a column reference is a ``(qualifier, name)``
pair, which ``plan.logical`` calls a ``Ref``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sqlglot import exp

PLACEHOLDER_PREFIX = "__sq"
"""An uncorrelated subquery inside an expression is bound as ``(SELECT * FROM
__sqN)``: a table of this prefix, whose rows a stage of its own computes."""


def conjuncts(cond: exp.Expr | None) -> list[exp.Expr]:
    """The AND-ed parts of a condition; literal TRUEs (sqlglot leaves them where it
    moved a conjunct away) are dropped.

    >>> import sqlglot
    >>> [c.sql() for c in conjuncts(sqlglot.parse_one("a = 1 AND (b OR c) AND TRUE AND (d = e)"))]
    ['a = 1', '(b OR c)', 'd = e']
    """
    if cond is None or (isinstance(cond, exp.Boolean) and cond.this is True):
        return []
    if isinstance(cond, exp.And):
        return conjuncts(cond.left) + conjuncts(cond.right)
    if isinstance(cond, exp.Paren):
        # ``JOIN t ON (a = b)``: the equality must be seen as one, or the join
        # orderer finds no key there and plans a cross product (TPC-DS q72).
        # An OR keeps its parentheses.
        return [cond] if isinstance(cond.this, exp.Or) else conjuncts(cond.this)
    return [cond]


def disjuncts(cond: exp.Expr) -> list[exp.Expr]:
    """The OR-ed parts of a condition (through parentheses)."""
    if isinstance(cond, exp.Paren):
        return disjuncts(cond.this)
    if isinstance(cond, exp.Or):
        return disjuncts(cond.left) + disjuncts(cond.right)
    return [cond]


VOLATILE = (exp.Rand, exp.Randn, exp.Randstr, exp.Uuid, exp.Anonymous)
"""Functions whose value may differ call by call (``Anonymous``: any function sqlglot
does not know, such as ``nextval``, and the front end's markers of hidden
subqueries): a condition holding one is never rewritten or moved."""


def common_factors(cond: exp.Expr) -> tuple[list[exp.Expr], list[list[exp.Expr]]]:
    """The conjuncts every branch of an OR shares, and what is left of each branch.

    ``(a AND b) OR (a AND c)`` is ``a AND (b OR c)`` (distributivity holds in SQL's
    three-valued logic too); a branch left with nothing makes the OR ``a`` alone.

    >>> import sqlglot
    >>> common, rest = common_factors(sqlglot.parse_one("(a = 1 AND b) OR (c AND a = 1)"))
    >>> [c.sql() for c in common], [[c.sql() for c in r] for r in rest]
    (['a = 1'], [['b'], ['c']])
    """
    branches = [conjuncts(b) for b in disjuncts(cond)]
    if len(branches) < 2:
        return [], branches
    common = [c for c in branches[0] if all(c in b for b in branches[1:])]
    return common, [[c for c in b if c not in common] for b in branches]


def and_all(conds: list[exp.Expr]) -> exp.Expr | None:
    """The conjunction of ``conds`` (not copied); None for no condition."""
    if not conds:
        return None
    return conds[0] if len(conds) == 1 else exp.and_(*conds, copy=False)


def iter_scope(node: exp.Expr) -> Iterator[exp.Expr]:
    """Walk an expression without entering nested queries."""
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        for child in cur.iter_expressions():
            if isinstance(child, exp.Query):
                continue
            stack.append(child)


def qualifiers(node: exp.Expr) -> set[str]:
    """The table qualifiers of the columns an expression names (outside nested queries)."""
    return {c.table for c in iter_scope(node) if isinstance(c, exp.Column)}


def source_aliases(select: exp.Select) -> set[str]:
    """The aliases a SELECT's FROM clause and joins define."""
    from_ = select.args.get("from_") or select.args.get("from")
    items = ([from_.this] if from_ is not None else []) + [
        j.this for j in select.args.get("joins") or []
    ]
    return {i.alias_or_name for i in items}


def sides_join(a: set[str], b: set[str], left: set[str], right: set[str]) -> bool:
    """Whether an equality whose sides use aliases ``a`` and ``b`` joins ``left`` to ``right``."""
    return bool(a and b) and ((a <= left and b <= right) or (a <= right and b <= left))


def split_keys(
    conds: list[exp.Expr], left: set[str], right: set[str]
) -> tuple[list[exp.Expr], list[exp.Expr], list[exp.Expr]]:
    """A join's conditions as its keys and the rest: ``(left keys, right keys,
    residual)``, where each equality of a column set of ``left`` to one of
    ``right`` (without a subquery placeholder) gives a key pair."""
    lk: list[exp.Expr] = []
    rk: list[exp.Expr] = []
    residual: list[exp.Expr] = []
    for c in conds:
        if (
            isinstance(c, exp.EQ)
            and sides_join(qualifiers(c.left), qualifiers(c.right), left, right)
            and not has_placeholder(c)
        ):
            if qualifiers(c.left) <= left:
                lk.append(c.left)
                rk.append(c.right)
            else:
                lk.append(c.right)
                rk.append(c.left)
        else:
            residual.append(c)
    return lk, rk, residual


def col(ref: tuple[str, str]) -> exp.Expr:
    """A quoted column reference to ``(qualifier, name)``."""
    return exp.column(ref[1], table=ref[0], quoted=True)


def substitute(expr: exp.Expr, fn: Callable[[exp.Expr], exp.Expr | None]) -> exp.Expr:
    """Replace subtrees top-down: ``fn`` returns a replacement or None to descend.

    Works on a copy; nested queries are not entered.
    """

    def visit(node: exp.Expr) -> exp.Expr:
        repl = fn(node)
        if repl is not None:
            return repl
        if isinstance(node, exp.Query):
            return node
        for key, value in list(node.args.items()):
            if isinstance(value, exp.Expr):
                node.set(key, visit(value))
            elif isinstance(value, list):
                node.set(key, [visit(v) if isinstance(v, exp.Expr) else v for v in value])
        return node

    return visit(expr.copy())


def _unwrap(e: exp.Expr) -> list[exp.Expr]:
    if isinstance(e, exp.Tuple):
        return [x for sub in e.expressions for x in _unwrap(sub)]
    if isinstance(e, exp.Paren):
        return _unwrap(e.this)
    return [e]


def grouping_sets(g: exp.Expr) -> list[list[exp.Expr]]:
    """The grouping sets a ROLLUP / CUBE / GROUPING SETS clause stands for."""
    items = [_unwrap(e) for e in g.expressions]
    if isinstance(g, exp.Rollup):
        return [[x for part in items[:i] for x in part] for i in range(len(items), -1, -1)]
    if isinstance(g, exp.Cube):
        sets: list[list[exp.Expr]] = [[]]
        for part in items:
            sets = [s + part for s in sets] + sets
        return sets
    return items


def has_placeholder(e: exp.Expr) -> bool:
    """True when ``e`` reads a subquery placeholder (``PLACEHOLDER_PREFIX``)."""
    return any(
        isinstance(t, exp.Table) and t.name.startswith(PLACEHOLDER_PREFIX)
        for t in e.find_all(exp.Table)
    )


def has_subquery(e: exp.Expr) -> bool:
    """True when a query is nested anywhere inside ``e``."""
    return any(isinstance(n, exp.Query) for n in e.walk() if n is not e)


def is_correlated(query: exp.Query) -> bool:
    """True when ``query`` names a column of a source it does not define itself."""
    defined: set[str] = set()
    for node in query.walk():
        if isinstance(node, (exp.Table, exp.Subquery, exp.CTE)) and node.alias_or_name:
            defined.add(node.alias_or_name)
    return any(
        isinstance(c, exp.Column) and c.table and c.table not in defined for c in query.walk()
    )
