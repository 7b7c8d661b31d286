"""The distributed planner's entry point: SQL text + catalog -> ``DistributedPlan``.

Steps: the front end parses and refuses what may not run; DuckDB (over empty
tables) binds the query, so unknown columns and type errors get DuckDB's own
words; sqlglot's optimizer qualifies and decorrelates; the binder builds the
logical plan, whose inner joins the join-order rule then orders by the estimates;
the distributor cuts it into stages. A query the binder does not
split runs whole, as one task that scans its tables — slower, never wrong —
and EXPLAIN says why.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from mangonel import defaults
from mangonel.catalog import Table
from mangonel.errors import BindError, InternalError
from mangonel.plan import probe
from mangonel.plan.bind import Binder, Unsupported, check_rewritten, check_supported
from mangonel.plan.config import PlannerConfig
from mangonel.plan.distribute import Distributor, describe
from mangonel.plan.dynamic_pruning import RangeSource, prune_row_groups
from mangonel.plan.eager import aggregate_early
from mangonel.plan.estimate import Estimator
from mangonel.plan.join_order import order_joins
from mangonel.plan.logical import Node, Opaque, Scan
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.probe import FileIdentity
from mangonel.plan.prune import prune_columns
from mangonel.plan.pushdown import push_filters
from mangonel.plan.semi_joins import semi_joins
from mangonel.plan.tiny import Tiny
from mangonel.plan.types import TypeOracle, oracle_for
from mangonel.plan.union_filters import union_filters
from mangonel.sql.explain import EXPLAIN
from mangonel.sql.frontend import DEFAULT_DIALECT, ParsedQuery, parse, to_duckdb
from mangonel.sql.optimize import optimize_query
from mangonel.storage import is_remote
from mangonel.task import OutputKind, OutputSpec

__all__ = ["PlanCache", "PlannerConfig", "plan_query"]
"""``PlannerConfig`` is ``plan.config``'s, named here for the planner's callers."""

_DEFAULT_CONFIG = PlannerConfig()
"""The default knobs (frozen: one instance serves every call that gives none)."""


def plan_query(
    sql: str,
    catalog: Mapping[str, Table],
    config: PlannerConfig = _DEFAULT_CONFIG,
    dialect: str | None = None,
) -> DistributedPlan:
    """Plan one SELECT statement (a leading EXPLAIN is accepted and ignored here).

    Raises:
        mangonel.errors.QueryError: (a subclass) when the query cannot run: syntax
            error, forbidden statement, unknown table or column, type error.
        mangonel.errors.InternalError: the query binds, but SQL the planner wrote
            for a part of it does not (a bug in the planner).
    """
    with _gc_paused():
        return _plan(sql, catalog, config, dialect)


def _plan(
    sql: str, catalog: Mapping[str, Table], config: PlannerConfig, dialect: str | None
) -> DistributedPlan:
    parsed = parse(sql, set(catalog), dialect)
    oracle = oracle_for({name: catalog[name] for name in parsed.tables})
    duck_sql = to_duckdb(parsed.query)
    names = [n for n, _ in _described(sql, parsed, duck_sql, oracle.describe)]
    schema: dict[str, object] = {t: oracle.table_types(t) for t in sorted(parsed.tables)}
    notes: list[str] = []
    pruned_by: tuple[FileIdentity, ...] = ()
    fallback: str | None = None
    distributor = _distributor(catalog, oracle, config, {})
    try:
        check_supported(parsed.query)
        # Not copied: ``duck_sql`` above is all this function needs of it otherwise.
        optimized = optimize_query(parsed.query, schema, parsed.dialect, copy=False)
        check_rewritten(optimized)
        tables = {t: catalog[t] for t in parsed.tables}
        binder = Binder(tables)
        node, _ = binder.bind(optimized)
        node = push_filters(node, binder.subqueries)
        prune_columns(node, binder.subqueries)
        pruned_by = prune_row_groups([node, *binder.subqueries.values()], tables, _probe(tables))
        estimator = Estimator(tables, binder.subqueries, Tiny(tables, probe.shared()))
        node = order_joins(node, binder.subqueries, estimator)
        semi_joins(node, binder.subqueries, estimator, tables)
        node = union_filters(node, binder.subqueries, estimator, tables, config.broadcast_bytes)
        aggregate_early([node, *binder.subqueries.values()], estimator, tables)
        distributor = _distributor(catalog, oracle, config, binder.subqueries, estimator)
        root = distributor.plan_tree(node)
    except BindError as err:
        # The query bound above: SQL the planner wrote for a part of it did not.
        raise InternalError(
            "internal error: DuckDB refused SQL that mangonel's planner wrote for a part "
            "of the query. The query itself is valid (it binds in DuckDB as a whole); "
            "this is a bug in mangonel, not in the query. Please report it with the "
            f"query's text and this message. DuckDB said: {err}"
        ) from err
    except (Unsupported, SqlglotError) as why:
        pruned_by = ()
        fallback = str(why) or type(why).__name__
        distributor = _distributor(catalog, oracle, config, {})
        root = distributor.plan_tree(_opaque(duck_sql, names, parsed.tables, catalog))
    distributor.finish(root, OutputSpec(OutputKind.SINGLE), describe(root.node) + " → result")
    notes += distributor.notes
    return DistributedPlan(
        tuple(distributor.stages),
        tuple(names),
        sql,
        tuple(notes),
        readable_files(catalog),
        pruned_by,
        fallback=fallback,
    )


READABLE_FILES_LIMIT = 1024
"""The most catalog files a plan lets its scan databases read (``readable_files``):
every task carries the list."""


def readable_files(catalog: Mapping[str, Table]) -> tuple[str, ...]:
    """The local files of every table in ``catalog``, sorted; empty when there are more
    than ``READABLE_FILES_LIMIT`` (see ``DistributedPlan.readable_files``).

    A scan database was opened per set of files the query scans, and a query's first
    run paid a fresh database's first Parquet read (about twice the page faults of
    a later one) in each slot it ran on: over TPC-DS's 99 queries at SF1, in order,
    the slots opened 143 databases keyed by each query's tables (272 keyed by each
    task's own files), 2 keyed by the catalog's (the sweep of the 99: 28.2-28.8 ->
    22.6 s).
    """
    files = {
        f
        for table in catalog.values()
        if table.text is None  # a CSV or JSON table's files are read by ``textfiles``
        for f in table.files
        if not is_remote(f)
    }
    if len(files) > READABLE_FILES_LIMIT:
        return ()
    return tuple(sorted(files))


def result_schema(sql: str, catalog: Mapping[str, Table], dialect: str | None = None) -> pa.Schema:
    """The schema of a query's result as DuckDB types it, without planning or running it.

    Column names are the user's; every column is nullable (what the executors
    write says no more). The result's own partitions may differ in width
    (``decimal(38, 2)`` here, ``decimal(18, 2)`` there) or in string encoding.

    Raises:
        mangonel.errors.QueryError: (a subclass) the query cannot run, as ``plan_query``.
    """
    parsed = parse(sql, set(catalog), dialect)
    oracle = oracle_for({name: catalog[name] for name in parsed.tables})
    schema = _described(sql, parsed, to_duckdb(parsed.query), oracle.arrow_schema)
    return pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])


_T = TypeVar("_T")


def _described(sql: str, parsed: ParsedQuery, duck_sql: str, bind: Callable[[str], _T]) -> _T:
    """``bind`` (a DESCRIBE of the type oracle) of the query as the user wrote
    it, where DuckDB reads that text: DuckDB names an unaliased column by its
    expression's text, which sqlglot's rendering changes (``string_agg`` becomes
    ``listagg``, ``len`` becomes ``length``, ``x::VARCHAR(3)`` loses its width),
    and the result's columns are named as DuckDB names them for the query
    itself. Else (another dialect, a text DuckDB does not bind alone: a
    qualified ``main.t``, a parameter) of ``duck_sql``, whose error is the
    query's."""
    if parsed.dialect == DEFAULT_DIALECT:
        text = EXPLAIN.sub("", sql, count=1) if parsed.explain else sql
        try:
            return bind(text)
        except BindError:
            pass
    return bind(duck_sql)


