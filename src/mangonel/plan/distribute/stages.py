"""Closing fragments into stages.

A *fragment* (``Frag``) is the part of the plan that runs inside the stage being
built, with the number of tasks that run it and how its rows are partitioned.
``StageBuilder`` owns the stages of one query: it closes a fragment into a stage
(``finish``) and starts the fragment that reads its output: gathered into one
task, hash-partitioned on keys (``exchange``), or broadcast into every task of
another fragment, where a small table may be scanned by those tasks themselves
instead (``join_in``).

No boundary is cut between two one-task stages: a fragment of one task whose only
reader runs as one task and reads all of it is planned inside that reader
(``one_task``, ``absorb``). A boundary costs a producer's output file, its report
and the scheduler's durable commit, and the reader's launch, input fetch and
DuckDB parse (about 15 ms on a 2-core host), where one DuckDB query runs both
parts with all of its threads. A fragment read by several stages (a shared CTE,
a subquery's stage, the kept side of a semi-join reduction) stays a stage: its
work would be repeated in each reader; unless that work is small
(``recomputable``: one task that reads only tables, or a shared node that reads
only stages, whose copies beyond the first read at most ``recompute_bytes``).
A cheap one-task side broadcast into a scan's several tasks that read no other
stage is computed by each of them the same way (``join_in``).

Fusion is bounded (``fuse_bytes``): a fused task scans at most about a split's
worth of tables, small ones aside (``task_bytes``). Past that, the producer is a
stage of its own (``fuse``, ``fits``), which another executor runs at the same
time as the others: on one host a fused task's DuckDB has all the cores, but a
cluster of many hosts would run TPC-DS q09's fifteen scans of ``store_sales``
(770 MiB at SF1) in one task of one executor. The bound is checked where the
sides meet, as each one-task producer is absorbed: a hash exchange into one
partition returns the producer itself, so the exchange alone cannot tell.

Why it is over 600 lines: ``StageBuilder`` is the one owner of a query's stages,
and closing, exchanging, broadcasting and fusing one-task stages each decide
where a boundary goes, by the rules this docstring draws together; apart, each
would need the others' bookkeeping.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sqlglot import exp

from mangonel import defaults
from mangonel.catalog import Table
from mangonel.ids import StageId
from mangonel.plan.fragment import Renderer, rewrite, sql
from mangonel.plan.logical import (
    Aggregate,
    Distinct,
    Join,
    Keep,
    Node,
    Opaque,
    Ref,
    Scan,
    SetOp,
    Sort,
    StageRead,
    Values,
    Window,
    phys,
    scan_table,
    volatile,
    walk,
)
from mangonel.plan.physical import ScanInput, Stage, StageInput
from mangonel.sql.exprs import PLACEHOLDER_PREFIX
from mangonel.task import FileSplit, InputMode, OutputKind, OutputSpec

SCAN_INPUT = "__scan"
"""The relation name by which a stage's SQL reads its own scan's splits (side scans
are ``__scan1``, ``__scan2``, ...)."""

TINY_SCAN_BYTES = 2 * 1024 * 1024
"""A table this small is scanned by the tasks that join it even where they wait for
other stages: its scan costs less than a stage's round trip."""

_MIB = 1024 * 1024


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
    hash_equal: tuple[list[exp.Expr] | None, tuple[exp.Expr, ...]] = (None, ())
    """Keys equal, position by position, to ``hash_keys`` in every row (the other
    side's keys of the inner join that hashed them: the rows are hashed on those
    too), and the very ``hash_keys`` list they were noted with: a fragment hashed
    anew, or whose keys a projection rewrote, has another list and so none
    (``joins._hashed_within``)."""
    single: bool = False
    side_scans: list[tuple[Scan, tuple[tuple[FileSplit, ...], ...]]] = field(default_factory=list)
    """Tables scanned by the tasks themselves: one group of splits that every task reads
    whole (a small table, ``StageBuilder.join_in``), or one group per task (the row
    groups a task's join keys may meet, ``ranges.KeyRanges.range_join``)."""
    equal: dict[Ref, Ref] = field(default_factory=dict)
    """Columns an inner join made equal to a column of ``scan`` (other -> scan's)."""
    needed: set[Ref] | None = None
    """The columns of ``node`` the plan above reads (``logical.required_columns``);
    the stage this fragment becomes writes only those. None: all."""
    copied: bool = False
    """A copy of a subquery several nodes read, each computing it
    (``Distributor._inline_subquery``)."""
    subqueries: dict[str, Frag] = field(default_factory=dict)
    """Subqueries of one task each, read only here, by placeholder: computed by
    this fragment's task where it closes as one task, each rendered where its
    placeholder is read; a stage of their own where it closes as several
    (``StageBuilder.finish``, ``Distributor._inline_subquery``)."""


