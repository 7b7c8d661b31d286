"""Unit tests of the scheduler's pure state machine (``scheduler.state``).

Every test drives ``SchedulerState.handle`` with hand-built events and compares
the exact commands it returns: no processes, no sleeps, no clock.

The usual plan (``three_stage_plan``)::

    stage 1  scan t, HASH(k) into R partitions, M tasks
    stage 2  R tasks, PARTITION input from stage 1, SINGLE output
    stage 3  1 task, ALL input from stage 2, SINGLE output (the result)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.plan.physical import DistributedPlan, ScanInput, Stage, StageInput
from mangonel.scheduler.events import (
    CancelRequested,
    Command,
    DeclareExecutorLost,
    Event,
    ExecutorConnected,
    ExecutorDraining,
    ExecutorHeartbeat,
    ExecutorLost,
    ExecutorRegistered,
    HealthChange,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    JobSucceeded,
    Limits,
    LogExecutorHealth,
    LogRejectedFragment,
    LossReason,
    RefuseHeartbeat,
    RefuseStream,
    TaskCompleted,
    TaskFailed,
    Tick,
)
from mangonel.scheduler.state import ExecutorState, JobState, SchedulerState
from mangonel.task import (
    CancelTask,
    ExecutionError,
    ExecutorInfo,
    FetchFailed,
    FileSplit,
    FragmentRejected,
    InputLocations,
    InputMode,
    LaunchTask,
    OutputKind,
    OutputSpec,
    PartitionLocation,
    PartitionOutput,
    QueryError,
    ReleaseOutputs,
    ScanSpec,
    TaskFailure,
)

E1, E2, E3 = ExecutorId("e1"), ExecutorId("e2"), ExecutorId("e3")
J1, J2 = JobId("j1"), JobId("j2")
S1, S2, S3 = StageId(1), StageId(2), StageId(3)
SINGLE = OutputSpec(OutputKind.SINGLE)
OUTPUT_BYTES = 64 * 1024 * 1024
"""Bytes of every output partition the harness reports: a planned partition's
size (``defaults.ADAPTIVE_PARTITION_BYTES``), so adaptive execution keeps each
plan's tasks as planned here; ``test_state_adaptive`` reports small ones."""

# ----------------------------------------------------------------------- helpers


def three_stage_plan(maps: int = 4, reducers: int = 2) -> DistributedPlan:
    splits = tuple((FileSplit(f"/data/t/{i}.parquet", (0,), rows=100),) for i in range(maps))
    scan = Stage(
        id=S1,
        sql="SELECT k, v FROM t",
        output=OutputSpec(OutputKind.HASH, reducers, ("k",)),
        num_tasks=maps,
        columns=("k", "v"),
        scan=ScanInput("t", "t", ("k", "v"), splits),
        label="scan t",
    )
    agg = Stage(
        id=S2,
        sql="SELECT k, sum(v) AS s FROM s1 GROUP BY k",
        output=SINGLE,
        num_tasks=reducers,
        columns=("k", "s"),
        inputs=(StageInput("s1", S1, InputMode.PARTITION),),
        label="final agg",
    )
    sort = Stage(
        id=S3,
        sql="SELECT * FROM s2 ORDER BY k",
        output=SINGLE,
        num_tasks=1,
        columns=("k", "s"),
        inputs=(StageInput("s2", S2, InputMode.ALL),),
        label="sort",
    )
    return DistributedPlan((scan, agg, sort), columns=("k", "s"), sql="SELECT ...")


def test_each_task_gets_its_own_row_groups_of_a_join_by_key_range() -> None:
    # A side scan with one group of splits per task (a join by key range) gives task
    # i its group i; one with a single group gives every task that group.
    h = Harness()
    h.register(E1, 4)
    plan = three_stage_plan(maps=3, reducers=1)
    ranged = tuple((FileSplit("/data/u.parquet", (i,), rows=10),) for i in range(3))
    whole = ((FileSplit("/data/small.parquet", (), rows=5),),)
    sides = (ScanInput("__scan1", "u", ("k",), ranged), ScanInput("__scan2", "w", ("x",), whole))
    stages = (dataclasses.replace(plan.stages[0], side_scans=sides), *plan.stages[1:])
    cmds = h.submit(dataclasses.replace(plan, stages=stages))
    specs = [c.task for c in cmds if isinstance(c, LaunchTask)]
    assert [s.attempt.task.partition for s in specs] == [0, 1, 2]
    for i, spec in enumerate(specs):
        assert [(scan.name, scan.splits) for scan in spec.scans[1:]] == [
            ("__scan1", ranged[i]),
            ("__scan2", whole[0]),
        ]


def test_every_task_of_a_job_names_the_files_of_every_table_the_job_scans() -> None:
    # One scan database per executor slot serves the whole job: each task carries the
    # job's files (its own scan's, the side scans' of any task, each once, sorted),
    # also a task of a stage that scans nothing itself.
    h = Harness()
    h.register(E1, 8)
    plan = three_stage_plan(maps=3, reducers=2)
    ranged = tuple((FileSplit("/data/u.parquet", (i,), rows=10),) for i in range(3))
    whole = ((FileSplit("/data/small.parquet", (), rows=5),),)
    sides = (ScanInput("__scan1", "u", ("k",), ranged), ScanInput("__scan2", "w", ("x",), whole))
    stages = (dataclasses.replace(plan.stages[0], side_scans=sides), *plan.stages[1:])
    specs = [c.task for c in h.submit(dataclasses.replace(plan, stages=stages))
             if isinstance(c, LaunchTask)]  # fmt: skip
    expected = (
        "/data/small.parquet",
        "/data/t/0.parquet",
        "/data/t/1.parquet",
        "/data/t/2.parquet",
        "/data/u.parquet",
    )
    assert len(specs) == 3
    assert {s.job_files for s in specs} == {expected}
    # Task 0 reads t/0 and u's range 0 itself, yet may read the rest of the job's.
    assert {split.path for scan in specs[0].scans for split in scan.splits} == {
        "/data/t/0.parquet",
        "/data/u.parquet",
        "/data/small.parquet",
    }
    cmds = finish_maps(h, {0: E1, 1: E1, 2: E1})
    reducers = [c.task for c in cmds if isinstance(c, LaunchTask)]
    assert reducers and all(r.job_files == expected and not r.scans for r in reducers)


