"""``mangonel demo``: TPC-H q12 on a fresh local cluster, with how it ran."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from importlib import resources

from mangonel.client import render
from mangonel.errors import ClusterError

TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")


def find_tpchgen() -> str:
    """The ``tpchgen-cli`` installed with mangonel: next to this Python, or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise ClusterError("tpchgen-cli is not installed; `pip install tpchgen-cli==4.0.0`")
    return found


def ensure_tpch(cache_dir: str, scale: float = 0.1) -> str:
    """Generate TPC-H Parquet files into ``cache_dir`` unless all 8 are there."""
    if all(os.path.exists(os.path.join(cache_dir, f"{t}.parquet")) for t in TABLES):
        return cache_dir
    os.makedirs(cache_dir, exist_ok=True)
    print(f"generating TPC-H SF {scale} into {cache_dir} ...", file=sys.stderr, flush=True)
    tmp = f"{cache_dir}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    done = subprocess.run(
        [find_tpchgen(), "parquet", "-s", str(scale), f"--output-dir={tmp}"],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"tpchgen-cli failed: {done.stderr.strip()[-500:]}")
    # Move files in only when all exist, so an interrupted run is never taken as done.
    for t in TABLES:
        os.replace(os.path.join(tmp, f"{t}.parquet"), os.path.join(cache_dir, f"{t}.parquet"))
    shutil.rmtree(tmp, ignore_errors=True)
    return cache_dir


def q12_text() -> str:
    return resources.files("mangonel.tpch").joinpath("queries/q12.sql").read_text()


def run_demo(cache_dir: str, executors: int = 2, log_level: str = "warning") -> int:
    """Generate data if needed, start a cluster, run q12 and print its answer and stages."""
    from mangonel.testing.cluster import LocalCluster

    started = time.monotonic()
    data = ensure_tpch(cache_dir)
    print(f"starting a local cluster: 1 scheduler, {executors} executors ...", file=sys.stderr)
    with LocalCluster(executors=executors, log_level=log_level) as cluster:
        with cluster.connect() as session:
            for t in TABLES:
                session.register_parquet(t, os.path.join(data, f"{t}.parquet"))
            print("running TPC-H q12 ...\n", file=sys.stderr, flush=True)
            result = session.sql(q12_text())
    print(render.format_table(result.to_arrow()))
    print(f"\n{result.num_rows} rows in {result.elapsed_s:.2f} s\n")
    print(render.format_stages(result.stages))
    print(f"\ntotal time (data, cluster start and stop, query): {time.monotonic() - started:.2f} s")
    return 0
