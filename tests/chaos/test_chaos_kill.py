"""SIGKILLed executors during each TPC-H query: the answer is still DuckDB's.

Three executors; the faults fire at points of the query, not after sleeps:

* after a map task: the first executor in line kills itself right after it reported
  its first stage-1 task, whose files it deleted just before (a machine lost with its
  disk: ``lost_machine_rules``), so an output the scheduler counted on is gone;
* in a reduce stage: the first executor to start a task of the first stage that
  reads shuffle output is killed there;
* two of three in turn: the first after its first stage-1 task, then whichever
  starts the final stage's task; the last executor finishes the query alone.
"""

from __future__ import annotations

import pytest
from chaos_support import (
    QUERIES,
    QUERY_IDS,
    ChaosCluster,
    FirstToReach,
    freeze_rule,
    kill,
    lost_machine_rules,
    outputs_recomputed,
    tasks_rerun,
    wait_exit,
)
from helpers import tpch_query

pytestmark = pytest.mark.timeout(90)


def _assert_killed(chaos: ChaosCluster, handle_pid: int, executor_id: str | None) -> None:
    handle = chaos.handle_of(handle_pid)
    wait_exit(handle, timeout=5)
    assert handle.process.returncode == -9, f"exit code {handle.process.returncode}, not SIGKILL"
    assert executor_id is not None
    lost = chaos.wait_lost(executor_id)
    # The broken command stream gives a killed executor away, not the heartbeat timeout.
    assert lost.reason == "connection lost", f"{executor_id}: {lost.reason} - {lost.detail}"


@pytest.mark.parametrize("number", QUERIES, ids=QUERY_IDS)
def test_kill_after_first_map_task(number: int, healthy: ChaosCluster) -> None:
    chaos = healthy
    victim = chaos.first_in_line()
    victim_id = victim.id
    chaos.set_faults(victim, lost_machine_rules(stage=1))

    result = chaos.session.sql(tpch_query(number))

    chaos.check(number, result)
    _assert_killed(chaos, victim.pid, victim_id)
    # It died holding a reported stage-1 output that later stages still needed.
    assert outputs_recomputed(result, stage=1) > 0, result.stages


@pytest.mark.parametrize("number", QUERIES, ids=QUERY_IDS)
def test_kill_in_reduce_stage(number: int, healthy: ChaosCluster) -> None:
    chaos = healthy
    reducer = chaos.points(number).first_reader

    with FirstToReach(chaos, freeze_rule("task_started", stage=reducer), kill) as point:
        result = chaos.session.sql(tpch_query(number))

    chaos.check(number, result)
    hit = point.require_hit()
    _assert_killed(chaos, hit.handle.pid, hit.executor_id)
    # The task it had started must have run again elsewhere.
    assert tasks_rerun(result, stage=reducer) > 0, result.stages


@pytest.mark.parametrize("number", QUERIES, ids=QUERY_IDS)
def test_kill_two_of_three_in_turn(number: int, healthy: ChaosCluster) -> None:
    chaos = healthy
    first = chaos.first_in_line()
    first_id = first.id
    final = chaos.points(number).final
    # The final stage cannot start before stage 1 is complete, so the second kill
    # comes after the first one.
    with FirstToReach(
        chaos,
        freeze_rule("task_started", stage=final),
        kill,
        extra={first.index: lost_machine_rules(stage=1)},
    ) as point:
        result = chaos.session.sql(tpch_query(number))

    chaos.check(number, result)
    _assert_killed(chaos, first.pid, first_id)
    second = point.require_hit()
    assert second.handle.pid != first.pid
    _assert_killed(chaos, second.handle.pid, second.executor_id)
    assert len(chaos.registered()) == 1
    # The breakpoint's own actions, should a victim have run on (a rare failure,
    # twice: the second victim's freeze, sent to its process, was taken by its main
    # thread only after the task thread had finished the final task; the kill then
    # took the result with it and the client re-ran the query. ``faults._kill_self``
    # now signals the calling thread).
    assert outputs_recomputed(result, stage=1) > 0, (result.stages, point.actions)
    assert tasks_rerun(result, stage=final) > 0, (result.stages, point.actions)
