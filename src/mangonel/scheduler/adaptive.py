"""Adaptive execution: a stage that has not started, re-planned from real sizes.

The planner sizes every hash exchange from estimates. Once the map tasks of an
exchange are done, the scheduler knows the bytes of each of its partitions, and
a reader stage that has not launched a task yet may run as fewer tasks than
planned: reader task *j* reads the contiguous partitions ``[a_j, b_j)`` of every
map task instead of partition *j* alone (Spark's AQE "coalesce shuffle
partitions"). This module holds the pure decisions; ``SchedulerState`` applies
them (``JobRecord.coalesce``) and the store keeps the result (``StageProgress.bounds``).

Recovery composes by construction: the map side's partitioning never changes, so
a map task made again after a loss writes the same N partitions its coalesced
readers expect.

Which stages may be coalesced (``coalescible``): only those whose task *i* has
nothing of its own but partition *i* of its hash-exchange inputs. A stage that
scans a table (task *i* reads split group *i*) or scans a side table by key
range (group *i* a task) keeps task *i* ↔ partition *i*; so does one whose
partitioned input is not an N-way hash exchange of its N tasks.

How big a coalesced task is (``target_bytes``): about
``Limits.adaptive_partition_bytes`` (64 MiB, the planner's own
``PARTITION_BYTES``), but no bigger than the total split evenly over the alive
slots, so coalescing never leaves slots idle that the planned tasks would have
kept busy; and no smaller than ``Limits.adaptive_min_partition_bytes`` (4 MiB):
below that a task's fixed cost (a launch, a DuckDB query, a report and a durable
commit, a few milliseconds each) outweighs the parallelism it buys. Spark's
"parallelism first" default makes the same trade with 1 MB; ours is higher since
a task here costs more than a Spark task's thread.

>>> coalesce([10, 10, 10, 10], target=25)
(0, 2)
>>> coalesce([100, 0, 0, 100], target=64)
(0, 1)
>>> coalesce([5, 5], target=64)
(0,)
"""

from __future__ import annotations

from collections.abc import Sequence

from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.task import InputMode, OutputKind

SMALL_GROUP_FACTOR = 0.2
"""A last group under this fraction of the target joins the group before it
(Spark's ``SMALL_PARTITION_FACTOR``): one tiny task costs a launch for nothing."""


def coalescible(stage: Stage, plan: DistributedPlan) -> bool:
    """Whether ``stage``'s tasks may each read a range of partitions instead of one.

    True for a stage of several tasks with no scan of its own, whose side scans
    (if any) are read whole by every task, and whose inputs are broadcasts
    (``InputMode.ALL``, the same for any task) or hash exchanges into exactly
    its ``num_tasks`` partitions, at least one of them.
    """
    if stage.num_tasks < 2 or stage.scan is not None:
        return False
    if any(len(side.task_splits) != 1 for side in stage.side_scans):
        return False  # a join by key range: task i reads the row groups of range i
    partitioned = [i for i in stage.inputs if i.mode is InputMode.PARTITION]
    if not partitioned:
        return False
    for inp in partitioned:
        output = plan.stage(inp.stage).output
        if output.kind is not OutputKind.HASH or output.partitions != stage.num_tasks:
            return False
    return True


def target_bytes(total: int, slots: int, advisory: int, minimum: int) -> int:
    """Bytes of input one coalesced task should read (see the module's docstring).

    >>> target_bytes(total=800, slots=8, advisory=64, minimum=4)
    64
    >>> target_bytes(total=80, slots=8, advisory=64, minimum=4)
    10
    >>> target_bytes(total=8, slots=8, advisory=64, minimum=4)
    4
    """
    even = -(-total // max(1, slots))
    return max(1, min(advisory, max(minimum, even)))


def coalesce(sizes: Sequence[int], target: int) -> tuple[int, ...]:
    """Group partitions into contiguous ranges of about ``target`` bytes.

    ``sizes[p]`` is what partition ``p`` holds over every map task of every
    partitioned input. Returns the first partition of each range (ranges end
    where the next begins, the last at ``len(sizes)``). A partition bigger than
    the target stays alone; it is never split (that would be skew handling,
    which must also change what the other side of a join reads).
    """
    if not sizes:
        return ()
    starts = [0]
    held = 0
    for p, size in enumerate(sizes):
        if p and held and held + size > target:
            starts.append(p)
            held = 0
        held += size
    if len(starts) > 1 and held < SMALL_GROUP_FACTOR * target:
        starts.pop()
    return tuple(starts)


def ranges(bounds: Sequence[int], partitions: int) -> list[range]:
    """The partitions of each task: ``bounds`` as ``coalesce`` returns them.

    >>> ranges((0, 2), 5)
    [range(0, 2), range(2, 5)]
    >>> ranges((), 5)
    []
    """
    if not bounds:
        return []
    ends = [*bounds[1:], partitions]
    return [range(a, b) for a, b in zip(bounds, ends, strict=True)]
