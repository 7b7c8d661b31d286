"""A slow link on the network lab, with the slow-link rules off and on, side by side.

Two ``NetCluster``s at once (each: a scheduler, three two-slot executors and a
client, every process on a host of its own; heartbeat timeout 3 s, executors'
``--fetch-timeout 4``, speculation on; TPC-H at ``--scale``), one with
``--slow-link-ratio 0`` (the rules off: what the scheduler did before them),
one with the default. Rounds alternate between them: in each, per query, a
healthy run, then executor 0's link limited to 20 mbit (``tc``) for one run,
then healed. Reported per query and cluster: the median times, their ratio
(slow over healthy), outputs recomputed, copies launched, executors lost, and
how often the scheduler's log says a rule acted. Every answer is compared with
single-process DuckDB's. Needs root (network namespaces).

Usage::

    sudo .venv/bin/python benchmarks/slow_link.py [--scale 1] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import (  # noqa: E402  (the test helpers live outside the package)
    TPCH_ORDER_BY,
    TPCH_TABLES,
    compare_results,
    duckdb_over,
    ensure_tpch,
    tpch_query,
)

from mangonel.testing.netclient import Answer  # noqa: E402
from mangonel.testing.netcluster import NetCluster  # noqa: E402
from mangonel.testing.netlab import NetLab  # noqa: E402

QUERIES = (9, 18)
RATE = "20mbit"


def lost(cluster: NetCluster) -> float:
    return sum(
        v for k, v in cluster.metrics().items() if k.startswith("mangonel_executors_lost_total")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (1)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    parser.add_argument("--work-dir", help="the labs' directory (default: a temporary one)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    problem = NetLab.unavailable()
    if problem is not None:
        print(f"needs network namespaces: {problem}", file=sys.stderr)
        return 2
    tables = ensure_tpch(args.scale)
    paths = {t: tables / f"{t}.parquet" for t in TPCH_TABLES}
    ref = duckdb_over(paths)
    expected = {q: ref.sql(tpch_query(q)).to_arrow_table() for q in QUERIES}
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="mangonel-slow-link-"))
    modes = {"off": "0", "on": "3"}
    clusters: dict[str, NetCluster] = {}
    try:
        for mode, ratio in modes.items():
            cluster = NetCluster(
                root / mode,
                executors=3,
                slots=2,
                heartbeat_timeout=3.0,
                executor_args=("--fetch-timeout", "4"),
                scheduler_args=("--slow-link-ratio", ratio),
                speculation=True,
            ).start()
            clusters[mode] = cluster
            for name, path in paths.items():
                cluster.client.register_parquet(name, str(path))
            for q in QUERIES:
                cluster.client.sql(tpch_query(q))  # warm
        time.sleep(2.0)

        def run(cluster: NetCluster, q: int) -> Answer:
            answer = cluster.client.sql(tpch_query(q))
            problem = compare_results(
                answer.result.to_arrow(), expected[q], ordered=True, order_by=TPCH_ORDER_BY[q]
            )
            if problem:
                raise AssertionError(f"q{q}: {problem}")
            return answer

        rows: dict[str, dict[str, Any]] = {}
        lost_before = {m: lost(c) for m, c in clusters.items()}
        log_before = {m: len(c.scheduler.log_path.read_text()) for m, c in clusters.items()}  # type: ignore[union-attr]
        for r in range(args.rounds):
            for q in QUERIES:
                for mode, cluster in clusters.items():
                    row = rows.setdefault(
                        f"q{q} {mode}",
                        {"healthy_s": [], "slow_s": [], "recomputed": 0, "copies": 0},
                    )
                    row["healthy_s"].append(run(cluster, q).elapsed_s)
                    cluster.lab.slow(cluster.executor_hosts[0], RATE)
                    try:
                        answer = run(cluster, q)
                    finally:
                        cluster.lab.heal(cluster.executor_hosts[0])
                    row["slow_s"].append(answer.elapsed_s)
                    row["recomputed"] += answer.result.outputs_recomputed
                    row["copies"] += sum(
                        max(0, s.attempts - s.tasks_total - s.tasks_rerun)
                        for s in answer.result.stages
                    )
                    print(
                        f"round {r + 1} q{q} rules {mode}: healthy {row['healthy_s'][-1]:.2f} s, "
                        f"{RATE} {row['slow_s'][-1]:.2f} s",
                        flush=True,
                    )
        out: dict[str, Any] = {"scale": args.scale, "rate": RATE, "rounds": args.rounds}
        for key, row in rows.items():
            mode = key.split()[1]
            h, s = statistics.median(row["healthy_s"]), statistics.median(row["slow_s"])
            row.update(healthy_median_s=h, slow_median_s=s, ratio=s / h)
            out[key] = row
        for mode, cluster in clusters.items():
            text = cluster.scheduler.log_path.read_text()[log_before[mode] :]  # type: ignore[union-attr]
            out[f"rules {mode}"] = {
                "acted": sum(
                    "slow link, a job stops reading it" in line for line in text.splitlines()
                ),
                "lost": lost(cluster) - lost_before[mode],
            }
        print()
        print(
            f"| query | rules | healthy (median) | {RATE} (median) | ratio | recomputed "
            "| extra attempts |"
        )
        print("|---|---|---|---|---|---|---|")
        for key, row in rows.items():
            q, mode = key.split()
            print(
                f"| {q} | {mode} | {row['healthy_median_s']:.2f} s | {row['slow_median_s']:.2f} s "
                f"| {row['ratio']:.2f}x | {row['recomputed']} | {row['copies']} |"
            )
        for mode in modes:
            print(f"rules {mode}: {out[f'rules {mode}']}")
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    finally:
        for cluster in clusters.values():
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
