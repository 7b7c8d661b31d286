"""Snapshots of the scheduler's state as the REST API's documents.

Everything reads ``SchedulerCore`` through its public methods and each job
record under the record's own lock, so one document shows one moment of a job.
"""

from __future__ import annotations

from collections import Counter

from mangonel.ids import StageId
from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.scheduler.breakdown import (
    JobBreakdown,
    StagePhases,
    job_breakdown,
    split_attempt,
    stage_phases,
)
from mangonel.scheduler.core import SchedulerCore
from mangonel.scheduler.jobs import JobWatch
from mangonel.scheduler.registry import ExecutorListing
from mangonel.scheduler.state_views import StageView
from mangonel.scheduler.telemetry import AttemptOutcome, AttemptRecord
from mangonel.security.auth import ANONYMOUS, HIDDEN_UNHEALTHY, Principal
from mangonel.task import OutputKind
from mangonel.web.models import (
    AttemptModel,
    BreakdownModel,
    ClusterModel,
    ExecutorModel,
    ExecutorTimeModel,
    JobDetail,
    JobSummary,
    PhasesModel,
    StageInputModel,
    StageModel,
    StagePhasesModel,
)


def executor_model(
    entry: ExecutorListing, held: int, now: float, hosts: bool = True
) -> ExecutorModel:
    """One executor; without ``hosts`` (``Principal.sees_hosts``) nothing of its
    host's particulars, as ``scheduler.service_status.executor_status``."""
    view = entry.view
    unhealthy = view.unhealthy if entry.usable else ""
    return ExecutorModel(
        id=view.id,
        state=view.state.value,
        since=view.since,
        reason=view.reason.value if view.reason else "",
        detail=view.detail if hosts else "",
        host=view.host if hosts else "",
        flight_address=view.flight_address,
        pid=entry.pid if hosts else 0,
        slots=view.slots,
        running_tasks=view.running if entry.usable else 0,
        heartbeat_age_s=max(0.0, now - view.last_heartbeat) if entry.usable else 0.0,
        unhealthy=unhealthy if hosts or not unhealthy else HIDDEN_UNHEALTHY,
        shuffle_bytes_held=held if entry.usable else 0,
        excluded_until=view.excluded_until,
        exclusion=view.exclusion,
        slow=view.slow,
        slowness=view.slowness,
        suspected_since=view.suspected_since,
        quarantined_until=view.quarantined_until,
        quarantine=view.quarantine,
        lagging_since=view.lagging_since,
        streams_moved=view.streams_moved,
        slow_link_since=view.slow_link_since,
        slow_link_until=view.slow_link_until,
        slow_link=view.slow_link,
    )


def executors(core: SchedulerCore, who: Principal = ANONYMOUS) -> list[ExecutorModel]:
    """Every executor the scheduler lists: alive and draining first, then lost, newest first."""
    held = core.telemetry.held_bytes()
    now = core.now()
    order = {"alive": 0, "draining": 1, "connecting": 2, "lost": 3}
    models = [executor_model(e, held.get(e.id, 0), now, who.sees_hosts) for e in core.executors()]
    return sorted(models, key=lambda m: (order.get(m.state, 4), -m.since))


def job_state(record: JobWatch) -> str:
    return str(record.state.value)


def output_text(stage: Stage) -> str:
    if stage.output.kind is OutputKind.HASH:
        return f"hash({', '.join(stage.output.keys)}) into {stage.output.partitions} partitions"
    return "single partition"


def _summary_fields(record: JobWatch, now: float) -> dict[str, object]:
    views = record.stage_views()
    total = sum(v.num_tasks for v in views)
    done = sum(min(v.done, v.num_tasks) for v in views)
    final = views[-1] if views else None
    return {
        "id": record.id,
        "owner": record.owner,
        "state": job_state(record),
        "sql": record.sql,
        "submitted_at": record.submitted_wall,
        "elapsed_s": record.elapsed(now),
        "rows": final.rows if final is not None else 0,
        "tasks_total": total,
        "tasks_done": done,
        "tasks_running": sum(v.running for v in views),
        "stages_total": len(views),
        "stages_done": sum(v.done >= v.num_tasks for v in views),
        "progress": (done / total) if total else 1.0,
        "tasks_rerun": sum(v.tasks_rerun for v in views),
        "outputs_recomputed": sum(v.outputs_recomputed for v in views),
        "speculated": sum(v.speculated for v in views),
        "error": record.error,
        "error_type": record.error_type,
    }


