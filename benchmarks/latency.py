"""Where a short query's time goes, phase by phase, on a real LocalCluster.

The fixed costs of a query (planning, the durable commit per event, launching a
task, opening its scan database, the report round trip, the result fetch) are
invisible in a big query and most of a short one. On one 2-executor
``LocalCluster`` over TPC-DS (or TPC-H, ``--suite tpch``, either ``--layout``),
in the order given, it runs each query once (its
first run: not planned before, its tables maybe not scanned before; the first
query of all also pays the processes' own first use of DuckDB and pyarrow) and
then ``--repeat`` more times (the plan cache and the slots' scan databases
warm), and splits each run, from the client's clock and the scheduler's task
attempts (``/api/jobs/{id}``), into:

* ``submit``: the Submit RPC, which returns once the query is planned, the job
  committed and its first tasks launched (planning is most of it on a first run);
* ``tasks``: the executors' own time of the tasks on the critical path (the
  longest attempt of each stage, summed over the stages);
* ``gaps``: the rest of the scheduler's time: between one stage's last task
  ending (on its executor) and the next stage's first launch (report round
  trip, event, durable commit, launch), from the Submit answer to the first
  launch (none: the launch comes first), and from the last task's end to the
  job's end;
* ``watch``: from the job's end (scheduler) to the client hearing it;
* ``fetch``: reading the result from the executors (Flight) and releasing it.

It also plans each query in this process, without the plan cache, the first
time and again. Not a test: timings belong here.

Usage::

    .venv/bin/python benchmarks/latency.py --scale 1 --queries 0,21,41,12,1 [--repeat 5]
    git archive main src | tar -x -C /tmp/base   # then, A (this checkout) against B:
    .venv/bin/python benchmarks/latency.py --no-planning --base-src /tmp/base/src
    .venv/bin/python benchmarks/latency.py --suite tpch --layout random --queries 1-22
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import (  # noqa: E402
    TPCDS_TABLES,
    TPCH_TABLES,
    duckdb_over,
    ensure_tpcds,
    ensure_tpch,
    tpcds_query,
    tpch_query,
)

TRIVIAL = {"tpcds": "SELECT count(*) AS n FROM store", "tpch": "SELECT count(*) AS n FROM nation"}
TABLES = {"tpcds": TPCDS_TABLES, "tpch": TPCH_TABLES}
PHASES = ("submit", "tasks", "gaps", "watch", "fetch", "total")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--suite", choices=("tpcds", "tpch"), default="tpcds")
    parser.add_argument(
        "--layout",
        choices=("generated", "random"),
        default="generated",
        help="TPC-H only: the tables as generated, or their rows in a fixed random order "
        "(tpch.py's --layout random)",
    )
    parser.add_argument("--queries", default="0,21,41,12,1", help="query numbers; 0 = trivial")
    parser.add_argument("--repeat", type=int, default=5, help="warm runs after the first")
    parser.add_argument("--no-planning", action="store_true", help="skip the in-process planning")
    parser.add_argument(
        "--base-src",
        help="also run B, a cluster of this src/ directory (e.g. main's, unpacked with "
        "git archive), side by side: each query on A and B in turn",
    )
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def query_text(suite: str, number: int) -> str:
    if number == 0:
        return TRIVIAL[suite]
    return tpch_query(number) if suite == "tpch" else tpcds_query(number)


def suite_data(args: argparse.Namespace) -> Path:
    """The directory of the suite's tables at ``--scale`` (generated once, cached)."""
    if args.suite == "tpcds":
        return ensure_tpcds(args.scale)
    data = ensure_tpch(args.scale)
    if args.layout == "random":
        from tpch import random_layout

        data = random_layout(data, data.parent, args.scale)
    return data


