"""The walk: each logical operator planned over its planned inputs.

``Distributor`` plans a tree bottom-up, growing a fragment (``stages.Frag``) and
closing it where an operator needs rows other tasks hold: an aggregate in two
phases around a hash exchange on its group keys, a window on its common
PARTITION BY keys, set operations on all columns, a top-n per task before the
merge, and each join where ``joins`` places it. Subqueries used in expressions
are planned once, as stages every reader reads whole.

Why it is over 600 lines: ``Distributor`` has one method per logical operator,
and each decides, over the same ``StageBuilder`` and estimates, where its rows
must move; what several operators share is already apart (``joins``,
``aggregates``, ``keys``, ``ranges``, ``reductions``, ``shared``, ``costs``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping

from sqlglot import exp

from mangonel.catalog import Table
from mangonel.ids import StageId
from mangonel.plan.distribute.aggregates import common_grouping_keys, split_aggs
from mangonel.plan.distribute.costs import EXCHANGE_FIXED, PARTIAL_KEEPS
from mangonel.plan.distribute.interesting import (
    Want,
    aggregate_keys,
    union_positions,
    wanted_keys,
)
from mangonel.plan.distribute.joins import JoinPlacer
from mangonel.plan.distribute.keys import KeyTypes, column_ref, same_keys, stripped
from mangonel.plan.distribute.ranges import KeyRanges
from mangonel.plan.distribute.reductions import Reductions
from mangonel.plan.distribute.shared import SharedNodes
from mangonel.plan.distribute.stages import (
    TINY_SCAN_BYTES,
    Frag,
    StageBuilder,
    copy_frag,
    one_task,
    same_inputs,
)
from mangonel.plan.estimate import Estimator
from mangonel.plan.fragment import rewrite
from mangonel.plan.logical import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    JoinKind,
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
    scan_table,
    walk_once,
)
from mangonel.plan.physical import Stage, StageInput
from mangonel.plan.semi_joins import membership
from mangonel.plan.types import TypeOracle
from mangonel.sql.exprs import col, substitute
from mangonel.task import InputMode, OutputKind, OutputSpec

FEW_VALUES_PER_PARTITION = 4
"""An aggregate is hashed on the keys its readers join on only where they may hold
at least this many values per partition (``Distributor._hashed_names``)."""


INLINE_SUBQUERY_BYTES = 2 * 1024 * 1024
"""The biggest subquery (estimated output bytes) computed inside its one reading task
(``Distributor._inline_subquery``): a value, or a short list. A big ``IN`` list is a
join whose build side DuckDB sizes exactly from a stage's input, but only guesses
from a subquery it plans itself: TPC-DS q95's two lists (~100 MB estimated each)
ran 0.67 s as stages, 1.06 s inside the final task."""


class Distributor:
    """Builds the stages of one query.

    Args:
        catalog: the tables the query may read.
        oracle: DuckDB over empty tables, for the types of keys.
        subqueries: uncorrelated subqueries by placeholder name.
        partitions: the most output partitions of a hash exchange.
        broadcast_bytes: the biggest join side broadcast.
        split_rows: rows per scan task for a row width and a table's rows, and
            whether it may be spread over the hosts (``PlannerConfig.scan_split_rows``).
        estimator: sizes of logical nodes (a new one over ``catalog`` if None).
        partition_bytes: an exchange gets one partition per this many bytes.
        inline_scan_bytes: see ``PlannerConfig.inline_scan_bytes``.
        fuse_bytes: see ``PlannerConfig.fuse_bytes`` (None: no bound).
        slots: task slots a job may hold (``PlannerConfig.slots``); 0: unknown.
        recompute_bytes: see ``PlannerConfig.recompute_bytes`` (0: never).
        parallel: see ``PlannerConfig.parallel`` (0: unknown).
    """

    def __init__(
        self,
        catalog: Mapping[str, Table],
        oracle: TypeOracle,
        subqueries: Mapping[str, Node],
        partitions: int,
        broadcast_bytes: int,
        split_rows: Callable[[float, int, bool], int],
        estimator: Estimator | None = None,
        partition_bytes: float | None = None,
        inline_scan_bytes: float = 0,
        fuse_bytes: float | None = None,
        slots: int = 0,
        recompute_bytes: float = 0,
        parallel: int = 0,
    ) -> None:
        self._catalog = catalog
        self._estimator = estimator or Estimator(catalog)
        self._subqueries = subqueries
        self._split_rows = split_rows
        self._set_branches: set[int] = set()
        """Scans whose rows reach a set operation as they are (``set_branch_scans``):
        not spread over the hosts."""
        self._names = itertools.count(1)
        """Generated qualifiers: partial aggregates (``_paN``), reductions (``_sjN``)."""
        self._subquery_stages: dict[str, StageId] = {}
        self._inlined: set[str] = set()
        """Subqueries planned inside their one reader's task (``_inline_subquery``)."""
        self._recomputed: dict[str, Frag] = {}
        """Subqueries several nodes read, computed by each (``_inline_subquery``):
        as planned, for a copy to each reader."""
        self._apart: dict[str, tuple[float, float]] = {}
        """Subqueries kept out of their one reader's task by the bound: the bytes
        that task and the subquery scan (``_inline_subquery``)."""
        self._stages = StageBuilder(
            catalog,
            partitions,
            partition_bytes,
            inline_scan_bytes,
            fuse_bytes,
            slots,
            recompute_bytes,
            parallel,
        )
        self._keys = KeyTypes(oracle, subqueries)
        self._ranges = KeyRanges(catalog)
        self._shared = SharedNodes(self._stages)
        self._wanted: dict[Node, Want] = {}
        """The keys each node's readers want it hashed on (``interesting``)."""
        self._reductions = Reductions(
            self._estimator, self._stages, self._shared, self._names, broadcast_bytes
        )
        self._joins = JoinPlacer(
            self._estimator,
            self._stages,
            self._keys,
            self._ranges,
            self._reductions,
            broadcast_bytes,
            # Hosts of their own cores, where spread scans made it matter.
            EXCHANGE_FIXED if parallel > 1 else 0.0,
            spread_reduced=parallel > 1,
        )

    @property
    def stages(self) -> list[Stage]:
        """The stages built so far, each after the stages it reads."""
        return self._stages.stages

    @property
    def notes(self) -> list[str]:
        """What EXPLAIN says of the plan (``StageBuilder.notes``)."""
        return self._stages.notes

    def finish(self, f: Frag, output: OutputSpec, label: str) -> tuple[StageRead, Stage]:
        """Close a fragment into a stage (see ``StageBuilder.finish``)."""
        return self._stages.finish(f, output, label)

    def expr_types(self, node: Node, exprs: list[exp.Expr]) -> list[str]:
        """DuckDB types of expressions over ``node``'s outputs (``KeyTypes.expr_types``)."""
        return self._keys.expr_types(node, exprs)

    # ------------------------------------------------------------ walk

    def plan_tree(self, root: Node) -> Frag:
        """Plan a tree: the query, or a subquery of it."""
        if not self._shared.analyzed:
            # The query and its subqueries at once: a node they share (a CTE read
            # in both) is computed once, with the columns all its readers need.
            self._shared.analyze([root, *self._subqueries.values()])
            self._wanted = wanted_keys([root, *self._subqueries.values()])
            self._set_branches = set_branch_scans([root, *self._subqueries.values()])
        return self.plan(root)

    def plan(self, node: Node) -> Frag:
        materialized = self._shared.materialized(node)
        if materialized is not None:
            return materialized
        method = getattr(self, f"_{type(node).__name__.lower()}")
        frag: Frag = method(node)
        frag.needed = self._shared.needed(node)
        if self._shared.is_shared(node):
            return self._shared.materialize(node, frag)
        return frag

    def _attach_subqueries(self, f: Frag, exprs: list[exp.Expr | None]) -> None:
        for e in exprs:
            if e is None:
                continue
            for t in e.find_all(exp.Table):
                name = t.name
                if name in self._subqueries and name not in f.inputs and name not in f.subqueries:
                    if name in self._recomputed:
                        # Computed by each reader that may: a copy of the one
                        # planned (with the subqueries it computes), as is its
                        # stage for a reader that may not.
                        sub = copy_frag(self._recomputed[name])
                        if self._inline_subquery(f, name, sub):
                            continue
                    if name not in self._subquery_stages:
                        if name not in self._recomputed:
                            # Planned once: every stage that needs it reads that
                            # output, all of its tasks' (no stage of its own to
                            # gather them).
                            sub = self._plan_subquery(name, t)
                            if self._inline_subquery(f, name, sub):
                                continue
                        _, stage = self._stages.finish(
                            sub, OutputSpec(OutputKind.SINGLE), "subquery", read_whole=True
                        )
                        self._subquery_stages[name] = stage.id
                        if name in self._apart:
                            self._stages.note_apart(stage.id, *self._apart[name])
                    f.inputs[name] = StageInput(name, self._subquery_stages[name], InputMode.ALL)

    def _plan_subquery(self, name: str, placeholder: exp.Table) -> Frag:
        sub = self.plan_tree(self._subqueries[name])
        if membership(placeholder) and not self._unique(self._subqueries[name]):
            # ``x IN (subquery)`` is blind to duplicates: each task drops its own,
            # and every reader then holds a set of values, not the rows that made
            # them (TPC-DS q95: 8.7M order numbers from a self-join, 72k of them
            # distinct). No exchange to drop them all: a few copies cost less.
            sub.node = Distinct(sub.node)
        return sub

    def _inline_subquery(self, f: Frag, name: str, sub: Frag) -> bool:
        """Plan a subquery inside its reader, when both are one task, nothing else
        reads it and it is small (``INLINE_SUBQUERY_BYTES``; TPC-H q22's average
        balance, read by the filter of the customers): a stage of its own would be
        a boundary on the query's path.
        ``f`` keeps it (``Frag.subqueries``) until it closes: as one task, its
        SQL computes it in place; read by the several tasks of another fragment
        (a small table scanned by each, ``StageBuilder.join_in``), it is a stage
        those tasks read, as before. Once only: a reader the analysis did not see
        (a filter a semi-join reduction copied) gets a stage of its own, planned
        again.

        A subquery several nodes read is computed by each of them the same way
        where it reads only tables, at most ``TINY_SCAN_BYTES`` of them, and its
        copies are cheap (``StageBuilder.recomputable``): TPC-DS q33, q56 and
        q60's items of a category or colour, read by three channels in one
        task. DuckDB runs an ``IN (subquery)`` it plans itself before the scan
        it filters, not beside it: TPC-H q20's ``part`` of one name pattern
        (9.4 MiB of columns at SF1) in the ``partsupp`` task that reduces
        ``lineitem`` costs the sum of both scans (DuckDB alone, two threads, on a
        loaded host: 81 ms, against 49 ms for the parts and 34 ms for partsupp
        reading them as a table), so only the round trip was saved, and its
        stage, still read by the final task, ran beside that task: q20 took
        1.0-1.5x the time in four interleaved A/B runs.
        """
        if f.tasks != 1 or not one_task(sub):
            return False
        shared = not self._shared.read_once(name)
        if shared and not (
            self._stages.recomputable(sub, self._shared.readers(name))
            and (self._stages.read_bytes(sub) or 0.0) <= TINY_SCAN_BYTES
        ):
            return False
        if sub.est > INLINE_SUBQUERY_BYTES:
            return False
        if (name in self._inlined and not shared) or not same_inputs(f, sub):
            return False
        if not self._stages.fits(f, sub):
            # A stage of its own, run at the same time as the reader's other
            # producers (TPC-DS q09: fifteen scans of ``store_sales``).
            self._apart[name] = (self._stages.task_bytes(f), self._stages.task_bytes(sub))
            return False
        self._inlined.add(name)
        sub.copied = shared
        if shared and name not in self._recomputed:
            # The next readers get copies of it as planned, with the subqueries
            # it computes itself (planned again, those would be read twice).
            self._recomputed[name] = copy_frag(sub)
        f.subqueries[name] = sub
        return True

    def _unique(self, node: Node) -> bool:
        """True when ``node``'s rows are known distinct (a key column, a DISTINCT,
        a GROUP BY of its one output), so that dropping duplicates would drop none."""
        if isinstance(node, Distinct):
            return True
        unique = self._estimator.size(node).unique
        return any(r in unique for r in node.outputs())

    def _scan(self, n: Scan) -> Frag:
        table = scan_table(self._catalog, n)
        spread = id(n) not in self._set_branches
        splits = table.splits(self._split_rows(table.row_width(n.columns), table.rows, spread))
        est = self._estimator.size(n).rows * table.row_width(n.columns)
        return Frag(n, len(splits), est, scan=n, splits=splits, single=len(splits) == 1)

    def _values(self, n: Values) -> Frag:
        f = Frag(n, 1, 64.0, single=True)
        self._attach_subqueries(f, [n.query])
        return f

    def _opaque(self, n: Opaque) -> Frag:
        """The query whole, in one task that scans every table itself.

        Each table is read whole by that task, as DuckDB alone reads it: DuckDB
        prunes its columns and row groups from the query and orders its joins
        by the files' statistics (``Stage.whole_query``). A table of several
        splits was a stage of its own, whose rows (every column) the task then
        read without statistics: with DuckDB's join order off, TPC-DS q18
        forced down this path joined its six tables as written, over two
        minutes against 0.15 s.
        """
        f = Frag(n, 1, 1e9, single=True)
        for source in n.tables.values():
            assert isinstance(source, Scan), "a whole query's tables are scans"
            table = scan_table(self._catalog, source)
            f.side_scans.append((source, table.splits(max(1, table.rows))))
        return f

    def _filter(self, n: Filter) -> Frag:
        f = self.plan(n.child)
        self._attach_subqueries(f, [n.condition])
        f.node = Filter(f.node, n.condition)
        f.est *= 0.5
        return f

    def _project(self, n: Project) -> Frag:
        f = self.plan(n.child)
        items = self._needed_items(n)
        self._attach_subqueries(f, [e for _, e in items])
        if f.hash_keys is not None:
            renamed: dict[Ref, Ref] = {}
            for name, e in items:
                if isinstance(e, exp.Column) and e.table:
                    renamed.setdefault((e.table, e.name), (n.qualifier, name))
            # The partitioning survives only if every key column is passed through.
            mapping = {r: col(renamed[r]) for r in renamed}
            survives = all(
                (c.table, c.name) in renamed for k in f.hash_keys for c in k.find_all(exp.Column)
            )
            f.hash_keys = [rewrite(k, mapping) for k in f.hash_keys] if survives else None
        f.node = Project(f.node, n.qualifier, items)
        return f

    def _needed_items(self, n: Project) -> list[tuple[str, exp.Expr]]:
        """The items of ``n`` that the plan above reads.

        The nodes under ``n`` provide only the columns those items name
        (``logical.required_columns``), and a stage boundary below drops the others
        (``StageBuilder.finish``), so an item nobody reads may name a column that is
        gone. A CTE bound again for each reader is where this shows: each copy has
        the CTE's whole select list and only its own reader's needs (TPC-DS q27).
        """
        needed = self._shared.needed(n)
        if needed is None:
            return n.items
        items = [(name, e) for name, e in n.items if (n.qualifier, name) in needed]
        # Read by nothing (COUNT(*) above): one constant column, as any item might
        # name a column that is gone.
        return items or [(n.items[0][0], exp.Literal.number(0))]

    def _window(self, n: Window) -> Frag:
        f = self.plan(n.child)
        common: list[exp.Expr] | None = None
        for _, w in n.funcs:
            parts = list(w.args.get("partition_by") or [])
            common = parts if common is None else [p for p in common if p in parts]
        keys = common or []
        if not f.single and not self._partitioned_within(f, keys):
            f = self._stages.exchange(f, keys) if keys else self._stages.gather(f)
        f.node = Window(f.node, n.qualifier, n.funcs)
        return f

    def _partitioned_within(self, f: Frag, keys: list[exp.Expr]) -> bool:
        """True when rows equal on ``keys`` already share a task: hashed on some of
        them, or scanned in tasks whose ranges of one of them do not overlap."""
        if f.hash_keys and keys and all(stripped(k) in keys for k in f.hash_keys):
            return True
        return self._ranges.clustered_on(f, keys)

    def _aggregate(self, n: Aggregate) -> Frag:
        f = self.plan(n.child)
        self._attach_subqueries(f, [e for _, e in n.groups + n.aggs])
        group_exprs = [e for _, e in n.groups]
        if n.grouping is not None:
            keys = common_grouping_keys(n.grouping)
            if not f.single and not self._partitioned_within(f, keys):
                partial = self._finest_grouping(f, n, keys)
                if partial is not None:
                    return partial
                f = self._stages.exchange(f, keys) if keys else self._stages.gather(f)
            f.node = Aggregate(f.node, n.qualifier, n.groups, n.aggs, n.grouping)
            f.hash_keys = None
            return f
        if f.single or n.local or self._partitioned_within(f, group_exprs):
            # A local aggregate (eager, under a join) runs in each task whatever
            # its partitioning: the aggregate above it merges its rows.
            f.node = Aggregate(f.node, n.qualifier, n.groups, n.aggs, local=n.local)
            if f.single:
                # One task holds every row: it is hashed on any keys.
                f.hash_keys = (
                    [col((n.qualifier, name)) for name, _ in n.groups] if f.hash_keys else None
                )
            else:
                f.hash_keys = _hashed_groups(f.hash_keys, n)
            f.est = self._local_bytes(f, n) if n.local else (f.est / 4 if n.groups else 64.0)
            return f
        hashed = self._hashed_names(n)
        split = split_aggs(n.aggs)
        if split is not None and self._partial_keeps_most(f, n):
            split = None
        if split is None:
            exprs = dict(n.groups)
            keys = [exprs[name] for name in hashed]
            f = self._stages.exchange(f, keys) if keys else self._stages.gather(f)
            f.node = Aggregate(f.node, n.qualifier, n.groups, n.aggs)
            f.hash_keys = [col((n.qualifier, name)) for name in hashed] or None
            f.est = f.est / 4 if n.groups else 64.0
            return f
        partial_items, final_of = split
        pq = f"_pa{next(self._names)}"
        f.est = self._partial_bytes(f, n)
        f.node = Aggregate(f.node, pq, n.groups, partial_items)
        f.needed = None  # all of the partial aggregate's columns
        group_refs = [col((pq, name)) for name in hashed]
        f = self._stages.exchange(f, group_refs) if n.groups else self._stages.gather(f)
        final_groups = [(name, col((pq, name))) for name, _ in n.groups]
        final_aggs = [(name, final_of(name, pq)) for name, _ in n.aggs]
        f.node = Aggregate(f.node, n.qualifier, final_groups, final_aggs)
        f.hash_keys = [col((n.qualifier, name)) for name in hashed] or None
        return f

    def _partial_bytes(self, f: Frag, n: Aggregate) -> float:
        """Estimated bytes of a partial aggregate's rows, all tasks together.

        Each of ``f.tasks`` tasks keeps one row per group among its own rows. The
        rows of a group are taken as spread at random over the tasks that may hold
        them: a task of ``r`` rows meets ``G * (1 - exp(-r / G))`` of ``G`` groups.
        Those are all groups, except that a task holds only the values of one key in
        the span of its row groups' ranges (``KeyRanges.spans``): a scan roughly in
        the key's order, where a NULL or overlapping row groups keep the aggregate
        from running in place (``_partitioned_within``). The partial rows then hold
        nearly every input row where groups have few rows each and the layout is
        random (TPC-H q18's lineitem by order in a random order: 6M rows, 2.6M
        partial rows in two tasks, 67 MB, once estimated as a quarter of the
        input), and one row per group per task where they have many.
        """
        if not n.groups:
            return 64.0
        groups = self._estimator.known_groups(n)
        if groups is None:
            return f.est / 4
        rows = max(1.0, self._estimator.size(n.child).rows)
        per_task = rows / max(1, f.tasks)
        spans = self._ranges.spans(f, n.groups[0][1]) if len(n.groups) == 1 else None
        kept = 0.0
        for span in spans or [1.0] * f.tasks:
            met = max(1.0, groups * span)
            kept += met * -math.expm1(-per_task / met)
        return f.est * min(1.0, kept / rows)

    def _local_bytes(self, f: Frag, n: Aggregate) -> float:
        """Estimated bytes of a local (eager) aggregate's rows, all tasks together.

        Its tasks keep a row per group they meet, as a partial aggregate's do
        (``_partial_bytes``), and only the aggregate's own columns: its groups and
        sums, of the columns its input carried. A flat quarter of the input's
        bytes where the footers do not count the groups. TPC-DS q04's store sales
        by customer and year: 1.1M rows of eight columns in two tasks, 27 MB by the
        quarter, 2.4 MB in fact (85k rows of three columns), 14 MB by this rule;
        broadcast the 11 MB of ``customer`` into both tasks looked cheaper than
        moving the aggregate's rows to a task that scans ``customer`` itself.
        """
        if self._estimator.known_groups(n) is None:
            return f.est / 4
        columns = len(n.groups) + len(n.aggs)
        return self._partial_bytes(f, n) * columns / max(columns, len(n.child.outputs()))

    def _partial_keeps_most(self, f: Frag, n: Aggregate) -> bool:
        """True when a partial aggregate by one key would keep more than
        ``PARTIAL_KEEPS`` of its input rows (``_partial_bytes``): each task would
        hash its rows into nearly as many groups, and the rows would move anyway.
        Such an aggregate is hashed whole after the exchange. TPC-H q18's lineitem
        by order in a random order: 6M rows made 2.6M partial rows in two tasks;
        without them the query took 0.74 of the time, 0.76 of the CPU.

        One key only: its count is the footers' (an integer's range, a dictionary),
        while several keys' product assumes them independent and may be far above
        the groups there are (TPC-DS q46 groups by ticket, customer, address and
        city, which a ticket's lines share).
        """
        if len(n.groups) != 1 or self._estimator.known_groups(n) is None:
            return False
        return self._partial_bytes(f, n) > PARTIAL_KEEPS * f.est

    def _hashed_names(self, n: Aggregate) -> list[str]:
        """The group columns an aggregate is hashed on: the ones its readers join
        on, if they all join on some of them (``interesting``), so that the joins
        read it where it is; else all of them.

        Not when the estimates know the wanted keys to hold fewer than
        ``FEW_VALUES_PER_PARTITION`` values per partition of the widest exchange:
        the aggregate would run in that few tasks (a join on the year alone),
        and its readers' hash again costs less than its groups made in one task.
        """
        every = [name for name, _ in n.groups]
        wanted = aggregate_keys(n, self._wanted.get(n))
        if wanted is None:
            return every
        child = self._estimator.size(n.child)
        exprs = dict(n.groups)
        values = 1.0
        for name in wanted:
            ref = column_ref(stripped(exprs[name]))
            if ref is None or ref not in child.distinct:
                return wanted
            values *= child.distinct[ref]
        few = values < FEW_VALUES_PER_PARTITION * self._stages.max_partitions
        return every if few else wanted

    def _finest_grouping(self, f: Frag, n: Aggregate, keys: list[exp.Expr]) -> Frag | None:
        """Grouping sets aggregated in two phases: each task aggregates its rows by
        all of the group expressions (the finest set), and the tasks that hold the
        common keys (one task without) aggregate those partial rows by the sets.

        TPC-DS q22's ROLLUP of four item columns over 2.3M inventory rows joined
        with ``item`` gathered 153 MB of wide rows into its one task; partially
        aggregated, each scan task sends one row per item. None when an
        aggregate does not split (``split_aggs``); ``GROUPING()`` is computed by
        the final phase, from the partial rows' group columns.
        """
        split = split_aggs([(name, a) for name, a in n.aggs if not isinstance(a, exp.Grouping)])
        if split is None or n.grouping is None:
            return None
        partial_items, final_of = split
        pq = f"_pa{next(self._names)}"
        f.node = Aggregate(f.node, pq, n.groups, partial_items)
        f.needed = None  # all of the partial aggregate's columns
        f.est = f.est / 4
        refs = [(g, col((pq, name))) for name, g in n.groups]

        def to_partial(e: exp.Expr) -> exp.Expr:
            return substitute(e, lambda x: next((r.copy() for g, r in refs if g == x), None))

        f = self._stages.exchange(f, [to_partial(k) for k in keys])
        final_aggs = [
            (name, to_partial(a) if isinstance(a, exp.Grouping) else final_of(name, pq))
            for name, a in n.aggs
        ]
        f.node = Aggregate(
            f.node,
            n.qualifier,
            [(name, col((pq, name))) for name, _ in n.groups],
            final_aggs,
            to_partial(n.grouping),
        )
        f.hash_keys = None
        return f

    def _distinct(self, n: Distinct) -> Frag:
        f = self.plan(n.child)
        outs = [col(r) for r in f.node.outputs()]
        if not f.single and not self._partitioned_within(f, outs):
            f.node = Distinct(f.node)
            f = self._stages.exchange(f, outs)
        f.node = Distinct(f.node)
        return f

    def _sort(self, n: Sort) -> Frag:
        f = self.plan(n.child)
        if not f.single:
            if n.limit is not None:
                f.node = Sort(f.node, n.keys, n.limit + n.offset, 0)
                f.est = min(f.est, float(n.limit + n.offset) * 64)
            f = self._stages.gather(f)
        f.node = Sort(f.node, n.keys, n.limit, n.offset)
        return f

    def _setop(self, n: SetOp) -> Frag:
        left, right = self.plan(n.left), self.plan(n.right)
        if left.single and right.single:
            merged = self._stages.union_in(left, right)
            if merged is not None:
                merged.node = SetOp(n.kind, n.distinct, left.node, right.node, n.qualifier, n.names)
                merged.est = left.est + right.est
                return merged
            # Apart (different inputs under one name, or over the bound): each
            # side a stage, both run at once before the set operation's task.
            scanned = self._stages.task_bytes(left), self._stages.task_bytes(right)
            over = not self._stages.fits(left, right)
            lread, linp = self._stages.broadcast(left)
            rread, rinp = self._stages.broadcast(right)
            if over:
                self._stages.note_apart(linp.stage, scanned[1], scanned[0])
                self._stages.note_apart(rinp.stage, scanned[0], scanned[1])
            node = SetOp(n.kind, n.distinct, lread, rread, n.qualifier, n.names)
            return Frag(
                node,
                1,
                left.est + right.est,
                inputs={linp.name: linp, rinp.name: rinp},
                single=True,
            )
        # Typed only here: each side's types cost DuckDB a query over empty tables
        # (24 of them, 0.28 s of q05's planning, for unions that ran in one task).
        lk, rk = self._keys.cast_keys(
            left.node,
            [col(r) for r in left.node.outputs()],
            right.node,
            [col(r) for r in right.node.outputs()],
            union=True,
        )
        positions = union_positions(n, self._wanted.get(n))
        if positions is not None:
            return self._union_all_on(
                n, left, right, [lk[i] for i in positions], [rk[i] for i in positions], positions
            )
        parts = self._stages.partitions_for(left.est + right.est)
        if n.distinct:
            # Each task drops its own duplicates before they move, as a partial
            # aggregate does: TPC-DS q14's INTERSECT of the brands, classes and
            # categories each channel sold hashed 2.5M rows (58 MB) into 3.8k.
            # A side already distinct (q87's SELECT DISTINCT branches) is not
            # hashed again for nothing.
            if not _distinct_rows(n.left):
                left.node = Distinct(left.node)
            if not _distinct_rows(n.right):
                right.node = Distinct(right.node)
        lx = self._stages.exchange(left, lk, parts)
        rx = self._stages.exchange(right, rk, parts)
        f = Frag(lx.node, parts, left.est + right.est, single=parts == 1)
        # A side hashed into one partition by one task is that task, within the bound.
        lx, rx = self._stages.fuse(f, lx), self._stages.fuse(f, rx)
        f.node = SetOp(n.kind, n.distinct, lx.node, rx.node, n.qualifier, n.names)
        return f

    def _union_all_on(
        self,
        n: SetOp,
        left: Frag,
        right: Frag,
        lk: list[exp.Expr],
        rk: list[exp.Expr],
        positions: list[int],
    ) -> Frag:
        """A UNION ALL hashed on the columns its readers join on (``lk``/``rk``, the
        sides' columns at ``positions``, cast alike): any columns do, as no row
        meets another. A side already hashed on them (an aggregate its want
        reached) stays where it is, and the other follows its partition count;
        the readers then join the union where it is, as q04's six readers of
        ``year_total`` do.
        """
        left_stays, right_stays = _hashed_into(left, lk), _hashed_into(right, rk)
        if left_stays and right_stays and left.tasks != right.tasks:
            # Partitioned into different counts: the smaller side follows.
            left_stays, right_stays = left.est >= right.est, left.est < right.est
        if left_stays:
            parts = left.tasks
        elif right_stays:
            parts = right.tasks
        else:
            parts = self._stages.partitions_for(left.est + right.est)
        lx = left if left_stays else self._stages.exchange(left, lk, parts)
        rx = right if right_stays else self._stages.exchange(right, rk, parts)
        # Hashed on the union's own columns only where neither side's key was
        # cast: a cast key hashes the supertype's value, which a reader's key
        # need not be.
        cast = any(isinstance(k, exp.Cast) for k in lk + rk)
        keys = None if cast else [col((n.qualifier, n.names[i])) for i in positions]
        f = Frag(lx.node, parts, left.est + right.est, hash_keys=keys, single=parts == 1)
        # A side hashed into one partition by one task is that task, within the bound.
        lx, rx = self._stages.fuse(f, lx), self._stages.fuse(f, rx)
        f.node = SetOp(n.kind, n.distinct, lx.node, rx.node, n.qualifier, n.names)
        return f

    def _join(self, n: Join) -> Frag:
        if n.kind in (JoinKind.INNER, JoinKind.LEFT, JoinKind.SEMI):
            self._reductions.reduce_aggregate_input(n.right, n.right_keys, n.left, n.left_keys)
        if n.kind is JoinKind.INNER:
            self._reductions.reduce_aggregate_input(n.left, n.left_keys, n.right, n.right_keys)
        left, right = self.plan(n.left), self.plan(n.right)
        f = self._joins.place(n, left, right)
        self._attach_subqueries(f, [n.residual])
        return f


