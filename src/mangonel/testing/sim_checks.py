"""The invariants the whole-cluster simulation checks, beyond ``SchedulerState.validate``.

``SimChecks`` is called by ``testing.cluster_sim`` at fixed points of a run
(after every scheduler event, at every command it carries out, at every fetch
and file deletion, at a restart, at the end) and raises ``Violation`` naming
the invariant broken; the names are listed in docs/architecture.md
("Simulation"). It sees the run through ``Observed``.
"""

from __future__ import annotations

from typing import Protocol

from mangonel.ids import ExecutorId, JobId
from mangonel.plan.physical import DistributedPlan
from mangonel.scheduler.events import (
    Command,
    Event,
    JobCancelled,
    JobFailed,
    JobSucceeded,
)
from mangonel.scheduler.invariants import StateInvariantError
from mangonel.scheduler.state import SchedulerState
from mangonel.scheduler.state_views import ExecutorState as SchedExecutorState
from mangonel.scheduler.store import MemoryStateStore
from mangonel.task import (
    LaunchTask,
    PartitionLocation,
    ReleaseOutputs,
)
from mangonel.testing import sim_data
from mangonel.testing.sim_restore import RestoreCheck
from mangonel.testing.sim_world import (
    Encodings,
    Proc,
    SimFile,
    SimResult,
    Violation,
    restored_state,
    state_documents,
)


class Observed(Protocol):
    """What the checks read of a run (``cluster_sim.ClusterSim``)."""

    state: SchedulerState
    store: MemoryStateStore
    now: float
    plans: dict[JobId, DistributedPlan]
    expected: dict[JobId, tuple[int, ...]]
    """Each job's answer, computed without faults."""
    known: set[JobId]
    procs: dict[str, Proc]
    result: SimResult

    def new_state(self) -> SchedulerState: ...

    def clock(self) -> float:
        """The scheduler's clock now."""
        ...


# ------------------------------------------------------------------ the checks