def job_summary(record: JobWatch, now: float) -> JobSummary:
    with record.changed:
        return JobSummary.model_validate(_summary_fields(record, now))


def visible_jobs(core: SchedulerCore, caller: Principal) -> list[JobWatch]:
    """The jobs ``caller`` may see: their own, or every one for an admin."""
    return [r for r in core.jobs() if caller.may_see(r.owner)]


def jobs(core: SchedulerCore, caller: Principal = ANONYMOUS) -> list[JobSummary]:
    """Every job the scheduler lists that ``caller`` may see, newest first."""
    now = core.now()
    records = sorted(visible_jobs(core, caller), key=lambda r: r.submitted, reverse=True)
    return [job_summary(r, now) for r in records]


def stage_models(
    plan: DistributedPlan,
    views: tuple[StageView, ...] | None = None,
    elapsed: dict[int, float] | None = None,
    failed: Counter[int] | None = None,
    lost: Counter[int] | None = None,
    phases: dict[StageId, StagePhases] | None = None,
) -> list[StageModel]:
    """The plan's stages with their progress (zeros for a plan that did not run)."""
    by_id = {v.id: v for v in views or ()}
    phases = phases or {}
    models = []
    for stage in plan.stages:
        v = by_id.get(stage.id)
        models.append(
            StageModel(
                id=int(stage.id),
                label=stage.label,
                num_tasks=v.num_tasks if v else stage.num_tasks,
                planned_tasks=v.planned_tasks if v else None,
                done=v.done if v else 0,
                running=v.running if v else 0,
                pending=v.pending if v else stage.num_tasks,
                failed=(failed or Counter())[int(stage.id)],
                lost=(lost or Counter())[int(stage.id)],
                attempts=v.attempts_launched if v else 0,
                tasks_rerun=v.tasks_rerun if v else 0,
                outputs_recomputed=v.outputs_recomputed if v else 0,
                speculated=v.speculated if v else 0,
                speculation_won=v.speculation_won if v else 0,
                speculation_lost=v.speculation_lost if v else 0,
                rows=v.rows if v else 0,
                bytes=v.bytes if v else 0,
                elapsed_s=(elapsed or {}).get(int(stage.id), 0.0),
                output=output_text(stage),
                inputs=[
                    StageInputModel(stage=int(i.stage), name=i.name, mode=i.mode.value)
                    for i in stage.inputs
                ],
                scan_table=stage.scan.table if stage.scan is not None else None,
                side_tables=[s.table for s in stage.side_scans if len(s.task_splits) == 1],
                ranged_tables=[s.table for s in stage.side_scans if len(s.task_splits) > 1],
                sql=stage.sql,
                final=stage is plan.final,
                phases=stage_phases_model(phases[stage.id]) if stage.id in phases else None,
            )
        )
    return models


def stage_phases_model(p: StagePhases) -> StagePhasesModel:
    return StagePhasesModel(
        **{f"{name}_s": value for name, value in p.seconds.items()},
        tasks=p.tasks,
        executors=p.executors,
        task_median_s=p.task_median_s,
        task_max_s=p.task_max_s,
        skew=p.skew,
        fetched_local_bytes=p.fetched_local_bytes,
        fetched_remote_bytes=p.fetched_remote_bytes,
        fetch_remote_s=p.fetch_remote_s,
        write_io_s=p.write_io_s,
    )


