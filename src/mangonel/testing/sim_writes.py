"""Write statements in the whole-cluster simulation: staged files, the commit thread,
and the checks that their rows are committed exactly once.

Every ``SimConfig.write_every``-th job (``testing.cluster_sim``) is a write
statement: the synthetic plan's join stage is its writing stage (``WriteTarget``),
as ``plan.write.plan_write`` makes the last stage of a query of several tasks. Its
files are real, in a directory of the run's own, and the real ``output`` module
commits them:

* each attempt of the writing stage writes one file in its own staging directory
  (``TaskSpec.sink``) as it runs, which holds the value it computed once it
  completes, before its report goes out; one that fails or is stopped removes its
  directory (``output.discard_attempt``), one whose process dies leaves it;
* ``CommitWrite`` and ``AbortWrite`` run ``output.commit`` and ``output.abort`` one at
  a time, in order, as the scheduler's commit thread does (``scheduler.commits``);
  the queue dies with the scheduler, whose restart sends ``CommitWrite`` again; a
  scheduler crash may come between a commit's intent and its moves, or after the
  commit before its answer.

Statements cycle through three targets: a location of their own (``CREATE``), one
location every such statement appends to (``APPEND``, as ``INSERT``), and one
location that only the first commit may take (``CREATE``: the others fail with
``WriteConflictError``).

The checks (docs/architecture.md, "Simulation"):

* ``write-once``: a statement that succeeded has, in its location's manifest, one
  file per task of its writing stage, each there on disk, and no other file of it
  on disk; their values add up to the writing stage's fault-free total;
* ``write-aborted``: one that failed or was cancelled left no committed file;
* ``staging-cleaned``: at the end, no staged file of an ended statement is left,
  but those of attempts whose report no scheduler ever handled (their executor
  died or was cut off after staging), which only the next commit to the location
  sweeps.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from mangonel import output
from mangonel.ids import JobId, StageId, TaskAttemptId
from mangonel.output import CommitMode, WriteConflictError
from mangonel.plan.physical import DistributedPlan, WriteTarget
from mangonel.scheduler.events import AbortWrite, CommitWrite
from mangonel.task import TaskSpec, WriteFormat
from mangonel.testing import sim_data
from mangonel.testing.sim_world import Violation

WRITING_STAGE = StageId(3)
"""The synthetic plan's join stage (``scheduler_sim.synthetic_plan``): several tasks."""

STAGED_FILE = "data_0.parquet"
"""The one file an attempt stages (its content is the value, not Parquet: the
commit moves files, it does not read them)."""


class CommitCrash(Exception):
    """Raised inside ``output.commit`` where the simulated scheduler dies."""


