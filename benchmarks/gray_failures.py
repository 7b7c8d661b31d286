"""Gray failures on the network lab, measured: a slow link, a flapping link, the
scheduler cut off, a silent cut (issue 37's targets).

One ``NetCluster`` (``mangonel.testing.netcluster``): the scheduler, three
executors and the client each on a host of its own, TPC-H at ``--scale`` (1),
with the issue's settings by default (``--heartbeat-timeout 3``, executors'
``--fetch-timeout 4``). In one run, side by side:

* **slow link**: q9 and q18 healthy, then with executor 0's link limited to
  20 mbit (``tc``), ``--repeat`` runs each: median times and their ratio, and
  the executors lost and outputs recomputed meanwhile;
* **flapping**: executor 1's port cut for 1.5 s and healed for 1.5 s, for 20 s,
  while q9 runs again and again: each query's time against healthy, losses;
* **scheduler cut**: 6 s, starting a third of the way into q9: time from the
  heal to the answer, outputs recomputed, losses;
* **silent cut**: executor 2's port cut while idle: the time until the
  scheduler's log says it is suspected, and lost.

Every answer is compared with single-process DuckDB's. Needs root (network
namespaces), as the ``tests/multihost`` suite does.

Usage::

    sudo .venv/bin/python benchmarks/gray_failures.py [--scale 1] [--repeat 3] [--cases flapping]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

import duckdb  # noqa: E402
from helpers import (  # noqa: E402  (the test helpers live outside the package)
    TPCH_ORDER_BY,
    TPCH_TABLES,
    compare_results,
    duckdb_over,
    ensure_tpch,
    tpch_query,
)

from mangonel.scheduler.state_liveness import FLAP_WINDOW_S  # noqa: E402
from mangonel.testing.netclient import Answer  # noqa: E402
from mangonel.testing.netcluster import NetCluster  # noqa: E402
from mangonel.testing.netlab import NetLab  # noqa: E402


def lost(cluster: NetCluster) -> float:
    return sum(
        v for k, v in cluster.metrics().items() if k.startswith("mangonel_executors_lost_total")
    )


def logged_at(log: str, pattern: str, after: float) -> float | None:
    """The time of the first line of ``log`` after ``after`` that matches ``pattern``."""
    for line in log.splitlines():
        if re.search(pattern, line):
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if stamp >= after:
                return stamp
    return None


class Runner:
    def __init__(self, cluster: NetCluster, ref: duckdb.DuckDBPyConnection) -> None:
        self.cluster = cluster
        self.ref = ref
        self.expected: dict[int, Any] = {}

    def run(self, q: int) -> Answer:
        answer = self.cluster.client.sql(tpch_query(q))
        if q not in self.expected:
            self.expected[q] = self.ref.sql(tpch_query(q)).to_arrow_table()
        problem = compare_results(
            answer.result.to_arrow(), self.expected[q], ordered=True, order_by=TPCH_ORDER_BY[q]
        )
        if problem:
            raise AssertionError(f"q{q}: {problem}")
        return answer


def slow_link(cluster: NetCluster, r: Runner, args: argparse.Namespace) -> dict[str, Any]:
    """q9 and q18 healthy, then with executor 0's link at 20 mbit."""
    slow: dict[str, Any] = {}
    for q in (9, 18):
        healthy = [r.run(q).elapsed_s for _ in range(args.repeat)]
        before, recomputed = lost(cluster), 0
        cluster.lab.slow(cluster.executor_hosts[0], "20mbit")
        try:
            runs = []
            for _ in range(args.repeat):
                a = r.run(q)
                runs.append(a.elapsed_s)
                recomputed += a.result.outputs_recomputed
        finally:
            cluster.lab.heal(cluster.executor_hosts[0])
        h, s = statistics.median(healthy), statistics.median(runs)
        slow[f"q{q}"] = {
            "healthy_s": h,
            "slow_s": s,
            "ratio": s / h,
            "lost": lost(cluster) - before,
            "recomputed": recomputed,
        }
        print(
            f"slow link q{q}: {s:.2f} s at 20 mbit vs {h:.2f} s healthy "
            f"({s / h:.2f}x), lost {lost(cluster) - before:g}, recomputed {recomputed}"
        )
    time.sleep(2.0)
    return slow


def flapping(cluster: NetCluster, r: Runner, args: argparse.Namespace) -> dict[str, Any]:
    """Executor 1's port cut 1.5 s and healed 1.5 s, for 20 s, while q9 runs
    again and again. Each run's start is kept against the flaps: which cut or
    heal a slow run met says which rule it waited for."""
    healthy9 = statistics.median([r.run(9).elapsed_s for _ in range(args.repeat)])
    before = lost(cluster)
    stop = threading.Event()
    began = time.time()
    flaps: list[tuple[float, str]] = []

    def flap() -> None:
        while time.time() < began + 20.0 and not stop.is_set():
            flaps.append((time.time() - began, "cut"))
            cluster.lab.cut(cluster.executor_hosts[1])
            time.sleep(1.5)
            flaps.append((time.time() - began, "heal"))
            cluster.lab.heal(cluster.executor_hosts[1])
            time.sleep(1.5)

    flapper = threading.Thread(target=flap, daemon=True)
    flapper.start()
    runs: list[float] = []
    starts: list[float] = []
    try:
        while flapper.is_alive():
            starts.append(time.time() - began)
            runs.append(r.run(9).elapsed_s)
    finally:
        stop.set()
        flapper.join()
        cluster.lab.heal(cluster.executor_hosts[1])
    slow = []
    for start, run in zip(starts, runs, strict=True):
        if run > 2 * healthy9:
            met = [f"{kind} at {t:.2f} s" for t, kind in flaps if start - 1.5 < t < start + run]
            slow.append({"start_s": start, "run_s": run, "met": met})
    print(
        f"flapping 1.5 s for 20 s: {len(runs)} q9 runs, {min(runs):.2f}-{max(runs):.2f} s "
        f"vs {healthy9:.2f} s healthy (worst {max(runs) / healthy9:.2f}x), "
        f"lost {lost(cluster) - before:g}"
    )
    for s in slow:
        print(f"  {s['run_s']:.2f} s from {s['start_s']:.2f} s; flaps: {', '.join(s['met'])}")
    out = {
        "healthy_s": healthy9,
        "runs_s": runs,
        "starts_s": starts,
        "flaps": flaps,
        "over_2x": slow,
        "worst_ratio": max(runs) / healthy9,
        "lost": lost(cluster) - before,
    }
    cluster.wait_for_executors(3, 60)
    time.sleep(25.0)  # a ping the flaps held may still break a stream: let it
    return out


