"""A slow link on the network lab: the first run after the link slowed, the runs
after, with link probes, without, and the slow-link rules off, side by side.

Up to three ``NetCluster``s at once (``--modes``; each: a scheduler, three
two-slot executors and a client, every process on a host of its own; heartbeat
timeout 3 s, executors' ``--fetch-timeout 4``, speculation on; TPC-H at
``--scale``): ``off``, with ``--slow-link-ratio 0`` and no link probes (the
rules and the marks off: the scheduler before them); ``on``, with the default
ratio and ``--slow-link-backoff`` at ``--backoff``, no probes
(``--link-probe-interval 0``: a link is known only once a job's fetches cross
it); ``probes``, as ``on`` with the executors' link probes at the default
interval. Rounds alternate between them: in each, per query, a healthy run,
then executor 0's link limited to 20 mbit (``tc``), ``--settle`` seconds of
waiting (a link that became slow a while ago: a few probe intervals), and
``--slowed-runs`` runs in a row, then healed. The first of those is the first
job that meets the slow link (without probes it learns it, and pays); the
later ones are the steady state. After the heal, the round waits until the
scheduler trusts the link again (the mark's back-off, then a trial:
``state_link_marks``), so each round starts from a trusted link.

Reported per query and cluster: the healthy median; the first and later runs'
medians and their ratios to healthy; outputs recomputed and tasks placed on
the slowed executor, first and later runs apart; whether the slowed executor
was marked before the first run; executors lost; the marks and
the job rule's actions from the scheduler's log; the load average before and
after. Every answer is compared with single-process DuckDB's. Needs root
(network namespaces).

Usage::

    sudo .venv/bin/python benchmarks/slow_link.py [--scale 1] [--rounds 3] \\
        [--slowed-runs 3] [--backoff 10] [--settle 8] [--modes off,on,probes] \\
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
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

from mangonel import defaults  # noqa: E402
from mangonel.testing.netclient import Answer  # noqa: E402
from mangonel.testing.netcluster import NetCluster  # noqa: E402
from mangonel.testing.netlab import NetLab  # noqa: E402

QUERIES = (9, 18)
RATE = "20mbit"
SLOW = 0
"""The executor whose link is slowed."""


def lost(cluster: NetCluster) -> float:
    return sum(
        v for k, v in cluster.metrics().items() if k.startswith("mangonel_executors_lost_total")
    )


def ran_on(cluster: NetCluster, answer: Answer) -> list[str]:
    """The executor of each task attempt of the answer's job (the web API)."""
    url = f"{cluster.web_url}/api/jobs/{answer.result.job_id}"
    doc = json.loads(cluster.client.http_get(url))
    return [a["executor"] for a in doc["attempts"]]


