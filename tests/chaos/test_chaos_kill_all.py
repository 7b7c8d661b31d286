"""Every executor SIGKILLed during each TPC-H query, with and without one coming back.

Each executor kills itself at its first task (the rule is on all three), so the
scheduler has no executor left while the job is running:

* one returns: a new executor starts right after the last one died, well within
  the grace (``GRACE_S``); the query must finish on it with DuckDB's answer;
* none returns: the job must fail with a ``JobFailedError`` saying that no
  executor was alive, after the grace and within grace + heartbeat timeout + a
  margin: never a hang. The measured times go to ``kill_all_timings.jsonl`` in
  the module's artifacts directory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from chaos_support import (
    GRACE_S,
    HEARTBEAT_TIMEOUT_S,
    QUERIES,
    QUERY_IDS,
    ChaosCluster,
    kill_rule,
    wait_exit,
)
from helpers import tpch_query

import mangonel
from mangonel.client.cluster import ExecutorHandle
from mangonel.client.status import ExecutorState

pytestmark = pytest.mark.timeout(90)

# The scheduler checks the grace on its 0.25 s tick; the rest is for a loaded machine.
FAIL_MARGIN_S = 2.0


def _assert_all_killed(
    chaos: ChaosCluster, handles: list[ExecutorHandle], ids: list[str | None]
) -> list[float]:
    """Wait for every process to be gone and listed LOST; return when each was lost."""
    for handle in handles:
        wait_exit(handle, timeout=10)
        assert handle.process.returncode == -9, f"executor {handle.index}: not SIGKILLed"
    lost_at = []
    for executor_id in ids:
        assert executor_id is not None
        entry = chaos.wait_lost(executor_id)
        lost_at.append(entry.since)
    return lost_at


@pytest.mark.parametrize("number", QUERIES, ids=QUERY_IDS)
def test_kill_all_and_one_returns(number: int, healthy: ChaosCluster) -> None:
    chaos = healthy
    old = chaos.live()
    old_ids = [h.id for h in old]
    # After reporting: each dies holding an output the scheduler had counted on.
    chaos.cluster.set_faults_all([kill_rule("task_finished")])

    job = chaos.session.submit(tpch_query(number))
    _assert_all_killed(chaos, old, old_ids)
    assert not chaos.registered()
    chaos.cluster.set_faults_all([])
    newcomer = chaos.spawn_registered()
    result = chaos.session.wait(job)

    chaos.check(number, result)
    assert {e.pid for e in chaos.registered()} == {newcomer.pid}
    # They died holding reported outputs: those were made again on the newcomer.
    assert result.outputs_recomputed > 0, result.stages


@pytest.mark.parametrize("number", QUERIES, ids=QUERY_IDS)
def test_kill_all_and_none_returns(number: int, healthy: ChaosCluster, module_dir: Path) -> None:
    chaos = healthy
    old = chaos.live()
    old_ids = [h.id for h in old]
    chaos.cluster.set_faults_all([kill_rule("task_started")])

    submitted = time.monotonic()
    with pytest.raises(mangonel.JobFailedError) as failure:
        chaos.session.sql(tpch_query(number))
    failed_after = time.monotonic() - submitted
    failed_wall = time.time()

    assert "no executor was alive" in str(failure.value), str(failure.value)
    lost_at = _assert_all_killed(chaos, old, old_ids)
    assert all(e.state is not ExecutorState.ALIVE for e in chaos.session.status().executors)
    waited = failed_wall - max(lost_at)
    timing = {"query": number, "failed_after_s": failed_after, "after_last_loss_s": waited}
    with open(module_dir / "kill_all_timings.jsonl", "a") as out:
        out.write(json.dumps(timing) + "\n")
    # It waited for the grace, then gave up promptly.
    assert waited >= GRACE_S - 0.5, f"failed {waited:.2f} s after the last executor was lost"
    assert failed_after <= GRACE_S + HEARTBEAT_TIMEOUT_S + FAIL_MARGIN_S, (
        f"took {failed_after:.2f} s to fail"
    )
