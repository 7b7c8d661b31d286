"""Nodes the plan reads more than once, and the columns each node's readers need.

A CTE that aggregates (or joins with a filter), read twice, is one node under two
parents (``plan.bind``); it is computed once, in a stage of its own that each
reader reads (``SharedNodes.materialize``), and the nodes under it are never
rewritten for one reader (``SharedNodes.under_shared``). The analysis runs once per query, over the
query and its subqueries together: a node they share gets the columns all its
readers need.

Nodes are keyed by themselves: logical nodes compare and hash by identity
(``eq=False`` dataclasses), and a key holds its node alive.
"""

from __future__ import annotations

from sqlglot import exp

from mangonel.plan.distribute.stages import Frag, StageBuilder, copy_frag
from mangonel.plan.fragment import rewrite, sql
from mangonel.plan.logical import (
    Node,
    Ref,
    StageRead,
    expressions,
    phys,
    required_columns,
    walk,
    walk_once,
)
from mangonel.plan.physical import StageInput
from mangonel.sql.exprs import PLACEHOLDER_PREFIX
from mangonel.task import InputMode, OutputKind, OutputSpec


class SharedNodes:
    """What the plan shares, and the stages shared nodes were closed into."""

    def __init__(self, stages: StageBuilder) -> None:
        self._stages = stages
        self.analyzed = False
        self._needed: dict[Node, set[Ref]] = {}
        self._shared: set[Node] = set()
        """Nodes with more than one parent (a CTE read twice)."""
        self._under_shared: set[Node] = set()
        """Shared nodes and every node under them: planned once, never changed."""
        self._placeholder_readers: dict[str, int] = {}
        """Subquery placeholders: how many nodes name each."""
        self._parents: dict[Node, int] = {}
        self._materialized: dict[Node, tuple[Frag, StageRead, StageInput]] = {}
        """Shared nodes closed into a stage: the fragment as it was, and how to read it."""
        self._recomputed: dict[Node, Frag] = {}
        """Shared nodes each reader computes again: the fragment each gets a copy of."""

    def analyze(self, trees: list[Node]) -> None:
        """Find the shared nodes and the needed columns of every node of ``trees``
        (the query and its subqueries)."""
        self.analyzed = True
        parents: dict[Node, int] = {}
        for tree in trees:
            for node, cols in required_columns(tree).items():
                self._needed[node] = self._needed.get(node, set()) | cols
            _count_parents(tree, parents)
        self._shared = {node for node, n in parents.items() if n > 1}
        self._parents = parents
        for node in walk_once(trees):
            self._count_readers(list(expressions(node)))
        for tree in trees:
            for node in walk(tree):
                if node in self._shared:
                    self._under_shared.update(walk(node))

    def needed(self, node: Node) -> set[Ref] | None:
        """The columns of ``node`` its readers need; None for a node the analysis
        did not see (made while planning): all."""
        return self._needed.get(node)

    def _count_readers(self, exprs: list[exp.Expr]) -> None:
        """One reader more for each placeholder some of ``exprs`` (one node's) read."""
        names = {
            t.name
            for e in exprs
            for t in e.find_all(exp.Table)
            if t.name.startswith(PLACEHOLDER_PREFIX)
        }
        for name in names:
            self._placeholder_readers[name] = self._placeholder_readers.get(name, 0) + 1

    def read_again(self, condition: exp.Expr) -> None:
        """A node made while planning reads ``condition`` (a semi-join reduction's
        copy of a filter): the subqueries it names have one reader more."""
        self._count_readers([condition])

    def read_once(self, placeholder: str) -> bool:
        """True when one node of the plan reads the subquery ``placeholder`` (one
        more for each node the planner copied a reading filter into: ``read_again``)."""
        return self._placeholder_readers.get(placeholder, 0) == 1

    def readers(self, placeholder: str) -> int:
        """How many nodes of the plan read the subquery ``placeholder`` (``read_once``)."""
        return self._placeholder_readers.get(placeholder, 0)

    def is_shared(self, node: Node) -> bool:
        return node in self._shared

    def under_shared(self, node: Node) -> bool:
        """True for a shared node or one under it: its other readers need it as is."""
        return node in self._under_shared

    def materialized(self, node: Node) -> Frag | None:
        """A fragment that reads the stage ``node`` was closed into, if it was
        (or a copy of its fragment, where each reader computes it again)."""
        if node in self._recomputed:
            return copy_frag(self._recomputed[node])
        if node not in self._materialized:
            return None
        f, read, inp = self._materialized[node]
        return Frag(
            read,
            f.tasks,
            f.est,
            inputs={inp.name: inp},
            hash_keys=[k.copy() for k in f.hash_keys] if f.hash_keys is not None else None,
            single=f.single,
            needed=f.needed,
        )

    def materialize(self, node: Node, f: Frag) -> Frag:
        """Close a node several parents read (a CTE that aggregates, read twice) into a
        stage of its own, which each of them reads: partitioned as the node was (task
        i of a reader reads partition i), else whole, in one task.

        A node of one task that scans no table, whose copies beyond the first
        read little (``StageBuilder.recomputable``, the stages it reads counted)
        is computed by each reader instead: TPC-H q15's ``revenue`` (the final
        aggregate of 10k suppliers' partial sums), read by the join and by the
        subquery of its maximum, was a stage of one task between the partial
        aggregate and the final task, which computes both. Not one that scans
        tables: its readers are often one task (a CTE and the correlated
        subquery over it, TPC-DS q01, q30, q81), which would scan and aggregate
        them twice on the query's path, where DuckDB alone computes such a CTE
        once.
        """
        if (
            f.single
            and not _scans(f)
            and self._stages.recomputable(f, self._parents.get(node, 2), stages=True)
        ):
            # Hashed into one partition or not, a copy is read as the stage
            # would be: whole, by whichever task reads it.
            f.hash_keys = None
            self._recomputed[node] = f
            return copy_frag(f)
        if f.hash_keys is not None and not f.single:
            mapping = {r: exp.column(phys(r), quoted=True) for r in f.node.outputs()}
            keys = tuple(sql(rewrite(k, mapping), copy=False) for k in f.hash_keys)
            out = OutputSpec(OutputKind.HASH, f.tasks, keys)
            read, inp = self._stages.read(f, out, InputMode.PARTITION)
            kept = Frag(read, f.tasks, f.est, hash_keys=f.hash_keys, needed=f.needed)
        else:
            read, inp = self._stages.read(f, OutputSpec(OutputKind.SINGLE), InputMode.ALL)
            kept = Frag(read, 1, f.est, single=True, needed=f.needed)
        self._materialized[node] = (kept, read, inp)
        materialized = self.materialized(node)
        assert materialized is not None
        return materialized


def _scans(f: Frag) -> bool:
    """True when ``f``'s task scans a table, itself or in a subquery it computes."""
    return (
        f.scan is not None
        or bool(f.side_scans)
        or any(_scans(sub) for sub in f.subqueries.values())
    )


def _count_parents(node: Node, parents: dict[Node, int]) -> None:
    """Add how many parents each node under ``node`` has (each subtree walked once)."""
    for child in node.children():
        parents[child] = parents.get(child, 0) + 1
        if parents[child] == 1:
            _count_parents(child, parents)
