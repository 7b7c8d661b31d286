"""Filters of a CTE's readers pushed into the CTE, when it is read more than once.

sqlglot's ``pushdown_predicates`` pushes a reader's WHERE into a CTE only when the
CTE has one reader. Read twice, a CTE that aggregates is computed once for both
(``plan.bind``), over all of its input, even where each reader keeps a small part
of it: TPC-DS q39 aggregates a year of inventory (2.3M rows) in a CTE that one
reader filters to ``d_moy = 1`` and the other to ``d_moy = 2``. What every reader
keeps passes the OR of their filters, so that OR may filter the CTE's own rows:

    WITH inv AS (SELECT d_moy, avg(q) AS mean FROM t GROUP BY d_moy)
    SELECT ... FROM inv a JOIN inv b ON ... WHERE a.d_moy = 1 AND b.d_moy = 2
    -- inv's body gets WHERE (t.d_moy = 1 OR t.d_moy = 2)

Each reader keeps its own filter. The OR goes down through selects where a filter
on an output column means the same as on the column it comes from: a plain
column, a GROUP BY key if the select aggregates (not of grouping sets: a rolled-up
row mixes groups), no window function, LIMIT or DISTINCT ON, and into a CTE read
only there when no outer join could turn a filtered-out row into a NULL-padded one.
It goes into each branch of a UNION [ALL], by position. A term that cannot go
down (an aggregate's output, a branch's constant) is dropped from its AND, which
only weakens the filter: every row a reader keeps still passes it. Where it can go
no deeper, it joins that select's WHERE, unless the select keeps those rows only
already (the same condition, or fewer literals of the column).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from sqlglot import exp

from mangonel.sql.exprs import VOLATILE

__all__ = [
    "add_cte",
    "open_to_ctes",
    "push_into_shared_ctes",
    "self_contained",
    "share_repeated_subqueries",
]


def push_into_shared_ctes(query: exp.Expr) -> exp.Expr:
    """``query`` (qualified: every column names its source) with the OR of each
    shared CTE's readers' filters pushed into the CTE, in place."""
    with_ = query.args.get("with_") or query.args.get("with")
    if not isinstance(query, exp.Select) or with_ is None or with_.args.get("recursive"):
        return query
    if any(w is not with_ for w in query.find_all(exp.With)):
        return query  # a nested WITH may shadow a name
    ctes = {c.alias_or_name: c for c in with_.expressions}
    if len(ctes) != len(with_.expressions):
        return query
    readers: dict[str, list[exp.Table]] = {}
    for t in query.find_all(exp.Table):
        if t.name in ctes and not t.args.get("db"):
            readers.setdefault(t.name, []).append(t)
    reads = Counter({name: len(ts) for name, ts in readers.items()})
    for name, cte in ctes.items():
        if reads[name] < 2:
            continue
        filters = [_reader_filter(t) for t in readers[name]]
        if any(f is None for f in filters):
            continue  # a reader that keeps every row: nothing to push
        either = exp.or_(*[exp.paren(f, copy=False) for f in filters if f is not None])
        _push(cte.this, either, ctes, reads)
    return query


def _reader_filter(table: exp.Table) -> exp.Expr | None:
    """The AND of the WHERE and inner-join conditions that name only ``table``'s
    alias in the select reading it, over the CTE's column names; None if none."""
    clause = table.parent
    select = clause.parent if isinstance(clause, (exp.From, exp.Join)) else None
    if not isinstance(select, exp.Select) or _outer_joins(select):
        return None
    alias = table.alias_or_name
    conds: list[exp.Expr] = []
    where = select.args.get("where")
    if where is not None:
        conds += _conjuncts(where.this)
    for join in select.args.get("joins") or []:
        if join.args.get("on") is not None:
            conds += _conjuncts(join.args["on"])
    mine = [c for c in conds if _only(c, alias)]
    if not mine:
        return None
    unqualified = [
        c.copy().transform(
            lambda n: exp.column(n.args["this"].copy()) if isinstance(n, exp.Column) else n
        )
        for c in mine
    ]
    return exp.and_(*unqualified) if len(unqualified) > 1 else unqualified[0]


