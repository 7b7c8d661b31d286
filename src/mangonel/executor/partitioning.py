"""Hash splitting: a task's result rows sent to their output partitions.

The partition of each row, ``hash(keys) % N``, is computed inside DuckDB, as a
column the fragment's query gets after its own (``hash_sql``); each Arrow batch
of the result then reaches its partitions' files with one stable sort and one
``take`` (``write_split``). DuckDB's ``hash`` depends on the type, which is why
a scan reads each column as the type the planner saw (``scan.scan_sql``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mangonel.executor.failures import TaskFailedError
from mangonel.executor.shuffle_write import PartitionSink
from mangonel.sqltext import identifier
from mangonel.task import FragmentRejected, TaskSpec

PART_COLUMN = "__mangonel_part"
"""The partition-id column ``hash_sql`` adds after the fragment's own."""


def hash_sql(spec: TaskSpec) -> str:
    """The fragment with a partition-id column added after its own columns.

    The alias list renames the fragment's columns to ``spec.columns`` so the
    key expressions (written over those names) bind whatever the fragment
    called them.
    """
    body = spec.sql.strip().rstrip(";")
    aliases = ", ".join(identifier(c) for c in spec.columns)
    keys = ", ".join(spec.output.keys)
    # The newline before ")" ends a trailing "--" comment in the fragment.
    return (
        f"SELECT *, CAST(hash({keys}) % {spec.output.partitions} AS INTEGER) AS {PART_COLUMN}"
        f" FROM (\n{body}\n) AS __mangonel_fragment({aliases})"
    )


def output_schema(schema: pa.Schema, spec: TaskSpec, split: bool) -> pa.Schema:
    """The schema of the task's partition files: the result's columns (less the
    partition id where ``split``) named as the plan names them.

    Raises:
        TaskFailedError: the fragment returns another number of columns than the
            plan expects (``FragmentRejected``: the planner's bug).
    """
    fields = list(schema)[:-1] if split else list(schema)
    if len(fields) != len(spec.columns):
        raise TaskFailedError(
            FragmentRejected(
                f"the fragment returns {len(fields)} columns but the plan expects "
                f"{len(spec.columns)} ({', '.join(spec.columns)})"
            )
        )
    return pa.schema([f.with_name(name) for f, name in zip(fields, spec.columns, strict=True)])


def write_split(sink: PartitionSink, batch: pa.RecordBatch, schema: pa.Schema) -> None:
    """Write one batch's rows to their partitions: one stable sort, then slices."""
    part = batch.column(batch.num_columns - 1)
    data = pa.RecordBatch.from_arrays(batch.columns[:-1], schema=schema)
    # A view of the non-null int32 ids. Array.to_numpy and pa.array(ndarray)
    # would import pandas (0.5 s on the first task), so numpy only counts.
    ids = np.frombuffer(part.buffers()[1], dtype=np.int32, count=len(part), offset=part.offset * 4)
    counts = np.bincount(ids, minlength=sink.partitions)
    if np.count_nonzero(counts) == 1:
        sink.write_batch(int(np.flatnonzero(counts)[0]), data)
        return
    # Arrow's sort is stable. Its indices are a permutation of the batch's own
    # rows, so the take's bounds check (a sixth of its time) can find nothing.
    ordered = pc.take(data, pc.sort_indices(part), boundscheck=False)
    start = 0
    for p, count in enumerate(counts.tolist()):
        if count:
            sink.write_batch(p, ordered.slice(start, count))
            start += count
