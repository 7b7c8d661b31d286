"""Running one task: register its inputs in DuckDB, run its SQL, write its output.

A ``TaskRunner`` is one task slot of an executor. It owns one DuckDB database
(so ``memory_limit`` and ``threads`` are per slot, and a slot spills into its
own ``temp_directory``) and runs one ``TaskSpec`` at a time:

1. register the inputs under their names: the scan's Parquet splits (read with
   pyarrow, only the needed columns) and every upstream stage's partitions
   (read with the ``ShuffleReader``: memory-mapped or over Flight);
2. run the fragment and stream its result as Arrow batches;
3. split the batches by the output spec (``hash(keys) % N`` computed inside
   DuckDB, rows moved with one ``take`` per batch) into the task's partition
   files, every partition written even when empty;
4. unregister everything, whether the task succeeded or not.

User SQL reaches this DuckDB, so after configuring it the runner turns off
external access (no file, network or extension access from SQL; registered
Arrow tables still work) and locks the configuration (no ``SET`` from SQL).

Every failure leaves as ``TaskFailedError`` with a typed ``TaskFailure``
(see ``failures.py``), or ``TaskCancelledError`` after ``cancel()``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mangonel.executor.failures import (
    TaskCancelledError,
    TaskFailedError,
    classify,
)
from mangonel.executor.shuffle import PartitionSink, ShuffleReader, ShuffleWriter
from mangonel.ids import TaskAttemptId
from mangonel.plan.physical import FileSplit, OutputKind
from mangonel.scheduler.events import InputLocations, PartitionOutput, QueryError, TaskSpec

log = logging.getLogger(__name__)

_PART_COLUMN = "__mangonel_part"
_ROWS_COLUMN = "__mangonel_rows"
"""Stand-in column for a scan of no columns: DuckDB cannot register a table without any."""

_INTERRUPT_REPEAT_S = 0.05

BATCH_ROWS = 1_000_000
"""Rows per Arrow batch pulled from DuckDB; each is split and written at once."""


class TaskRunner:
    """One task slot: a DuckDB database and the code that runs a task in it.

    Not thread-safe: one task at a time. ``cancel()`` may be called from any
    thread.

    Args:
        writer: Writes the output partition files, unless ``run`` is given one.
        reader: Reads upstream partitions.
        spill_dir: DuckDB ``temp_directory`` of this slot (created if missing).
        memory_limit: DuckDB ``memory_limit``, e.g. ``"1GB"``; ``None`` keeps
            DuckDB's default.
        threads: DuckDB threads.
    """

    def __init__(
        self,
        writer: ShuffleWriter | None,
        reader: ShuffleReader,
        spill_dir: str,
        memory_limit: str | None = None,
        threads: int = 1,
    ) -> None:
        self.writer = writer
        self.reader = reader
        # Cancellation names an attempt, so a cancel that arrives late (after
        # its task ended) can never stop the next task of this slot.
        self._lock = threading.Lock()
        self._active: TaskAttemptId | None = None
        self._cancel: TaskAttemptId | None = None
        os.makedirs(spill_dir, exist_ok=True)
        self._con = _locked_connection(spill_dir, memory_limit, threads)

    def run(
        self, spec: TaskSpec, writer: ShuffleWriter | None = None
    ) -> tuple[PartitionOutput, ...]:
        """Run one task attempt and return its output partitions, in order.

        Args:
            spec: The attempt.
            writer: Where its output goes; the slot's own writer when ``None``
                (the executor passes the writer of the life the task belongs to).

        Raises:
            TaskFailedError: the task failed; ``failure`` says why.
            TaskCancelledError: ``cancel()`` was called while it ran.
        """
        with self._lock:
            self._active = spec.attempt
        registered: list[str] = []
        try:
            self._check_cancelled()
            if spec.scan_name:
                self._register(spec.scan_name, _read_scan(spec), registered)
            for inp in spec.inputs:
                self._check_cancelled()
                self._register(inp.name, self._read_input(inp), registered)
            self._check_cancelled()
            target = writer or self.writer
            if target is None:
                raise TypeError("TaskRunner.run needs a writer: none given and none by default")
            return self._execute(spec, target)
        except TaskCancelledError:
            raise
        except Exception as exc:
            if self._is_cancelled():
                raise TaskCancelledError(str(spec.attempt)) from exc
            if isinstance(exc, TaskFailedError):
                raise
            raise TaskFailedError(classify(exc)) from exc
        finally:
            for name in registered:
                try:
                    self._con.unregister(name)
                except duckdb.Error:  # must not hide the task's own outcome
                    log.exception("unregistering %s failed", name)
            with self._lock:
                self._active = None

    def cancel(self, attempt: TaskAttemptId | None = None) -> None:
        """Stop a task of this slot: it raises ``TaskCancelledError``.

        Args:
            attempt: The attempt to stop: the running one, or the next one this
                slot starts (the caller may cancel a task it has handed to this
                slot before the slot began it). ``None`` means whatever runs now.
        """
        with self._lock:
            target = attempt if attempt is not None else self._active
            if target is None:
                return
            self._cancel = target
            if target != self._active:
                return
            self._con.interrupt()
        # DuckDB forgets an interrupt that lands between two statements (each
        # query start clears it), so repeat it until the task has stopped.
        threading.Thread(
            target=self._keep_interrupting, args=(target,), name="cancel", daemon=True
        ).start()

    def _keep_interrupting(self, target: TaskAttemptId) -> None:
        while True:
            time.sleep(_INTERRUPT_REPEAT_S)
            with self._lock:
                if self._active != target:
                    return
                self._con.interrupt()

    @property
    def active(self) -> TaskAttemptId | None:
        """The attempt running now, if any."""
        return self._active

    def close(self) -> None:
        """Close the DuckDB database."""
        self._con.close()

    # ---------------------------------------------------------------- inputs

    def _register(self, name: str, table: pa.Table, registered: list[str]) -> None:
        self._con.register(name, table)
        registered.append(name)

    def _read_input(self, inp: InputLocations) -> pa.Table:
        if inp.locations:
            return self.reader.read_many(inp.locations)
        # No map task wrote anything (an upstream stage of no tasks): all the
        # runner knows is the column names, so the columns are NULL-typed.
        return pa.table({c: pa.nulls(0) for c in inp.columns or (_ROWS_COLUMN,)})

    # ---------------------------------------------------------------- output

    def _execute(self, spec: TaskSpec, writer: ShuffleWriter) -> tuple[PartitionOutput, ...]:
        output = spec.output
        if output.kind is OutputKind.HASH and output.partitions > 1:
            sql, partitions = _hash_sql(spec), output.partitions
        else:
            # SINGLE runs the fragment untouched: wrapping it in a subquery
            # could lose its ORDER BY.
            sql, partitions = spec.sql, 1
        relation = self._con.sql(sql)
        if relation is None:
            raise TaskFailedError(QueryError(f"the fragment is not a query: {spec.sql!r}"))
        # The stream must be closed on every path: an open result blocks the
        # connection ("connection has an open result") for the next task.
        with relation.to_arrow_reader(BATCH_ROWS) as stream:
            split = partitions > 1
            schema = _output_schema(stream.schema, spec, split)
            with writer.open(spec.attempt, partitions, schema) as sink:
                for batch in self._batches(stream):
                    if split:
                        _write_split(sink, batch, schema)
                    else:
                        sink.write_batch(
                            0, pa.RecordBatch.from_arrays(batch.columns, schema=schema)
                        )
                self._check_cancelled()
                return sink.commit()

    def _batches(self, stream: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        for batch in stream:
            self._check_cancelled()
            yield batch

    def _is_cancelled(self) -> bool:
        with self._lock:
            return self._cancel is not None and self._cancel == self._active

    def _check_cancelled(self) -> None:
        if self._is_cancelled():
            raise TaskCancelledError(f"task {self._active} was cancelled")


def _locked_connection(
    spill_dir: str, memory_limit: str | None, threads: int
) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(database=":memory:")
    con.execute(f"SET threads = {int(threads)}")
    con.execute("SET temp_directory = ?", [spill_dir])
    if memory_limit is not None:
        con.execute("SET memory_limit = ?", [memory_limit])
    # It prints to stdout in a long query; an executor's stdout is a log.
    con.execute("SET enable_progress_bar = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    # Last: after these two, SQL can reach no file and change no setting.
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _read_scan(spec: TaskSpec) -> pa.Table:
    columns = list(spec.scan_columns)
    tables = [_read_split(split, columns) for split in spec.scan_splits]
    if not tables:
        return pa.table({c: pa.nulls(0) for c in columns or [_ROWS_COLUMN]})
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    if not columns:
        # count(*) and the like read no column; keep the row count.
        table = pa.table({_ROWS_COLUMN: pa.nulls(table.num_rows)})
    return table


def _read_split(split: FileSplit, columns: list[str]) -> pa.Table:
    parquet = pq.ParquetFile(split.path)
    if split.row_groups:
        return parquet.read_row_groups(list(split.row_groups), columns=columns)
    return parquet.read(columns=columns)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _hash_sql(spec: TaskSpec) -> str:
    """The fragment with a partition-id column added after its own columns.

    The alias list renames the fragment's columns to ``spec.columns`` so the
    key expressions (written over those names) bind whatever the fragment
    called them.
    """
    body = spec.sql.strip().rstrip(";")
    aliases = ", ".join(_quote(c) for c in spec.columns)
    keys = ", ".join(spec.output.keys)
    # The newline before ")" ends a trailing "--" comment in the fragment.
    return (
        f"SELECT *, CAST(hash({keys}) % {spec.output.partitions} AS INTEGER) AS {_PART_COLUMN}"
        f" FROM (\n{body}\n) AS __mangonel_fragment({aliases})"
    )


def _output_schema(schema: pa.Schema, spec: TaskSpec, split: bool) -> pa.Schema:
    fields = list(schema)[:-1] if split else list(schema)
    if len(fields) != len(spec.columns):
        raise TaskFailedError(
            QueryError(
                f"the fragment returns {len(fields)} columns but the plan expects "
                f"{len(spec.columns)} ({', '.join(spec.columns)})"
            )
        )
    return pa.schema([f.with_name(name) for f, name in zip(fields, spec.columns, strict=True)])


def _write_split(sink: PartitionSink, batch: pa.RecordBatch, schema: pa.Schema) -> None:
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
    ordered = data.take(pc.sort_indices(part))  # Arrow's sort is stable
    start = 0
    for p, count in enumerate(counts.tolist()):
        if count:
            sink.write_batch(p, ordered.slice(start, count))
            start += count
