"""Running one task: register its inputs in DuckDB, run its SQL, write its output.

A ``TaskRunner`` is one task slot of an executor. It owns one DuckDB database
(so ``memory_limit`` and ``threads`` are per slot: the slot's share of the
executor's budget, ``executor.memory.SlotBudget``) and runs one ``TaskSpec`` at
a time. The slot's ``temp_directory``, capped at its part of the spill budget
(``max_temp_directory_size``), is the running task's: one task at a time spills
there, DuckDB deletes its files when the query ends, and the runner logs how
much the task spilled at most. The steps:

1. make the inputs readable under their names: the scan's Parquet splits and
   the other tables the task scans (small ones whole, or the row groups of a
   join by key range; each a CTE in front of the fragment
   over DuckDB's own Parquet reader, only the needed columns and the split's
   row groups, so the fragment's filters and projections reach the reader) and
   every upstream stage's partitions (read with the ``ShuffleReader``:
   memory-mapped or over Flight);
2. run the fragment and stream its result as Arrow batches;
3. split the batches by the output spec (``hash(keys) % N`` computed inside
   DuckDB, rows moved with one ``take`` per batch) into the task's partition
   files, every partition written even when empty;
4. unregister everything, whether the task succeeded or not.

Each step is marked on the task's ``PhaseClock`` (``executor.phases``: setup, fetch,
execute, write, cleanup), whose times go with the task's report.

User SQL reaches this DuckDB, so after configuring it the runner turns off
external access (no file, network or extension access from SQL; registered
Arrow tables still work) and locks the configuration (no ``SET`` from SQL).
A task that scans runs in a second database of the slot, locked the same way
but allowed (``allowed_paths``) to read exactly the Parquet files the task's
job names (``TaskSpec.job_files``: every table of the catalog it was planned
against, see ``DistributedPlan.readable_files``; with the task's own), kept for
the next task of any job that names the same: its SQL can reach the files of the
catalog's tables and no other, which its user may read anyway. One database per
slot thus serves every scan task of every query, where one per set of files a task
scanned cost a TPC-DS query's first run a fresh database per table in each slot
(opening one costs about 20 ms, and its first big Parquet read about twice the
page faults of the same read in it again). The slot opens its next scan
database ahead of need on another thread (configured, not yet locked down: no
SQL runs in it before a task takes it and it is given its files and locked),
so a new set of tables costs a task no database opening. Which DuckDB type
each file's column has is asked once per process (``_column_types``), and
``warm_up`` pays the process's first use of DuckDB and pyarrow at start, not
in its first task.

A split in object storage (``s3://``) is read with pyarrow through
``mangonel.storage``, never by DuckDB (whose S3 reader, the ``httpfs``
extension, is not in the wheel; no database here installs or loads
extensions): only the split's row groups and the scan's columns, each column
chunk one ranged GET, after a check that the object is the one registered. The
bytes fetched are logged per task.

Every failure leaves as ``TaskFailedError`` with a typed ``TaskFailure``
(see ``failures.py``), or ``TaskCancelledError`` after ``cancel()``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mangonel import storage, textfiles
from mangonel.errors import ObjectStoreError
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
from mangonel.executor.phases import Phase, PhaseClock
from mangonel.executor.shuffle import PartitionSink, ShuffleReader, ShuffleWriter
from mangonel.executor.sink import write_rows
from mangonel.ids import TaskAttemptId
from mangonel.output import discard_attempt
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

_PART_COLUMN = "__mangonel_part"
_ROWS_COLUMN = "__mangonel_rows"
"""Stand-in column for a scan of no columns: DuckDB cannot register a table without any."""

_INTERRUPT_REPEAT_S = 0.05

_WITH = re.compile(r"\s*with\b", re.IGNORECASE)
"""A fragment that starts with its own WITH clause."""
_ANY_WITH = re.compile(r"\bwith\b", re.IGNORECASE)
"""A WITH anywhere in a fragment (or in a literal: then its inputs are read whole)."""

SCAN_DATABASES = 4
"""Scan databases a slot keeps (one per set of files a job names: the catalog's
tables, or a query's own), the least recently used closed past it.

Each DuckDB database holds about 4.3 MiB of its own (its catalog of built-in
functions, allocated with ``malloc``) however little it reads, and a slot that kept
16 held 13 to 15 after the 22 TPC-H queries: 55 to 65 MiB of each executor's peak
(issue 19). Opening one again costs little against that: the slot opens its next database
ahead of need (``_take_spare``), so a set of files met again costs a task only
locking the spare down and the files' footers read again (about 1 ms for
``lineitem``'s). One holds what every query over a catalog scans; the others serve
plans made before a table was registered, until they are done.
"""

BATCH_ROWS = 131_072
"""Rows per Arrow batch pulled from DuckDB; each is split and written at once.

Measured on the map tasks of a shuffle-heavy query (SF1 ``lineitem`` and
``orders`` hash-partitioned, 276 MB written, one slot, glibc's defaults):
0.79 CPU-s with 1M-row batches, 0.56 to 0.58 with 256k and 128k, 0.60 with
64k. Most of it was page faults, 93,000 per run with 1M rows against 3,200
with 128k: DuckDB grows each batch's buffers with ``realloc`` and glibc handed
a big batch's memory back to the kernel (see ``keep_batch_memory``). With
``keep_batch_memory`` in force, on 2 executors, the query still took 0.65 s
with 1M-row batches against 0.575 s with 128k.
"""

_MALLOC_MMAP_THRESHOLD = 32 * 1024 * 1024
"""glibc's ``M_MMAP_THRESHOLD`` in an executor: the largest value it accepts
on 64-bit, and the cap of the adaptive threshold it replaces."""
_MALLOC_TRIM_THRESHOLD = 64 * 1024 * 1024
"""glibc's ``M_TRIM_THRESHOLD`` in an executor: free memory a heap keeps on top."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""The ``mallopt`` parameter numbers, from glibc's ``malloc.h``."""

SCAN_BATCH_ROWS = 65_536
"""Rows per Arrow batch decoded from Parquet and handed to DuckDB (measured:
64k-row batches scan faster than 128k and 1M ones, which leave the CPU caches)."""


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
        self._con = _locked_connection(spill_dir, budget, threads)
        self._running_con = self._con
        """The database the active task runs in (what ``cancel`` interrupts)."""
        self._spill_watch = _SpillWatch(spill_dir)
        self.hooks: TaskHooks = NO_HOOKS
        """Test hooks (``executor.hooks``); the executor gives its own."""
        self._scan_cons: OrderedDict[frozenset[str], duckdb.DuckDBPyConnection] = OrderedDict()
        self._scan_seq = 0
        self.scan_databases_opened = 0
        """Scan databases this slot has locked down for a task, over its life."""
        self._job_files_of: tuple[tuple[str, ...], frozenset[str]] = ((), frozenset())
        self._spare: Future[duckdb.DuckDBPyConnection] | None = self._open_spare()
        """A scan database being opened ahead, on another thread, for the next set
        of files this slot has none for (``_scan_connection``)."""

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
            sqls = {s.name: self._scan_sql(s.columns, s.splits) for s in spec.scans}
            native = [s for s in spec.scans if sqls[s.name] is not None]
            if native:
                con = self._scan_connection(
                    [split for s in native for split in s.splits], spec.job_files
                )
                with self._lock:
                    self._running_con = con
            # The reads go in front of the fragment as CTEs (one statement, where two
            # views per table would add two more per task); a fragment with a WITH
            # of its own gets views.
            as_views = _WITH.match(spec.sql) is not None
            ctes: list[tuple[str, str]] = []
            for scan in spec.scans:
                read = sqls[scan.name]
                if read is None:
                    once = _read_once(spec.sql, scan.name)
                    if scan.splits and scan.splits[0].text is not None:
                        scratch = os.path.join(self._spill_dir, "text")
                        memory = self.budget.memory if self.budget is not None else None
                        reader = textfiles.read_splits(
                            scan.splits, scan.columns, scratch, opened, _ROWS_COLUMN, memory
                        )
                    else:
                        reader = _read_scan(scan.columns, scan.splits, opened, once)
                    self._register(con, scan.name, reader, registered)
                elif as_views:
                    con.execute(f"CREATE OR REPLACE TEMP VIEW {_quote(scan.name)} AS {read}")
                    views.append(scan.name)
                else:
                    ctes.append((scan.name, read))
            for inp in spec.inputs:
                self._check_cancelled()
                clock.switch(Phase.FETCH)
                read = self._read_input(inp, _read_once(spec.sql, inp.name))
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
                    con.execute(f"DROP VIEW IF EXISTS {_quote(view)}")
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
        """Scan databases this slot keeps open now (at most ``SCAN_DATABASES``)."""
        return len(self._scan_cons)

    @property
    def active(self) -> TaskAttemptId | None:
        """The attempt running now, if any."""
        return self._active

    def close(self) -> None:
        """Close the DuckDB databases."""
        self._spill_watch.close()
        self._con.close()
        for con in self._scan_cons.values():
            con.close()
        self._scan_cons.clear()
        spare, self._spare = self._spare, None
        if spare is not None and not spare.cancel():
            with contextlib.suppress(Exception):  # it failed to open: nothing to close
                spare.result().close()

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
        self, splits: Sequence[FileSplit], job_files: Sequence[str] = ()
    ) -> duckdb.DuckDBPyConnection:
        """A locked database of this slot that may read the splits' files and the
        local ones of ``job_files`` (every table of the catalog the task's job was
        planned against, or of the job itself), and no other.

        Keyed by the job's files, not the task's: a query's scan tasks read several
        tables, and each set of files had a database of its own, so a TPC-DS query's
        first run opened one per table in each slot, each paying a fresh database's
        first Parquet read (about twice the page faults of the same read in a
        database that has read once; issue 20). The splits' own files are added
        too, so a task whose job named none (or not all) of them still runs.
        """
        files = self._job_files(job_files) | {os.path.realpath(s.path) for s in splits}
        con = self._scan_cons.pop(files, None)
        if con is None:
            self.scan_databases_opened += 1
            log.info(
                "slot %s opens scan database %d for %d files",
                self._spill_dir,
                self.scan_databases_opened,
                len(files),
            )
            con = _lock_down(self._take_spare(), sorted(files))
            while len(self._scan_cons) >= SCAN_DATABASES:
                _, old = self._scan_cons.popitem(last=False)
                # Closing a database takes 8 to 25 ms: on the opener's thread, not
                # on this task's path.
                _OPENER.submit(old.close)
        self._scan_cons[files] = con  # most recently used last
        return con

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

    def _open_spare(self) -> Future[duckdb.DuckDBPyConnection]:
        self._scan_seq += 1
        spill = os.path.join(self._spill_dir, f"scan-{self._scan_seq}")
        return _OPENER.submit(_open_connection, spill, self.budget, self._threads)

    def _take_spare(self) -> duckdb.DuckDBPyConnection:
        """The database opened ahead (not locked down yet); the next one starts opening.

        Opening a DuckDB database costs 15 to 25 ms (more on a busy machine), and a
        short query's first run opened one in each slot for each set of tables its
        tasks scan, on the task's critical path. The next is opened while the slot
        runs tasks or waits; a task that needs two new ones opens the second itself.
        """
        spare = self._spare
        self._spare = self._open_spare()
        if spare is not None:
            try:
                return spare.result()
            except Exception:  # noqa: BLE001 - opened again below, where a failure fails the task
                log.warning("opening a scan database ahead failed", exc_info=True)
        self._scan_seq += 1
        spill = os.path.join(self._spill_dir, f"scan-{self._scan_seq}")
        return _open_connection(spill, self.budget, self._threads)

    def _scan_sql(self, columns: Sequence[str], splits: Sequence[FileSplit]) -> str | None:
        """DuckDB SQL reading some splits of a table, or ``None`` to read them with pyarrow.

        Each file's rows are chosen by ``file_row_number`` ranges, which DuckDB's
        reader turns into row-group pruning. Columns are cast to the types the
        planner saw (DuckDB over the file's Arrow schema) where DuckDB's own
        reading differs, since hash partitioning depends on the type.
        """
        if not columns or not splits or any(storage.is_remote(s.path) for s in splits):
            return None
        if any(s.text is not None for s in splits):
            return None  # CSV or JSON: byte ranges that ``textfiles`` cuts at lines
        parts = []
        for split in splits:
            path = os.path.realpath(split.path)
            if "file_row_number" in _metadata(path).schema.names:
                return None  # the reader's row-number column would be shadowed
            selected = []
            for c in columns:
                planned, native = _column_types(path, c)
                expr = _quote(c) if planned == native else f"CAST({_quote(c)} AS {planned})"
                selected.append(f"{expr} AS {_quote(c)}")
            where = " OR ".join(
                f"(file_row_number >= {start} AND file_row_number < {stop})"
                for start, stop in _row_ranges(path, split.row_groups)
            )
            parts.append(
                f"SELECT {', '.join(selected)} FROM read_parquet({_literal(path)})"
                + (f" WHERE {where}" if where else "")
            )
        return " UNION ALL ".join(parts)

    def _read_input(
        self, inp: InputLocations, once: bool = False
    ) -> pa.Table | pa.RecordBatchReader:
        if inp.locations:
            if once:
                return self.reader.stream_many(inp.locations)
            return self.reader.read_many(inp.locations)
        # No map task wrote anything (an upstream stage of no tasks): all the
        # runner knows is the column names, so the columns are NULL-typed.
        return pa.table({c: pa.nulls(0) for c in inp.columns or (_ROWS_COLUMN,)})

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
            sql, partitions = _hash_sql(spec), output.partitions
        else:
            # SINGLE runs the fragment untouched: wrapping it in a subquery
            # could lose its ORDER BY.
            sql, partitions = spec.sql, 1
        if ctes:
            sql = "WITH " + ", ".join(f"{_quote(n)} AS ({s})" for n, s in ctes) + "\n" + sql
        relation = con.sql(sql)
        if relation is None:
            # The planner wrote it: mangonel's bug, not the query's.
            raise TaskFailedError(FragmentRejected(f"the fragment is not a query: {spec.sql!r}"))
        # The stream must be closed on every path: an open result blocks the
        # connection ("connection has an open result") for the next task.
        with relation.to_arrow_reader(BATCH_ROWS) as stream:
            if spec.sink is not None:
                return self._write_sink(spec, spec.sink, stream, writer, clock)
            split = partitions > 1
            schema = _output_schema(stream.schema, spec, split)
            clock.switch(Phase.WRITE)
            with writer.open(spec.attempt, partitions, schema) as sink:
                clock.switch(Phase.EXECUTE)
                for batch in self._batches(stream):
                    clock.switch(Phase.WRITE)
                    if split:
                        _write_split(sink, batch, schema)
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
        _metadata(path)
        _column_types(path, "k")
        con = _locked_connection(os.path.join(directory, "warm-up"), None, 1, [path])
        try:
            con.register("__warm_up", table)
            parts = con.sql(f"SELECT hash(k) % 2 AS p FROM {_quote('__warm_up')}").to_arrow_table()
            pc.take(table, pc.sort_indices(parts.column(0)))
            with con.sql(f"SELECT * FROM read_parquet({_literal(path)})").to_arrow_reader(
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


def keep_batch_memory() -> bool:
    """Make glibc keep freed memory for the next Arrow batches (once per executor process).

    DuckDB builds each Arrow batch of a task's result in buffers it grows with
    ``realloc``. With glibc's default, adaptive thresholds, each batch's buffers
    were mapped afresh or the top of the slot thread's heap was handed back to
    the kernel once they were freed, so every batch faulted its pages in again
    (dear in a VM: about 1.5 ms per fresh MB on this project's machines). Fixed
    thresholds (allocations under 32 MiB from the heap, trimmed past 64 MiB
    free) keep that memory for the next batch. Measured on the shuffle query of
    ``benchmarks/micro.py`` (SF1, 276 MB shuffled, 2 executors, median of 10):
    0.67 s before, 0.575 s after; the executors' peak RSS 460 MB before, 500 MB
    after. It changes the C allocator of the whole process.

    Returns:
        Whether glibc took the settings (``False`` without glibc's ``mallopt``).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    took_mmap = int(mallopt(_M_MMAP_THRESHOLD, _MALLOC_MMAP_THRESHOLD)) == 1
    took_trim = int(mallopt(_M_TRIM_THRESHOLD, _MALLOC_TRIM_THRESHOLD)) == 1
    return took_mmap and took_trim


_NO_EXTENSIONS: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
"""Every database of an executor: no extension is installed or loaded behind its back
(an ``s3://`` path would make DuckDB download ``httpfs``; ``storage`` reads those)."""


class _SpillWatch:
    """How much the running task of a slot spilled at most: the slot's spill files,
    looked at while it runs.

    DuckDB writes and deletes its temporary files inside a query (a hash
    aggregate's spilled partitions are gone before its first row comes out), so
    they are looked at on a thread every ``_SPILL_POLL_S``, not after. The thread
    is the slot's, for its whole life, and sleeps between tasks: one started and
    joined per task cost a tiny task (a final sort of a few rows, 8 to 16 ms in
    all) 0.3 to 1.5 ms to start it and 0.7 to 4.4 ms to join it, whenever the
    other slot's thread held the GIL (TPC-H SF1, issue 19).

    ``start`` and ``stop`` bracket one task, on the slot's thread. A look that
    began during one task never counts for the next (``_task`` names the task).
    """

    def __init__(self, spill_dir: str) -> None:
        self._dir = spill_dir
        self._cond = threading.Condition()
        """Guards the fields below and wakes the thread when a task starts."""
        self._task = 0
        """How many tasks have started: which one the thread's look belongs to."""
        self._active = False
        self._idle = True
        """The thread waits for a task (only then does ``start`` wake it)."""
        self._closed = False
        self._peak = 0
        self._thread = threading.Thread(target=self._watch, name="spill-watch", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """A task starts: watch from now, from zero."""
        with self._cond:
            self._task += 1
            self._active = True
            self._peak = 0
            if self._idle:
                self._cond.notify()

    def stop(self) -> int:
        """The task ended: the most bytes seen while it ran, its files now included."""
        now = _spill_bytes(self._dir)
        with self._cond:
            self._active = False
            return max(self._peak, now)

    @property
    def peak(self) -> int:
        """The most bytes seen so far in the running (or last) task."""
        with self._cond:
            return self._peak

    def close(self) -> None:
        """End the thread (the slot closes); it does not wait for it."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._active:
                    self._idle = True
                    self._cond.wait()
                    self._idle = False
                    continue
                task = self._task
                self._cond.wait(_SPILL_POLL_S)
                if self._closed or not self._active or self._task != task:
                    continue
                self._cond.release()
                try:
                    size = _spill_bytes(self._dir)
                finally:
                    self._cond.acquire()
                if self._active and self._task == task:
                    self._peak = max(self._peak, size)


_SPILL_POLL_S = 0.05
"""A spill that lasts less than this may go unseen (and costs little)."""


def _spill_bytes(spill_dir: str) -> int:
    """Bytes in DuckDB's temporary files under a slot's spill directory (its scan
    databases' directories included)."""
    total = 0
    try:
        with os.scandir(spill_dir) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    total += _spill_bytes(entry.path)
                elif entry.name.endswith(".tmp"):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
    except OSError:  # a file DuckDB deleted meanwhile
        pass
    return total


def _locked_connection(
    spill_dir: str, budget: SlotBudget | None, threads: int, readable: Sequence[str] = ()
) -> duckdb.DuckDBPyConnection:
    return _lock_down(_open_connection(spill_dir, budget, threads), readable)


def _open_connection(
    spill_dir: str, budget: SlotBudget | None, threads: int
) -> duckdb.DuckDBPyConnection:
    """A slot's database with its budget, not locked down yet: it must run no SQL
    of a task before ``_lock_down``."""
    con = duckdb.connect(database=":memory:", config=_NO_EXTENSIONS)
    con.execute(f"SET threads = {int(threads)}")
    con.execute("SET temp_directory = ?", [spill_dir])
    if budget is not None:
        # In KiB: DuckDB's own units, and exact enough.
        con.execute("SET memory_limit = ?", [f"{max(1, budget.memory // 1024)}KiB"])
        if budget.spill is not None:
            con.execute("SET max_temp_directory_size = ?", [f"{max(1, budget.spill // 1024)}KiB"])
    # It prints to stdout in a long query; an executor's stdout is a log.
    con.execute("SET enable_progress_bar = false")
    return con


def _lock_down(
    con: duckdb.DuckDBPyConnection, readable: Sequence[str] = ()
) -> duckdb.DuckDBPyConnection:
    """Finish ``_open_connection``'s database: it may read the ``readable`` files
    (a scan database) or none, and no SQL can change its settings any more."""
    if readable:
        # Exact files, not directories: a table's directory may hold other files.
        con.execute("SET allowed_paths = ?", [list(readable)])
        # A slot keeps several scan databases: none may hold copies of file
        # blocks (the OS page cache has them), each keeps the parsed footers.
        con.execute("SET enable_external_file_cache = false")
        con.execute("SET parquet_metadata_cache = true")
    # The planner ordered the fragment's joins from the tables' footers (sizes,
    # key ranges: ``plan.estimate``); DuckDB sees Arrow inputs without statistics
    # and may reorder them into a many-to-many join (TPC-H q5 at SF10 joined
    # customers to suppliers on their nation first: billions of rows, spilled
    # until the disk was full).
    # The planner also put the side it estimated smaller on the right of each
    # inner join, and DuckDB builds its hash table on the right; its build-side rule,
    # guessing sizes over Arrow inputs, swapped them where a join had cut one side
    # down: TPC-H q9's lineitem tasks (random layout) built tables over the whole
    # broadcast orders and partsupp (2.3M rows, about 170 MB in each task) instead
    # of their 106k lineitem rows that meet a green part. Without the rule, the
    # executors' peak RSS at SF1 fell by 75 to 150 MB in all, q9 ran faster and no
    # query measurably slower (issue 19; docs "Memory and disk"). A LEFT, SEMI or
    # ANTI join now always builds its right side (q13: the orders, not the customers).
    # DuckDB 2.0's partial aggregate pushdown puts a partial GROUP BY under a join
    # whatever the other side's size: TPC-H q18's lineitem task grouped 3M rows by
    # order (764k groups) before joining the 57 orders a broadcast brings, where the
    # join alone, its key filter pushed into the scan, keeps 217 rows (122 -> 20 ms;
    # one slot, all 22 queries: 6.3 -> 5.4 s). The planner places aggregates itself.
    disabled = ["join_order", "partial_aggregate_pushdown", "build_side_probe_side"]
    if readable:
        # DuckDB 2.0.0's late materialization of a top-n (ORDER BY ... LIMIT
        # <= 50) over read_parquet fails on the scan's file_row_number filter
        # ("INTERNAL Error: Attempted to access index -9223372036854775807").
        disabled.append("late_materialization")
    con.execute("SET disabled_optimizers = ?", [",".join(disabled)])
    # Last: after these two, SQL can reach no file and change no setting.
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _read_scan(
    columns: Sequence[str],
    splits: Sequence[FileSplit],
    opened: list[storage.ObjectFile] | None = None,
    once: bool = False,
) -> pa.Table | pa.RecordBatchReader:
    """Some splits of a table: their row groups' needed columns, streamed where ``once``.

    Where DuckDB reads the scan in one pass (``once``: ``_read_once``), a stream:
    DuckDB consumes a ``RecordBatchReader`` batch by batch through the Arrow C
    stream (measured at SF1, 750k ``lineitem`` rows: 0.075 s to scan and hash vs
    0.10 s for the same rows read whole first), and a task never holds its decoded
    split in memory. Else a table: a fragment may name a scan more than once (a
    subquery the planner copied, such as TPC-H q20's ``part`` filter, rendered both
    in its ``IN`` and in the semi-join that cuts ``lineitem`` down, reads the same
    scan twice), and a stream, consumed by the first read, fails the second. A local
    split has no such limit: DuckDB's reader reads the file again for each.

    Objects in object storage are opened (and checked against the version the
    catalog saw) here, before the stream starts, so that a changed or missing
    object fails the task with its own typed error; ``opened`` collects them.
    """
    opened = [] if opened is None else opened
    if not columns:
        # count(*) and the like read no column: the row count is in the footers.
        rows = sum(_split_rows(split, opened) for split in splits)
        return pa.table({_ROWS_COLUMN: pa.nulls(rows)})
    if not splits:
        return pa.table({c: pa.nulls(0) for c in columns})
    files = [(_parquet_file(split, opened), split) for split in splits]
    schema = pa.schema([files[0][0].schema_arrow.field(c) for c in columns])
    stream = pa.RecordBatchReader.from_batches(schema, _split_batches(files, list(columns)))
    return stream if once else stream.read_all()


def _split_batches(
    files: list[tuple[pq.ParquetFile, FileSplit]], columns: list[str]
) -> Iterator[pa.RecordBatch]:
    schema = pa.schema([files[0][0].schema_arrow.field(c) for c in columns])
    for parquet, split in files:
        row_groups = list(split.row_groups) or None
        for batch in parquet.iter_batches(SCAN_BATCH_ROWS, row_groups, columns):
            # Files of one table may differ in small ways (nullability, string
            # encoding); the stream has one schema, the first file's.
            yield batch if batch.schema == schema else batch.cast(schema)


def _parquet_file(split: FileSplit, opened: list[storage.ObjectFile]) -> pq.ParquetFile:
    if not storage.is_remote(split.path):
        return pq.ParquetFile(split.path)
    expected = storage.ObjectVersion(split.object_size, split.version)
    source = storage.open_object(split.path, expected if split.object_size else None)
    opened.append(source)
    try:
        # pre_buffer: the column chunks of a row group that lie close together
        # come in one ranged GET (pyarrow's defaults: holes up to 8 KiB joined).
        return pq.ParquetFile(source, pre_buffer=True)
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, ObjectStoreError):
            raise
        raise ObjectStoreError(
            f"{split.path} is not a readable Parquet file any more: {exc}"
        ) from exc


def _split_rows(split: FileSplit, opened: list[storage.ObjectFile]) -> int:
    metadata = _parquet_file(split, opened).metadata
    groups = split.row_groups or range(metadata.num_row_groups)
    return sum(metadata.row_group(g).num_rows for g in groups)


def _read_once(sql: str, name: str) -> bool:
    """Whether DuckDB reads the input or scan ``name`` in one pass: the fragment names
    it once and has no WITH (a CTE named twice is read twice). Such an input is
    streamed (``ShuffleReader.stream_many``, ``_read_scan``), which DuckDB can read
    only once; any other is read whole (a fragment naming its input unquoted, which
    the planner does not write, is read whole too)."""
    return sql.count(_quote(name)) == 1 and _ANY_WITH.search(sql) is None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _row_ranges(path: str, row_groups: Sequence[int]) -> list[tuple[int, int]]:
    """``file_row_number`` ranges [start, stop) of some row groups (none: all)."""
    metadata = _metadata(path)
    if not row_groups or len(set(row_groups)) == metadata.num_row_groups:
        return []  # the whole file
    starts = [0]
    for g in range(metadata.num_row_groups):
        starts.append(starts[-1] + metadata.row_group(g).num_rows)
    ranges: list[tuple[int, int]] = []
    for g in sorted(row_groups):
        start, stop = starts[g], starts[g + 1]
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], stop)
        else:
            ranges.append((start, stop))
    return ranges


_OPENER = ThreadPoolExecutor(1, thread_name_prefix="scan-db")
"""Opens the slots' next scan databases ahead of need (``TaskRunner._take_spare``)."""

_TYPES: OrderedDict[tuple[str, int, int, str], tuple[str, str]] = OrderedDict()
"""(file, mtime, size, column) -> (DuckDB type over Arrow, read natively), for every slot;
the oldest files' answers are dropped past ``_TYPES_KEPT`` (a long-lived executor sees
new files, and rewritten ones under new keys)."""
_TYPES_KEPT = 65_536
_TYPES_LOCK = threading.Lock()
_TYPES_ASKED: set[tuple[str, int, int]] = set()
"""The files whose types ``_TYPES`` got (maybe dropped since: then asked again)."""
_probe: duckdb.DuckDBPyConnection | None = None
"""The database that answers ``_column_types`` (under ``_TYPES_LOCK``); opened once."""


def _column_types(path: str, column: str) -> tuple[str, str]:
    """A column's DuckDB type as the planner saw it (over the file's Arrow schema) and as
    DuckDB's Parquet reader reads it, asked once per file in the process.

    Asking took about 20 ms a file in each slot, most of it opening a database for
    the question: a short query's first task paid it for every table it scans
    (TPC-DS q21: 4 tables, 180 ms). The answers are the same for every slot, and
    one database asks them all. It runs no user SQL, so it needs no lock-down.
    """
    return _file_types(path, column)[column]


def _file_types(path: str, column: str | None = None) -> dict[str, tuple[str, str]]:
    """``_column_types`` of a file's columns: all of them where they were asked now;
    ``column``'s alone where it was known; none where ``column`` is ``None`` and the
    file was asked before (``learn_ahead``)."""
    global _probe
    st = os.stat(path)
    file = (path, st.st_mtime_ns, st.st_size)
    with _TYPES_LOCK:
        if column is not None:
            known = _TYPES.get((*file, column))
            if known is not None:
                return {column: known}
        elif file in _TYPES_ASKED:
            return {}
        schema = pq.read_schema(path)
        if _probe is None:
            _probe = duckdb.connect(":memory:", config=_NO_EXTENSIONS)
        try:
            _probe.register("__arrow", pa.Table.from_batches([], schema))
            planned = _probe.execute("DESCRIBE SELECT * FROM __arrow").fetchall()
            native = _probe.execute(
                f"DESCRIBE SELECT * FROM read_parquet({_literal(path)})"
            ).fetchall()
        finally:
            _probe.unregister("__arrow")
        native_types = {str(r[0]): str(r[1]) for r in native}
        answers = {str(r[0]): (str(r[1]), native_types.get(str(r[0]), "")) for r in planned}
        for name, answer in answers.items():
            _TYPES[(*file, name)] = answer
        while len(_TYPES) > _TYPES_KEPT:
            _TYPES.popitem(last=False)
        if len(_TYPES_ASKED) >= _TYPES_KEPT:
            _TYPES_ASKED.clear()
        _TYPES_ASKED.add(file)
        return answers


_METADATA: OrderedDict[tuple[str, float, int], pq.FileMetaData] = OrderedDict()
_METADATA_LOCK = threading.Lock()
_METADATA_KEPT = 64

LEARN_AHEAD_FILES = _METADATA_KEPT // 2
"""The most files of a job's catalog ``learn_ahead`` reads ahead (the footers kept are
``_METADATA_KEPT``: learning more would push out those the tasks use)."""
_LEARNER = ThreadPoolExecutor(1, thread_name_prefix="learn-files")
_LEARN_LOCK = threading.Lock()
_LEARNED: set[str] = set()
"""Files handed to the learner (each once per process)."""


def learn_ahead(paths: Sequence[str]) -> None:
    """Read the footers and column types of a job's catalog files ahead, at low priority.

    A task reading a file for the first time in this process read its footer and
    asked DuckDB its column types first (``_metadata``, ``_column_types``): 10 to
    18 ms a file (TPC-DS SF1), paid by the first query to scan each table on each
    executor (a query over five new tables: 60 ms). Every task carries its job's
    catalog files (``TaskSpec.job_files``): the first one seen starts a thread of
    the lowest CPU priority that learns them all, on cores the tasks leave idle.
    Where there are more than ``LEARN_AHEAD_FILES``, none is learned ahead.
    """
    if len(paths) > LEARN_AHEAD_FILES:
        return
    with _LEARN_LOCK:
        new = [p for p in paths if p not in _LEARNED]
        _LEARNED.update(new)
    for path in new:
        _LEARNER.submit(_learn, path)


def _learn(path: str) -> None:
    with contextlib.suppress(OSError):
        # This thread only (Linux: a thread's id is a process id to setpriority).
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    try:
        _file_types(path)
        _metadata(path)
    except Exception:  # noqa: BLE001 - the task that reads the file will say what is wrong
        log.debug("learning %s ahead failed", path, exc_info=True)


def _metadata(path: str) -> pq.FileMetaData:
    """A Parquet file's footer, cached by path, mtime and size (lineitem's takes ~1 ms)."""
    st = os.stat(path)
    key = (path, st.st_mtime, st.st_size)
    with _METADATA_LOCK:
        cached = _METADATA.get(key)
    if cached is None:
        cached = pq.read_metadata(path)
        with _METADATA_LOCK:
            _METADATA[key] = cached
            while len(_METADATA) > _METADATA_KEPT:
                _METADATA.popitem(last=False)
    return cached


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
            FragmentRejected(
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
    # Arrow's sort is stable. Its indices are a permutation of the batch's own
    # rows, so the take's bounds check (a sixth of its time) can find nothing.
    ordered = pc.take(data, pc.sort_indices(part), boundscheck=False)
    start = 0
    for p, count in enumerate(counts.tolist()):
        if count:
            sink.write_batch(p, ordered.slice(start, count))
            start += count
