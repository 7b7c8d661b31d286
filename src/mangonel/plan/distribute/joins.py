"""Where a join runs: the strategy that moves the fewest (weighted) bytes.

Each strategy is a typed choice (``JoinChoice``), costed with ``costs``:

* ``Shuffle``: hash both sides on the join keys, cast to one type (DuckDB's
  ``hash()`` depends on the type); a side already partitioned on the keys does
  not move, and two such sides join task by task (colocated);
* ``Broadcast``: copy the smaller side (at most ``broadcast_bytes``) into every
  task of the other; a small table is then scanned by those tasks themselves
  instead of in a stage of its own (``StageBuilder.join_in``);
* ``ByRange``: each task of a scan reads only the row groups of the other side's
  table whose key range meets its own (``ranges.KeyRanges.range_join``).

A join without equi keys broadcasts a side the kind allows, or runs in one task.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sqlglot import exp

from mangonel.plan.distribute.costs import BROADCAST_COST, RANGE_REDUCES, SHUFFLE_COST
from mangonel.plan.distribute.keys import KeyTypes, same_keys
from mangonel.plan.distribute.ranges import KeyRanges, Sliced, join_sliced, note_equal
from mangonel.plan.distribute.reductions import Reductions, Spread
from mangonel.plan.distribute.stages import Frag, StageBuilder
from mangonel.plan.estimate import Estimator
from mangonel.plan.logical import Join, JoinKind


class Side(enum.Enum):
    """The side of a join that is brought into the other side's tasks."""

    LEFT = "left"
    RIGHT = "right"


@dataclass(frozen=True)
class Shuffle:
    """Hash-partition the sides that are not yet partitioned on the keys."""

    cost: float
    left_moves: bool
    right_moves: bool
    on: tuple[int, ...] | None = None
    """The positions of the join keys the sides are partitioned on: those a side
    that stays is hashed on already (``_staying``); ``None``: all, in order."""


@dataclass(frozen=True)
class Broadcast:
    """Every task of the other side reads all of ``side``."""

    cost: float
    side: Side


@dataclass(frozen=True)
class ByRange:
    """Every task of the other side scans the row groups of ``side`` its keys may meet."""

    cost: float
    side: Side
    sliced: Sliced


JoinChoice = Shuffle | Broadcast | ByRange


