"""CSV and JSON tables: mangonel over text against mangonel over Parquet and DuckDB over text.

Writes TPC-H ``lineitem`` and ``orders`` at ``--scale`` as CSV and as
newline-delimited JSON (DuckDB's ``COPY``, into ``.cache/tpch-sf<scale>-text``,
reused by later runs), then runs each query, interleaved (query 1 on every engine,
``--repeat`` times, then query 2, ...), on:

- ``duckdb-csv`` / ``duckdb-json``: one DuckDB process (this one) with views over the
  text files (``read_csv`` / ``read_json``, its own sniffing);
- ``mangonel-parquet``: a ``LocalCluster`` (``--executors``) over the Parquet files;
- ``mangonel-csv`` / ``mangonel-json``: the same cluster over the text tables, split
  at line boundaries into tasks (``split_size`` default).

Reports the median wall time of each, and the ratios of mangonel over text to
mangonel over Parquet and to DuckDB over the same text. Every answer is checked
against DuckDB's over the same files. Not a test: timings belong here.

Usage::

    .venv/bin/python benchmarks/textscan.py [--scale 1] [--repeat 3] [--queries 1,6,12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

import duckdb  # noqa: E402
import pyarrow as pa  # noqa: E402
from helpers import CACHE_DIR, TPCH_ORDER_BY, compare_results, ensure_tpch, tpch_query  # noqa: E402

TABLES = ("lineitem", "orders")


def text_files(scale: float, parquet: Path) -> Path:
    out = CACHE_DIR / f"tpch-sf{scale:g}-text"
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    for name in TABLES:
        for fmt, suffix in (("csv, HEADER", "csv"), ("json", "json")):
            target = out / f"{name}.{suffix}"
            if not target.exists():
                tmp = out / f".{name}.{suffix}.tmp"
                con.execute(
                    f"COPY (SELECT * FROM read_parquet('{parquet / name}.parquet')) "
                    f"TO '{tmp}' (FORMAT {fmt})"
                )
                tmp.rename(target)
    con.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--queries", default="1,6,12")
    args = parser.parse_args()
    import mangonel

    parquet = ensure_tpch(args.scale)
    text = text_files(args.scale, parquet)
    ref = duckdb.connect()
    for name in TABLES:
        ref.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{parquet / name}.parquet')")
    duck: dict[str, duckdb.DuckDBPyConnection] = {}
    for suffix, reader in (("csv", "read_csv"), ("json", "read_json")):
        con = duckdb.connect()
        for name in TABLES:
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM {reader}('{text / name}.{suffix}')")
        duck[suffix] = con
    queries = [int(q) for q in args.queries.split(",")]
    timings: dict[tuple[int, str], list[float]] = {}
    with mangonel.LocalCluster(executors=args.executors) as cluster, cluster.connect() as s:
        for name in TABLES:
            s.register(name, str(parquet / f"{name}.parquet"))
            s.register(f"{name}_csv", str(text / f"{name}.csv"), "csv")
            s.register(f"{name}_json", str(text / f"{name}.json"), "json")

        def on(suffix: str) -> Callable[[str], str]:
            def rename(sql: str) -> str:
                for name in TABLES:
                    sql = sql.replace(f" {name}", f" {name}_{suffix}").replace(
                        f",{name}", f",{name}_{suffix}"
                    )
                return sql

            return rename

        engines: dict[str, Callable[[str], pa.Table]] = {
            "duckdb-csv": lambda sql: duck["csv"].sql(sql).to_arrow_table(),
            "duckdb-json": lambda sql: duck["json"].sql(sql).to_arrow_table(),
            "mangonel-parquet": lambda sql: s.sql(sql).to_arrow(),
            "mangonel-csv": lambda sql: s.sql(on("csv")(sql)).to_arrow(),
            "mangonel-json": lambda sql: s.sql(on("json")(sql)).to_arrow(),
        }
        for q in queries:
            sql = tpch_query(q)
            # Text columns are typed as DuckDB sniffs them (decimals read as DOUBLE):
            # an engine's answer over text is checked against DuckDB's over that text.
            expected_of = {
                "parquet": ref.sql(sql).to_arrow_table(),
                "csv": duck["csv"].sql(sql).to_arrow_table(),
                "json": duck["json"].sql(sql).to_arrow_table(),
            }
            for _ in range(args.repeat):
                for engine, run in engines.items():
                    start = time.perf_counter()
                    got = run(sql)
                    timings.setdefault((q, engine), []).append(time.perf_counter() - start)
                    expected = expected_of[engine.rpartition("-")[2]]
                    problem = compare_results(
                        got, expected, ordered=True, order_by=TPCH_ORDER_BY[q], check_names=False
                    )
                    if problem:
                        print(f"q{q:02d} {engine}: WRONG ANSWER\n{problem}", file=sys.stderr)
                        return 1
    names = list(engines)
    print(f"TPC-H SF{args.scale:g}, {args.executors} executors, median of {args.repeat} (s)")
    print("query " + " ".join(f"{n:>16}" for n in names) + "  csv/parquet  csv/duckdb  json/duckdb")
    for q in queries:
        m = {n: statistics.median(timings[(q, n)]) for n in names}
        print(
            f"q{q:02d}   "
            + " ".join(f"{m[n]:16.2f}" for n in names)
            + f"  {m['mangonel-csv'] / m['mangonel-parquet']:11.2f}"
            + f"  {m['mangonel-csv'] / m['duckdb-csv']:10.2f}"
            + f"  {m['mangonel-json'] / m['duckdb-json']:11.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