def two_stage_plan(maps: int, finals: int, mode: InputMode) -> DistributedPlan:
    """Scan (HASH into ``finals`` partitions) -> final stage reading it with ``mode``."""
    plan = three_stage_plan(maps, finals)
    final = Stage(
        id=S2,
        sql="SELECT * FROM s1",
        output=SINGLE,
        num_tasks=finals,
        columns=("k", "v"),
        inputs=(StageInput("s1", S1, mode),),
    )
    return DistributedPlan((plan.stages[0], final), columns=("k", "v"))


def att(stage: int, partition: int, attempt: int = 0, job: JobId = J1) -> TaskAttemptId:
    return TaskAttemptId(TaskId(job, StageId(stage), partition), attempt)


def launches(commands: Sequence[Command]) -> list[tuple[str, str]]:
    """``LaunchTask``s as ``(executor, attempt)`` strings, e.g. ``("e1", "j1/s1/p0/a0")``."""
    return [(c.executor, str(c.task.attempt)) for c in commands if isinstance(c, LaunchTask)]


class Harness:
    """Feeds events with increasing ids at a settable time, checking the state's
    invariants after each; remembers the plans."""

    def __init__(self, limits: Limits | None = None, **kwargs: float) -> None:
        self.state = SchedulerState(limits or Limits(), **kwargs)
        self.now = 0.0
        self.last_id = 0
        self.plans: dict[JobId, DistributedPlan] = {}

    def send(self, make: type[Event], *args: object, **kwargs: object) -> list[Command]:
        """Handle one event, then check every invariant of the state (``validate``)."""
        self.last_id += 1
        event = make(self.last_id, self.now, *args, **kwargs)
        commands = self.state.handle(event)
        assert all(c.cause == self.last_id for c in commands), commands
        self.state.validate()
        return commands

    def register(self, executor: ExecutorId, slots: int = 4) -> list[Command]:
        """Register ``executor`` and open its stream: the commands of both."""
        n = executor[1:]
        info = ExecutorInfo(executor, f"h{n}", f"h{n}:50{n}", slots)
        return self.send(ExecutorRegistered, info) + self.send(ExecutorConnected, executor)

    def submit(self, plan: DistributedPlan, job: JobId = J1) -> list[Command]:
        self.plans[job] = plan
        return self.send(JobSubmitted, job, plan)

    def outputs(self, attempt: TaskAttemptId, executor: ExecutorId) -> tuple[PartitionOutput, ...]:
        stage = self.plans[attempt.task.job].stage(attempt.task.stage)
        return tuple(
            PartitionOutput(p, f"/w/{executor}/{attempt}/{p}.arrow", 10, OUTPUT_BYTES, f"c{p}")
            for p in range(stage.output.partitions)
        )

    def loc(
        self, attempt: TaskAttemptId, executor: ExecutorId, partition: int
    ) -> PartitionLocation:
        """Where ``complete(attempt, executor)`` put output ``partition``."""
        n = executor[1:]
        return PartitionLocation(
            executor=executor,
            host=f"h{n}",
            flight_address=f"h{n}:50{n}",
            stage=attempt.task.stage,
            map_partition=attempt.task.partition,
            partition=partition,
            path=f"/w/{executor}/{attempt}/{partition}.arrow",
            rows=10,
            bytes=OUTPUT_BYTES,
            checksum=f"c{partition}",
        )

    def complete(self, attempt: TaskAttemptId, executor: ExecutorId) -> list[Command]:
        return self.send(TaskCompleted, attempt, executor, self.outputs(attempt, executor))

    def fail(
        self, attempt: TaskAttemptId, executor: ExecutorId, failure: TaskFailure
    ) -> list[Command]:
        return self.send(TaskFailed, attempt, executor, failure)

    def lose(
        self, executor: ExecutorId, reason: LossReason = LossReason.CONNECTION_LOST
    ) -> list[Command]:
        """The loss's commands after the ``DeclareExecutorLost`` that answers it
        (first, and only for an executor that was live)."""
        view = self.state.executor(executor)
        live = view is not None and view.state in (ExecutorState.ALIVE, ExecutorState.DRAINING)
        cmds = self.send(ExecutorLost, executor, reason, "socket closed")
        declared = [c for c in cmds if isinstance(c, DeclareExecutorLost)]
        if not live:
            assert declared == []
            return cmds
        assert cmds[0] == declared[0]
        assert (declared[0].cause, declared[0].executor) == (self.last_id, executor)
        return cmds[1:]

    def tick(self, at: float) -> list[Command]:
        self.now = at
        return self.send(Tick)


def started(maps: int = 4, reducers: int = 2, slots: int = 4) -> Harness:
    """e1 and e2 registered, j1 submitted: stage 1 runs p0, p2 on e1 and p1, p3 on e2."""
    h = Harness()
    h.register(E1, slots)
    h.register(E2, slots)
    h.submit(three_stage_plan(maps, reducers))
    return h


def finish_maps(h: Harness, placement: dict[int, ExecutorId]) -> list[Command]:
    commands: list[Command] = []
    for p, executor in placement.items():
        commands = h.complete(att(1, p), executor)
    return commands


# -------------------------------------------------------------------- happy path


