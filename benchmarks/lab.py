"""TPC-H on the network lab: tables in the object store vs local files, side by side.

One ``NetCluster`` (``mangonel.testing.netcluster``): the scheduler, ``--executors``
executors, the client and an S3 server (moto's, ``testing.netstore``) each on a
host of its own, joined by the lab's switch. The TPC-H tables at ``--scale`` are
uploaded to the store and registered twice: from ``s3://tpch/<table>.parquet``
under their own names, and from the local Parquet files (which every host reads
at one path) as ``<table>_file``. Each query runs on both, interleaved (the
store, then the files, then the other way round: ``--repeat`` runs each), so both
meet the same machine load;
the SQL of the local run names the ``_file`` tables (sqlglot renames the table
references, nothing else). Reported per query: the median time of each as the
client host saw it (query sent to last byte read), and what the store served
the executors during the store's runs: bytes of GET bodies, counted at the
server per client address (the median over the runs, which agree but for
retries), and requests. The local runs are checked to fetch nothing from the
store. The first answer of each is compared with single-process DuckDB's.

Needs root (network namespaces), as the ``tests/multihost`` suite does.

Usage::

    sudo .venv/bin/python benchmarks/lab.py --scale 1 [--repeat 3] [--queries 1,6,9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

import sqlglot  # noqa: E402
from helpers import (  # noqa: E402  (the test helpers live outside the package)
    TPCH_ORDER_BY,
    TPCH_TABLES,
    compare_results,
    duckdb_over,
    ensure_tpch,
    tpch_query,
)

from mangonel.testing.netcluster import NetCluster  # noqa: E402
from mangonel.testing.netlab import NetLab  # noqa: E402
from mangonel.testing.netstore import ClientCounters  # noqa: E402

BUCKET = "tpch"
LOCAL_SUFFIX = "_file"


def on_local_files(sql: str) -> str:
    """``sql`` with every TPC-H table reference renamed to its ``_file`` twin."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    for table in tree.find_all(sqlglot.exp.Table):
        if table.name in TPCH_TABLES:
            table.set("this", sqlglot.exp.to_identifier(table.name + LOCAL_SUFFIX))
    return tree.sql(dialect="duckdb")


def fetched(cluster: NetCluster) -> dict[str, ClientCounters]:
    assert cluster.store is not None
    return cluster.store.counters(cluster.client.http_get)


