"""Flight SQL against the Python client, and a big result read from the executors or the scheduler.

Two measurements, on ``LocalCluster``s of ``--executors`` executors (every answer is
checked against single-process DuckDB with the test suite's comparator):

1. The TPC-H queries at ``--scale``, each fetched whole by the Python client
   (``session.sql(q).to_arrow()``) and by the ADBC Flight SQL driver
   (``cursor.execute(q)`` + ``fetch_arrow_table()``) over one connection each,
   interleaved per query (one untimed warm-up each, then ``--repeat`` rounds, each
   client first in turn), median of each and their ratio.
2. A result of ``--rows`` rows (a generated table of four columns, scanned in
   ``--partitions`` tasks, so the result has that many partitions spread over the
   executors) fetched through ADBC from a cluster whose Flight SQL endpoint sends
   clients to the executors (``--flight-sql-results executors``: the driver reads
   the partitions in parallel, each from its executor) and from one that serves
   them through the scheduler (``--flight-sql-results scheduler``); the Python
   client reads the same result for reference. The fetch alone is timed too: one
   ``FlightInfo`` (the job done), then its endpoints read by a plain Flight client,
   one thread per endpoint, from the executors or all through the scheduler.

Usage::

    .venv/bin/python benchmarks/flightsql.py --scale 1 --json flightsql.json

Prints markdown tables and, with ``--json``, writes the same as JSON. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

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

import mangonel  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--queries", default="1-22", help="e.g. 1-22 or 1,3,9")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--partitions", type=int, default=4, help="result partitions of the big result")
    p.add_argument("--big-repeat", type=int, default=3)
    p.add_argument("--no-tpch", action="store_true", help="only the big result")
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def _queries(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def _timed(fn: Callable[[], pa.Table]) -> tuple[float, pa.Table]:
    start = time.perf_counter()
    table = fn()
    return time.perf_counter() - start, table


def _adbc(url: str) -> Any:
    import adbc_driver_flightsql.dbapi

    return adbc_driver_flightsql.dbapi.connect(url, autocommit=True)


def _adbc_fetch(conn: Any, sql: str) -> pa.Table:
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def tpch(args: argparse.Namespace, data: Path, work: Path) -> list[dict[str, Any]]:
    tables = {t: data / f"{t}.parquet" for t in TPCH_TABLES}
    reference = duckdb_over(tables)
    rows: list[dict[str, Any]] = []
    cluster = mangonel.LocalCluster(executors=args.executors, work_dir=str(work / "tpch"))
    with cluster, cluster.connect() as session, _adbc(cluster.flight_sql_url) as conn:
        for name, path in tables.items():
            session.register_parquet(name, str(path))
        for number in _queries(args.queries):
            sql = tpch_query(number)
            expected = reference.sql(sql).to_arrow_table()
            order_by = TPCH_ORDER_BY[number]
            times: dict[str, list[float]] = {"python": [], "adbc": []}
            ok = True
            fetchers = [
                ("python", lambda sql=sql: session.sql(sql).to_arrow()),
                ("adbc", lambda sql=sql: _adbc_fetch(conn, sql)),
            ]
            for _, fetch in fetchers:  # warm-up, untimed: planned once, files cached
                fetch()
            for run in range(args.repeat):
                # Each goes first in turn, so neither always follows the other.
                for name, fetch in fetchers if run % 2 == 0 else fetchers[::-1]:
                    elapsed, table = _timed(fetch)
                    times[name].append(elapsed)
                    why = compare_results(
                        table, expected, ordered=bool(order_by), order_by=order_by
                    )
                    if why is not None:
                        ok = False
                        print(f"q{number:02d} {name}: WRONG ANSWER: {why}", file=sys.stderr)
            python = statistics.median(times["python"])
            adbc = statistics.median(times["adbc"])
            rows.append(
                {
                    "query": f"q{number:02d}",
                    "rows": expected.num_rows,
                    "python_s": python,
                    "adbc_s": adbc,
                    "ratio": adbc / python,
                    "ok": ok,
                }
            )
            print(
                f"q{number:02d} python {python:.3f} s  adbc {adbc:.3f} s  "
                f"x{adbc / python:.2f} {'ok' if ok else 'WRONG'}",
                flush=True,
            )
    reference.close()
    return rows


def big_table(path: Path, rows: int) -> pa.Table:
    rng = np.random.default_rng(7)
    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "k": pa.array(rng.integers(0, 1_000_000, rows, dtype=np.int32)),
            "v": pa.array(rng.random(rows)),
            "d": pa.array(rng.integers(0, 20_000, rows, dtype=np.int32)).cast(pa.date32()),
        }
    )
    pq.write_table(table, path, row_group_size=max(1, rows // 16))
    return table


def big_result(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    path = work / "big.parquet"
    expected = big_table(path, args.rows)
    sql = "SELECT id, k, v, d FROM big"
    split = -(-args.rows // args.partitions)
    out: list[dict[str, Any]] = []
    for mode in ("executors", "scheduler"):
        with (
            mangonel.LocalCluster(
                executors=args.executors,
                work_dir=str(work / f"big-{mode}"),
                flight_sql_results=mode,
                scheduler_args=("--split-rows", str(split)),
            ) as cluster,
            cluster.connect() as session,
            _adbc(cluster.flight_sql_url) as conn,
        ):
            session.register_parquet("big", str(path))
            fetchers: list[tuple[str, Callable[[], pa.Table]]] = [
                (f"adbc, results from {mode}", lambda: _adbc_fetch(conn, sql))
            ]
            if mode == "executors":
                fetchers.append(("python client (reference)", lambda: session.sql(sql).to_arrow()))
            for what, fetch in fetchers:
                fetch()  # warm-up, untimed: channels opened, file cached
                times = []
                for _ in range(args.big_repeat):
                    elapsed, table = _timed(fetch)
                    times.append(elapsed)
                    # Row by row in Python would take minutes: Arrow's own equality.
                    if not table.sort_by("id").cast(expected.schema).equals(expected):
                        print(f"{what}: WRONG ANSWER", file=sys.stderr)
                    del table
                median = statistics.median(times)
                out.append(
                    {
                        "fetch": what,
                        "rows": args.rows,
                        "partitions": args.partitions,
                        "median_s": median,
                        "runs_s": times,
                        "mrows_per_s": args.rows / median / 1e6,
                    }
                )
                print(f"{what}: {median:.3f} s ({args.rows / median / 1e6:.1f} M rows/s)")
            if mode == "executors":
                out += fetch_only(args, cluster.flight_sql_url, sql, expected)
    return out


def _read_parallel(info: Any, where: Callable[[Any], str]) -> pa.Table:
    """Every endpoint of ``info`` read at ``where(endpoint)``, one thread per endpoint."""
    import pyarrow.flight as flight

    def read(endpoint: Any) -> pa.Table:
        with flight.connect(where(endpoint)) as client:
            return client.do_get(endpoint.ticket).read_all()

    with ThreadPoolExecutor(len(info.endpoints)) as pool:
        return pa.concat_tables(pool.map(read, info.endpoints))


def fetch_only(
    args: argparse.Namespace, url: str, sql: str, expected: pa.Table
) -> list[dict[str, Any]]:
    import pyarrow.flight as flight
    from google.protobuf import any_pb2

    from mangonel.proto import flightsql_pb2 as sql_pb

    packed = any_pb2.Any()
    packed.Pack(sql_pb.CommandStatementQuery(query=sql), type_url_prefix="type.googleapis.com/")
    with flight.connect(url) as client:
        command = flight.FlightDescriptor.for_command(packed.SerializeToString())
        info = client.get_flight_info(command)
    out = []
    for what, where in (
        ("fetch only: from the executors", lambda e: e.locations[0].uri.decode()),
        ("fetch only: through the scheduler", lambda e: url),
    ):
        _read_parallel(info, where)  # warm-up
        times = []
        for _ in range(args.big_repeat):
            elapsed, table = _timed(lambda where=where: _read_parallel(info, where))
            times.append(elapsed)
            if not table.sort_by("id").cast(expected.schema).equals(expected):
                print(f"{what}: WRONG ANSWER", file=sys.stderr)
        median = statistics.median(times)
        out.append(
            {
                "fetch": what,
                "rows": args.rows,
                "partitions": len(info.endpoints),
                "median_s": median,
                "runs_s": times,
                "mrows_per_s": args.rows / median / 1e6,
            }
        )
        print(f"{what}: {median:.3f} s ({args.rows / median / 1e6:.1f} M rows/s)")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    print(f"load at start {load:.2f}", flush=True)
    data = ensure_tpch(args.scale)
    with tempfile.TemporaryDirectory(prefix="mangonel-bench-fsql-") as tmp:
        work = Path(tmp)
        queries = [] if args.no_tpch else tpch(args, data, work)
        big = big_result(args, work)
    total_py = sum(r["python_s"] for r in queries) or 1.0
    total_adbc = sum(r["adbc_s"] for r in queries)
    print("\n| query | rows | python client s | ADBC Flight SQL s | × | ok |")
    print("|---|---:|---:|---:|---:|---|")
    for r in queries:
        print(
            f"| {r['query']} | {r['rows']} | {r['python_s']:.3f} | {r['adbc_s']:.3f} | "
            f"{r['ratio']:.2f} | {'ok' if r['ok'] else 'WRONG'} |"
        )
    print(f"| total | | {total_py:.3f} | {total_adbc:.3f} | {total_adbc / total_py:.2f} | |")
    print("\n| fetch | rows | partitions | median s | M rows/s |")
    print("|---|---:|---:|---:|---:|")
    for r in big:
        print(
            f"| {r['fetch']} | {r['rows']} | {r['partitions']} | {r['median_s']:.3f} | "
            f"{r['mrows_per_s']:.1f} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"scale": args.scale, "load_at_start": load, "tpch": queries, "big": big}, indent=1
            )
        )
    return 0 if all(r["ok"] for r in queries) else 1


if __name__ == "__main__":
    raise SystemExit(main())