def test_happy_path_launches_spreads_and_succeeds() -> None:
    h = Harness()
    assert h.register(E1, 2) == []
    assert h.register(E2, 2) == []
    plan = three_stage_plan(maps=4, reducers=2)
    cmds = h.submit(plan)
    # The whole map stage goes out in one batch, alternating between executors.
    assert launches(cmds) == [
        ("e1", "j1/s1/p0/a0"),
        ("e2", "j1/s1/p1/a0"),
        ("e1", "j1/s1/p2/a0"),
        ("e2", "j1/s1/p3/a0"),
    ]
    spec = cmds[2]
    assert isinstance(spec, LaunchTask)
    scan = plan.stages[0].scan
    assert scan is not None
    assert spec.task.sql == "SELECT k, v FROM t"
    assert spec.task.output == plan.stages[0].output
    assert spec.task.columns == ("k", "v")
    assert spec.task.scans == (ScanSpec("t", "t", ("k", "v"), scan.task_splits[2]),)
    assert spec.task.inputs == ()
    assert not spec.task.result  # not the final stage: its output is no result
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.RUNNING

    assert h.complete(att(1, 0), E1) == []
    assert h.complete(att(1, 1), E2) == []
    assert h.complete(att(1, 3), E2) == []
    cmds = h.complete(att(1, 2), E1)
    assert launches(cmds) == [("e1", "j1/s2/p0/a0"), ("e2", "j1/s2/p1/a0")]
    reducer = cmds[1]
    assert isinstance(reducer, LaunchTask)
    placed = {0: E1, 1: E2, 2: E1, 3: E2}
    assert reducer.task.inputs == (
        InputLocations(
            name="s1",
            stage=S1,
            mode=InputMode.PARTITION,
            locations=tuple(h.loc(att(1, m), placed[m], 1) for m in range(4)),
            columns=("k", "v"),
        ),
    )
    assert reducer.task.scans == () and not reducer.task.result

    assert h.complete(att(2, 1), E2) == []
    cmds = h.complete(att(2, 0), E1)
    assert launches(cmds) == [("e1", "j1/s3/p0/a0")]
    final = cmds[0]
    assert isinstance(final, LaunchTask)
    assert final.task.inputs[0].locations == (
        h.loc(att(2, 0), E1, 0),
        h.loc(att(2, 1), E2, 0),
    )
    assert final.task.inputs[0].mode is InputMode.ALL
    assert final.task.result  # the job's result: a small one goes with the report

    cmds = h.complete(att(3, 0), E1)
    assert cmds == [
        JobSucceeded(h.last_id, J1, (h.loc(att(3, 0), E1, 0),)),
        ReleaseOutputs(h.last_id, E1, J1, (S1, S2)),
        ReleaseOutputs(h.last_id, E2, J1, (S1, S2)),
    ]
    view = h.state.job(J1)
    assert view is not None
    assert view.state is JobState.SUCCEEDED and view.error is None
    assert [(s.id, s.done, s.running, s.pending, s.attempts_launched) for s in view.stages] == [
        (S1, 4, 0, 0, 4),
        (S2, 2, 0, 0, 2),
        (S3, 1, 0, 0, 1),
    ]
    assert view.tasks_rerun == 0 and view.outputs_recomputed == 0
    # A finished job ignores anything else said about it.
    assert h.complete(att(3, 0), E1) == []


def test_slots_are_respected_and_freed_slots_reused() -> None:
    h = Harness()
    h.register(E1, 1)
    h.register(E2, 2)
    cmds = h.submit(three_stage_plan(maps=5, reducers=1))
    # Least loaded by fraction of slots in use: e1 (0/1), e2 (0/2), e2 (1/2); then full.
    assert launches(cmds) == [
        ("e1", "j1/s1/p0/a0"),
        ("e2", "j1/s1/p1/a0"),
        ("e2", "j1/s1/p2/a0"),
    ]
    assert h.state.running_attempts(E2) == [att(1, 1), att(1, 2)]
    assert launches(h.complete(att(1, 1), E2)) == [("e2", "j1/s1/p3/a0")]
    assert launches(h.complete(att(1, 0), E1)) == [("e1", "j1/s1/p4/a0")]
    assert [(v.id, v.running) for v in h.state.executors()] == [("e1", 1), ("e2", 2)]


def test_all_input_is_ordered_by_map_then_partition() -> None:
    h = Harness()
    h.register(E1)
    h.register(E2)
    h.submit(two_stage_plan(maps=2, finals=2, mode=InputMode.ALL))
    h.complete(att(1, 1), E2)
    cmds = h.complete(att(1, 0), E1)
    assert launches(cmds) == [("e1", "j1/s2/p0/a0"), ("e2", "j1/s2/p1/a0")]
    expected = (
        h.loc(att(1, 0), E1, 0),
        h.loc(att(1, 0), E1, 1),
        h.loc(att(1, 1), E2, 0),
        h.loc(att(1, 1), E2, 1),
    )
    for cmd in cmds:
        assert isinstance(cmd, LaunchTask)
        assert cmd.task.inputs[0].locations == expected


def test_job_waits_queued_without_executors_then_runs() -> None:
    h = Harness()
    assert h.submit(three_stage_plan(maps=2)) == []
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.QUEUED
    assert launches(h.register(E1)) == [("e1", "j1/s1/p0/a0"), ("e1", "j1/s1/p1/a0")]


# ---------------------------------------------------------------------- failures


def test_query_error_fails_job_at_once() -> None:
    h = Harness()
    h.register(E1, 2)
    h.register(E2, 1)
    h.submit(three_stage_plan(maps=3))
    h.complete(att(1, 1), E2)
    cmds = h.fail(att(1, 0), E1, QueryError("Binder Error: column x not found"))
    assert len(cmds) == 4
    assert cmds[0] == CancelTask(h.last_id, E1, att(1, 2))
    failed = cmds[1]
    assert isinstance(failed, JobFailed) and failed.job == J1
    assert "j1/s1/p0/a0" in failed.message and "e1" in failed.message
    assert "column x not found" in failed.message
    # Wherever an attempt ran: e1 ran p0 and the cancelled p2, e2 holds p1.
    assert cmds[2:] == [
        ReleaseOutputs(h.last_id, E1, J1, None),
        ReleaseOutputs(h.last_id, E2, J1, None),
    ]
    assert h.state.running_attempts(E1) == []
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.FAILED
    assert view.error == failed.message
    # The cancelled attempt's late report changes nothing but what it wrote,
    # released again (the first release may not have reached it: it may have
    # written after, the cancel lost in a cut; simulation seed 904345).
    assert h.complete(att(1, 2), E1) == [ReleaseOutputs(h.last_id, E1, J1, None)]
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.FAILED
    assert h.state.running_attempts(E1) == []


