"""An executor lost for a long cut that comes back: under its id with its outputs
(``scheduler.state_revival``) against a baseline that registers it anew, measured
side by side on the network lab.

Each round starts a ``NetCluster`` (scheduler, one two-slot executor, client,
each on a host of its own; ``--heartbeat-timeout 3``, scans split every
``--split-rows``), runs q9 (``--query``) at TPC-H ``--scale`` (1), and when the
executor has finished two tasks of ``--stage`` (3: q9's scan of lineitem) cuts
its host off until a second after the scheduler declared it lost, then heals
it. With no other executor nothing can be made again meanwhile: with the
revival its outputs are the job's again; without, they are recomputed under a
new id. Rounds alternate between the processes of this checkout and those of
``--baseline-src`` (a ``src`` directory of the code to compare with, e.g.
``git archive <commit> src | tar -x -C /tmp/base``), so a loaded machine
weighs on both alike. Every answer is compared with single-process DuckDB's.
Printed per round and as medians: heal to answer, outputs recomputed, whether
the id was kept. Needs root (network namespaces).

Usage::

    sudo .venv/bin/python benchmarks/revival.py --baseline-src /tmp/base/src [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
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
    TPCH_ORDER_BY,
    TPCH_TABLES,
    compare_results,
    duckdb_over,
    ensure_tpch,
    is_stopped,
    tpch_query,
    wait_until,
)

from mangonel.testing.netclient import Answer  # noqa: E402
from mangonel.testing.netcluster import NetCluster  # noqa: E402
from mangonel.testing.netlab import NetLab  # noqa: E402


def one_round(
    root: Path, src: str, paths: dict[str, Path], q: int, expected: Any, args: Any
) -> dict[str, Any]:
    """One cluster whose processes import mangonel from ``src``; the cut, measured."""
    os.environ["PYTHONPATH"] = src  # the lab's processes inherit it
    with NetCluster(
        root,
        executors=1,
        slots=2,
        heartbeat_timeout=args.heartbeat_timeout,
        scheduler_args=("--split-rows", str(args.split_rows)),
    ) as cluster:
        for name, path in paths.items():
            cluster.client.register_parquet(name, str(path))
        (only,) = cluster.wait_for_executors(1).values()
        host, proc = cluster.executor_hosts[0], cluster.executors[0]
        rule = {"action": "freeze", "when": "task_finished", "stage": args.stage, "nth": 2}
        cluster.set_faults(0, [rule])
        outcome: list[Answer] = []
        query = threading.Thread(
            target=lambda: outcome.append(cluster.client.sql(tpch_query(q))), daemon=True
        )
        query.start()
        wait_until(lambda: is_stopped(proc.pid), "the executor froze", 120)
        cluster.lab.cut(host)
        cut_at = time.time()
        os.kill(proc.pid, signal.SIGCONT)
        assert cluster.scheduler is not None
        log = cluster.scheduler.log_path
        wait_until(lambda: f"executor {only} lost" in log.read_text(), "the loss", 30)
        lost_after = time.time() - cut_at
        time.sleep(1.0)
        cluster.lab.heal(host)
        healed = time.time()
        query.join(300)
        answer = outcome[0]
        problem = compare_results(
            answer.result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[q]
        )
        if problem:
            raise AssertionError(f"q{q}: {problem}")
        kept = cluster.wait_for_executors(1, 60) == {0: only}
        return {
            "lost_after_s": lost_after,
            "heal_to_answer_s": answer.finished_at - healed,
            "recomputed": answer.result.outputs_recomputed,
            "kept_id": kept,
            "came_back_logged": bool(re.search(rf"executor {only} came back", log.read_text())),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--baseline-src", required=True, help="src/ of the code to compare with")
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (1)")
    parser.add_argument("--query", type=int, default=9, help="TPC-H query (9)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (3)")
    parser.add_argument(
        "--stage", type=int, default=3, help="the stage of many tasks to cut in (3: q9's lineitem)"
    )
    parser.add_argument("--heartbeat-timeout", type=float, default=3.0, help="seconds (3)")
    parser.add_argument(
        "--split-rows", type=int, default=500_000, help="rows a scan task reads (500000)"
    )
    parser.add_argument("--work-dir", help="the labs' directory (default: a temporary one)")
    args = parser.parse_args()
    problem = NetLab.unavailable()
    if problem is not None:
        print(f"needs network namespaces: {problem}", file=sys.stderr)
        return 2
    tables = ensure_tpch(args.scale)
    paths = {t: tables / f"{t}.parquet" for t in TPCH_TABLES}
    ref = duckdb_over(paths)
    expected = ref.sql(tpch_query(args.query)).to_arrow_table()
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="mangonel-revival-"))
    variants = {"this": str(REPO_ROOT / "src"), "baseline": os.path.abspath(args.baseline_src)}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for n in range(args.rounds):
        for name, src in variants.items():
            r = one_round(root / f"{name}-{n}", src, paths, args.query, expected, args)
            runs[name].append(r)
            print(
                f"round {n} {name}: lost {r['lost_after_s']:.1f} s after the cut; answer "
                f"{r['heal_to_answer_s']:.2f} s after the heal; recomputed {r['recomputed']}; "
                f"id kept {r['kept_id']}",
                flush=True,
            )
    med = {v: statistics.median(r["heal_to_answer_s"] for r in rs) for v, rs in runs.items() if rs}
    print(
        f"q{args.query} SF{args.scale:g}, heal to answer (median of {args.rounds}): this "
        f"{med['this']:.2f} s, baseline {med['baseline']:.2f} s, ratio "
        f"{med['this'] / med['baseline']:.2f}; recomputed this "
        f"{[r['recomputed'] for r in runs['this']]}, baseline "
        f"{[r['recomputed'] for r in runs['baseline']]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
