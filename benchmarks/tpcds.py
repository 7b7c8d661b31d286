"""TPC-DS side by side: mangonel and single-process DuckDB, the 99 queries.

Generates TPC-DS at ``--scale`` with DuckDB's ``tpcds`` extension into the cache
(``tests/helpers.ensure_tpcds``: a virtualenv of its own holds the generator),
starts a ``LocalCluster`` (``--executors``, 2 by default) and runs each query
first on DuckDB, then on mangonel, ``--repeat`` times, interleaved query by query
so both see the same page cache. Reports per query the first run (an ad-hoc
query's time: mangonel plans it then) and the median of the runs, and the
totals of both; every mangonel answer is checked against DuckDB's with the test
suite's comparator (ORDER BY columns in order, ties as multisets). Not a test:
timings belong here, not in asserts.

Usage::

    .venv/bin/python benchmarks/tpcds.py --scale 1 --repeat 3 --json tpcds.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import (  # noqa: E402  (the test helpers live outside the package)
    TPCDS_TABLES,
    compare_results,
    duckdb_over,
    ensure_tpcds,
    order_by_outputs,
    tpcds_query,
)


@dataclass
class Row:
    query: int
    duckdb_s: list[float] = field(default_factory=list)
    mangonel_s: list[float] = field(default_factory=list)
    ok: bool = True
    error: str = ""

    def ratio(self, first: bool) -> float | None:
        if not self.duckdb_s or not self.mangonel_s:
            return None
        pick = (lambda xs: xs[0]) if first else statistics.median
        return pick(self.mangonel_s) / max(pick(self.duckdb_s), 1e-6)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-DS scale factor (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per query (default 3)")
    parser.add_argument("--executors", type=int, default=2, help="mangonel executors (default 2)")
    parser.add_argument("--queries", default="1-99", help="e.g. 1-99 or 3,72,95")
    parser.add_argument("--timeout", type=float, default=300.0, help="per query, seconds")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--log-dir",
        type=Path,
        help="keep the cluster's logs (scheduler.log, executor-N.log) here, to find "
        "where a slow run's time went (default: discarded with the cluster)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        help="every exchange gets exactly this many partitions (--partition-bytes 0); "
        "default: the scheduler's, sized from the estimates",
    )
    parser.add_argument(
        "--partition-bytes",
        type=int,
        help="one partition of an exchange per this many estimated bytes (the "
        "scheduler's --partition-bytes; default: its own)",
    )
    parser.add_argument(
        "--adaptive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the scheduler's adaptive execution (coalesced reader stages); "
        "--no-adaptive runs every stage with its planned task count (default: on)",
    )
    return parser.parse_args(argv)


def parse_queries(spec: str) -> list[int]:
    numbers: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        numbers.extend(range(int(lo), int(hi or lo) + 1))
    return numbers


def bench(
    number: int, session: Any, ref: duckdb.DuckDBPyConnection, repeat: int, timeout: float
) -> Row:
    sql = tpcds_query(number)
    row = Row(number)
    for _ in range(repeat):
        start = time.perf_counter()
        expected = ref.sql(sql).to_arrow_table()
        row.duckdb_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        try:
            actual = session.sql(sql, timeout_s=timeout).to_arrow()
        except Exception as exc:  # noqa: BLE001 - a failed query is a result here
            row.ok, row.error = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return row
        row.mangonel_s.append(time.perf_counter() - start)
        order_by = order_by_outputs(sql, expected.column_names)
        why = compare_results(actual, expected, ordered=bool(order_by), order_by=order_by or ())
        if why is not None:
            row.ok, row.error = False, why.splitlines()[0][:200]
            return row
    return row


def markdown(rows: list[Row]) -> str:
    lines = [
        "| query | duckdb first s | mangonel first s | × first | duckdb median s "
        "| mangonel median s | × median | ok |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if not r.mangonel_s:
            lines.append(f"| q{r.query:02d} | | | | | | | {r.error} |")
            continue
        lines.append(
            f"| q{r.query:02d} | {r.duckdb_s[0]:.3f} | {r.mangonel_s[0]:.3f} | "
            f"{r.ratio(True):.2f} | {statistics.median(r.duckdb_s):.3f} | "
            f"{statistics.median(r.mangonel_s):.3f} | {r.ratio(False):.2f} | "
            f"{'ok' if r.ok else r.error} |"
        )
    done = [r for r in rows if r.mangonel_s]
    d0, m0 = sum(r.duckdb_s[0] for r in done), sum(r.mangonel_s[0] for r in done)
    d1 = sum(statistics.median(r.duckdb_s) for r in done)
    m1 = sum(statistics.median(r.mangonel_s) for r in done)
    lines.append(
        f"| **total** ({len(done)}) | **{d0:.2f}** | **{m0:.2f}** | **{m0 / d0:.2f}** "
        f"| **{d1:.2f}** | **{m1:.2f}** | **{m1 / d1:.2f}** | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import mangonel

    data = ensure_tpcds(args.scale)
    tables = {name: data / f"{name}.parquet" for name in TPCDS_TABLES}
    ref = duckdb_over(tables)
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="mangonel-tpcds-") as work,
        mangonel.LocalCluster(
            executors=args.executors,
            work_dir=work,
            partitions=args.partitions,
            partition_bytes=args.partition_bytes,
            adaptive=args.adaptive,
            log_dir=str(args.log_dir) if args.log_dir else None,
        ) as cluster,
        cluster.connect() as session,
    ):
        for name, path in tables.items():
            session.register_parquet(name, str(path))
        for number in parse_queries(args.queries):
            row = bench(number, session, ref, args.repeat, args.timeout)
            rows.append(row)
            status = "ok" if row.ok else row.error
            print(f"{time.strftime('%H:%M:%S')} q{number:02d} duckdb {row.duckdb_s[:1]} "
                  f"mangonel {row.mangonel_s[:1]} {status}",
                  file=sys.stderr, flush=True)  # fmt: skip
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"scale": args.scale, "rows": [asdict(r) for r in rows]}))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
