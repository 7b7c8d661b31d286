"""A frozen executor (SIGSTOP) during each TPC-H query: declared lost by heartbeat timeout.

A frozen process keeps its connections open and answers nothing, so only its
silence gives it away: suspected in about 2 s (its needed outputs made again on
other executors), lost at the heartbeat timeout. The first executor to start a reduce task (the
first stage that reads shuffle output) stops there and stays stopped; the query
must finish on the other two with DuckDB's answer. Thawed afterwards, the executor
learns it was given up, registers again under a new id and takes part in a
fault-free run of the same query.
"""

from __future__ import annotations

import signal

import pytest
from chaos_support import (
    QUERIES,
    QUERY_IDS,
    ChaosCluster,
    FirstToReach,
    freeze_rule,
    is_stopped,
    leave_frozen,
    tasks_rerun,
    wait_until,
)
from helpers import tpch_query

from mangonel.client.status import ExecutorState

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("number", QUERIES, ids=QUERY_IDS)
def test_frozen_executor_is_lost_by_heartbeat_timeout(number: int, healthy: ChaosCluster) -> None:
    chaos = healthy
    reducer = chaos.points(number).first_reader

    with FirstToReach(chaos, freeze_rule("task_started", stage=reducer), leave_frozen) as point:
        result = chaos.session.sql(tpch_query(number))

    chaos.check(number, result)
    hit = point.require_hit()
    frozen = hit.handle
    assert hit.executor_id is not None
    # The query finished while it was still stopped: nobody waited for it (often
    # not even for its loss: its outputs are made again once it is suspected).
    assert is_stopped(frozen.pid)
    lost = chaos.wait_lost(hit.executor_id)
    assert lost.state is ExecutorState.LOST
    assert lost.reason == "heartbeat timeout", f"{lost.reason} - {lost.detail}"
    assert tasks_rerun(result, stage=reducer) > 0, result.stages

    frozen.signal(signal.SIGCONT)
    wait_until(
        lambda: any(e.pid == frozen.pid for e in chaos.registered()),
        f"the thawed executor (pid {frozen.pid}) registered again",
    )
    again = next(e for e in chaos.registered() if e.pid == frozen.pid)
    assert again.id != hit.executor_id, "a lost executor must come back under a new id"
    assert len(chaos.registered()) == 3

    healthy_run = chaos.session.sql(tpch_query(number))
    chaos.check(number, healthy_run)
    assert healthy_run.tasks_rerun == healthy_run.outputs_recomputed == 0, healthy_run.stages
