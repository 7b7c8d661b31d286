"""The scheduler's own crash, measured: recovery time and the cost of durable state.

Two measurements, both on ``LocalCluster``s of 2 executors over TPC-H:

* **Recovery** (``--query``, q9 by default): fault-free runs (the fastest
  counts), then one run in which the scheduler SIGKILLs itself half-way
  through the query (a crash rule, ``mangonel.scheduler.crash``: after the
  N-th task report, N = half the tasks), and is started again at once, as a
  supervisor would. Prints the time from the scheduler's death until it serves
  again, until every executor has reattached, and the query's total time
  against the fault-free one; the client only called ``session.sql``.
* **Persistence overhead** (``--overhead``): the 22 queries on two clusters side
  by side, one keeping its state in SQLite (the default) and one in memory
  (``--state memory://``), interleaved per query, median of ``--repeat`` runs,
  every answer checked against DuckDB.

Not a test: timings belong here. Usage::

    .venv/bin/python benchmarks/scheduler_crash.py --scale 1 [--overhead] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--query", type=int, default=9, help="query killed half-way (default 9)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (default 3)")
    parser.add_argument(
        "--overhead", action="store_true", help="also measure SQLite state vs in-memory state"
    )
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON here")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument(
        "--work-dir", type=Path, help="clusters' work dirs and logs (default: temp)"
    )
    return parser.parse_args(argv)


def wrong(number: int, actual: Any, expected: Any) -> str | None:
    order_by = TPCH_ORDER_BY[number]
    return compare_results(actual, expected, ordered=bool(order_by), order_by=order_by)


def recovery(
    args: argparse.Namespace, tables: dict[str, Path], con: Any, work: Path
) -> dict[str, Any]:
    from mangonel.client.cluster import LocalCluster
    from mangonel.client.status import ExecutorState
    from mangonel.options import TEST_HOOKS_ENV

    # --crash-file is a test-only option: the scheduler (a child) takes it with the hooks on.
    os.environ[TEST_HOOKS_ENV] = "1"
    sql = tpch_query(args.query)
    expected = con.sql(sql).to_arrow_table()
    crash_file = work / "crash.json"
    with (
        LocalCluster(
            executors=2,
            work_dir=work / "recovery",
            scheduler_args=("--crash-file", str(crash_file)),
        ) as cluster,
        cluster.connect() as session,
    ):
        for name, path in tables.items():
            session.register_parquet(name, str(path))
        session.sql(sql)  # warm-up
        runs = [session.sql(sql) for _ in range(args.repeat)]
        fault_free = min(runs, key=lambda r: r.elapsed_s)
        tasks = sum(s.attempts for s in fault_free.stages)
        nth = max(1, tasks // 2)
        crash_file.write_text(json.dumps([{"event": "TaskCompleted", "nth": nth}]))
        executors = {h.id for h in cluster.executors}
        outcome: dict[str, Any] = {}
        started = time.monotonic()
        runner = threading.Thread(target=lambda: outcome.setdefault("result", session.sql(sql)))
        runner.start()
        scheduler = cluster.scheduler
        assert scheduler is not None
        code = scheduler.process.wait(300)
        died = time.monotonic()
        if code != -signal.SIGKILL:
            raise SystemExit(f"the scheduler exited with {code}, not by the crash rule")
        crash_file.write_text("[]")
        cluster.restart_scheduler()
        serving = time.monotonic()
        with cluster.connect() as watcher:
            while True:
                alive = {e.id for e in watcher.status().executors if e.state is ExecutorState.ALIVE}
                if alive >= executors:
                    break
                time.sleep(0.01)
        reattached = time.monotonic()
        runner.join(300)
        done = time.monotonic()
        result = outcome["result"]
        return {
            "query": args.query,
            "tasks": tasks,
            "crash_after_task_reports": nth,
            "fault_free_s": fault_free.elapsed_s,
            "with_crash_s": done - started,
            "crash_after_s": died - started,
            "restart_to_serving_s": serving - died,
            "restart_to_executors_back_s": reattached - died,
            "tasks_rerun": result.tasks_rerun,
            "outputs_recomputed": result.outputs_recomputed,
            "same_job": True,
            "fault_free_matches_duckdb": wrong(args.query, fault_free.to_arrow(), expected) is None,
            "with_crash_matches_duckdb": wrong(args.query, result.to_arrow(), expected) is None,
        }


def overhead(
    args: argparse.Namespace, tables: dict[str, Path], con: Any, work: Path
) -> dict[str, Any]:
    from mangonel.client.cluster import LocalCluster

    clusters = {
        "sqlite": LocalCluster(executors=2, work_dir=work / "sqlite"),
        "memory": LocalCluster(executors=2, work_dir=work / "memory", state="memory://"),
    }
    times: dict[str, dict[int, float]] = {name: {} for name in clusters}
    bad: list[str] = []
    for cluster in clusters.values():
        cluster.start()
    try:
        sessions = {name: c.connect() for name, c in clusters.items()}
        for session in sessions.values():
            for name, path in tables.items():
                session.register_parquet(name, str(path))
        for number in range(1, 23):
            sql = tpch_query(number)
            expected = con.sql(sql).to_arrow_table()
            samples: dict[str, list[float]] = {name: [] for name in clusters}
            for session in sessions.values():
                session.sql(sql)  # warm-up
            for _ in range(args.repeat):
                for name, session in sessions.items():
                    result = session.sql(sql)
                    samples[name].append(result.elapsed_s)
                    if wrong(number, result.to_arrow(), expected) is not None:
                        bad.append(f"q{number} on {name}")
            for name in clusters:
                times[name][number] = statistics.median(samples[name])
            print(
                f"q{number}: sqlite {times['sqlite'][number]:.3f} s, "
                f"memory {times['memory'][number]:.3f} s",
                file=sys.stderr,
            )
        for session in sessions.values():
            session.close()
    finally:
        for cluster in clusters.values():
            cluster.stop()
    totals = {name: sum(t.values()) for name, t in times.items()}
    return {
        "per_query_s": times,
        "total_s": totals,
        "ratio_sqlite_to_memory": totals["sqlite"] / totals["memory"],
        "wrong_answers": bad,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"generating or reusing TPC-H SF {args.scale:g} ...", file=sys.stderr)
    data = ensure_tpch(args.scale, args.cache_dir)
    tables = {name: data / f"{name}.parquet" for name in TPCH_TABLES}
    con = duckdb_over(tables)
    payload: dict[str, Any] = {"scale": args.scale, "repeat": args.repeat}
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="mangonel-crash-bench-"))
    print(f"cluster work directories and logs under {work}", file=sys.stderr)
    rec = recovery(args, tables, con, work)
    payload["recovery"] = rec
    print(f"\nTPC-H q{rec['query']} at SF {args.scale:g}, 2 executors, SQLite state\n")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| fault-free (fastest of {args.repeat}) | {rec['fault_free_s']:.3f} s |")
    print(
        f"| with the scheduler killed after {rec['crash_after_task_reports']} of "
        f"{rec['tasks']} task reports, restarted at once | {rec['with_crash_s']:.3f} s |"
    )
    print(f"| killed at | {rec['crash_after_s']:.3f} s after submission |")
    serving = rec["restart_to_serving_s"]
    print(f"| death to serving again (process start, recovery) | {serving:.3f} s |")
    print(f"| death to every executor reattached | {rec['restart_to_executors_back_s']:.3f} s |")
    rerun, recomputed = rec["tasks_rerun"], rec["outputs_recomputed"]
    print(f"| tasks re-run / outputs recomputed | {rerun} / {recomputed} |")
    print(
        f"| answers match DuckDB (fault-free / with crash) | "
        f"{'yes' if rec['fault_free_matches_duckdb'] else 'NO'} / "
        f"{'yes' if rec['with_crash_matches_duckdb'] else 'NO'} |"
    )
    ok = rec["fault_free_matches_duckdb"] and rec["with_crash_matches_duckdb"]
    if args.overhead:
        over = overhead(args, tables, con, work)
        payload["overhead"] = over
        print(f"\n22 TPC-H queries at SF {args.scale:g}, median of {args.repeat}, interleaved\n")
        print("| query | SQLite state (s) | in-memory state (s) | ratio |")
        print("|---|---:|---:|---:|")
        for number in range(1, 23):
            a = over["per_query_s"]["sqlite"][number]
            b = over["per_query_s"]["memory"][number]
            print(f"| q{number} | {a:.3f} | {b:.3f} | {a / b:.2f} |")
        t = over["total_s"]
        print(
            f"| **total** | **{t['sqlite']:.2f}** | **{t['memory']:.2f}** | "
            f"**{over['ratio_sqlite_to_memory']:.3f}** |"
        )
        if over["wrong_answers"]:
            print(f"wrong answers: {over['wrong_answers']}", file=sys.stderr)
            ok = False
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    if args.work_dir is None and ok:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