def scheduler_cut(cluster: NetCluster, r: Runner, args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler's link cut for 6 s, a third of the way into q9 (its
    healthy time measured just before)."""
    healthy9 = statistics.median([r.run(9).elapsed_s for _ in range(args.repeat)])
    before = lost(cluster)
    result: list[Answer] = []
    query = threading.Thread(target=lambda: result.append(r.run(9)), daemon=True)
    query.start()
    time.sleep(healthy9 / 3)  # mid-way: the query must meet the cut
    cluster.lab.cut(cluster.scheduler_host)
    time.sleep(6.0)
    cluster.lab.heal(cluster.scheduler_host)
    healed = time.time()
    query.join(120)
    a = result[0]
    early = a.finished_at < healed
    print(
        f"scheduler cut 6 s: answer {a.finished_at - healed:.2f} s after the heal, "
        f"recomputed {a.result.outputs_recomputed}, lost {lost(cluster) - before:g}"
        + (" (the query ended before the heal: this run says nothing)" if early else "")
    )
    time.sleep(2.0)
    return {
        "heal_to_answer_s": a.finished_at - healed,
        "recomputed": a.result.outputs_recomputed,
        "lost": lost(cluster) - before,
        "finished_before_heal": early,
    }


def silent_cut(cluster: NetCluster, r: Runner, args: argparse.Namespace) -> dict[str, Any]:
    """Executor 2's port cut while idle: when the scheduler's log says it is
    suspected, and lost. After ``FLAP_WINDOW_S`` without a cut: a silence that
    soon after another (the scheduler's cut before) is a relapse, suspected
    sooner (``state_liveness.relapse_bar``), and this measures the detector."""
    time.sleep(FLAP_WINDOW_S + 1.0)
    victim = cluster.wait_for_executors(3)[2]
    cut = time.time()  # before the command: the times below are upper bounds
    cluster.lab.cut(cluster.executor_hosts[2])
    suspected = gone = None
    assert cluster.scheduler is not None
    while time.time() - cut < 60 and gone is None:
        # The scheduler's log says when (its clock is this machine's).
        log = cluster.scheduler.log_path.read_text()
        suspected = suspected or logged_at(log, rf"executor {victim} suspected", cut)
        gone = logged_at(log, rf"executor {victim} lost", cut)
        time.sleep(0.2)
    suspected = suspected - cut if suspected else None
    gone = gone - cut if gone else None
    cluster.lab.heal(cluster.executor_hosts[2])
    print(f"silent cut: suspected after {suspected:.2f} s, lost after {gone:.2f} s")
    return {"suspected_s": suspected, "lost_s": gone}


CASES = {
    "slow_link": slow_link,
    "flapping": flapping,
    "scheduler_cut": scheduler_cut,
    "silent_cut": silent_cut,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each query (3)")
    parser.add_argument("--heartbeat-timeout", type=float, default=3.0, help="seconds (3)")
    parser.add_argument("--fetch-timeout", type=float, default=4.0, help="seconds (4)")
    parser.add_argument("--work-dir", help="the lab's directory (default: a temporary one)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"which cases to run, comma-separated (all: {','.join(CASES)})",
    )
    args = parser.parse_args()
    cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    if not cases <= set(CASES):
        parser.error(f"unknown case(s) {sorted(cases - set(CASES))}; known: {', '.join(CASES)}")
    problem = NetLab.unavailable()
    if problem is not None:
        print(f"needs network namespaces: {problem}", file=sys.stderr)
        return 2
    tables = ensure_tpch(args.scale)
    paths = {t: tables / f"{t}.parquet" for t in TPCH_TABLES}
    ref = duckdb_over(paths)
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="mangonel-gray-"))
    out: dict[str, Any] = {"scale": args.scale, "heartbeat_timeout": args.heartbeat_timeout}
    with NetCluster(
        root,
        executors=3,
        slots=2,
        heartbeat_timeout=args.heartbeat_timeout,
        executor_args=("--fetch-timeout", str(args.fetch_timeout)),
        speculation=True,
    ) as cluster:
        for name, path in paths.items():
            cluster.client.register_parquet(name, str(path))
        r = Runner(cluster, ref)
        for q in (9, 18):
            r.run(q)  # warm
        time.sleep(2.0)

        for name in CASES:
            if name in cases:
                out[name] = CASES[name](cluster, r, args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