def test_a_rejected_fragment_fails_the_job_as_an_internal_error() -> None:
    # DuckDB's binder refused stage 2's SQL: the planner wrote it, and the query
    # bound as a whole, so the user is told it is mangonel's bug, not theirs, and
    # the shell logs the SQL a report needs.
    h = Harness()
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.complete(att(1, 0), E1)
    error = 'Binder Error: Referenced table "store" not found!'
    cmds = h.fail(att(2, 0), E1, FragmentRejected(error))
    logged, failed = cmds[0], cmds[1]
    stage_sql = "SELECT k, sum(v) AS s FROM s1 GROUP BY k"
    assert logged == LogRejectedFragment(
        h.last_id, J1, S2, att(2, 0), error, stage_sql, "SELECT ..."
    )
    assert isinstance(failed, JobFailed) and failed.job == J1
    assert failed.message.startswith("internal error:")
    assert "stage 2" in failed.message and error in failed.message
    assert "bug in mangonel, not in the query" in failed.message
    assert "report it" in failed.message
    assert "cannot run as written" not in failed.message
    assert cmds[2:] == [ReleaseOutputs(h.last_id, E1, J1, None)]
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.FAILED
    assert view.error == failed.message
    assert view.stages[1].attempts_launched == 1  # not retried


def test_execution_error_is_retried_with_new_attempt_numbers() -> None:
    h = Harness(Limits(max_task_attempts=3))
    h.register(E1, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    cmds = h.fail(att(1, 0), E1, ExecutionError("out of memory"))
    assert launches(cmds) == [("e1", "j1/s1/p0/a1")]
    cmds = h.fail(att(1, 0, 1), E1, ExecutionError("out of memory"))
    assert launches(cmds) == [("e1", "j1/s1/p0/a2")]
    assert launches(h.complete(att(1, 0, 2), E1)) == [("e1", "j1/s2/p0/a0")]
    view = h.state.job(J1)
    assert view is not None
    assert (view.stages[0].attempts_launched, view.stages[0].tasks_rerun) == (3, 2)


def test_execution_error_exhausted_names_task_executors_reason_attempts() -> None:
    h = Harness(Limits(max_task_attempts=3))
    h.register(E1, 1)
    h.register(E2, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    # A lost executor counts as a failed attempt too.
    assert launches(h.lose(E1)) == [("e2", "j1/s1/p0/a1")]
    assert launches(h.fail(att(1, 0, 1), E2, ExecutionError("disk full"))) == [
        ("e2", "j1/s1/p0/a2")
    ]
    cmds = h.fail(att(1, 0, 2), E2, ExecutionError("disk full"))
    assert len(cmds) == 2 and isinstance(cmds[0], JobFailed)
    assert cmds[1] == ReleaseOutputs(h.last_id, E2, J1, None)  # its failed attempts' files
    msg = cmds[0].message
    assert "task j1/s1/p0 failed 3 attempts" in msg
    assert "on executor(s) e1, e2; last error: disk full" in msg
    assert "max_task_attempts" in msg


# ---------------------------------------------------------------------- recovery


def test_loss_before_map_stage_completes_reruns_lost_tasks_only() -> None:
    h = started()
    h.complete(att(1, 0), E1)
    h.complete(att(1, 1), E2)
    # e1 ran p2 and held p0's output: both run again on e2, p1's output stays.
    assert launches(h.lose(E1)) == [("e2", "j1/s1/p0/a1"), ("e2", "j1/s1/p2/a1")]
    view = h.state.job(J1)
    assert view is not None
    s1 = view.stages[0]
    assert (s1.done, s1.running, s1.tasks_rerun, s1.outputs_recomputed) == (1, 3, 1, 1)


def test_loss_after_map_stage_completes_reruns_only_lost_map_tasks() -> None:
    h = started()
    cmds = finish_maps(h, {0: E1, 1: E2, 2: E1, 3: E2})
    assert launches(cmds) == [("e1", "j1/s2/p0/a0"), ("e2", "j1/s2/p1/a0")]
    # The reducer on e1 goes back to pending; the one on e2 reads maps 0 and 2
    # on e1 too, so it is cancelled rather than left to wait on a fetch from a
    # lost executor. Both wait: their input is incomplete.
    cmds = h.lose(E1)
    assert cmds[0] == CancelTask(h.last_id, E2, att(2, 1))
    assert launches(cmds) == [("e2", "j1/s1/p0/a1"), ("e2", "j1/s1/p2/a1")]
    assert len(cmds) == 3
    # A late report of the cancelled reducer changes nothing.
    assert h.complete(att(2, 1), E2) == []
    assert h.complete(att(1, 0, 1), E2) == []
    cmds = h.complete(att(1, 2, 1), E2)
    assert launches(cmds) == [("e2", "j1/s2/p0/a1"), ("e2", "j1/s2/p1/a1")]
    reducer = cmds[0]
    assert isinstance(reducer, LaunchTask)
    assert reducer.task.inputs[0].locations == (
        h.loc(att(1, 0, 1), E2, 0),
        h.loc(att(1, 1), E2, 0),
        h.loc(att(1, 2, 1), E2, 0),
        h.loc(att(1, 3), E2, 0),
    )
    assert h.complete(att(2, 1, 1), E2) == []
    assert launches(h.complete(att(2, 0, 1), E2)) == [("e2", "j1/s3/p0/a0")]
    assert h.complete(att(3, 0), E2) == [
        JobSucceeded(h.last_id, J1, (h.loc(att(3, 0), E2, 0),)),
        ReleaseOutputs(h.last_id, E2, J1, (S1, S2)),
    ]
    view = h.state.job(J1)
    assert view is not None
    assert [(s.tasks_rerun, s.outputs_recomputed) for s in view.stages] == [
        (0, 2),
        (2, 0),
        (0, 0),
    ]


def test_fetch_failed_recomputes_exactly_that_map_task_without_charging_reader() -> None:
    # Two attempts per task: were the fetch failure charged, the reader's next
    # ExecutionError would exhaust them. e3 is the holder; readers on two
    # executors (e2 in another job, then e1) failed to reach it, so it is lost.
    h = Harness(Limits(max_task_attempts=2))
    for e in (E1, E2, E3):
        h.register(e, 1)
    h.submit(three_stage_plan(maps=3, reducers=2))
    cmds = finish_maps(h, {0: E1, 1: E2, 2: E3})
    assert launches(cmds) == [("e1", "j1/s2/p0/a0"), ("e2", "j1/s2/p1/a0")]
    h.state._unreachable[E3] = {E2: h.now}  # noqa: SLF001 - e2's earlier report
    cmds = h.fail(att(2, 0), E1, FetchFailed(E3, S1, 2, "connection refused"))
    assert cmds[0] == DeclareExecutorLost(h.last_id, E3, LossReason.FETCH_FAILURES)
    # The reducer on e2 read map 2 on e3 as well: cancelled, uncharged.
    assert cmds[1] == CancelTask(h.last_id, E2, att(2, 1))
    assert launches(cmds) == [("e1", "j1/s1/p2/a1")]
    assert len(cmds) == 3
    lost = [v for v in h.state.executors() if v.id == E3][0]
    assert lost.state is ExecutorState.LOST and lost.reason is LossReason.FETCH_FAILURES
    assert "connection refused" in lost.detail and "readers on e1, e2" in lost.detail
    cmds = h.complete(att(1, 2, 1), E1)
    assert launches(cmds) == [("e1", "j1/s2/p0/a1"), ("e2", "j1/s2/p1/a1")]
    reducer = cmds[0]
    assert isinstance(reducer, LaunchTask)
    assert [loc.executor for loc in reducer.task.inputs[0].locations] == [E1, E2, E1]
    view = h.state.job(J1)
    assert view is not None
    assert (view.stages[0].outputs_recomputed, view.stages[1].tasks_rerun) == (1, 2)
    cmds = h.fail(att(2, 0, 1), E1, ExecutionError("killed"))
    # Not charged out (2 attempts): it runs again, though not on e1 where it failed.
    assert launches(cmds) == []
    assert launches(h.complete(att(2, 1, 1), E2)) == [("e2", "j1/s2/p0/a2")]


def test_fetch_failed_naming_an_already_lost_executor_requeues_the_reader() -> None:
    h = started(maps=2, reducers=1)
    finish_maps(h, {0: E1, 1: E2})  # the reducer runs on e1
    h.lose(E2)
    cmds = h.fail(att(2, 0), E1, FetchFailed(E2, S1, 1, "connection reset"))
    # No second loss, no second re-run of stage 1: the reader just waits for it.
    assert cmds == []
    view = h.state.job(J1)
    assert view is not None
    assert (view.stages[0].outputs_recomputed, view.stages[1].pending) == (1, 1)


def test_loss_of_final_result_holder_before_success_recomputes_it() -> None:
    h = Harness()
    h.register(E2, 1)
    h.submit(two_stage_plan(maps=1, finals=2, mode=InputMode.PARTITION))
    h.register(E1, 2)
    cmds = h.complete(att(1, 0), E2)
    assert launches(cmds) == [("e2", "j1/s2/p0/a0"), ("e1", "j1/s2/p1/a0")]
    assert h.complete(att(2, 1), E1) == []
    assert h.lose(E1) == []  # e2 is busy; the lost result waits for a slot
    assert launches(h.complete(att(2, 0), E2)) == [("e2", "j1/s2/p1/a1")]
    assert h.complete(att(2, 1, 1), E2) == [
        JobSucceeded(h.last_id, J1, (h.loc(att(2, 0), E2, 0), h.loc(att(2, 1, 1), E2, 0))),
        ReleaseOutputs(h.last_id, E2, J1, (S1,)),
    ]


def test_success_releases_outputs_only_on_live_executors() -> None:
    h = Harness()
    h.register(E1, 1)
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=2, reducers=1))
    h.send(ExecutorDraining, E1)
    finish_maps(h, {0: E1, 1: E2})
    h.complete(att(2, 0), E2)
    assert h.lose(E1) == []  # map 0's output is no longer needed
    assert h.complete(att(3, 0), E2) == [
        JobSucceeded(h.last_id, J1, (h.loc(att(3, 0), E2, 0),)),
        ReleaseOutputs(h.last_id, E2, J1, (S1, S2)),
    ]


