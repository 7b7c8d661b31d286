"""The gRPC services' answers built from the core's records: job, stage,
executor and table status messages (``mangonel.proto``'s ``JobStatus``,
``ExecutorStatus``, ``TableInfo``), as ``WatchJob``, ``ClusterStatus`` and the
catalog calls of ``service.QueryService`` send them.
"""

from __future__ import annotations

from collections.abc import Mapping

from mangonel.catalog import Table
from mangonel.ids import StageId
from mangonel.proto import convert
from mangonel.proto import mangonel_pb2 as pb
from mangonel.scheduler.breakdown import StagePhases
from mangonel.scheduler.jobs import JobWatch
from mangonel.scheduler.registry import ExecutorListing
from mangonel.scheduler.state_views import ExecutorState, JobState, StageView
from mangonel.security.auth import HIDDEN_UNHEALTHY

_JOB_STATE = {
    JobState.QUEUED: pb.JOB_STATE_RUNNING,  # the wire has no queued state
    JobState.RUNNING: pb.JOB_STATE_RUNNING,
    JobState.SUCCEEDED: pb.JOB_STATE_SUCCEEDED,
    JobState.FAILED: pb.JOB_STATE_FAILED,
    JobState.CANCELLED: pb.JOB_STATE_CANCELLED,
}
_EXECUTOR_STATE = {
    ExecutorState.CONNECTING: pb.EXECUTOR_STATE_CONNECTING,
    ExecutorState.ALIVE: pb.EXECUTOR_STATE_ALIVE,
    ExecutorState.DRAINING: pb.EXECUTOR_STATE_DRAINING,
    ExecutorState.LOST: pb.EXECUTOR_STATE_LOST,
}


def table_info(table: Table) -> pb.TableInfo:
    return pb.TableInfo(
        name=table.name,
        location=table.location,
        columns=[pb.Column(name=f.name, type=str(f.type)) for f in table.schema],
        rows=table.rows,
        bytes=table.bytes,
        files=list(table.files),
        format=table.format.value,
    )


def attach_result_files(msg: pb.JobStatus, record: JobWatch) -> None:
    """Put the result files the scheduler holds into the status's locations."""
    with record.changed:
        for loc in msg.result:
            data = record.result_files.get(loc.path)
            if data:
                loc.data = data


def job_status(
    record: JobWatch,
    now: float,
    with_result: bool,
    phases: Mapping[StageId, StagePhases] | None = None,
) -> pb.JobStatus:
    """A snapshot of a job: the state machine's counters, the shell's times, and
    where each stage's task time went (``phases``, given for a finished job's
    final status: ``mangonel sql --stages`` shows them).

    Takes the record's lock so that the counters are of one moment.
    """
    phases = phases or {}
    with record.changed:
        views = record.stage_views()
        stages = [
            pb.StageStatus(
                stage=int(v.id),
                label=v.label,
                tasks_total=v.num_tasks,
                tasks_done=v.done,
                tasks_running=v.running,
                tasks_pending=v.pending,
                rows=v.rows,
                bytes=v.bytes,
                elapsed_s=_stage_elapsed(record, v, now),
                attempts=v.attempts_launched,
                tasks_rerun=v.tasks_rerun,
                outputs_recomputed=v.outputs_recomputed,
                tasks_planned=v.planned_tasks or 0,
                phases=stage_phases_to_proto(phases.get(v.id)),
            )
            for v in views
        ]
        msg = pb.JobStatus(
            job_id=record.id,
            state=_JOB_STATE[record.state],
            sql=record.sql,
            columns=list(record.plan.columns),
            stages=stages,
            submitted_at=record.submitted_wall,
            elapsed_s=record.elapsed(now),
            error=record.error,
            error_type=record.error_type,
            tasks_rerun=sum(v.tasks_rerun for v in views),
            outputs_recomputed=sum(v.outputs_recomputed for v in views),
            owner=record.owner,
            took_effect=record.plan.took_effect,
        )
        if with_result:
            msg.result.extend(convert.partition_location_to_proto(loc) for loc in record.result)
        return msg


def stage_phases_to_proto(p: StagePhases | None) -> pb.StagePhases | None:
    if p is None:
        return None
    return pb.StagePhases(
        tasks=p.tasks,
        executors=p.executors,
        **{f"{name}_s": value for name, value in p.seconds.items()},
        task_median_s=p.task_median_s,
        task_max_s=p.task_max_s,
        fetched_local_bytes=p.fetched_local_bytes,
        fetched_remote_bytes=p.fetched_remote_bytes,
        fetch_remote_s=p.fetch_remote_s,
        write_io_s=p.write_io_s,
    )


def _stage_elapsed(record: JobWatch, view: StageView, now: float) -> float:
    timing = record.timing.get(view.id)
    if timing is None:
        return 0.0
    end = record.finished if record.finished is not None else now
    return timing.elapsed(end, complete=view.done >= view.num_tasks)


def executor_status(entry: ExecutorListing, now: float, hosts: bool = True) -> pb.ExecutorStatus:
    """One executor; ``now`` is the shell's clock (for the heartbeat age); without
    ``hosts`` (``Principal.sees_hosts``) nothing of its host's particulars."""
    view = entry.view
    unhealthy = view.unhealthy if entry.usable else ""
    return pb.ExecutorStatus(
        id=view.id,
        host=view.host if hosts else "",
        flight_address=view.flight_address,
        slots=view.slots,
        pid=entry.pid if hosts else 0,
        state=_EXECUTOR_STATE[view.state],
        since=view.since,
        reason=view.reason.value if view.reason else "",
        detail=view.detail if hosts else "",
        running_tasks=view.running,
        heartbeat_age_s=max(0.0, now - view.last_heartbeat) if entry.usable else 0.0,
        unhealthy=unhealthy if hosts or not unhealthy else HIDDEN_UNHEALTHY,
        slow_link_since=view.slow_link_since or 0.0,
        slow_link_until=view.slow_link_until or 0.0,
        slow_link=view.slow_link if hosts else "",
        lagging_since=view.lagging_since or 0.0,
    )