class SimChecks:
    """The invariants the simulator checks, beyond ``SchedulerState.validate``.

    Each method is called at one point of the run and raises ``Violation``
    naming the invariant it found broken (docs/architecture.md, "Simulation").
    """

    def __init__(self) -> None:
        self.outcome: dict[JobId, type[Command] | None] = {}
        """Each submitted job's end, once it ended (``None``: not yet)."""
        self.succeeded_results: dict[JobId, tuple[PartitionLocation, ...]] = {}
        self.read: set[JobId] = set()
        self.released: set[tuple[ExecutorId, JobId, int | None]] = set()
        self.deleted_by_release: set[str] = set()
        self.orphans: set[JobId] = set()
        """Jobs whose submission got no answer: the client does not read their results."""
        self.restore: RestoreCheck | None = None
        self.encodings = Encodings()
        """The live state's records encoded at earlier checks (``restore_equivalent``)."""

    def submitted(self, job: JobId) -> None:
        self.outcome[job] = None

    def after_handle(self, sim: Observed, event: Event, commands: list[Command]) -> None:
        try:
            sim.state.validate()
        except StateInvariantError as exc:
            raise Violation(exc.invariant, f"after {type(event).__name__}: {exc.detail}") from exc
        for job, ended in self.outcome.items():
            if ended is None:
                continue
            view = sim.state.job(job)  # the running one, were it kept twice (``job-state``)
            if view is not None and not view.state.finished:
                raise Violation(
                    "job-ends-once", f"job {job} ended ({ended.__name__}) and runs again"
                )

    def carried_out(self, sim: Observed, command: Command) -> None:
        now = sim.clock()  # the scheduler's: ``excluded_until`` is on its clock
        if isinstance(command, JobSucceeded | JobFailed | JobCancelled):
            job = command.job
            if self.outcome.get(job) is not None:
                raise Violation(
                    "job-ends-once",
                    f"job {job} ended as {type(command).__name__} after it had ended as "
                    f"{self.outcome[job].__name__}",  # type: ignore[union-attr]
                )
            self.outcome[job] = type(command)
            if isinstance(command, JobSucceeded):
                self.check_result(sim, job, command.result)
                sim.result.jobs_succeeded += 1
            elif isinstance(command, JobFailed):
                sim.result.jobs_failed += 1
            else:
                sim.result.jobs_cancelled += 1
        elif isinstance(command, LaunchTask):
            view = sim.state.executor(command.executor)
            # A mark behind a slow link bars new tasks only while the marks
            # hold (some unmarked executor takes tasks: ``state_link_marks``).
            marked = (
                view is not None
                and view.slow_link_since is not None
                and sim.state.slow_link_marks_hold
            )
            if (
                view is None
                or view.state is not SchedExecutorState.ALIVE
                or (view.excluded_until is not None and view.excluded_until > now)
                or marked
            ):
                raise Violation(
                    "launch-on-live",
                    f"{command.task.attempt} launched on {command.executor}, which is "
                    f"{view.state.name if view else 'unknown'}"
                    + (
                        f", excluded until {view.excluded_until}"
                        if view and view.excluded_until
                        else ""
                    )
                    + (
                        f", marked behind a slow link since {view.slow_link_since}"
                        if marked and view
                        else ""
                    ),
                )
            job = command.task.attempt.task.job
            for inp in command.task.inputs:
                for loc in inp.locations:
                    self.not_released(loc, job, f"{command.task.attempt} is given")
        elif isinstance(command, ReleaseOutputs):
            stages = [None] if command.stages is None else [int(s) for s in command.stages]
            for s in stages:
                self.released.add((command.executor, command.job, s))

    def not_released(self, loc: PartitionLocation, job: JobId, who: str) -> None:
        for key in ((loc.executor, job, int(loc.stage)), (loc.executor, job, None)):
            if key in self.released:
                raise Violation(
                    "read-after-release",
                    f"{who} {loc.path} (stage {loc.stage} of {job} on {loc.executor}), "
                    "whose outputs were released",
                )

    def fetched(self, sim: Observed, loc: PartitionLocation) -> None:
        job = loc.path.split("/")[3]
        if loc.path in self.deleted_by_release and self.outcome.get(JobId(job)) is None:
            raise Violation(
                "read-after-release", f"{loc.path} is read after its release deleted it"
            )

    def deleted(self, proc: Proc, path: str, f: SimFile, released: bool) -> None:
        if released:
            self.deleted_by_release.add(path)

    def check_result(
        self, sim: Observed, job: JobId, result: tuple[PartitionLocation, ...]
    ) -> None:
        final = sim.plans[job].stages[-1]
        expected = sim.expected[job]
        parts = [(loc.map_partition, loc.partition) for loc in result]
        if len(parts) != len(set(parts)) or len(result) != len(expected):
            raise Violation(
                "result-once", f"job {job} succeeded with outputs {parts}, not one per partition"
            )
        for loc in result:
            if loc.stage != final.id:
                raise Violation("result-once", f"job {job}'s result names stage {loc.stage}")
            self.not_released(loc, job, f"job {job}'s result is")
        got = tuple(sim_data.decode_value(loc.checksum) for loc in result)
        if got != expected:
            raise Violation(
                "result-checksum", f"job {job} succeeded with {got}, expected {expected}"
            )
        self.succeeded_results[job] = result

    def read_result(self, sim: Observed, job: JobId) -> None:
        self.read.add(job)

    def restore_equivalent(self, sim: Observed) -> None:
        live = state_documents(sim.state, self.encodings)
        self.encodings.forget()
        if self.restore is None:
            self.restore = RestoreCheck(sim.new_state)
        if live == self.restore.documents(sim.store.load()):
            return
        # Confirmed, and told, by restoring the whole store as a restart does.
        restored = state_documents(restored_state(sim.store, sim.new_state))
        if live != restored:
            differ = sorted(
                k for k in live.keys() | restored.keys() if live.get(k) != restored.get(k)
            )
            raise Violation("restore-equals-live", f"the store restores another state: {differ}")
        raise Violation(
            "restore-equals-live",
            "the store restores into the live state, but restoring only the keys that "
            "changed (sim_restore.RestoreCheck) said otherwise: a bug of the simulator",
        )

    def restarted(self, sim: Observed) -> None:
        for job in sorted(self.orphans):
            if sim.state.job(job) is None and self.outcome.get(job, 0) is None:
                del self.outcome[job]  # its submission was never written: it never was
                sim.known.discard(job)
        lost = sorted(j for j, o in self.outcome.items() if o is None and sim.state.job(j) is None)
        if lost:
            # Accepted, not ended as far as its client heard, and unknown now: the
            # client would ask about it in vain.
            raise Violation("lost-job", f"jobs {lost} were accepted and are gone after the restart")
        for view in sim.state.jobs():
            if view.state.finished and self.outcome.get(view.id) is None:
                # Its end was written, and the crash came before the client heard.
                finished = sim.state.export_finished(view.id)
                assert finished is not None
                kind = {
                    "SUCCEEDED": JobSucceeded,
                    "FAILED": JobFailed,
                    "CANCELLED": JobCancelled,
                }[view.state.name]
                self.carried_out(
                    sim,
                    kind(0, view.id, finished.result)  # type: ignore[arg-type]
                    if kind is JobSucceeded
                    else (
                        JobFailed(0, view.id, "")
                        if kind is JobFailed
                        else JobCancelled(0, view.id, "")
                    ),
                )

    def at_end(self, sim: Observed) -> None:
        """Once every job ended and its result was read: no slot is held, in the
        scheduler or on an executor, and no file of an ended job is left."""
        for view in sim.state.executors():
            if view.running:
                raise Violation(
                    "slots-conserved", f"{view.id} runs {view.running} attempts at the end"
                )
        for proc in sim.procs.values():
            if not proc.alive or proc.exited:
                continue
            if proc.running or proc.queue or sorted(proc.free) != list(range(proc.slots)):
                raise Violation(
                    "slots-conserved",
                    f"{proc.host} holds attempts {sorted(map(str, proc.running))}, queued "
                    f"{len(proc.queue)}, free slots {sorted(proc.free)} of {proc.slots}",
                )
            for life, home in proc.homes.items():
                home = {p: f for p, f in home.items() if not _unread(sim.state, f.job)}
                if home:
                    raise Violation(
                        "outputs-released",
                        f"{proc.host} still holds {len(home)} files of ended jobs in the home "
                        f"of {life}: {sorted(home)[:3]}",
                    )


def _unread(state: SchedulerState, job: JobId) -> bool:
    finished = state.export_finished(job)
    return finished is not None and finished.unread