def test_loss_after_success_changes_nothing() -> None:
    h = started(maps=1, reducers=1)
    h.complete(att(1, 0), E1)
    h.complete(att(2, 0), E1)
    assert isinstance(h.complete(att(3, 0), E1)[0], JobSucceeded)
    assert h.lose(E1) == []
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.SUCCEEDED


def test_late_reports_from_lost_executor_or_superseded_attempt_are_ignored() -> None:
    h = started(maps=2, reducers=1)
    assert launches(h.lose(E1)) == [("e2", "j1/s1/p0/a1")]
    before = h.state.job(J1)
    assert h.complete(att(1, 0), E1) == []  # from the lost executor
    assert h.fail(att(1, 0), E1, QueryError("boom")) == []
    # It must register again (a new id): the shell tells it so.
    assert h.send(ExecutorHeartbeat, E1) == [RefuseHeartbeat(h.last_id, E1)]
    assert h.state.job(J1) == before
    # A superseded attempt reporting from a live executor.
    assert launches(h.fail(att(1, 1), E2, ExecutionError("io"))) == [("e2", "j1/s1/p1/a1")]
    assert h.complete(att(1, 1, 0), E2) == []
    assert h.complete(att(1, 1, 7), E2) == []  # never launched
    assert h.complete(att(1, 0, 1), E1) == []  # right attempt, wrong executor
    assert h.state.job(J1) is not None
    view = h.state.job(J1)
    assert view is not None and view.stages[0].done == 0
    assert h.send(TaskCompleted, att(9, 0), E2, ()) == []  # unknown stage
    assert h.send(TaskCompleted, att(1, 0, job=J2), E2, ()) == []  # unknown job