def _hashed_into(f: Frag, keys: list[exp.Expr]) -> bool:
    """True when task i of ``f``'s several tasks holds exactly the rows whose
    ``keys`` hash to i (a scan's tasks hold splits, whatever its keys)."""
    return (
        f.hash_keys is not None and not f.single and f.scan is None and same_keys(f.hash_keys, keys)
    )


def _hashed_groups(hash_keys: list[exp.Expr] | None, n: Aggregate) -> list[exp.Expr] | None:
    """The keys an aggregate run in place is hashed on: its input's, as its own
    group columns.

    Its rows stay in the tasks they were in, hashed on the input's keys, which
    may be only some of the group keys (grouped on dept and mgr, hashed on
    dept): saying all of them would let a join on (dept, mgr) meet a side hashed
    on both task by task, rows equal on both in different tasks. A cast the
    exchange hashed through is kept, so the keys compare only with keys cast
    alike. None when the input is not hashed or a key is not a group.
    """
    if not hash_keys:
        return None
    out: list[exp.Expr] = []
    for key in hash_keys:
        name = next((name for name, g in n.groups if g == stripped(key)), None)
        if name is None:
            return None
        ref = col((n.qualifier, name))
        if isinstance(key, exp.Cast):
            cast = key.copy()
            cast.set("this", ref)
            ref = cast
        out.append(ref)
    return out


