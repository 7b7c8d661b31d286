"""What the multi-host test modules share: clusters whose every process runs on a
host of its own (``mangonel.testing.netcluster``).

Each module starts one ``NetCluster`` (a network lab of Linux namespaces: a
scheduler host, two executor hosts and a client host on one switch), since a
start costs a few seconds. The lab needs root and iproute2; without them the
suite fails with the reason (``scripts/install-system-deps.sh`` installs
iproute2; CI runs as root; ``MANGONEL_TESTS_MAY_SKIP=1`` skips it instead).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from helpers import is_stopped, require_host, wait_until

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


def distrusted(net: NetCluster, executor: str, among: tuple[str, ...] | None = None) -> str | None:
    """How the scheduler distrusts ``executor`` now (``suspected``, ``quarantined``,
    ``lagging`` or ``slow_link``: its metric names one, in that order), else
    ``None``; with ``among``, only those."""
    for key, value in net.metrics().items():
        found = re.match(r"mangonel_executors_distrusted\{(.*)\}", key)
        if found and value and f'executor="{executor}"' in found.group(1):
            state = re.search(r'as="(\w+)"', found.group(1)).group(1)  # type: ignore[union-attr]
            return state if among is None or state in among else None
    return None


class Started(Protocol):
    """A query started on a thread of the test: its answer or error, once it ended."""

    outcome: list[Any]


Q = TypeVar("Q", bound=Started)

_FREEZES: dict[int, int] = {}
"""Freeze rules each executor process has fired, by pid: a rule fires once per
process and is known by its place in the file and its content, so the next one
goes one place further."""


def fault_mid_query(
    net: NetCluster, freezer: int, start: Callable[[], Q], fault: Callable[[], None]
) -> tuple[Q, float]:
    """Freeze executor ``freezer`` at its first task of stage 1 of the query that
    ``start`` starts, apply ``fault``, thaw it: the query, and the fault's time.
    The moment of a fault is so chosen by a fault rule, not a sleep.

    The freezer must be trusted first: one still suspected after the last test's
    cut (until its heartbeats get through), or behind a link marked slow (a
    back-off of 20 s or more), gets no task, and the query would end without it,
    the rule left armed for the next query (CI at ``d9eb1eb``). A rule that did
    not fire is taken back."""
    proc = net.executors[freezer]
    executor = wait_until(lambda: net.executor_ids().get(freezer), "the freezer registered", 60)
    wait_until(lambda: distrusted(net, executor) is None, "the freezer trusted", 60)
    fired = _FREEZES.get(proc.pid, 0)
    net.set_faults(freezer, [{"action": "freeze", "stage": 1, "nth": 1}] * (fired + 1))
    query = start()
    wait_until(lambda: is_stopped(proc.pid) or query.outcome, "the executor froze", 60)
    try:
        if not is_stopped(proc.pid):
            net.set_faults(freezer, [])  # no later query may freeze it
        assert not query.outcome, f"the query ended before the breakpoint: {query.outcome}"
        _FREEZES[proc.pid] = fired + 1
        fault()
        return query, time.time()
    finally:
        os.kill(proc.pid, signal.SIGCONT)


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
