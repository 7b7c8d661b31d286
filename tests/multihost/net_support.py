"""What the multi-host test modules share: clusters whose every process runs on a
host of its own (``mangonel.testing.netcluster``).

Each module starts one ``NetCluster`` (a network lab of Linux namespaces: a
scheduler host, two executor hosts and a client host on one switch), since a
start costs a few seconds. The lab needs root and iproute2; without them the
suite is skipped with the reason (``scripts/install-system-deps.sh`` installs
iproute2; CI runs as root).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mangonel.testing.netcluster import NetCluster
from mangonel.testing.netlab import NetLab

PARTITIONS = 4


def start_cluster(
    root: Path,
    tables: dict[str, Path],
    split_rows: int,
    heartbeat_timeout: float = 10.0,
    executor_args: tuple[str, ...] = (),
) -> NetCluster:
    """A started ``NetCluster`` of two one-slot executors with the TPC-H tables
    registered. Every exchange has ``PARTITIONS`` partitions (the data would fit in
    one), so rows cross between the executors."""
    problem = NetLab.unavailable()
    if problem:
        pytest.skip(f"multi-host tests need network namespaces: {problem}")
    cluster = NetCluster(
        root,
        executors=2,
        slots=1,
        heartbeat_timeout=heartbeat_timeout,
        scheduler_args=(
            "--partitions",
            str(PARTITIONS),
            "--partition-bytes",
            "0",
            "--split-rows",
            str(split_rows),
        ),  # fmt: skip
        executor_args=executor_args,
    ).start()
    try:
        for name, path in tables.items():
            cluster.client.register_parquet(name, str(path))
    except BaseException:
        cluster.stop()
        raise
    return cluster
