"""Cut a logical plan into stages at exchanges.

The planner walks the logical tree bottom-up, growing a *fragment*: the part of
the tree that runs inside the current stage, with the number of tasks that run
it and how its rows are partitioned. An operator that needs rows that other
tasks hold closes the fragment into a stage and starts a new one over that
stage's output:

* join: whichever moves fewer bytes (sizes from ``plan.estimate``): broadcast a
  side (at most ``broadcast_bytes``), which copies it into every task of the other
  side, or hash both sides on the join keys, cast to one type (DuckDB's ``hash()``
  depends on the type), which moves each side once but costs more per byte; a side
  already partitioned on the keys does not move at all. Without equi keys, any side
  the kind allows is broadcast;
* aggregate: partial aggregate -> hash exchange on the group keys -> final;
  AVG as SUM/COUNT; aggregates that do not split (DISTINCT, ...) are computed
  whole after a hash exchange on the group keys;
* window: hash exchange on the common PARTITION BY keys;
* set operation: both sides hashed on all columns;
* ORDER BY ... LIMIT n: top-n per task, then the merge in one task;
* what has no key to split on (a global sort, an aggregate without GROUP BY
  that does not split, a FULL join without equi keys) gathers into one task.

No exchange is added where the rows are already partitioned as needed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from mangonel.catalog import RowGroup, Table
from mangonel.ids import StageId
from mangonel.plan.estimate import Estimator
from mangonel.plan.fragment import Renderer, rewrite, sql
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
    required_columns,
    walk,
)
from mangonel.plan.physical import (
    FileSplit,
    InputMode,
    OutputKind,
    OutputSpec,
    ScanInput,
    Stage,
    StageInput,
)
from mangonel.plan.types import TypeOracle
from mangonel.sql.exprs import (
    and_all,
    col,
    conjuncts,
    grouping_sets,
    has_placeholder,
    qualifiers,
)

SCAN_INPUT = "__scan"
SHUFFLE_COST = 1.0
"""Cost of a byte through a hash exchange (hashed, split, written, read back)
relative to a byte of a broadcast side (built into a hash table in every task of
the other side). About equal, measured on TPC-H SF1 in one slot
(``benchmarks/inproc.py``): q5's 6 MB of filtered orders broadcast to 9 lineitem
tasks beats shuffling 240 MB of lineitem (2.8 -> 0.55 s), while q21's 9.5 MB of
orders broadcast to 9 tasks cost 0.5 s more than shuffling 7.6 + 9.5 MB."""


BROADCAST_COST = 1.5
"""Cost of a broadcast byte in each task that receives it, relative to a shuffled byte:
every task builds its own hash table of the broadcast side. TPC-H q9 at SF1 broadcast
1.5M orders and 800k partsupp rows into each of 5 lineitem tasks at 1.0 (0.71 s in an
A/B, ``benchmarks/ab.py``); at 1.5 it shuffles the filtered lineitem to meet orders
(0.54 s). At 2.0, q18 shuffles lineitem too, where its (misestimated: 57 rows, not
750k) orders are better broadcast (0.65 -> 0.75 s)."""


REDUCE_RATIO = 4.0
"""The far side of a semi / anti join is first reduced by the kept side's keys when it
is estimated this many times bigger (``Distributor._reduce_by_keys``)."""

RANGE_COPIES = 0.5
"""A range join reads at most this share of the copies of its source a broadcast
would make beyond the first (0: each row group once; 1: all of it in every task)."""

RANGE_REDUCES = 0.5
"""A semi / anti join whose far side a range join reads with at most this many
duplicated bytes (relative to the smaller side) is not first reduced by keys."""

TINY_SCAN_BYTES = 2 * 1024 * 1024
"""A table this small is scanned by the tasks that join it even where they wait for
other stages: its scan costs less than a stage's round trip."""


@dataclass
class Frag:
    """The part of the plan that runs in the stage being built."""

    node: Node
    tasks: int
    est: float
    scan: Scan | None = None
    splits: tuple[tuple[FileSplit, ...], ...] = ()
    inputs: dict[str, StageInput] = field(default_factory=dict)
    hash_keys: list[exp.Expr] | None = None
    """Rows are partitioned by hash of these (over ``node``'s outputs), if known."""
    single: bool = False
    side_scans: list[tuple[Scan, tuple[tuple[FileSplit, ...], ...]]] = field(default_factory=list)
    """Tables scanned by the tasks themselves: one group of splits that every task reads
    whole (a small table, ``Distributor.join_in``), or one group per task (the row
    groups a task's join keys may meet, ``Distributor._range_join``)."""
    equal: dict[Ref, Ref] = field(default_factory=dict)
    """Columns an inner join made equal to a column of ``scan`` (other -> scan's)."""
    needed: set[Ref] | None = None
    """The columns of ``node`` the plan above reads (``logical.required_columns``);
    the stage this fragment becomes writes only those. None: all."""


def _stripped(e: exp.Expr) -> exp.Expr:
    return e.this if isinstance(e, exp.Cast) else e