def _push(query: exp.Expr, cond: exp.Expr, ctes: dict[str, exp.CTE], reads: Counter[str]) -> bool:
    """Filter ``query``'s rows by ``cond`` (over its output names), as deep as it
    means the same; False where all of it could not go (``query`` is then untouched,
    or, below a set operation, filtered only in some of its branches)."""
    if isinstance(query, exp.Union):
        return _push_union(query, cond, ctes, reads)
    if not isinstance(query, exp.Select) or _not_pushable(query):
        return False
    group = query.args.get("group")
    grouped = group is not None or any(
        isinstance(n, exp.AggFunc) for e in query.expressions for n in e.walk()
    )
    keys = list(group.expressions) if group is not None else []
    if group is not None and any(group.args.get(k) for k in ("grouping_sets", "rollup", "cube")):
        return False
    outputs = {
        e.alias_or_name: e.this if isinstance(e, exp.Alias) else e for e in query.expressions
    }

    def passes(leaf: exp.Expr) -> bool:
        for c in leaf.find_all(exp.Column):
            source = outputs.get(c.name)
            if not isinstance(source, exp.Column) or (grouped and source not in keys):
                return False
        return True

    weaker = _weaken(cond, passes)
    if weaker is None:
        return False
    cond = _distinct_terms(weaker)
    mapping = {c.name: outputs[c.name].copy() for c in cond.find_all(exp.Column)}
    inner = cond.copy().transform(
        lambda n: mapping[n.name].copy() if isinstance(n, exp.Column) else n
    )
    qualifiers = {c.table for c in inner.find_all(exp.Column)}
    if len(qualifiers) == 1 and not _outer_joins(query):
        (alias,) = qualifiers
        cte = _cte_source(query, alias, ctes)
        if cte is not None and reads[cte.alias_or_name] == 1:
            below = inner.copy().transform(
                lambda n: exp.column(n.args["this"].copy()) if isinstance(n, exp.Column) else n
            )
            if _push(cte.this, below, ctes, reads):
                return True
    if not _implied(query, inner, ctes):
        query.where(inner, copy=False)
    return True


def _push_union(
    query: exp.Union, cond: exp.Expr, ctes: dict[str, exp.CTE], reads: Counter[str]
) -> bool:
    """Filter each branch of a UNION [ALL] by ``cond``, its columns renamed to the
    branch's by position: a row of the union passes exactly where it passed in its
    branch (and duplicates dropped after the filter are the ones dropped before).

    Only terms over columns that every branch takes from a column of one name (q04's
    ``dyear``: ``d_year`` in each channel) go down: a union's column has the type its
    branches' types meet in, and a condition may mean another thing in a branch's
    own type (a VARCHAR union of an INTEGER branch: ``k = '01'`` holds for the
    integer 1, not for the string '1')."""
    names = query.named_selects
    if (
        query.args.get("by_name")
        or query.args.get("limit")
        or query.args.get("offset")
        or query.args.get("order")
        or len(set(names)) != len(names)
        or any(c.name not in names for c in cond.find_all(exp.Column))
    ):
        return False
    alike = _alike_positions(query, len(names))
    uniform = {name for i, name in enumerate(names) if i in alike}
    weaker = _weaken(cond, lambda leaf: all(c.name in uniform for c in leaf.find_all(exp.Column)))
    if weaker is None:
        return False
    cond = weaker
    pushed = True
    for branch in (query.left, query.right):
        while isinstance(branch, exp.Subquery) and not any(
            v is not None for k, v in branch.args.items() if k != "this"
        ):
            branch = branch.this  # parentheses only
        if not isinstance(branch, exp.Query) or len(branch.named_selects) != len(names):
            return False
        by_position = dict(zip(names, branch.named_selects, strict=True))
        renamed = cond.copy().transform(partial(_renamed, by_position))
        pushed = _push(branch, renamed, ctes, reads) and pushed
    return pushed


