"""Scale-out: executors made hosts of their own cores, against DuckDB on the same cores.

Each mangonel executor is a host of its own, as on separate machines: ``--host-id
host-<i> --cores C --slots S --threads C/S``, pinned with ``taskset`` to its own C
cores (cores ``i*C`` to ``i*C+C-1``), so its shuffle partitions reach the others over
Arrow Flight and never from a shared disk; the scheduler and this process (the
client) are not pinned. For every host count in ``--hosts`` a ``LocalCluster`` of
that many executors is started (all at once, idle but for heartbeats while another
runs), and DuckDB runs in a child process of its own (``engine_worker.py``) with as
many threads as the cores it is pinned to: one host's, and every host count's. Each
query runs on every engine in turn, ``--repeat`` times (interleaved: all see the same
page cache and the same machine), the median counts, and every answer is compared
with DuckDB's.

Reported per query and host count N: mangonel's time; the speedup over one host (its
one-host time over its N-host time; one host is the path without distribution: one
executor, shuffles read from its own disk); the ratio to one DuckDB process on the
same N*C cores, and to DuckDB on one host's C cores; the stages and tasks the job ran
and on how many hosts (a query the planner ran as one task on one host is not
distributed, whatever its time). Then, the point: where the distributed time went,
from the job's own telemetry (the REST API's ``breakdown``, ``scheduler.breakdown``):
every slot's time over the query, from the submission's arrival to the result in the
client's hands, by what it did: the phases of its tasks (launch, setup, fetch,
execute, write, cleanup, report), idle at a stage barrier, idle while no slot ran a
task (the scheduler's hops between stages), idle before the first launch (planning),
and idle while the client submitted and read the result; with the bytes the tasks
fetched over the network, the skew of each stage, and the CPU the scheduler and the
client spent. Totals over the queries are ranked.

``--suite tpcds`` runs TPC-DS instead (``tests/helpers.ensure_tpcds`` generates it).

Usage::

    .venv/bin/python benchmarks/scaleout.py --scale 1 --hosts 1,2 --cores-per-host 1 \\
        --repeat 3 --json scaleout.json

``--base-src DIR`` also runs another checkout's code (``DIR`` is its ``src/``) on
clusters of its own, beside this checkout's, query by query, and adds an A/B table:
one run, the same machine state for both.

Prints markdown tables and, with ``--json``, writes every run's figures. Not a test:
timings belong here. The machine should be quiet: the load average at the start and
end, and the spread of each engine's runs, are printed to say how noisy it was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from ab import cpu_seconds, parse_queries  # noqa: E402  (sibling modules: benchmarks/ is no package)
from engines import (  # noqa: E402
    EngineError,
    MangonelEngine,
    WorkerEngine,
    add_huge_pages_argument,
    huge_pages_for_workers,
    pinned,
)
from helpers import (  # noqa: E402  (the test helpers live outside the package)
    CACHE_DIR,
    TPCDS_TABLES,
    TPCH_ORDER_BY,
    TPCH_TABLES,
    compare_results,
    ensure_tpcds,
    ensure_tpch,
    order_by_outputs,
    tpcds_query,
    tpch_query,
)

import mangonel  # noqa: E402

ON_SLOT = ("setup", "fetch", "execute", "write", "cleanup", "other")
CATEGORIES = (
    "execute",
    "setup",
    "fetch",
    "write",
    "cleanup",
    "other",
    "launch",
    "report",
    "wasted",
    "idle_barrier",
    "idle_scheduler",
    "idle_planning",
    "idle_client",
)
"""Where a slot's time goes (``scheduler.breakdown``), and ``idle_client``: the slots
while the client submits the query and reads its result, outside the job's window."""


