"""What the web tests share: their data, a cluster with a web UI, HTTP helpers, waits.

The data is TPC-H SF 0.01 rewritten with small row groups, so that q12 runs as
five stages of several tasks each (scans split by row groups, hash joins only, and
``orders`` in a random order of its rows, which no join reads by key range):
enough tasks to see progress, re-runs and recomputes on a page, in about a second.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helpers
import pyarrow.parquet as pq
from helpers import CACHE_DIR, TPCH_TABLES, ensure_tpch, shuffled_orders, tpch_dir_name

from mangonel.testing.cluster import TestCluster

SCALE = 0.01
ROW_GROUP_ROWS = 2500
SPLIT_ROWS = 7500
"""lineitem (60k rows) is read by 9 scan tasks, orders (15k) by 2."""


def small_row_groups_tpch(cache_dir: Path = CACHE_DIR) -> Path:
    """TPC-H SF 0.01 with ``ROW_GROUP_ROWS``-row groups, ``orders`` shuffled
    (``helpers.shuffled_orders``), written once and reused."""
    target = cache_dir / f"{tpch_dir_name(SCALE)}-rg{ROW_GROUP_ROWS}-shuffled-orders"
    if all((target / f"{t}.parquet").is_file() for t in TPCH_TABLES):
        return target
    source = ensure_tpch(SCALE, cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir))
    try:
        for table in TPCH_TABLES:
            if table == "orders":
                shuffled_orders(source / f"{table}.parquet", tmp, ROW_GROUP_ROWS)
                continue
            data = pq.read_table(source / f"{table}.parquet")
            pq.write_table(data, tmp / f"{table}.parquet", row_group_size=ROW_GROUP_ROWS)
        tmp.chmod(0o755)
        shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:  # another run put its complete copy there first
            if not all((target / f"{t}.parquet").is_file() for t in TPCH_TABLES):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def web_cluster(work_dir: Path, executors: int = 2, **options: Any) -> TestCluster:
    """A cluster with a web UI on a free port, hash joins only, small scan splits.

    The heartbeat timeout is long (60 s): tests freeze executors to hold a query
    still while a page is looked at, and a frozen executor must not be lost then.
    """
    settings: dict[str, Any] = {
        "executors": executors,
        "slots": 2,
        "partitions": 4,
        "broadcast_bytes": 0,
        "heartbeat_timeout": 60.0,
        "web_port": 0,
        "log_level": "info",
        "scheduler_args": ("--split-rows", str(SPLIT_ROWS)),
    }
    settings.update(options)
    return TestCluster(work_dir=work_dir, **settings)


def get(url: str) -> tuple[int, str, bytes]:
    """``(status, content type, body)`` of a GET; HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def get_json(url: str) -> Any:
    status, _, body = get(url)
    assert status == 200, f"GET {url}: {status} {body[:500]!r}"
    return json.loads(body)


def post_json(url: str, payload: Any = None) -> tuple[int, Any]:
    data = json.dumps(payload).encode() if payload is not None else b""
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """``helpers.wait_until`` with the web tests' default timeout."""
    return helpers.wait_until(predicate, what, timeout)
