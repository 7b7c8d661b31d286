"""SIGTERM to an executor in the middle of each TPC-H query: it drains, then leaves.

The first executor to start a reduce task (the first stage that reads shuffle
output) is stopped there, sent SIGTERM and resumed, so the signal lands while it
runs a task of the query. A drain takes no new tasks but finishes the ones it
runs and serves its outputs until no job needs them: nothing is run twice, the
scheduler writes it off as drained, it exits 0, and the answer is DuckDB's.
"""

from __future__ import annotations

import pytest
from chaos_support import (
    QUERIES,
    QUERY_IDS,
    ChaosCluster,
    FirstToReach,
    freeze_rule,
    terminate,
    wait_exit,
)
from helpers import tpch_query

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("number", QUERIES, ids=QUERY_IDS)
def test_sigterm_mid_query(number: int, healthy: ChaosCluster) -> None:
    chaos = healthy
    reducer = chaos.points(number).first_reader

    with FirstToReach(chaos, freeze_rule("task_started", stage=reducer), terminate) as point:
        result = chaos.session.sql(tpch_query(number))

    chaos.check(number, result)
    hit = point.require_hit()
    assert hit.executor_id is not None
    wait_exit(hit.handle, timeout=15)
    assert hit.handle.process.returncode == 0, (
        f"exit code {hit.handle.process.returncode} after SIGTERM; log ends:\n"
        f"{hit.handle.log_tail(1500)}"
    )
    gone = chaos.wait_lost(hit.executor_id)
    assert gone.reason == "drained", f"{gone.reason} - {gone.detail}"
    assert result.tasks_rerun == result.outputs_recomputed == 0, result.stages
