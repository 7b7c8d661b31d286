"""Semi-join reductions: rows that can meet nothing are dropped before they move.

Two of them, both a semi join with the keys of a small side:

* ``Reductions.reduce_aggregate_input``: an aggregate joined back on its group
  keys (a decorrelated subquery, TPC-H q17) aggregates only the groups the other
  side's filtered table can meet. A rewrite of the logical tree, in place, before
  the join is placed.
* ``Reductions.reduce_by_keys``: the far side of a semi / anti join much bigger
  than the kept side keeps only the rows whose keys the kept side has (q21).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from mangonel.plan.distribute.costs import REDUCE_RATIO
from mangonel.plan.distribute.keys import column_ref
from mangonel.plan.distribute.shared import SharedNodes
from mangonel.plan.distribute.stages import Frag, StageBuilder, hashed
from mangonel.plan.estimate import Estimator
from mangonel.plan.logical import Aggregate, Filter, Join, JoinKind, Node, Project, Ref, Scan, walk
from mangonel.plan.physical import StageInput
from mangonel.sql.exprs import VOLATILE, and_all, conjuncts, has_placeholder, qualifiers
from mangonel.task import InputMode, OutputKind, OutputSpec


class Reductions:
    """Semi-join reductions of one query's joins.

    Args:
        estimator: sizes of logical nodes.
        stages: where the kept side of a reduced semi join becomes a stage.
        shared: shared nodes, which are never rewritten for one reader.
        names: the query's counter of generated qualifiers (``_sjN``), shared with
            the partial aggregates' (``_paN``).
        broadcast_bytes: the biggest side broadcast.
    """

    def __init__(
        self,
        estimator: Estimator,
        stages: StageBuilder,
        shared: SharedNodes,
        names: Iterator[int],
        broadcast_bytes: int,
    ) -> None:
        self._estimator = estimator
        self._stages = stages
        self._shared = shared
        self._names = names
        self._broadcast = broadcast_bytes

    def reduce_aggregate_input(
        self,
        side: Node,
        side_keys: list[exp.Expr],
        other: Node,
        other_keys: list[exp.Expr],
    ) -> None:
        """Semi-join reduction of an aggregate joined back on its group keys.

        A decorrelated subquery aggregates a whole table by a key (q17: the
        average quantity of each of 200 000 parts over 6M lineitem rows) and is
        joined to the few keys the query keeps (2 000 parts of one brand and
        container). Only the rows of groups that can meet the other side matter,
        and a group is kept or dropped whole, so the aggregate's input may be
        filtered first by a semi join with the table (and its filter) that gives
        the other side its key values: a superset of them. Done in place, where
        that table is estimated at a tenth of the aggregate's input or less; the
        small side is then broadcast into the aggregate's scan.
        """
        agg, groups = _groups_under(side)
        if agg is None or agg.grouping is not None or self._shared.under_shared(agg):
            return  # a shared aggregate: its other readers need all of its groups
        reduced = (
            isinstance(agg.child, Join)
            and agg.child.kind is JoinKind.SEMI
            and any(
                isinstance(x, Scan) and x.alias.startswith("_sj") for x in walk(agg.child.right)
            )
        )
        if reduced:
            return  # already (a subquery planned a second time)
        pairs = [
            (groups[ref], ok)
            for sk, ok in zip(side_keys, other_keys, strict=True)
            if (ref := column_ref(sk)) is not None and ref in groups
        ]
        if not pairs:
            return
        other_refs = [column_ref(ok) for _, ok in pairs]
        aliases = {r[0] for r in other_refs if r is not None}
        if any(r is None for r in other_refs) or len(aliases) != 1:
            return
        found = _filtered_scan(other, aliases.pop())
        if found is None:
            return  # an unfiltered table has every key: the semi join would keep all
        scan, conditions = found
        # A condition that draws ``random()`` draws again in a copy: the copy
        # would keep other keys than the side's own rows have. Without it the
        # semi join keeps a superset, as it must.
        conditions = [c for c in conditions if c.find(*VOLATILE) is None]
        if not conditions:
            return
        alias = f"_sj{next(self._names)}"

        def rename(e: exp.Expr) -> exp.Expr:
            return e.copy().transform(
                lambda c: (
                    exp.column(c.name, table=alias, quoted=True)
                    if isinstance(c, exp.Column) and c.table == scan.alias
                    else c
                )
            )

        keys = [r[1] for r in other_refs if r is not None]
        renamed = [rename(c) for c in conditions]
        filtered = {c.name for cond in renamed for c in cond.find_all(exp.Column)}
        columns = [c for c in scan.columns if c in set(keys) | filtered] or keys
        # Conditions with a subquery (``IN (SELECT ...)``) stay above the scan,
        # where the planner attaches the subquery's stage.
        later = [c for c in renamed if has_placeholder(c)]
        source: Node = Scan(
            scan.table, alias, columns, and_all([c for c in renamed if c not in later])
        )
        if later:
            source = Filter(source, and_all(later))  # type: ignore[arg-type]
        size = self._estimator.size
        if size(source).rows * 10 > size(agg.child).rows:
            return
        by_key = {k: g for (g, _), k in zip(pairs, keys, strict=True)}
        keyed = [_key_in(c, scan.alias, by_key) for c in conditions]
        if all(k is not None for k in keyed):
            # Only key IN (subquery) filters the other side: the aggregate's input
            # is filtered by those subqueries on its own keys, with no copy of the
            # table. TPC-H q20: the line items of parts named 'forest%', where a
            # copy of ``partsupp`` joined with those parts was a stage more on
            # the query's path.
            for c in conditions:
                self._shared.read_again(c)
            agg.child = Filter(agg.child, and_all([k for k in keyed if k is not None]))
            return
        for c in later:
            self._shared.read_again(c)  # its subqueries have one reader more
        agg.child = Join(
            agg.child,
            source,
            JoinKind.SEMI,
            [g.copy() for g, _ in pairs],
            [exp.column(k, table=alias, quoted=True) for k in keys],
            broadcast_right=True,
        )

    def reducible(self, n: Join, left: Frag, right: Frag) -> bool:
        """A semi / anti join whose kept side is small next to the other one."""
        return (
            not n.broadcast_right
            and left.est <= self._broadcast
            and left.est * REDUCE_RATIO <= right.est
        )

    def reduced_bytes(self, n: Join, right: Frag) -> float:
        """Estimated bytes of ``right`` reduced by the keys of ``n``'s kept side: its
        share of ``right``'s rows that the kept side's rows may meet, at most all."""
        size = self._estimator.size
        return right.est * min(1.0, size(n.left).rows / max(1.0, size(n.right).rows))

    def reduce_by_keys(
        self, n: Join, left: Frag, right: Frag, spread: Spread | None = None
    ) -> tuple[Frag, Frag]:
        """Semi-join reduction of the far side of a semi / anti join.

        Which rows of ``left`` have a match is all a semi (anti) join asks, so
        ``left`` cannot be broadcast into ``right``'s tasks; but rows of ``right``
        whose keys no row of ``left`` has can match nothing. ``left`` becomes a
        stage of its own, broadcast into ``right``'s tasks, which keep only the
        rows that may match before anything moves (TPC-H q21: the line items of
        the orders of one nation's suppliers, not all of ``lineitem``).

        The join itself reads ``left`` whole in one task; with ``spread``, in
        ``spread.partitions`` tasks instead: ``left``'s stage hashes its rows by
        ``spread.keys``, ``right``'s tasks read all of its partitions, and task
        *i* of the returned kept side reads partition *i*, for the caller to
        hash the reduced ``right`` alike and join task by task.
        """
        if spread is None:
            read, stage = self._stages.finish(left, OutputSpec(OutputKind.SINGLE), "")
            kept = Frag(read, 1, left.est, single=True)
            mode = InputMode.ALL
        else:
            output = hashed(left, spread.keys, spread.partitions)
            read, stage = self._stages.finish(left, output, "")
            kept = Frag(read, spread.partitions, left.est, hash_keys=spread.keys)
            mode = InputMode.PARTITION
        kept.inputs[read.name] = StageInput(read.name, stage.id, mode)
        inp = StageInput(read.name, stage.id, InputMode.ALL)
        right.inputs[inp.name] = inp
        right.node = Join(
            right.node,
            read,
            JoinKind.SEMI,
            [k.copy() for k in n.right_keys],
            [k.copy() for k in n.left_keys],
        )
        right.est = self.reduced_bytes(n, right)
        return kept, right


@dataclass(frozen=True)
class Spread:
    """A reduced semi / anti join spread over ``partitions`` tasks by hash of the
    join keys, each pair cast to one type (``KeyTypes.cast_keys``)."""

    keys: list[exp.Expr]
    """The kept side's keys, over its outputs."""
    far_keys: list[exp.Expr]
    """The far side's keys, over its outputs."""
    partitions: int


def _groups_under(node: Node) -> tuple[Aggregate | None, dict[Ref, exp.Expr]]:
    """The aggregate under ``node`` (through projections and HAVING filters) and, for
    each of ``node``'s outputs that passes a group key through, that key's expression."""
    if isinstance(node, Aggregate):
        return node, {(node.qualifier, name): e for name, e in node.groups}
    if isinstance(node, Filter):
        return _groups_under(node.child)
    if isinstance(node, Project):
        agg, inner = _groups_under(node.child)
        passed = {
            (node.qualifier, name): inner[ref]
            for name, e in node.items
            if (ref := column_ref(e)) is not None and ref in inner
        }
        return agg, passed
    return None, {}


def _key_in(condition: exp.Expr, alias: str, by_key: dict[str, exp.Expr]) -> exp.Expr | None:
    """``condition`` over the aggregate's input instead of ``alias``'s scan, where it
    is ``<a key column of alias> IN (subquery)`` (``by_key``: the key column's
    name -> the aggregate input's expression it is joined to); else None."""
    if not isinstance(condition, exp.In) or not has_placeholder(condition):
        return None
    column = condition.this
    if not isinstance(column, exp.Column) or column.table != alias or column.name not in by_key:
        return None
    if condition.args.get("expressions") or not condition.args.get("query"):
        return None
    out = condition.copy()
    out.set("this", by_key[column.name].copy())
    return out


def _filtered_scan(node: Node, alias: str) -> tuple[Scan, list[exp.Expr]] | None:
    """The scan of ``alias`` under ``node`` (through joins and filters) and the
    conditions on it alone that hold for ``node``'s rows: its own filter and those
    of filters on the way (an ``IN (subquery)`` among them); None when there is
    no such scan or nothing filters it."""
    conditions: list[exp.Expr] = []
    while True:
        if isinstance(node, Scan):
            if node.alias != alias:
                return None
            conditions = conjuncts(node.filter) + conditions
            return (node, conditions) if conditions else None
        if isinstance(node, Filter):
            conditions += [c for c in conjuncts(node.condition) if qualifiers(c) == {alias}]
            node = node.child
        elif isinstance(node, Join) and node.kind in (JoinKind.INNER, JoinKind.CROSS):
            sides = [c for c in node.children() if any(r[0] == alias for r in c.outputs())]
            if len(sides) != 1:
                return None
            node = sides[0]
        elif isinstance(node, Join) and node.kind in (JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI):
            node = node.left  # the right side's rows do not all reach the output
        else:
            return None