def wait_trusted(cluster: NetCluster, executor: str, limit_s: float) -> float:
    """Wait until the scheduler trusts ``executor``'s link again; the seconds waited."""
    start = time.time()
    while True:
        found = cluster.client.status().executor(executor)
        if found is None or not found.slow_link:
            return time.time() - start
        if time.time() - start > limit_s:
            raise AssertionError(f"executor {executor} not trusted {limit_s:g} s after the heal")
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (1)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    parser.add_argument(
        "--slowed-runs", type=int, default=3, help="runs in a row per slowed link (3)"
    )
    parser.add_argument(
        "--backoff", type=float, default=10.0, help="--slow-link-backoff of the rules' cluster (10)"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=4 * defaults.LINK_PROBE_INTERVAL_S,
        help="seconds between slowing the link and the first run: a few probe intervals "
        "(%(default)g)",
    )
    parser.add_argument(
        "--modes",
        default="off,on,probes",
        help="clusters, any of off, on, probes (off,on,probes)",
    )
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
    no_probes = ("--link-probe-interval", "0")
    scheduler_args = {
        "off": ("--slow-link-ratio", "0"),
        "on": ("--slow-link-backoff", str(args.backoff)),
        "probes": ("--slow-link-backoff", str(args.backoff)),
    }
    executor_args = {"off": no_probes, "on": no_probes, "probes": ()}
    modes = [m for m in args.modes.split(",") if m]
    clusters: dict[str, NetCluster] = {}
    load_before = os.getloadavg()
    try:
        for mode in modes:
            cluster = NetCluster(
                root / mode,
                executors=3,
                slots=2,
                heartbeat_timeout=3.0,
                executor_args=("--fetch-timeout", "4", *executor_args[mode]),
                scheduler_args=scheduler_args[mode],
                speculation=True,
            ).start()
            clusters[mode] = cluster
            for name, path in paths.items():
                cluster.client.register_parquet(name, str(path))
            for q in QUERIES:
                cluster.client.sql(tpch_query(q))  # warm
        time.sleep(2.0)
        slow_ids = {m: c.wait_for_executors(3)[SLOW] for m, c in clusters.items()}

        def run(cluster: NetCluster, q: int) -> Answer:
            answer = cluster.client.sql(tpch_query(q))
            problem = compare_results(
                answer.result.to_arrow(), expected[q], ordered=True, order_by=TPCH_ORDER_BY[q]
            )
            if problem:
                raise AssertionError(f"q{q}: {problem}")
            return answer

        rows: dict[str, dict[str, Any]] = {}
        runs: list[dict[str, Any]] = []
        lost_before = {m: lost(c) for m, c in clusters.items()}
        log_before = {m: len(c.scheduler.log_path.read_text()) for m, c in clusters.items()}  # type: ignore[union-attr]
        for r in range(args.rounds):
            for q in QUERIES:
                for mode, cluster in clusters.items():
                    row = rows.setdefault(
                        f"q{q} {mode}", {"healthy_s": [], "first_s": [], "later_s": []}
                    )
                    healthy = run(cluster, q)
                    row["healthy_s"].append(healthy.elapsed_s)
                    cluster.lab.slow(cluster.executor_hosts[SLOW], RATE)
                    try:
                        time.sleep(args.settle)
                        found = cluster.client.status().executor(slow_ids[mode])
                        known = found is not None and found.slow_link_since is not None
                        print(
                            f"round {r + 1} q{q} rules {mode}: link slowed {args.settle:g} s "
                            f"before the first run; marked by then: {known}",
                            flush=True,
                        )
                        for i in range(args.slowed_runs):
                            answer = run(cluster, q)
                            kind = "first" if i == 0 else "later"
                            row[f"{kind}_s"].append(answer.elapsed_s)
                            on_slow = ran_on(cluster, answer).count(slow_ids[mode])
                            runs.append(
                                {
                                    "round": r + 1,
                                    "query": q,
                                    "rules": mode,
                                    "run": kind,
                                    "seconds": round(answer.elapsed_s, 3),
                                    "healthy_s": round(healthy.elapsed_s, 3),
                                    "recomputed": answer.result.outputs_recomputed,
                                    "tasks_on_slowed": on_slow,
                                    "marked_before_first": known,
                                }
                            )
                            print(
                                f"round {r + 1} q{q} rules {mode}: healthy "
                                f"{healthy.elapsed_s:.2f} s, {RATE} run {i + 1} ({kind}) "
                                f"{answer.elapsed_s:.2f} s, recomputed "
                                f"{answer.result.outputs_recomputed}, {on_slow} attempt(s) on "
                                f"the slowed executor",
                                flush=True,
                            )
                    finally:
                        cluster.lab.heal(cluster.executor_hosts[SLOW])
                    if mode != "off":
                        limit = 2 * 8 * args.backoff + 30  # a back-off and a trial, capped
                        waited = wait_trusted(cluster, slow_ids[mode], limit)
                        print(f"  healed; trusted again after {waited:.1f} s", flush=True)
        load_after = os.getloadavg()
        out: dict[str, Any] = {
            "scale": args.scale,
            "rate": RATE,
            "rounds": args.rounds,
            "slowed_runs": args.slowed_runs,
            "backoff_s": args.backoff,
            "settle_s": args.settle,
            "link_probe_interval_s": defaults.LINK_PROBE_INTERVAL_S,
            "load_before": load_before,
            "load_after": load_after,
            "runs": runs,
        }
        for key, row in rows.items():
            q, mode = key.split()
            h = statistics.median(row["healthy_s"])
            mine = [x for x in runs if f"q{x['query']}" == q and x["rules"] == mode]
            summary: dict[str, Any] = {"healthy_median_s": h}
            for kind in ("first", "later"):
                these = [x for x in mine if x["run"] == kind]
                if not these:
                    continue
                m = statistics.median(x["seconds"] for x in these)
                summary[kind] = {
                    "median_s": m,
                    "ratio": m / h,
                    "runs": len(these),
                    "recomputed": sum(x["recomputed"] for x in these),
                    "tasks_on_slowed": sum(x["tasks_on_slowed"] for x in these),
                    "marked_before_first": sum(x["marked_before_first"] for x in these),
                }
            out[key] = {**row, **summary}
        for mode, cluster in clusters.items():
            text = cluster.scheduler.log_path.read_text()[log_before[mode] :]  # type: ignore[union-attr]
            lines = text.splitlines()
            out[f"rules {mode}"] = {
                "job_rule_acted": sum("slow link, a job stops reading it" in x for x in lines),
                "marked": sum("slow link, no new task of any job" in x for x in lines),
                "tried_again": sum("back-off over, tried again" in x for x in lines),
                "trusted_again": sum("link fast again" in x for x in lines),
                "lost": lost(cluster) - lost_before[mode],
            }
        print()
        print(
            f"| query | rules | healthy (median) | {RATE} {args.settle:g} s on, first run (median) "
            "| ratio "
            "| recomputed | tasks on the slowed | later runs (median) | ratio | recomputed "
            "| tasks on the slowed |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for key, row in out.items():
            if not key.startswith("q"):
                continue
            q, mode = key.split()
            first, later = row.get("first", {}), row.get("later", {})
            print(
                f"| {q} | {mode} | {row['healthy_median_s']:.2f} s "
                f"| {first.get('median_s', 0):.2f} s | {first.get('ratio', 0):.2f}x "
                f"| {first.get('recomputed', 0)} | {first.get('tasks_on_slowed', 0)} "
                f"| {later.get('median_s', 0):.2f} s | {later.get('ratio', 0):.2f}x "
                f"| {later.get('recomputed', 0)} | {later.get('tasks_on_slowed', 0)} |"
            )
        for mode in clusters:
            print(f"rules {mode}: {out[f'rules {mode}']}")
        print(f"load average before {load_before}, after {load_after}")
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    finally:
        for cluster in clusters.values():
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
