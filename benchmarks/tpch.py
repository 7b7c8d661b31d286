"""TPC-H side by side: mangonel, single-process DuckDB, DataFusion and Ballista.

Generates TPC-H at ``--scale`` with ``tpchgen-cli`` into a cache directory (reused
by later runs), then runs each of the chosen queries on every engine, interleaved
per query (query 1 on each engine, ``--repeat`` times, then query 2, ...), so all
see the same page cache, and reports the median of each (and, on a line of its own,
the total of the first runs, before any engine cached anything of the query: the
scheduler reuses a query's plan for the same SQL). Every answer is checked
against DuckDB's with the test suite's comparator. Not a test: timings belong
here, not in asserts.

Engines (``--engines``, default all four):

- ``duckdb``: one process, views over the Parquet files (``engine_worker.py``).
- ``mangonel``: a ``LocalCluster`` (scheduler + ``--executors`` executors).
- ``datafusion``: one process, ``register_parquet`` + ``ctx.sql(q).to_arrow_table()``.
  The TPC-H text runs unchanged; its answers differ from DuckDB's in type only
  (q1 ``avg`` and q8 ``mkt_share`` are decimals, q12's sums are integers, q18's
  ``sum(l_quantity)`` column is named ``sum(lineitem.l_quantity)``), so numeric
  columns are cast to DuckDB's types and columns take DuckDB's names before the
  comparison; the ``ok`` column says ``ok*`` where that was needed.
- ``ballista``: Apache Ballista standalone from PyPI, where ``import ballista``
  works; otherwise the output says it was skipped and why.

DuckDB, DataFusion and Ballista each run in a child process of their own, so the
peak memory reported is that engine's own (``VmHWM``); for mangonel it is the sum
over the scheduler and executor processes, read just before the cluster stops.

``--secure`` adds ``mangonel-secure``: a second ``LocalCluster`` with security on
(``secure=True``: TLS on every channel, signed tickets), run side by side with the
plaintext one, query by query. ``--flight-shuffle`` gives each executor (of both
clusters) a host identity of its own, so shuffle partitions cross between executors
over Flight, as on several machines, instead of being read from the shared disk:
that is where TLS costs most.

``--no-adaptive`` adds ``mangonel-no-adaptive``: a second ``LocalCluster`` whose
scheduler runs every stage with its planned task count (``adaptive=False``), side
by side with the default one, query by query: what coalescing a hash exchange's
small partitions into fewer reader tasks gains or costs.

``--layout random`` runs on a copy of the tables with their rows in a fixed random
order (written once by this script beside the generated data, same row-group sizes
and compression), so no join or aggregate can lean on tables sorted by their keys,
as real tables rarely are; ``--layout both`` runs the two layouts one after the
other and prints both.

``--latency`` adds the latency of trivial queries end to end; ``--shuffle`` the
shuffle throughput against the raw Flight loopback rate (see ``micro.py``);
``--no-tpch`` runs only those.

Usage::

    .venv/bin/python benchmarks/tpch.py --scale 1 --latency --shuffle --json bench.json

Prints markdown tables and, with ``--json``, writes the same as JSON.
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
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

import micro  # noqa: E402  (a sibling module: benchmarks/ is not a package)
from engines import (  # noqa: E402
    Engine,
    EngineError,
    MangonelEngine,
    WorkerEngine,
    add_huge_pages_argument,
    ballista_unavailable,
    huge_pages_for_workers,
)
from helpers import (  # noqa: E402  (the test helpers live outside the package)
    CACHE_DIR,
    TPCH_ORDER_BY,
    TPCH_TABLES,
    cached_tables,
    compare_results,
    duckdb_over,
    ensure_tpch,
    tpch_dir_name,
    tpch_query,
    type_kind,
)

ALL_ENGINES = ("duckdb", "mangonel", "datafusion", "ballista")
REFERENCE = "duckdb"
SECURE_ENGINE = "mangonel-secure"
NO_ADAPTIVE_ENGINE = "mangonel-no-adaptive"
NUMERIC_KINDS = {"integer", "decimal", "float"}


@dataclass
class Run:
    """One engine's runs of one query."""

    times: list[float] = field(default_factory=list)
    ok: bool = False
    adjusted: bool = False
    """The answer matched only after casting numeric types / renaming columns."""
    error: str | None = None
    stages: int | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times) if self.times and self.error is None else None


