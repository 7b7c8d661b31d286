"""Stragglers: TPC-H at SF 1 with one of three executors slowed to a quarter of a CPU.

Four ``LocalCluster``s of 3 executors run side by side, each query on each
cluster in turn (interleaved, so drift of a noisy machine hits all four alike):

* ``healthy``: fault-free, speculation on (the default);
* ``healthy-nospec``: fault-free, ``--no-speculation``;
* ``slow``: the first executor in line held to 0.25 CPU by a cgroup CPU quota
  (``mangonel.testing.throttle.CpuThrottle``: cgroup v1 ``cpu.cfs_quota_us`` or
  v2 ``cpu.max``; needs root), speculation on;
* ``slow-nospec``: the same slowed executor, ``--no-speculation``.

Prints each query's time (median of ``--repeat`` after one warm-up), the totals,
and the ratios that matter: slowed with speculation / fault-free (target: at
most 1.3), slowed without / fault-free, and the overhead of speculation on a
healthy cluster (healthy / healthy-nospec: target within noise). It also counts
the speculative copies each cluster launched, won and lost (``/metrics``), and
checks every answer against single-process DuckDB.

Not a test: timings belong here. Usage::

    .venv/bin/python benchmarks/stragglers.py [--scale 1] [--repeat 1] [--json out.json]

Exits 1 when an answer is wrong.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
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

CLUSTERS = ("healthy", "healthy-nospec", "slow", "slow-nospec")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per query (median)")
    parser.add_argument("--cpus", type=float, default=0.25, help="CPUs of the slowed executor")
    parser.add_argument("--queries", default="1-22", help="e.g. 1-22 or 1,3,9")
    parser.add_argument(
        "--speculation-min",
        type=float,
        default=None,
        help="the scheduler's --speculation-min (its default when absent)",
    )
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--work-dir", type=Path, default=None, help="kept when given")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    return parser.parse_args(argv)


def query_numbers(spec: str) -> list[int]:
    numbers: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            low, high = part.split("-")
            numbers.extend(range(int(low), int(high) + 1))
        else:
            numbers.append(int(part))
    return numbers


def speculative_counts(web_url: str) -> dict[str, int]:
    with urllib.request.urlopen(web_url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("mangonel_speculative_attempts_total{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            counts[result] = int(float(line.split()[-1]))
    return counts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mangonel.client.cluster import LocalCluster
    from mangonel.testing.throttle import CpuThrottle

    print(f"generating or reusing TPC-H SF {args.scale:g} ...", file=sys.stderr)
    data = ensure_tpch(args.scale, args.cache_dir)
    tables = {name: data / f"{name}.parquet" for name in TPCH_TABLES}
    con = duckdb_over(tables)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="mangonel-stragglers-"))
    print(f"cluster work directories and logs under {work}", file=sys.stderr)
    clusters = {
        name: LocalCluster(
            executors=3,
            work_dir=work / name,
            web_port=0,
            flight_sql_port=None,
            speculation=not name.endswith("nospec"),
            speculation_min=args.speculation_min,
        )
        for name in CLUSTERS
    }
    throttles: list[CpuThrottle] = []
    times: dict[str, dict[int, float]] = {name: {} for name in CLUSTERS}
    wrong: list[str] = []
    numbers = query_numbers(args.queries)
    try:
        for cluster in clusters.values():
            cluster.start()
        sessions = {name: c.connect() for name, c in clusters.items()}
        for name in ("slow", "slow-nospec"):
            # The first executor in line (the earliest connected): it gets the
            # first task of every stage on an idle cluster, the only one of a
            # stage of one task, so every query meets it in both clusters alike.
            # A cgroup of its own each: the two must not share one quota.
            first = next(iter(sessions[name].status().alive_executors()))
            throttle = CpuThrottle(f"bench-{name}", cpus=args.cpus)
            throttles.append(throttle)
            throttle.add(first.pid)
        for session in sessions.values():
            for table, path in tables.items():
                session.register_parquet(table, str(path))
        for number in numbers:
            sql = tpch_query(number)
            expected = con.sql(sql).to_arrow_table()
            samples: dict[str, list[float]] = {name: [] for name in CLUSTERS}
            for session in sessions.values():
                session.sql(sql)  # warm-up: plan cache, scan databases
            for _ in range(args.repeat):
                for name, session in sessions.items():
                    started = time.perf_counter()
                    result = session.sql(sql)
                    table = result.to_arrow()
                    samples[name].append(time.perf_counter() - started)
                    order_by = TPCH_ORDER_BY[number]
                    problem = compare_results(
                        table, expected, ordered=bool(order_by), order_by=order_by
                    )
                    if problem is not None:
                        wrong.append(f"q{number} on {name}: {problem}")
            for name in CLUSTERS:
                times[name][number] = statistics.median(samples[name])
            print(
                f"q{number}: " + ", ".join(f"{n} {times[n][number]:.2f} s" for n in CLUSTERS),
                file=sys.stderr,
            )
        counts = {name: speculative_counts(c.web_url) for name, c in clusters.items()}
        for session in sessions.values():
            session.close()
    finally:
        for cluster in clusters.values():
            cluster.stop()
        for throttle in throttles:
            throttle.close()
    totals = {name: sum(t.values()) for name, t in times.items()}
    payload: dict[str, Any] = {
        "scale": args.scale,
        "repeat": args.repeat,
        "slow_cpus": args.cpus,
        "speculation_min_s": args.speculation_min,
        "per_query_s": times,
        "total_s": totals,
        "speculative": counts,
        "ratio_slow_spec_to_healthy": totals["slow"] / totals["healthy-nospec"],
        "ratio_slow_nospec_to_healthy": totals["slow-nospec"] / totals["healthy-nospec"],
        "ratio_speculation_overhead": totals["healthy"] / totals["healthy-nospec"],
        "wrong_answers": wrong,
    }
    print(
        f"\nTPC-H SF {args.scale:g}, 3 executors, one held to {args.cpus:g} CPU in the "
        f"slow clusters; median of {args.repeat} after a warm-up, interleaved\n"
    )
    print("| query | " + " | ".join(f"{n} (s)" for n in CLUSTERS) + " |")
    print("|---|" + "---:|" * len(CLUSTERS))
    for number in numbers:
        print(f"| q{number} | " + " | ".join(f"{times[n][number]:.2f}" for n in CLUSTERS) + " |")
    print("| **total** | " + " | ".join(f"**{totals[n]:.2f}**" for n in CLUSTERS) + " |")
    print("\n| ratio | value |")
    print("|---|---:|")
    print(
        f"| slowed, speculation on / fault-free (no speculation) | "
        f"{payload['ratio_slow_spec_to_healthy']:.2f} |"
    )
    print(
        f"| slowed, speculation off / fault-free (no speculation) | "
        f"{payload['ratio_slow_nospec_to_healthy']:.2f} |"
    )
    print(
        f"| healthy: speculation on / off (its overhead) | "
        f"{payload['ratio_speculation_overhead']:.3f} |"
    )
    print("\n| cluster | copies launched | won | lost |")
    print("|---|---:|---:|---:|")
    for name in CLUSTERS:
        c = counts[name]
        print(f"| {name} | {c.get('launched', 0)} | {c.get('won', 0)} | {c.get('lost', 0)} |")
    if wrong:
        print(f"wrong answers: {wrong}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    if args.work_dir is None and not wrong:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