def job_detail(web_url: str, job_id: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{web_url}/api/jobs/{job_id}", timeout=10) as reply:
        detail: dict[str, Any] = json.load(reply)
    return detail


def one_run(session: Any, web_url: str, sql: str) -> dict[str, float]:
    """One query's phases in seconds (see the module docstring)."""
    fetch_s = 0.0
    flight = session._flight
    read = flight.read

    def timed_read(*args: Any, **kwargs: Any) -> Any:
        nonlocal fetch_s
        started = time.perf_counter()
        try:
            return read(*args, **kwargs)
        finally:
            fetch_s += time.perf_counter() - started

    flight.read = timed_read
    try:
        t0 = time.perf_counter()
        w0 = time.time()
        job_id = session.submit(sql)
        t1 = time.perf_counter()
        result = session.wait(job_id)
        t2 = time.perf_counter()
    finally:
        flight.read = read
    detail = job_detail(web_url, job_id)
    attempts = [a for a in detail["attempts"] if a["state"] == "succeeded"]
    submitted = detail["submitted_at"]
    job_end = submitted + detail["elapsed_s"]
    by_stage: dict[int, list[dict[str, Any]]] = {}
    for a in attempts:
        by_stage.setdefault(a["stage"], []).append(a)
    tasks = sum(max(a["elapsed_s"] or 0.0 for a in group) for group in by_stage.values())
    first_launch = min(a["launched_at"] for a in attempts)
    submit_s = t1 - t0
    # The scheduler's clock is Unix time: place the Submit answer on it.
    answered = w0 + submit_s
    run_s = job_end - max(first_launch, answered)
    total = t2 - t0
    watch = max(0.0, total - submit_s - run_s - fetch_s)
    return {
        "submit": submit_s,
        "tasks": tasks,
        "gaps": max(0.0, run_s - tasks),
        "watch": watch,
        "fetch": fetch_s,
        "total": total,
        "stages": float(len(by_stage)),
        "tasks_n": float(len(attempts)),
        "scheduler": result.scheduler_elapsed_s,
    }


def planning(suite: str, numbers: list[int], data: Path) -> dict[int, dict[str, float]]:
    """Plan each query in this process twice, without the plan cache: the first
    time (nothing of the query warm) and again. A trivial query is planned first,
    so the process's own start (imports) is not in the first query's time."""
    from mangonel.catalog import load_table
    from mangonel.plan.planner import PlannerConfig, plan_query

    started = time.perf_counter()
    catalog = {t: load_table(t, str(data / f"{t}.parquet")) for t in TABLES[suite]}
    print(f"catalog load (footers of {len(catalog)} tables): "
          f"{(time.perf_counter() - started) * 1e3:.0f} ms", file=sys.stderr)  # fmt: skip
    started = time.perf_counter()
    plan_query("SELECT 1 AS x", catalog, PlannerConfig())
    print(f"process warm-up (a trivial query's planning): "
          f"{(time.perf_counter() - started) * 1e3:.0f} ms", file=sys.stderr)  # fmt: skip
    out: dict[int, dict[str, float]] = {}
    for number in numbers:
        sql = query_text(suite, number)
        times = []
        for _ in range(2):
            started = time.perf_counter()
            plan_query(sql, catalog, PlannerConfig())
            times.append(time.perf_counter() - started)
        out[number] = {"plan first": times[0], "plan again": times[1]}
    return out


def started(work: Path, src: str | None, data: Path, suite: str) -> tuple[Any, Any]:
    """A 2-executor cluster running ``src`` (this checkout's when ``None``), tables registered."""
    import mangonel

    before = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = src
    try:
        cluster = mangonel.LocalCluster(executors=2, work_dir=str(work), web_port=0).start()
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    session = cluster.connect()
    for name in TABLES[suite]:
        session.register_parquet(name, str(data / f"{name}.parquet"))
    return cluster, session


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tpcds import parse_queries  # ranges too: "1-22"

    numbers = parse_queries(args.queries)
    data = suite_data(args)
    results: dict[str, Any] = {
        "suite": args.suite,
        "layout": args.layout,
        "scale": args.scale,
        "queries": {},
    }
    if not args.no_planning:
        plans = planning(args.suite, numbers, data)
        results["planning"] = {str(k): v for k, v in plans.items()}
        print("| query | plan first ms | plan again ms |")
        print("|---|---:|---:|")
        for n, p in plans.items():
            print(f"| q{n:02d} | {p['plan first'] * 1e3:.0f} | {p['plan again'] * 1e3:.0f} |")
        print()
    print("| query | run | " + " | ".join(PHASES) + " | stages/tasks |")
    print("|---|---|" + "---:|" * len(PHASES) + "---|")
    ref = duckdb_over({t: data / f"{t}.parquet" for t in TABLES[args.suite]})
    summary: list[tuple[int, list[float], dict[str, list[float]]]] = []
    with tempfile.TemporaryDirectory(prefix="mangonel-latency-") as work:
        sides = {"A": None} if args.base_src is None else {"A": None, "B": args.base_src}
        clusters = {
            name: started(Path(work) / name, src, data, args.suite) for name, src in sides.items()
        }
        try:
            for turn, number in enumerate(numbers):
                sql = query_text(args.suite, number)
                order = list(clusters) if turn % 2 == 0 else list(reversed(clusters))
                runs: dict[str, list[dict[str, float]]] = {name: [] for name in clusters}
                duck: list[float] = []
                for i in range(1 + args.repeat):
                    started_at = time.perf_counter()
                    ref.sql(sql).to_arrow_table()
                    duck.append(time.perf_counter() - started_at)
                    for name in order if i % 2 == 0 else reversed(order):
                        cluster, session = clusters[name]
                        runs[name].append(one_run(session, cluster.web_url, sql))
                summary.append(
                    (number, duck, {n: [r["total"] for r in got] for n, got in runs.items()})
                )
                for name, got in runs.items():
                    first, warm = got[0], got[1:]
                    median = {k: statistics.median(r[k] for r in warm) for k in first}
                    results["queries"].setdefault(str(number), {})[name] = {
                        "first": first,
                        "warm": warm,
                    }
                    for label, row in (("first", first), (f"median of {len(warm)}", median)):
                        cells = " | ".join(f"{row[p] * 1e3:.1f}" for p in PHASES)
                        shape = f"{int(row['stages'])}/{int(row['tasks_n'])}"
                        side = f" {name}" if len(clusters) > 1 else ""
                        print(f"| q{number:02d}{side} | {label} | {cells} | {shape} |", flush=True)
        finally:
            for cluster, session in clusters.values():
                session.close()
                cluster.stop()
    print()
    print(totals(summary))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def totals(summary: list[tuple[int, list[float], dict[str, list[float]]]]) -> str:
    """Each query's whole time against single-process DuckDB's, run in the same turns:
    the first run and the median of all runs (``tpcds.py``'s two figures)."""
    sides = list(summary[0][2]) if summary else []
    head = "| query | DuckDB median s | " + " | ".join(
        f"{n} first s | {n} median s | {n} × median" for n in sides
    )
    lines = [head + " |", "|---|---:|" + "---:|---:|---:|" * len(sides)]
    for number, duck, runs in summary:
        d = statistics.median(duck)
        cells = " | ".join(
            f"{runs[n][0]:.3f} | {statistics.median(runs[n]):.3f} | "
            f"{statistics.median(runs[n]) / max(d, 1e-6):.2f}"
            for n in sides
        )
        lines.append(f"| q{number:02d} | {d:.3f} | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