class JoinPlacer:
    """Chooses and builds each join's strategy.

    Args:
        estimator: sizes of logical nodes.
        stages: closes the sides that move into stages.
        keys: key types, for the casts of hashed keys.
        ranges: key ranges of scan tasks.
        reductions: the semi-join reduction of a semi / anti join's far side.
        broadcast_bytes: the biggest side broadcast.
        exchange_fixed: what a side that moves through a hash exchange costs
            besides its bytes (``costs.EXCHANGE_FIXED``; 0: bytes alone).
        spread_reduced: a reduced semi / anti join may run in several tasks
            (``_spread_reduced``): hosts of their own cores run them side by side.
    """

    def __init__(
        self,
        estimator: Estimator,
        stages: StageBuilder,
        keys: KeyTypes,
        ranges: KeyRanges,
        reductions: Reductions,
        broadcast_bytes: int,
        exchange_fixed: float = 0.0,
        spread_reduced: bool = False,
    ) -> None:
        self._estimator = estimator
        self._stages = stages
        self._keys = keys
        self._ranges = ranges
        self._reductions = reductions
        self._broadcast = broadcast_bytes
        self._exchange_fixed = exchange_fixed
        self._spread_reduced_joins = spread_reduced

    def place(self, n: Join, left: Frag, right: Frag) -> Frag:
        """The fragment that joins ``left`` and ``right`` (the planned sides of ``n``)."""
        out = self._join_estimate(n, left, right)
        kind = n.kind
        inner = kind in (JoinKind.INNER, JoinKind.CROSS)
        can_bcast_right = inner or kind in (JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI)
        if not n.left_keys:
            return self._join_without_keys(n, left, right, out)
        ranged: list[ByRange] = []
        if can_bcast_right and (
            r := self._ranges.range_join(left, right, n.left_keys, n.right_keys, inner=inner)
        ):
            ranged.append(ByRange(r[0], Side.RIGHT, r[1]))
        if inner and (
            r := self._ranges.range_join(right, left, n.right_keys, n.left_keys, inner=True)
        ):
            ranged.append(ByRange(r[0], Side.LEFT, r[1]))
        # A side whose key ranges already keep it to the rows it may meet needs no
        # reduction by keys.
        ranged_cheap = any(c.cost <= RANGE_REDUCES * min(left.est, right.est) for c in ranged)
        reduced = (
            kind in (JoinKind.SEMI, JoinKind.ANTI)
            and not ranged_cheap
            and self._reductions.reducible(n, left, right)
        )
        spread: Spread | None = None
        if reduced:
            ranged = []
            spread = self._spread_reduced(n, left, right)
            left, right = self._reductions.reduce_by_keys(n, left, right, spread)
            if spread is not None:
                # The kept side's stage is hashed on the keys; the reduced far
                # side follows, and the join runs task by task.
                moves = Shuffle(SHUFFLE_COST * right.est + self._exchange_fixed, False, True)
                return self._shuffle(n, left, right, spread.keys, spread.far_keys, moves, out)
        lk: list[exp.Expr] | None = None
        left_moves = right_moves = True
        on: tuple[int, ...] | None = None
        if left.hash_keys or right.hash_keys:
            lk, rk = self._keys.cast_keys(left.node, n.left_keys, right.node, n.right_keys)
            left_moves, right_moves, on = _staying(left, lk, right, rk)
        # Bytes each choice moves; a side already hash-partitioned on the keys, or
        # on some of them (an aggregate over a shuffle joined back on its group
        # keys, as in q21; a window's rows joined with themselves on its
        # partition keys and a rank, as in TPC-DS q47) stays where it is, and two
        # such sides join task by task.
        moved = left.est * left_moves + right.est * right_moves
        shuffle = SHUFFLE_COST * moved + self._exchange_fixed * (left_moves + right_moves)
        # Only the smaller side is broadcast: the bigger one, copied into a few
        # tasks of a small side (one, for a small table), would run the whole
        # join in those few tasks. The first of equal costs wins, in this order.
        options: list[JoinChoice] = [Shuffle(shuffle, left_moves, right_moves, on)]
        if can_bcast_right and right.est <= min(self._broadcast, left.est):
            cost = BROADCAST_COST * right.est * left.tasks + self._gathered(left, right)
            options.append(Broadcast(cost, Side.RIGHT))
        if inner and left.est <= min(self._broadcast, right.est):
            cost = BROADCAST_COST * left.est * right.tasks + self._gathered(right, left)
            options.append(Broadcast(cost, Side.LEFT))
        options += ranged
        choice = min(options, key=lambda o: o.cost)
        if (
            (n.broadcast_right or reduced)
            and can_bcast_right
            and right.est <= self._broadcast
            and not isinstance(choice, ByRange)
        ):
            # A reduced far side meets the kept side, read whole by one task, there.
            choice = Broadcast(BROADCAST_COST * right.est * left.tasks, Side.RIGHT)
        if isinstance(choice, ByRange):
            if choice.side is Side.RIGHT:
                target, pair = left, (left.node, choice.sliced.node)
            else:
                target, pair = right, (choice.sliced.node, right.node)
            join_sliced(target, choice.sliced)
            target.node = Join(*pair, kind, n.left_keys, n.right_keys, n.residual)
            target.est = out
            return target
        if isinstance(choice, Broadcast) and choice.side is Side.RIGHT:
            read = self._stages.join_in(left, right)
            left.node = Join(left.node, read, kind, n.left_keys, n.right_keys, n.residual)
            left.est = out
            if inner:
                note_equal(left, n.left_keys, n.right_keys)
            return left
        if isinstance(choice, Broadcast):
            read = self._stages.join_in(right, left)
            right.node = Join(read, right.node, kind, n.left_keys, n.right_keys, n.residual)
            right.est = out
            note_equal(right, n.right_keys, n.left_keys)
            return right
        if lk is None:
            lk, rk = self._keys.cast_keys(left.node, n.left_keys, right.node, n.right_keys)
        return self._shuffle(n, left, right, lk, rk, choice, out)

    def _gathered(self, target: Frag, side: Frag) -> float:
        """What a broadcast of ``side`` into ``target``'s tasks costs besides its
        bytes where ``side`` runs in more tasks than ``target``: an exchange's
        fixed cost (as each side a shuffle moves pays), for the stage that waits
        for all of ``side`` and the join that then runs in fewer tasks. A range
        join, the other way to bring a table into the tasks of the side in more
        of them, has no stage.

        Without it, TPC-H q12 at SF1 on two hosts of one core broadcast the 31k
        filtered line items from their two tasks into the one task of ``orders``
        (1.1 MB of cost, against 2.6 MB for reading ``orders`` by key range in the
        line items' tasks, 9 % of it twice), which then scanned, joined and
        aggregated all 1.5M orders while the other host idled: 0.89 of the time
        with the range join (A/B, 5 runs, 2026-12-07). A side of one task
        broadcast into several pays nothing more: counted there too, it turned
        five TPC-DS SF1 broadcasts (q23, q46, q47, q78, q79) into shuffles, 1.04 to
        1.15 of the time.
        """
        if side.tasks <= target.tasks or self._stages.absorbs(target, side):
            return 0.0
        return self._exchange_fixed

    def _spread_reduced(self, n: Join, left: Frag, right: Frag) -> Spread | None:
        """How a reduced semi / anti join is spread over the hosts' tasks; None
        where it runs in one task, reading the kept side whole.

        One task held the whole join while the other hosts waited (TPC-H SF10 on
        two hosts of one core: q21's anti join 0.42 s, q04's semi join 0.22 s).
        Spread only where hosts run tasks side by side (``spread_reduced``), as
        an exchange of the kept side and reduced far side together would be
        (``StageBuilder.partitions_for``), and where the far side is not already
        hashed on the keys (its tasks would read the kept side's stage both
        whole and by partition).
        """
        if not self._spread_reduced_joins:
            return None
        lk, rk = self._keys.cast_keys(left.node, n.left_keys, right.node, n.right_keys)
        if _hashed_on(right, rk):
            return None
        parts = self._stages.partitions_for(left.est + self._reductions.reduced_bytes(n, right))
        return Spread(lk, rk, parts) if parts > 1 else None

    def _shuffle(
        self,
        n: Join,
        left: Frag,
        right: Frag,
        lk: list[exp.Expr],
        rk: list[exp.Expr],
        choice: Shuffle,
        out: float,
    ) -> Frag:
        """Hash the sides that move into the partitions of the join, then join task by task."""
        left_moves, right_moves = choice.left_moves, choice.right_moves
        if choice.on is not None:
            lk, rk = [lk[i] for i in choice.on], [rk[i] for i in choice.on]
        if not left_moves and not right_moves and left.tasks != right.tasks:
            # Both partitioned on the keys, but into different counts: the
            # smaller side follows the bigger one's partitioning.
            left_moves, right_moves = left.est < right.est, left.est >= right.est
        if left_moves and right_moves:
            parts = self._stages.partitions_for(left.est + right.est)
        else:
            parts = right.tasks if left_moves else left.tasks
        if left_moves:
            left = self._stages.exchange(left, lk, parts)
        if right_moves:
            right = self._stages.exchange(right, rk, parts)
        joined = _colocated_join(n, left, right, lk, rk, self._stages)
        joined.est = out
        return joined

    def _join_without_keys(self, n: Join, left: Frag, right: Frag, out: float) -> Frag:
        """A join on no equality: some side must meet all of the other."""
        kind = n.kind
        inner = kind in (JoinKind.INNER, JoinKind.CROSS)
        if kind in (JoinKind.LEFT, JoinKind.SEMI, JoinKind.ANTI) or (
            inner and left.est >= right.est
        ):
            read = self._stages.join_in(left, right)
            left.node = Join(left.node, read, kind, n.left_keys, n.right_keys, n.residual)
            left.est = out
            return left
        if inner:
            read = self._stages.join_in(right, left)
            right.node = Join(read, right.node, kind, n.left_keys, n.right_keys, n.residual)
            right.est = out
            return right
        # FULL join without equi keys: both sides in one task.
        lg = self._stages.gather(left)
        read = self._stages.join_in(lg, right)
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


