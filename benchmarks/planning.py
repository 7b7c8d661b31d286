"""How long the scheduler takes to plan each TPC-H query, in this process.

Planning (parse, DuckDB binding over empty tables, sqlglot's optimizer, the binder, the
join-order rule, the distributor) happens before a job's first task, so
``profile_mangonel.py``, which looks at jobs, does not see it. Each query is planned
once to warm up, then ``--repeat`` times; the mean is printed in milliseconds.

Usage::

    .venv/bin/python benchmarks/planning.py --scale 1 [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import CACHE_DIR, TPCH_TABLES, ensure_tpch, tpch_query  # noqa: E402

from mangonel.catalog import load_table  # noqa: E402
from mangonel.plan.planner import plan_query  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = ensure_tpch(args.scale, CACHE_DIR)
    catalog = {t: load_table(t, str(data / f"{t}.parquet")) for t in TPCH_TABLES}
    total = 0.0
    for number in range(1, 23):
        sql = tpch_query(number)
        plan_query(sql, catalog)
        started = time.perf_counter()
        for _ in range(args.repeat):
            plan_query(sql, catalog)
        ms = (time.perf_counter() - started) / args.repeat * 1e3
        total += ms
        print(f"q{number:02d} {ms:6.1f} ms")
    print(f"total {total:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
