"""A TPC-H query's plan run stage by stage in this process, one ``TaskRunner``.

Not a benchmark of record (``tpch.py`` is): a tool for finding what to make
faster in a task without a cluster's noise. Every task of every stage runs in
turn on one slot (one DuckDB thread), with each phase of ``TaskRunner.run``
timed (scan, shuffle read, DuckDB execution incl. split and write, commit);
``--profile`` wraps the runs in cProfile and prints the top functions.

Usage::

    .venv/bin/python benchmarks/inproc.py --scale 1 --queries 21,5 [--profile]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import CACHE_DIR, TPCH_TABLES, ensure_tpch, tpch_query  # noqa: E402

from mangonel.catalog import load_table  # noqa: E402
from mangonel.executor import runner as runner_mod  # noqa: E402
from mangonel.executor.runner import TaskRunner  # noqa: E402
from mangonel.executor.shuffle import ShuffleReader  # noqa: E402
from mangonel.executor.shuffle_write import ShuffleWriter  # noqa: E402
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId  # noqa: E402
from mangonel.plan.planner import plan_query  # noqa: E402
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


def run_query(number: int, runner: TaskRunner, writer: ShuffleWriter, catalog: dict) -> float:  # type: ignore[type-arg]
    plan = plan_query(tpch_query(number), catalog)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--queries", default="21")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    data = ensure_tpch(args.scale, CACHE_DIR)
    catalog = {t: load_table(t, str(data / f"{t}.parquet")) for t in TPCH_TABLES}
    work = Path(tempfile.mkdtemp(prefix="mangonel-inproc-"))
    writer = ShuffleWriter(str(work / "shuffle"))
    runner = TaskRunner(writer, ShuffleReader("local"), str(work / "spill"))
    runner_mod.read_scan = _timed("scan", runner_mod.read_scan)
    runner._read_input = _timed("shuffle read", runner._read_input)  # type: ignore[method-assign]
    runner._execute = _timed("execute+write", runner._execute)  # type: ignore[method-assign]
    profiler = cProfile.Profile() if args.profile else None
    numbers = [int(q) for q in args.queries.split(",")]
    run_query(numbers[0], runner, writer, catalog)  # warm-up
    PHASES.clear()
    total = 0.0
    cpu = time.process_time()
    if profiler:
        profiler.enable()
    for _ in range(args.repeat):
        for n in numbers:
            elapsed = run_query(n, runner, writer, catalog)
            total += elapsed
            print(f"q{n:02d}: {elapsed:.3f} s", file=sys.stderr)
    if profiler:
        profiler.disable()
    cpu = time.process_time() - cpu
    print(f"total {total:.3f} s, CPU {cpu:.3f} s; phases: "
          + ", ".join(f"{k} {v:.3f}" for k, v in PHASES.most_common()))  # fmt: skip
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
