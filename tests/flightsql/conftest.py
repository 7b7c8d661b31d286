"""Fixtures of the Flight SQL suite: a real cluster, and clients that speak Flight SQL.

* ``fsql_cluster``: ``LocalCluster(executors=2, partitions=4)`` with the TPC-H SF 0.1
  tables registered (scan tasks of 250 000 rows, as the integration suite's), started
  once for the whole directory under ``test-artifacts/flightsql``; its Flight SQL
  endpoint is ``fsql_cluster.flight_sql_url``.
* ``adbc``: a DB-API connection of the real ADBC Flight SQL driver (Go) to it.
* ``flight_client``: a plain ``pyarrow.flight`` client of the same endpoint, for
  what the driver does not let a test do (forged tickets, malformed commands).
* ``fsql``: helpers that pack Flight SQL commands for ``flight_client``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.flight as flight
import pytest
from fsql_support import adbc_connect
from helpers import ARTIFACTS_DIR

EXECUTORS = 2
PARTITIONS = 4
SPLIT_ROWS = 250_000


@pytest.fixture(scope="package")
def fsql_cluster(tpch_tables: dict[str, Path]) -> Iterator[Any]:
    import mangonel

    work_dir = ARTIFACTS_DIR / "flightsql" / "_package" / "cluster"
    shutil.rmtree(work_dir, ignore_errors=True)
    with mangonel.LocalCluster(
        executors=EXECUTORS,
        work_dir=str(work_dir),
        partitions=PARTITIONS,
        scheduler_args=("--split-rows", str(SPLIT_ROWS)),
    ) as cluster:
        with cluster.connect() as session:
            for name, path in tpch_tables.items():
                session.register_parquet(name, str(path))
        yield cluster


@pytest.fixture(scope="package")
def adbc(fsql_cluster: Any) -> Iterator[Any]:
    conn = adbc_connect(fsql_cluster.flight_sql_url)
    yield conn
    conn.close()


@pytest.fixture
def flight_client(fsql_cluster: Any) -> Iterator[flight.FlightClient]:
    client = flight.connect(fsql_cluster.flight_sql_url)
    yield client
    client.close()