class Distributor:
    """Builds the stages of one query."""

    def __init__(
        self,
        catalog: Mapping[str, Table],
        oracle: TypeOracle,
        subqueries: Mapping[str, Node],
        partitions: int,
        broadcast_bytes: int,
        split_rows: Callable[[float], int],
        estimator: Estimator | None = None,
        partition_bytes: float | None = None,
        inline_scan_bytes: float = 0,
    ) -> None:
        self._catalog = catalog
        self._estimator = estimator or Estimator(catalog)
        self._oracle = oracle
        self._subqueries = subqueries
        self._n = max(1, partitions)
        self._partition_bytes = partition_bytes
        self._broadcast = broadcast_bytes
        self._inline_scan_bytes = inline_scan_bytes
        self._split_rows = split_rows
        self._ids = itertools.count(1)
        self._qual = itertools.count(1)
        self.stages: list[Stage] = []
        self._subquery_stages: dict[str, StageId] = {}
        self._needed: dict[int, set[Ref]] = {}
        self._analyzed = False
        self._shared: set[int] = set()
        """Nodes with more than one parent (a CTE read twice), by ``id``."""
        self._under_shared: set[int] = set()
        """Shared nodes and every node under them: planned once, never changed."""
        self._materialized: dict[int, tuple[Frag, StageRead, StageInput]] = {}
        """Shared nodes closed into a stage: the fragment as it was, and how to read it."""

    # ------------------------------------------------------------ stages

    def finish(self, f: Frag, output: OutputSpec, label: str) -> tuple[StageRead, Stage]:
        """Close a fragment into a stage; return the node that reads its output."""
        stage_id = StageId(next(self._ids))
        outputs = f.node.outputs()
        if f.needed is not None and f.needed <= set(outputs):
            # Only what the plan above reads crosses the exchange (TPC-H q13 shipped
            # o_comment, which only its scan's filter reads: 101 MB -> 25 MB).
            keep = [r for r in outputs if r in f.needed] or outputs[:1]
            if len(keep) < len(outputs):
                f.node = Keep(f.node, keep)
        scan_names = {id(f.scan): SCAN_INPUT} if f.scan is not None else {}
        side_scans = []
        for i, (side, splits) in enumerate(f.side_scans, start=1):
            name = f"{SCAN_INPUT}{i}"
            scan_names[id(side)] = name
            side_scans.append(ScanInput(name, side.table, tuple(side.columns), splits))
        text = Renderer(scan_names).render(f.node)
        scan = None
        if f.scan is not None:
            scan = ScanInput(SCAN_INPUT, f.scan.table, tuple(f.scan.columns), f.splits)
        refs = f.node.outputs()
        stage = Stage(
            id=stage_id,
            sql=text,
            output=output,
            num_tasks=f.tasks,
            columns=tuple(phys(r) for r in refs),
            scan=scan,
            inputs=tuple(f.inputs.values()),
            label=label or describe(f.node),
            side_scans=tuple(side_scans),
        )
        self.stages.append(stage)
        return StageRead(f"s{stage_id}", refs, f.node), stage

    def _read(self, f: Frag, output: OutputSpec, mode: InputMode) -> tuple[StageRead, StageInput]:
        read, stage = self.finish(f, output, "")
        return read, StageInput(read.name, stage.id, mode)

    def gather(self, f: Frag) -> Frag:
        if f.single:
            return f
        read, inp = self._read(f, OutputSpec(OutputKind.SINGLE), InputMode.ALL)
        return Frag(read, 1, f.est, inputs={inp.name: inp}, single=True)

    def partitions_for(self, est: float) -> int:
        """Partitions of an exchange carrying ``est`` bytes: one per ``partition_bytes``,
        at most ``partitions`` (always ``partitions`` without ``partition_bytes``).
        A task has a fixed cost (a DuckDB query, files, scheduling) and small
        exchanges do not need many.
        """
        if not self._partition_bytes:
            return self._n
        return max(1, min(self._n, -int(-est // self._partition_bytes)))

    def exchange(self, f: Frag, keys: list[exp.Expr], partitions: int | None = None) -> Frag:
        """Hash-partition a fragment's rows by ``keys`` (expressions over its outputs)
        into ``partitions`` (default: sized from the fragment's estimate)."""
        if not keys:
            return self.gather(f)
        n = partitions or self.partitions_for(f.est)
        mapping = {r: exp.column(phys(r), quoted=True) for r in f.node.outputs()}
        key_sql = tuple(sql(rewrite(k, mapping)) for k in keys)
        read, inp = self._read(f, OutputSpec(OutputKind.HASH, n, key_sql), InputMode.PARTITION)
        return Frag(
            read,
            n,
            f.est,
            inputs={inp.name: inp},
            hash_keys=[k.copy() for k in keys],
            single=n == 1,
        )

    def broadcast(self, f: Frag) -> tuple[StageRead, StageInput]:
        return self._read(f, OutputSpec(OutputKind.SINGLE), InputMode.ALL)

    def join_in(self, target: Frag, source: Frag) -> Node:
        """The node by which every task of ``target`` reads all of ``source``.

        A small table (filtered, joined with other small tables) is scanned by each
        task of ``target`` itself when the bytes of its columns times those tasks
        stay within ``inline_scan_bytes``: a stage less, and the scheduling round
        trips between the two. Anything else is broadcast from a stage of its own.
        """
        if self._inlinable(source, target):
            assert source.scan is not None and len(source.splits) == 1
            target.side_scans += [(source.scan, (source.splits[0],)), *source.side_scans]
            return source.node
        read, inp = self.broadcast(source)
        target.inputs[inp.name] = inp
        return read

    def _inlinable(self, source: Frag, target: Frag) -> bool:
        if source.scan is None or source.inputs or source.tasks != 1 or len(source.splits) != 1:
            return False
        scans = [source.scan, *(s for s, _ in source.side_scans)]
        read = sum(
            self._catalog[s.table].row_width(s.columns) * self._catalog[s.table].rows for s in scans
        )
        if target.inputs and read > TINY_SCAN_BYTES:
            # The target waits for other stages anyway; a stage of its own scans
            # the table meanwhile (q18's customers, scanned in the orders task
            # after the IN subquery: 0.63 -> 0.71 s).
            return False
        return read * max(1, target.tasks) <= self._inline_scan_bytes

    # ------------------------------------------------------------ types

    def expr_types(self, node: Node, exprs: list[exp.Expr]) -> list[str]:
        """DuckDB types of expressions over ``node``'s outputs.

        Join keys are mostly table columns passed up unchanged; their types are
        the catalog's. Anything else is bound by DuckDB over the rendered subtree.
        """
        known = [self._scan_column_type(node, e) for e in exprs]
        if all(t is not None for t in known):
            return [t for t in known if t is not None]
        mapping = {r: exp.column(phys(r), table="t", quoted=True) for r in node.outputs()}
        cols = ", ".join(f"{sql(rewrite(e, mapping))} AS k{i}" for i, e in enumerate(exprs))
        inner = Renderer(expand_reads=True, subqueries=self._subqueries).render(node)
        return [t for _, t in self._oracle.describe(f"SELECT {cols} FROM ({inner}) AS t")]

    def _scan_column_type(self, node: Node, e: exp.Expr) -> str | None:
        ref = _column_ref(e)
        scan = _providing_scan(node, ref) if ref is not None else None
        if scan is None or ref is None:
            return None
        return self._oracle.table_types(scan.table).get(ref[1])

    def _cast_keys(
        self, left: Node, lk: list[exp.Expr], right: Node, rk: list[exp.Expr]
    ) -> tuple[list[exp.Expr], list[exp.Expr]]:
        lt, rt = self.expr_types(left, lk), self.expr_types(right, rk)
        out_l, out_r = [], []
        for le, re_, a, b in zip(lk, rk, lt, rt, strict=True):
            t = self._oracle.supertype(a, b)
            out_l.append(le.copy() if a == t else exp.cast(le.copy(), t))
            out_r.append(re_.copy() if b == t else exp.cast(re_.copy(), t))
        return out_l, out_r

    # ------------------------------------------------------------ walk

    def plan_tree(self, root: Node) -> Frag:
        """Plan a tree: the query, or a subquery of it."""
        if not self._analyzed:
            # The query and its subqueries at once: a node they share (a CTE read
            # in both) is computed once, with the columns all its readers need.
            self._analyzed = True
            parents: dict[int, int] = {}
            for tree in [root, *self._subqueries.values()]:
                for ref, cols in required_columns(tree).items():
                    self._needed[ref] = self._needed.get(ref, set()) | cols
                _count_parents(tree, parents)
            self._shared = {k for k, n in parents.items() if n > 1}
            for tree in [root, *self._subqueries.values()]:
                for node in walk(tree):
                    if id(node) in self._shared:
                        self._under_shared.update(id(n) for n in walk(node))
        return self.plan(root)

    def plan(self, node: Node) -> Frag:
        if id(node) in self._materialized:
            return self._read_materialized(node)
        method = getattr(self, f"_{type(node).__name__.lower()}")
        frag: Frag = method(node)
        frag.needed = self._needed.get(id(node))
        if id(node) in self._shared:
            return self._materialize(node, frag)
        return frag

    def _materialize(self, node: Node, f: Frag) -> Frag:
        """Close a node several parents read (a CTE that aggregates, read twice) into a
        stage of its own, which each of them reads: partitioned as the node was (task
        i of a reader reads partition i), else whole, in one task.
        """
        if f.hash_keys is not None and not f.single:
            mapping = {r: exp.column(phys(r), quoted=True) for r in f.node.outputs()}
            keys = tuple(sql(rewrite(k, mapping)) for k in f.hash_keys)
            out = OutputSpec(OutputKind.HASH, f.tasks, keys)
            read, inp = self._read(f, out, InputMode.PARTITION)
            kept = Frag(read, f.tasks, f.est, hash_keys=f.hash_keys, needed=f.needed)
        else:
            read, inp = self._read(f, OutputSpec(OutputKind.SINGLE), InputMode.ALL)
            kept = Frag(read, 1, f.est, single=True, needed=f.needed)
        self._materialized[id(node)] = (kept, read, inp)
        return self._read_materialized(node)

    def _read_materialized(self, node: Node) -> Frag:
        f, read, inp = self._materialized[id(node)]
        return Frag(
            read,
            f.tasks,
            f.est,
            inputs={inp.name: inp},
            hash_keys=[k.copy() for k in f.hash_keys] if f.hash_keys is not None else None,
            single=f.single,
            needed=f.needed,
        )

    def _attach_subqueries(self, f: Frag, exprs: list[exp.Expr | None]) -> None:
        for e in exprs:
            if e is None:
                continue
            for t in e.find_all(exp.Table):
                name = t.name
                if name in self._subqueries and name not in f.inputs:
                    if name not in self._subquery_stages:
                        # Planned once: every stage that needs it reads that output,
                        # all of its tasks' (no stage of its own to gather them).
                        sub = self.plan_tree(self._subqueries[name])
                        _, stage = self.finish(sub, OutputSpec(OutputKind.SINGLE), "subquery")
                        self._subquery_stages[name] = stage.id
                    f.inputs[name] = StageInput(name, self._subquery_stages[name], InputMode.ALL)

    def _scan(self, n: Scan) -> Frag:
        table = self._catalog[n.table]
        splits = table.splits(self._split_rows(table.row_width(n.columns)))
        est = self._estimator.size(n).rows * table.row_width(n.columns)
        return Frag(n, len(splits), est, scan=n, splits=splits, single=len(splits) == 1)

    def _values(self, n: Values) -> Frag:
        return Frag(n, 1, 64.0, single=True)

    def _opaque(self, n: Opaque) -> Frag:
        inputs: dict[str, StageInput] = {}
        tables: dict[str, Node] = {}
        for name, source in n.tables.items():
            read, inp = self.broadcast(self.plan(source))
            inputs[inp.name] = inp
            tables[name] = read
        node = Opaque(n.query, n.qualifier, n.names, tables)
        return Frag(node, 1, 1e9, inputs=inputs, single=True)

    def _filter(self, n: Filter) -> Frag:
        f = self.plan(n.child)
        self._attach_subqueries(f, [n.condition])
        f.node = Filter(f.node, n.condition)
        f.est *= 0.5
        return f

    def _project(self, n: Project) -> Frag:
        f = self.plan(n.child)
        self._attach_subqueries(f, [e for _, e in n.items])
        if f.hash_keys is not None:
            renamed: dict[Ref, Ref] = {}
            for name, e in n.items:
                if isinstance(e, exp.Column) and e.table:
                    renamed.setdefault((e.table, e.name), (n.qualifier, name))
            # The partitioning survives only if every key column is passed through.
            mapping = {r: col(renamed[r]) for r in renamed}
            survives = all(
                (c.table, c.name) in renamed for k in f.hash_keys for c in k.find_all(exp.Column)
            )
            f.hash_keys = [rewrite(k, mapping) for k in f.hash_keys] if survives else None
        f.node = Project(f.node, n.qualifier, n.items)
        return f

    def _window(self, n: Window) -> Frag:
        f = self.plan(n.child)
        common: list[exp.Expr] | None = None
        for _, w in n.funcs:
            parts = list(w.args.get("partition_by") or [])
            common = parts if common is None else [p for p in common if p in parts]
        keys = common or []
        if not f.single and not self._partitioned_within(f, keys):
            f = self.exchange(f, keys) if keys else self.gather(f)
        f.node = Window(f.node, n.qualifier, n.funcs)
        return f

    def _partitioned_within(self, f: Frag, keys: list[exp.Expr]) -> bool:
        """True when rows equal on ``keys`` already share a task: hashed on some of
        them, or scanned in tasks whose ranges of one of them do not overlap."""
        if f.hash_keys and keys and all(_stripped(k) in keys for k in f.hash_keys):
            return True
        return self._clustered_on(f, keys)

    def _clustered_on(self, f: Frag, keys: list[exp.Expr]) -> bool:
        """True when some key is a column of the fragment's scan (or made equal to one
        by an inner join) without NULLs whose ranges in the tasks' row groups do not
        overlap: rows equal on it, so on all keys, are read by one task.

        Tables written in the order of a key (TPC-H ``lineitem`` and ``orders`` by
        order key, a fact table by time) group on it without an exchange: q18
        aggregated 6M line items by order in two phases, 1.5M groups crossing a
        shuffle in between, where the scan tasks hold whole orders.
        """
        if f.scan is None or f.tasks < 2 or len(f.splits) != f.tasks:
            return False
        for key in keys:
            ref = _column_ref(_stripped(key))
            if ref is None:
                continue
            ref = f.equal.get(ref, ref)
            column = _scan_column(f.node, ref)
            if column is None or column[0] is not f.scan:
                continue
            ranges = self._task_ranges(f, column[1], null_free=True)
            if ranges is not None and _disjoint(ranges):
                return True
        return False

    def _task_ranges(self, f: Frag, column: str, null_free: bool = False) -> list[Bounds] | None:
        """Per task of ``f``, the range of its scan's ``column`` over the row groups
        the task reads (``None`` for a task of no rows); ``None`` when a row group's
        footer gives none (or, with ``null_free``, holds NULLs)."""
        assert f.scan is not None
        table = self._catalog[f.scan.table]
        out: list[Bounds] = []
        for split in f.splits:
            low: Any = None
            high: Any = None
            for group in table.groups_of(split):
                r = group.ranges.get(column)
                if r is None or (null_free and r[2]):
                    return None
                low = r[0] if low is None else min(low, r[0])
                high = r[1] if high is None else max(high, r[1])
            out.append(None if low is None else (low, high))
        return out

    def _aggregate(self, n: Aggregate) -> Frag:
        f = self.plan(n.child)
        self._attach_subqueries(f, [e for _, e in n.aggs])
        group_exprs = [e for _, e in n.groups]
        if n.grouping is not None:
            keys = _common_grouping_keys(n.grouping)
            if not f.single and not self._partitioned_within(f, keys):
                f = self.exchange(f, keys) if keys else self.gather(f)
            f.node = Aggregate(f.node, n.qualifier, n.groups, n.aggs, n.grouping)
            f.hash_keys = None
            return f
        if f.single or self._partitioned_within(f, group_exprs):
            f.node = Aggregate(f.node, n.qualifier, n.groups, n.aggs)
            f.hash_keys = (
                [col((n.qualifier, name)) for name, _ in n.groups] if f.hash_keys else None
            )
            f.est = f.est / 4 if n.groups else 64.0
            return f
        split = _split_aggs(n.aggs)
        if split is None:
            f = self.exchange(f, group_exprs) if group_exprs else self.gather(f)
            f.node = Aggregate(f.node, n.qualifier, n.groups, n.aggs)
            f.hash_keys = [col((n.qualifier, name)) for name, _ in n.groups] or None
            f.est = f.est / 4 if n.groups else 64.0
            return f
        partial_items, final_of = split
        pq = f"_pa{next(self._qual)}"
        f.node = Aggregate(f.node, pq, n.groups, partial_items)
        f.needed = None  # all of the partial aggregate's columns
        f.est = f.est / 4 if n.groups else 64.0
        group_refs = [col((pq, name)) for name, _ in n.groups]
        f = self.exchange(f, group_refs) if n.groups else self.gather(f)
        final_groups = [(name, col((pq, name))) for name, _ in n.groups]
        final_aggs = [(name, final_of(name, pq)) for name, _ in n.aggs]
        f.node = Aggregate(f.node, n.qualifier, final_groups, final_aggs)
        f.hash_keys = [col((n.qualifier, name)) for name, _ in n.groups] or None
        return f

    def _distinct(self, n: Distinct) -> Frag:
        f = self.plan(n.child)
        outs = [col(r) for r in f.node.outputs()]
        if not f.single and not self._partitioned_within(f, outs):
            f.node = Distinct(f.node)
            f = self.exchange(f, outs)
        f.node = Distinct(f.node)
        return f

    def _sort(self, n: Sort) -> Frag:
        f = self.plan(n.child)
        if not f.single:
            if n.limit is not None:
                f.node = Sort(f.node, n.keys, n.limit + n.offset, 0)
                f.est = min(f.est, float(n.limit + n.offset) * 64)
            f = self.gather(f)
        f.node = Sort(f.node, n.keys, n.limit, n.offset)
        return f

    def _setop(self, n: SetOp) -> Frag:
        left, right = self.plan(n.left), self.plan(n.right)
        lrefs, rrefs = n.left.outputs(), n.right.outputs()
        lk, rk = self._cast_keys(
            left.node,
            [col(r) for r in left.node.outputs()],
            right.node,
            [col(r) for r in right.node.outputs()],
        )
        del lrefs, rrefs
        if left.single and right.single and not left.inputs.keys() & right.inputs.keys():
            lread, linp = self.broadcast(left)
            rread, rinp = self.broadcast(right)
            node = SetOp(n.kind, n.distinct, lread, rread, n.qualifier, n.names)
            return Frag(
                node,
                1,
                left.est + right.est,
                inputs={linp.name: linp, rinp.name: rinp},
                single=True,
            )
        parts = self.partitions_for(left.est + right.est)
        lx, rx = self.exchange(left, lk, parts), self.exchange(right, rk, parts)
        node = SetOp(n.kind, n.distinct, lx.node, rx.node, n.qualifier, n.names)
        return Frag(
            node,
            parts,
            left.est + right.est,
            inputs={**lx.inputs, **rx.inputs},
            single=parts == 1,
        )

    def _join(self, n: Join) -> Frag:
        if n.kind in (JoinKind.INNER, JoinKind.LEFT, JoinKind.SEMI):
            self._reduce_aggregate_input(n.right, n.right_keys, n.left, n.left_keys)
        if n.kind is JoinKind.INNER:
            self._reduce_aggregate_input(n.left, n.left_keys, n.right, n.right_keys)
        f = self._place_join(n)
        self._attach_subqueries(f, [n.residual])
        return f

    def _reduce_aggregate_input(
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
        if agg is None or agg.grouping is not None or id(agg) in self._under_shared:
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
            if (ref := _column_ref(sk)) is not None and ref in groups
        ]
        if not pairs:
            return
        other_refs = [_column_ref(ok) for _, ok in pairs]
        aliases = {r[0] for r in other_refs if r is not None}
        if any(r is None for r in other_refs) or len(aliases) != 1:
            return
        found = _filtered_scan(other, aliases.pop())
        if found is None:
            return  # an unfiltered table has every key: the semi join would keep all
        scan, conditions = found
        alias = f"_sj{next(self._qual)}"

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
        agg.child = Join(
            agg.child,
            source,
            JoinKind.SEMI,
            [g.copy() for g, _ in pairs],
            [exp.column(k, table=alias, quoted=True) for k in keys],
            broadcast_right=True,
        )

    def _place_join(self, n: Join) -> Frag:
        left, right = self.plan(n.left), self.plan(n.right)
        out = self._join_estimate(n, left, right)
        kind = n.kind
        inner = kind in (JoinKind.INNER, JoinKind.CROSS)
        can_bcast_right = inner or kind in (JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI)
        if not n.left_keys:
            return self._join_without_keys(n, left, right, out)
        ranged: list[tuple[float, str, Sliced]] = []
        if can_bcast_right and (r := self._range_join(left, right, n.left_keys, n.right_keys)):
            ranged.append((r[0], "range right", r[1]))
        if inner and (r := self._range_join(right, left, n.right_keys, n.left_keys)):
            ranged.append((r[0], "range left", r[1]))
        # A side whose key ranges already keep it to the rows it may meet needs no
        # reduction by keys.
        ranged_cheap = any(c <= RANGE_REDUCES * min(left.est, right.est) for c, _, _ in ranged)
        reduced = (
            kind in (JoinKind.SEMI, JoinKind.ANTI)
            and not ranged_cheap
            and self._reducible(n, left, right)
        )
        if reduced:
            ranged = []
            left, right = self._reduce_by_keys(n, left, right)
        lk: list[exp.Expr] | None = None
        left_moves = right_moves = True
        if left.hash_keys or right.hash_keys:
            lk, rk = self._cast_keys(left.node, n.left_keys, right.node, n.right_keys)
            left_moves, right_moves = not self._hashed_on(left, lk), not self._hashed_on(right, rk)
        # Bytes each choice moves; a side already hash-partitioned on the keys
        # (an aggregate over a shuffle joined back on its group keys, as in q21)
        # stays where it is, and two such sides join task by task.
        shuffle = SHUFFLE_COST * (left.est * left_moves + right.est * right_moves)
        # Only the smaller side is broadcast: the bigger one, copied into a few
        # tasks of a small side (one, for a small table), would run the whole
        # join in those few tasks.
        options = [(shuffle, "shuffle")]
        if can_bcast_right and right.est <= min(self._broadcast, left.est):
            options.append((BROADCAST_COST * right.est * left.tasks, "right"))
        if inner and left.est <= min(self._broadcast, right.est):
            options.append((BROADCAST_COST * left.est * right.tasks, "left"))
        options += [(cost, how) for cost, how, _ in ranged]
        choice = min(options, key=lambda o: o[0])[1]
        if (
            (n.broadcast_right or reduced)
            and can_bcast_right
            and right.est <= self._broadcast
            and not choice.startswith("range")
        ):
            # A reduced far side meets the kept side, read whole by one task, there.
            choice = "right"
        for _, how, sliced in ranged:
            if how == choice:
                if how == "range right":
                    target, pair = left, (left.node, sliced.node)
                else:
                    target, pair = right, (sliced.node, right.node)
                self._join_sliced(target, sliced)
                target.node = Join(*pair, kind, n.left_keys, n.right_keys, n.residual)
                target.est = out
                return target
        if choice == "right":
            read = self.join_in(left, right)
            left.node = Join(left.node, read, kind, n.left_keys, n.right_keys, n.residual)
            left.est = out
            if inner:
                _note_equal(left, n.left_keys, n.right_keys)
            return left
        if choice == "left":
            read = self.join_in(right, left)
            right.node = Join(read, right.node, kind, n.left_keys, n.right_keys, n.residual)
            right.est = out
            _note_equal(right, n.right_keys, n.left_keys)
            return right
        if lk is None:
            lk, rk = self._cast_keys(left.node, n.left_keys, right.node, n.right_keys)
        if not left_moves and not right_moves and left.tasks != right.tasks:
            # Both partitioned on the keys, but into different counts: the
            # smaller side follows the bigger one's partitioning.
            left_moves, right_moves = left.est < right.est, left.est >= right.est
        if left_moves and right_moves:
            parts = self.partitions_for(left.est + right.est)
        else:
            parts = right.tasks if left_moves else left.tasks
        if left_moves:
            left = self.exchange(left, lk, parts)
        if right_moves:
            right = self.exchange(right, rk, parts)
        joined = self._colocated_join(n, left, right, lk)
        joined.est = out
        return joined

    def _range_join(
        self,
        target: Frag,
        source: Frag,
        target_keys: list[exp.Expr],
        source_keys: list[exp.Expr],
    ) -> tuple[float, Sliced] | None:
        """Join ``source`` into the tasks of ``target`` by key ranges, if it can be.

        Each task of ``target`` (a scan split into tasks) reads its key column from
        row groups whose footers give that column's range; a row can only meet
        ``source`` rows whose key lies in its task's range, and those lie in the
        row groups of ``source``'s table whose own range of the key overlaps it. So
        each task scans those row groups of ``source`` itself and joins them: no
        exchange, no stage. Any layout gives the right answer (a row group read by
        two tasks only adds rows no key of the other task meets); the layout
        decides the cost: two tables written in the order of the key (TPC-H
        ``lineitem`` and ``orders``) read each row group of ``source`` about once,
        an unordered one reads all of it in every task, like a broadcast.

        ``source`` must be a scan whose rows map one to one to its table's rows
        (filters, projections, joins that keep its side) and whose other inputs
        every task reads whole. Returns the cost (the bytes of ``source`` read
        more than once) and how to join it, or ``None``.
        """
        if target.scan is None or target.tasks < 2 or len(target.splits) != target.tasks:
            return None
        if target.tasks < source.tasks or source.est > target.est:
            # The bigger side, in more tasks, keeps them; each task builds a hash
            # table of its part of the smaller side (TPC-H q21 joined the kept
            # line items of one nation's suppliers to every line item of their
            # orders: 0.37 -> 0.66 s; reduced by keys, they meet a few).
            return None
        if not _sliceable(source):
            return None
        assert source.scan is not None
        source_table = self._catalog[source.scan.table]
        groups = [g for split in source.splits for g in source_table.groups_of(split)]
        total = sum(g.rows for g in groups)
        if not groups or total == 0:
            return None
        best: tuple[float, Sliced] | None = None
        for tk, sk in zip(target_keys, source_keys, strict=True):
            tref, sref = _column_ref(_stripped(tk)), _column_ref(_stripped(sk))
            if tref is None or sref is None:
                continue
            tcol = _scan_column(target.node, tref)
            scol = _scan_column(source.node, sref)
            if tcol is None or scol is None or tcol[0] is not target.scan:
                continue
            if scol[0] is not source.scan:
                continue
            ranges = self._task_ranges(target, tcol[1])
            if ranges is None:
                continue
            per_task = [_overlapping(groups, scol[1], r) for r in ranges]
            read = sum(g.rows for task in per_task for g in task) / total
            if read - 1.0 > RANGE_COPIES * (target.tasks - 1):
                continue  # about a broadcast: the planner's other choices know its costs
            whole = sum(
                self._catalog[s.table].column_bytes(s.columns) for s, _ in source.side_scans
            )
            cost = BROADCAST_COST * (
                source.est * max(0.0, read - 1.0) + whole * max(0, target.tasks - source.tasks)
            )
            if best is None or cost < best[0]:
                splits = tuple(source_table.split_of(task) for task in per_task)
                best = (cost, Sliced(source, splits, {sref: tref}))
        return best

    def _join_sliced(self, target: Frag, sliced: Sliced) -> None:
        """Make ``target``'s tasks scan their row groups of ``sliced.source``."""
        source = sliced.source
        assert source.scan is not None
        target.side_scans += [(source.scan, sliced.splits), *source.side_scans]
        target.inputs.update(source.inputs)
        target.equal.update(sliced.equal)

    def _reducible(self, n: Join, left: Frag, right: Frag) -> bool:
        """A semi / anti join whose kept side is small next to the other one."""
        return (
            not n.broadcast_right
            and left.est <= self._broadcast
            and left.est * REDUCE_RATIO <= right.est
        )

    def _reduce_by_keys(self, n: Join, left: Frag, right: Frag) -> tuple[Frag, Frag]:
        """Semi-join reduction of the far side of a semi / anti join.

        Which rows of ``left`` have a match is all a semi (anti) join asks, so
        ``left`` cannot be broadcast into ``right``'s tasks; but rows of ``right``
        whose keys no row of ``left`` has can match nothing. ``left`` becomes a
        stage of its own, broadcast into ``right``'s tasks, which keep only the
        rows that may match before anything moves (TPC-H q21: the line items of
        the orders of one nation's suppliers, not all of ``lineitem``), and read
        whole by the join itself.
        """
        read, stage = self.finish(left, OutputSpec(OutputKind.SINGLE), "")
        inp = StageInput(read.name, stage.id, InputMode.ALL)
        right.inputs[inp.name] = inp
        right.node = Join(
            right.node,
            read,
            JoinKind.SEMI,
            [k.copy() for k in n.right_keys],
            [k.copy() for k in n.left_keys],
        )
        size = self._estimator.size
        right.est *= min(1.0, size(n.left).rows / max(1.0, size(n.right).rows))
        return Frag(read, 1, left.est, inputs={inp.name: inp}, single=True), right

    def _join_without_keys(self, n: Join, left: Frag, right: Frag, out: float) -> Frag:
        """A join on no equality: some side must meet all of the other."""
        kind = n.kind
        inner = kind in (JoinKind.INNER, JoinKind.CROSS)
        if kind in (JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI) or (
            inner and left.est >= right.est
        ):
            read = self.join_in(left, right)
            left.node = Join(left.node, read, kind, n.left_keys, n.right_keys, n.residual)
            left.est = out
            return left
        if inner:
            read = self.join_in(right, left)
            right.node = Join(read, right.node, kind, n.left_keys, n.right_keys, n.residual)
            right.est = out
            return right
        # FULL join without equi keys: both sides in one task.
        lg = self.gather(left)
        read, inp = self.broadcast(right)
        lg.inputs[inp.name] = inp
        lg.node = Join(lg.node, read, kind, n.left_keys, n.right_keys, n.residual)
        lg.est = out
        return lg

    def _join_estimate(self, n: Join, left: Frag, right: Frag) -> float:
        """Bytes of a join's output: its estimated rows times both sides' row widths."""
        size = self._estimator.size
        width = left.est / max(1.0, size(n.left).rows)
        if n.kind not in (JoinKind.SEMI, JoinKind.ANTI):
            width += right.est / max(1.0, size(n.right).rows)
        return size(n).rows * width

    def _hashed_on(self, f: Frag, keys: list[exp.Expr]) -> bool:
        """True when task i of ``f``'s tasks holds exactly the rows whose ``keys`` hash
        to i (modulo its task count)."""
        return f.hash_keys is not None and _same(f.hash_keys, keys) and f.scan is None

    def _colocated_join(self, n: Join, left: Frag, right: Frag, lk: list[exp.Expr]) -> Frag:
        """Join two sides hash-partitioned alike on the join keys, task by task."""
        left.inputs.update(right.inputs)
        left.side_scans += right.side_scans
        left.node = Join(left.node, right.node, n.kind, n.left_keys, n.right_keys, n.residual)
        left.hash_keys = lk if n.kind is not JoinKind.FULL else None
        return left


Bounds = tuple[Any, Any] | None
"""The smallest and largest value of a column in a task's row groups; None: no rows."""


def _disjoint(ranges: list[Bounds]) -> bool:
    """True when no two of the ranges share a value."""
    known = sorted((r for r in ranges if r is not None), key=lambda r: r[0])
    try:
        return all(a[1] < b[0] for a, b in itertools.pairwise(known))
    except TypeError:  # values of different kinds
        return False


@dataclass
class Sliced:
    """A fragment to be scanned by another one's tasks, each its own row groups."""

    source: Frag
    splits: tuple[tuple[FileSplit, ...], ...]
    """Per task of the fragment that joins it."""
    equal: dict[Ref, Ref]
    """The source's key column -> the joining fragment's (an inner join's equality)."""

    @property
    def node(self) -> Node:
        return self.source.node


def _overlapping(groups: list[RowGroup], column: str, bounds: Bounds) -> list[RowGroup]:
    """The row groups whose ``column`` may hold a value within ``bounds`` (groups
    without a range of it may hold any); at least one: a task of no rows still
    needs the table's columns, and rows it cannot meet change nothing."""
    if bounds is None:
        return groups[:1]
    low, high = bounds
    kept = []
    for g in groups:
        r = g.ranges.get(column)
        try:
            if r is None or (r[1] >= low and r[0] <= high):
                kept.append(g)
        except TypeError:  # values of different kinds: keep it
            kept.append(g)
    return kept or groups[:1]


def _sliceable(f: Frag) -> bool:
    """True when ``f`` is a scan whose rows come one each from rows of its table
    (``Distributor._range_join``): filtered, projected, joined only where its side
    is kept, every other input read whole by each task."""
    if f.scan is None or f.hash_keys is not None or not f.splits:
        return False
    if any(i.mode is not InputMode.ALL for i in f.inputs.values()):
        return False
    if any(len(splits) != 1 for _, splits in f.side_scans):
        return False
    node = f.node
    while node is not f.scan:
        if isinstance(node, (Filter, Project, Keep)):
            node = node.child
        elif isinstance(node, Join):
            on_left = any(x is f.scan for x in walk(node.left))
            if on_left and node.kind in (
                JoinKind.INNER,
                JoinKind.CROSS,
                JoinKind.LEFT,
                JoinKind.SEMI,
                JoinKind.ANTI,
            ):
                node = node.left
            elif not on_left and node.kind in (JoinKind.INNER, JoinKind.CROSS):
                node = node.right
            else:
                return False
        else:
            return False
    return True


def _note_equal(f: Frag, scan_keys: list[exp.Expr], other_keys: list[exp.Expr]) -> None:
    """Record that an inner join made the other side's key columns equal to ``f``'s."""
    for a, b in zip(scan_keys, other_keys, strict=True):
        ra, rb = _column_ref(_stripped(a)), _column_ref(_stripped(b))
        if ra is not None and rb is not None:
            f.equal[rb] = f.equal.get(ra, ra)


def _column_ref(e: exp.Expr) -> Ref | None:
    if isinstance(e, exp.Column) and e.table:
        return (e.table, e.name)
    return None


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
            if (ref := _column_ref(e)) is not None and ref in inner
        }
        return agg, passed
    return None, {}


def _providing_scan(node: Node, ref: Ref) -> Scan | None:
    """The scan whose column ``ref`` reaches ``node``'s outputs unchanged (through
    filters, sorts, joins and stage reads), if any."""
    while True:
        if isinstance(node, Scan):
            return node if node.alias == ref[0] and ref[1] in node.columns else None
        if isinstance(node, StageRead):
            node = node.source
        elif isinstance(node, (Filter, Sort)):
            node = node.child
        elif isinstance(node, Join):
            sides = [c for c in (node.left, node.right) if ref in c.outputs()]
            if len(sides) != 1 or ref not in node.outputs():
                return None
            node = sides[0]
        else:
            return None


def _scan_column(node: Node, ref: Ref) -> tuple[Scan, str] | None:
    """The scan and its column whose values ``ref`` carries unchanged (through
    filters, projections that pass a column on, inner joins and the kept side of
    other joins), if any; stage reads end the search."""
    while True:
        if isinstance(node, Scan):
            return (node, ref[1]) if node.alias == ref[0] and ref[1] in node.columns else None
        if isinstance(node, (Filter, Sort, Keep)):
            node = node.child
        elif isinstance(node, Project):
            if node.qualifier != ref[0]:
                return None
            items = dict(node.items)
            inner = _column_ref(items[ref[1]]) if ref[1] in items else None
            if inner is None:
                return None
            node, ref = node.child, inner
        elif isinstance(node, Join):
            sides = [c for c in (node.left, node.right) if ref in c.outputs()]
            if len(sides) != 1 or ref not in node.outputs():
                return None
            kept = {JoinKind.INNER, JoinKind.CROSS}
            if sides[0] is node.left:
                kept |= {JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI}
            if node.kind not in kept:
                return None  # NULLs where no row matched
            node = sides[0]
        else:
            return None


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


def _count_parents(node: Node, parents: dict[int, int]) -> None:
    """Add how many parents each node under ``node`` has (each subtree walked once)."""
    for child in node.children():
        parents[id(child)] = parents.get(id(child), 0) + 1
        if parents[id(child)] == 1:
            _count_parents(child, parents)


def _same(a: list[exp.Expr], b: list[exp.Expr]) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(a, b, strict=True))


def _common_grouping_keys(grouping: exp.Expr) -> list[exp.Expr]:
    """Expressions present in every grouping set (rows equal on them share a task)."""
    sets = grouping_sets(grouping)
    if not sets:
        return []
    common = sets[0]
    for s in sets[1:]:
        common = [e for e in common if e in s]
    return common


FinalOf = Callable[[str, str], exp.Expr]


def _split_aggs(
    aggs: list[tuple[str, exp.Expr]],
) -> tuple[list[tuple[str, exp.Expr]], FinalOf] | None:
    """Partial aggregate items and a function that builds each final expression.

    Returns None when some aggregate does not split into partial and final.
    """
    partial: list[tuple[str, exp.Expr]] = []
    plans: dict[str, tuple[str, list[str]]] = {}
    for name, a in aggs:
        if isinstance(a, exp.Filter) or a.args.get("distinct") or isinstance(a.this, exp.Distinct):
            return None
        if isinstance(a, exp.Count):
            partial.append((f"{name}_c", a.copy()))
            plans[name] = ("count", [f"{name}_c"])
        elif isinstance(a, exp.Sum) and len(a.expressions) == 0:
            partial.append((f"{name}_s", a.copy()))
            plans[name] = ("sum", [f"{name}_s"])
        elif type(a) in (exp.Min, exp.Max) and not a.expressions:
            partial.append((f"{name}_m", a.copy()))
            plans[name] = ("min" if isinstance(a, exp.Min) else "max", [f"{name}_m"])
        elif isinstance(a, exp.Avg):
            partial.append((f"{name}_s", exp.Sum(this=a.this.copy())))
            partial.append((f"{name}_c", exp.Count(this=a.this.copy())))
            plans[name] = ("avg", [f"{name}_s", f"{name}_c"])
        else:
            return None

    def final(name: str, pq: str) -> exp.Expr:
        how, parts = plans[name]
        cols = [col((pq, p)) for p in parts]
        if how == "count":
            return exp.cast(exp.Sum(this=cols[0]), "BIGINT")
        if how == "sum":
            return exp.Sum(this=cols[0])
        if how == "min":
            return exp.Min(this=cols[0])
        if how == "max":
            return exp.Max(this=cols[0])
        total = exp.cast(exp.Sum(this=cols[0]), "DOUBLE")
        count = exp.Nullif(this=exp.Sum(this=cols[1]), expression=exp.Literal.number(0))
        return exp.Div(this=total, expression=count)

    return partial, final


def describe(node: Node) -> str:
    """A short label of what a stage does, e.g. ``scan lineitem → join → partial aggregate``."""
    words: list[str] = []

    def visit(n: Node) -> None:
        if isinstance(n, StageRead):
            return
        for c in n.children():
            visit(c)
        if isinstance(n, Scan):
            words.append(f"scan {n.table}" + (" (filtered)" if n.filter is not None else ""))
        elif isinstance(n, Join):
            words.append(f"{n.kind.value} join")
        elif isinstance(n, Aggregate):
            words.append("partial aggregate" if n.qualifier.startswith("_pa") else "aggregate")
        elif isinstance(n, Sort):
            words.append("top-n" if n.limit is not None else "sort")
        elif isinstance(n, (Window, Distinct, SetOp, Opaque, Values)):
            words.append(type(n).__name__.lower() if not isinstance(n, Opaque) else "whole query")

    visit(node)
    return " → ".join(words) or "read"
