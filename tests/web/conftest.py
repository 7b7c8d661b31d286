"""Fixtures of the web tests: a cluster with a web UI per module, and its data.

* ``web_data``: TPC-H SF 0.01 with small row groups (``web_support``).
* ``reference``: single-process DuckDB over the same files.
* ``cluster``: a 2-executor ``TestCluster`` with its web UI on a free port
  (``cluster.web_url``), started once per module under
  ``test-artifacts/<module>/_module/cluster``, with the TPC-H tables registered.
* ``own_cluster``: the same, started for one test under its ``work_dir``: for
  tests that freeze or kill executors. A frozen executor that is thawed still
  runs the tasks it had been given before its job was cancelled, and could
  meet the next test's fault rules; a cluster of its own leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_TABLES, duckdb_views_sql
from web_support import small_row_groups_tpch, web_cluster

from mangonel.testing.cluster import TestCluster


@pytest.fixture(scope="session")
def web_data() -> Path:
    return small_row_groups_tpch()


@pytest.fixture(scope="session")
def reference(web_data: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    for statement in duckdb_views_sql({t: web_data / f"{t}.parquet" for t in TPCH_TABLES}):
        con.execute(statement)
    yield con
    con.close()


def _started(work_dir: Path, data: Path) -> Iterator[TestCluster]:
    with web_cluster(work_dir) as running:
        with running.connect() as session:
            for table in TPCH_TABLES:
                session.register_parquet(table, str(data / f"{table}.parquet"))
        yield running


@pytest.fixture(scope="module")
def cluster(module_dir: Path, web_data: Path) -> Iterator[TestCluster]:
    yield from _started(module_dir / "cluster", web_data)


@pytest.fixture
def own_cluster(work_dir: Path, web_data: Path) -> Iterator[TestCluster]:
    yield from _started(work_dir / "cluster", web_data)