@dataclass
class Row:
    query: str
    rows: int
    runs: dict[str, Run]

    def ratio(self, engine: str) -> float | None:
        mine, ref = self.runs[engine].median_s, self.runs[REFERENCE].median_s
        return None if mine is None or not ref else mine / ref


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per query; the median counts")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--engines", default=",".join(ALL_ENGINES), help=f"comma list of {', '.join(ALL_ENGINES)}"
    )
    parser.add_argument("--executors", type=int, default=2, help="mangonel executor processes")
    parser.add_argument(
        "--partitions", type=int, help="the most partitions of an exchange (scheduler default)"
    )
    parser.add_argument(
        "--partition-bytes",
        type=int,
        help="one exchange partition per this many bytes, 0: always --partitions "
        "(scheduler default)",
    )
    parser.add_argument(
        "--slots",
        type=int,
        help="task slots per executor (default: the cores shared out among them)",
    )
    parser.add_argument(
        "--threads", type=int, help="DuckDB threads of each mangonel slot (executor default)"
    )
    parser.add_argument(
        "--memory",
        help="memory budget of each mangonel executor, e.g. 4GB (mangonel executor "
        "--memory: each slot's DuckDB gets a share and spills past it; default: the "
        "host's memory shared among the executors)",
    )
    parser.add_argument(
        "--memory-limit",
        help="deprecated (the executors' --memory-limit): DuckDB memory limit of each "
        "mangonel executor slot, e.g. 2GB",
    )
    parser.add_argument("--split-rows", type=int, help="rows per scan task (scheduler default)")
    parser.add_argument(
        "--split-bytes", type=int, help="scanned bytes per scan task (scheduler default)"
    )
    parser.add_argument("--broadcast-bytes", type=int, help="broadcast threshold (default)")
    parser.add_argument(
        "--queries", default="1-22", help="which queries, e.g. '1,3,5' or '1-22' (default all)"
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="also run mangonel with security on (TLS everywhere, signed tickets), side by side",
    )
    parser.add_argument(
        "--no-adaptive",
        action="store_true",
        help="also run mangonel with adaptive execution off (every stage its planned "
        "task count), side by side",
    )
    parser.add_argument(
        "--flight-shuffle",
        action="store_true",
        help="executors report hosts of their own: shuffles go over Flight, not the disk",
    )
    parser.add_argument(
        "--layout",
        choices=("generated", "random", "both"),
        default="generated",
        help="the tables as tpchgen-cli writes them (sorted by their keys), a copy with "
        "the rows in a fixed random order, or both one after the other (default generated)",
    )
    parser.add_argument("--latency", action="store_true", help="trivial-query latency p50/p95")
    parser.add_argument("--shuffle", action="store_true", help="shuffle vs Flight loopback")
    parser.add_argument("--no-tpch", action="store_true", help="skip the 22 queries")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="where data is cached")
    parser.add_argument("--work-dir", type=Path, help="cluster work dir (default: temp)")
    add_huge_pages_argument(parser)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - set(ALL_ENGINES)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; choose from {ALL_ENGINES}")
    if REFERENCE not in args.engines:
        args.engines.insert(0, REFERENCE)  # every answer is checked against it
    if args.secure:
        at = args.engines.index("mangonel") + 1 if "mangonel" in args.engines else 1
        args.engines.insert(at, SECURE_ENGINE)
    if args.no_adaptive:
        at = args.engines.index("mangonel") + 1 if "mangonel" in args.engines else 1
        args.engines.insert(at, NO_ADAPTIVE_ENGINE)
    return args


def parse_queries(spec: str) -> list[int]:
    numbers: list[int] = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        numbers.extend(range(int(low), int(high or low) + 1))
    bad = [n for n in numbers if not 1 <= n <= 22]
    if bad:
        raise SystemExit(f"TPC-H has queries 1 to 22, not {bad}")
    return numbers


def align_types(actual: pa.Table, expected: pa.Table) -> tuple[pa.Table, pa.Table, bool]:
    """(actual, expected) with DuckDB's column names and numeric types where they differ.

    Only for engines whose dialect types results differently (DataFusion's
    decimal ``avg``); values are still compared by ``compare_results``.
    """
    if actual.num_columns != expected.num_columns:
        return actual, expected, False
    changed = actual.column_names != expected.column_names
    columns, wanted = [], []
    for col, want, ref in zip(actual.columns, expected.schema, expected.columns, strict=True):
        have = type_kind(col.type)
        if have != type_kind(want.type) and {have, type_kind(want.type)} <= NUMERIC_KINDS:
            if pa.types.is_decimal(col.type) and type_kind(want.type) == "float":
                # DataFusion's decimal avg/division truncates to the decimal's
                # scale (q1 avg_disc 0.049985, q8 0.01825027): compare DuckDB's
                # double at that scale too.
                factor = 10.0**col.type.scale
                ref = pc.divide(pc.trunc(pc.multiply(ref, factor)), factor)
            col = col.cast(want.type, safe=False)
            changed = True
        columns.append(col)
        wanted.append(ref)
    names = expected.column_names
    return pa.table(columns, names=names), pa.table(wanted, names=names), changed


