"""Running one task: register its inputs in DuckDB, run its SQL, write its output.

A ``TaskRunner`` is one task slot of an executor. It owns one DuckDB database
(so ``memory_limit`` and ``threads`` are per slot: the slot's share of the
executor's budget, ``executor.memory.SlotBudget``) and runs one ``TaskSpec`` at
a time. The slot's ``temp_directory``, capped at its part of the spill budget
(``max_temp_directory_size``), is the running task's: one task at a time spills
there, DuckDB deletes its files when the query ends, and the runner logs how
much the task spilled at most (``executor.spill``). The steps:

1. make the inputs readable under their names: the scan's Parquet splits and
   the other tables the task scans (small ones whole, or the row groups of a
   join by key range; each a CTE in front of the fragment
   over DuckDB's own Parquet reader, only the needed columns and the split's
   row groups, so the fragment's filters and projections reach the reader:
   ``executor.scan``) and every upstream stage's partitions (read with the
   ``ShuffleReader``: memory-mapped or over Flight);
2. run the fragment and stream its result as Arrow batches;
3. split the batches by the output spec (``hash(keys) % N`` computed inside
   DuckDB, rows moved with one ``take`` per batch: ``executor.partitioning``)
   into the task's partition files, every partition written even when empty;
4. unregister everything, whether the task succeeded or not.

Each step is marked on the task's ``PhaseClock`` (``executor.phases``: setup, fetch,
execute, write, cleanup), whose times go with the task's report.

User SQL reaches the slot's databases, which are locked down: no file, network
or extension access, no ``SET`` from SQL; a task that scans runs in a scan
database that may read exactly its job's files (``executor.databases``).
``warm_up`` pays the process's first use of DuckDB and pyarrow at start, not
in its first task.

Every failure leaves as ``TaskFailedError`` with a typed ``TaskFailure``
(see ``failures.py``), or ``TaskCancelledError`` after ``cancel()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mangonel import storage, textfiles
from mangonel.executor.arrow_types import PlainTypes
from mangonel.executor.databases import ScanDatabases, locked_connection
from mangonel.executor.failures import (
    TaskCancelledError,
    TaskFailedError,
    classify,
    write_target_full,
)
from mangonel.executor.hooks import NO_HOOKS, TaskHooks
from mangonel.executor.memory import (
    SlotBudget,
    format_size,
    parse_size,
    release_duckdb_memory,
)
from mangonel.executor.partitioning import hash_sql, output_schema, write_split
from mangonel.executor.phases import Phase, PhaseClock
from mangonel.executor.scan import (
    ROWS_COLUMN,
    column_types,
    learn_ahead,
    metadata,
    read_scan,
    scan_sql,
)
from mangonel.executor.shuffle import ShuffleReader
from mangonel.executor.shuffle_write import ShuffleWriter
from mangonel.executor.sink import write_rows
from mangonel.executor.spill import SpillWatch
from mangonel.ids import TaskAttemptId
from mangonel.output import discard_attempt
from mangonel.sqltext import identifier, literal
from mangonel.task import (
    FileSplit,
    FragmentRejected,
    InputLocations,
    OutputKind,
    PartitionOutput,
    SinkSpec,
    TaskSpec,
)

log = logging.getLogger(__name__)

_INTERRUPT_REPEAT_S = 0.05

_WITH = re.compile(r"\s*with\b", re.IGNORECASE)
"""A fragment that starts with its own WITH clause."""
_ANY_WITH = re.compile(r"\bwith\b", re.IGNORECASE)
"""A WITH anywhere in a fragment (or in a literal: then its inputs are read whole)."""

BATCH_ROWS = 131_072
"""Rows per Arrow batch pulled from DuckDB; each is split and written at once.