def _distinct_rows(node: Node) -> bool:
    """True when ``node``'s rows are distinct by construction: a DISTINCT, a GROUP BY
    without aggregates, a set operation that drops duplicates, or columns passed
    through unchanged from one of them."""
    if isinstance(node, Distinct):
        return True
    if isinstance(node, Aggregate):
        return not node.aggs and node.grouping is None
    if isinstance(node, SetOp):
        return node.distinct
    if isinstance(node, Project):
        child = {(c, n) for c, n in node.child.outputs()}
        passed = [
            (e.table, e.name)
            for _, e in node.items
            if isinstance(e, exp.Column) and (e.table, e.name) in child
        ]
        return len(set(passed)) == len(child) and _distinct_rows(node.child)
    if isinstance(node, (Filter, Sort)):
        return _distinct_rows(node.child)
    return False


def set_branch_scans(roots: list[Node]) -> set[int]:
    """The ids of the scans whose rows reach a set operation's side as they are
    (through projections, filters and joins; not through an aggregate, which
    leaves fewer): such a scan is not spread over the hosts
    (``PlannerConfig.scan_split_rows``). A set operation's sides of several tasks
    each are hashed whole into its partitions, where two sides of one task each
    run it in one task (``StageBuilder.union_in``). TPC-DS q05's channels, each a
    union of sales and returns filtered by 15 days (``plan.union_filters``), ran
    as 20 stages with ``store_sales`` spread, 9 without: on two hosts of one
    core 0.20 s against 0.81 s before both rules (q71 0.93, q75 1.03; a quiet
    machine, 2026-12-05, ``benchmarks/scaleout.py``).
    """
    found: set[int] = set()

    def reach(node: Node) -> None:
        if isinstance(node, Scan):
            found.add(id(node))
        elif isinstance(node, (Project, Filter, Join, SetOp)):
            for child in node.children():
                reach(child)

    for node in walk_once(roots):
        if isinstance(node, SetOp):
            for side in node.children():
                reach(side)
    return found