def executors_delta(
    cluster: NetCluster, before: dict[str, ClientCounters], after: dict[str, ClientCounters]
) -> tuple[int, int]:
    """(bytes, requests) the store served the executor hosts between two readings."""
    zero = ClientCounters(0, 0)
    got = sent = 0
    for host in cluster.executor_hosts:
        a, b = after.get(host.address, zero), before.get(host.address, zero)
        got += a.get_bytes - b.get_bytes
        sent += a.requests - b.requests
    return got, sent


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each query on each (3)")
    parser.add_argument("--queries", default="1-22", help="e.g. 1,6,9 (default all 22)")
    parser.add_argument("--executors", type=int, default=2, help="executor hosts (2)")
    parser.add_argument("--slots", type=int, default=2, help="task slots per executor (2)")
    parser.add_argument("--work-dir", help="the lab's directory (default: a temporary one)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    problem = NetLab.unavailable()
    if problem:
        parser.error(f"the lab cannot run here: {problem}")
    if args.queries == "1-22":
        numbers = list(range(1, 23))
    else:
        numbers = [int(n) for n in args.queries.split(",")]
    data = ensure_tpch(args.scale)
    files = {t: data / f"{t}.parquet" for t in TPCH_TABLES}
    sizes = {t: p.stat().st_size for t, p in files.items()}
    reference = duckdb_over({t: str(p) for t, p in files.items()})

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mangonel-bench-lab-"))
    rows: list[dict[str, Any]] = []
    with NetCluster(work, executors=args.executors, slots=args.slots, object_store=True) as cluster:
        assert cluster.store is not None
        began = time.monotonic()
        cluster.store.upload({f"{t}.parquet": p for t, p in files.items()}, BUCKET)
        print(
            f"TPC-H SF {args.scale:g}: {sum(sizes.values()) / 1e6:.0f} MB uploaded to the "
            f"store in {time.monotonic() - began:.0f} s",
            flush=True,
        )
        before = fetched(cluster)
        for table in TPCH_TABLES:
            cluster.client.register_parquet(table, f"s3://{BUCKET}/{table}.parquet")
            cluster.client.register_parquet(table + LOCAL_SUFFIX, str(files[table]))
        footers = (
            fetched(cluster)[cluster.scheduler_host.address].get_bytes
            - before.get(cluster.scheduler_host.address, ClientCounters(0, 0)).get_bytes
        )
        for number in numbers:
            sql = tpch_query(number)
            expected = reference.sql(sql).to_arrow_table()
            runs: dict[str, list[float]] = {"store": [], "files": []}
            got: list[tuple[int, int]] = []
            local_fetches = 0
            checks: dict[str, str | None] = {}
            pair = [("store", sql), ("files", on_local_files(sql))]
            for rep in range(args.repeat):
                # Which goes first alternates: neither always meets the other's leftovers.
                for mode, text in pair if rep % 2 == 0 else pair[::-1]:
                    start = fetched(cluster)
                    answer = cluster.client.sql(text)
                    end = fetched(cluster)
                    runs[mode].append(answer.elapsed_s)
                    delta = executors_delta(cluster, start, end)
                    if mode == "store":
                        got.append(delta)
                    else:
                        local_fetches += delta[0]
                    if mode not in checks:
                        order_by = TPCH_ORDER_BY[number]
                        checks[mode] = compare_results(
                            answer.result.to_arrow(),
                            expected,
                            ordered=bool(order_by),
                            order_by=order_by,
                        )
            named = {x.name for x in _tables(sql)} & set(TPCH_TABLES)
            row = {
                "query": number,
                "store_s": statistics.median(runs["store"]),
                "files_s": statistics.median(runs["files"]),
                "fetched_bytes": int(statistics.median(b for b, _ in got)),
                "requests": int(statistics.median(r for _, r in got)),
                "tables_bytes": sum(sizes[t] for t in named),
                "local_fetched_bytes": local_fetches,
                "ok": all(c is None for c in checks.values()),
                "why": [c for c in checks.values() if c],
                "runs": runs,
            }
            rows.append(row)
            print(_row(row), flush=True)
            if not row["ok"]:
                print(f"  WRONG ANSWER: {row['why']}", flush=True)

    print()
    print(_table(rows, args, footers, sum(sizes.values())))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


def _tables(sql: str) -> list[Any]:
    return list(sqlglot.parse_one(sql, read="duckdb").find_all(sqlglot.exp.Table))


def _row(r: dict[str, Any]) -> str:
    return (
        f"| q{r['query']:02d} | {r['store_s']:.2f} s | {r['files_s']:.2f} s | "
        f"{r['store_s'] / r['files_s']:.2f} | {r['fetched_bytes'] / 1e6:.1f} MB | "
        f"{r['requests']} | {r['tables_bytes'] / 1e6:.1f} MB | "
        f"{r['fetched_bytes'] / r['tables_bytes']:.0%} | {'ok' if r['ok'] else 'WRONG'} |"
    )


def _table(rows: list[dict[str, Any]], args: argparse.Namespace, footers: int, size: int) -> str:
    lines = [
        f"| query | from the store (median of {args.repeat}) | from local files | store/files "
        "| fetched from the store | requests | size of the tables it reads | fetched/size "
        "| answer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [_row(r) for r in rows]
    store = sum(r["store_s"] for r in rows)
    files = sum(r["files_s"] for r in rows)
    got = sum(r["fetched_bytes"] for r in rows)
    read = sum(r["tables_bytes"] for r in rows)
    lines.append(
        f"| total | {store:.2f} s | {files:.2f} s | {store / files:.2f} | {got / 1e6:.0f} MB | "
        f"{sum(r['requests'] for r in rows)} | {read / 1e6:.0f} MB | {got / read:.0%} | |"
    )
    local = sum(r["local_fetched_bytes"] for r in rows)
    lines.append(
        f"\nRegistering the 8 tables fetched {footers / 1e3:.0f} kB of footers from the store "
        f"({footers / size:.2%} of {size / 1e6:.0f} MB). The local-file runs fetched "
        f"{local} B from the store."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