Measured on the map tasks of a shuffle-heavy query (SF1 ``lineitem`` and
``orders`` hash-partitioned, 276 MB written, one slot, glibc's defaults):
0.79 CPU-s with 1M-row batches, 0.56 to 0.58 with 256k and 128k, 0.60 with
64k. Most of it was page faults, 93,000 per run with 1M rows against 3,200
with 128k: DuckDB grows each batch's buffers with ``realloc`` and glibc handed
a big batch's memory back to the kernel (see ``memory.keep_batch_memory``). With
``keep_batch_memory`` in force, on 2 executors, the query still took 0.65 s
with 1M-row batches against 0.575 s with 128k.
"""


class TaskRunner:
    """One task slot: a DuckDB database and the code that runs a task in it.

    Not thread-safe: one task at a time. ``cancel()`` may be called from any
    thread.

    Args:
        writer: Writes the output partition files, unless ``run`` is given one.
        reader: Reads upstream partitions.
        spill_dir: DuckDB ``temp_directory`` of this slot (created if missing).
        budget: The slot's DuckDB ``memory_limit`` and ``max_temp_directory_size``,
            and the executor budget they are a share of (named when a task runs
            out of memory); a size such as ``"1GB"`` sets the memory limit alone;
            ``None`` keeps DuckDB's defaults.
        threads: DuckDB threads.
    """

    def __init__(
        self,
        writer: ShuffleWriter | None,
        reader: ShuffleReader,
        spill_dir: str,
        budget: SlotBudget | str | None = None,
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
        self._spill_dir = spill_dir
        if isinstance(budget, str):
            size = parse_size(budget)
            budget = SlotBudget(size, None, size, 1, "memory limit")
        self.budget = budget
        self._threads = threads
        self._con = locked_connection(spill_dir, budget, threads)
        self._running_con = self._con
        """The database the active task runs in (what ``cancel`` interrupts)."""
        self._spill_watch = SpillWatch(spill_dir)
        self.hooks: TaskHooks = NO_HOOKS
        """Test hooks (``executor.hooks``); the executor gives its own."""
        self._scans = ScanDatabases(spill_dir, budget, threads)
        self._plain = PlainTypes(spill_dir, budget)
        self._job_files_of: tuple[tuple[str, ...], frozenset[str]] = ((), frozenset())

    def run(
        self,
        spec: TaskSpec,
        writer: ShuffleWriter | None = None,
        clock: PhaseClock | None = None,
    ) -> tuple[PartitionOutput, ...]:
        """Run one task attempt and return its output partitions, in order.

        Args:
            spec: The attempt.
            writer: Where its output goes; the slot's own writer when ``None``
                (the executor passes the writer of the life the task belongs to).
            clock: Marked at each change of phase (setup, fetch, execute, write,
                cleanup), with what the task read and wrote; for its report.

        Raises:
            TaskFailedError: the task failed; ``failure`` says why.
            TaskCancelledError: ``cancel()`` was called while it ran.
        """
        clock = clock if clock is not None else PhaseClock()
        clock.switch(Phase.SETUP)
        with self._lock:
            self._active = spec.attempt
            # Under the lock: a cancel of this attempt that comes after this
            # line reaches the reader, and none of an earlier task lingers.
            self.reader.reset()
        registered: list[str] = []
        streams: list[pa.RecordBatchReader] = []
        views: list[str] = []
        opened: list[storage.ObjectFile] = []
        con = self._con
        self._spill_watch.start()
        try:
            self._check_cancelled()
            sqls = {s.name: scan_sql(s.columns, s.splits) for s in spec.scans}
            native = [s for s in spec.scans if sqls[s.name] is not None]
            if native or spec.whole_query:
                con = self._scan_connection(
                    [split for s in native for split in s.splits],
                    spec.job_files,
                    spec.whole_query,
                )
                with self._lock:
                    self._running_con = con
            # The reads go in front of the fragment as CTEs (one statement, where two
            # views per table would add two more per task); a fragment with a WITH
            # of its own gets views, and so does a query run whole: DuckDB planned
            # TPC-DS q27 whole 2.2 times slower over CTEs than over views (its own
            # WITH, nested in the task's SELECT, reads them).
            as_views = spec.whole_query or _WITH.match(spec.sql) is not None
            ctes: list[tuple[str, str]] = []
            for scan in spec.scans:
                read = sqls[scan.name]
                if read is None:
                    once = read_once(spec.sql, scan.name)
                    if scan.splits and scan.splits[0].text is not None:
                        scratch = os.path.join(self._spill_dir, "text")
                        memory = self.budget.memory if self.budget is not None else None
                        reader = textfiles.read_splits(
                            scan.splits, scan.columns, scratch, opened, ROWS_COLUMN, memory
                        )
                    else:
                        reader = read_scan(scan.columns, scan.splits, opened, once)
                    self._register(con, scan.name, reader, registered)
                elif as_views:
                    con.execute(f"CREATE OR REPLACE TEMP VIEW {identifier(scan.name)} AS {read}")
                    views.append(scan.name)
                else:
                    ctes.append((scan.name, read))
            for inp in spec.inputs:
                self._check_cancelled()
                clock.switch(Phase.FETCH)
                read = self._read_input(inp, read_once(spec.sql, inp.name))
                clock.switch(Phase.SETUP)
                if isinstance(read, pa.RecordBatchReader):
                    streams.append(read)
                self._register(con, inp.name, read, registered)
            self._check_cancelled()
            target = writer or self.writer
            if target is None:
                raise TypeError("TaskRunner.run needs a writer: none given and none by default")
            return self._execute(con, spec, target, ctes, clock)
        except TaskCancelledError:
            raise
        except Exception as exc:
            if self._is_cancelled():
                raise TaskCancelledError(str(spec.attempt)) from exc
            if isinstance(exc, TaskFailedError):
                raise
            raise TaskFailedError(classify(exc, self.budget)) from exc
        finally:
            clock.switch(Phase.CLEANUP)
            fetched = self.reader.fetched
            clock.fetched_local_bytes = fetched.local_bytes
            clock.fetched_remote_bytes = fetched.remote_bytes
            clock.fetch_remote_s = fetched.remote_s
            spilled = self._spill_watch.stop()
            if spilled:
                log.info("task %s spilled %s at most", spec.attempt, format_size(spilled))
            for name in registered:
                try:
                    con.unregister(name)
                except duckdb.Error:  # must not hide the task's own outcome
                    log.exception("unregistering %s failed", name)
            for view in views:
                try:
                    con.execute(f"DROP VIEW IF EXISTS {identifier(view)}")
                except duckdb.Error:
                    log.exception("dropping the scan view %s failed", view)
            for stream in streams:  # its files, where DuckDB did not read it to the end
                stream.close()
            release_duckdb_memory()
            with self._lock:
                self._active = None
                self._running_con = self._con
            if opened:
                log.info(
                    "task %s fetched %d bytes in %d requests from %d objects",
                    spec.attempt,
                    sum(f.bytes_read for f in opened),
                    sum(f.requests for f in opened),
                    len(opened),
                )
                for f in opened:
                    f.close()
            clock.stop()

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
            self.reader.cancel()  # a fetch from a silent peer, which DuckDB's interrupt misses
            self._running_con.interrupt()
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
                self._running_con.interrupt()

    @property
    def scan_databases(self) -> int:
        """Scan databases this slot keeps open now (at most ``databases.SCAN_DATABASES``)."""
        return len(self._scans)

    @property
    def scan_databases_opened(self) -> int:
        """Scan databases this slot has locked down for a task, over its life."""
        return self._scans.opened

    @property
    def active(self) -> TaskAttemptId | None:
        """The attempt running now, if any."""
        return self._active

    def close(self) -> None:
        """Close the DuckDB databases."""
        self._spill_watch.close()
        self._con.close()
        self._scans.close()
        self._plain.close()

    # ---------------------------------------------------------------- inputs

    def _register(
        self,
        con: duckdb.DuckDBPyConnection,
        name: str,
        table: pa.Table | pa.RecordBatchReader,
        registered: list[str],
    ) -> None:
        con.register(name, table)
        registered.append(name)

    # ---------------------------------------------------------------- scan

    def _scan_connection(
        self,
        splits: Sequence[FileSplit],
        job_files: Sequence[str] = (),
        whole_query: bool = False,
    ) -> duckdb.DuckDBPyConnection:
        """A locked database of this slot that may read the splits' files and the
        local ones of ``job_files`` (every table of the catalog the task's job was
        planned against, or of the job itself), and no other (``ScanDatabases``);
        one that orders joins itself for a task that runs a query whole
        (``TaskSpec.whole_query``), even one that reads no such file.

        The splits' own files are added to the job's, so a task whose job named
        none (or not all) of them still runs.
        """
        files = self._job_files(job_files) | {os.path.realpath(s.path) for s in splits}
        return self._scans.connection(files, whole_query)

    def _job_files(self, job_files: Sequence[str]) -> frozenset[str]:
        """The local files of ``job_files``, resolved, remembered for the job's next task
        (a job sends the same list with every task; resolving each path costs a
        system call per directory in it)."""
        key = tuple(job_files)
        if key != self._job_files_of[0]:
            local = [p for p in key if not storage.is_remote(p)]
            self._job_files_of = (key, frozenset(os.path.realpath(p) for p in local))
            learn_ahead(local)
        return self._job_files_of[1]

    def _read_input(
        self, inp: InputLocations, once: bool = False
    ) -> pa.Table | pa.RecordBatchReader:
        if inp.locations:
            if once:
                return self.reader.stream_many(inp.locations)
            return self.reader.read_many(inp.locations)
        # No map task wrote anything (an upstream stage of no tasks): all the
        # runner knows is the column names, so the columns are NULL-typed.
        return pa.table({c: pa.nulls(0) for c in inp.columns or (ROWS_COLUMN,)})

    # ---------------------------------------------------------------- output

    def _execute(
        self,
        con: duckdb.DuckDBPyConnection,
        spec: TaskSpec,
        writer: ShuffleWriter,
        ctes: Sequence[tuple[str, str]] = (),
        clock: PhaseClock | None = None,
    ) -> tuple[PartitionOutput, ...]:
        clock = clock if clock is not None else PhaseClock()
        clock.switch(Phase.EXECUTE)
        output = spec.output
        if output.kind is OutputKind.HASH and output.partitions > 1:
            sql, partitions = hash_sql(spec), output.partitions
        else:
            # SINGLE runs the fragment untouched: wrapping it in a subquery
            # could lose its ORDER BY.
            sql, partitions = spec.sql, 1
        if ctes:
            sql = "WITH " + ", ".join(f"{identifier(n)} AS ({s})" for n, s in ctes) + "\n" + sql
        relation = con.sql(sql)
        if relation is None:
            # The planner wrote it: mangonel's bug, not the query's.
            raise TaskFailedError(FragmentRejected(f"the fragment is not a query: {spec.sql!r}"))
        # The stream must be closed on every path: an open result blocks the
        # connection ("connection has an open result") for the next task.
        with contextlib.ExitStack() as closing:
            stream = closing.enter_context(relation.to_arrow_reader(BATCH_ROWS))
            if spec.sink is not None:
                return self._write_sink(spec, spec.sink, stream, writer, clock)
            if spec.result:
                # DuckDB's own types crossed the shuffles (``arrow_types``); a
                # client reads Arrow's.
                stream = closing.enter_context(self._plain.of(stream))
            split = partitions > 1
            schema = output_schema(stream.schema, spec, split)
            clock.switch(Phase.WRITE)
            with writer.open(spec.attempt, partitions, schema) as sink:
                clock.switch(Phase.EXECUTE)
                for batch in self._batches(stream):
                    clock.switch(Phase.WRITE)
                    if split:
                        write_split(sink, batch, schema)
                    else:
                        sink.write_batch(
                            0, pa.RecordBatch.from_arrays(batch.columns, schema=schema)
                        )
                    clock.switch(Phase.EXECUTE)
                self._check_cancelled()
                clock.switch(Phase.WRITE)
                try:
                    return sink.commit()
                finally:
                    clock.write_io_s += sink.io_s

    def _write_sink(
        self,
        spec: TaskSpec,
        sink: SinkSpec,
        stream: pa.RecordBatchReader,
        writer: ShuffleWriter,
        clock: PhaseClock,
    ) -> tuple[PartitionOutput, ...]:
        """A writing task: its rows go to files in its staging directory
        (``executor.sink``), its output is one row, how many it wrote."""
        clock.switch(Phase.WRITE)
        memory = f"{max(1, self.budget.memory // 1024)}KiB" if self.budget is not None else None
        try:
            rows = write_rows(
                stream,
                sink,
                self._spill_dir,
                self._check_cancelled,
                memory,
                self._threads,
                midway=lambda: self.hooks.writing(spec.attempt),
            )
            self._check_cancelled()
        except BaseException as exc:
            # Nothing of a failed or cancelled attempt is ever committed: its files
            # go now, not only with its job's staging directory at the job's end.
            try:
                discard_attempt(sink.staging)
            except OSError:
                log.exception("task %s: its staged files could not be removed", spec.attempt)
            full = None
            if isinstance(exc, Exception) and not storage.is_remote(sink.target):
                full = write_target_full(sink.target, self._spill_dir, exc)
            if full is not None:
                raise TaskFailedError(full) from exc
            raise
        schema = pa.schema([pa.field(spec.columns[0], pa.int64())])
        with writer.open(spec.attempt, 1, schema) as out:
            count = pa.RecordBatch.from_arrays([pa.array([rows], pa.int64())], schema=schema)
            out.write_batch(0, count)
            try:
                return out.commit()
            finally:
                clock.write_io_s += out.io_s

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


def warm_up(directory: str) -> None:
    """Pay, before the first task, what a process pays the first time it runs one.

    The first task of a new executor took 0.3 to 0.7 s more than the same task
    later (TPC-DS SF1, a 2-executor cluster), long enough for the scheduler to
    copy it as a straggler: the first DuckDB database and Arrow registration
    (which imports pandas), the first Parquet footer and read, the first Arrow
    IPC file. This goes through those once, on a tiny file in ``directory``; the
    executor calls it on a thread of its own at start. A failure is only logged:
    the first task pays the rest.
    """
    started = time.monotonic()
    path = os.path.join(directory, "warm-up.parquet")
    try:
        # Built from buffers, not from Python values: ``pa.array([1, 2])`` makes
        # pyarrow import pandas, about 40 MB of the process's memory that no task
        # needs (the docs' "Memory and disk").
        keys = pa.py_buffer(np.arange(1, 3, dtype=np.int64))
        offsets = pa.py_buffer(np.array([0, 1, 2], dtype=np.int32))
        table = pa.table(
            {
                "k": pa.Array.from_buffers(pa.int64(), 2, [None, keys]),
                "s": pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"ab")]),
            }
        )
        pq.write_table(table, path)
        metadata(path)
        column_types(path, "k")
        con = locked_connection(os.path.join(directory, "warm-up"), None, 1, [path])
        try:
            con.register("__warm_up", table)
            parts = con.sql(
                f"SELECT hash(k) % 2 AS p FROM {identifier('__warm_up')}"
            ).to_arrow_table()
            pc.take(table, pc.sort_indices(parts.column(0)))
            with con.sql(f"SELECT * FROM read_parquet({literal(path)})").to_arrow_reader(
                BATCH_ROWS
            ) as stream:
                read = stream.read_all()
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, read.schema) as out:
                out.write_table(read)
            pa.ipc.open_file(sink.getvalue()).read_all()
        finally:
            con.close()
    except Exception:  # noqa: BLE001 - a warm-up must never stop the executor
        log.info("warming up the executor failed; its first task pays for it", exc_info=True)
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
    log.info("warmed up in %.3f s", time.monotonic() - started)


def read_once(sql: str, name: str) -> bool:
    """Whether DuckDB reads the input or scan ``name`` in one pass: the fragment names
    it once and has no WITH (a CTE named twice is read twice). Such an input is
    streamed (``ShuffleReader.stream_many``, ``scan.read_scan``), which DuckDB can read
    only once; any other is read whole (a fragment naming its input unquoted, which
    the planner does not write, is read whole too)."""
    return sql.count(identifier(name)) == 1 and _ANY_WITH.search(sql) is None
