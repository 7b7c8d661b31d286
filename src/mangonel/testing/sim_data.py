"""What simulated tasks compute: each output a checksum of exactly the inputs it read.

The whole-cluster simulator (``testing.cluster_sim``) runs no SQL. A task's
output partitions are numbers (modulo a large prime) that depend only on its
stage, on which partitions of which upstream outputs it read and on their
values, so a recomputation that read a wrong file, a partition read twice or
not at all, or a reader handed another partition's files ends in a final value
that differs from ``expected_result`` (computed once, as if nothing failed).

The functions are chosen so the answer does not depend on how a reader stage
was split into tasks (adaptive coalescing may give one task several
partitions): a reader's output is a sum over the partitions it read, and the
next stage sums again.

>>> from mangonel.testing.scheduler_sim import synthetic_plan
>>> expected_result(synthetic_plan(9, 3)) == expected_result(synthetic_plan(9, 3))
True
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable

from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.task import InputMode, OutputKind, PartitionLocation

MODULUS = (1 << 61) - 1


def mix(*parts: object) -> int:
    """A number for ``parts``, the same in every process and run."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % MODULUS


def scan_outputs(stage: Stage, task: int) -> dict[int, int]:
    """Output partition -> value of task ``task`` of a stage that reads no other stage."""
    base = mix("scan", int(stage.id), task)
    return _split(stage, [base])


def reader_outputs(
    stage: Stage, read: Iterable[tuple[str, InputMode, PartitionLocation, int]]
) -> dict[int, int]:
    """Output partition -> value of a task that read ``read``: (input name, mode,
    location, the value found in its file)."""
    by_partition: dict[tuple[str, int], int] = defaultdict(int)
    whole: dict[str, int] = defaultdict(int)
    partitions: set[int] = set()
    for name, mode, loc, value in read:
        if mode is InputMode.PARTITION:
            key = (name, loc.partition)
            by_partition[key] = (by_partition[key] + value) % MODULUS
            partitions.add(loc.partition)
        else:
            whole[name] = (whole[name] + value) % MODULUS
    names = sorted({i.name for i in stage.inputs if i.mode is InputMode.PARTITION})
    all_part = tuple(sorted(whole.items()))
    rows = [
        mix("row", p, tuple(by_partition.get((n, p), 0) for n in names), all_part)
        for p in sorted(partitions)
    ] or [mix("row", -1, all_part)]
    return _split(stage, rows)


def _split(stage: Stage, rows: list[int]) -> dict[int, int]:
    if stage.output.kind is OutputKind.HASH:
        return {
            q: sum(mix(row, q) for row in rows) % MODULUS for q in range(stage.output.partitions)
        }
    return {0: sum(rows) % MODULUS}


def output_bytes(stage: int, map_partition: int, partition: int) -> int:
    """A file's size: the same for every attempt, varied enough that adaptive
    coalescing groups partitions in different ways."""
    return 20 + mix("bytes", stage, map_partition, partition) % 280


def expected_result(plan: DistributedPlan) -> tuple[int, ...]:
    """The final stage's output values, partition by partition, when every task
    ran once as planned (task *i* of a reader reads partition *i*)."""
    values = _fault_free(plan)
    final = plan.stages[-1]
    return tuple(
        values[(int(final.id), t, p)]
        for t in range(final.num_tasks)
        for p in sorted({p for (s, tt, p) in values if s == int(final.id) and tt == t})
    )


def stage_total(plan: DistributedPlan, stage: int) -> int:
    """The sum of stage ``stage``'s output values when every task ran once as
    planned: what a write statement's files hold in all, whichever tasks (one
    per partition, or fewer that adaptive execution gave several) wrote them.

    >>> from mangonel.testing.scheduler_sim import synthetic_plan
    >>> plan = synthetic_plan(9, 3)
    >>> stage_total(plan, 4) == sum(expected_result(plan)) % MODULUS
    True
    """
    return sum(v for (s, _, _), v in _fault_free(plan).items() if s == stage) % MODULUS


def _fault_free(plan: DistributedPlan) -> dict[tuple[int, int, int], int]:
    """(stage, map task, partition) -> value, every task run once as planned."""
    values: dict[tuple[int, int, int], int] = {}
    for stage in plan.stages:
        for task in range(stage.num_tasks):
            if not stage.inputs:
                out = scan_outputs(stage, task)
            else:
                read = []
                for inp in stage.inputs:
                    for (sid, m, p), v in values.items():
                        if sid != int(inp.stage):
                            continue
                        if inp.mode is InputMode.PARTITION and p != task:
                            continue
                        loc = PartitionLocation(
                            executor=None,  # type: ignore[arg-type]
                            host="",
                            flight_address="",
                            stage=inp.stage,
                            map_partition=m,
                            partition=p,
                            path="",
                            rows=0,
                            bytes=0,
                            checksum="",
                        )
                        read.append((inp.name, inp.mode, loc, v))
                out = reader_outputs(stage, read)
            for p, v in out.items():
                values[(int(stage.id), task, p)] = v
    return values


def encode_value(value: int) -> str:
    return format(value, "x")


def decode_value(checksum: str) -> int:
    return int(checksum, 16)
