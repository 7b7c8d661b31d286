"""The seed scenario: an executor SIGKILLed half-way through TPC-H q12 at SF 1.

Apache Ballista, the project's ancestor, notices such a kill only by its 180 s
heartbeat timeout and then stalls (300-420 s to a correct answer, see
ARCHITECTURE.md); mangonel's target is a few seconds. This runs q12 on a
``LocalCluster`` of 2 executors: ``--repeat`` fault-free runs after one warm-up
(the fastest counts), then one run in which an executor SIGKILLs itself right
after reporting its N-th task, half its share of the query's tasks by default
(``--kill-after-tasks``; a fault rule, so the kill lands at the same point on
every run). Prints:

* the fault-free time and the time with the kill (and their difference);
* when it died (and what share of the fault-free time that is);
* the detection latency: from its death (seen by a thread waiting on the
  process) to the scheduler marking it lost (the ``since`` of its status entry);
* the reason the scheduler gives, the tasks re-run and the outputs recomputed;
* whether both answers match single-process DuckDB.

Not a test: timings belong here. Usage::

    .venv/bin/python benchmarks/seed_kill.py [--scale 1] [--json seed_kill.json]

Exits 1 when an answer is wrong or the kill did not land mid-query.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import (  # noqa: E402  (the test helpers live outside the package)
    CACHE_DIR,
    TPCH_ORDER_BY,
    TPCH_TABLES,
    compare_results,
    duckdb_over,
    ensure_tpch,
    tpch_query,
)

QUERY = 12


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--executors", type=int, default=2, help="executor processes (default 2)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per exchange")
    parser.add_argument("--repeat", type=int, default=2, help="fault-free runs; the fastest counts")
    parser.add_argument(
        "--kill-after-tasks",
        type=int,
        help="the executor dies after its N-th task (default: half its share of the tasks)",
    )
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON here")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="where data is cached")
    parser.add_argument("--work-dir", type=Path, help="cluster work dir (default: temp)")
    args = parser.parse_args(argv)
    if args.executors < 2:
        parser.error("--executors must be at least 2: one has to survive")
    if args.kill_after_tasks is not None and args.kill_after_tasks < 1:
        parser.error("--kill-after-tasks must be at least 1")
    return args


def mismatch(actual: Any, expected: Any) -> str | None:
    order_by = TPCH_ORDER_BY[QUERY]
    return compare_results(actual, expected, ordered=bool(order_by), order_by=order_by)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mangonel.client.demo import describe_kill, halfway_tasks
    from mangonel.testing.cluster import TestCluster
    from mangonel.testing.kill import run_with_fault_kill

    print(f"generating or reusing TPC-H SF {args.scale:g} ...", file=sys.stderr)
    data = ensure_tpch(args.scale, args.cache_dir)
    tables = {name: data / f"{name}.parquet" for name in TPCH_TABLES}
    sql = tpch_query(QUERY)
    con = duckdb_over(tables)
    started = time.perf_counter()
    expected = con.sql(sql).to_arrow_table()
    duckdb_s = time.perf_counter() - started

    own_work_dir = args.work_dir is None
    work_root = args.work_dir or Path(tempfile.mkdtemp(prefix="mangonel-seed-kill-"))
    with (
        TestCluster(
            executors=args.executors, work_dir=str(work_root), partitions=args.partitions
        ) as cluster,
        cluster.connect() as session,
    ):
        for name, path in tables.items():
            session.register_parquet(name, str(path))
        print("warm-up and fault-free runs ...", file=sys.stderr)
        session.sql(sql)
        runs = [session.sql(sql) for _ in range(args.repeat)]
        fault_free = min(runs, key=lambda r: r.elapsed_s)
        nth = args.kill_after_tasks or halfway_tasks(fault_free, args.executors)
        print(f"the run with a kill after an executor's task #{nth} ...", file=sys.stderr)
        report = run_with_fault_kill(cluster, session, sql, nth)

    clean_wrong = mismatch(fault_free.to_arrow(), expected)
    kill_wrong = mismatch(report.result.to_arrow(), expected)
    ok = clean_wrong is None and kill_wrong is None
    if own_work_dir and ok:
        shutil.rmtree(work_root, ignore_errors=True)
    elif own_work_dir:
        print(f"cluster work directory (logs) kept at {work_root}", file=sys.stderr)

    print(
        f"TPC-H q{QUERY} at SF {args.scale:g}, {args.executors} executors, "
        f"{args.partitions} partitions per exchange\n"
    )
    print(describe_kill(report, fault_free))
    print()
    print("| measure | value |")
    print("|---|---:|")
    print(f"| DuckDB, single process | {duckdb_s:.3f} s |")
    print(f"| mangonel fault-free (fastest of {args.repeat}) | {fault_free.elapsed_s:.3f} s |")
    print(f"| mangonel with the kill | {report.result.elapsed_s:.3f} s |")
    print(f"| cost of the kill | {report.result.elapsed_s - fault_free.elapsed_s:+.3f} s |")
    share = report.killed_after_s / fault_free.elapsed_s
    print(
        f"| kill (after its task #{report.after_tasks}), after submission "
        f"| {report.killed_after_s:.3f} s ({share:.0%} of fault-free) |"
    )
    detection = report.detected_after_s
    print(f"| detection latency | {'never' if detection is None else f'{detection:.3f} s'} |")
    print(f"| lost because | {report.reason or '-'} |")
    print(f"| tasks re-run (cut off or failed) | {report.tasks_rerun} |")
    print(f"| outputs recomputed (lost with it) | {report.outputs_recomputed} |")
    print(f"| fault-free answer matches DuckDB | {'yes' if clean_wrong is None else 'NO'} |")
    print(f"| answer with the kill matches DuckDB | {'yes' if kill_wrong is None else 'NO'} |")
    for what, text in (("fault-free", clean_wrong), ("with the kill", kill_wrong)):
        if text is not None:
            print(f"\n{what}: {text}", file=sys.stderr)

    if args.json is not None:
        payload = {
            "query": QUERY,
            "scale": args.scale,
            "executors": args.executors,
            "partitions": args.partitions,
            "duckdb_s": duckdb_s,
            "fault_free_s": fault_free.elapsed_s,
            "with_kill_s": report.result.elapsed_s,
            "killed_after_s": report.killed_after_s,
            "killed_after_tasks": report.after_tasks,
            "detection_latency_s": detection,
            "lost_reason": report.reason,
            "lost_detail": report.detail,
            "killed_executor": report.executor_id,
            "tasks_total": report.tasks_total,
            "tasks_rerun": report.tasks_rerun,
            "outputs_recomputed": report.outputs_recomputed,
            "fault_free_matches_duckdb": clean_wrong is None,
            "with_kill_matches_duckdb": kill_wrong is None,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
