"""The scheduler simulator (``mangonel.testing.scheduler_sim``) at a small size.

It must keep running as the state machine changes: every job finishes, the
executors it loses are recovered from (their outputs made again), and the
figures it reports are sane. The scale itself is measured by
``benchmarks/scheduler_sim.py``, not here; here every event is followed by
``SchedulerState.validate`` (``SimConfig.validate``).
"""

from __future__ import annotations

from mangonel.scheduler.persist import read_snapshot
from mangonel.testing.scheduler_sim import SimConfig, Simulator, simulate, synthetic_plan


def test_a_small_cluster_finishes_every_job_and_recovers_from_its_losses() -> None:
    cfg = SimConfig(
        executors=6,
        slots=2,
        tasks_per_job=300,
        jobs=4,
        concurrent_jobs=2,
        losses=3,
        validate=True,
    )
    result = simulate(cfg)
    assert result.complete
    assert (result.jobs_succeeded, result.jobs_failed) == (4, 0)
    # Every task ran at least once; lost executors' finished outputs ran again.
    tasks = cfg.jobs * sum(s.num_tasks for s in synthetic_plan(300, cfg.partitions).stages)
    assert result.task_events >= tasks
    assert len(result.loss_seconds) == 3
    assert result.jobs_failed_at_loss == [0, 0, 0]
    summary = result.summary()
    assert summary["losses_failing_jobs"] == 0
    assert summary["loss_ms_max_failing_no_job"] == summary["loss_ms_max"]
    if sum(result.outputs_at_loss) > 0:
        assert result.task_events > tasks
    assert result.events_per_s > 0 and result.task_store_bytes > 0
    assert 0 < result.store_bytes_per_event <= result.task_store_max_bytes


def test_the_store_it_writes_reads_back_and_holds_no_finished_job_progress() -> None:
    sim = Simulator(
        SimConfig(executors=3, slots=2, tasks_per_job=50, jobs=2, losses=1, validate=True)
    )
    result = sim.run()
    assert result.complete and result.jobs_succeeded == 2
    snap = read_snapshot(sim.store.load(), "sim")
    assert [j.outcome is not None and j.progress is None for j in snap.jobs] == [True, True]
    assert snap.executors is not None and len(snap.executors.live) == 3


def test_the_synthetic_plan_has_the_tasks_asked_for() -> None:
    for tasks in (10, 1000):
        plan = synthetic_plan(tasks, 4)
        assert sum(s.num_tasks for s in plan.stages) == tasks
        assert plan.final.num_tasks == 1
