"""A task slot's DuckDB databases: how each is opened and locked down, and the scan
databases a slot keeps.

A slot runs tasks in a database of its own, with its budget (``memory_limit``
and ``threads`` per slot: the slot's share of the executor's, ``memory.SlotBudget``;
``temp_directory`` capped at the slot's part of the spill budget). User SQL
reaches these databases, so after configuring one (``open_connection``) the slot
turns off external access (no file, network or extension access from SQL;
registered Arrow tables still work) and locks the configuration (no ``SET`` from
SQL): ``lock_down``. No database here installs or loads an extension
(``NO_EXTENSIONS``).

A task that scans runs in a second database of the slot, locked the same way but
allowed (``allowed_paths``) to read exactly the Parquet files the task's job
names (``TaskSpec.job_files``: every table of the catalog it was planned against,
see ``DistributedPlan.readable_files``; with the task's own), kept for the next
task of any job that names the same (``ScanDatabases``): its SQL can reach the
files of the catalog's tables and no other, which its user may read anyway. One
database per slot thus serves every scan task of every query, where one per set
of files a task scanned cost a TPC-DS query's first run a fresh database per
table in each slot (opening one costs about 20 ms, and its first big Parquet
read about twice the page faults of the same read in it again). The slot opens
its next scan database ahead of need on another thread (configured, not yet
locked down: no SQL runs in it before a task takes it and it is given its files
and locked), so a new set of tables costs a task no database opening.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import duckdb

from mangonel.executor.memory import SlotBudget

log = logging.getLogger(__name__)

NO_EXTENSIONS: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
"""Every database of an executor: no extension is installed or loaded behind its back
(an ``s3://`` path would make DuckDB download ``httpfs``; ``storage`` reads those)."""

SCAN_DATABASES = 4
"""Scan databases a slot keeps (one per set of files a job names: the catalog's
tables, or a query's own), the least recently used closed past it.

Each DuckDB database holds about 4.3 MiB of its own (its catalog of built-in
functions, allocated with ``malloc``) however little it reads, and a slot that kept
16 held 13 to 15 after the 22 TPC-H queries: 55 to 65 MiB of each executor's peak
(issue 19). Opening one again costs little against that: the slot opens its next database
ahead of need (``ScanDatabases._take_spare``), so a set of files met again costs a task
only locking the spare down and the files' footers read again (about 1 ms for
``lineitem``'s). One holds what every query over a catalog scans; the others serve
plans made before a table was registered, until they are done.
"""

_OPENER = ThreadPoolExecutor(1, thread_name_prefix="scan-db")
"""Opens the slots' next scan databases ahead of need (``ScanDatabases._take_spare``)
and closes the ones they drop."""


def locked_connection(
    spill_dir: str, budget: SlotBudget | None, threads: int, readable: Sequence[str] = ()
) -> duckdb.DuckDBPyConnection:
    """A slot's database, opened and locked down at once (``open_connection``, ``lock_down``)."""
    return lock_down(open_connection(spill_dir, budget, threads), readable)


def open_connection(
    spill_dir: str, budget: SlotBudget | None, threads: int
) -> duckdb.DuckDBPyConnection:
    """A slot's database with its budget, not locked down yet: it must run no SQL
    of a task before ``lock_down``."""
    con = duckdb.connect(database=":memory:", config=NO_EXTENSIONS)
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


def lock_down(
    con: duckdb.DuckDBPyConnection, readable: Sequence[str] = (), whole_query: bool = False
) -> duckdb.DuckDBPyConnection:
    """Finish ``open_connection``'s database: it may read the ``readable`` files
    (a scan database) or none, and no SQL can change its settings any more.
    ``whole_query``: its tasks run users' queries whole (``TaskSpec.whole_query``),
    which DuckDB plans as it plans them alone, its own join order on."""
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
    if whole_query:
        # Nothing of the query was placed by the planner: DuckDB's rules are what
        # orders its joins (a fallen-back plan: ``Stage.whole_query``).
        disabled = []
    if readable:
        # DuckDB 2.0.0's late materialization of a top-n (ORDER BY ... LIMIT
        # <= 50) over read_parquet fails on the scan's file_row_number filter
        # ("INTERNAL Error: Attempted to access index -9223372036854775807").
        disabled.append("late_materialization")
    con.execute("SET disabled_optimizers = ?", [",".join(disabled)])
    # A stage's rows keep DuckDB's own types across a shuffle (a HUGEINT is not
    # a DECIMAL(38, 0) when read again); a query's result is made plain by
    # ``arrow_types.PlainTypes``.
    con.execute("SET arrow_lossless_conversion = true")
    # Last: after these two, SQL can reach no file and change no setting.
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


class ScanDatabases:
    """The scan databases of one slot, each locked down to one set of files, the
    least recently used closed past ``SCAN_DATABASES``; and the next one, opened ahead.

    Used from the slot's thread only.

    Args:
        spill_dir: The slot's spill directory; each database spills in a directory
            of its own under it.
        budget: The slot's budget (``open_connection``).
        threads: DuckDB threads.
    """

    def __init__(self, spill_dir: str, budget: SlotBudget | None, threads: int) -> None:
        self._spill_dir = spill_dir
        self._budget = budget
        self._threads = threads
        self._cons: OrderedDict[tuple[frozenset[str], bool], duckdb.DuckDBPyConnection] = (
            OrderedDict()
        )
        self._seq = 0
        self.opened = 0
        """Scan databases this slot has locked down for a task, over its life."""
        self._spare: Future[duckdb.DuckDBPyConnection] | None = self._open_spare()
        """A scan database being opened ahead, on another thread, for the next set
        of files this slot has none for (``connection``)."""

    def __len__(self) -> int:
        """Scan databases kept open now (at most ``SCAN_DATABASES``)."""
        return len(self._cons)

    def connection(
        self, files: frozenset[str], whole_query: bool = False
    ) -> duckdb.DuckDBPyConnection:
        """The locked database that may read exactly ``files`` (resolved local paths:
        the local files of the task's job, with those of its splits), and no other;
        with DuckDB's join order on where ``whole_query`` (``lock_down``).

        Keyed by the job's files, not the task's: a query's scan tasks read several
        tables, and each set of files had a database of its own, so a TPC-DS query's
        first run opened one per table in each slot, each paying a fresh database's
        first Parquet read (about twice the page faults of the same read in a
        database that has read once; issue 20).
        """
        key = (files, whole_query)
        con = self._cons.pop(key, None)
        if con is None:
            self.opened += 1
            log.info(
                "slot %s opens scan database %d for %d files",
                self._spill_dir,
                self.opened,
                len(files),
            )
            con = lock_down(self._take_spare(), sorted(files), whole_query)
            while len(self._cons) >= SCAN_DATABASES:
                _, old = self._cons.popitem(last=False)
                # Closing a database takes 8 to 25 ms: on the opener's thread, not
                # on this task's path.
                _OPENER.submit(old.close)
        self._cons[key] = con  # most recently used last
        return con

    def close(self) -> None:
        """Close every scan database, the one opened ahead included."""
        for con in self._cons.values():
            con.close()
        self._cons.clear()
        spare, self._spare = self._spare, None
        if spare is not None and not spare.cancel():
            with contextlib.suppress(Exception):  # it failed to open: nothing to close
                spare.result().close()

    def _open_spare(self) -> Future[duckdb.DuckDBPyConnection]:
        return _OPENER.submit(open_connection, self._next_spill(), self._budget, self._threads)

    def _next_spill(self) -> str:
        self._seq += 1
        return os.path.join(self._spill_dir, f"scan-{self._seq}")

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
        return open_connection(self._next_spill(), self._budget, self._threads)
