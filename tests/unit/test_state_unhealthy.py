"""The scheduler and an unhealthy executor (its work directory full): no task is
placed on it until a heartbeat clears it; its outputs stay usable meanwhile; a
task that runs out of memory on every attempt fails its job with that message."""

from __future__ import annotations

from test_state_machine import E1, E2, J1, Harness, att, launches, three_stage_plan

from mangonel.scheduler.events import ExecutorHeartbeat, JobFailed, Limits
from mangonel.task import ExecutionError, ExecutionProblem

FULL = "work directory /w is full (1.0 MiB free now of 64.0 MiB; it needs 3.2 MiB)"


def test_no_task_goes_to_an_unhealthy_executor_until_it_is_healthy() -> None:
    h = Harness()
    h.register(E1, 2)
    h.register(E2, 2)
    assert h.send(ExecutorHeartbeat, E1, FULL) == []
    view = {v.id: v for v in h.state.executors()}
    assert view[E1].unhealthy == FULL and view[E2].unhealthy == ""
    # Four scan tasks, two slots free: all on e2 first, the rest wait.
    assert launches(h.submit(three_stage_plan(maps=4, reducers=1))) == [
        ("e2", "j1/s1/p0/a0"),
        ("e2", "j1/s1/p1/a0"),
    ]
    # e1 says it is healthy again: the waiting tasks go there at once.
    assert launches(h.send(ExecutorHeartbeat, E1, "")) == [
        ("e1", "j1/s1/p2/a0"),
        ("e1", "j1/s1/p3/a0"),
    ]
    # A heartbeat that says nothing of health (an older executor) changes nothing.
    h.send(ExecutorHeartbeat, E2)
    assert all(v.unhealthy == "" for v in h.state.executors())


def test_a_disk_full_failure_runs_again_on_another_executor() -> None:
    h = Harness(Limits(max_task_attempts=3))
    h.register(E1, 1)
    h.register(E2, 1)
    assert launches(h.submit(three_stage_plan(maps=2, reducers=1))) == [
        ("e1", "j1/s1/p0/a0"),
        ("e2", "j1/s1/p1/a0"),
    ]
    assert launches(h.complete(att(1, 1), E2)) == []
    # The executor says it is unhealthy before it reports the failure.
    h.send(ExecutorHeartbeat, E1, FULL)
    full = ExecutionError("disk full: no space left", ExecutionProblem.DISK_FULL)
    assert launches(h.fail(att(1, 0), E1, full)) == [("e2", "j1/s1/p0/a1")]


def test_out_of_memory_on_every_attempt_fails_the_job_saying_so() -> None:
    h = Harness(Limits(max_task_attempts=2))
    h.register(E1, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    oom = ExecutionError(
        "out of memory: the task needed more than its slot's share, 64.0 MiB of the "
        "executor's 512.0 MiB (--memory) over 4 slots",
        ExecutionProblem.OUT_OF_MEMORY,
    )
    assert launches(h.fail(att(1, 0), E1, oom)) == [("e1", "j1/s1/p0/a1")]
    cmds = h.fail(att(1, 0, 1), E1, oom)
    failed = [c for c in cmds if isinstance(c, JobFailed)]
    assert len(failed) == 1 and failed[0].job == J1
    assert "failed 2 attempts" in failed[0].message
    assert "out of memory" in failed[0].message and "512.0 MiB (--memory)" in failed[0].message
