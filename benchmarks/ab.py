"""A/B of two mangonel source trees on TPC-H, interleaved run by run.

On a machine shared with other work, two benchmark runs minutes apart see
different loads, and even the ratio to DuckDB moves with the load (mangonel's
five processes get a bigger share of a busy machine than DuckDB's two threads).
This runs two clusters side by side: ``A`` from this checkout and ``B`` from
``--base-src`` (e.g. ``git archive HEAD`` unpacked, or a copy of ``src/`` with
some files reverted), both started and warmed up before the first timing, then
each query on A and B alternately (A first on odd runs, B first on even ones),
so that both see the same load. Only the scheduler and executor processes run
B's code; the client is this checkout's. Answers are not compared here
(``tpch.py`` compares every answer with DuckDB). At the end it prints each
cluster's peak memory as ``tpch.py`` counts it: the RSS high-water marks
(``VmHWM``) of its scheduler and executors, summed. ``--layout random`` runs on
the copy of the tables with their rows in a random order (``tpch.py --layout``).
Next to the times it reports the CPU seconds the cluster's processes spent on each
query (``/proc/PID/stat`` read around it): on a machine shared with other work the
wall time moves with the load, the CPU a change costs much less.

Usage::

    .venv/bin/python benchmarks/ab.py --base-src /tmp/base/src --scale 1 [--queries 1-22]
    .venv/bin/python benchmarks/ab.py --a-executor-args "--threads 2" --queries 1-22
    .venv/bin/python benchmarks/ab.py --base-src /tmp/base/src --layout random
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SRC = REPO_ROOT / "src"
# A runs this checkout's code even where the virtualenv's mangonel is another
# checkout's (a git worktree sharing one virtualenv): client here, servers below.
sys.path[:0] = [str(SRC), str(REPO_ROOT / "tests")]

from engine_worker import vmhwm_kb  # noqa: E402  (a sibling module: benchmarks/ is not a package)
from helpers import CACHE_DIR, TPCH_TABLES, ensure_tpch, tpch_query  # noqa: E402
from tpch import random_layout  # noqa: E402


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes have spent so far."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def parse_queries(text: str) -> list[int]:
    numbers: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        numbers.extend(range(int(lo), int(hi or lo) + 1))
    return numbers


@contextlib.contextmanager
def started(  # type: ignore[no-untyped-def]
    data: Path,
    work: Path,
    src: str,
    partitions: int | None,
    executor_args: str = "",
    scheduler_args: str = "",
):
    import mangonel

    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = src
    try:
        cluster = mangonel.LocalCluster(
            executors=2,
            partitions=partitions,
            work_dir=str(work),
            executor_args=tuple(shlex.split(executor_args)),
            scheduler_args=tuple(shlex.split(scheduler_args)),
        )
        cluster.__enter__()
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    try:
        with cluster.connect() as session:
            for t in TPCH_TABLES:
                session.register_parquet(t, str(data / f"{t}.parquet"))
            yield session, cluster
    finally:
        cluster.__exit__(None, None, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-src", default=str(SRC), help="B's src/ directory (default: this checkout's)"
    )
    parser.add_argument("--a-executor-args", default="", help='e.g. "--threads 2"')
    parser.add_argument("--b-executor-args", default="")
    parser.add_argument("--a-scheduler-args", default="", help='e.g. "--partition-bytes 16777216"')
    parser.add_argument("--b-scheduler-args", default="")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--queries", default="1-22")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partitions", type=int, help="fixed partitions per exchange")
    parser.add_argument("--layout", choices=("generated", "random"), default="generated")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    data = ensure_tpch(args.scale, CACHE_DIR)
    if args.layout == "random":
        data = random_layout(data, CACHE_DIR, args.scale)
    work = Path(tempfile.mkdtemp(prefix="mangonel-ab-"))
    numbers = parse_queries(args.queries)
    times: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}
    peaks: dict[str, list[int]] = {}
    with (
        started(
            data, work / "a", str(SRC), args.partitions, args.a_executor_args, args.a_scheduler_args
        ) as (a, cluster_a),
        started(
            data,
            work / "b",
            args.base_src,
            args.partitions,
            args.b_executor_args,
            args.b_scheduler_args,
        ) as (b, cluster_b),
    ):
        for n in numbers:  # warm-up: every query once on each
            a.sql(tpch_query(n))
            b.sql(tpch_query(n))
        pids = {
            name: [c.scheduler.pid, *(e.pid for e in c.executors)]
            for name, c in (("a", cluster_a), ("b", cluster_b))
        }
        for n in numbers:
            sql = tpch_query(n)
            runs: dict[str, list[float]] = {"a": [], "b": []}
            spent: dict[str, list[float]] = {"a": [], "b": []}
            for r in range(args.repeat):
                order = (("a", a), ("b", b)) if r % 2 == 0 else (("b", b), ("a", a))
                for name, session in order:
                    before = cpu_seconds(pids[name])
                    runs[name].append(session.sql(sql).elapsed_s)
                    spent[name].append(cpu_seconds(pids[name]) - before)
            times[f"q{n:02d}"] = runs
            cpu[f"q{n:02d}"] = spent
            ma, mb = statistics.median(runs["a"]), statistics.median(runs["b"])
            ca, cb = statistics.median(spent["a"]), statistics.median(spent["b"])
            print(
                f"q{n:02d}: A {ma:.3f} s, B {mb:.3f} s, A/B {ma / mb:.2f}; "
                f"CPU A {ca:.2f} s, B {cb:.2f} s",
                file=sys.stderr,
            )
        for name, cluster in (("a", cluster_a), ("b", cluster_b)):  # before they stop
            processes = [cluster.scheduler, *cluster.executors]
            peaks[name] = [vmhwm_kb(p.pid) // 1024 for p in processes]
    total_a = sum(statistics.median(v["a"]) for v in times.values())
    total_b = sum(statistics.median(v["b"]) for v in times.values())
    print("| query | A s | B s | A/B |\n|---|---:|---:|---:|")
    for q, v in times.items():
        ma, mb = statistics.median(v["a"]), statistics.median(v["b"])
        print(f"| {q} | {ma:.3f} | {mb:.3f} | {ma / mb:.2f} |")
    print(f"| **total** | **{total_a:.3f}** | **{total_b:.3f}** | **{total_a / total_b:.2f}** |")
    cpu_a = sum(statistics.median(v["a"]) for v in cpu.values())
    cpu_b = sum(statistics.median(v["b"]) for v in cpu.values())
    print(
        f"\nCPU seconds (scheduler + executors, medians summed): A {cpu_a:.2f}, "
        f"B {cpu_b:.2f}, A/B {cpu_a / cpu_b:.3f}"
    )
    peak_a, peak_b = sum(peaks["a"]), sum(peaks["b"])
    print(
        f"\npeak RSS (MiB, scheduler + executors): A {peak_a} ({' + '.join(map(str, peaks['a']))})"
        f", B {peak_b} ({' + '.join(map(str, peaks['b']))}), A/B {peak_a / peak_b:.2f}"
    )
    if args.json:
        report: dict[str, Any] = {
            "base_src": args.base_src,
            "a_executor_args": args.a_executor_args,
            "b_executor_args": args.b_executor_args,
            "a_scheduler_args": args.a_scheduler_args,
            "b_scheduler_args": args.b_scheduler_args,
            "scale": args.scale,
            "layout": args.layout,
            "runs": times,
            "peak_rss_mib": peaks,
        }
        report |= {"total_a_s": total_a, "total_b_s": total_b, "cpu_s": cpu}
        report |= {"total_cpu_a_s": cpu_a, "total_cpu_b_s": cpu_b}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
