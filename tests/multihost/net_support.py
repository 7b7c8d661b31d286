"""What the multi-host test modules share: clusters whose every process runs on a
host of its own (``mangonel.testing.netcluster``).

Each module starts one ``NetCluster`` (a network lab of Linux namespaces: a
scheduler host, two executor hosts and a client host on one switch), since a
start costs a few seconds. The lab needs root and iproute2; without them the
suite fails with the reason (``scripts/install-system-deps.sh`` installs
iproute2; CI runs as root; ``MANGONEL_TESTS_MAY_SKIP=1`` skips it instead).
"""

from __future__ import annotations

import threading
from pathlib import Path

from helpers import require_host

from mangonel.testing.netclient import Answer
from mangonel.testing.netcluster import NetCluster
from mangonel.testing.netlab import NetLab


def require_lab() -> None:
    """Fail when no lab can be built here (``helpers.require_host``): the suite
    needs root for its network namespaces."""
    require_host(NetLab.unavailable(), "multi-host tests need network namespaces")


class QueryInBackground:
    """``net.client.sql(sql)`` on a thread of its own, so that a test can fault the
    cluster meanwhile: ``answers`` receives its answer, or the exception it raised."""

    def __init__(self, net: NetCluster, sql: str) -> None:
        self.answers: list[Answer | BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(net, sql), name="query")
        self.thread.daemon = True
        self.thread.start()

    def _run(self, net: NetCluster, sql: str) -> None:
        try:
            self.answers.append(net.client.sql(sql))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self.answers.append(exc)


PARTITIONS = 4
STORE_BUCKET = "tpch"
SHUFFLED = 21
"""A TPC-H query whose exchanges hash both sides on ``start_cluster``'s cluster
(SF 0.1): five of q21's seven stages write hashed partitions. q9 did, until its
parts cut ``partsupp`` before ``lineitem`` meets it (docs/planner.md)."""


def start_cluster(
    root: Path,
    tables: dict[str, Path],
    split_rows: int,
    heartbeat_timeout: float = 10.0,
    executor_args: tuple[str, ...] = (),
    object_store: bool = False,
    scheduler_args: tuple[str, ...] = (),
) -> NetCluster:
    """A started ``NetCluster`` of two one-slot executors with the TPC-H tables
    registered. Every exchange has ``PARTITIONS`` partitions (the data would fit in
    one), so rows cross between the executors. With ``object_store``, the cluster
    has a store host too (``NetCluster.store``) and ``tables`` go there
    (``s3://<STORE_BUCKET>/<name>.parquet``) and are registered from it."""
    require_lab()
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
            *scheduler_args,
        ),  # fmt: skip
        executor_args=executor_args,
        object_store=object_store,
    ).start()
    try:
        locations = {name: str(path) for name, path in tables.items()}
        if cluster.store is not None:
            keys = {f"{name}.parquet": path for name, path in tables.items()}
            cluster.store.upload(keys, STORE_BUCKET)
            locations = {name: f"s3://{STORE_BUCKET}/{name}.parquet" for name in tables}
        for name, location in locations.items():
            cluster.client.register_parquet(name, location)
    except BaseException:
        cluster.stop()
        raise
    return cluster