def parameter_types(
    sql: str, count: int, catalog: Mapping[str, Table], dialect: str | None = None
) -> list[pa.DataType | None]:
    """The Arrow type of each of a query's ``count`` parameters (``$1``, ``$2``...: see
    ``sql.params.numbered``), as DuckDB infers it from where it stands; ``None``
    where the query does not tell.

    Raises:
        mangonel.errors.QueryError: (a subclass) the query may not run, as ``parse``.
    """
    parsed = parse(sql, set(catalog), dialect)
    oracle = oracle_for({name: catalog[name] for name in parsed.tables})
    kinds = oracle.parameter_types(to_duckdb(parsed.query), count)
    if count < 2 or any(kinds):
        return kinds
    # DuckDB binds no plan where one parameter's type is open (``SELECT ?``): ask
    # for each one alone, the others NULL.
    alone: list[pa.DataType | None] = []
    for number in range(1, count + 1):
        query = parsed.query.copy()
        for node in list(query.find_all(exp.Placeholder)):
            if str(node.args.get("this") or "") != str(number):
                node.replace(exp.Null())
        alone.append(oracle.parameter_types(to_duckdb(query), count)[number - 1])
    return alone


_gc_lock = threading.Lock()
_gc_planners = 0
"""Plans in progress on any thread; the first one pauses the collector, the last
one resumes it a moment after it ends (``_gc_paused``)."""
_gc_paused_now = False
"""The collector is paused by ``_gc_paused`` (plans run, or one ended a moment ago)."""
_gc_was_enabled = False
_gc_paused_since = 0.0
"""``time.monotonic()`` when the collector was paused, or last collected while paused."""
_gc_resume_token = 0
"""Which plan's end may resume the collector: a plan that starts in the meantime
makes the waiting resume obsolete."""
GC_PAUSE_LIMIT_S = 0.5
"""The longest the collector stays paused while plans overlap or follow each other
without a gap: a plan ending after that collects (a scheduler planning for many
clients at once would otherwise never free the trees its plans left). The plan
that collects pays for what all the plans of the pause left, with the GIL held:
TPC-DS's 99 planned back to back three times, the slowest plan 400-630 ms at 2 s
(every other one under 70 ms), 160 ms at 0.5 s, the total the same (6.1 s); two
threads planning at once, the slowest 575-700 ms against 240-255 ms, the totals
within the noise (8.5-9.1 s). At 0.25 s and below the two threads took 10-15 %
longer: collections in the middle of the other thread's plans promote its trees."""
GC_RESUME_DELAY_S = 0.05
"""How long after the last plan ends the collector resumes (and frees that plan's
trees, 4 to 6 ms for a TPC-DS query at its next allocation): after the scheduler
has committed the job and sent its first tasks, not before (``_gc_paused``)."""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a query is planned, and a moment after.

    sqlglot's trees link each node to its parent, so every tree the planner
    builds, copies and drops is a reference cycle that only the collector frees.
    Planning allocates them by the ten thousand: the collector ran about 15 times
    a query, promoted trees still in use to the older generations, and then
    traversed everything the process holds to free them (a fifth of planning
    TPC-DS's 99 queries, 1.2 of 6 s). Paused, the trees a plan leaves behind are
    freed by the first young collection after it, in one pass. That pass took 4
    to 6 ms a query (TPC-DS SF1: 0.57 s for the 99), and ran as the plan ended,
    before the scheduler committed the job and launched its first tasks; the
    collector now resumes ``GC_RESUME_DELAY_S`` later, on a timer, while the
    tasks run on the executors. Planning allocates some megabytes in the
    meantime, for tens of milliseconds. A counter, not ``gc.isenabled()``,
    decides: with two plans on two threads, the first one to finish must not turn
    it back on under the other; a collector switched off by someone else stays
    off. Plans that overlap or follow each other without a gap for longer than
    ``GC_PAUSE_LIMIT_S`` get a collection as one of them ends.
    """
    global _gc_planners, _gc_paused_now, _gc_was_enabled, _gc_paused_since, _gc_resume_token
    with _gc_lock:
        if not _gc_paused_now:
            _gc_was_enabled = gc.isenabled()
            _gc_paused_now = True
            _gc_paused_since = time.monotonic()
        gc.disable()  # again if a resume is pending: someone may have turned it on
        _gc_planners += 1
        _gc_resume_token += 1
    try:
        yield
    finally:
        collect = False
        resume_later = 0
        with _gc_lock:
            _gc_planners -= 1
            overdue = time.monotonic() - _gc_paused_since > GC_PAUSE_LIMIT_S
            if _gc_planners == 0 and overdue:
                _resume_collector()
            elif _gc_planners == 0:
                resume_later = _gc_resume_token
            elif _gc_was_enabled and overdue:
                _gc_paused_since = time.monotonic()
                collect = True
        if resume_later:
            timer = threading.Timer(GC_RESUME_DELAY_S, _resume_after_plans, (resume_later,))
            timer.name = "gc-resume"
            timer.daemon = True
            timer.start()
        if collect:
            gc.collect()  # under the other plans, once in GC_PAUSE_LIMIT_S at most


def _resume_after_plans(token: int) -> None:
    """The timer ``_gc_paused`` started: resume unless a plan began since."""
    with _gc_lock:
        if token == _gc_resume_token and _gc_planners == 0 and _gc_paused_now:
            _resume_collector()


@atexit.register
def _resume_at_exit() -> None:
    """A pause pending at exit ends: Python's last collection runs only if it is on
    (the cycles left uncollected otherwise are reported as leaks by nanobind)."""
    with _gc_lock:
        if _gc_paused_now:
            _resume_collector()


def _resume_collector() -> None:
    """Under ``_gc_lock``: end the pause (the next allocation collects the young)."""
    global _gc_paused_now
    _gc_paused_now = False
    if _gc_was_enabled:
        gc.enable()


_WARM_UP_TABLE = "__warm_up"
_WARM_UP_SQL = f"""
    WITH t AS (SELECT k, v, d FROM {_WARM_UP_TABLE} WHERE d >= DATE '2000-01-01')
    SELECT t.v, count(*) AS n, sum(t.k) AS s, avg(u.x) AS a
    FROM t JOIN {_WARM_UP_TABLE} AS u ON t.k = u.k
    WHERE t.k IN (SELECT k FROM {_WARM_UP_TABLE} WHERE v LIKE 'a%')
    GROUP BY t.v ORDER BY n DESC LIMIT 10"""


def warm_up() -> None:
    """Plan one query over an empty stand-in table, so the first real query need not.

    A process's first planning pays once for what later ones get for free:
    sqlglot's dialects and optimizer rules imported on first use, the first
    DuckDB database and Arrow registration (which imports pandas). On a loaded
    2-core machine that was 1 to 2 s on top of the first query. The scheduler
    calls this on a thread at start; the type oracle it opens then serves the
    real tables too (``types.oracle_for``).
    """
    schema = pa.schema(
        [("k", pa.int64()), ("v", pa.string()), ("d", pa.date32()), ("x", pa.decimal128(7, 2))]
    )
    plan_query(_WARM_UP_SQL, {_WARM_UP_TABLE: Table(_WARM_UP_TABLE, "", (), schema, ())})
    # Plan-time pruning's DuckDB opened, and a first Parquet read paid, before a
    # query needs them (``probe.Probe.warm_up``).
    probe.shared().warm_up()


class PlanCache:
    """The plans of recent queries, reused while the catalog is the one they were
    planned against.

    Planning in Python costs milliseconds (TPC-H SF1: 5 to 35 ms a query, about
    300 ms for the 22), where running a small query costs tens: a dashboard or a
    benchmark sending the same SQL again pays it once. A plan depends on the SQL,
    the dialect, the planner's settings and the tables (their files, row groups
    and statistics, read when they were registered); registering or dropping any
    table starts afresh; so does a plan pruned by a dimension whose local file has
    changed since (``DistributedPlan.pruned_by``). Thread-safe; planning runs outside
    the lock.

    Args:
        size: Plans kept, the least recently used dropped first; 0 keeps none.
    """

    def __init__(self, size: int = defaults.PLAN_CACHE) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._plans: OrderedDict[
            tuple[str, str, PlannerConfig], tuple[Mapping[str, Table], DistributedPlan]
        ] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def plan(
        self,
        sql: str,
        catalog: Mapping[str, Table],
        config: PlannerConfig = _DEFAULT_CONFIG,
        dialect: str | None = None,
    ) -> DistributedPlan:
        """``plan_query``'s plan, from the cache when it holds one for this catalog."""
        key = (sql, dialect or "", config)
        with self._lock:
            entry = self._plans.get(key)
            if (
                entry is not None
                and _same_tables(entry[0], catalog)
                and probe.unchanged(entry[1].pruned_by)
            ):
                self._plans.move_to_end(key)
                self.hits += 1
                return entry[1]
            self.misses += 1
        plan = plan_query(sql, catalog, config, dialect)
        if self.size > 0:
            with self._lock:
                # The catalog copy keeps its tables alive: their ids stay theirs.
                self._plans[key] = (dict(catalog), plan)
                self._plans.move_to_end(key)
                while len(self._plans) > self.size:
                    self._plans.popitem(last=False)
        return plan


