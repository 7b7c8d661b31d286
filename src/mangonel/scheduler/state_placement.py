"""Placement: which pending task runs where, and when a straggler gets a copy.

After every event ``Placement._assign`` hands pending tasks of runnable stages
to free slots of alive executors, least loaded first, each free slot to the job
holding the fewest (fair shares, ``--max-job-share`` as a cap); a stage about
to launch its first task may run as fewer tasks (``_adapt``, adaptive
execution); on a ``Tick``, ``_speculate`` copies stragglers onto free slots no
pending task wanted. ``_validate_assigned`` checks the result from scratch
(the ``nothing-launchable`` invariant).

A part of ``scheduler.state.SchedulerState`` (its base class), pure like the rest.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

from mangonel.ids import ExecutorId, JobId
from mangonel.scheduler import adaptive
from mangonel.scheduler.events import (
    Limits,
)
from mangonel.scheduler.invariants import StateInvariantError
from mangonel.scheduler.state_executors import (
    ExecutorRecord,
    ExecutorRegistry,
)
from mangonel.scheduler.state_gray import (
    stragglers,
)
from mangonel.scheduler.state_jobs import JobRecord
from mangonel.scheduler.state_liveness import late_beats
from mangonel.scheduler.state_recovery import Step
from mangonel.scheduler.state_stages import Pending, Running, StageRecord, StageState, TaskRecord
from mangonel.scheduler.state_views import (
    JobState,
)
from mangonel.task import (
    LaunchTask,
)


class Placement:
    """The placement rules of ``SchedulerState``; see the module docstring."""

    limits: Limits
    _executors: ExecutorRegistry
    _jobs: dict[JobId, JobRecord]

    if TYPE_CHECKING:

        def _distrusted(self, executor: ExecutorId) -> bool: ...

    def _assign(self, step: Step) -> None:
        """Hand pending tasks of runnable stages to free slots, fairly between jobs.

        Each free slot goes to the job that holds the fewest slots at that moment
        (its running attempts, speculative copies included), ties to the earliest
        submitted: the fair sharing of Hadoop's fair scheduler and Spark's FAIR
        mode, with one pool and equal weights. Slots are handed out one task at a
        time, so two jobs with work for every slot end up with half each, and a
        job submitted while another holds every slot gets each slot that frees
        until it holds as many (tasks are never preempted). It is
        work-conserving: a job alone takes every slot, and a job that cannot use
        its share (no more runnable tasks, or a free slot only on executors it
        excludes or its tasks failed on) leaves the rest to the others. Within a
        job, stages in plan order and tasks in partition order, each to the least
        loaded executor (``_launch_next``).

        With ``Limits.max_job_share`` below 1, no job holds more than that share
        of the slots (``_job_slot_cap``), which is no longer work-conserving: an
        operator's choice, so that a job arriving finds slots free at once
        however long the running tasks of the others are.
        """
        # Whether slow-link marks hold follows every change of who takes tasks.
        self._executors.settle_marks()
        least = self._executors.least_loaded()
        if least is None:
            return
        cap = self._job_slot_cap()
        # Counting the held slots costs the busy slots; one job alone without a
        # cap takes every slot it can use whatever it holds.
        held = self._executors.slots_held() if len(self._jobs) > 1 or cap is not None else {}
        # (slots held, submission order, job); the order is unique, so the heap
        # never compares the jobs.
        # A job being committed (``_commit``) launches nothing more.
        queue = [
            (held.get(job.id, 0), order, job)
            for order, job in enumerate(self._jobs.values())
            if job.commit is None
        ]
        # A job's walk over its launchable tasks, started when it first comes
        # to the top: a completion frees one slot, and starting a walk for each
        # of ten jobs to launch one task cost a third of the event.
        walks: dict[int, Generator[TaskRecord, None, None]] = {}
        try:
            heapq.heapify(queue)
            while queue:
                count, order, job = queue[0]
                if cap is not None and count >= cap:
                    return  # the job holding the fewest is at the cap: so is every other
                tasks = walks.get(order)
                if tasks is None:
                    tasks = walks[order] = self._pending_runnable(job)
                if self._launch_next(job, tasks, least, step):
                    heapq.heapreplace(queue, (count + 1, order, job))
                else:
                    heapq.heappop(queue)
                    tasks.close()  # nothing more it can launch now
                # Asked once a turn, and handed to the next job's launch: the
                # last free slot taken ends the loop without a look at any job.
                least = self._executors.least_loaded()
                if least is None:
                    return  # no free slot anywhere
        finally:
            # A stage's walk puts the tasks it passed over back in its queue when
            # it is closed; closed here, not whenever the garbage collector gets
            # to it, before the next event walks the stage again.
            for tasks in walks.values():
                tasks.close()

    def job_slots(self) -> int:
        """The slots one job may hold now: the alive executors', at most its
        share of them (``Limits.max_job_share``); 0 with no executor alive. The
        planner sizes exchanges by it (``PlannerConfig.slots``)."""
        alive = self._executors.alive_slots()
        cap = self._job_slot_cap()
        return alive if cap is None or not alive else min(alive, cap)

    def job_parallel(self) -> int:
        """The tasks of one job the alive executors' hosts run at full speed at
        once (``ExecutorRegistry.parallel_slots``), at most ``job_slots``; the
        planner sizes scans by it (``PlannerConfig.parallel``)."""
        return min(self.job_slots(), self._executors.parallel_slots())

    def _job_slot_cap(self) -> int | None:
        """The most slots one job may hold now (``Limits.max_job_share`` of the
        alive executors' slots, at least one); ``None``: no cap."""
        share = self.limits.max_job_share
        if share >= 1.0:
            return None
        # The epsilon keeps 0.29 x 100 slots at 29, not 28 (binary fractions).
        return max(1, math.floor(share * self._executors.alive_slots() + 1e-9))

    def _pending_runnable(self, job: JobRecord) -> Generator[TaskRecord, None, None]:
        """The job's pending tasks of runnable stages, stages in plan order.

        Lazy, so a job with thousands of pending tasks is read only as far as
        the free slots reach. Launching a task changes no stage's state, so
        what was runnable when the walk started stays so until it ends.
        """
        is_live = job.usable(self._executors.is_live)
        for sid, rec in job.stages.items():
            if not rec.pending_count or job.stage_state(sid, is_live) is not StageState.RUNNABLE:
                continue
            if rec.adaptable:
                self._adapt(job, rec)
            yield from rec.pending_tasks()

    def _adapt(self, job: JobRecord, rec: StageRecord) -> None:
        """Decide, once, how many tasks a stage that is about to launch its first
        one runs, from the real sizes of its partitioned inputs
        (``scheduler.adaptive``). Its upstream stages are complete (it is
        runnable) and none of its tasks launched, so no reader has seen its
        task count yet; the decision is kept (``StageRecord.bounds``, stored
        with the job's progress) for as long as the job runs, outputs lost and
        made again included, since the map side writes the same partitions."""
        rec.adaptable = False
        limits = self.limits
        if not limits.adaptive or rec.totals["attempts_launched"]:
            return
        sizes = job.partition_bytes(rec.stage)
        target = adaptive.target_bytes(
            sum(sizes),
            self._executors.alive_slots(),
            limits.adaptive_partition_bytes,
            limits.adaptive_min_partition_bytes,
        )
        bounds = adaptive.coalesce(sizes, target)
        if len(bounds) < len(sizes):
            rec.coalesce(job.id, bounds)

    def _launch_next(
        self,
        job: JobRecord,
        tasks: Iterator[TaskRecord],
        least: ExecutorRecord,
        step: Step,
    ) -> bool:
        """Launch the next of ``tasks`` that may run now; ``False`` when none may
        (no slot the job may use is free, or the tasks left wait for executors
        other than those with a free slot). ``least`` is the least loaded
        executor with a free slot (``ExecutorRegistry.least_loaded()``)."""
        if job.excluded:
            # Looked up before the next task is: with no slot free, the job's
            # pending tasks are not read at all.
            found = self._executors.least_loaded(job.excluded)
            if found is None:
                return False
            least = found
        for task in tasks:
            executor = least
            if executor.id in task.failed_on:
                # Not again where it failed (Spark's one attempt per task and
                # executor), while another executor may run it: it waits for
                # a slot there rather than fail again, and a bad executor
                # that fails at once cannot use up the task's attempts alone.
                avoid = job.excluded | set(task.failed_on)
                elsewhere = self._executors.least_loaded(avoid)
                if elsewhere is None and self._executors.any_taker(avoid):
                    continue
                executor = elsewhere or executor
            eid = executor.id
            attempt = task.next_attempt()
            task.move(Running(attempt, eid, started=step.now))
            job.ran_on.add(eid)
            self._executors.start(eid, attempt)
            job.state = JobState.RUNNING
            stage = job.stages[attempt.task.stage].stage
            step.commands.append(LaunchTask(step.cause, eid, job.task_spec(stage, attempt)))
            return True
        return False

    def _speculate(self, step: Step) -> None:
        """Copy straggling attempts onto other executors' free slots (on ``Tick``).

        Which attempts straggle is ``state_gray.stragglers``; each gets one copy
        on the least loaded executor other than its own that the job may use,
        and whose heartbeats are not late (``state_liveness.late_beats``).
        Called after ``_assign``, so pending tasks always come first. The first
        of the two to finish wins (``_task_completed``).
        """
        distrusted = any(
            r.suspected_since is not None
            or r.quarantined_until is not None
            or r.lagging_since is not None
            for r in self._executors.live_records()
        )
        found = stragglers(
            self._jobs.values(),
            self._executors.is_live,
            step.now,
            self.limits,
            self._distrusted if distrusted else None,
        )
        cap = self._job_slot_cap()
        held = self._executors.slots_held() if cap is not None and found else {}
        late = late_beats(self._executors.live_records(), step.now, self.limits) if found else set()
        for s in found:
            if cap is not None and held.get(s.job.id, 0) >= cap:
                continue  # a copy holds a slot too (``_assign``)
            if not self._copyable(s.job, s.stage):
                continue
            executor = self._executors.least_loaded(s.job.excluded | late | {s.running.executor})
            if executor is None:
                continue
            self._launch_copy(s.job, s.stage, s.task, executor.id, step)
            if cap is not None:
                held[s.job.id] = held.get(s.job.id, 0) + 1

    def _copyable(self, job: JobRecord, stage: StageRecord) -> bool:
        """Whether a copy of an attempt of ``stage`` may be launched now: only
        while every input of it is there (the stage is runnable). While one is
        being made again, a copy's spec would name only the outputs there are,
        and the copy would read too few (simulation seed 714366: a wrong answer)."""
        live = job.usable(self._executors.is_live)
        return job.stage_state(stage.stage.id, live) is StageState.RUNNABLE

    def _launch_copy(
        self, job: JobRecord, stage: StageRecord, task: TaskRecord, executor: ExecutorId, step: Step
    ) -> None:
        """Launch a speculative copy of ``task``'s running attempt on ``executor``
        (a free slot of it); the first of the two to finish wins."""
        attempt = task.next_attempt()
        task.set_copy(Running(attempt, executor, started=step.now))
        stage.speculated += 1
        job.ran_on.add(executor)
        self._executors.start(executor, attempt)
        spec = job.task_spec(stage.stage, attempt)
        step.commands.append(LaunchTask(step.cause, executor, spec, speculative=True))

    def _validate_assigned(self) -> None:
        """The ``nothing-launchable`` invariant: after an event, no pending task
        of a runnable stage could take a free slot (the rules of ``_assign`` and
        ``_launch_next``, from scratch)."""
        free = self._executors.with_free_slots()
        if not free:
            return
        cap = self._job_slot_cap()
        held = self._executors.slots_held()
        for job in self._jobs.values():
            usable = [r.id for r in free if r.id not in job.excluded]
            if not usable or (cap is not None and held.get(job.id, 0) >= cap):
                continue
            if job.commit is not None:
                continue  # being committed: it launches nothing (``_commit``)
            live = job.usable(self._executors.is_live)
            for sid, rec in job.stages.items():
                if not rec.pending_count or job.stage_state(sid, live) is not StageState.RUNNABLE:
                    continue
                for task in rec.tasks:
                    if not isinstance(task.state, Pending):
                        continue
                    elsewhere = [e for e in usable if e not in task.failed_on]
                    if elsewhere or not self._executors.any_taker(
                        job.excluded | set(task.failed_on)
                    ):
                        raise StateInvariantError(
                            "nothing-launchable",
                            f"task {task.id} is pending in a runnable stage while executor(s) "
                            f"{', '.join(elsewhere or usable)} have a free slot it may take",
                        )
