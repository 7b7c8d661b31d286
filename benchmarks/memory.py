"""TPC-H on executors held to a small memory budget: every query completes, spilling, correct.

Starts a ``TestCluster`` whose executors each run in a memory cgroup of their own
(a hard limit: past it the kernel's OOM killer SIGKILLs the executor) and get
the same budget as ``--memory``, so each slot's DuckDB has its share of it and
must spill to stay inside. Runs the chosen TPC-H queries once each, checks every
answer against single-process DuckDB (run in this process, which is not
limited), and reports per query the time, the tasks run again (an OOM kill
shows there, and as a lost executor), and after the run, per executor: the
cgroup's peak memory, OOM kills, and how many tasks spilled and the most one
spilled (the executors log ``task ... spilled N at most``).

Needs root (cgroups). Not a test: timings belong here, not in asserts.

Usage::

    .venv/bin/python benchmarks/memory.py --scale 1 --memory 384MiB --json mem.json
"""

from __future__ import annotations

import argparse
import json
import re
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

from mangonel.executor.memory import SlotBudget, format_size, parse_size  # noqa: E402
from mangonel.testing.cluster import TestCluster  # noqa: E402

_SPILLED = re.compile(r"task (\S+) spilled ([\d.]+) (\w+) at most")
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _queries(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--memory", default="384MiB", help="--memory of each executor")
    parser.add_argument(
        "--cgroup", default=None, help="hard cgroup limit of each executor (default: --memory)"
    )
    parser.add_argument("--queries", default="1-22")
    parser.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="partitions of every exchange (fewer: bigger tasks)",
    )
    parser.add_argument(
        "--split-bytes", default=None, help="scheduler --split-bytes (more: bigger scan tasks)"
    )
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args()

    budget, limit = parse_size(args.memory), parse_size(args.cgroup or args.memory)
    share = SlotBudget.share(budget, args.slots)
    data = ensure_tpch(args.scale)
    tables = {t: data / f"{t}.parquet" for t in TPCH_TABLES}
    reference = duckdb_over(tables)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mangonel-memory-"))
    cluster = TestCluster(
        executors=args.executors,
        work_dir=work,
        slots=args.slots,
        executor_memory=dict.fromkeys(range(args.executors), limit),
        executor_args=("--memory", args.memory),
        partitions=args.partitions,
        scheduler_args=("--split-bytes", args.split_bytes) if args.split_bytes else (),
        start_timeout=120,
    )
    rows: list[dict[str, Any]] = []
    with cluster:
        with cluster.connect() as session:
            for name, path in tables.items():
                session.register_parquet(name, str(path))
            for number in _queries(args.queries):
                sql = tpch_query(number)
                started = time.perf_counter()
                try:
                    result = session.sql(sql)
                    actual = result.to_arrow()
                    elapsed = time.perf_counter() - started
                    expected = reference.sql(sql).to_arrow_table()
                    order_by = TPCH_ORDER_BY[number]
                    diff = compare_results(
                        actual, expected, ordered=bool(order_by), order_by=order_by
                    )
                    row = {
                        "query": number,
                        "rows": actual.num_rows,
                        "seconds": round(elapsed, 3),
                        "rerun": result.tasks_rerun,
                        "ok": diff is None,
                        "error": diff or "",
                    }
                except Exception as exc:  # a failed query is a result too
                    row = {
                        "query": number,
                        "rows": 0,
                        "seconds": round(time.perf_counter() - started, 3),
                        "rerun": 0,
                        "ok": False,
                        "error": str(exc)[:300],
                    }
                rows.append(row)
                print(json.dumps(row), flush=True)
        executors = []
        for handle in cluster.executors:
            log = handle.log_path.read_text(errors="replace")
            spills = [float(m.group(2)) * _UNITS[m.group(3)] for m in _SPILLED.finditer(log)]
            executors.append(
                {
                    "index": handle.index,
                    "alive": handle.alive(),
                    "cgroup_peak": cluster.cgroups[handle.index].peak(),
                    "oom_kills": cluster.oom_kills(handle.index),
                    "tasks_spilled": len(spills),
                    "most_spilled": int(max(spills, default=0)),
                    "spilled_total": int(sum(spills)),
                }
            )
    ok = sum(r["ok"] for r in rows)
    print()
    print(
        f"{args.executors} executors x {args.slots} slots, --memory {args.memory} "
        f"(each slot's DuckDB: {format_size(share.memory)}), cgroup limit "
        f"{format_size(limit)} each, TPC-H SF{args.scale:g}, partitions "
        f"{args.partitions or 'default'}, split bytes {args.split_bytes or 'default'}"
    )
    print()
    print("| query | rows | s | re-run | ok |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        mark = "ok" if r["ok"] else f"FAILED: {r['error']}"
        print(f"| q{r['query']:02d} | {r['rows']} | {r['seconds']:.3f} | {r['rerun']} | {mark} |")
    total = sum(r["seconds"] for r in rows)
    print(f"| **total** | | **{total:.3f}** | {sum(r['rerun'] for r in rows)} | {ok}/{len(rows)} |")
    print()
    print(
        "| executor | peak (cgroup) | OOM kills | tasks that spilled | most one spilled | alive |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for e in executors:
        print(
            f"| {e['index']} | {format_size(e['cgroup_peak'])} | {e['oom_kills']} | "
            f"{e['tasks_spilled']} | {format_size(e['most_spilled'])} | {e['alive']} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "queries": rows, "executors": executors}, indent=1)
        )
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