@dataclass
class Run:
    """One engine's runs of one query."""

    times: list[float] = field(default_factory=list)
    ok: bool = True
    error: str = ""
    jobs: list[dict[str, Any]] = field(default_factory=list)
    """mangonel: each run's job as the REST API describes it (and the CPU it took)."""

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times) if self.times and not self.error else None

    def median_job(self) -> dict[str, Any] | None:
        """The job of the run whose time is the median (the lower of the middle two)."""
        if not self.jobs or len(self.jobs) != len(self.times):
            return None
        order = sorted(range(len(self.times)), key=self.times.__getitem__)
        return self.jobs[order[(len(order) - 1) // 2]]


@dataclass
class Row:
    query: int
    runs: dict[str, Run]


class PinnedCluster(mangonel.LocalCluster):
    """A ``LocalCluster`` whose executor *i* runs on ``host_cpus[i]`` alone."""

    def __init__(self, host_cpus: Sequence[Sequence[int]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host_cpus = [list(c) for c in host_cpus]

    def executor_command(self, index: int, args: list[str]) -> list[str]:
        return pinned(args, self.host_cpus[index])


class Mangonel(MangonelEngine):
    """A pinned cluster's session; each run also reads the job's telemetry and the
    CPU the scheduler, the executors and this process (the client) spent on it."""

    def __init__(self, name: str, cluster: PinnedCluster, session: Any) -> None:
        super().__init__(cluster, session)
        self.name = name
        self.job: dict[str, Any] = {}

    def run(self, sql: str) -> tuple[float, pa.Table]:
        scheduler = [self.cluster.scheduler.pid]
        executors = [e.pid for e in self.cluster.executors]
        before = (cpu_seconds(scheduler), cpu_seconds(executors), time.process_time())
        elapsed, table = super().run(sql)
        after = (cpu_seconds(scheduler), cpu_seconds(executors), time.process_time())
        url = f"{self.cluster.web_url}/api/jobs/{self.last.job_id}"
        with urllib.request.urlopen(url, timeout=30) as answer:
            self.job = json.load(answer)
        self.job["client_s"] = elapsed
        spent = [b - a for a, b in zip(before, after, strict=True)]
        self.job["cpu_s"] = dict(zip(("scheduler", "executors", "client"), spent, strict=True))
        return elapsed, table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=("tpch", "tpcds"), default="tpch")
    parser.add_argument("--scale", type=float, default=1.0, help="scale factor (default 1)")
    parser.add_argument("--hosts", default="1,2", help="host counts, e.g. 1,2,4 (default 1,2)")
    parser.add_argument("--cores-per-host", type=int, default=1, help="cores of each host (1)")
    parser.add_argument(
        "--slots-per-host",
        type=int,
        default=1,
        help="task slots of each executor, each with cores/slots DuckDB threads (1)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per query; the median counts")
    parser.add_argument("--queries", help="e.g. 1,3,5 or 1-22 (default: all of the suite)")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="where data is cached")
    parser.add_argument("--work-dir", type=Path, help="the clusters' work dirs (default: temp)")
    parser.add_argument(
        "--base-src",
        help="another checkout's src/ (e.g. `git worktree add /tmp/base BASE`, then "
        "/tmp/base/src): its clusters of every host count run beside this checkout's, "
        "query by query, and an A/B table compares the two",
    )
    add_huge_pages_argument(parser)
    args = parser.parse_args(argv)
    args.hosts = sorted({int(h) for h in args.hosts.split(",")})
    if args.hosts[0] != 1:
        args.hosts.insert(0, 1)  # every speedup is over one host
    cpus = sorted(os.sched_getaffinity(0))
    need = args.hosts[-1] * args.cores_per_host
    if need > len(cpus):
        parser.error(f"{need} cores needed ({args.hosts[-1]} hosts), this process has {len(cpus)}")
    if args.cores_per_host % args.slots_per_host:
        parser.error("--cores-per-host must be a multiple of --slots-per-host")
    args.cpus = cpus
    args.queries = parse_queries(args.queries or ("1-22" if args.suite == "tpch" else "1-99"))
    return args


def host_cpus(args: argparse.Namespace, hosts: int) -> list[list[int]]:
    c = args.cores_per_host
    return [args.cpus[i * c : (i + 1) * c] for i in range(hosts)]


@contextlib.contextmanager
def cluster(
    args: argparse.Namespace,
    hosts: int,
    tables: dict[str, Path],
    work: Path,
    src: str | None = None,
) -> Iterator[Mangonel]:
    """A pinned cluster of ``hosts`` hosts, running the code under ``src`` (another
    checkout's ``src/``, for ``--base-src``) or this checkout's."""
    threads = args.cores_per_host // args.slots_per_host
    pinned_to = host_cpus(args, hosts)
    name = f"mangonel-{hosts}h" + ("-base" if src else "")
    started = PinnedCluster(
        pinned_to,
        executors=hosts,
        work_dir=str(work / name),
        slots=args.slots_per_host,
        web_port=0,
        log_level="warning",
        executor_args_for=lambda i: [
            "--host-id",
            f"host-{i}",
            "--cores",
            str(args.cores_per_host),
            "--threads",
            str(threads),
        ],  # fmt: skip
    )
    with with_pythonpath(src):
        started.start()
    try:
        with started.connect() as session:
            for table, path in tables.items():
                session.register_parquet(table, str(path))
            yield Mangonel(name, started, session)
    finally:
        started.stop()


@contextlib.contextmanager
def with_pythonpath(src: str | None) -> Iterator[None]:
    """``PYTHONPATH`` set to ``src`` (when given) for the processes started inside."""
    before = os.environ.get("PYTHONPATH")
    if src:
        os.environ["PYTHONPATH"] = src
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def check(suite: str, number: int, sql: str, actual: pa.Table, expected: pa.Table) -> str | None:
    if suite == "tpch":
        order_by: Sequence[str] | None = TPCH_ORDER_BY[number]
    else:
        order_by = order_by_outputs(sql, expected.column_names)
    why = compare_results(actual, expected, ordered=bool(order_by), order_by=order_by or ())
    return None if why is None else why.splitlines()[0][:200]


def bench_query(
    suite: str, number: int, engines: dict[str, Any], repeat: int, reference: str
) -> Row:
    sql = tpch_query(number) if suite == "tpch" else tpcds_query(number)
    runs = {name: Run() for name in engines}
    answers: dict[str, pa.Table] = {}
    for _ in range(repeat):
        for name, engine in engines.items():
            run = runs[name]
            if run.error:
                continue
            try:
                elapsed, answers[name] = engine.run(sql)
            except Exception as exc:  # a failed query is a row of the report
                run.ok, run.error = False, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                continue
            run.times.append(elapsed)
            if isinstance(engine, Mangonel):
                run.jobs.append(engine.job)
    expected = answers.get(reference)
    for name, run in runs.items():
        if name != reference and name in answers and expected is not None and not run.error:
            why = check(suite, number, sql, answers[name], expected)
            if why is not None:
                run.ok, run.error = False, "wrong answer: " + why
    return Row(number, runs)


# ------------------------------------------------------------------ what a job says


def job_shape(job: dict[str, Any]) -> tuple[int, int, int]:
    """(stages, tasks, hosts that ran a task) of one run of a query."""
    done = [a for a in job["attempts"] if a["state"] == "succeeded"]
    return len(job["stages"]), len(done), len({a["executor"] for a in done})


def slot_seconds(job: dict[str, Any]) -> dict[str, float]:
    """Every slot's time from the query's submission to its result in the client's
    hands, by ``CATEGORIES`` (the job's breakdown, and the client's own time)."""
    b = job["breakdown"]
    seconds = {c: float(b["seconds"].get(c, 0.0)) for c in CATEGORIES}
    seconds["idle_client"] = max(0.0, job["client_s"] - b["window_s"]) * b["slots"]
    return seconds


def shuffled(job: dict[str, Any]) -> tuple[int, int]:
    """(bytes fetched over the network, bytes read on the task's own host)."""
    phases = [s["phases"] for s in job["stages"] if s.get("phases")]
    return (
        sum(p["fetched_remote_bytes"] for p in phases),
        sum(p["fetched_local_bytes"] for p in phases),
    )


def worst_skew(job: dict[str, Any]) -> float:
    """The largest skew (slowest task / median) of a stage of several tasks."""
    skews = [s["phases"]["skew"] for s in job["stages"] if s.get("phases", {}) and
             s["phases"]["tasks"] > 1]  # fmt: skip
    return max(skews, default=1.0)


def stage_waits(job: dict[str, Any]) -> tuple[float, float]:
    """(Wall seconds of the stages that ran as one task, slot-seconds the tasks of
    stages of several waited for their stage's slowest: the skew tail).

    Each is a part of the barrier idling: while a one-task stage runs, every other
    host idles unless another stage runs beside it; a task that ends before its
    stage's last one leaves its slot idle until the next stage starts.
    """
    spans: dict[int, list[tuple[float, float]]] = {}
    for a in job["attempts"]:
        if a["state"] == "succeeded" and a.get("phases"):
            end = a["launched_at"] + sum(v for k, v in a["phases"].items() if k in SPAN)
            spans.setdefault(a["stage"], []).append((a["launched_at"], end))
    one_task = tail = 0.0
    for tasks in spans.values():
        last = max(e for _, e in tasks)
        if len(tasks) == 1:
            one_task += last - tasks[0][0]
        else:
            tail += sum(last - e for _, e in tasks)
    return one_task, tail


SPAN = {f"{p}_s" for p in ("launch", *ON_SLOT, "report")}


# ------------------------------------------------------------------------ report


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def times_table(rows: list[Row], args: argparse.Namespace) -> str:
    c = args.cores_per_host
    head = f"| query | DuckDB {c} core{'s' if c > 1 else ''} s |"
    sep = "|---|---:|"
    for n in args.hosts[1:]:
        head += f" DuckDB {n * c} cores s |"
        sep += "---:|"
    for n in args.hosts:
        head += f" mangonel {n}×{c} s | stages/tasks/hosts |"
        sep += "---:|---|"
        if n > 1:
            head += f" speedup over 1 host | × DuckDB {n * c} cores |"
            sep += "---:|---:|"
        head += f" × DuckDB {c} core{'s' if c > 1 else ''} |"
        sep += "---:|"
    lines = [head + " ok |", sep + "---|"]
    totals: dict[str, float] = {}
    complete = bool(rows)
    for row in rows:
        med = {name: run.median_s for name, run in row.runs.items()}
        complete = complete and all(v is not None for v in med.values())
        for name, value in med.items():
            totals[name] = totals.get(name, 0.0) + (value or 0.0)
        cells = [f"q{row.query:02d}", fmt(med[f"duckdb-{c}c"])]
        cells += [fmt(med[f"duckdb-{n * c}c"]) for n in args.hosts[1:]]
        for n in args.hosts:
            mine = med[f"mangonel-{n}h"]
            job = row.runs[f"mangonel-{n}h"].median_job()
            cells += [fmt(mine), "/".join(map(str, job_shape(job))) if job else "-"]
            if n > 1:
                cells += [
                    fmt(ratio(med["mangonel-1h"], mine), 2),
                    fmt(ratio(mine, med[f"duckdb-{n * c}c"]), 2),
                ]
            cells.append(fmt(ratio(mine, med[f"duckdb-{c}c"]), 2))
        bad = [f"{name}: {run.error}" for name, run in row.runs.items() if run.error]
        lines.append("| " + " | ".join(cells) + f" | {'; '.join(bad) or 'ok'} |")
    if complete:
        cells = ["**total**", fmt(totals[f"duckdb-{c}c"])]
        cells += [fmt(totals[f"duckdb-{n * c}c"]) for n in args.hosts[1:]]
        for n in args.hosts:
            mine = totals[f"mangonel-{n}h"]
            cells += [f"**{fmt(mine)}**", ""]
            if n > 1:
                cells += [
                    f"**{fmt(ratio(totals['mangonel-1h'], mine), 2)}**",
                    f"**{fmt(ratio(mine, totals[f'duckdb-{n * c}c']), 2)}**",
                ]
            cells.append(f"**{fmt(ratio(mine, totals[f'duckdb-{c}c']), 2)}**")
        lines.append("| " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def ab_table(rows: list[Row], args: argparse.Namespace) -> str:
    """Per query and host count, this checkout's median time over the base's, with
    both plans' shapes; totals last."""
    head, sep = "| query |", "|---|"
    for n in args.hosts:
        head += f" {n} host(s): base s | this s | this/base | shapes (base → this) |"
        sep += "---:|---:|---:|---|"
    lines = [head, sep]
    totals: dict[str, float] = {}
    for row in rows:
        cells = [f"q{row.query:02d}"]
        for n in args.hosts:
            base, mine = row.runs[f"mangonel-{n}h-base"], row.runs[f"mangonel-{n}h"]
            for key, run in (("base", base), ("this", mine)):
                totals[f"{n}{key}"] = totals.get(f"{n}{key}", 0.0) + (run.median_s or 0.0)
            shapes = [run.median_job() for run in (base, mine)]
            cells += [
                fmt(base.median_s),
                fmt(mine.median_s),
                fmt(ratio(mine.median_s, base.median_s), 2),
                " → ".join("/".join(map(str, job_shape(j))) if j else "-" for j in shapes),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["**total**"]
    for n in args.hosts:
        base, mine = totals.get(f"{n}base"), totals.get(f"{n}this")
        cells += [fmt(base), fmt(mine), f"**{fmt(ratio(mine, base), 2)}**", ""]
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


SHOWN = ("execute", "setup", "fetch", "write", "launch", "report", "idle_barrier",
         "idle_scheduler", "idle_planning", "idle_client")  # fmt: skip
"""The columns of the per-query breakdown; the rest goes into ``rest``."""


def breakdown_table(rows: list[Row], engine: str) -> tuple[str, dict[str, float]]:
    """Per query, each category's share of the slots' time; and the totals (slot-seconds
    by category, and ``extra``: the other columns summed, see ``extra_line``)."""
    head = "| query | client s | slots × window s |" + "".join(f" {c} |" for c in SHOWN)
    head += (
        " rest | planning s | one-task stages s | skew tail slot-s | fetched: network (own host)"
        " | worst skew | CPU s: scheduler, client |"
    )
    lines = [head, "|---|---:|---:|" + "---:|" * (len(SHOWN) + 1) + "---:|" * 5 + "---|"]
    totals = dict.fromkeys(CATEGORIES, 0.0)
    extra = dict.fromkeys(EXTRA, 0.0)
    for row in rows:
        job = row.runs[engine].median_job()
        if job is None:
            continue
        seconds = slot_seconds(job)
        capacity = sum(seconds.values())
        for name, value in seconds.items():
            totals[name] += value
        share = {name: value / capacity if capacity else 0.0 for name, value in seconds.items()}
        rest = 1.0 - sum(share[c] for c in SHOWN)
        remote, local = shuffled(job)
        one_task, tail = stage_waits(job)
        cpu = job["cpu_s"]
        for name, value in zip(
            EXTRA,
            (job["client_s"], job["planning_s"], one_task, tail, remote, local,
             cpu["scheduler"], cpu["executors"], cpu["client"]),
            strict=True,
        ):  # fmt: skip
            extra[name] += value
        lines.append(
            f"| q{row.query:02d} | {job['client_s']:.3f} | {capacity:.3f} |"
            + "".join(f" {share[c]:.0%} |" for c in SHOWN)
            + f" {rest:.0%} | {job['planning_s']:.3f} | {one_task:.3f} | {tail:.3f} |"
            f" {remote / 1e6:.1f} MB ({local / 1e6:.1f} MB) |"
            f" {worst_skew(job):.1f} | {cpu['scheduler']:.2f}, {cpu['client']:.2f} |"
        )
    return "\n".join(lines), totals | {f"extra_{k}": v for k, v in extra.items()}


EXTRA = ("client_s", "planning_s", "one_task_stages_s", "skew_tail_slot_s", "fetched_remote",
         "fetched_local", "cpu_scheduler_s", "cpu_executors_s", "cpu_client_s")  # fmt: skip


def extra_line(totals: dict[str, float]) -> str:
    x = {k: totals[f"extra_{k}"] for k in EXTRA}
    return (
        f"Over the queries: {x['client_s']:.2f} s of client time, {x['planning_s']:.3f} s "
        f"planning, {x['one_task_stages_s']:.2f} s in stages of one task, "
        f"{x['skew_tail_slot_s']:.2f} slot-s waiting for a stage's slowest task; "
        f"{x['fetched_remote'] / 1e6:.0f} MB fetched over the network, "
        f"{x['fetched_local'] / 1e6:.0f} MB read on the task's own host; CPU: scheduler "
        f"{x['cpu_scheduler_s']:.2f} s, executors {x['cpu_executors_s']:.2f} s, client "
        f"{x['cpu_client_s']:.2f} s."
    )


def ranked_table(totals: dict[str, float]) -> str:
    slots = {k: v for k, v in totals.items() if k in CATEGORIES}
    capacity = sum(slots.values())
    lines = ["| where the slots' time went | slot-seconds | share |", "|---|---:|---:|"]
    for name, value in sorted(slots.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {value:.3f} | {value / capacity:.1%} |")
    lines.append(f"| **all** | **{capacity:.3f}** | |")
    return "\n".join(lines)


def loss_table(one: dict[str, float], many: dict[str, float], hosts: int) -> str:
    """What ``hosts`` hosts cost beyond an ideal split of one host's time: the slots'
    time on them less one host's, category by category (ideally the same total: the
    same work in 1/``hosts`` of the time on ``hosts`` times the slots)."""
    loss = sum(many[c] for c in CATEGORIES) - sum(one[c] for c in CATEGORIES)
    lines = [
        f"| category | 1 host slot-s | {hosts} hosts slot-s | more on {hosts} hosts "
        "| share of the loss |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in sorted(CATEGORIES, key=lambda c: one[c] - many[c]):
        more = many[c] - one[c]
        lines.append(
            f"| {c} | {one[c]:.3f} | {many[c]:.3f} | {more:+.3f} | "
            f"{more / loss if loss else 0.0:.0%} |"
        )
    lines.append(f"| **all** | | | **{loss:+.3f}** | |")
    x1 = {k: one[f"extra_{k}"] for k in EXTRA}
    xn = {k: many[f"extra_{k}"] for k in EXTRA}
    lines.append(
        f"\nCPU of the executors {x1['cpu_executors_s']:.2f} s on one host, "
        f"{xn['cpu_executors_s']:.2f} s on {hosts}; of the scheduler "
        f"{x1['cpu_scheduler_s']:.2f} s and {xn['cpu_scheduler_s']:.2f} s (it and the "
        "client share the hosts' cores). Of the barrier idling on "
        f"{hosts} hosts, stages of one task ran {xn['one_task_stages_s']:.2f} s (the "
        f"other hosts idle meanwhile, unless another stage ran beside), and tasks waited "
        f"{xn['skew_tail_slot_s']:.2f} slot-s for their stage's slowest."
    )
    return "\n".join(lines)


def noise_table(rows: list[Row]) -> str:
    """Per engine, the median over the queries of (slowest - fastest run) / median."""
    lines = ["| engine | median spread of its runs | largest |", "|---|---:|---:|"]
    for name in rows[0].runs if rows else ():
        spreads = [
            (max(times) - min(times)) / statistics.median(times)
            for times in (r.runs[name].times for r in rows)
            if len(times) > 1 and statistics.median(times) > 0
        ]
        if spreads:
            lines.append(f"| {name} | {statistics.median(spreads):.0%} | {max(spreads):.0%} |")
    return "\n".join(lines)


# -------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.suite == "tpch":
        data = ensure_tpch(args.scale, args.cache_dir)
        names: Sequence[str] = TPCH_TABLES
    else:
        data = ensure_tpcds(args.scale, args.cache_dir)
        names = TPCDS_TABLES
    tables = {name: data / f"{name}.parquet" for name in names}
    c = args.cores_per_host
    load = os.getloadavg()
    print(
        f"{args.suite.upper()} SF {args.scale:g}: mangonel on {args.hosts} host(s) of {c} "
        f"core(s) each ({args.slots_per_host} slot(s)), against DuckDB on the same cores"
        f"{' without huge pages' if args.duckdb_no_huge_pages else ''}; "
        f"median of {args.repeat}; {os.cpu_count()} CPUs, load {load[0]:.2f} at the start "
        f"({time.strftime('%Y-%m-%d %H:%M:%S')})\n"
    )
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mangonel-scaleout-", dir=args.work_dir))
    rows: list[Row] = []
    clean = False
    try:
        with contextlib.ExitStack() as stack:
            engines: dict[str, Any] = {}
            huge_pages_for_workers(args)
            for n in [1, *args.hosts[1:]]:
                cpus = [cpu for host in host_cpus(args, n) for cpu in host]
                worker = WorkerEngine("duckdb", data, len(cpus), cpus, names)
                stack.callback(worker.close)
                engines[f"duckdb-{len(cpus)}c"] = worker
            for n in args.hosts:
                engines[f"mangonel-{n}h"] = stack.enter_context(cluster(args, n, tables, work))
                if args.base_src:
                    base = cluster(args, n, tables, work, args.base_src)
                    engines[f"mangonel-{n}h-base"] = stack.enter_context(base)
            reference = f"duckdb-{c}c"
            for number in args.queries:
                row = bench_query(args.suite, number, engines, args.repeat, reference)
                rows.append(row)
                parts = [f"{name} {fmt(run.median_s)}{' ' + run.error if run.error else ''}"
                         for name, run in row.runs.items()]  # fmt: skip
                print(f"q{number:02d}: " + ", ".join(parts), file=sys.stderr, flush=True)
        clean = True
    except EngineError as exc:
        print(f"an engine failed to start: {exc}", file=sys.stderr)
        return 2
    finally:
        if clean:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"the clusters' work directories (logs) are kept at {work}", file=sys.stderr)
    end_load = os.getloadavg()
    print(times_table(rows, args))
    print(f"\nLoad average {load[0]:.2f} at the start, {end_load[0]:.2f} at the end. "
          "The spread of each engine's runs (noise):\n")  # fmt: skip
    print(noise_table(rows))
    if args.base_src:
        print(f"\n### A/B: this checkout against {args.base_src}, side by side\n")
        print(ab_table(rows, args))
    payload: dict[str, Any] = {
        "suite": args.suite,
        "scale": args.scale,
        "hosts": args.hosts,
        "cores_per_host": c,
        "slots_per_host": args.slots_per_host,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "load": [load, end_load],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": [{"query": r.query, **{n: asdict(run) for n, run in r.runs.items()}} for r in rows],
    }
    for n in args.hosts:
        engine = f"mangonel-{n}h"
        table, totals = breakdown_table(rows, engine)
        print(f"\n### Where the time went: {n} host(s) × {c} core(s), each query's median run\n")
        print("Shares of the slots' time from the submission's arrival to the result in the "
              "client's hands (slots × that time = 100 %):\n")  # fmt: skip
        print(table)
        print(f"\nAll queries, {n} host(s), ranked:\n")
        print(ranked_table(totals))
        print("\n" + extra_line(totals))
        payload[f"breakdown_{engine}"] = totals
        if n > 1:
            print(f"\nWhat {n} hosts cost beyond an ideal split of one host's time:\n")
            print(loss_table(payload["breakdown_mangonel-1h"], totals, n))
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0 if all(run.ok for r in rows for run in r.runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