def check(number: int, engine: str, actual: pa.Table, expected: pa.Table, run: Run) -> None:
    order_by = TPCH_ORDER_BY[number]
    mismatch = compare_results(actual, expected, ordered=bool(order_by), order_by=order_by)
    if mismatch is not None and engine != "mangonel":
        aligned, reference, run.adjusted = align_types(actual, expected)
        if run.adjusted:
            mismatch = compare_results(
                aligned, reference, ordered=bool(order_by), order_by=order_by
            )
    run.ok = mismatch is None
    if mismatch is not None:
        run.error = "wrong answer: " + mismatch.splitlines()[0]
        print(f"q{number:02d} {engine}: {mismatch}", file=sys.stderr)


def bench_query(number: int, engines: dict[str, Engine], repeat: int) -> Row:
    sql = tpch_query(number)
    runs = {name: Run() for name in engines}
    answers: dict[str, pa.Table] = {}
    for _ in range(repeat):
        for name, engine in engines.items():
            run = runs[name]
            if run.error is not None:
                continue
            try:
                elapsed, answers[name] = engine.run(sql)
            except Exception as exc:  # a failed query is a row of the report, not the end
                run.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                if not isinstance(exc, EngineError):
                    traceback.print_exc(file=sys.stderr)
                continue
            run.times.append(elapsed)
            if isinstance(engine, MangonelEngine) and engine.last is not None:
                run.stages = len(engine.last.stages)
    expected = answers.get(REFERENCE)
    for name, run in runs.items():
        if run.error is None and expected is not None and name in answers:
            if name == REFERENCE:
                run.ok = True
            else:
                check(number, name, answers[name], expected, run)
    return Row(f"q{number:02d}", expected.num_rows if expected is not None else 0, runs)


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def totals(rows: list[Row], engine: str) -> float | None:
    medians = [r.runs[engine].median_s for r in rows]
    return None if any(m is None for m in medians) else sum(m for m in medians if m is not None)


def first_totals(rows: list[Row], engine: str) -> float | None:
    """The total of each query's first run: nothing cached yet (mangonel's scheduler
    plans each query then, and reuses the plan for the runs after)."""
    runs = [r.runs[engine] for r in rows]
    firsts = [run.times[0] if run.times and run.error is None else None for run in runs]
    return None if any(f is None for f in firsts) else sum(f for f in firsts if f is not None)


def markdown(rows: list[Row], engines: list[str]) -> str:
    others = [e for e in engines if e != REFERENCE]
    head = "| query | rows | duckdb s |" + "".join(f" {e} s | × |" for e in others) + " ok |"
    lines = [head, "|---|---:|---:|" + "---:|---:|" * len(others) + "---|"]

    def ok_cell(row: Row) -> str:
        bad = [e for e in others if not row.runs[e].ok]
        adjusted = any(row.runs[e].adjusted for e in others if row.runs[e].ok)
        return ("NO: " + ", ".join(bad)) if bad else ("ok*" if adjusted else "ok")

    for r in rows:
        cells = "".join(f" {fmt(r.runs[e].median_s)} | {fmt(r.ratio(e), 2)} |" for e in others)
        lines.append(f"| {r.query} | {r.rows} | {fmt(r.runs[REFERENCE].median_s)} |{cells} "
                     f"{ok_cell(r)} |")  # fmt: skip
    passed = sum(all(r.runs[e].ok for e in engines) for r in rows)
    for label, total_of, bold in (("total", totals, "**"), ("first runs", first_totals, "")):
        ref = total_of(rows, REFERENCE)
        cells = ""
        for e in others:
            total = total_of(rows, e)
            ratio = total / ref if total is not None and ref else None
            cells += f" {bold}{fmt(total)}{bold} | {bold}{fmt(ratio, 2)}{bold} |"
        done = f"{passed}/{len(rows)}" if bold else ""
        lines.append(f"| {bold}{label}{bold} | | {bold}{fmt(ref)}{bold} |{cells} {done} |")
    return "\n".join(lines)


