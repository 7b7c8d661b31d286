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

With ``--s3`` the outputs go to object storage: moto's S3 server in a process of
its own (``python -m mangonel.testing.netstore serve``), ``COPY`` under
``s3://bench/out/`` and the warehouse at ``s3://bench/warehouse``. DuckDB's own
``COPY`` to S3 needs its ``httpfs`` extension, which this machine cannot
install (no network but the package registries), so DuckDB's side is its
``COPY`` to local disk followed by an upload of the file with pyarrow's S3
client: what mangonel's executors do per task (``executor.sink``), in one
process. Both times are kept (``duckdb_copy_s``, ``duckdb_upload_s``).

Also printed: how many tasks wrote, on how many executors (the write spreads
over the cluster). Not a test: timings belong here. Usage::

    .venv/bin/python benchmarks/writes.py --scale 1 [--repeat 3] [--s3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.fs as pafs

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers import TPCH_TABLES, ensure_tpch  # noqa: E402  (the test helpers)

from mangonel.executor.sink import FILE_SIZE_BYTES  # noqa: E402

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
    parser.add_argument(
        "--s3", action="store_true", help="write to moto's S3 server instead of local disk"
    )
    return parser.parse_args(argv)


BUCKET = "bench"


@contextmanager
def s3_store(work: Path) -> Iterator[str]:
    """moto's S3 server in a process of its own, with a bucket ``BUCKET``; yields its
    endpoint, and points this process's ``mangonel.storage`` (and the environment the
    cluster's processes inherit) at it."""
    from mangonel import storage
    from mangonel.testing.netstore import client_env

    ready = work / "store.ready"
    port = 19000 + os.getpid() % 1000
    server = subprocess.Popen(
        [sys.executable, "-m", "mangonel.testing.netstore", "serve",
         "--port", str(port), "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("moto's S3 server did not start")
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port}"
        os.environ.update(client_env())
        storage.configure(storage.StorageOptions(endpoint_url=url, addressing="path"))
        s3fs(url).create_dir(BUCKET)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def s3fs(url: str) -> pafs.S3FileSystem:
    env = os.environ
    return pafs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=url,
        region=env["AWS_REGION"],
        force_virtual_addressing=False,
        allow_bucket_creation=True,
    )


def checksum(files: list[str], columns: str) -> tuple[int, float]:
    con = duckdb.connect()
    row = con.execute(
        f"SELECT count(*), sum(hash({columns}) % 1000003)::DOUBLE FROM read_parquet({files!r})"
    ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


def committed_files(location: str, fs: pafs.FileSystem | None, local: Path) -> list[str]:
    """The files the location's manifest names; from S3 (``fs``), copied to ``local``."""
    if fs is None:
        doc = json.loads((Path(location) / "_mangonel_manifest.json").read_text())
        return [str(Path(location) / f) for f in doc["files"]]
    base = location.removeprefix("s3://").rstrip("/")
    with fs.open_input_stream(f"{base}/_mangonel_manifest.json") as f:
        doc = json.loads(f.read())
    local.mkdir(parents=True, exist_ok=True)
    files = []
    for i, name in enumerate(doc["files"]):
        path = local / f"{i}.parquet"
        pafs.copy_files(f"{base}/{name}", str(path), source_filesystem=fs)
        files.append(str(path))
    return files


def run_duckdb(
    data: Path, query: str, target: Path, fs: pafs.FileSystem | None
) -> tuple[float, float]:
    """DuckDB's COPY of ``query`` to ``target``: its time, and (with ``fs``) the time
    of the upload of its files to S3 after it.

    For S3, DuckDB writes files of at most the size mangonel's tasks write
    (``sink.FILE_SIZE_BYTES``) into a directory, uploaded one by one: the same
    objects as mangonel's, where one multi-GB object was a multipart upload that
    moto's server failed to complete at SF10."""
    con = duckdb.connect()
    for t in TPCH_TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{data / (t + '.parquet')}')")
    options = "FORMAT parquet"
    if fs is not None:
        options += f", FILE_SIZE_BYTES {FILE_SIZE_BYTES}"
    started = time.perf_counter()
    con.execute(f"COPY ({query}) TO '{target}' ({options})")
    took = time.perf_counter() - started
    con.close()
    upload = 0.0
    if fs is not None:
        started = time.perf_counter()
        prefix = f"{BUCKET}/ref/{target.name}"
        pafs.copy_files(str(target), prefix, destination_filesystem=fs)
        upload = time.perf_counter() - started
        fs.delete_dir(prefix)
    return took, upload


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import mangonel

    data = ensure_tpch(args.scale)
    work = Path(tempfile.mkdtemp(prefix="mangonel-writes-"))
    try:
        if args.s3:
            with s3_store(work) as url:
                from mangonel import storage

                options = storage.StorageOptions(endpoint_url=url, addressing="path")
                measure(args, mangonel, data, work, s3fs(url), options)
        else:
            measure(args, mangonel, data, work, None, None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def measure(
    args: argparse.Namespace,
    mangonel: Any,
    data: Path,
    work: Path,
    fs: pafs.FileSystem | None,
    storage_options: Any,
) -> None:
    if fs is None:
        out, warehouse = str(work / "out"), str(work / "warehouse")
        (work / "out").mkdir()
    else:
        out, warehouse = f"s3://{BUCKET}/out", f"s3://{BUCKET}/warehouse"
    names = args.statement or list(STATEMENTS)
    results: dict[str, Any] = {
        "scale": args.scale,
        "executors": args.executors,
        "target": "s3 (moto)" if fs is not None else "local disk",
        "runs": {},
    }
    extra = {"storage": storage_options} if storage_options is not None else {}
    with mangonel.LocalCluster(
        executors=args.executors,
        work_dir=str(work / "cluster"),
        web_port=0,
        scheduler_args=("--write-root", out, "--warehouse", warehouse),
        **extra,
    ) as cluster:
        session = cluster.connect()
        for t in TPCH_TABLES:
            session.register_parquet(t, str(data / f"{t}.parquet"))
        print(
            f"TPC-H SF{args.scale:g} to {results['target']}, {args.executors} executors, "
            f"median of {args.repeat}"
        )
        print(f"{'statement':<15} {'mangonel s':>11} {'duckdb s':>9} {'ratio':>6}  writers")
        for name in names:
            query, columns = STATEMENTS[name]
            ours: list[float] = []
            theirs: list[float] = []
            uploads: list[float] = []
            spread = ""
            for i in range(args.repeat):
                ref = work / f"ref-{name}-{i}.parquet"
                copy_s, upload_s = run_duckdb(data, query, ref, fs)
                theirs.append(copy_s + upload_s)
                uploads.append(upload_s)
                if name.startswith("copy"):
                    target = f"{out}/{name}-{i}"
                    sql = f"COPY ({query}) TO '{target}' (FORMAT parquet)"
                else:
                    target = f"{warehouse}/{name}_{i}"
                    sql = f"CREATE TABLE {name}_{i} AS {query}"
                started = time.perf_counter()
                result = session.sql(sql)
                ours.append(time.perf_counter() - started)
                files = committed_files(target, fs, work / f"back-{name}-{i}")
                ref_files = sorted(map(str, ref.iterdir())) if ref.is_dir() else [str(ref)]
                if checksum(files, columns) != checksum(ref_files, columns):
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
                elif fs is None:
                    shutil.rmtree(target)
                else:
                    fs.delete_dir(target.removeprefix("s3://"))
                if fs is not None:
                    shutil.rmtree(work / f"back-{name}-{i}", ignore_errors=True)
                if ref.is_dir():
                    shutil.rmtree(ref)
                else:
                    os.remove(ref)
                print(
                    f"  run {i + 1}: mangonel {ours[-1]:.2f} s, duckdb {theirs[-1]:.2f} s",
                    flush=True,
                )
            m, d = statistics.median(ours), statistics.median(theirs)
            print(f"{name:<15} {m:>11.2f} {d:>9.2f} {m / d:>6.2f}  {spread}", flush=True)
            results["runs"][name] = {
                "mangonel_s": ours,
                "duckdb_s": theirs,
                "duckdb_upload_s": uploads,
                "ratio": m / d,
                "writers": spread,
            }
            if args.json:  # after each statement: a later failure keeps these
                args.json.write_text(json.dumps(results, indent=1))
        session.close()


if __name__ == "__main__":
    sys.exit(main())