def _alike_positions(query: exp.Expr, width: int) -> set[int]:
    """The output positions where every SELECT of a union (nested unions and
    parentheses looked through) is a plain column, of one name in all of them."""
    selects: list[exp.Select] = []
    stack = [query]
    while stack:
        node = stack.pop()
        if isinstance(node, exp.Subquery):
            stack.append(node.this)
        elif isinstance(node, exp.Union):
            stack += [node.left, node.right]
        elif isinstance(node, exp.Select) and len(node.expressions) == width:
            selects.append(node)
        else:
            return set()
    alike = set()
    for i in range(width):
        sources = [s.expressions[i] for s in selects]
        sources = [e.this if isinstance(e, exp.Alias) else e for e in sources]
        if all(isinstance(e, exp.Column) for e in sources) and len({e.name for e in sources}) == 1:
            alike.add(i)
    return alike


def _renamed(names: dict[str, str], node: exp.Expr) -> exp.Expr:
    return exp.column(names[node.name]) if isinstance(node, exp.Column) else node


def _weaken(cond: exp.Expr, passes: Callable[[exp.Expr], bool]) -> exp.Expr | None:
    """``cond`` without the conditions ``passes`` refuses, taken as TRUE, through its
    ANDs and ORs; None where nothing is left (TRUE).

    A weaker filter is still one every row the readers keep passes (each reader
    keeps its own filter): q04's readers keep ``sale_type = 's' AND dyear = 2001
    AND year_total > 0``, where ``year_total`` is an aggregate and ``sale_type`` a
    constant of each branch, and the years alone go down."""
    if isinstance(cond, exp.Paren):
        inner = _weaken(cond.this, passes)
        return None if inner is None else exp.paren(inner, copy=False)
    if isinstance(cond, exp.Or):
        left, right = _weaken(cond.left, passes), _weaken(cond.right, passes)
        return None if left is None or right is None else exp.or_(left, right, copy=False)
    if isinstance(cond, exp.And):
        sides = (_weaken(cond.left, passes), _weaken(cond.right, passes))
        kept = [p for p in sides if p is not None]
        return exp.and_(*kept, copy=False) if kept else None
    return cond.copy() if passes(cond) else None


def _distinct_terms(cond: exp.Expr) -> exp.Expr:
    """``cond`` with each term of its top OR once (readers that weakened alike)."""
    terms = {_bare(t).sql(): t for t in _disjuncts(cond)}
    if len(terms) == 1:
        return next(iter(terms.values()))
    return exp.paren(exp.or_(*terms.values(), copy=False), copy=False)


def _bare(cond: exp.Expr) -> exp.Expr:
    while isinstance(cond, exp.Paren):
        cond = cond.this
    return cond


def _disjuncts(cond: exp.Expr) -> list[exp.Expr]:
    if isinstance(cond, exp.Or):
        return _disjuncts(cond.left) + _disjuncts(cond.right)
    if isinstance(cond, exp.Paren) and isinstance(cond.this, exp.Or):
        return _disjuncts(cond.this)
    return [cond]