def memory_markdown(memory: dict[str, dict[str, Any]]) -> str:
    lines = ["| engine | peak RSS MB | processes |", "|---|---:|---:|"]
    for name, m in memory.items():
        lines.append(f"| {name} | {m['peak_rss_kb'] / 1024:.0f} | {m['processes']} |")
    return "\n".join(lines)


RANDOM_SEED = 20261201


def random_layout(data: Path, cache_dir: Path, scale: float) -> Path:
    """A copy of the TPC-H tables in ``data`` with each table's rows in a fixed random
    order (seeded, so every run and machine gets the same files), cached beside the
    generated data. Row groups keep the generated files' sizes and compression, so
    the layouts differ in row order alone."""
    import numpy as np
    import pyarrow.parquet as pq

    def shuffle(into: Path) -> None:
        rng = np.random.default_rng(RANDOM_SEED)
        for name in TPCH_TABLES:
            source = pq.ParquetFile(data / f"{name}.parquet")
            meta = source.metadata
            table = source.read()
            order = rng.permutation(table.num_rows)
            # Arrow's take has no string_view kernel (tpchgen-cli writes string_view):
            # reorder as plain strings, then restore the generated schema.
            plain = pa.schema(
                f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f
                for f in table.schema
            )
            shuffled = table.cast(plain).take(pa.array(order)).cast(table.schema)
            pq.write_table(
                shuffled,
                into / f"{name}.parquet",
                row_group_size=meta.row_group(0).num_rows if meta.num_row_groups else None,
                compression=meta.row_group(0).column(0).compression.lower()
                if meta.num_row_groups
                else "snappy",
            )
            del table

    return cached_tables(
        cache_dir / f"{tpch_dir_name(scale)}-random", TPCH_TABLES, "random layout", shuffle
    )


@contextlib.contextmanager
def mangonel_cluster(
    args: argparse.Namespace, tables: dict[str, Path], **overrides: Any
) -> Iterator[tuple[Any, Any]]:
    """A started ``LocalCluster`` with the tables registered: (session, cluster)."""
    import mangonel

    scheduler_args: tuple[str, ...] = ()
    if args.split_rows is not None:
        scheduler_args += ("--split-rows", str(args.split_rows))
    if args.split_bytes is not None:
        scheduler_args += ("--split-bytes", str(args.split_bytes))
    kwargs: dict[str, Any] = {
        "executors": args.executors,
        "partitions": args.partitions,
        "partition_bytes": args.partition_bytes,
        "broadcast_bytes": args.broadcast_bytes,
        "slots": args.slots,
        "scheduler_args": scheduler_args,
        "executor_args": (
            (("--memory", args.memory) if args.memory else ())
            + (("--memory-limit", args.memory_limit) if args.memory_limit else ())
            + (("--threads", str(args.threads)) if args.threads else ())
        ),
    } | overrides
    if args.flight_shuffle:
        kwargs["executor_args_for"] = lambda i: ["--host-id", f"bench-host-{i}"]
    work = Path(tempfile.mkdtemp(prefix="mangonel-bench-", dir=args.work_dir))
    clean = False
    try:
        with (
            mangonel.LocalCluster(work_dir=str(work), **kwargs) as cluster,
            cluster.connect() as session,
        ):
            for name, path in tables.items():
                session.register_parquet(name, str(path))
            yield session, cluster
        clean = True
    finally:
        if clean:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"cluster work directory (logs) kept at {work}", file=sys.stderr)


def start_engines(
    names: list[str], data: Path, args: argparse.Namespace, stack: contextlib.ExitStack,
    tables: dict[str, Path], skipped: dict[str, str],
) -> dict[str, Engine]:  # fmt: skip
    engines: dict[str, Engine] = {}
    huge_pages_for_workers(args)
    for name in names:
        if name == "ballista":
            why = ballista_unavailable()
            if why is not None:
                skipped[name] = why
                print(f"ballista: skipped: {why}", file=sys.stderr)
                continue
        if name in ("mangonel", SECURE_ENGINE, NO_ADAPTIVE_ENGINE):
            overrides: dict[str, Any] = {}
            if name == SECURE_ENGINE:
                overrides["secure"] = True
            if name == NO_ADAPTIVE_ENGINE:
                overrides["adaptive"] = False
            elif args.no_adaptive:
                # Explicitly on: LocalCluster leaves it off where --partition-bytes 0
                # forces every exchange's width, the very case worth comparing.
                overrides["adaptive"] = True
            session, cluster = stack.enter_context(mangonel_cluster(args, tables, **overrides))
            engines[name] = MangonelEngine(cluster, session)
            continue
        try:
            worker = WorkerEngine(name, data)
        except EngineError as exc:
            skipped[name] = str(exc)
            print(f"{name}: skipped: {exc}", file=sys.stderr)
            continue
        stack.callback(worker.close)
        engines[name] = worker
    return engines