def attempt_phases(record: AttemptRecord) -> PhasesModel | None:
    t = record.timings
    if t is None or record.reported_wall is None:
        return None
    parts = split_attempt(record, record.reported_wall)
    return PhasesModel(
        **{f"{name}_s": value for name, value in parts.items()},
        fetched_local_bytes=t.fetched_local_bytes,
        fetched_remote_bytes=t.fetched_remote_bytes,
        fetch_remote_s=t.fetch_remote_s,
        write_io_s=t.write_io_s,
    )


def breakdown_model(b: JobBreakdown) -> BreakdownModel:
    return BreakdownModel(
        window_s=b.window_s,
        planning_s=b.planning_s,
        slots=b.slots,
        capacity_s=b.capacity_s,
        seconds=b.seconds,
        executors=[
            ExecutorTimeModel(
                executor=e.executor,
                slots=e.slots,
                attempts=e.attempts,
                busy_s=e.busy_s,
                **{f"idle_{reason}_s": value for reason, value in e.idle_s.items()},
            )
            for e in b.executors
        ],
    )


def attempt_model(record: AttemptRecord) -> AttemptModel:
    task = record.attempt.task
    return AttemptModel(
        stage=int(task.stage),
        partition=task.partition,
        attempt=record.attempt.attempt,
        executor=record.executor,
        kind=record.kind.value,
        state=record.outcome.value,
        launched_at=record.launched_wall,
        elapsed_s=record.elapsed_s,
        reason=record.reason,
        rows=record.rows,
        bytes=record.bytes,
        output_lost=record.output_lost,
        phases=attempt_phases(record),
    )


def job_detail(core: SchedulerCore, record: JobWatch) -> JobDetail:
    now = core.now()
    attempts, dropped = core.telemetry.attempts(record.id)
    failed: Counter[int] = Counter(
        int(a.attempt.task.stage) for a in attempts if a.outcome is AttemptOutcome.FAILED
    )
    lost: Counter[int] = Counter(
        int(a.attempt.task.stage) for a in attempts if a.outcome is AttemptOutcome.LOST
    )
    # The cluster's slots: those of the executors alive now, and of those that ran
    # attempts of the job (lost since, they held slots then).
    ran = {a.executor for a in attempts}
    slots = {e.view.id: e.view.slots for e in core.executors() if e.usable or e.view.id in ran}
    with record.changed:
        fields = _summary_fields(record, now)
        views = record.stage_views()
        end = record.finished if record.finished is not None else now
        elapsed = {}
        for v in views:
            timing = record.timing.get(v.id)
            if timing is not None:
                elapsed[int(v.id)] = timing.elapsed(end, complete=v.done >= v.num_tasks)
        stages = stage_models(record.plan, views, elapsed, failed, lost, stage_phases(attempts))
        fallback = record.plan.fallback
        planning_s, submitted_wall, run_s = (
            record.planning_s,
            record.submitted_wall,
            record.elapsed(now),
        )
    breakdown = job_breakdown(attempts, slots, submitted_wall, run_s, planning_s)
    return JobDetail.model_validate(
        {
            **fields,
            "stages": stages,
            "attempts": [attempt_model(a) for a in attempts],
            "attempts_not_kept": dropped,
            "planning_s": planning_s,
            "fallback": fallback,
            "breakdown": breakdown_model(breakdown),
        }
    )


def cluster(
    core: SchedulerCore, scheduler_address: str, caller: Principal = ANONYMOUS
) -> ClusterModel:
    """Counts of executors, and of the jobs ``caller`` may see, by state."""
    entries = core.executors()
    by_state = Counter({"alive": 0, "draining": 0, "lost": 0})
    by_state.update(e.view.state.value for e in entries)
    jobs_by_state = Counter({"running": 0, "succeeded": 0, "failed": 0, "cancelled": 0})
    jobs_by_state.update(job_state(r) for r in visible_jobs(core, caller))
    return ClusterModel(
        scheduler_address=scheduler_address,
        executors=dict(by_state),
        jobs=dict(jobs_by_state),
        slots=sum(e.view.slots for e in entries if e.usable),
        running_tasks=sum(e.view.running for e in entries if e.usable),
    )
