"""CPU time per TPC-H query: single-process DuckDB against mangonel's processes.

Not a benchmark of record (``tpch.py`` is): on a machine with few cores the CPU
an engine spends bounds its wall time, so this shows how much work mangonel adds
to DuckDB's own. Each query runs once on DuckDB in this process (after a warm-up
pass), then once on a warm ``LocalCluster`` (two warm-up passes); the CPU of the
scheduler and the executors is read from ``/proc/<pid>/stat`` around each query.

Usage::

    .venv/bin/python benchmarks/cpu.py --scale 1 [--queries 1-22]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from ab import parse_queries  # noqa: E402
from helpers import CACHE_DIR, TPCH_TABLES, ensure_tpch, tpch_query  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    import duckdb

    import mangonel

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--queries", default="1-22")
    args = parser.parse_args()
    data = ensure_tpch(args.scale, CACHE_DIR)
    numbers = parse_queries(args.queries)
    con = duckdb.connect()
    for t in TPCH_TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{data / f'{t}.parquet'}')")
    for n in numbers:
        con.execute(tpch_query(n)).fetchall()
    rows: dict[int, list[float]] = {}
    for n in numbers:
        cpu, wall = time.process_time(), time.perf_counter()
        con.execute(tpch_query(n)).fetchall()
        rows[n] = [time.process_time() - cpu, time.perf_counter() - wall]
    with mangonel.LocalCluster(log_level="warning") as cluster, cluster.connect() as session:
        for t in TPCH_TABLES:
            session.register_parquet(t, str(data / f"{t}.parquet"))
        for _ in range(2):
            for n in numbers:
                session.sql(tpch_query(n))
        scheduler = cluster.scheduler.pid
        executors = [e.pid for e in cluster.executors]
        for n in numbers:
            sched = cpu_seconds(scheduler)
            execs = sum(cpu_seconds(p) for p in executors)
            wall = time.perf_counter()
            session.sql(tpch_query(n))
            rows[n] += [
                time.perf_counter() - wall,
                cpu_seconds(scheduler) - sched,
                sum(cpu_seconds(p) for p in executors) - execs,
            ]
    print("| query | DuckDB CPU s | DuckDB wall s | mangonel wall s | scheduler CPU s "
          "| executors CPU s | executors / DuckDB |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    totals = [0.0] * 5
    for n, r in rows.items():
        totals = [a + b for a, b in zip(totals, r, strict=True)]
        print(f"| q{n:02d} | " + " | ".join(f"{x:.3f}" for x in r) + f" | {r[4] / r[0]:.2f} |")
    print("| **total** | " + " | ".join(f"**{x:.3f}**" for x in totals)
          + f" | **{totals[4] / totals[0]:.2f}** |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
