"""Where mangonel's time goes: sampled stacks, stage times, fixed costs, granularity.

Not a benchmark of record (``tpch.py`` is): a tool for finding what to make
faster. For the chosen TPC-H queries (by default the five slowest relative to
DuckDB in a ``tpch.py --json`` file) it:

1. runs each query once to warm up, then ``--repeat`` times with ``py-spy
   record`` (``--nonblocking``, so the processes are not paused) attached to
   the scheduler and to every executor, and sorts the samples of active
   threads by the innermost mangonel function on their stack into: scan
   (opening a scan database; Parquet decode with pyarrow where a scan does not
   go through DuckDB's reader, whose decoding counts as DuckDB execution),
   DuckDB execution, shuffle write (split, IPC, crc32 + file write, rename),
   shuffle read (mmap + crc32, Flight, concat), DuckDB
   register, reporting, and on the scheduler planning (sqlglot, mangonel.plan),
   the state machine, the store and the gRPC service; samples / rate = CPU
   seconds (threads, not wall time: 2 executors x N slots share the cores);
2. reports per query: client wall time, scheduler time (submit to job end),
   the client-side rest (result fetch over Flight, release, round trips) and
   each stage's time, tasks and bytes;
3. measures the per-task fixed cost with ``SELECT count(*) FROM lineitem``
   (reads no column) at one task per row group vs one task in all;
4. runs the queries again with other ``--split-rows`` values (task granularity).

Usage::

    .venv/bin/pip install py-spy   # into .venv, not a project dependency
    .venv/bin/python benchmarks/profile_mangonel.py --scale 1 --from-json bench.json
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import CACHE_DIR, TPCH_TABLES, ensure_tpch, tpch_query  # noqa: E402

PY_SPY = Path(sys.executable).parent / "py-spy"
RATE = 100
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]*)(?::\d+)?\)$")

# Innermost match wins: (function name, file part or "", category).
EXECUTOR_RULES: tuple[tuple[str, str, str], ...] = (
    ("file_checksum", "shuffle", "shuffle write: crc32 + rename"),
    ("commit", "shuffle", "shuffle write: crc32 + rename"),
    ("write", "shuffle", "shuffle write: crc32 + file write"),
    ("write_batch", "shuffle", "shuffle write: Arrow IPC"),
    ("write_table", "shuffle", "shuffle write: Arrow IPC"),
    ("write_split", "partitioning", "shuffle write: split (sort + take)"),
    ("open", "shuffle", "shuffle write: open files"),
    ("_read_local", "shuffle", "shuffle read: mmap + crc32"),
    ("_read_flight", "shuffle", "shuffle read: Flight"),
    ("read_many", "shuffle", "shuffle read: concat"),
    ("_split_batches", "scan", "scan: Parquet decode (pyarrow)"),
    ("read_scan", "scan", "scan: Parquet decode (pyarrow)"),
    ("connection", "databases", "scan: open a scan database"),
    ("scan_sql", "scan", "scan: plan the split's read"),
    ("_register", "runner", "DuckDB register/unregister"),
    ("run", "runner", "task setup/teardown (register, unregister)"),
    ("_batches", "runner", "DuckDB execution"),
    ("_execute", "runner", "DuckDB execution"),
    ("do_get", "flight", "serving Flight (results)"),
    ("_report", "service", "reporting to the scheduler"),
    ("", "link", "control stream (link)"),
    ("", "faults", "fault-rule check"),
    ("_attempt", "service", "task bookkeeping"),
    ("_run_task", "service", "task bookkeeping"),
)
SCHEDULER_RULES: tuple[tuple[str, str, str], ...] = (
    ("", "sqlglot", "planning: sqlglot parse/optimize"),
    ("", "mangonel/sql", "planning: mangonel.sql"),
    ("", "mangonel/plan", "planning: mangonel.plan"),
    ("", "mangonel/catalog", "planning: catalog"),
    ("", "sqlite", "state store (SQLite)"),
    ("", "scheduler/store", "state store (SQLite)"),
    ("", "scheduler/state", "state machine"),
    ("", "scheduler/jobs", "jobs"),
    ("", "scheduler/core", "scheduler core (I/O shell)"),
    ("", "scheduler/service", "gRPC service"),
    ("", "proto", "proto conversion"),
    ("", "grpc", "gRPC"),
)


def classify(stack: list[str], rules: tuple[tuple[str, str, str], ...]) -> str:
    """The category of one sampled stack (outermost frame first)."""
    innermost = FRAME.match(stack[-1]) if stack else None
    if innermost and innermost["file"].endswith("threading.py"):
        return "waiting (a lock or event; py-spy saw the thread running)"
    for frame in reversed(stack):
        m = FRAME.match(frame)
        func, file = (m["func"], m["file"]) if m else (frame, "")
        func = func.rpartition(".")[2]  # py-spy writes Class.method
        for name, part, category in rules:
            if (not name or func == name) and part in file:
                return category
    return "other"


def parse_raw(path: Path, rules: tuple[tuple[str, str, str], ...]) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    if not path.exists():
        return counts
    for line in path.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not stack_text:
            continue
        counts[classify(stack_text.split(";"), rules)] += int(count)
    return counts


class Sampler:
    """``py-spy record`` attached to some pids until ``stop``."""

    def __init__(self, pids: dict[str, int], out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.files = {name: out_dir / f"{name}.raw" for name in pids}
        self.procs = [
            subprocess.Popen(
                [
                    str(PY_SPY),
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(RATE),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--full-filenames",
                    "--output",
                    str(self.files[name]),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for name, pid in pids.items()
        ]
        time.sleep(1.0)  # py-spy attaches in a fraction of a second

    def stop(self) -> dict[str, collections.Counter[str]]:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return {
            name: parse_raw(path, SCHEDULER_RULES if name == "scheduler" else EXECUTOR_RULES)
            for name, path in self.files.items()
        }


def start_cluster(scale_dir: Path, split_rows: int | None, work: Path) -> tuple[Any, Any]:
    import mangonel

    args: tuple[str, ...] = () if split_rows is None else ("--split-rows", str(split_rows))
    cluster = mangonel.LocalCluster(executors=2, work_dir=str(work), scheduler_args=args)
    cluster.start()
    session = cluster.connect()
    for name in TPCH_TABLES:
        session.register_parquet(name, str(scale_dir / f"{name}.parquet"))
    return cluster, session


def stage_rows(result: Any) -> list[dict[str, Any]]:
    return [
        {"stage": s.stage, "label": s.label, "tasks": s.tasks_total, "rows": s.rows,
         "bytes": s.bytes, "elapsed_s": round(s.elapsed_s, 4)}
        for s in result.stages
    ]  # fmt: skip


def profile_queries(session: Any, cluster: Any, numbers: list[int], repeat: int,
                    out: Path) -> dict[str, Any]:  # fmt: skip
    report: dict[str, Any] = {}
    for number in numbers:
        sql = tpch_query(number)
        session.sql(sql)  # warm-up
        pids = {"scheduler": cluster.scheduler.pid}
        pids |= {f"executor-{e.index}": e.pid for e in cluster.executors}
        sampler = Sampler(pids, out / f"q{number:02d}")
        results = [session.sql(sql) for _ in range(repeat)]
        samples = sampler.stop()
        median = sorted(results, key=lambda r: r.elapsed_s)[len(results) // 2]
        executor_total: collections.Counter[str] = collections.Counter()
        for name, counts in samples.items():
            if name != "scheduler":
                executor_total += counts
        report[f"q{number:02d}"] = {
            "explain_s": explain_time(session, sql),
            "client_s": median.elapsed_s,
            "scheduler_s": median.scheduler_elapsed_s,
            "client_rest_s": median.elapsed_s - median.scheduler_elapsed_s,
            "stages": stage_rows(median),
            # CPU seconds per run (samples of active threads / rate / runs).
            "executor_cpu_s": {k: v / RATE / repeat for k, v in executor_total.most_common()},
            "scheduler_cpu_s": {
                k: v / RATE / repeat for k, v in samples["scheduler"].most_common()
            },
        }
        print(f"q{number:02d}: {json.dumps(report[f'q{number:02d}'], indent=1)}", file=sys.stderr)
    return report


def explain_time(session: Any, sql: str, repeat: int = 5) -> float:
    """Median time of ``session.explain``: planning on the scheduler plus one round trip."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.explain(sql)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def timed(session: Any, sql: str, repeat: int) -> tuple[float, float, Any]:
    results = [session.sql(sql) for _ in range(repeat)]
    median = sorted(results, key=lambda r: r.elapsed_s)[len(results) // 2]
    return median.elapsed_s, median.scheduler_elapsed_s, median


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--queries", help="comma list of query numbers")
    parser.add_argument("--from-json", type=Path, help="tpch.py --json output: 5 slowest")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--split-rows",
        default="250000,1000000,7000000",
        help="other --split-rows values to compare with the default",
    )
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--keep", type=Path, help="keep py-spy raw files here")
    args = parser.parse_args(argv)

    if args.queries:
        numbers = [int(q) for q in args.queries.split(",")]
    elif args.from_json:
        bench = json.loads(args.from_json.read_text())
        ranked = sorted(bench["queries"], key=lambda q: -(q["mangonel"]["ratio"] or 0))
        numbers = [int(q["query"][1:]) for q in ranked[:5]]
    else:
        numbers = [1, 9, 13, 18, 21]
    data = ensure_tpch(args.scale, CACHE_DIR)
    work = Path(tempfile.mkdtemp(prefix="mangonel-profile-"))
    out = args.keep or work / "pyspy"
    report: dict[str, Any] = {"queries": numbers, "scale": args.scale}
    try:
        cluster, session = start_cluster(data, None, work / "default")
        try:
            report["profile"] = profile_queries(session, cluster, numbers, args.repeat, out)
            count = "SELECT count(*) FROM lineitem"
            session.sql(count)
            many = timed(session, count, 5)
            report["fixed_cost"] = {"tasks": many[2].stages[0].tasks_total,
                                    "client_s": many[0], "scheduler_s": many[1]}  # fmt: skip
            select1 = timed(session, "SELECT 1", 20)
            report["fixed_cost"]["select1_client_s"] = select1[0]
            report["fixed_cost"]["select1_scheduler_s"] = select1[1]
            report["fixed_cost"]["select1_explain_s"] = explain_time(session, "SELECT 1", 20)
            report["fixed_cost"]["count_explain_s"] = explain_time(session, count, 5)
            report["granularity"] = {"default": {
                f"q{n:02d}": timed(session, tpch_query(n), args.repeat)[0] for n in numbers
            }}  # fmt: skip
        finally:
            session.close()
            cluster.stop()
        for split in [int(s) for s in args.split_rows.split(",") if s]:
            cluster, session = start_cluster(data, split, work / f"split-{split}")
            try:
                session.sql(tpch_query(numbers[0]))  # warm-up
                if split >= 6_001_215:
                    one = timed(session, count, 5)
                    report["fixed_cost"] |= {"one_task_client_s": one[0],
                                             "one_task_scheduler_s": one[1]}  # fmt: skip
                row: dict[str, Any] = {}
                for n in numbers:
                    client_s, _, result = timed(session, tpch_query(n), args.repeat)
                    row[f"q{n:02d}"] = client_s
                    row[f"q{n:02d}_tasks"] = sum(s.tasks_total for s in result.stages)
                report["granularity"][str(split)] = row
                print(f"split {split}: {row}", file=sys.stderr)
            finally:
                session.close()
                cluster.stop()
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