def test_two_losses_in_a_row() -> None:
    h = Harness()
    for e in (E1, E2, E3):
        h.register(e, 4)
    h.submit(three_stage_plan(maps=3, reducers=1))
    cmds = finish_maps(h, {0: E1, 1: E2, 2: E3})
    assert launches(cmds) == [("e1", "j1/s2/p0/a0")]
    # e1 held map 0 and ran the reducer; map 0 goes to e2 (least loaded, first).
    assert launches(h.lose(E1)) == [("e2", "j1/s1/p0/a1")]
    # e2 then takes map 0's re-run and map 1's output with it.
    assert launches(h.lose(E2)) == [("e3", "j1/s1/p0/a2"), ("e3", "j1/s1/p1/a1")]
    h.complete(att(1, 0, 2), E3)
    assert launches(h.complete(att(1, 1, 1), E3)) == [("e3", "j1/s2/p0/a1")]
    h.complete(att(2, 0, 1), E3)
    cmds = h.complete(att(3, 0), E3)
    assert isinstance(cmds[0], JobSucceeded)
    assert cmds[1:] == [ReleaseOutputs(h.last_id, E3, J1, (S1, S2))]
    view = h.state.job(J1)
    assert view is not None
    # Map 0: a0 on e1 done then lost, a1 on e2 lost while running, a2 done.
    assert [(s.tasks_rerun, s.outputs_recomputed) for s in view.stages] == [
        (1, 2),
        (1, 0),
        (0, 0),
    ]


def test_recovery_is_recursive_in_one_event_and_cancels_the_consumer() -> None:
    h = Harness()
    h.register(E1, 2)
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=2, reducers=1))
    assert launches(finish_maps(h, {0: E1, 1: E2})) == [("e1", "j1/s2/p0/a0")]
    h.send(ExecutorDraining, E1)
    assert launches(h.complete(att(2, 0), E1)) == [("e2", "j1/s3/p0/a0")]
    h.register(E3, 2)
    # The final task reads the reducer's output on e1: it is cancelled, so the
    # reducer's output is needed again, and so is map 0's, also on e1: map 0
    # runs first (on e2, whose slot the cancel freed), the reducer waits.
    cmds = h.lose(E1, LossReason.DRAINED)
    assert cmds[0] == CancelTask(h.last_id, E2, att(3, 0))
    assert launches(cmds) == [("e2", "j1/s1/p0/a1")]
    assert len(cmds) == 2
    view = h.state.job(J1)
    assert view is not None
    assert [(s.done, s.running, s.pending) for s in view.stages] == [
        (1, 1, 0),
        (0, 0, 1),
        (0, 0, 1),
    ]
    assert h.complete(att(3, 0), E2) == []  # the cancelled attempt's report is stale
    assert launches(h.complete(att(1, 0, 1), E2)) == [("e2", "j1/s2/p0/a1")]
    assert launches(h.complete(att(2, 0, 1), E2)) == [("e2", "j1/s3/p0/a1")]
    assert h.complete(att(3, 0, 1), E2) == [
        JobSucceeded(h.last_id, J1, (h.loc(att(3, 0, 1), E2, 0),)),
        ReleaseOutputs(h.last_id, E2, J1, (S1, S2)),
    ]


def test_outputs_no_longer_needed_are_not_recomputed_until_they_are() -> None:
    h = Harness()
    h.register(E1, 1)
    h.register(E2, 2)
    h.submit(three_stage_plan(maps=2, reducers=1))
    h.send(ExecutorDraining, E1)
    assert launches(finish_maps(h, {0: E1, 1: E2})) == [("e2", "j1/s2/p0/a0")]
    assert launches(h.complete(att(2, 0), E2)) == [("e2", "j1/s3/p0/a0")]
    h.register(E3, 2)
    # Stage 2 is complete and the final task reads only stage 2: map 0 can go.
    assert h.lose(E1) == []
    view = h.state.job(J1)
    assert view is not None and view.outputs_recomputed == 0
    # Losing e2 loses the final task and the reducer output; re-running the
    # reducer needs map 0 (lost earlier with e1) and map 1 (lost now).
    assert launches(h.lose(E2)) == [("e3", "j1/s1/p0/a1"), ("e3", "j1/s1/p1/a1")]
    h.complete(att(1, 0, 1), E3)
    assert launches(h.complete(att(1, 1, 1), E3)) == [("e3", "j1/s2/p0/a1")]
    assert launches(h.complete(att(2, 0, 1), E3)) == [("e3", "j1/s3/p0/a1")]
    assert isinstance(h.complete(att(3, 0, 1), E3)[0], JobSucceeded)
    view = h.state.job(J1)
    assert view is not None
    assert [(s.tasks_rerun, s.outputs_recomputed) for s in view.stages] == [
        (0, 2),
        (0, 1),
        (1, 0),
    ]


