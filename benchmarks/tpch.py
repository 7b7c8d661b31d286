"""TPC-H side by side: mangonel (a LocalCluster) against single-process DuckDB.

Generates TPC-H at ``--scale`` with ``tpchgen-cli`` into a cache directory (reused
by later runs), then runs each of the 22 queries on DuckDB and on mangonel, one
after the other per query (so both see the same page cache), ``--repeat`` times,
and reports the median of each. Every mangonel answer is checked against DuckDB's
with the test suite's comparator. Not a test: timings belong here, not in asserts.

Usage::

    .venv/bin/python benchmarks/tpch.py --scale 1 --repeat 3 --json bench.json

Prints a markdown table (query, duckdb s, mangonel s, ratio, rows, ok) with totals.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import (  # noqa: E402  (the test helpers live outside the package)
    CACHE_DIR,
    TPCH_ORDER_BY,
    TPCH_TABLES,
    compare_results,
    duckdb_views_sql,
    ensure_tpch,
    tpch_query,
)


@dataclass
class Row:
    query: str
    duckdb_s: float
    mangonel_s: float | None
    rows: int
    ok: bool
    stages: int | None
    error: str | None

    @property
    def ratio(self) -> float | None:
        if self.mangonel_s is None or self.duckdb_s <= 0:
            return None
        return self.mangonel_s / self.duckdb_s


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per query; the median counts")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--executors", type=int, default=2, help="mangonel executor processes")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per exchange")
    parser.add_argument(
        "--queries", default="1-22", help="which queries, e.g. '1,3,5' or '1-22' (default all)"
    )
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="where data is cached")
    parser.add_argument("--work-dir", type=Path, help="cluster work dir (default: temp)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
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


def run_duckdb(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[float, Any]:
    start = time.perf_counter()
    table = con.sql(sql).to_arrow_table()
    return time.perf_counter() - start, table


def run_mangonel(session: Any, sql: str) -> tuple[float, Any]:
    start = time.perf_counter()
    result = session.sql(sql)
    return time.perf_counter() - start, result


def bench_query(number: int, con: duckdb.DuckDBPyConnection, session: Any, repeat: int) -> Row:
    sql = tpch_query(number)
    duck_times: list[float] = []
    mangonel_times: list[float] = []
    expected = actual = result = None
    error: str | None = None
    for _ in range(repeat):
        elapsed, expected = run_duckdb(con, sql)
        duck_times.append(elapsed)
        try:
            elapsed, result = run_mangonel(session, sql)
            actual = result.to_arrow()
            mangonel_times.append(elapsed)
        except Exception as exc:  # a failed query is a row of the report, not the end of it
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            traceback.print_exc(file=sys.stderr)
            break
    ok = False
    if error is None and actual is not None and expected is not None:
        order_by = TPCH_ORDER_BY[number]
        mismatch = compare_results(actual, expected, ordered=bool(order_by), order_by=order_by)
        ok = mismatch is None
        if mismatch is not None:
            error = "wrong answer: " + mismatch.splitlines()[0]
            print(f"q{number:02d}: {mismatch}", file=sys.stderr)
    return Row(
        query=f"q{number:02d}",
        duckdb_s=statistics.median(duck_times),
        mangonel_s=statistics.median(mangonel_times) if mangonel_times else None,
        rows=expected.num_rows if expected is not None else 0,
        ok=ok,
        stages=len(result.stages) if result is not None else None,
        error=error,
    )


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(rows: list[Row]) -> str:
    lines = [
        "| query | duckdb s | mangonel s | ratio | rows | ok |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.query} | {fmt(r.duckdb_s)} | {fmt(r.mangonel_s)} | {fmt(r.ratio, 1)} "
            f"| {r.rows} | {'yes' if r.ok else 'NO'} |"
        )
    duck_total = sum(r.duckdb_s for r in rows)
    done = [r.mangonel_s for r in rows if r.mangonel_s is not None]
    mangonel_total = sum(done) if len(done) == len(rows) else None
    ratio = mangonel_total / duck_total if mangonel_total is not None and duck_total else None
    passed = sum(r.ok for r in rows)
    lines.append(
        f"| **total** | {fmt(duck_total)} | {fmt(mangonel_total)} | {fmt(ratio, 1)} "
        f"| {sum(r.rows for r in rows)} | {passed}/{len(rows)} |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    numbers = parse_queries(args.queries)
    import mangonel

    print(f"generating or reusing TPC-H SF {args.scale:g} ...", file=sys.stderr)
    data = ensure_tpch(args.scale, args.cache_dir)
    tables = {name: data / f"{name}.parquet" for name in TPCH_TABLES}

    con = duckdb.connect()
    for statement in duckdb_views_sql(dict(tables)):
        con.execute(statement)

    own_work_dir = args.work_dir is None
    work_root = args.work_dir or Path(tempfile.mkdtemp(prefix="mangonel-bench-"))
    rows: list[Row] = []
    with mangonel.LocalCluster(
        executors=args.executors, work_dir=str(work_root), partitions=args.partitions
    ) as cluster:
        session = cluster.connect()
        for name, path in tables.items():
            session.register_parquet(name, str(path))
        for number in numbers:
            row = bench_query(number, con, session, args.repeat)
            rows.append(row)
            print(
                f"{row.query}: duckdb {fmt(row.duckdb_s)} s, mangonel {fmt(row.mangonel_s)} s, "
                f"{'ok' if row.ok else row.error}",
                file=sys.stderr,
            )
        close = getattr(session, "close", None)
        if close is not None:
            close()

    if own_work_dir and all(r.ok for r in rows):
        shutil.rmtree(work_root, ignore_errors=True)
    elif own_work_dir:
        print(f"cluster work directory (logs) kept at {work_root}", file=sys.stderr)

    print(
        f"TPC-H SF {args.scale:g}, mangonel with {args.executors} executors and "
        f"{args.partitions} partitions per exchange, median of {args.repeat} run(s)\n"
    )
    print(markdown(rows))
    if args.json is not None:
        payload = {
            "scale": args.scale,
            "executors": args.executors,
            "partitions": args.partitions,
            "repeat": args.repeat,
            "queries": [asdict(r) | {"ratio": r.ratio} for r in rows],
            "duckdb_total_s": sum(r.duckdb_s for r in rows),
            "mangonel_total_s": (
                sum(r.mangonel_s for r in rows if r.mangonel_s is not None)
                if all(r.mangonel_s is not None for r in rows)
                else None
            ),
            "all_ok": all(r.ok for r in rows),
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
