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

Statements take the kinds of ``SimConfig.write_kinds`` in turn: a location of
their own (``own``: ``CREATE``), one location every such statement appends to
(``append``: ``APPEND``, as ``INSERT``), one location that only the first commit
may take (``contested``: ``CREATE``, the others fail with ``WriteConflictError``),
one location each replaces (``replace``: ``REPLACE``, as ``CREATE OR REPLACE``).
A kind written ``-empty`` stages no file in any task (a ``PARTITION_BY`` write of
no rows): its commit moves nothing, and only the manifest says that it happened.
A ``drop`` is no write statement: its job runs as a plain query, and its client
drops the replaced location's table as it submits it (``DROP TABLE``: the real
``output.drop``, queued on the commit thread in order with the commits, its files
retired for their readers); the next replace makes the table again there.

What a replace retired waits, as in the scheduler, for every job unfinished when
its commit landed (the real ``writes.Retirements``, which dies with each scheduler
life), then the commit thread deletes it (``DeleteRetired``, in order with the
commits); a restarted scheduler looks through its locations for what waits
(``output.waiting_under``) once the commits it sends again are queued, as
``SchedulerCore.start`` does. Every ``SimConfig.read_every``-th job is a query of
the replaced location: planned at submission on the files its manifest lists then,
each of its attempts reads them as it starts.

The checks (docs/architecture.md, "Simulation"):

* ``write-once``: a statement that succeeded has, in its location's manifest, one
  file per task of its writing stage (none for an empty one), each there on
  disk, and no other file of it on disk; their values add up to the writing
  stage's fault-free total; its commit took effect (the manifest became its own)
  exactly once; a replaced one is exempt from the manifest's part only once a
  later commit to its location took effect;
* ``write-aborted``: one that failed or was cancelled left no committed file, and
  no commit of it took effect;
* ``write-replaced``: at the end, a location that statements replace holds only
  the files of its last commit, and on disk no other committed file;
* ``read-intact``: an attempt of a query not ended finds every file it was
  planned on;