SPREAD_PARTITION_BYTES = defaults.ADAPTIVE_MIN_PARTITION_BYTES
"""An exchange spread over the hosts' parallel tasks carries at least this many
estimated bytes a partition (``StageBuilder.partitions_for``): the size below
which the scheduler merges partitions anyway (``Limits.adaptive_min_partition_bytes``).
At SF1 on two hosts of one core it spreads an exchange of q09, q17 and q20: 0.7-0.8 of
the time in one run on a loaded machine, 1.08-1.12 in one on a quiet one, where queries
whose plans did not change moved by up to 15 % (2026-12-04/05, ``BENCHMARKS.md``)."""


def whole_waves(partitions: int, slots: int, most: int) -> int:
    """``partitions`` reader tasks, made a multiple of ``slots`` where there are
    more than ``slots`` of them (up to ``most``, else down), so that their last
    wave fills the slots.

    A reader task is not spread evenly over its DuckDB threads: reading its
    input, the aggregate's finish and writing its output run on fewer, so a task
    alone in the last wave leaves cores idle that a task beside it would use.
    TPC-H q18 at SF1 with the rows in random order: its 144 MB exchange (by
    order key, aggregated into 1.5M groups) in 3 partitions on 2 slots ran the
    query in 1066 ms, in 4 in 912 ms, in 2 in 989 ms (``partition_bytes`` 64,
    36 and 72 MiB, interleaved on one machine). Fewer partitions than slots are
    left alone: they are one wave already, and each has its fixed cost.

    >>> whole_waves(3, slots=2, most=4)
    4
    >>> whole_waves(5, slots=4, most=6)
    4
    >>> whole_waves(3, slots=8, most=4)
    3
    >>> whole_waves(3, slots=0, most=4)
    3
    """
    if slots < 1 or partitions <= slots or partitions % slots == 0:
        return partitions
    up = -(-partitions // slots) * slots
    return up if up <= most else partitions // slots * slots


class _Absorbed(enum.Enum):
    """How ``StageBuilder.join_in`` brings a side into the tasks that read it
    without a stage of its own."""

    FUSED = "both one task: the reader's task runs the side's too"
    INLINE = "a small table each task scans itself"
    RECOMPUTED = "a one-task producer from tables alone, each task computes it"


class StageBuilder:
    """The stages of one query, and the exchanges between them.

    Args:
        catalog: the tables (their sizes decide whether a side is scanned inline).
        partitions: the most output partitions of a hash exchange.
        partition_bytes: an exchange gets one partition per this many estimated
            bytes; None: always ``partitions``.
        inline_scan_bytes: see ``PlannerConfig.inline_scan_bytes``.
        fuse_bytes: the most bytes of tables a task of fused one-task stages
            scans (``task_bytes``); None: no bound.
        slots: task slots a job may hold (``PlannerConfig.slots``); 0: unknown.
        recompute_bytes: the most bytes of tables the copies beyond the first of
            a producer computed again by each task that reads it may scan
            (``recomputable``); 0: never.
        parallel: tasks the hosts run at full speed at once
            (``PlannerConfig.parallel``); 0: unknown.
    """

    def __init__(
        self,
        catalog: Mapping[str, Table],
        partitions: int,
        partition_bytes: float | None,
        inline_scan_bytes: float,
        fuse_bytes: float | None = None,
        slots: int = 0,
        recompute_bytes: float = 0,
        parallel: int = 0,
    ) -> None:
        self._catalog = catalog
        self._n = max(1, partitions)
        self._parallel = max(0, parallel)
        self._partition_bytes = partition_bytes
        self._slots = max(0, slots)
        self._inline_scan_bytes = inline_scan_bytes
        self._fuse_bytes = fuse_bytes
        self._recompute_bytes = recompute_bytes
        self.notes: list[str] = []
        """What EXPLAIN says of the plan: each producer kept apart by the bound."""
        self.stages: list[Stage] = []
        self._stage_bytes: dict[StageId, float] = {}
        """Each stage's estimated output (its fragment's ``est``)."""
        self._read_whole: dict[tuple[object, ...], Stage] = {}
        """Stages read whole by position (subqueries'), by ``_same_rows_key``."""

    def finish(
        self, f: Frag, output: OutputSpec, label: str, read_whole: bool = False
    ) -> tuple[StageRead, Stage]:
        """Close a fragment into a stage; return the node that reads its output.

        With ``read_whole`` (a subquery's stage: its readers select all of its one
        column, by position), a stage that computes the same rows under other
        column names is returned instead of a new one. TPC-DS q14 reads its
        ``cross_items`` and ``avg_sales`` CTEs in a subquery of each of its three
        channels: six stages that made two results three times each.
        """
        # Numbered by position: a stage found the same as one before is not
        # added, and leaves no gap.
        inline = self._take_subqueries(f)
        stage_id = StageId(len(self.stages) + 1)
        f.node = kept(f)
        scan_names = {id(f.scan): SCAN_INPUT} if f.scan is not None else {}
        side_scans = []
        for i, (side, splits) in enumerate(f.side_scans, start=1):
            name = f"{SCAN_INPUT}{i}"
            scan_names[id(side)] = name
            side_scans.append(
                ScanInput(name, side.table, tuple(side.columns), splits, _pruned(side))
            )
        text = Renderer(scan_names, inline=inline).render(f.node)
        scan = None
        if f.scan is not None:
            scan = ScanInput(
                SCAN_INPUT, f.scan.table, tuple(f.scan.columns), f.splits, _pruned(f.scan)
            )
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
            whole_query=any(isinstance(n, Opaque) for n in walk(f.node)),
        )
        if read_whole:
            key = _same_rows_key(stage)
            same = self._read_whole.get(key)
            if same is not None:
                return StageRead(f"s{same.id}", refs, f.node), same
            self._read_whole[key] = stage
        self.stages.append(stage)
        self._stage_bytes[stage_id] = f.est
        return StageRead(f"s{stage_id}", refs, f.node), stage

    def _take_subqueries(self, f: Frag) -> dict[str, Node]:
        """Settle ``f``'s subqueries as it closes (``Frag.subqueries``): in its task,
        where it is one task (their scans, inputs and own subqueries become its),
        the nodes to render by placeholder; else each a stage ``f`` reads whole,
        unless each of its tasks may compute it again (``recomputable``: a
        one-task producer fused into them by ``join_in`` brought it along).

        A copy (``Frag.copied``: a subquery other readers compute too), and any
        subquery of several tasks, is a stage where ``f`` reads other stages:
        ``f`` starts once they end, and computing it there would be on the
        query's path, where its stage runs meanwhile (TPC-H q20 at SF 0.1: its
        final task, which reads the ``lineitem`` stage, reads the filtered
        parts' stage; the ``lineitem`` tasks compute them).
        """
        if f.tasks != 1:
            self.stage_subqueries(
                f, keep=lambda sub: not f.inputs and self.recomputable(sub, f.tasks)
            )
        elif f.inputs:
            self.stage_subqueries(f, keep=lambda sub: not sub.copied)
        inline: dict[str, Node] = {}
        while f.subqueries:
            name, sub = f.subqueries.popitem()
            inline[name] = kept(sub)
            absorb(f, sub)
        return inline

    def stage_subqueries(self, f: Frag, keep: Callable[[Frag], bool] = lambda _: False) -> None:
        """Close each subquery ``f`` was to compute into a stage ``f`` reads whole:
        ``f``'s rows are to be read by several tasks, each of which would compute
        them again. Those ``keep`` accepts stay ``f``'s to compute.

        Read whole by position: a subquery several readers compute (``recomputable``)
        that two of them put in stages is one stage.
        """
        kept_here: dict[str, Frag] = {}
        for name, sub in f.subqueries.items():
            if keep(sub):
                kept_here[name] = sub
                continue
            _, stage = self.finish(sub, OutputSpec(OutputKind.SINGLE), "subquery", read_whole=True)
            f.inputs[name] = StageInput(name, stage.id, InputMode.ALL)
        f.subqueries = kept_here

    def read(self, f: Frag, output: OutputSpec, mode: InputMode) -> tuple[StageRead, StageInput]:
        """Close ``f`` into a stage; the node and the input by which another stage reads it."""
        read, stage = self.finish(f, output, "")
        return read, StageInput(read.name, stage.id, mode)

    def gather(self, f: Frag) -> Frag:
        """All of ``f``'s rows in one task (``f`` itself, where it is one task)."""
        if f.single:
            return f
        read, inp = self.read(f, OutputSpec(OutputKind.SINGLE), InputMode.ALL)
        return Frag(read, 1, f.est, inputs={inp.name: inp}, single=True)

    @property
    def max_partitions(self) -> int:
        """The most partitions an exchange gets."""
        return self._n

    def partitions_for(self, est: float) -> int:
        """Partitions of an exchange carrying ``est`` bytes: one per ``partition_bytes``,
        at most ``partitions`` (always ``partitions`` without ``partition_bytes``).
        A task has a fixed cost (a DuckDB query, files, scheduling) and small
        exchanges do not need many. More partitions than slots are made whole
        waves (``whole_waves``).

        Where several tasks run at full speed at once (``parallel`` over 1), an
        exchange of at least ``SPREAD_PARTITION_BYTES`` a partition gets one for
        each of them: one reader task would keep the other hosts idle. The
        scheduler merges partitions that turn out smaller
        (``scheduler.adaptive``), so an estimate too high costs files, not tasks.
        """
        if not self._partition_bytes:
            return self._n
        wanted = max(1, min(self._n, -int(-est // self._partition_bytes)))
        if self._parallel > 1 and wanted < self._parallel:
            spread = min(self._n, self._parallel, int(est // SPREAD_PARTITION_BYTES))
            wanted = max(wanted, spread)
        return whole_waves(wanted, self._slots, self._n)

    def exchange(self, f: Frag, keys: list[exp.Expr], partitions: int | None = None) -> Frag:
        """Hash-partition a fragment's rows by ``keys`` (expressions over its outputs)
        into ``partitions`` (default: sized from the fragment's estimate)."""
        if not keys:
            return self.gather(f)
        n = partitions or self.partitions_for(f.est)
        if n == 1 and one_task(f):
            # Hashed into one partition by one task: the reader's one task runs
            # ``f`` itself (TPC-H q13: the customer and orders scans were two
            # stages of one task each, hashed into the one task of the join).
            f.hash_keys = [k.copy() for k in keys]
            f.single = True
            return f
        read, inp = self.read(f, hashed(f, keys, n), InputMode.PARTITION)
        return Frag(
            read,
            n,
            f.est,
            inputs={inp.name: inp},
            hash_keys=[k.copy() for k in keys],
            single=n == 1,
        )

    def broadcast(self, f: Frag) -> tuple[StageRead, StageInput]:
        """Close ``f`` into a stage that every task of its reader reads whole."""
        return self.read(f, OutputSpec(OutputKind.SINGLE), InputMode.ALL)

    def join_in(self, target: Frag, source: Frag) -> Node:
        """The node by which every task of ``target`` reads all of ``source``.

        A small table (filtered, joined with other small tables) is scanned by each
        task of ``target`` itself when the bytes of its columns times those tasks
        stay within ``inline_scan_bytes``: a stage less, and the scheduling round
        trips between the two. Anything else is broadcast from a stage of its own.
        """
        how = self._absorption(target, source)
        if how is _Absorbed.INLINE and target.tasks > 1:
            # Unless each task may compute them again, as it scans the table.
            self.stage_subqueries(
                source,
                keep=lambda sub: not target.inputs and self.recomputable(sub, target.tasks),
            )
        if how is not None:
            absorb(target, source)
            return source.node
        host_bytes, guest_bytes = self.task_bytes(target), self.task_bytes(source)
        read, inp = self.broadcast(source)
        if target.tasks == 1 and one_task(source) and same_inputs(target, source):
            # Both one task, but over the bound on a fused task's bytes.
            self.note_apart(inp.stage, host_bytes, guest_bytes)
        target.inputs[inp.name] = inp
        return read

    def absorbs(self, target: Frag, source: Frag) -> bool:
        """True when ``join_in`` has ``target``'s tasks compute ``source``
        themselves; False when ``source`` is broadcast from a stage of its own."""
        return self._absorption(target, source) is not None

    def _absorption(self, target: Frag, source: Frag) -> _Absorbed | None:
        """How ``join_in`` brings ``source`` into ``target``'s tasks without a
        stage of its own; None: it does not."""
        if (
            target.tasks == 1
            and one_task(source)
            and same_inputs(target, source)
            and self.fits(target, source)
        ):
            # Both one task: the target's task runs ``source`` too (TPC-H q22's
            # semi join of ``orders`` with the filtered customers, read only by
            # the final anti join; TPC-DS q04/q11's readers of the shared
            # year_total, each keeping one channel and year), within the bound.
            return _Absorbed.FUSED
        if self._inlinable(source, target):
            return _Absorbed.INLINE
        if (
            target.tasks > 1
            and not target.inputs
            and self.recomputable(source, target.tasks)
            and self.fits(target, source)
        ):
            # A producer of one task, from tables alone, on the path of a scan
            # that waits for nothing else: each of the scan's tasks computes it
            # (TPC-H q17's filtered ``part``, 6 MiB, into ``lineitem``'s two
            # tasks; q08's and q19's filtered ``part`` the same way),
            # within the bound on the bytes of the fused task.
            return _Absorbed.RECOMPUTED
        return None

    def union_in(self, left: Frag, right: Frag) -> Frag | None:
        """One task that runs both sides of a set operation of two one-task sides
        (``left``'s fragment, with ``right``'s scans and inputs); the caller sets
        its node. None when they read an input name as different inputs.

        Each side in a stage of its own would write its rows whole for the one
        task of the set operation to read back: TPC-DS q05's union of
        ``store_sales`` and ``store_returns`` wrote 221 MB (2.9M rows) before a
        join with 15 days of ``date_dim`` kept 1 % of them. Sides that aggregate
        run in one DuckDB query too, in parallel on its threads.
        """
        if not (one_task(left) and one_task(right) and same_inputs(left, right)):
            return None
        if not self.fits(left, right):
            # Both sides become stages of their own, run at the same time
            # (``Distributor._setop``): one kept as the host would scan its
            # tables only after the other's stage ended.
            return None
        absorb(left, right)
        # The set operation's outputs are new columns: no key or equality of the
        # host's scan describes them.
        left.hash_keys = None
        left.equal = {}
        return left

    def task_bytes(self, f: Frag) -> float:
        """Bytes of tables one task of ``f`` scans: rows times the width of the
        columns read (as splits are sized), of its own scan, of its side scans and
        of the subqueries its task is to compute.

        A scan of at most ``inline_scan_bytes`` is not counted: a join scans such
        a table in every one of its tasks anyway, so it is not work that another
        executor could take off the task (TPC-DS's dimensions at SF1, ``item``,
        ``customer``, ``date_dim``, ``time_dim``, are 0.3 to 3.8 MiB of the
        columns read; the default is 8 MiB).
        """
        scans: list[tuple[Scan, tuple[FileSplit, ...]]] = []
        if f.scan is not None and f.splits:
            scans.append((f.scan, max(f.splits, key=_rows)))
        scans += [(side, max(groups, key=_rows)) for side, groups in f.side_scans if groups]
        total = 0.0
        for scan, splits in scans:
            table = self._catalog[scan.table]
            read = _rows(splits) * table.row_width(scan.columns)
            if read > self._inline_scan_bytes:
                total += read
        return total + sum(self.task_bytes(sub) for sub in f.subqueries.values())

    def read_bytes(self, f: Frag, stages: bool = False) -> float | None:
        """Bytes ``f``'s one task reads: of tables, every scan counted, with the
        subqueries it computes; with ``stages``, the estimated output of the
        stages it reads too. None where it runs as several tasks, or reads
        another stage without ``stages``: it is not computed from tables alone."""
        if not one_task(f) or (f.inputs and not stages):
            return None
        scans: list[tuple[Scan, tuple[FileSplit, ...]]] = []
        if f.scan is not None and f.splits:
            scans.append((f.scan, f.splits[0]))
        scans += [(side, max(groups, key=_rows)) for side, groups in f.side_scans if groups]
        total = sum(
            _rows(splits) * self._catalog[scan.table].row_width(scan.columns)
            for scan, splits in scans
        )
        total += sum(self._stage_bytes.get(i.stage, 0.0) for i in f.inputs.values())
        for sub in f.subqueries.values():
            sub_bytes = self.read_bytes(sub, stages)
            if sub_bytes is None:
                return None
            total += sub_bytes
        return total

    def recomputable(self, f: Frag, copies: int, stages: bool = False) -> bool:
        """True when ``copies`` tasks may each compute ``f`` (one task that reads
        only tables; with ``stages``, other stages too) instead of reading it
        from a stage of its own: the copies beyond the first read at most
        ``recompute_bytes`` (``read_bytes``).

        The stage is a round trip on the path of each reader that waits for
        nothing else (the producer's report, the durable commit, the reader's
        launch and fetch: ~15-25 ms on a 2-core host), where the copies run
        on other cores or hosts at the same time.
        """
        if copies > 1 and computes_volatile(f):
            return False
        read = self.read_bytes(f, stages)
        return read is not None and read * max(0, copies - 1) <= self._recompute_bytes

    def fits(self, host: Frag, guest: Frag) -> bool:
        """True when ``host``'s task may run ``guest``'s too: together they scan at
        most ``fuse_bytes``, or one of them scans nothing that counts (the fused
        task then scans no more than the other alone would)."""
        if self._fuse_bytes is None:
            return True
        host_bytes, guest_bytes = self.task_bytes(host), self.task_bytes(guest)
        return not host_bytes or not guest_bytes or host_bytes + guest_bytes <= self._fuse_bytes

    def fuse(self, host: Frag, guest: Frag) -> Frag:
        """``absorb`` ``guest`` into ``host`` within the bound; past it, a stage of
        ``guest``'s (its one task's output, read whole) instead. Returns what
        ``host`` absorbed: ``guest``, or the fragment that reads its stage."""
        if guest.tasks == 1 and not self.fits(host, guest):
            host_bytes, guest_bytes = self.task_bytes(host), self.task_bytes(guest)
            read, inp = self.read(guest, OutputSpec(OutputKind.SINGLE), InputMode.ALL)
            self.note_apart(inp.stage, host_bytes, guest_bytes)
            keys = [k.copy() for k in guest.hash_keys] if guest.hash_keys is not None else None
            guest = Frag(read, 1, guest.est, inputs={inp.name: inp}, hash_keys=keys, single=True)
        absorb(host, guest)
        return guest

    def note_apart(self, stage: StageId, host_bytes: float, guest_bytes: float) -> None:
        """Say in EXPLAIN that ``stage`` was not fused into its reader's task."""
        self.notes.append(
            f"stage {stage} is not fused into the one task that reads it: with that "
            f"task's {host_bytes / _MIB:.0f} MiB it would scan {guest_bytes / _MIB:.0f} "
            f"MiB more, over the bound of {(self._fuse_bytes or 0) / _MIB:.0f} MiB "
            "(--fuse-bytes); apart, another executor runs it at the same time"
        )

    def _inlinable(self, source: Frag, target: Frag) -> bool:
        if source.scan is None or source.tasks != 1 or len(source.splits) != 1:
            return False
        if target.tasks > 1 and computes_volatile(source):
            return False  # each task would draw its own ``random()``: one stage draws
        if any(
            i.mode is not InputMode.ALL or not name.startswith(PLACEHOLDER_PREFIX)
            for name, i in source.inputs.items()
        ):
            # Only subqueries' stages (a value, a list), read whole: each of the
            # target's tasks reads them, and a join's broadcast side may be big.
            return False
        scans = [source.scan, *(s for s, _ in source.side_scans)]
        read = sum(
            (table := scan_table(self._catalog, s)).row_width(s.columns) * table.rows for s in scans
        )
        if (target.inputs or source.inputs) and read > TINY_SCAN_BYTES:
            # The target waits for other stages anyway; a stage of its own scans
            # the table meanwhile (q18's customers, scanned in the orders task
            # after the IN subquery: 0.63 -> 0.71 s). A small table filtered by a
            # subquery's stage (q83's 21 days of ``date_dim``) is scanned by the
            # target's tasks, which read that stage too: a stage less in a row.
            return False
        return read * max(1, target.tasks) <= self._inline_scan_bytes


def hashed(f: Frag, keys: list[exp.Expr], partitions: int) -> OutputSpec:
    """The output of ``f``'s stage hash-partitioned by ``keys`` (expressions over
    its outputs, rendered over the columns the stage writes)."""
    mapping = {r: exp.column(phys(r), quoted=True) for r in f.node.outputs()}
    key_sql = tuple(sql(rewrite(k, mapping), copy=False) for k in keys)
    return OutputSpec(OutputKind.HASH, partitions, key_sql)


def _pruned(scan: Scan) -> str:
    return scan.pruned.why if scan.pruned is not None else ""


def _same_rows_key(stage: Stage) -> tuple[object, ...]:
    """What a stage computes, but not what its output columns are called: its SQL
    with those names replaced by their positions, its inputs and scans."""
    text = stage.sql
    for i, name in enumerate(stage.columns):
        text = text.replace(sql(exp.column(name, quoted=True)), f'"__out{i}"')
    return (text, stage.inputs, stage.scan, stage.side_scans, stage.output, stage.num_tasks)


def _rows(splits: tuple[FileSplit, ...]) -> int:
    return sum(s.rows for s in splits)


def copy_frag(f: Frag) -> Frag:
    """A fragment of its own to one reader of a producer each reader computes
    again (``StageBuilder.recomputable``): readers add to what it reads, scans
    and computes, and close it, in place. The subqueries it computes are
    copied too; the logical nodes are shared, as no reader changes them."""
    return replace(
        f,
        inputs=dict(f.inputs),
        side_scans=list(f.side_scans),
        equal=dict(f.equal),
        subqueries={name: copy_frag(sub) for name, sub in f.subqueries.items()},
        hash_keys=[k.copy() for k in f.hash_keys] if f.hash_keys is not None else None,
        needed=set(f.needed) if f.needed is not None else None,
    )


def same_inputs(target: Frag, source: Frag) -> bool:
    """True when no input name of ``source`` means another input in ``target``."""
    return all(target.inputs.get(name, inp) == inp for name, inp in source.inputs.items())


def computes_volatile(f: Frag) -> bool:
    """True when ``f``'s task computes an expression whose value may change call
    by call (``logical.volatile``), in its node or in a subquery it computes: it
    is computed by one task, never again by each of several readers."""
    return volatile(f.node) or any(computes_volatile(s) for s in f.subqueries.values())


def one_task(f: Frag) -> bool:
    """True when ``f`` would be a stage of one task: one split at most, whatever
    it reads of other stages (all of them, or the one partition of each)."""
    return f.tasks == 1 and len(f.splits) <= 1


def absorb(host: Frag, guest: Frag) -> None:
    """Make ``host``'s tasks read what ``guest``'s one task reads, so that
    ``host``'s node can hold ``guest``'s: its scan becomes a side scan (one group,
    read whole by every task of ``host``), its side scans, inputs and subqueries
    join ``host``'s. ``finish`` names each scan by its node, so the names stay apart.
    """
    assert guest.scan is None or one_task(guest), "several tasks' splits read as one"
    # Several tasks would each compute them: ``StageBuilder.stage_subqueries``
    # first, unless each may (``StageBuilder.recomputable``: no stage read).
    assert host.tasks == 1 or not any(s.inputs for s in guest.subqueries.values()), (
        "subqueries that read stages in several tasks"
    )
    scans = list(guest.side_scans)
    if guest.scan is not None:
        scans.insert(0, (guest.scan, (guest.splits[0],)))
    for side in scans:
        # A producer each reader computes again (``copy_frag``) may meet the
        # same task twice (TPC-H q15's revenue, joined and read by the subquery
        # of its maximum): its scans are read once, by the one name ``finish``
        # gives each scan node.
        if not any(side[0] is s and side[1] == splits for s, splits in host.side_scans):
            host.side_scans.append(side)
    host.inputs.update(guest.inputs)
    host.subqueries.update(guest.subqueries)


def kept(f: Frag) -> Node:
    """``f``'s node as its stage writes it: only the columns the plan above reads
    cross an exchange (TPC-H q13 shipped o_comment, which only its scan's filter
    reads: 101 MB -> 25 MB), and a subquery's one column."""
    outputs = f.node.outputs()
    if f.needed is not None and f.needed <= set(outputs):
        keep = [r for r in outputs if r in f.needed] or outputs[:1]
        if len(keep) < len(outputs):
            return Keep(f.node, keep)
    return f.node


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
            partial = n.local or n.qualifier.startswith("_pa")
            words.append("partial aggregate" if partial else "aggregate")
        elif isinstance(n, Sort):
            words.append("top-n" if n.limit is not None else "sort")
        elif isinstance(n, (Window, Distinct, SetOp, Opaque, Values)):
            words.append(type(n).__name__.lower() if not isinstance(n, Opaque) else "whole query")

    visit(node)
    return " → ".join(words) or "read"