def test_heartbeat_timeout_via_tick() -> None:
    # The timeout alone: the detector's suspicion (and an isolation of the
    # scheduler, both executors silent) is ``test_state_liveness``'s.
    h = Harness(Limits(heartbeat_timeout_s=10.0, suspect_phi=math.inf))
    h.register(E1, 1)
    h.register(E2, 2)
    assert launches(h.submit(three_stage_plan(maps=2))) == [
        ("e1", "j1/s1/p0/a0"),
        ("e2", "j1/s1/p1/a0"),
    ]
    h.now = 5.0
    h.send(ExecutorHeartbeat, E2)
    assert h.tick(10.0) == []  # e1 silent for exactly the timeout: not yet
    cmds = h.tick(12.0)
    assert cmds == [
        DeclareExecutorLost(h.last_id, E1, LossReason.HEARTBEAT_TIMEOUT),
        cmds[1],
    ]
    assert launches(cmds[1:]) == [("e2", "j1/s1/p0/a1")]
    e1 = h.state.executors()[1]
    assert (e1.id, e1.state, e1.since, e1.reason) == (
        E1,
        ExecutorState.LOST,
        12.0,
        LossReason.HEARTBEAT_TIMEOUT,
    )
    assert "12.0 s" in e1.detail
    assert h.tick(14.0) == []  # e2 heard from at 5.0 is still fine
    # A task report counts as being heard from.
    h.now = 15.0
    h.complete(att(1, 1), E2)
    assert h.tick(24.0) == []
    cmds = h.tick(25.5)
    assert cmds[0] == DeclareExecutorLost(h.last_id, E2, LossReason.HEARTBEAT_TIMEOUT)


def test_executors_timing_out_together_are_one_stage_rerun() -> None:
    h = Harness(Limits(heartbeat_timeout_s=10.0, max_task_recomputes=1, suspect_phi=math.inf))
    h.register(E1, 1)
    h.register(E2, 1)
    h.submit(three_stage_plan(maps=2, reducers=1))
    finish_maps(h, {0: E1, 1: E2})  # the reducer runs on e1
    h.register(E3, 2)
    h.now = 8.0
    h.send(ExecutorHeartbeat, E3)
    cmds = h.tick(11.0)
    assert cmds[:2] == [
        DeclareExecutorLost(h.last_id, E1, LossReason.HEARTBEAT_TIMEOUT),
        DeclareExecutorLost(h.last_id, E2, LossReason.HEARTBEAT_TIMEOUT),
    ]
    assert launches(cmds) == [("e3", "j1/s1/p0/a1"), ("e3", "j1/s1/p1/a1")]


def test_task_recomputes_exhausted_fails_job() -> None:
    h = Harness(Limits(max_task_recomputes=1))
    for e in (E1, E2, E3):
        h.register(e, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    assert launches(h.complete(att(1, 0), E1)) == [("e1", "j1/s2/p0/a0")]
    cmds = h.fail(att(2, 0), E1, FetchFailed(E1, S1, 0, "file missing"))
    # e1 lost: map 0 re-runs (stage 1's first re-run) on e2.
    assert launches(cmds) == [("e2", "j1/s1/p0/a1")]
    assert launches(h.complete(att(1, 0, 1), E2)) == [("e2", "j1/s2/p0/a1")]
    cmds = h.fail(att(2, 0, 1), E2, FetchFailed(E2, S1, 0, "file missing"))
    assert cmds[0] == DeclareExecutorLost(h.last_id, E2, LossReason.FETCH_FAILURES)
    assert len(cmds) == 2 and isinstance(cmds[1], JobFailed)
    msg = cmds[1].message
    assert "task 0 of stage 1 (scan t)" in msg and "2 times" in msg and "limit is 1" in msg
    assert "e2" in msg


def test_all_executors_lost_then_one_rejoins_within_grace() -> None:
    h = Harness(Limits(no_executor_grace_s=30.0))
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=2, reducers=1))
    h.now = 10.0
    assert h.lose(E1) == []
    assert h.tick(39.0) == []
    h.now = 39.5
    assert launches(h.register(E2, 2)) == [("e2", "j1/s1/p0/a1"), ("e2", "j1/s1/p1/a1")]
    h.now = 95.0
    h.send(ExecutorHeartbeat, E2)
    # Silent 5 s since: suspected (no loss); its next report clears it.
    assert h.tick(100.0) == [LogExecutorHealth(h.last_id, HealthChange.SUSPECTED, E2)]
    finish = [h.complete(att(1, p, 1), E2) for p in (0, 1)]
    assert launches(finish[1]) == [("e2", "j1/s2/p0/a0")]
    h.complete(att(2, 0), E2)
    assert isinstance(h.complete(att(3, 0), E2)[0], JobSucceeded)


def test_grace_restarts_when_an_executor_comes_and_goes() -> None:
    h = Harness(Limits(no_executor_grace_s=30.0, heartbeat_timeout_s=1000.0))
    h.register(E1, 1)
    h.submit(three_stage_plan(maps=1))
    h.now = 10.0
    h.lose(E1)
    h.now = 20.0
    assert launches(h.register(E2, 1)) == [("e2", "j1/s1/p0/a1")]
    h.now = 50.0
    h.lose(E2)
    assert h.tick(79.0) == []
    cmds = h.tick(80.0)
    assert len(cmds) == 1 and isinstance(cmds[0], JobFailed)


def test_no_executor_for_grace_fails_job_with_clear_message() -> None:
    h = Harness(Limits(no_executor_grace_s=30.0, heartbeat_timeout_s=1000.0))
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=2, reducers=1))
    h.complete(att(1, 0), E1)
    h.now = 10.0
    h.lose(E1)
    # A job submitted while none is alive waits from its own submission.
    h.now = 20.0
    h.submit(three_stage_plan(maps=1), J2)
    assert h.tick(39.9) == []
    cmds = h.tick(40.0)
    assert len(cmds) == 1 and isinstance(cmds[0], JobFailed) and cmds[0].job == J1
    assert "no executor was alive for 30 s" in cmds[0].message
    assert "Start an executor" in cmds[0].message
    assert h.tick(49.0) == []
    cmds = h.tick(50.0)
    assert len(cmds) == 1 and isinstance(cmds[0], JobFailed) and cmds[0].job == J2
    assert "no executor was alive for 30 s" in cmds[0].message


