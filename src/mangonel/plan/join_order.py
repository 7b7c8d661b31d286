"""Join ordering: the rule that turns each ``JoinGroup`` the binder emits into a
tree of ``Join`` nodes, in the order the estimates favour.

The binder keeps a block's inner joins in the order the query wrote them, with
the conditions that connect them (``logical.JoinGroup``); outer joins, pushed
filters and everything else are already in place. This rule alone reads the
estimates (``plan.estimate``) to order joins:

* greedy operator ordering: of all pairs connected by an equality, the pair whose
  join has the fewest estimated rows goes first, and that join is one source
  from then on (the tree may be bushy);
* a pair where a small side cuts a big one (``REDUCER_ROWS``) goes before any
  other;
* a condition is applied as soon as the sources it names are joined;
* sources with no equality to the rest are joined last, the smallest first;
* a FULL join (not reordered) has its smaller side on the right;
* a small filtering source reduces, by a semi join with a copy of itself, every
  source equal to it only through a chain of equalities (``_reduce_by``);
* two sources equal only through a chain of equalities are joined on the equality
  the chain implies where that join would cut the bigger one (``_implied``), and
  a join's keys that the sides' own joins already make equal are dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, MutableMapping

from sqlglot import exp

from mangonel.plan.estimate import Estimator, Size, join_size
from mangonel.plan.logical import Filter, Join, JoinGroup, JoinKind, Node, Project, Ref, Scan
from mangonel.sql.exprs import and_all, col, qualifiers, sides_join, split_keys

REDUCER_ROWS = 1_000_000
"""A join side of at most this many estimated rows, a tenth of the other's or less,
whose join keeps half of the other side or less, is joined before anything else."""

COPY_ROWS = 1_000
"""A source of at most this many estimated rows, over tables of at most
``REDUCER_ROWS`` rows each, may be read a second time to reduce another source by a
semi join (``_reduce_by``): a copy costs each task that little."""

REDUCES = 0.5
"""The most of a source's distinct key values such a semi join may keep, by the
estimates, for it to be added."""

COPY_SHARE = 0.1
"""The most rows a copy may scan (its tables' rows, in each task that reads it), as a
share of the rows its semi join removes by the estimates. TPC-DS q84 cut 287k
`store_returns` rows by a copy of `customer` ⋈ a filtered `customer_address` (150k
rows scanned again): no less CPU, up to a fifth more time in a loaded A/B."""


def order_joins(root: Node, subqueries: MutableMapping[str, Node], estimator: Estimator) -> Node:
    """Replace every ``JoinGroup`` under ``root`` and the subqueries by ordered joins.

    The subqueries (``bind.Binder.subqueries``) are ordered first, in the order they
    were bound, and replaced in ``subqueries``: the estimates of a filter with
    ``IN (subquery)`` read the subquery's size. Nodes are changed in place; a node
    read twice (a CTE) is ordered once and stays shared. Returns the new root.
    """
    done: dict[Node, Node] = {}
    for name in list(subqueries):
        subqueries[name] = _visit(subqueries[name], estimator, done)
    return _visit(root, estimator, done)


def _visit(node: Node, estimator: Estimator, done: dict[Node, Node]) -> Node:
    """``node`` with the groups under it ordered, children before parents (the
    estimates of a group's sources need their own groups ordered)."""
    if node in done:
        return done[node]
    if isinstance(node, JoinGroup):
        inputs = [_visit(n, estimator, done) for n in node.inputs]
        result = _order(inputs, list(node.conditions), estimator)
    else:
        for f in dataclasses.fields(node):  # type: ignore[arg-type]
            value = getattr(node, f.name)
            if isinstance(value, Node):
                setattr(node, f.name, _visit(value, estimator, done))
        if isinstance(node, Join) and node.kind is JoinKind.FULL:
            _smaller_right(node, estimator)
        result = node
    done[node] = result
    return result


def _smaller_right(join: Join, estimator: Estimator) -> None:
    """A FULL join with its smaller side on the right, where DuckDB builds its hash
    table (the executors keep its build-side rule off: ``executor.databases``). A FULL
    join keeps both sides' rows either way round, and its readers name columns,
    not positions: TPC-DS q51 built 499k store rows against 138k web rows."""
    if estimator.size(join.left).rows < estimator.size(join.right).rows:
        join.left, join.right = join.right, join.left
        join.left_keys, join.right_keys = join.right_keys, join.left_keys


class _Source:
    """A group's input while it is ordered: its node, the aliases it covers, and the
    columns its joins made equal (each to a representative: ``same``)."""

    def __init__(
        self, node: Node, aliases: set[str] | None = None, equal: dict[Ref, Ref] | None = None
    ) -> None:
        self.node = node
        self.aliases = aliases if aliases is not None else {q for q, _ in node.outputs()}
        self.equal: dict[Ref, Ref] = dict(equal or {})

    def same(self, ref: Ref) -> Ref:
        """The representative of the columns equal to ``ref`` in every row."""
        while self.equal.get(ref, ref) != ref:
            ref = self.equal[ref]
        return ref

    def make_equal(self, a: Ref, b: Ref) -> None:
        self.equal.setdefault(a, a)
        self.equal.setdefault(b, b)
        self.equal[self.same(a)] = self.same(b)


def _order(inputs: list[Node], conds: list[exp.Expr], estimator: Estimator) -> Node:
    """Join ``inputs`` by ``conds``, smallest result first.

    Of all pairs connected by an equality, join the one whose result has the
    fewest estimated rows, and repeat with that join as one source (q21 joins
    supplier with its filtered nation before either meets lineitem, so that only
    1/25 of lineitem crosses an exchange). A pair where a small side cuts a big
    one (``REDUCER_ROWS``) goes before any other: q5 at SF10 cut lineitem by one
    region's suppliers where it is read instead of shuffling all of it to meet
    the year's orders. The bigger input is the left one. Sources with no equality
    to the rest are joined last, the smallest first (a cross product).
    """
    sizes: dict[Node, Size] = {}  # the sources do not change while they are ordered

    def size(node: Node) -> Size:
        if node not in sizes:
            sizes[node] = estimator.size(node)
        return sizes[node]

    # Each condition's aliases, once: asked of every condition at every step. By
    # ``id``, as ``sides`` below.
    quals = {id(c): qualifiers(c) for c in conds}
    items = [_Source(n) for n in inputs]
    for s in items:
        _apply_ready(s, conds, quals)
    classes = _equal_columns(conds, items, estimator)
    for s in list(items):
        _reduce_by(s, items, conds, quals, classes, estimator)
    _implied(items, conds, quals, classes, size)
    # Each equality's two sides' aliases, once (the pair loop asks often: q8). By
    # ``id``: sqlglot expressions hash by their text, slowly, and the conditions
    # stay alive in ``conds`` meanwhile.
    sides = {
        id(c): (qualifiers(c.left), qualifiers(c.right)) for c in conds if isinstance(c, exp.EQ)
    }

    def pair_size(a: set[str], b: set[str], sa: Size, sb: Size) -> Size | None:
        """The size of joining sources of aliases ``a`` and ``b``; None where no
        equality connects them."""
        keys = [c for c in conds if id(c) in sides and sides_join(*sides[id(c)], a, b)]
        if not keys:
            return None
        # One key of each chain of equal columns: the joins on either side make the
        # chain's columns there equal, and a key more would be counted twice.
        keys = [k for i, k in enumerate(keys) if not any(_chained(k, o, classes) for o in keys[:i])]
        lk, rk, _ = split_keys(keys, a, b)
        return join_size(sa, sb, list(zip(lk, rk, strict=True)))

    while len(items) > 1:
        best: tuple[float, float, float] | None = None
        pair: tuple[_Source, _Source] | None = None
        pairs: list[tuple[_Source, _Source, Size, bool]] = []
        cut_now: dict[int, float] = {}
        """By a source's ``id``: the fewest rows a reducing pair leaves of it."""
        for i, a in enumerate(items):
            for b in items[i + 1 :]:
                rows = pair_size(a.aliases, b.aliases, size(a.node), size(b.node))
                if rows is None:
                    continue
                bigger = b if size(b.node).rows > size(a.node).rows else a
                small, big = sorted((size(a.node).rows, size(b.node).rows))
                # A join that cuts a big side by a small one runs where the big
                # side is read (the small side is broadcast): it goes first.
                reducing = _cuts(small, big, rows.rows)
                if reducing:
                    cut_now[id(bigger)] = min(cut_now.get(id(bigger), big), rows.rows)
                pairs.append((a, b, rows, reducing))
        for a, b, rows, reducing in pairs:
            small = min(size(a.node).rows, size(b.node).rows)
            score = (0.0 if reducing else 1.0, rows.rows, small)
            if not reducing and rows.rows <= REDUCER_ROWS:
                # A pair whose result would cut a third source, one that a
                # reducing pair cuts now, to at most half of what that leaves of
                # it goes first too, scored by that cut (TPC-DS q72 at SF1 on two
                # hosts, where no pair cut inventory, took 1.5x the CPU when it
                # was let cut it): q5 at SF10 joins the year's orders with the
                # region's customers (455k rows), which keep 1.8M of lineitem's
                # 60M, before lineitem meets the region's suppliers (12M).
                both = a.aliases | b.aliases
                for c in items:
                    if c is a or c is b or id(c) not in cut_now:
                        continue
                    cut = pair_size(c.aliases, both, size(c.node), rows)
                    if (
                        cut is not None
                        and _cuts(rows.rows, size(c.node).rows, cut.rows)
                        and cut.rows <= cut_now[id(c)] / 2
                    ):
                        score = min(score, (0.0, cut.rows, rows.rows))
            if best is None or score < best:
                best, pair = score, (a, b)
        if pair is None:
            by_size = sorted(items, key=lambda s: size(s.node).rows)
            pair = (by_size[0], by_size[1])
        a, b = pair
        if size(b.node).rows > size(a.node).rows:
            a, b = b, a
        both = a.aliases | b.aliases
        used = [
            c
            for c in conds
            if quals[id(c)] <= both
            and not quals[id(c)] <= a.aliases
            and not quals[id(c)] <= b.aliases
        ]
        for c in used:
            conds.remove(c)
        lk, rk, residual = split_keys(used, a.aliases, b.aliases)
        lk, rk = _distinct_keys(lk, rk, a, b)
        kind = JoinKind.INNER if (lk or residual) else JoinKind.CROSS
        joined = _Source(
            Join(a.node, b.node, kind, lk, rk, and_all(residual)), both, {**a.equal, **b.equal}
        )
        for x, y in zip(lk, rk, strict=True):
            # Only columns of one chain, which holds columns of one type: a key
            # compared through a cast need not make its columns the same value
            # ('1.0' = 1, yet '1.0' <> '1').
            if isinstance(x, exp.Column) and isinstance(y, exp.Column):
                xr, yr = (x.table, x.name), (y.table, y.name)
                if yr in classes.get(xr, ()):
                    joined.make_equal(xr, yr)
        _apply_ready(joined, conds, quals)
        items[items.index(a)] = joined
        items.remove(b)
        _reduce_by(joined, items, conds, quals, classes, estimator)
    return items[0].node


def _implied(
    items: list[_Source],
    conds: list[exp.Expr],
    quals: dict[int, set[str]],
    classes: dict[Ref, set[Ref]],
    size: Callable[[Node], Size],
) -> None:
    """Add to ``conds`` the equality a chain implies between two sources that no
    condition connects, where joining them on it would cut the bigger one where it
    is read (``_cuts``); ``quals`` learns its aliases.

    In an inner join group every result row holds one row of each source, so
    columns equal through a chain (``p_partkey = l_partkey = ps_partkey``) are
    equal in every row: the equality of two of them holds, though the query does
    not write it. TPC-H q9 writes ``part`` and ``partsupp`` each equal to
    ``lineitem``'s part key: greedy ordering could only join the filtered parts
    with ``lineitem`` first and then hash all of ``partsupp`` (8M rows at SF10,
    256 MB) against the 3.3M line items that joined, both crossing an exchange;
    joined first on the implied key, the 5 % of ``partsupp`` the parts keep (430k
    rows) is broadcast into ``lineitem``'s tasks instead. Only where it cuts, so
    that a chain through a dimension (``c_nationkey = s_nationkey = n_nationkey``,
    TPC-H q5) does not offer pairs that cut nothing.
    """
    for i, a in enumerate(items):
        for b in items[i + 1 :]:
            if any(quals[id(c)] & a.aliases and quals[id(c)] & b.aliases for c in conds):
                continue
            pairs = sorted(
                (x, y)
                for x in a.node.outputs()
                if x in classes
                for y in b.node.outputs()
                if y in classes[x] and x != y
            )
            if not pairs:
                continue
            x, y = pairs[0]
            if _reduced_on(a.node, classes[x]) or _reduced_on(b.node, classes[x]):
                continue  # a copy of the other cut it through the chain already
            left, right = size(a.node), size(b.node)
            joined = join_size(left, right, [(col(x), col(y))])
            small, big = sorted((left.rows, right.rows))
            if _cuts(small, big, joined.rows):
                cond = exp.EQ(this=col(x), expression=col(y))
                quals[id(cond)] = {x[0], y[0]}
                conds.append(cond)


def _reduced_on(node: Node, chain: set[Ref]) -> bool:
    """Whether ``node`` is a semi join on a column of ``chain`` (``_reduce_by``'s):
    its estimate counts that cut, and a join on the chain would count it again
    (TPC-DS q64's ``store_returns``, reduced by a copy of the filtered ``item``,
    would be joined with ``item`` before ``store_sales`` for nothing)."""
    return (
        isinstance(node, Join)
        and node.kind is JoinKind.SEMI
        and any(isinstance(k, exp.Column) and (k.table, k.name) in chain for k in node.left_keys)
    )


def _chained(k: exp.Expr, other: exp.Expr, classes: dict[Ref, set[Ref]]) -> bool:
    """Whether equalities ``k`` and ``other`` both equate columns of one chain."""
    if not (isinstance(k, exp.EQ) and isinstance(other, exp.EQ)):
        return False
    cols = [k.left, k.right, other.left, other.right]
    if not all(isinstance(c, exp.Column) for c in cols):
        return False
    first = (cols[0].table, cols[0].name)
    return first in classes and all((c.table, c.name) in classes[first] for c in cols[1:])


def _distinct_keys(
    lk: list[exp.Expr], rk: list[exp.Expr], a: _Source, b: _Source
) -> tuple[list[exp.Expr], list[exp.Expr]]:
    """The key pairs of a join of ``a`` (left keys) and ``b``, less each pair whose
    columns the sides' own joins made equal to those of a pair kept before it:
    ``l_partkey = p_partkey AND l_partkey = ps_partkey`` over ``part ⋈ partsupp``
    joined on ``p_partkey = ps_partkey`` is one key, hashed once."""
    kept: list[tuple[exp.Expr, exp.Expr]] = []
    seen: set[tuple[Ref, Ref]] = set()
    for x, y in zip(lk, rk, strict=True):
        if isinstance(x, exp.Column) and isinstance(y, exp.Column):
            pair = (a.same((x.table, x.name)), b.same((y.table, y.name)))
            if pair in seen:
                continue
            seen.add(pair)
        kept.append((x, y))
    return [x for x, _ in kept], [y for _, y in kept]


def _cuts(small: float, big: float, rows: float) -> bool:
    """True when a join of a side of ``small`` rows with one of ``big`` rows, of
    ``rows`` rows, cuts the big side where it is read (``REDUCER_ROWS``)."""
    return small <= min(big / 10, REDUCER_ROWS) and rows <= big / 2


def _apply_ready(src: _Source, conds: list[exp.Expr], quals: dict[int, set[str]]) -> None:
    """Filter ``src`` by the conditions that name only its aliases (and drop them);
    ``quals``: each condition's aliases, by ``id``."""
    ready = [c for c in conds if quals[id(c)] and quals[id(c)] <= src.aliases]
    if ready:
        for c in ready:
            conds.remove(c)
        src.node = Filter(src.node, and_all(ready))  # type: ignore[arg-type]


def _equal_columns(
    conds: list[exp.Expr], items: list[_Source], estimator: Estimator
) -> dict[Ref, set[Ref]]:
    """Each column that an equality of bare columns names, with every column of the
    group equal to it through a chain of them (itself included).

    Only columns a source reads from a scan of a table through filters and the kept
    sides of joins take part (not from inside a derived table or a semi join's far
    side, whose scans' aliases belong to another scope), and a chain only of
    columns of one type: an equality between two types compares through a cast,
    and such equalities need not chain (``'1.0' = 1`` and ``1 = '1'``, not
    ``'1.0' = '1'``).
    """
    types: dict[Ref, object] = {}
    for s in items:
        for scan in _output_scans(s.node):
            schema = estimator.table(scan).schema
            for c in scan.columns:
                if c in schema.names:
                    types[(scan.alias, c)] = schema.field(c).type
    parent: dict[Ref, Ref] = {}

    def root(r: Ref) -> Ref:
        while parent.get(r, r) != r:
            r = parent[r]
        return r

    for c in conds:
        if not (
            isinstance(c, exp.EQ)
            and isinstance(c.left, exp.Column)
            and isinstance(c.right, exp.Column)
        ):
            continue
        a, b = (c.left.table, c.left.name), (c.right.table, c.right.name)
        if a in types and b in types and types[a] == types[b]:
            parent.setdefault(a, a)
            parent.setdefault(b, b)
            parent[root(a)] = root(b)
    classes: dict[Ref, set[Ref]] = {}
    for r in parent:
        classes.setdefault(root(r), set()).add(r)
    return {r: classes[root(r)] for r in parent}


def _reduce_by(
    reducer: _Source,
    items: list[_Source],
    conds: list[exp.Expr],
    quals: dict[int, set[str]],
    classes: dict[Ref, set[Ref]],
    estimator: Estimator,
) -> None:
    """Semi join each other source that ``reducer`` filters through a chain of
    equalities alone with a copy of ``reducer``, where that keeps at most
    ``REDUCES`` of its key values and the copy scans at most ``COPY_SHARE`` of the
    rows it removes.

    In an inner join group every result row holds one row of each source, so a
    source's column equal to ``reducer``'s through other sources' columns
    (``c_nationkey = s_nationkey = n_nationkey``) holds one of ``reducer``'s values:
    the other rows meet nothing. The greedy order joins ``reducer`` to one source;
    the rest would meet its filter only at their last join, after being hashed
    whole. TPC-H q5: `customer` (1.5M rows at SF10, read whole by every `lineitem`
    task) is cut to the 5 nations of ASIA (1/5) by a copy of nation ⋈ region
    before it builds its join with the year's orders. A source with an equality
    written to ``reducer`` joins it directly and is left alone.
    """
    size = estimator.size(reducer.node)
    if size.rows > COPY_ROWS or not _copyable(reducer.node):
        return
    scanned = [estimator.table(s).rows for s in _scans(reducer.node)]
    if max(scanned) > REDUCER_ROWS:
        return
    mine = {r for r in reducer.node.outputs() if r in classes}
    if not mine:
        return
    for i, other in enumerate(items):
        if other is reducer or any(
            quals[id(c)] & other.aliases and quals[id(c)] & reducer.aliases for c in conds
        ):
            continue
        theirs = estimator.size(other.node)
        if theirs.rows < 10 * size.rows:
            continue
        pairs = [
            (r, m)
            for r in other.node.outputs()
            if r in classes
            for m in sorted(mine)
            if m in classes[r]
        ]
        if not pairs:
            continue
        r, m = pairs[0]
        values = min(size.rows, size.distinct.get(m, size.rows))
        keeps = values / max(1.0, min(theirs.rows, theirs.distinct.get(r, theirs.rows)))
        if keeps > REDUCES or sum(scanned) > COPY_SHARE * theirs.rows * (1 - keeps):
            continue
        semi = Join(
            other.node,
            _copy(reducer.node),
            JoinKind.SEMI,
            [exp.column(r[1], table=r[0], quoted=True)],
            [exp.column(m[1], table=m[0], quoted=True)],
        )
        items[i] = _Source(semi, other.aliases, other.equal)


def _scans(node: Node) -> list[Scan]:
    """The scans under ``node``."""
    if isinstance(node, Scan):
        return [node]
    return [s for c in node.children() for s in _scans(c)]


def _output_scans(node: Node) -> list[Scan]:
    """The scans whose columns ``node`` outputs as they are: through filters and
    the sides of joins whose rows it keeps."""
    if isinstance(node, Scan):
        return [node]
    if isinstance(node, Filter):
        return _output_scans(node.child)
    if isinstance(node, Join):
        kept = [node.left] if node.kind in (JoinKind.SEMI, JoinKind.ANTI) else node.children()
        return [s for c in kept for s in _output_scans(c)]
    return []


def _copyable(node: Node) -> bool:
    """Whether ``node`` is scans under filters, projections and inner joins alone
    (``_copy`` copies those)."""
    if isinstance(node, Scan):
        return True
    if isinstance(node, (Filter, Project)):
        return _copyable(node.child)
    if isinstance(node, Join):
        return node.kind is JoinKind.INNER and _copyable(node.left) and _copyable(node.right)
    return False


def _copy(node: Node) -> Node:
    """New nodes for a ``_copyable`` tree: read a second time, it is not a node
    with two readers (which the distributor computes once, as a shared CTE)."""
    if isinstance(node, Scan):
        condition = node.filter.copy() if node.filter is not None else None
        return Scan(node.table, node.alias, list(node.columns), condition, node.pruned)
    if isinstance(node, Filter):
        return Filter(_copy(node.child), node.condition.copy())
    if isinstance(node, Project):
        return Project(_copy(node.child), node.qualifier, [(n, e.copy()) for n, e in node.items])
    assert isinstance(node, Join)
    return Join(
        _copy(node.left),
        _copy(node.right),
        node.kind,
        [k.copy() for k in node.left_keys],
        [k.copy() for k in node.right_keys],
        node.residual.copy() if node.residual is not None else None,
    )