class SimWrites:
    """The write side of one run: its directory, its statements, their commit queue."""

    def __init__(self, every: int) -> None:
        self.every = every
        # In memory where the machine has it: every commit fsyncs its intent and manifest.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.root = tempfile.mkdtemp(prefix="mangonel-sim-writes-", dir=shm) if every else ""
        self.targets: dict[JobId, WriteTarget] = {}
        self.totals: dict[JobId, int] = {}
        """Each statement's fault-free total of its writing stage."""
        self.queue: deque[tuple[int, CommitWrite | AbortWrite]] = deque()
        """Commands for the commit thread, each with the scheduler life that gave it."""
        self.busy = False
        self.staged: dict[str, TaskAttemptId] = {}
        """Staging directory of an attempt -> the attempt."""
        self.reported: set[TaskAttemptId] = set()
        """Attempts whose report a scheduler handled."""
        self.commits = 0
        """Commits carried out to the end (their answers may be lost)."""

    def close(self) -> None:
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ plans

    def plan(self, index: int, job: JobId, plan: DistributedPlan) -> DistributedPlan:
        """Job ``index``'s plan: ``plan`` itself, or it as a write statement."""
        if not self.every or index % self.every:
            return plan
        kind = (index // self.every) % 3
        name, mode = (
            (f"own-{job}", CommitMode.CREATE),
            ("appended", CommitMode.APPEND),
            ("contested", CommitMode.CREATE),
        )[kind]
        target = WriteTarget(
            location=os.path.join(self.root, name),
            format=WriteFormat.PARQUET,
            stage=WRITING_STAGE,
            columns=("k", "s"),
            mode=mode,
        )
        self.targets[job] = target
        self.totals[job] = sim_data.stage_total(plan, int(WRITING_STAGE))
        return replace(plan, write=target)

    # -------------------------------------------------------- the executors

    def begin(self, spec: TaskSpec) -> None:
        """A writing attempt starts: its file is there, half written (``executor.sink``)."""
        self._write(spec, "half written")

    def stage(self, spec: TaskSpec, values: dict[int, int]) -> None:
        """A writing attempt completed: its file holds its rows (their value)."""
        self._write(spec, str(sum(values.values()) % sim_data.MODULUS))

    def discard(self, spec: TaskSpec) -> None:
        """A writing attempt failed or was stopped: it removes what it wrote."""
        assert spec.sink is not None
        output.discard_attempt(spec.sink.staging)

    def _write(self, spec: TaskSpec, text: str) -> None:
        sink = spec.sink
        assert sink is not None
        os.makedirs(sink.staging, exist_ok=True)
        with open(os.path.join(sink.staging, STAGED_FILE), "w", encoding="utf-8") as f:
            f.write(text)
        self.staged[sink.staging] = spec.attempt

    # -------------------------------------------------------- the commit thread

    def put(self, life: int, command: CommitWrite | AbortWrite) -> bool:
        """Queue a command; whether the thread must be woken (it was idle)."""
        self.queue.append((life, command))
        if self.busy:
            return False
        self.busy = True
        return True

    def next(
        self,
        life: int,
        running: frozenset[str],
        crash: Callable[[], str | None],
    ) -> tuple[CommitWrite | AbortWrite, bool | str] | None:
        """Carry out the next command of scheduler life ``life`` (those of dead
        lives are dropped, as their thread died): ``(command, outcome)`` with the
        outcome ``True`` (committed or aborted), a conflict's message, or
        ``False`` where the scheduler died during it; ``None`` when none is left.

        ``crash()`` says where this commit's scheduler dies: ``"intent"``
        (after the intent, before any move), ``"answer"`` (committed, before the
        answer), or ``None``.
        """
        while self.queue and self.queue[0][0] != life:
            self.queue.popleft()
        if not self.queue:
            self.busy = False
            return None
        _, command = self.queue.popleft()
        target = command.target
        if isinstance(command, AbortWrite):
            output.abort(target.location, str(command.job))
            return command, True
        where = crash()

        def after_intent() -> None:
            if where == "intent":
                raise CommitCrash

        try:
            output.commit(
                target.location,
                str(command.job),
                dict(command.winners),
                target.format.value,
                target.mode,
                after_intent=after_intent,
                running=running,
            )
        except CommitCrash:
            return command, False
        except WriteConflictError as exc:
            return command, str(exc)
        self.commits += 1
        if where == "answer":
            return command, False
        return command, True

    # --------------------------------------------------------------- checks

    def check_succeeded(self, job: JobId) -> None:
        """``write-once``: the statement's files are its winners', once each."""
        target = self.targets.get(job)
        if target is None:
            return
        manifest = output.read_manifest(target.location)
        mine = sorted(f for f in (manifest.files if manifest else ()) if _of(f, job))
        partitions = [_partition(f, job) for f in mine]
        if not mine or len(set(partitions)) != len(partitions):
            raise Violation(
                "write-once",
                f"write statement {job} succeeded with {mine} in its manifest: not one "
                "file per task of its writing stage",
            )
        on_disk = sorted(f for f in _committed(target.location) if _of(f, job))
        if on_disk != mine:
            raise Violation(
                "write-once",
                f"write statement {job}: its manifest names {mine}, the disk has {on_disk}",
            )
        total = 0
        for name in mine:
            with open(os.path.join(target.location, name), encoding="utf-8") as f:
                text = f.read()
            if not text.isdigit():
                raise Violation(
                    "write-once", f"write statement {job} committed {name}, which is {text}"
                )
            total = (total + int(text)) % sim_data.MODULUS
        if total != self.totals[job]:
            raise Violation(
                "write-once",
                f"write statement {job}'s files hold {total}, expected {self.totals[job]}",
            )

    def check_end(self, succeeded: set[JobId], ended: set[JobId]) -> None:
        """``write-aborted`` and ``staging-cleaned``, once every job ended."""
        for job, target in sorted(self.targets.items()):
            if job not in ended:
                continue
            if job in succeeded:
                self.check_succeeded(job)  # again: later commits to its location kept it
            else:
                left = [f for f in _committed(target.location) if _of(f, job)]
                if left:
                    raise Violation(
                        "write-aborted",
                        f"write statement {job} did not succeed and left {left} at "
                        f"{target.location}",
                    )
            staging = output.job_staging(target.location, str(job))
            if not os.path.isdir(staging):
                continue
            entries = os.listdir(staging)
            unreported = {
                _dir(attempt)
                for entry in entries
                if (attempt := self.staged.get(os.path.join(staging, entry))) is not None
                and attempt not in self.reported
            }
            strays = sorted(set(entries) - unreported)
            if strays:
                raise Violation(
                    "staging-cleaned",
                    f"write statement {job} ended and its staging directory still holds "
                    f"{strays} at {target.location}",
                )


def _of(name: str, job: JobId) -> bool:
    return posixpath.basename(name).startswith(f"part-{job}-p")


def _partition(name: str, job: JobId) -> int:
    """The task a committed file of ``job`` came from (``output.final_name``)."""
    rest = posixpath.basename(name)[len(f"part-{job}-p") :]
    return int(rest.split("-", 1)[0])


def _dir(attempt: TaskAttemptId) -> str:
    return posixpath.basename(
        output.attempt_staging("", "", attempt.task.partition, attempt.attempt)
    )


def _committed(location: str) -> list[str]:
    """The files at a location outside its staging directory, as relative names."""
    found = []
    for here, dirs, files in os.walk(location):
        dirs[:] = [d for d in dirs if d != output.STAGING]
        for name in files:
            if name != output.MANIFEST:
                found.append(os.path.relpath(os.path.join(here, name), location))
    return found


__all__ = ["STAGED_FILE", "WRITING_STAGE", "CommitCrash", "SimWrites"]