def test_cancel_stops_tasks_releases_outputs_and_frees_slots() -> None:
    h = started(maps=4, reducers=1, slots=2)
    h.submit(three_stage_plan(maps=2), J2)  # queued behind j1: no free slot
    h.complete(att(1, 1), E2)  # j2 gets that slot
    assert h.state.running_attempts(E2) == [att(1, 3), att(1, 0, job=J2)]
    cmds = h.send(CancelRequested, J1)
    assert cmds == [
        CancelTask(h.last_id, E1, att(1, 0)),
        CancelTask(h.last_id, E1, att(1, 2)),
        CancelTask(h.last_id, E2, att(1, 3)),
        JobCancelled(h.last_id, J1, "cancelled by the user"),
        ReleaseOutputs(h.last_id, E1, J1, None),  # the cancelled attempts' files
        ReleaseOutputs(h.last_id, E2, J1, None),
        cmds[6],
    ]
    assert launches(cmds[6:]) == [("e1", "j2/s1/p1/a0")]
    # A cancelled attempt that finished anyway: its files released again, nothing else.
    assert h.complete(att(1, 0), E1) == [ReleaseOutputs(h.last_id, E1, J1, None)]
    assert h.send(CancelRequested, J1) == []
    view = h.state.job(J1)
    assert view is not None
    assert (view.state, view.error) == (JobState.CANCELLED, "cancelled by the user")
    other = h.send(CancelRequested, J2, "scheduler shutting down")
    (ended,) = [c for c in other if isinstance(c, JobCancelled)]  # then its releases
    assert ended.message == "cancelled: scheduler shutting down"


def test_draining_executor_gets_no_new_tasks_but_finishes_its_own() -> None:
    h = Harness()
    h.register(E1, 2)
    h.register(E2, 1)
    h.submit(three_stage_plan(maps=4, reducers=1))
    assert h.state.running_attempts(E1) == [att(1, 0), att(1, 2)]
    assert h.send(ExecutorDraining, E1) == []
    assert [v.state for v in h.state.executors()] == [ExecutorState.DRAINING, ExecutorState.ALIVE]
    assert launches(h.complete(att(1, 0), E1)) == []
    assert launches(h.complete(att(1, 1), E2)) == [("e2", "j1/s1/p3/a0")]
    h.complete(att(1, 2), E1)
    # The reducer may read e1's outputs, but runs on e2.
    assert launches(h.complete(att(1, 3), E2)) == [("e2", "j1/s2/p0/a0")]
    assert h.state.running_attempts(E1) == []


# -------------------------------------------------------------- views and bounds


def test_unknown_executor_events_are_ignored() -> None:
    h = Harness()
    assert h.send(ExecutorHeartbeat, E1) == [RefuseHeartbeat(h.last_id, E1)]
    assert h.send(ExecutorDraining, E1) == []
    assert h.lose(E1) == []
    assert h.state.executors() == []
    h.register(E1)
    h.lose(E1)
    assert h.register(E1) == [RefuseStream(h.last_id, E1)]  # a lost id stays lost
    assert [v.state for v in h.state.executors()] == [ExecutorState.LOST]


def test_heartbeats_count_from_connecting_and_live_executors_only() -> None:
    h = Harness()
    info = ExecutorInfo(E1, "h1", "h1:501", 2)
    h.send(ExecutorRegistered, info)
    assert h.send(ExecutorHeartbeat, E1) == []  # connecting: its stream is on its way
    h.send(ExecutorConnected, E1)
    assert h.send(ExecutorHeartbeat, E1) == []
    assert h.state.touched_jobs() is None  # nothing the store keeps changed
    assert h.lose(E1) == []
    assert h.state.touched_jobs() == []  # the executors' document changed
    assert h.send(ExecutorHeartbeat, E1) == [RefuseHeartbeat(h.last_id, E1)]
    assert h.send(ExecutorLost, E1, LossReason.CONNECTION_LOST, "again") == []
    assert h.state.touched_jobs() is None  # a loss already known changes nothing


def test_executor_views() -> None:
    h = Harness()
    h.now = 1.0
    h.register(E1, 3)
    h.submit(three_stage_plan(maps=2))
    h.now = 2.0
    h.send(ExecutorHeartbeat, E1)
    (view,) = h.state.executors()
    assert (view.id, view.host, view.flight_address, view.slots) == (E1, "h1", "h1:501", 3)
    assert (view.state, view.since, view.reason, view.detail) == (
        ExecutorState.ALIVE,
        1.0,
        None,
        "",
    )
    assert (view.running, view.last_heartbeat) == (2, 2.0)
    h.now = 3.0
    h.lose(E1, LossReason.PROCESS_EXITED)
    (view,) = h.state.executors()
    assert (view.state, view.since, view.reason, view.detail, view.running) == (
        ExecutorState.LOST,
        3.0,
        LossReason.PROCESS_EXITED,
        "socket closed",
        0,
    )


def test_histories_are_bounded() -> None:
    h = Harness(keep_finished_jobs=2, keep_finished_s=0.0, keep_lost_executors=2)
    for i in range(3):
        job = JobId(f"j{i}")
        h.now = float(i)
        h.submit(three_stage_plan(maps=1), job)
        h.send(CancelRequested, job)
    assert [v.id for v in h.state.jobs()] == ["j1", "j2"]
    assert h.state.job(JobId("j0")) is None
    for e in (E1, E2, E3):
        h.register(e)
        h.lose(e)
    assert [v.id for v in h.state.executors()] == ["e2", "e3"]


def test_invalid_plan_fails_the_job_with_a_message() -> None:
    h = Harness()
    h.register(E1)
    good = three_stage_plan(maps=2)
    broken = Stage(
        id=S1,
        sql=good.stages[0].sql,
        output=good.stages[0].output,
        num_tasks=3,  # but two groups of scan splits
        columns=good.stages[0].columns,
        scan=good.stages[0].scan,
    )
    cmds = h.submit(DistributedPlan((broken, *good.stages[1:]), columns=good.columns))
    assert len(cmds) == 1 and isinstance(cmds[0], JobFailed)
    assert "stage 1 has 3 tasks but 2 groups of scan splits" in cmds[0].message
    assert h.submit(good) == []  # the id is taken: a duplicate is ignored
