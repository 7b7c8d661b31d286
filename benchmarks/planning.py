"""How long the scheduler takes to plan each TPC-H (or TPC-DS) query, in this process.

Planning (parse, DuckDB binding over empty tables, sqlglot's optimizer, the binder, the
join-order rule, the distributor) happens before a job's first task, so
``profile_mangonel.py``, which looks at jobs, does not see it. Each query is planned
once to warm up, then ``--repeat`` times; the mean is printed in milliseconds, and
the first planning's time too (a first plan pays what later ones find cached, such
as plan-time pruning's evaluation of a dimension, ``plan/probe.py``).

Usage::

    .venv/bin/python benchmarks/planning.py --scale 1 [--repeat 3] [--suite tpcds] [--hosts 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import (  # noqa: E402
    TPCDS_TABLES,
    TPCH_TABLES,
    ensure_tpcds,
    ensure_tpch,
    tpcds_query,
    tpch_query,
)

from mangonel.catalog import load_table  # noqa: E402
from mangonel.plan.planner import PlannerConfig, plan_query, warm_up  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--suite", choices=("tpch", "tpcds"), default="tpch")
    parser.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="plan for this many hosts of one core, one slot each, as the scheduler "
        "would for them (default: the planner's defaults, no cluster known)",
    )
    args = parser.parse_args()
    config = PlannerConfig(slots=args.hosts, parallel=args.hosts) if args.hosts else PlannerConfig()
    if args.suite == "tpcds":
        data, tables, numbers, text = ensure_tpcds(args.scale), TPCDS_TABLES, 99, tpcds_query
    else:
        data, tables, numbers, text = ensure_tpch(args.scale), TPCH_TABLES, 22, tpch_query
    catalog = {t: load_table(t, str(data / f"{t}.parquet")) for t in tables}
    warm_up()  # as the scheduler does at start
    total = total_first = 0.0
    slowest = (0.0, 0)
    for number in range(1, numbers + 1):
        sql = text(number)
        started = time.perf_counter()
        plan_query(sql, catalog, config)
        first = (time.perf_counter() - started) * 1e3
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            plan_query(sql, catalog, config)
            times.append((time.perf_counter() - started) * 1e3)
        ms = sum(times) / len(times)
        total += ms
        total_first += first
        slowest = max(slowest, (max([first, *times]), number))
        print(f"q{number:02d} {ms:6.1f} ms  (first {first:6.1f} ms)")
    print(f"total {total:.0f} ms  (first plans {total_first:.0f} ms)")
    # Plans back to back, as here, keep the collector paused until one ends past
    # ``GC_PAUSE_LIMIT_S``: that plan pays for collecting what all of them left.
    print(f"slowest single plan {slowest[0]:.0f} ms (q{slowest[1]:02d})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