def _implied(query: exp.Select, cond: exp.Expr, ctes: dict[str, exp.CTE]) -> bool:
    """Whether a conjunct of ``query``'s WHERE (or of an inner join's ON, where no
    join is outer), or of the CTE that ``cond``'s one source reads, already keeps
    only rows that pass ``cond``: the same condition, or a column's values among
    ``cond``'s values of it. Such a filter adds nothing, and the estimates would
    count it twice: TPC-DS q74's CTE keeps ``d_year IN (2001, 2002)`` itself (in a
    CTE of ``date_dim`` that both its branches read), and its readers the years
    2001 and 2002 again."""
    qualifiers = {c.table for c in cond.find_all(exp.Column)}
    if len(qualifiers) == 1 and not _outer_joins(query):
        cte = _cte_source(query, next(iter(qualifiers)), ctes)
        body = cte.this if cte is not None else None
        if isinstance(body, exp.Select) and not _not_pushable(body) and not body.args.get("group"):
            outputs = {
                e.alias_or_name: e.this if isinstance(e, exp.Alias) else e for e in body.expressions
            }
            sources = [outputs.get(c.name) for c in cond.find_all(exp.Column)]
            if all(isinstance(source, exp.Column) for source in sources):
                inside = cond.copy().transform(
                    lambda n: outputs[n.name].copy() if isinstance(n, exp.Column) else n
                )
                if _implied(body, inside, ctes):
                    return True
    where = query.args.get("where")
    held_by: list[exp.Expr] = _conjuncts(where.this) if where is not None else []
    if not _outer_joins(query):
        for join in query.args.get("joins") or []:
            if join.args.get("on") is not None:
                held_by += _conjuncts(join.args["on"])
    wanted = _values(cond)
    for have in held_by:
        if have == cond:
            return True
        held = _values(have)
        if (
            wanted is not None
            and held is not None
            and held[0] == wanted[0]
            and held[1] <= wanted[1]
        ):
            return True
    return False


def _values(cond: exp.Expr) -> tuple[exp.Column, frozenset[tuple[bool, str]]] | None:
    """``(column, literals)`` where ``cond`` holds exactly when the column is one of
    the literals (``=``, ``IN``, ORs of them on one column); None otherwise."""
    if isinstance(cond, exp.Paren):
        return _values(cond.this)
    if isinstance(cond, exp.Or):
        left, right = _values(cond.left), _values(cond.right)
        if left is None or right is None or left[0] != right[0]:
            return None
        return left[0], left[1] | right[1]
    if isinstance(cond, exp.EQ):
        pairs = [(cond.this, cond.expression), (cond.expression, cond.this)]
        for col, lit in pairs:
            if isinstance(col, exp.Column) and isinstance(lit, exp.Literal):
                return col, frozenset({(lit.is_string, lit.this)})
        return None
    if (
        isinstance(cond, exp.In)
        and isinstance(cond.this, exp.Column)
        and not cond.args.get("query")
    ):
        items = cond.expressions
        if items and all(isinstance(i, exp.Literal) for i in items):
            return cond.this, frozenset((i.is_string, i.this) for i in items)
    return None


def _not_pushable(query: exp.Select) -> bool:
    distinct = query.args.get("distinct")
    return bool(
        query.args.get("limit")
        or query.args.get("offset")
        or (distinct is not None and distinct.args.get("on"))
        or any(isinstance(n, exp.Window) for e in query.expressions for n in e.walk())
    )


def _outer_joins(select: exp.Select) -> bool:
    return any(j.args.get("side") for j in select.args.get("joins") or [])


def _cte_source(select: exp.Select, alias: str, ctes: dict[str, exp.CTE]) -> exp.CTE | None:
    """The CTE read as ``alias`` in ``select``'s FROM or joins, if one is."""
    from_ = select.args.get("from_") or select.args.get("from")
    items = [from_.this] if from_ is not None else []
    items += [j.this for j in select.args.get("joins") or []]
    for item in items:
        if isinstance(item, exp.Table) and item.alias_or_name == alias and item.name in ctes:
            return ctes[item.name]
    return None


def _conjuncts(cond: exp.Expr) -> list[exp.Expr]:
    if isinstance(cond, exp.And):
        return _conjuncts(cond.left) + _conjuncts(cond.right)
    if isinstance(cond, exp.Paren):
        return _conjuncts(cond.this) if isinstance(cond.this, exp.And) else [cond]
    return [cond]


