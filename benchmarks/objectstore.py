"""Tables in object storage: the I/O path, and the bytes each TPC-H query fetches.

Serves TPC-H from a real S3 server (moto's, in this process: ``tests/objectstore/
s3server.py``, which logs every request with its Range header and the bytes it
sent back) and measures two things:

1. **The I/O path.** The same scans read two ways from the same server:
   pyarrow's ``S3FileSystem`` under ``mangonel.storage`` (the footer, then the
   needed column chunks of the needed row groups, fed to DuckDB as an Arrow
   stream: what an executor does), and DuckDB's own Parquet reader going through
   an fsspec filesystem registered with DuckDB (``register_filesystem``; the
   fsspec filesystem is pyarrow's S3 client again, so only the path differs).
   Median wall time of ``--repeat`` runs (5), bytes and requests the server saw
   (of the last run), and how many runs failed.
2. **Bytes fetched per query.** The 22 TPC-H queries on a 2-executor
   ``LocalCluster`` reading from the store: bytes of object data the server sent
   back (ranged GETs) per query, against the size of the tables it names.

Usage::

    .venv/bin/python benchmarks/objectstore.py [--scale 0.1] [--skip-path] [--skip-queries]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "objectstore"))

import duckdb  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from helpers import TPCH_TABLES, ensure_tpch, tpch_query  # noqa: E402
from s3server import S3TestServer  # noqa: E402

from mangonel import storage  # noqa: E402

BUCKET = "tpch"
NO_EXTENSIONS: dict[str, Any] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}

# (name, table, columns, filter) scans for the I/O path comparison.
SCANS = [
    ("q6 columns of lineitem", "lineitem",
     ["l_shipdate", "l_discount", "l_quantity", "l_extendedprice"], None),
    ("q1 columns of lineitem", "lineitem",
     ["l_returnflag", "l_linestatus", "l_quantity", "l_extendedprice", "l_discount", "l_tax",
      "l_shipdate"], None),
    ("all of orders", "orders", None, None),
]  # fmt: skip


def upload(server: S3TestServer, data: Path, prefix: str) -> dict[str, str]:
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    locations = {}
    for table in TPCH_TABLES:
        client.upload_file(str(data / f"{table}.parquet"), BUCKET, f"{prefix}/{table}.parquet")
        locations[table] = f"s3://{BUCKET}/{prefix}/{table}.parquet"
    return locations


def measure(server: S3TestServer, run: Any) -> tuple[float, int, int]:
    """(seconds, bytes sent back, requests) of one run."""
    start = len(server.requests)
    began = time.perf_counter()
    run()
    elapsed = time.perf_counter() - began
    reqs = server.requests[start:]
    return elapsed, sum(r.sent for r in reqs if r.method == "GET"), len(reqs)


def io_paths(server: S3TestServer, locations: dict[str, str], repeat: int) -> list[str]:
    import fsspec.implementations.arrow as fsarrow

    class S3ViaArrow(fsarrow.ArrowFSWrapper):  # type: ignore[misc]
        protocol = "s3"

    fs = S3ViaArrow(storage.filesystem())
    rows = [
        f"| scan | path | time (median of {repeat}) | bytes fetched | requests |",
        "|---|---|---:|---:|---:|",
    ]
    for name, table, columns, _ in SCANS:
        uri = locations[table]
        # Every value is read: statistics cannot answer it (count and max could).
        select = ", ".join(columns) if columns else "*"
        aggregate = "count(*), bit_xor(hash(COLUMNS(*)))"

        def with_pyarrow(uri: str = uri, columns: Any = columns, query: str = aggregate) -> None:
            source = storage.open_object(uri)
            parquet = pq.ParquetFile(source, pre_buffer=True)
            schema = parquet.schema_arrow
            if columns is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            reader = pa.RecordBatchReader.from_batches(
                schema, parquet.iter_batches(65_536, columns=columns)
            )
            con = duckdb.connect(config=NO_EXTENSIONS)
            con.register("t", reader)
            con.execute(f"SELECT {query} FROM t").fetchall()
            con.close()

        def with_duckdb_fsspec(
            uri: str = uri, select: str = select, query: str = aggregate
        ) -> None:
            con = duckdb.connect(config=NO_EXTENSIONS)
            con.register_filesystem(fs)
            con.execute(
                f"SELECT {query} FROM (SELECT {select} FROM read_parquet('{uri}'))"
            ).fetchall()
            con.close()

        for label, run in (
            ("pyarrow S3FileSystem (mangonel.storage)", with_pyarrow),
            ("DuckDB read_parquet over fsspec", with_duckdb_fsspec),
        ):
            results, errors = [], []
            for _ in range(repeat):
                try:
                    results.append(measure(server, run))
                except duckdb.Error as exc:  # DuckDB's bridge to Python filesystems
                    errors.append(str(exc).splitlines()[0])
            failed = f" ({len(errors)} of {repeat} runs failed: {errors[0]!r})" if errors else ""
            if not results:
                rows.append(f"| {name} | {label}{failed} | | | |")
                continue
            median = statistics.median(r[0] for r in results)
            _, sent, count = results[-1]
            rows.append(
                f"| {name} | {label}{failed} | {median:.3f} s | {sent / 1e6:.2f} MB | {count} |"
            )
        size = server.client().head_object(Bucket=BUCKET, Key=uri.split("/", 3)[3])["ContentLength"]
        rows.append(f"| {name} | (the object) | | {size / 1e6:.2f} MB | |")
    return rows


def queries(server: S3TestServer, locations: dict[str, str], work: Path) -> list[str]:
    import mangonel

    client = server.client()
    sizes = {
        t: client.head_object(Bucket=BUCKET, Key=loc.split("/", 3)[3])["ContentLength"]
        for t, loc in locations.items()
    }
    rows = [
        "| query | time | bytes fetched | requests | size of the tables it reads | fetched/size |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    total_fetched = total_size = 0
    with mangonel.LocalCluster(
        executors=2, work_dir=str(work / "cluster"),
        storage=storage.StorageOptions(endpoint_url=server.url),
    ) as cluster, cluster.connect() as session:  # fmt: skip
        start = len(server.requests)
        for table, location in locations.items():
            session.register_parquet(table, location)
        footers = sum(r.sent for r in server.requests[start:] if r.method == "GET")
        first_query = len(server.requests)
        for number in range(1, 23):
            sql = tpch_query(number)
            named = [t for t in TPCH_TABLES if re.search(rf"\b{t}\b", sql)]
            size = sum(sizes[t] for t in named)
            elapsed, sent, count = measure(server, lambda sql=sql: session.sql(sql).to_arrow())
            total_fetched += sent
            total_size += size
            rows.append(
                f"| q{number:02d} | {elapsed:.2f} s | {sent / 1e6:.2f} MB | {count} | "
                f"{size / 1e6:.2f} MB | {sent / size:.0%} |"
            )
        whole = [r for r in server.requests[first_query:] if r.method == "GET" and not r.range]
    rows.append(
        f"| all 22 | | {total_fetched / 1e6:.1f} MB | | {total_size / 1e6:.1f} MB | "
        f"{total_fetched / total_size:.0%} |"
    )
    everything = sum(sizes.values())
    rows.append(
        f"\nRegistering the 8 tables fetched {footers / 1e3:.0f} kB of footers "
        f"({footers / everything:.2%} of {everything / 1e6:.1f} MB); "
        f"GETs without a Range header during the queries: {len(whole)}."
    )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-path", action="store_true")
    parser.add_argument("--skip-queries", action="store_true")
    args = parser.parse_args()
    data = ensure_tpch(args.scale)
    server = S3TestServer().start()
    os.environ.update(server.env())
    storage.configure(storage.StorageOptions(endpoint_url=server.url))
    try:
        locations = upload(server, data, f"sf{args.scale:g}")
        print(f"TPC-H SF {args.scale:g} in moto's S3 at {server.url}\n")
        if not args.skip_path:
            print("\n".join(io_paths(server, locations, args.repeat)) + "\n")
        if not args.skip_queries:
            with tempfile.TemporaryDirectory(prefix="mangonel-bench-s3-") as work:
                print("\n".join(queries(server, locations, Path(work))))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
