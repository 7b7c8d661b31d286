"""A TPC-H (or TPC-DS) query's plan run stage by stage in this process, one ``TaskRunner``.

Not a benchmark of record (``tpch.py`` is): a tool for finding what to make
faster in a task without a cluster's noise. The plan is made for ``--slots`` slots
(default 1: one host of one core), and every task of every stage runs in
turn on one slot (one DuckDB thread), with each phase of ``TaskRunner.run``
timed (scan, shuffle read, DuckDB execution incl. split and write, commit);
``--profile`` wraps the runs in cProfile and prints the top functions.
``--duckdb`` also runs each query whole in DuckDB on one thread, interleaved, and
prints the ratio: where it is well above 1 for a plan of one task, the plan (its
join order, its aggregates' places) costs more than DuckDB's own, not the cluster.

Usage::

    .venv/bin/python benchmarks/inproc.py --scale 1 --queries 21,5 [--profile]
    .venv/bin/python benchmarks/inproc.py --suite tpcds --queries 1-99 --repeat 3 --duckdb
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

import duckdb  # noqa: E402
from helpers import (  # noqa: E402
    CACHE_DIR,
    TPCDS_TABLES,
    TPCH_TABLES,
    ensure_tpcds,
    ensure_tpch,
    tpcds_query,
    tpch_query,
)

from mangonel.catalog import load_table  # noqa: E402
from mangonel.executor import runner as runner_mod  # noqa: E402
from mangonel.executor.runner import TaskRunner  # noqa: E402
from mangonel.executor.shuffle import ShuffleReader  # noqa: E402
from mangonel.executor.shuffle_write import ShuffleWriter  # noqa: E402
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId  # noqa: E402
from mangonel.plan.planner import PlannerConfig, plan_query  # noqa: E402
from mangonel.task import (  # noqa: E402
    InputLocations,
    InputMode,
    PartitionLocation,
    PartitionOutput,
    ScanSpec,
    TaskSpec,
)

PHASES: collections.Counter[str] = collections.Counter()


def _timed(name: str, fn):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PHASES[name] += time.perf_counter() - started

    return wrapper


def _location(stage: StageId, map_partition: int, out: PartitionOutput) -> PartitionLocation:
    return PartitionLocation(
        ExecutorId("local"), "local", "", stage, map_partition, out.partition,
        out.path, out.rows, out.bytes, out.checksum,
    )  # fmt: skip


def run_query(
    sql: str,
    number: int,
    runner: TaskRunner,
    writer: ShuffleWriter,
    catalog: dict,  # type: ignore[type-arg]
    config: PlannerConfig,
) -> float:
    plan = plan_query(sql, catalog, config)
    job = JobId(f"q{number:02d}x{time.monotonic_ns() % 100000}")
    outputs: dict[StageId, list[PartitionLocation]] = {}
    started = time.perf_counter()
    for stage in plan.stages:
        locs: list[PartitionLocation] = []
        stage_started = time.perf_counter()
        for partition in range(stage.num_tasks):
            inputs = tuple(
                InputLocations(
                    i.name,
                    i.stage,
                    i.mode,
                    tuple(
                        loc
                        for loc in outputs[i.stage]
                        if i.mode is InputMode.ALL or loc.partition == partition
                    ),
                    plan.stage(i.stage).columns,
                )
                for i in stage.inputs
            )
            scans = (stage.scan,) if stage.scan is not None else ()
            spec = TaskSpec(
                TaskAttemptId(TaskId(job, stage.id, partition), 0),
                stage.sql,
                stage.output,
                stage.columns,
                tuple(
                    ScanSpec(s.name, s.table, s.columns, s.splits_of(partition))
                    for s in scans + stage.side_scans
                ),
                inputs,
            )
            for out in runner.run(spec, writer):
                locs.append(_location(stage.id, partition, out))
        outputs[stage.id] = locs
        print(
            f"  q{number:02d} s{stage.id} {stage.num_tasks} tasks "
            f"{time.perf_counter() - stage_started:.3f} s "
            f"{sum(loc.bytes for loc in locs) / 1e6:.1f} MB  {stage.label}",
            file=sys.stderr,
        )
    elapsed = time.perf_counter() - started
    writer.release(job)
    return elapsed


def _numbers(text: str) -> list[int]:
    """``1,3,5`` or ``1-22`` or a mix."""
    numbers: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        numbers += range(int(low), int(high or low) + 1)
    return numbers


def _duckdb_alone(data: Path, tables: tuple[str, ...]) -> duckdb.DuckDBPyConnection:
    """DuckDB on one thread over views of the same Parquet files."""
    con = duckdb.connect()
    con.execute("SET threads = 1")
    for table in tables:
        path = str(data / f"{table}.parquet").replace("'", "''")
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{path}')")
    return con


def _timed_duckdb(con: duckdb.DuckDBPyConnection, sql: str) -> float:
    started = time.perf_counter()
    con.sql(sql).to_arrow_table()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=("tpch", "tpcds"), default="tpch")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--queries", default="21", help="e.g. 21,5 or 1-99")
    parser.add_argument("--repeat", type=int, default=1, help="runs; the median counts")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--duckdb", action="store_true", help="also run each query whole in DuckDB, 1 thread"
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=1,
        help="the slots the plan is made for (default 1: one host of one core)",
    )
    args = parser.parse_args()
    if args.suite == "tpcds":
        data, tables, text = ensure_tpcds(args.scale, CACHE_DIR), TPCDS_TABLES, tpcds_query
    else:
        data, tables, text = ensure_tpch(args.scale, CACHE_DIR), TPCH_TABLES, tpch_query
    catalog = {t: load_table(t, str(data / f"{t}.parquet")) for t in tables}
    alone = _duckdb_alone(data, tables) if args.duckdb else None
    config = PlannerConfig(slots=args.slots, parallel=args.slots)
    work = Path(tempfile.mkdtemp(prefix="mangonel-inproc-"))
    writer = ShuffleWriter(str(work / "shuffle"))
    runner = TaskRunner(writer, ShuffleReader("local"), str(work / "spill"))
    runner_mod.read_scan = _timed("scan", runner_mod.read_scan)
    runner._read_input = _timed("shuffle read", runner._read_input)  # type: ignore[method-assign]
    runner._execute = _timed("execute+write", runner._execute)  # type: ignore[method-assign]
    profiler = cProfile.Profile() if args.profile else None
    numbers = _numbers(args.queries)
    run_query(text(numbers[0]), numbers[0], runner, writer, catalog, config)  # warm-up
    PHASES.clear()
    total = total_alone = 0.0
    cpu = time.process_time()
    if profiler:
        profiler.enable()
    for n in numbers:
        sql = text(n)
        ours, theirs = [], []
        for _ in range(args.repeat):
            ours.append(run_query(sql, n, runner, writer, catalog, config))
            if alone is not None:
                theirs.append(_timed_duckdb(alone, sql))
        mine = statistics.median(ours)
        total += mine
        line = f"q{n:02d}: {mine:.3f} s"
        if theirs:
            duck = statistics.median(theirs)
            total_alone += duck
            line += f"  duckdb {duck:.3f} s  ×{mine / duck:.2f}"
        print(line, file=sys.stderr)
    if profiler:
        profiler.disable()
    cpu = time.process_time() - cpu
    print(f"total {total:.3f} s, CPU {cpu:.3f} s; phases: "
          + ", ".join(f"{k} {v:.3f}" for k, v in PHASES.most_common()))  # fmt: skip
    if alone is not None:
        print(f"duckdb alone {total_alone:.3f} s: ×{total / total_alone:.2f}")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
