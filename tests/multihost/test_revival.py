"""An executor declared lost whose process lived comes back under its id, with
its outputs (``scheduler.state_revival``), on the multi-host lab.

One cluster for the module: a scheduler, one two-slot executor and a client,
each on a host of its own, heartbeat timeout 3 s. TPC-H q12 at SF 0.1, lineitem
in 12 tasks. The executor freezes itself (SIGSTOP) once it has finished two
tasks of stage 1; the test cuts its host off, thaws it, and keeps it cut until
the scheduler has declared it lost (heartbeat timeout) and one second more. With
no other executor, nothing can make its outputs again meanwhile: healed, it asks
to resume, and the outputs it kept are the job's again. Without the revival its
finished stage-1 outputs would be recomputed (``outputs_recomputed`` > 0) under
a new id. The answer is checked against DuckDB.

These tests need root for the lab's network namespaces: without them they fail,
saying why; they never skip.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, is_stopped, tpch_query, wait_until
from net_support import require_lab

from mangonel.testing.netclient import Answer
from mangonel.testing.netcluster import NetCluster

QUERY = 12
SPLIT_ROWS = 50_000
HEARTBEAT_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def net(lab_root: Path, tpch_tables: dict[str, Path]) -> Iterator[NetCluster]:
    require_lab()
    cluster = NetCluster(
        lab_root,
        executors=1,
        slots=2,
        heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
        scheduler_args=(
            "--partitions",
            "4",
            "--partition-bytes",
            "0",
            "--split-rows",
            str(SPLIT_ROWS),
        ),  # fmt: skip
    ).start()
    try:
        for name, path in tpch_tables.items():
            cluster.client.register_parquet(name, str(path))
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


def _scheduler_log(net: NetCluster) -> str:
    assert net.scheduler is not None
    return net.scheduler.log_path.read_text()


def test_an_executor_lost_for_a_long_cut_resumes_its_id_and_nothing_is_recomputed(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    expected = duckdb_ref.sql(tpch_query(QUERY)).to_arrow_table()
    assert expected.num_rows > 0
    (only,) = net.wait_for_executors(1).values()
    host, proc = net.executor_hosts[0], net.executors[0]
    outcome: list[Answer | BaseException] = []

    def run() -> None:
        try:
            outcome.append(net.client.sql(tpch_query(QUERY)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    net.set_faults(0, [{"action": "freeze", "when": "task_finished", "stage": 1, "nth": 2}])
    query = threading.Thread(target=run, name="query", daemon=True)
    query.start()
    wait_until(lambda: is_stopped(proc.pid) or outcome, "the executor froze", 60)
    assert not outcome, f"the query ended before the breakpoint: {outcome}"
    net.lab.cut(host)
    cut_at = time.time()
    os.kill(proc.pid, signal.SIGCONT)
    lost = wait_until(
        lambda: re.search(rf"executor {only} lost \((.*?)\): (.*)", _scheduler_log(net)),
        "the cut executor is declared lost",
        30,
    )
    lost_after = time.time() - cut_at
    time.sleep(1.0)  # past the loss: its outputs were sent back to be made again
    net.lab.heal(host)
    healed_at = time.time()
    query.join(120)
    assert outcome, "no answer within 120 s of the heal"
    answer = outcome[0]
    if isinstance(answer, BaseException):
        raise answer
    assert_same_result(
        answer.result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[QUERY]
    )
    log = _scheduler_log(net)
    assert lost.group(1) == "heartbeat timeout", lost.group(0)
    assert re.search(
        rf"executor {only} came back after it was lost: lost \(heartbeat timeout\) but "
        rf"alive; it goes on under its id",
        log,
    ), log[-3000:]
    # Its finished stage-1 outputs were the job's again: none made twice.
    assert answer.result.outputs_recomputed == 0, answer.result.stages
    assert net.wait_for_executors(1) == {0: only}
    assert net.metrics()["mangonel_executors_false_losses_total"] == 1
    print(
        f"cut past the timeout: lost ({lost.group(1)}) {lost_after:.1f} s after the cut; "
        f"answer {answer.finished_at - healed_at:.2f} s after the heal, under the same id, "
        f"nothing recomputed"
    )
