"""Adaptive execution in the pure state machine: a hash exchange's reader stage
coalesced from the real sizes of its partitions (``scheduler.adaptive``).

The plans are ``test_state_machine``'s: stage 1 scans and hashes into R
partitions, stage 2 (R tasks) reads them by partition, stage 3 gathers. Map
outputs are reported with chosen sizes, so what the reader stage becomes is
decided by those sizes alone.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_persist_task_keys import Driven
from test_state_machine import (
    E1,
    E2,
    J1,
    S1,
    S2,
    Harness,
    att,
    launches,
    three_stage_plan,
    two_stage_plan,
)
from test_state_restart import held, reattach, restarted

from mangonel.ids import StageId, TaskAttemptId
from mangonel.plan.physical import ScanInput, StageInput
from mangonel.scheduler import adaptive
from mangonel.scheduler.events import (
    Command,
    ExecutorConnected,
    ExecutorLost,
    ExecutorRegistered,
    JobSubmitted,
    Limits,
    LossReason,
    SchedulerRecovered,
    TaskCompleted,
)
from mangonel.scheduler.persist import read_snapshot
from mangonel.scheduler.state import JobState
from mangonel.scheduler.state_jobs import JobRecord
from mangonel.task import (
    ExecutorInfo,
    FileSplit,
    InputMode,
    LaunchTask,
    OutputKind,
    OutputSpec,
    PartitionOutput,
)

MIB = 1024 * 1024

# ------------------------------------------------------------- the pure decision


def test_partitions_are_grouped_into_contiguous_ranges_of_about_the_target() -> None:
    assert adaptive.coalesce([10, 10, 10, 10, 10, 10], target=30) == (0, 3)
    # A partition bigger than the target stays alone; empty ones join a neighbour.
    assert adaptive.coalesce([5, 100, 0, 0, 5, 5], target=20) == (0, 1, 2)
    # All under the target: one range.
    assert adaptive.coalesce([1, 2, 3], target=100) == (0,)
    # A last range under a fifth of the target joins the one before it.
    assert adaptive.coalesce([50, 50, 5], target=60) == (0, 1)
    assert adaptive.coalesce([50, 50, 20], target=60) == (0, 1, 2)
    assert adaptive.coalesce([], target=10) == ()


def test_the_target_keeps_every_slot_busy_unless_tasks_would_be_tiny() -> None:
    # Much data: the advisory size.
    assert adaptive.target_bytes(10_000 * MIB, 8, 64 * MIB, 4 * MIB) == 64 * MIB
    # 80 MiB over 8 slots: 10 MiB a task, so 8 tasks, not 2 of 64 MiB.
    assert adaptive.target_bytes(80 * MIB, 8, 64 * MIB, 4 * MIB) == 10 * MIB
    # 8 MiB over 8 slots would be 1 MiB tasks: not worth a task each.
    assert adaptive.target_bytes(8 * MIB, 8, 64 * MIB, 4 * MIB) == 4 * MIB
    assert adaptive.target_bytes(0, 0, 64 * MIB, 0) == 1


def test_only_stages_that_read_nothing_of_their_own_but_partition_i_are_coalescible() -> None:
    plan = three_stage_plan(maps=4, reducers=4)
    scan, reader, gather = plan.stages
    assert adaptive.coalescible(reader, plan)
    assert not adaptive.coalescible(scan, plan)  # task i reads split group i
    assert not adaptive.coalescible(gather, plan)  # one task, reads all
    # A side scan by key range: task i reads the row groups of range i.
    ranged = tuple((FileSplit("/u.parquet", (i,)),) for i in range(4))
    by_range = dataclasses.replace(reader, side_scans=(ScanInput("__scan1", "u", ("k",), ranged),))
    assert not adaptive.coalescible(by_range, plan)
    # A small side table read whole by every task does not tie tasks to partitions.
    whole = dataclasses.replace(
        reader, side_scans=(ScanInput("__scan1", "u", ("k",), ((FileSplit("/u.parquet"),),)),)
    )
    assert adaptive.coalescible(whole, plan)
    # Only broadcast inputs: every task reads the same, nothing to coalesce.
    broadcast = dataclasses.replace(reader, inputs=(StageInput("s1", S1, InputMode.ALL),))
    assert not adaptive.coalescible(broadcast, plan)
    # A partitioned input that is not a hash into this stage's task count.
    other = dataclasses.replace(
        plan,
        stages=(
            dataclasses.replace(scan, output=OutputSpec(OutputKind.HASH, 8, ("k",))),
            reader,
            gather,
        ),
    )
    assert not adaptive.coalescible(reader, other)


# ----------------------------------------------------------- in the state machine


def sized_outputs(
    h: Harness, attempt: TaskAttemptId, sizes: list[int]
) -> tuple[PartitionOutput, ...]:
    return tuple(dataclasses.replace(o, bytes=sizes[o.partition]) for o in h.outputs(attempt, E1))


def run_maps(h: Harness, maps: int, sizes: list[int]) -> list[Command]:
    """Complete every map task on e1, each writing partitions of ``sizes`` bytes."""
    cmds: list[Command] = []
    for m in range(maps):
        a = att(1, m)
        cmds = h.send(TaskCompleted, a, E1, sized_outputs(h, a, sizes))
    return cmds


def reader_specs(cmds: list[Command]) -> list[LaunchTask]:
    return [c for c in cmds if isinstance(c, LaunchTask) and c.task.attempt.task.stage == S2]


def started(limits: Limits | None = None, maps: int = 3, reducers: int = 8) -> Harness:
    """e1 with 8 slots runs every task; j1 submitted."""
    h = Harness(limits)
    h.register(E1, 8)
    h.submit(three_stage_plan(maps, reducers))
    return h


def test_a_reader_of_small_partitions_runs_as_fewer_tasks_each_reading_a_range() -> None:
    h = started(maps=2)
    # 8 partitions of 1 MiB from each of 2 maps: 16 MiB over 8 slots would be
    # 2 MiB a task, under the 4 MiB floor: tasks of 4 MiB, two partitions each.
    specs = reader_specs(run_maps(h, 2, [MIB] * 8))
    assert [s.task.attempt.task.partition for s in specs] == [0, 1, 2, 3]
    for j, launch in enumerate(specs):
        (inp,) = launch.task.inputs
        # Every map task's partitions 2j and 2j+1, by (map, partition).
        assert [(loc.map_partition, loc.partition) for loc in inp.locations] == [
            (m, p) for m in range(2) for p in (2 * j, 2 * j + 1)
        ]
    view = h.state.job(J1)
    assert view is not None
    reader = view.stages[1]
    assert (reader.num_tasks, reader.planned_tasks, reader.running) == (4, 8, 4)


def test_partitions_big_enough_keep_the_planned_tasks() -> None:
    h = started()
    specs = reader_specs(run_maps(h, 3, [64 * MIB] * 8))
    assert [s.task.attempt.task.partition for s in specs] == list(range(8))
    assert [[loc.partition for loc in s.task.inputs[0].locations] for s in specs] == [
        [p] * 3 for p in range(8)
    ]
    view = h.state.job(J1)
    assert view is not None and view.stages[1].planned_tasks is None


def test_adaptive_off_keeps_the_planned_tasks_however_small() -> None:
    h = started(Limits(adaptive=False))
    specs = reader_specs(run_maps(h, 3, [1] * 8))
    assert len(specs) == 8


def test_uneven_partitions_make_uneven_ranges_and_the_job_still_succeeds() -> None:
    h = started()
    sizes = [30 * MIB, 0, 0, 1 * MIB, 1 * MIB, 40 * MIB, 0, 0]
    specs = reader_specs(run_maps(h, 3, sizes))
    # 216 MiB over 8 slots: 27 MiB a task. p0 (90 MiB) alone; p1..p4 (6 MiB); p5
    # (120 MiB) alone; p6, p7 (empty) join it.
    got = [sorted({loc.partition for loc in s.task.inputs[0].locations}) for s in specs]
    assert got == [[0], [1, 2, 3, 4], [5, 6, 7]]
    for launch in specs:
        cmds = h.complete(launch.task.attempt, launch.executor)
    (final,) = [c for c in cmds if isinstance(c, LaunchTask)]
    # The gather reads one output of each of the 3 reader tasks.
    assert [loc.map_partition for loc in final.task.inputs[0].locations] == [0, 1, 2]
    h.complete(final.task.attempt, final.executor)
    view = h.state.job(J1)
    assert view is not None and view.state is JobState.SUCCEEDED


def test_a_map_output_lost_after_coalescing_is_made_again_for_the_same_ranges() -> None:
    h = Harness()
    h.register(E1, 4)
    h.register(E2, 4)
    h.submit(three_stage_plan(maps=4, reducers=8))
    # Maps 0, 2 on e1 and 1, 3 on e2; 64 KiB partitions: one reader task.
    cmds: list[Command] = []
    for m in range(4):
        a = att(1, m)
        where = E1 if m % 2 == 0 else E2
        outs = tuple(dataclasses.replace(o, bytes=64 * 1024) for o in h.outputs(a, where))
        cmds = h.send(TaskCompleted, a, where, outs)
    (reader,) = reader_specs(cmds)
    assert {loc.partition for loc in reader.task.inputs[0].locations} == set(range(8))
    # e2 goes: the reader (reading its files) is cancelled, maps 1 and 3 run again.
    cmds = h.send(ExecutorLost, E2, LossReason.CONNECTION_LOST, "gone")
    assert launches(cmds) == [("e1", "j1/s1/p1/a1"), ("e1", "j1/s1/p3/a1")]
    h.complete(att(1, 1, 1), E1)
    cmds = h.complete(att(1, 3, 1), E1)
    # The stage keeps its one task; it reads all 8 partitions of the 4 maps again.
    (again,) = reader_specs(cmds)
    assert str(again.task.attempt) == "j1/s2/p0/a1"
    locs = again.task.inputs[0].locations
    assert sorted((loc.map_partition, loc.partition) for loc in locs) == [
        (m, p) for m in range(4) for p in range(8)
    ]
    assert {loc.executor for loc in locs} == {E1}
    view = h.state.job(J1)
    assert view is not None
    assert (view.stages[1].num_tasks, view.stages[1].planned_tasks) == (1, 8)


def test_coalesced_ranges_survive_a_restart() -> None:
    h = started(maps=2)
    specs = reader_specs(run_maps(h, 2, [MIB] * 8))
    assert len(specs) == 4  # 16 MiB: 4 MiB ranges of 2 partitions
    r = restarted(h)
    view = r.state.job(J1)
    assert view is not None and (view.stages[1].num_tasks, view.stages[1].planned_tasks) == (4, 8)
    r.send(SchedulerRecovered)
    # e1 comes back with the maps' files: the reader tasks run again, same ranges.
    cmds = reattach(r, "e1", held(h, E1, att(1, 0), att(1, 1)))
    again = reader_specs(cmds)
    assert [str(s.task.attempt) for s in again] == [f"j1/s2/p{j}/a1" for j in range(4)]
    assert [sorted({loc.partition for loc in s.task.inputs[0].locations}) for s in again] == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
    ]


def test_a_stage_that_never_launched_is_decided_again_after_a_restart() -> None:
    # Maps done but no slot free for the reader: nothing decided yet, nothing stored.
    h = Harness()
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=2, reducers=8))
    h.send(ExecutorLost, E1, LossReason.CONNECTION_LOST, "gone")
    r = restarted(h)
    rec = r.state._jobs[J1].stages[S2]
    assert rec.adaptable and rec.bounds == ()


def test_the_store_reads_back_a_coalesced_stage_from_its_task_keys() -> None:
    # Through the real store layout (a head per job, a key per changed task).
    d = Driven()
    for e in ("e1", "e2"):
        d.emit(ExecutorRegistered, ExecutorInfo(e, "h", f"h:{e}", 4))  # type: ignore[arg-type]
        d.emit(ExecutorConnected, e)
    plan = two_stage_plan(maps=3, finals=6, mode=InputMode.PARTITION)
    d.emit(JobSubmitted, J1, plan)
    for _ in range(3):
        d.complete_next()  # each output 10 bytes: one reader task of 6 partitions
    (reader,) = d.launched
    assert reader.task.attempt.task.stage == StageId(2)
    assert len(reader.task.inputs[0].locations) == 18
    snap = read_snapshot(d.store.load(), "test")
    (stored,) = snap.jobs
    assert stored.progress is not None
    assert stored.progress.stages[StageId(2)].bounds == (0,)
    restored = JobRecord.restore(stored.plan.plan, stored.progress)
    view = d.state.job(J1)
    assert view is not None and restored.view().stages == view.stages
    assert len(restored.stages[StageId(2)].tasks) == 1


def test_a_stored_range_that_does_not_fit_the_plan_is_refused() -> None:
    h = started()
    run_maps(h, 3, [MIB] * 8)
    progress = h.state.export_job(J1)
    assert progress is not None
    progress.stages[S2].bounds = (0, 9)
    with pytest.raises(ValueError, match="bad partition ranges"):
        JobRecord.restore(h.plans[J1], progress)


# ------------------------------------------------------------------- how it shows


def test_the_views_show_planned_and_actual_tasks_of_a_coalesced_stage() -> None:
    from mangonel.client.render import format_stages
    from mangonel.client.status import StageStatus
    from mangonel.web.picture import dot, svg
    from mangonel.web.views import stage_models

    h = started(maps=2)
    run_maps(h, 2, [MIB] * 8)
    view = h.state.job(J1)
    assert view is not None
    models = stage_models(h.plans[J1], view.stages)
    assert [(m.num_tasks, m.planned_tasks) for m in models] == [(2, None), (4, 8), (1, None)]
    assert "0/4 tasks done, 4 running (planned 8)" in svg(models)
    assert "4 task(s) (planned 8)" in dot(models)
    # Before it ran, the plan's own count.
    assert [m.num_tasks for m in stage_models(h.plans[J1])] == [2, 8, 1]
    text = format_stages(
        [
            StageStatus(2, "join", 4, 4, 0, 10, 100, 0.1, 4, tasks_planned=8),
            StageStatus(3, "sort", 1, 1, 0, 10, 100, 0.1, 1),
        ]
    )
    assert "4/4 (planned 8)" in text
    assert "1/1 " in text and text.count("planned") == 1
