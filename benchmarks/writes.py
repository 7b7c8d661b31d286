"""Writing data, measured: mangonel's COPY TO / CREATE TABLE AS vs DuckDB's own, side by side.

On one ``LocalCluster`` (``--executors``, default 2) over TPC-H at ``--scale``,
each statement runs on mangonel and on single-process DuckDB (in a fresh
in-memory database over the same Parquet files, all its threads), alternately,
``--repeat`` times; the medians and their ratio are printed. Every mangonel
output is read back through its manifest and compared with DuckDB's (row count
and a checksum of a few columns), so a fast wrong answer cannot pass.

Statements:

* ``copy_lineitem``: ``COPY lineitem TO dir (FORMAT parquet)``;
* ``ctas_join``: ``CREATE TABLE AS`` lineitem ⋈ orders, every column of both;
* ``ctas_q1``: ``CREATE TABLE AS`` TPC-H q1's aggregate (a small output).

Also printed: how many tasks wrote, on how many executors (the write spreads
over the cluster). Not a test: timings belong here. Usage::

    .venv/bin/python benchmarks/writes.py --scale 1 [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import duckdb

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import TPCH_TABLES, ensure_tpch  # noqa: E402  (the test helpers)

STATEMENTS: dict[str, tuple[str, str]] = {
    # name -> (the query written, the columns checked)
    "copy_lineitem": ("SELECT * FROM lineitem", "l_orderkey, l_linenumber, l_extendedprice"),
    "ctas_join": (
        "SELECT * FROM lineitem JOIN orders ON l_orderkey = o_orderkey",
        "l_orderkey, l_linenumber, o_totalprice",
    ),
    "ctas_q1": (
        "SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, "
        "sum(l_extendedprice) AS sum_base_price, avg(l_discount) AS avg_disc, "
        "count(*) AS count_order FROM lineitem WHERE l_shipdate <= DATE '1998-09-02' "
        "GROUP BY l_returnflag, l_linestatus",
        "count_order, sum_qty, sum_qty",
    ),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per statement (default 3)")
    parser.add_argument("--executors", type=int, default=2, help="executors (default 2)")
    parser.add_argument("--statement", action="append", choices=sorted(STATEMENTS))
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON here")
    return parser.parse_args(argv)


def checksum(files: list[str], columns: str) -> tuple[int, float]:
    con = duckdb.connect()
    row = con.execute(
        f"SELECT count(*), sum(hash({columns}) % 1000003)::DOUBLE FROM read_parquet({files!r})"
    ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


def committed_files(location: Path) -> list[str]:
    doc = json.loads((location / "_mangonel_manifest.json").read_text())
    return [str(location / f) for f in doc["files"]]


def run_duckdb(data: Path, query: str, target: Path) -> float:
    con = duckdb.connect()
    for t in TPCH_TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{data / (t + '.parquet')}')")
    started = time.perf_counter()
    con.execute(f"COPY ({query}) TO '{target}' (FORMAT parquet)")
    took = time.perf_counter() - started
    con.close()
    return took


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import mangonel

    data = ensure_tpch(args.scale)
    work = Path(tempfile.mkdtemp(prefix="mangonel-writes-"))
    out = work / "out"
    out.mkdir()
    names = args.statement or list(STATEMENTS)
    results: dict[str, Any] = {"scale": args.scale, "executors": args.executors, "runs": {}}
    try:
        with mangonel.LocalCluster(
            executors=args.executors,
            work_dir=str(work / "cluster"),
            web_port=0,
            scheduler_args=("--write-root", str(out), "--warehouse", str(work / "warehouse")),
        ) as cluster:
            session = cluster.connect()
            for t in TPCH_TABLES:
                session.register_parquet(t, str(data / f"{t}.parquet"))
            print(f"TPC-H SF{args.scale:g}, {args.executors} executors, median of {args.repeat}")
            print(f"{'statement':<15} {'mangonel s':>11} {'duckdb s':>9} {'ratio':>6}  writers")
            for name in names:
                query, columns = STATEMENTS[name]
                ours: list[float] = []
                theirs: list[float] = []
                spread = ""
                for i in range(args.repeat):
                    ref = work / f"ref-{name}-{i}.parquet"
                    theirs.append(run_duckdb(data, query, ref))
                    if name.startswith("copy"):
                        target = out / f"{name}-{i}"
                        sql = f"COPY ({query}) TO '{target}' (FORMAT parquet)"
                    else:
                        target = work / "warehouse" / f"{name}_{i}"
                        sql = f"CREATE TABLE {name}_{i} AS {query}"
                    started = time.perf_counter()
                    result = session.sql(sql)
                    ours.append(time.perf_counter() - started)
                    files = committed_files(target)
                    if checksum(files, columns) != checksum([str(ref)], columns):
                        raise SystemExit(f"{name}: mangonel's output differs from DuckDB's")
                    with urllib.request.urlopen(
                        f"{cluster.web_url}/api/jobs/{result.job_id}", timeout=10
                    ) as answer:
                        job = json.load(answer)
                    writing = job["stages"][-2]["id"]
                    done = [
                        a
                        for a in job["attempts"]
                        if a["stage"] == writing and a["state"] == "succeeded"
                    ]
                    spread = (
                        f"{len(done)} tasks on {len({a['executor'] for a in done})} executors, "
                        f"{len(files)} files"
                    )
                    if not name.startswith("copy"):
                        session.sql(f"DROP TABLE {name}_{i}")
                    else:
                        shutil.rmtree(target)
                    os.remove(ref)
                m, d = statistics.median(ours), statistics.median(theirs)
                print(f"{name:<15} {m:>11.2f} {d:>9.2f} {m / d:>6.2f}  {spread}")
                results["runs"][name] = {
                    "mangonel_s": ours,
                    "duckdb_s": theirs,
                    "ratio": m / d,
                    "writers": spread,
                }
            session.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
