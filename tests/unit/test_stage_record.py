"""``StageRecord``'s counts, kept as its tasks change, against a fresh count.

The counts are what the state machine's questions cost nothing to answer (is a
stage complete, which task goes next, which outputs an executor holds); a loss
sends thousands of tasks back in one pass (``send_back``) instead of through
each assignment's hook. Either way the counts must be the ones that a stage
built from the same tasks counts afresh.
"""

from __future__ import annotations

import copy
from typing import Any

from test_state_machine import three_stage_plan

from mangonel.ids import ExecutorId, TaskAttemptId, TaskId
from mangonel.scheduler.state_stages import Done, Pending, Running, StageRecord, TaskRecord
from mangonel.task import PartitionLocation

E1, E2 = ExecutorId("e1"), ExecutorId("e2")
JOB = "j1"


def _done(rec: StageRecord, partition: int, executor: ExecutorId, seconds: float) -> Done:
    attempt = TaskAttemptId(rec.tasks[partition].id, 0)
    outputs = tuple(
        PartitionLocation(
            executor,
            "h",
            "h:1",
            rec.stage.id,
            partition,
            p,
            f"/w/{partition}/{p}",
            10 + p,
            100,
            "c",
        )
        for p in range(2)
    )
    return Done(attempt, executor, outputs, seconds)


def _stage(tasks: int = 12) -> StageRecord:
    """Tasks 0-4 done on e1, 5-8 done on e2, 9 running on e2, 10-11 pending."""
    stage = three_stage_plan(maps=tasks, reducers=2).stages[0]
    rec = StageRecord(stage, [TaskRecord.fresh(TaskId(JOB, stage.id, p)) for p in range(tasks)])
    for p in range(9):
        attempt = rec.tasks[p].next_attempt()
        rec.tasks[p].move(Running(attempt, E1 if p < 5 else E2, 0.0))
        rec.tasks[p].move(_done(rec, p, E1 if p < 5 else E2, seconds=1.0 + p % 3))
    rec.tasks[9].move(Running(rec.tasks[9].next_attempt(), E2, 0.0))
    rec.changed.clear()
    return rec


def _counts(rec: StageRecord) -> dict[str, Any]:
    return {
        "done": rec.done,
        "rows": rec.rows,
        "bytes": rec.bytes,
        "pending": rec.pending_count,
        "running": sorted(rec.running),
        "held": {
            e: (sorted(h.partitions), h.rows, h.bytes) for e, h in sorted(rec.done_on.items())
        },
        "totals": dict(rec.totals),
        "next": [t.id.partition for t in rec.pending_tasks()],
        "complete": rec.complete,
    }


def _afresh(rec: StageRecord) -> dict[str, Any]:
    tasks = [copy.copy(t) for t in rec.tasks]
    return _counts(StageRecord(rec.stage, tasks))


def test_the_counts_kept_task_by_task_are_the_counts_made_afresh() -> None:
    rec = _stage()
    assert _counts(rec) == _afresh(rec)
    assert _counts(rec)["held"] == {E1: ([0, 1, 2, 3, 4], 105, 1000), E2: ([5, 6, 7, 8], 84, 800)}


def test_send_back_is_each_task_made_pending_and_recomputed_in_one_pass() -> None:
    rec = _stage()
    one_by_one = _stage()
    for task in one_by_one.done_tasks_on(E1):
        task.recompute()

    sent = rec.send_back(E1)

    assert [t.id.partition for t in sent] == [0, 1, 2, 3, 4]
    assert all(isinstance(t.state, Pending) and t.recomputes == 1 for t in sent)
    assert rec.changed == {t.id for t in sent} == one_by_one.changed
    assert _counts(rec) == _counts(one_by_one) == _afresh(rec)
    assert _counts(rec)["next"] == [0, 1, 2, 3, 4, 10, 11]
    assert (rec.done, rec.rows, rec.totals["recomputes"]) == (4, 84, 5)
    # How long the lost tasks took still counts for the stage's median.
    assert rec.durations == one_by_one.durations == sorted(1.0 + p % 3 for p in range(9))
    # Sending back what the executor no longer holds changes nothing.
    assert rec.send_back(E1) == []
    assert _counts(rec) == _afresh(rec)


def test_tasks_sent_back_run_and_finish_again_with_the_counts_kept() -> None:
    rec = _stage()
    rec.send_back(E2)
    for task in list(rec.pending_tasks()):
        task.move(Running(task.next_attempt(), E1, 5.0))
        task.move(_done(rec, task.id.partition, E1, seconds=2.0))
    assert _counts(rec) == _afresh(rec)
    assert _counts(rec)["held"] == {E1: ([0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11], 231, 2200)}
    assert not rec.complete  # task 9 still runs on e2


def test_a_few_sent_back_into_a_long_queue_come_out_in_partition_order() -> None:
    # Most of a big stage still pending: the few sent back are pushed one by
    # one rather than the queue ordered again; the order must be the same.
    stage = three_stage_plan(maps=100, reducers=2).stages[0]
    rec = StageRecord(stage, [TaskRecord.fresh(TaskId(JOB, stage.id, p)) for p in range(100)])
    launched = []
    for task in rec.pending_tasks():  # as the state machine launches: off the queue
        if len(launched) == 3:
            break
        task.move(Running(task.next_attempt(), E1, 0.0))
        launched.append(task)
    for task in launched:
        task.move(_done(rec, task.id.partition, E1, seconds=1.0))
    assert 0 not in rec._queued  # left the queue: sending it back must push it
    rec.send_back(E1)
    assert _counts(rec) == _afresh(rec)
    assert _counts(rec)["next"] == list(range(100))