def _only(cond: exp.Expr, alias: str) -> bool:
    """True when ``cond`` reads columns of ``alias`` only, and is a plain condition
    (no subquery, aggregate, window or volatile function, not a constant TRUE)."""
    columns = list(cond.find_all(exp.Column))
    if not columns or any(c.table != alias for c in columns):
        return False
    banned = (exp.Query, exp.AggFunc, exp.Window, *VOLATILE)
    return not any(isinstance(n, banned) for n in cond.walk())


def share_repeated_subqueries(query: exp.Expr) -> exp.Expr:
    """``query`` (qualified) with each derived table written out more than once, the
    same text each time, made one CTE that its readers share, in place.

    A CTE read twice is computed once (``plan.bind``); a derived table, as often as
    it is written. TPC-DS q65 aggregates a year of ``store_sales`` by store and
    item twice, word for word: once for each store's average, once for the rows
    compared with it. The CTE goes before the first CTE of the top WITH that reads
    it, after those it reads. Two CTEs of the same body become one the same way
    (``_merge_equal_ctes``).

    Only a derived table that aggregates (``_shareable``), and only where one
    evaluation means the same as several: a derived table of a SELECT's FROM or
    JOIN, every column of its own sources (nothing of an outer query), without a
    function whose value may differ call by call or a LIMIT (either may give each
    evaluation other rows), under no WITH but the top one.
    """
    if not isinstance(query, exp.Select) or not open_to_ctes(query):
        return query
    with_ = query.args.get("with_") or query.args.get("with")
    if with_ is not None:
        _merge_equal_ctes(query, with_)
    top = [c.alias_or_name for c in with_.expressions] if with_ is not None else []
    taken = {t.name for t in query.find_all(exp.Table)} | set(top)
    refused: set[str] = set()
    made = 0
    while True:
        derived = [
            sub
            for sub in query.find_all(exp.Subquery)
            if isinstance(sub.parent, (exp.From, exp.Join)) and isinstance(sub.this, exp.Query)
        ]
        repeated = [
            (text, subs)
            for text, subs in _written_alike(derived, lambda sub: sub.this)
            if text not in refused and _shareable(subs[0].this)
        ]
        if not repeated:
            return query
        # The longest first: a repeated one inside it is then left once, in its CTE.
        text, subs = max(repeated, key=lambda item: len(item[0]))
        at = _place(query, with_, top, subs)
        if at is None:
            refused.add(text)
            continue
        made += 1
        while f"shared_subquery_{made}" in taken:
            made += 1
        name = f"shared_subquery_{made}"
        taken.add(name)
        cte = exp.CTE(
            this=subs[0].this.copy(),
            alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True)),
        )
        with_ = add_cte(query, cte, at)
        top = [c.alias_or_name for c in with_.expressions]
        for sub in subs:
            alias = sub.args.get("alias")
            sub.replace(
                exp.Table(
                    this=exp.to_identifier(name, quoted=True), alias=alias.copy() if alias else None
                )
            )


_N = TypeVar("_N", bound=exp.Expr)


def _written_alike(nodes: list[_N], body: Callable[[_N], exp.Expr]) -> list[tuple[str, list[_N]]]:
    """The SQL text of each ``body`` that two or more of ``nodes`` share, with those
    nodes in order; texts in the order of their first node.

    A text is rendered only for bodies equal as trees to another's (sqlglot's
    structural equality): every subquery's text, rendered at each round of
    ``share_repeated_subqueries``, was most of its time over TPC-DS, where few
    repeat.
    """
    trees: dict[exp.Expr, list[_N]] = {}
    for node in nodes:
        trees.setdefault(body(node), []).append(node)
    texts: dict[str, list[_N]] = {}
    for alike in trees.values():
        if len(alike) > 1:
            for node in alike:
                texts.setdefault(body(node).sql(), []).append(node)
    order = {id(node): i for i, node in enumerate(nodes)}
    groups = [(text, group) for text, group in texts.items() if len(group) > 1]
    return sorted(groups, key=lambda item: order[id(item[1][0])])


