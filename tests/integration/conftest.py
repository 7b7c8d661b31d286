"""A real cluster per test module: one scheduler and two executor processes.

* ``cluster``: ``mangonel.LocalCluster(executors=2, partitions=4)`` with its work
  directory under ``test-artifacts/<module>/_module/cluster``, started once per module
  (starting processes costs about a second; one per test would dominate the suite).
  Every exchange has 4 partitions and a scan task reads at most 250 000 rows: the
  defaults size both from the data, and SF 0.1 would mostly run in single tasks.
* ``session``: a client session on that cluster with the eight TPC-H SF 0.1 tables
  registered under their own names.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

EXECUTORS = 2
PARTITIONS = 4
SPLIT_ROWS = 250_000


@pytest.fixture(scope="module")
def cluster(module_dir: Path) -> Iterator[Any]:
    """A running LocalCluster with 2 executors and 4 partitions per exchange."""
    import mangonel

    work_dir = module_dir / "cluster"
    with mangonel.LocalCluster(
        executors=EXECUTORS,
        work_dir=str(work_dir),
        partitions=PARTITIONS,
        scheduler_args=("--split-rows", str(SPLIT_ROWS)),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def session(cluster: Any, tpch_tables: dict[str, Path]) -> Iterator[Any]:
    """A session on ``cluster`` with the TPC-H tables registered."""
    client = cluster.connect()
    for name, path in tpch_tables.items():
        client.register_parquet(name, str(path))
    yield client
    close = getattr(client, "close", None)
    if close is not None:
        close()
