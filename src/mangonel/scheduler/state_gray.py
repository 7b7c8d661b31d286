"""Gray failures inside the scheduler's state machine: which attempts straggle,
which executors keep failing tasks.

Pure rules over the job and executor records; ``SchedulerState`` calls them and
emits the commands (a copy's ``LaunchTask``, the ``JobFailed`` of a cluster of
bad executors). Both rules are Spark's:

* **speculation** (``stragglers``): once ``Limits.speculation_quantile`` of a
  stage's tasks are done, a running attempt without a copy that has run longer
  than ``speculation_multiplier`` times the median run time of the done ones,
  and at least ``speculation_min_s``, is a straggler;
* **slow executors** (``observe_speed``, as Hadoop's LATE scheduler does): each
  finished task's run time against its stage's median, and each attempt a copy
  beat, feed a moving average per executor; one whose average reaches
  ``speculation_multiplier`` is marked slow, and between equally loaded
  executors the others get tasks (and copies) first. A stage of one task cannot
  be speculated (no median), so this is what keeps it off a slow machine;
* **exclusion** (``count_failure``): ``exclusion_failures`` distinct tasks that
  failed for execution reasons on one executor within ``exclusion_window_s``
  exclude it from new tasks for ``exclusion_s``.

>>> from mangonel.scheduler.events import Limits
>>> threshold([1.0, 1.0, 3.0], Limits(speculation_min_s=0.5))  # 1.5 x the median
1.5
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mangonel.ids import TaskId
from mangonel.scheduler.events import Limits
from mangonel.scheduler.state_executors import ExecutorRecord
from mangonel.scheduler.state_jobs import JobRecord
from mangonel.scheduler.state_stages import LiveCheck, Running, StageRecord, StageState, TaskRecord

__all__ = [
    "Straggler",
    "count_failure",
    "excluded_everywhere",
    "observe_speed",
    "stragglers",
    "threshold",
]

SPEED_WEIGHT = 0.5
"""Weight of the newest observation in an executor's moving average of run-time
ratios: one clearly slow task marks it, two ordinary ones clear it."""


@dataclass(frozen=True)
class Straggler:
    """A running attempt to copy, and for how long it has run."""

    ran_s: float
    job: JobRecord
    stage: StageRecord
    task: TaskRecord
    running: Running


def threshold(durations: Sequence[float], limits: Limits) -> float:
    """How long an attempt of a stage whose done tasks took ``durations`` may run."""
    median = statistics.median(durations)
    return max(limits.speculation_multiplier * median, limits.speculation_min_s)


def stragglers(
    jobs: Iterable[JobRecord],
    is_live: LiveCheck,
    now: float,
    limits: Limits,
    distrusted: LiveCheck | None = None,
) -> list[Straggler]:
    """Attempts of runnable stages to copy, the longest-running first.

    An attempt on a ``distrusted`` executor (suspected or quarantined by
    ``state_liveness``) is copied whatever its stage's progress: it may never
    report, and its executor is not lost yet. ``None``: no executor is.
    """
    found: list[Straggler] = []
    for job in jobs:
        usable = job.usable(is_live)
        for sid, rec in job.stages.items():
            if job.stage_state(sid, usable) is not StageState.RUNNABLE:
                continue
            quantile = rec.done >= max(1, math.floor(limits.speculation_quantile * len(rec.tasks)))
            if not quantile and distrusted is None:
                continue
            longest = (
                max(limits.speculation_multiplier * rec.median_duration(), limits.speculation_min_s)
                if quantile
                else math.inf
            )
            for task in rec.running_tasks():
                running = task.state
                if isinstance(running, Running) and task.speculative is None:
                    ran = now - running.started
                    if (quantile and ran > longest) or (
                        distrusted is not None and distrusted(running.executor)
                    ):
                        found.append(Straggler(ran, job, rec, task, running))
    return sorted(found, key=lambda s: -s.ran_s)


def observe_speed(rec: ExecutorRecord, stage: StageRecord, ran_s: float, limits: Limits) -> None:
    """An attempt of ``stage`` on ``rec`` ran ``ran_s`` (it finished, or a copy
    beat it then): update the executor's slowness against the stage's median.

    Needs two finished tasks in the stage, and a median above zero.
    """
    if stage.done < 2:
        return
    median = stage.median_duration()
    if median <= 0:
        return
    rec.slowness = (1 - SPEED_WEIGHT) * rec.slowness + SPEED_WEIGHT * (ran_s / median)
    slow = rec.slowness >= limits.speculation_multiplier
    if slow != rec.slow:
        # Only on a change: ``slow`` is part of the executor's rank, and every
        # change of it pushes a new entry on the registry's heap.
        rec.slow = slow
        if rec.registry is not None:
            rec.registry.rank_changed(rec)


def count_failure(rec: ExecutorRecord, task: TaskId, why: str, now: float, limits: Limits) -> bool:
    """Count a task that failed on ``rec`` for an execution reason; exclude the
    executor when it is one too many. Returns whether it was excluded now.

    Only ``ExecutionError``s are counted (the caller's business): a query error
    is the query's fault, a fetch failure the holder's. One task failing again
    and again is the task's problem (``max_task_attempts``), not the executor's:
    distinct tasks are counted.
    """
    if limits.exclusion_failures <= 0:
        return False
    window = limits.exclusion_window_s
    rec.failures = [(at, t) for at, t in rec.failures if now - at <= window]
    rec.failures.append((now, task))
    tasks = {t for _, t in rec.failures}
    if rec.excluded or len(tasks) < limits.exclusion_failures:
        return False
    rec.excluded_until = now + limits.exclusion_s
    rec.exclusion = (
        f"{len(tasks)} tasks failed on it within {window:g} s (the limit is "
        f"{limits.exclusion_failures}, --exclusion-failures); last: {why}"
    )
    rec.failures.clear()
    return True


def excluded_everywhere(takers: Sequence[ExecutorRecord]) -> str | None:
    """Why no executor may take a task, when every one that does or will
    (``ExecutorRegistry.takers``) is excluded; ``None`` otherwise."""
    if not takers or not all(r.excluded for r in takers):
        return None
    return "; ".join(f"{r.id}: {r.exclusion}" for r in takers)