def open_to_ctes(query: exp.Select) -> bool:
    """Whether CTEs may be added to ``query``'s own WITH: it has no other WITH (a
    nested one may shadow a name) and is not recursive."""
    with_ = query.args.get("with_") or query.args.get("with")
    if with_ is not None and with_.args.get("recursive"):
        return False
    return all(w is with_ for w in query.find_all(exp.With))


def add_cte(query: exp.Select, cte: exp.CTE, at: int) -> exp.With:
    """Put ``cte`` at position ``at`` of ``query``'s WITH (made where it has none)."""
    with_ = query.args.get("with_") or query.args.get("with")
    if with_ is None:
        with_ = exp.With(expressions=[])
        query.set("with_" if "with_" in query.arg_types else "with", with_)
    with_.set("expressions", [*with_.expressions[:at], cte, *with_.expressions[at:]])
    return with_


def _merge_equal_ctes(query: exp.Select, with_: exp.With) -> None:
    """Readers of a CTE whose body is word for word an earlier one's read that one
    instead, and the later one goes (TPC-DS q44's ``v1`` and ``v2``, one store's
    items by their average profit, for the best and for the worst ten)."""
    renamed: dict[str, str] = {}
    for _, alike in _written_alike(with_.expressions, lambda cte: cte.this):
        for cte in alike[1:]:
            if _shareable(cte.this):
                renamed[cte.alias_or_name] = alike[0].alias_or_name
    if not renamed:
        return
    kept = [cte for cte in with_.expressions if cte.alias_or_name not in renamed]
    for table in query.find_all(exp.Table):
        if table.name in renamed and not table.args.get("db"):
            if not table.alias:  # its columns name it: it keeps the name as its alias
                table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name, quoted=True)))
            table.set("this", exp.to_identifier(renamed[table.name], quoted=True))
    with_.set("expressions", kept)


def _shareable(body: exp.Query) -> bool:
    """Whether a derived table aggregates (what computing it twice costs most), every
    column of it comes from its own sources, and it holds nothing whose evaluations
    may give other rows. A table's rows passed through (sqlglot writes each table
    of a query with subqueries as one such) are read again more cheaply than kept."""
    if not isinstance(body, exp.Select) or not (
        body.args.get("group") or any(e.find(exp.AggFunc) for e in body.expressions)
    ):
        return False
    if body.find(*VOLATILE, exp.Limit, exp.Fetch, exp.TableSample) is not None:
        return False
    return self_contained(body)


def self_contained(body: exp.Query) -> bool:
    """Whether every column of ``body`` names one of its own sources (a table, a
    derived table or a CTE of it), nothing of an outer query."""
    own = {t.alias_or_name for t in body.find_all(exp.Table)}
    own |= {s.alias_or_name for s in body.find_all(exp.Subquery)}
    own |= {c.alias_or_name for c in body.find_all(exp.CTE)}
    return all(c.table and c.table in own for c in body.find_all(exp.Column))


def _place(
    query: exp.Select, with_: exp.With | None, top: list[str], subs: list[exp.Subquery]
) -> int | None:
    """Where in the top WITH the CTE of ``subs`` goes: after the CTEs its body reads,
    before the first one holding one of ``subs``; ``None`` where that is no place."""
    if with_ is None:
        return 0
    reads = {t.name for t in subs[0].this.find_all(exp.Table)}
    after = max((i + 1 for i, name in enumerate(top) if name in reads), default=0)
    holders = [
        i
        for i, cte in enumerate(with_.expressions)
        if any(s.find_ancestor(exp.CTE) is cte for s in subs)
    ]
    before = min(holders, default=len(top))
    return after if after <= before else None