def _same_tables(a: Mapping[str, Table], b: Mapping[str, Table]) -> bool:
    """True when both name the same table objects (a table registered again is new)."""
    return a.keys() == b.keys() and all(a[name] is b[name] for name in a)


def _distributor(
    catalog: Mapping[str, Table],
    oracle: TypeOracle,
    config: PlannerConfig,
    subqueries: Mapping[str, Node],
    estimator: Estimator | None = None,
) -> Distributor:
    return Distributor(
        catalog,
        oracle,
        subqueries,
        config.partitions,
        config.broadcast_bytes,
        config.scan_split_rows,
        estimator,
        config.partition_bytes or None,
        config.inline_scan_bytes,
        # One task at full speed at a time: a producer apart runs no sooner.
        (config.fuse_bytes or None) if config.parallel != 1 else None,
        config.slots,
        config.recompute_bytes,
        config.parallel,
    )


def _probe(tables: Mapping[str, Table]) -> RangeSource | None:
    """The probe that evaluates dimensions for plan-time pruning, or None where no
    table has two row groups (nothing to prune: the probe is not even opened)."""
    if all(len(t.row_groups) < 2 for t in tables.values()):
        return None
    return probe.shared()


def _opaque(
    duck_sql: str, names: list[str], tables: frozenset[str], catalog: Mapping[str, Table]
) -> Opaque:
    query = sqlglot.parse_one(duck_sql, read=DEFAULT_DIALECT)
    sources: dict[str, Node] = {t: Scan(t, t, list(catalog[t].columns)) for t in sorted(tables)}
    return Opaque(query, "_q", [f"c{i}" for i in range(len(names))], sources)  # type: ignore[arg-type]