def run_tpch(
    args: argparse.Namespace, data: Path, tables: dict[str, Path], skipped: dict[str, str]
) -> tuple[list[Row], list[str], dict[str, dict[str, Any]]]:
    numbers = parse_queries(args.queries)
    rows: list[Row] = []
    memory: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        engines = start_engines(args.engines, data, args, stack, tables, skipped)
        for number in numbers:
            row = bench_query(number, engines, args.repeat)
            rows.append(row)
            parts = [f"{n} {fmt(r.median_s)} s{'' if r.ok else ' (' + str(r.error) + ')'}"
                     for n, r in row.runs.items()]  # fmt: skip
            print(f"{row.query}: " + ", ".join(parts), file=sys.stderr)
        # Read before anything stops: VmHWM vanishes with the process.
        for name, engine in engines.items():
            kb, procs = engine.peak_rss_kb()
            memory[name] = {"peak_rss_kb": kb, "processes": procs}
    return rows, list(engines), memory


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"generating or reusing TPC-H SF {args.scale:g} ...", file=sys.stderr)
    data = ensure_tpch(args.scale, args.cache_dir)
    tables = {name: data / f"{name}.parquet" for name in TPCH_TABLES}
    load = os.getloadavg()
    payload: dict[str, Any] = {
        "scale": args.scale,
        "executors": args.executors,
        "partitions": args.partitions,
        "partition_bytes": args.partition_bytes,
        "split_rows": args.split_rows,
        "split_bytes": args.split_bytes,
        "slots": args.slots,
        "flight_shuffle": args.flight_shuffle,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "load_at_start": load,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "skipped": {},
    }
    ok = True
    print(
        f"TPC-H SF {args.scale:g}, mangonel with {args.executors} executors and "
        f"{args.partitions or 'the default'} partitions per exchange at most, "
        f"median of {args.repeat} run(s); "
        f"{os.cpu_count()} CPUs, load {load[0]:.2f} at start\n"
    )
    if not args.no_tpch:
        layouts = ("generated", "random") if args.layout == "both" else (args.layout,)
        results: dict[str, dict[str, Any]] = {}
        for layout in layouts:
            source = (
                data if layout == "generated" else random_layout(data, args.cache_dir, args.scale)
            )
            files = {name: source / f"{name}.parquet" for name in TPCH_TABLES}
            if len(layouts) > 1:
                print(f"## Layout: {layout}\n")
            rows, engines, memory = run_tpch(args, source, files, payload["skipped"])
            for name, why in payload["skipped"].items():
                print(f"- {name}: skipped: {why}")
            print()
            print(markdown(rows, engines))
            print("\nPeak memory (RSS high-water mark of the engine's processes):\n")
            print(memory_markdown(memory))
            print()
            ok = ok and all(r.runs[e].ok for r in rows for e in engines)
            results[layout] = {
                "layout": layout,
                "engines": engines,
                "queries": [
                    {"query": r.query, "rows": r.rows}
                    | {
                        e: asdict(r.runs[e]) | {"median_s": r.runs[e].median_s, "ratio": r.ratio(e)}
                        for e in engines
                    }
                    for r in rows
                ],  # fmt: skip
                "totals_s": {e: totals(rows, e) for e in engines},
                "first_run_totals_s": {e: first_totals(rows, e) for e in engines},
                "memory": memory,
                "all_ok": all(r.runs[e].ok for r in rows for e in engines),
            }
        # One layout: its figures at the top level, as before; two: one entry each.
        payload |= results[layouts[0]] if len(layouts) == 1 else {"layouts": results}
    if args.latency:
        con = duckdb_over(tables)
        with mangonel_cluster(args, tables) as (session, _cluster):
            lat = micro.latency(session, con)
        print(f"\nLatency, end to end, {micro.LATENCY_RUNS} runs after "
              f"{micro.LATENCY_WARMUP} warm-up runs:\n")  # fmt: skip
        print(micro.latency_markdown(lat))
        payload["latency"] = lat
    if args.shuffle:
        shuffle = micro.shuffle(lambda: mangonel_cluster(args, tables, broadcast_bytes=0))
        print("\nShuffle throughput:\n")
        print(micro.shuffle_markdown(shuffle))
        payload["shuffle"] = shuffle
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