def _hashed_on(f: Frag, keys: list[exp.Expr]) -> bool:
    """True when task i of ``f``'s tasks holds exactly the rows whose ``keys`` hash
    to i (modulo its task count)."""
    return (
        f.hash_keys is not None
        and same_keys(f.hash_keys, keys)
        and (f.scan is None or f.tasks == 1)  # one task holds all: hashed into one
    )


def _staying(
    left: Frag, lk: list[exp.Expr], right: Frag, rk: list[exp.Expr]
) -> tuple[bool, bool, tuple[int, ...] | None]:
    """Which sides of a join on ``lk`` = ``rk`` move (are hashed again), and on which
    of the keys the join runs task by task (``Shuffle.on``).

    A side hash-partitioned on some of the join keys holds, in one task, every row
    equal on all of them: it stays, and the other side is hashed on the same keys.
    Two sides hashed on the same ones both stay. Where both are hashed, on
    different keys, the bigger one stays.
    """
    lon, ron = _hashed_within(left, lk), _hashed_within(right, rk)
    if lon is not None and lon == ron:
        return False, False, lon
    if lon is not None and (ron is None or left.est >= right.est):
        return False, True, lon
    if ron is not None:
        return True, False, ron
    return True, True, None


def _hashed_within(f: Frag, keys: list[exp.Expr]) -> tuple[int, ...] | None:
    """The positions in ``keys`` of the keys ``f`` is hash-partitioned on, in the
    order it was hashed on them; ``None`` where it is not hashed on keys all among
    ``keys`` (see ``_hashed_on``). A fragment of one task is hashed on any keys: it
    counts only on all of them, as before (on some, the other side would be hashed
    into its one task where it might have been spread)."""
    if f.tasks == 1:
        return tuple(range(len(keys))) if _hashed_on(f, keys) else None
    if not f.hash_keys or f.scan is not None:
        return None
    noted, equal = f.hash_equal
    also = equal if noted is f.hash_keys else (None,) * len(f.hash_keys)
    on: list[int] = []
    for key, other in zip(f.hash_keys, also, strict=True):
        at = next((i for i, k in enumerate(keys) if i not in on and k in (key, other)), None)
        if at is None:
            return None
        on.append(at)
    return tuple(on)


def _colocated_join(
    n: Join, left: Frag, right: Frag, lk: list[exp.Expr], rk: list[exp.Expr], stages: StageBuilder
) -> Frag:
    """Join two sides hash-partitioned alike on the join keys, task by task."""
    # A side hashed into one partition by one task is that task, within the bound.
    right = stages.fuse(left, right)
    left.node = Join(left.node, right.node, n.kind, n.left_keys, n.right_keys, n.residual)
    left.hash_keys = lk if n.kind is not JoinKind.FULL else None
    if n.kind is JoinKind.INNER:
        # Each row's keys on the right equal its keys on the left: it is hashed
        # on those too (TPC-DS q47 joins v1 with v1_lag, then the result with
        # v1_lead on v1's columns).
        left.hash_equal = (left.hash_keys, tuple(rk))
    return left