* ``retired-deleted``: at the end, once the commit thread is done, no manifest
  lists a retired file (each was deleted once its readers were done, by the
  scheduler life that retired it or by the next one's sweep);
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
from mangonel.errors import DroppedLocationError
from mangonel.ids import JobId, StageId, TaskAttemptId
from mangonel.output import CommitMode, WriteConflictError
from mangonel.plan.physical import DistributedPlan, WriteTarget
from mangonel.scheduler.events import AbortWrite, CommitWrite
from mangonel.scheduler.writes import DeleteRetired, Retirements
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


SWEEP = "sweep"
"""The commit thread's look through the locations after a restart
(``CommitThread.sweep_retired``)."""

DROP = "drop-"
"""The start of a drop's id, which is all a drop command is: ``drop-<n>``."""

Queued = CommitWrite | AbortWrite | DeleteRetired | str
"""A command of the commit thread (``SWEEP`` and drops are strings)."""


class SimWrites:
    """The write side of one run: its directory, its statements, their commit queue."""

    def __init__(
        self, every: int, kinds: str = "own,append,contested", read_every: int = 0
    ) -> None:
        self.every = every
        self.read_every = read_every
        self.kinds = [_kind(k) for k in kinds.split(",") if k]
        """(kind, empty) of each statement in turn."""
        # In memory where the machine has it: every commit fsyncs its intent and manifest.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.root = tempfile.mkdtemp(prefix="mangonel-sim-writes-", dir=shm) if every else ""
        self.targets: dict[JobId, WriteTarget] = {}
        self.totals: dict[JobId, int] = {}
        """Each statement's fault-free total of its writing stage."""
        self.empty: set[JobId] = set()
        """Statements whose tasks stage no file."""
        self.took_effect: dict[JobId, int] = {}
        """Statements whose commit made the manifest theirs, with the commit's number."""
        self.latest: dict[str, JobId] = {}
        """Each location's statement whose commit took effect last."""
        self.queue: deque[tuple[int, Queued]] = deque()
        """Commands for the commit thread, each with the scheduler life that gave it."""
        self.retirements = Retirements()
        """What replaces retired, waiting for jobs: this scheduler life's."""
        self.reads: dict[JobId, tuple[str, ...]] = {}
        """Each query of the replaced location: the files it was planned on."""
        self.deleted = 0
        """Retired files deleted."""
        self.drops: list[str] = []
        """The drops clients asked for, to be queued as their jobs are submitted."""
        self.dropped = 0
        """Drops that took a table's files out."""
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
            if self.read_every and index % self.read_every == 0 and self.root:
                location = os.path.join(self.root, LOCATIONS["replace"])
                try:
                    self.reads[job] = output.manifest_files(location) or ()
                except DroppedLocationError:  # the query would fail to plan: reads nothing
                    self.reads[job] = ()
            return plan
        kind, empty = self.kinds[(index // self.every) % len(self.kinds)]
        if kind == "drop":
            self.drops.append(f"{DROP}{index}")
            return plan
        name = f"own-{job}" if kind == "own" else LOCATIONS[kind]
        if empty:
            self.empty.add(job)
        target = WriteTarget(
            location=os.path.join(self.root, name),
            format=WriteFormat.PARQUET,
            stage=WRITING_STAGE,
            columns=("k", "s"),
            mode=MODES[kind],
        )
        self.targets[job] = target
        self.totals[job] = sim_data.stage_total(plan, int(WRITING_STAGE))
        return replace(plan, write=target)

    # -------------------------------------------------------- the executors

    def read(self, spec: TaskSpec, ended: bool) -> None:
        """An attempt starts: ``read-intact`` if its job was planned on files gone since.
        ``ended``: its job ended (a late attempt of a cancelled job: what it reads
        no longer matters, and its end let the files go)."""
        files = () if ended else self.reads.get(spec.attempt.task.job, ())
        gone = [f for f in files if not os.path.exists(f)]
        if gone:
            raise Violation(
                "read-intact",
                f"{spec.attempt} of a query planned on {len(files)} files of "
                f"{posixpath.dirname(files[0])} found {sorted(gone)} deleted",
            )

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
        self.staged[sink.staging] = spec.attempt
        if spec.attempt.task.job in self.empty:
            return  # no rows: DuckDB's COPY with PARTITION_BY makes no file
        with open(os.path.join(sink.staging, STAGED_FILE), "w", encoding="utf-8") as f:
            f.write(text)

    # -------------------------------------------------------- the commit thread

    def put(self, life: int, command: Queued) -> bool:
        """Queue a command; whether the thread must be woken (it was idle)."""
        self.queue.append((life, command))
        if self.busy:
            return False
        self.busy = True
        return True

    def submitted(self, life: int) -> bool:
        """A job was submitted: queue the drop its client asked for with it, if it
        did; whether the thread must be woken."""
        wake = False
        while self.drops:
            wake = self.put(life, self.drops.pop(0)) or wake
        return wake

    def job_finished(self, life: int, job: JobId) -> bool:
        """A job ended: queue the deletions it alone held back; whether the thread
        must be woken (``CommitThread.job_finished``)."""
        wake = False
        for release in self.retirements.finished(str(job)):
            wake = self.put(life, release) or wake
        return wake

    def crashed(self) -> None:
        """The scheduler died: its commit thread and what waited in memory with it."""
        self.busy = False
        self.retirements = Retirements()

    def restarted(self, life: int) -> bool:
        """A scheduler is back and queued the commits it sends again: queue its look
        for what waits (only where something does, so that a run whose replaces
        retired nothing keeps its schedule); whether the thread must be woken."""
        if not self.root or not output.waiting_under(self.root):
            return False
        return self.put(life, SWEEP)

    def next(
        self,
        life: int,
        running: frozenset[str],
        crash: Callable[[], str | None],
    ) -> tuple[Queued, bool | str] | None:
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
        if isinstance(command, str) and command.startswith(DROP):
            return command, self._drop(command, running, crash())
        if isinstance(command, str):  # SWEEP
            for location, manifest in output.waiting_under(self.root):
                ready = self.retirements.committed(location, manifest.job, running)
                for release in ready:
                    self._delete(release)
            return command, True
        if isinstance(command, DeleteRetired):
            self._delete(command)
            return command, True
        target = command.target
        if isinstance(command, AbortWrite):
            output.abort(target.location, str(command.job))
            return command, True
        where = crash()

        def after_intent() -> None:
            if where == "intent":
                raise CommitCrash

        before = output.read_manifest(target.location)
        try:
            done = output.commit(
                target.location,
                str(command.job),
                dict(command.winners),
                target.format.value,
                target.mode,
                after_intent=after_intent,
                running=running,
            )
        except CommitCrash:
            self._took_effect(command.job, target.location, before)
            return command, False
        except WriteConflictError as exc:
            return command, str(exc)
        self._took_effect(command.job, target.location, before)
        self.commits += 1
        if where == "answer":
            return command, False
        if done.retired:
            # With no job that may read them, deleted before the answer.
            ready = self.retirements.committed(target.location, str(command.job), running)
            for release in ready:
                self._delete(release)
        return command, True

    def _delete(self, release: DeleteRetired) -> None:
        self.deleted += output.delete_retired(release.location, release.job)

    def _drop(self, drop_id: str, running: frozenset[str], where: str | None) -> bool:
        """``CommitThread._drop`` on the replaced location: ``False`` where the
        scheduler dies once the drop's manifest landed (``where``)."""
        location = os.path.join(self.root, LOCATIONS["replace"])
        dropped = output.drop(location, drop_id)
        if dropped is None:
            return True  # no table there (yet, or any more)
        if dropped.job == drop_id:
            self.dropped += 1
            self.latest[location] = JobId(drop_id)
        if where is not None:
            return False
        for release in self.retirements.committed(location, dropped.job, running):
            self._delete(release)
        return True

    def _took_effect(self, job: JobId, location: str, before: output.Manifest | None) -> None:
        """Note a commit that made the manifest ``job``'s: ``write-once`` if it did so
        before."""
        after = output.read_manifest(location)
        if after is None or after == before or after.job != str(job):
            return
        if job in self.took_effect:
            raise Violation(
                "write-once",
                f"write statement {job}'s commit took effect twice at {location} (its "
                f"manifest was {before.job if before else 'none'}'s the second time)",
            )
        self.took_effect[job] = len(self.took_effect)
        self.latest[location] = job

    # --------------------------------------------------------------- checks

    def check_succeeded(self, job: JobId) -> None:
        """``write-once``: the statement's files are its winners', once each."""
        target = self.targets.get(job)
        if target is None:
            return
        if job not in self.took_effect:
            raise Violation(
                "write-once",
                f"write statement {job} succeeded and no commit of it took effect at "
                f"{target.location}",
            )
        on_disk = sorted(f for f in _committed(target.location) if _of(f, job))
        if target.mode is CommitMode.REPLACE and self.latest[target.location] != job:
            return  # replaced since: its files are retired (and gone, checked at the end)
        manifest = output.read_manifest(target.location)
        mine = sorted(f for f in (manifest.files if manifest else ()) if _of(f, job))
        partitions = [_partition(f, job) for f in mine]
        if job in self.empty:
            if mine or on_disk:
                raise Violation(
                    "write-once",
                    f"write statement {job} staged no file and {mine} are in its "
                    f"manifest, {on_disk} on disk",
                )
            return
        if not mine or len(set(partitions)) != len(partitions):
            raise Violation(
                "write-once",
                f"write statement {job} succeeded with {mine} in its manifest: not one "
                "file per task of its writing stage",
            )
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
                if left or job in self.took_effect:
                    raise Violation(
                        "write-aborted",
                        f"write statement {job} did not succeed and left {left} at "
                        f"{target.location}, its commit "
                        f"{'took' if job in self.took_effect else 'did not take'} effect",
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
        self._check_replaced()
        for location in sorted({t.location for t in self.targets.values()}):
            manifest = output.read_manifest(location)
            if manifest is not None and manifest.retired:
                raise Violation(
                    "retired-deleted",
                    f"every job ended and {location}'s manifest ({manifest.job}'s) still "
                    f"lists {len(manifest.retired)} retired files",
                )

    def _check_replaced(self) -> None:
        """``write-replaced``: a replaced location holds its last commit's files only."""
        location = os.path.join(self.root, LOCATIONS["replace"])
        last = self.latest.get(location)
        if last is None:
            return
        manifest = output.read_manifest(location)
        if last.startswith(DROP):
            # Dropped last, every reader done: nothing of the table is left.
            left = sorted(_committed(location)) if os.path.isdir(location) else []
            if manifest is not None or left:
                whose = f"the manifest of {manifest.job}" if manifest else "no manifest"
                raise Violation(
                    "write-replaced",
                    f"{location} was dropped last ({last}) and holds {whose} and {left}",
                )
            return
        assert manifest is not None  # a commit took effect there
        others = [f for f in manifest.files if not _of(f, last)]
        # A replace whose answer was lost deletes what it retired at its next commit.
        on_disk = set(_committed(location)) - set(manifest.files) - set(manifest.retired)
        if manifest.job != str(last) or others or on_disk:
            raise Violation(
                "write-replaced",
                f"{location} was last replaced by {last}; its manifest is {manifest.job}'s "
                f"with {others} of other statements, and the disk holds {sorted(on_disk)} "
                "beside what it lists",
            )


MODES = {
    "own": CommitMode.CREATE,
    "append": CommitMode.APPEND,
    "contested": CommitMode.CREATE,
    "replace": CommitMode.REPLACE,
}
LOCATIONS = {"append": "appended", "contested": "contested", "replace": "replaced"}
"""The location every statement of a shared kind writes."""


def _kind(text: str) -> tuple[str, bool]:
    """(kind, empty) of one of ``SimConfig.write_kinds``."""
    kind, _, rest = text.strip().partition("-")
    if kind == "drop" and not rest:
        return kind, False
    if kind not in MODES or rest not in ("", "empty"):
        known = ", ".join(MODES)
        raise ValueError(f"write kind {text!r}: one of {known}, each maybe with -empty; or drop")
    return kind, rest == "empty"


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
