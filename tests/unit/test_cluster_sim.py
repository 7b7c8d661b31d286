"""The whole-cluster simulation: fixed seeds hold every invariant, and each
invariant catches a bug planted on purpose.

``testing.cluster_sim`` runs the real scheduler and executor state machines
with a simulated network, disks, task work and clients, faults at random
steps, and checks the invariants after every scheduler event (see
docs/architecture.md, "Simulation"). A failing seed here prints the command
that replays it; ``--shrink`` on that command finds a short fault schedule.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest

from mangonel.executor import events as ex
from mangonel.executor.state import ExecutorMachine
from mangonel.ids import ExecutorId, JobId, StageId
from mangonel.scheduler.events import (
    CancelRequested,
    Command,
    Event,
    ExecutorConnected,
    ExecutorDraining,
    ExecutorRegistered,
    ExecutorStreamReopened,
    JobCancelled,
    JobSubmitted,
    JobSucceeded,
    SchedulerRecovered,
    TaskCompleted,
)
from mangonel.scheduler.persist import (
    StateWriter,
    StoredPlan,
    job_key,
    read_snapshot,
    state_changes,
)
from mangonel.scheduler.state import SchedulerState
from mangonel.scheduler.state_recovery import Step
from mangonel.scheduler.store import MemoryStateStore
from mangonel.task import (
    ExecutorInfo,
    LaunchTask,
    OutputKind,
    PartitionOutput,
    ReleaseOutputs,
    TaskSpec,
)
from mangonel.testing.cluster_sim import (
    ClusterSim,
    Fault,
    Proc,
    SimChecks,
    SimConfig,
    SimResult,
    _parse,
    run,
    shrink,
)
from mangonel.testing.scheduler_sim import synthetic_plan
from mangonel.testing.sim_restore import RestoreCheck
from mangonel.testing.sim_world import new_state, restored_state, state_documents

CI_SEEDS = range(0, 80)
"""Seeds run on every push (about 12 s on a loaded two-core machine)."""


def _assert_holds(result: SimResult) -> None:
    assert result.violation is None, (
        f"{result.violation}\nreplay: {result.config.command()} --shrink\n"
        f"faults: {' '.join(result.schedule)}"
    )


@pytest.mark.parametrize("seeds", [CI_SEEDS[i::4] for i in range(4)])
def test_fixed_seeds_hold_every_invariant(seeds: range) -> None:
    ended = succeeded = faults = 0
    for seed in seeds:
        result = run(SimConfig(seed=seed))
        _assert_holds(result)
        assert result.jobs_ended == result.jobs_accepted >= result.config.jobs
        ended += result.jobs_ended
        succeeded += result.jobs_succeeded
        faults += sum(result.faults.values())
    # The runs did meet faults, and most jobs still succeeded (their answers
    # checked): a simulation whose every job failed would prove nothing.
    assert faults >= 5 * len(seeds)
    assert succeeded >= ended // 2


@pytest.mark.parametrize(
    "config",
    [
        SimConfig(seed=1, executors=1, slots=1, jobs=2),  # one slot: every job queues
        SimConfig(seed=2, executors=6, slots=1, jobs=4, concurrent=4, tasks=14, partitions=4),
        SimConfig(seed=3, faults=(Fault.SCHEDULER_CRASH,), fault_every_s=1.5, jobs=4),
        SimConfig(seed=4, faults=(Fault.CUT, Fault.FLAP, Fault.PEER_CUT), fault_every_s=1.0),
        SimConfig(seed=5, faults=(Fault.FREEZE, Fault.EXECUTOR_CRASH, Fault.DRAIN), jobs=4),
        SimConfig(seed=6, faults=(Fault.CORRUPT, Fault.TASK_ERROR), task_fault_rate=0.2),
    ],
    ids=["one-slot", "wide", "scheduler-crashes", "cuts", "processes", "bad-data"],
)
def test_shapes_and_fault_mixes_hold_every_invariant(config: SimConfig) -> None:
    result = run(config)
    _assert_holds(result)
    assert result.jobs_ended == result.jobs_accepted >= config.jobs


BEFORE_STREAM_LAG = tuple(k for k in Fault if k is not Fault.STREAM_LAG)
"""The fault kinds before ``stream-lag``: a new kind changes every seed's
schedule, so a seed found before it names the kinds it was found with."""

HEARTBEAT_FAULTS = (
    Fault.STREAM_LAG,
    Fault.FLAP,
    Fault.CUT_TO_SCHEDULER,
    Fault.EXECUTOR_CRASH,
    Fault.SCHEDULER_CRASH,
)


FOUND = [
    # A Tick's recompute on suspicion made an output again past its limit
    # (found at 490c55e among 19,421 seeds; shrunk to 14 faults).
    SimConfig(seed=612404, jobs=8, concurrent=3, faults=BEFORE_STREAM_LAG, skip=(4, 6, 9, 10, 18)),
    # A heartbeat's running count made an executor lag, a field the store
    # keeps, without marking the stored snapshot stale (``executor-index``;
    # the first seed run once heartbeats counted their attempts).
    SimConfig(seed=3, jobs=8, concurrent=3, skip=(1, 2)),
    # The simulator's own fault: a stream lag begun just before faults stopped
    # held its releases past the end checks (``outputs-released``), as if
    # faults went on; a held stream now flows once they stop.
    SimConfig(seed=711293, jobs=8, concurrent=3, skip=(6, 7, 11, 13)),
    # A copy of a reader behind a slow link of its own was launched while a
    # map output it reads was being made again: its spec named the other
    # outputs only, and the job succeeded with a wrong answer
    # (``result-checksum``; found among 4,645 seeds at cde3f3f).
    SimConfig(seed=714366, jobs=8, concurrent=3, skip=(2, 5, 11)),
    # A stream move counted in a field the store keeps without marking the
    # stored snapshot stale (``executor-index``; the first seed run once the
    # simulated executors moved their streams).
    SimConfig(seed=4, jobs=4, faults=HEARTBEAT_FAULTS, skip=(0, 1)),
    # A draining executor's stream moved after a cut, and the launches it had
    # not received were sent again down the new one: a draining executor was
    # given new work (``launch-on-live``; found at 85ba431 among 390 seeds).
    SimConfig(seed=1000058, jobs=8, concurrent=3, skip=(2, 4)),
    # The same on an executor marked behind a slow link (found in that batch).
    SimConfig(seed=1001733, jobs=8, concurrent=3),
    # A launch sent again on a moved stream was written anew while a map output
    # its stage reads was being made again: it named three of four, and the job
    # succeeded with a wrong answer (``result-checksum``; that batch, shrunk).
    SimConfig(seed=1004598, jobs=8, concurrent=3, skip=(2, 3, 4, 6, 7, 9)),
    # The simulator's own fault: once faults stopped it thawed only one frozen
    # process, so a release delivered to another stayed unread (``outputs-released``).
    SimConfig(seed=1009849, jobs=8, concurrent=3, skip=(5, 7)),
    # A cancelled job's attempt reported done after the cancel: the scheduler
    # took the report for stale and left the files it wrote, which no release
    # had reached (``outputs-released``; found at 72d6e37 among 7,000 seeds,
    # shrunk to 11 faults). A stale report of an ended job now releases them.
    SimConfig(seed=904345, jobs=8, concurrent=3, skip=(5, 6, 13, 14, 15, 16)),
    # The simulator's own fault: the run ended on the tick that expired an
    # orphan's unread result, its release still on the way (``outputs-released``;
    # four executors of one slot, fair shares of a half, shrunk to 18 faults). A
    # run now ends once every command sent has landed.
    SimConfig(
        seed=3002727,
        executors=4,
        slots=1,
        jobs=8,
        concurrent=4,
        tasks=16,
        partitions=6,
        fault_every_s=1.5,
        max_job_share=0.5,
        skip=(7, 10, 15, 16, 17, 20, 24, 25),
        write_every=2,
    ),
    # One event failed five jobs (every executor excluded), more than the history
    # keeps: two were forgotten in the event that ended them, and their tasks'
    # keys stayed in the store, which a restart read as a job without a plan
    # (``restore-equals-live``; five jobs at once; 4 faults).
    SimConfig(seed=3600031, jobs=8, concurrent=5),
    # One event failed four jobs (the executors gone) and forgot two of them in
    # the same write (two settled jobs kept); the scheduler died before that
    # event's commands went out, and the clients asked the restarted one about
    # jobs it did not know (``lost-job``; a denser mix than before, found at
    # ebb1470 among its first 400 seeds). A job is now kept ``keep_finished_s``
    # after it ends.
    SimConfig(
        seed=6000394,
        executors=2,
        slots=3,
        jobs=6,
        concurrent=4,
        tasks=12,
        partitions=5,
        fault_every_s=0.8,
        task_fault_rate=0.1,
        duplicate_rate=0.1,
        latency_s=0.3,
        write_every=2,
        write_kinds="replace,drop,own-empty,append,contested-empty",
        read_every=2,
        keep_finished_jobs=2,
        keep_lost_executors=1,
    ),
]
"""Seeds that broke an invariant in a batch (``scripts/simulate.py``), shrunk: each
fails on the code before its fix."""


@pytest.mark.parametrize("config", FOUND, ids=lambda c: f"seed-{c.seed}")
def test_seeds_found_by_batches_hold_every_invariant(config: SimConfig) -> None:
    result = run(config)
    _assert_holds(result)
    assert result.jobs_ended == result.jobs_accepted >= config.jobs


def test_slow_links_amid_crashes_are_worked_around_and_hold_every_invariant() -> None:
    # Executors' outbound links slow down while processes and the scheduler
    # crash: jobs stop reading the slow ones (``state_links``), which cancels
    # readers and makes outputs again, and every answer is still the one.
    config = SimConfig(
        seed=5, faults=(Fault.SLOW_LINK, Fault.EXECUTOR_CRASH, Fault.SCHEDULER_CRASH), jobs=4
    )
    result = run(config)
    _assert_holds(result)
    assert result.jobs_ended == result.jobs_accepted >= config.jobs
    assert result.faults["rule:slow-link"] >= 1  # the rule acted, more than once here


def test_heartbeats_count_running_attempts_and_failed_beats_and_their_rules_act() -> None:
    # Simulated heartbeats say how many attempts the executor runs and how many
    # of its heartbeats failed (unanswered within the deadline) since its last
    # answered one. A command stream held up while heartbeats go through
    # (``stream-lag``) makes its executor lag and catch up; a flapping link's
    # failed beats end in quarantines, and the quarantined executors' outputs
    # are made again elsewhere; a silent executor that work waits on is
    # suspected early (hedged); a heartbeat answered after failed ones has its
    # executor move its stream, and the move releases the files of jobs that
    # ended meanwhile; crashes and restarts all the while. Every invariant
    # holds, and each rule acted (the counts of its health changes).
    rules: Counter[str] = Counter()
    for seed in range(10, 15):  # seeds where every rule below acts
        config = SimConfig(seed=seed, faults=HEARTBEAT_FAULTS, jobs=4)
        result = run(config)
        _assert_holds(result)
        assert result.jobs_ended == result.jobs_accepted >= config.jobs
        rules.update(result.faults)
    assert rules["beat:failed"] >= rules["beat:failed-reported"] > 0, rules
    for rule in (
        "rule:lagging",
        "rule:caught-up",
        "rule:hedged",
        "rule:relapsed",
        "rule:quarantined",
        "rule:quarantine-moved",
        "rule:stream-moved",
        "rule:stream-move-released",
    ):
        assert rules[rule] > 0, f"{rule} never acted: {rules}"


class _NoReleaseOnMove(SchedulerState):
    """Releases nothing when a stream moves (as before ``held_jobs``)."""

    def _stream_reopened(self, event: ExecutorStreamReopened, step: Step) -> None:
        super()._stream_reopened(replace(event, held_jobs=()), step)


def test_what_a_moved_stream_left_behind_is_released_by_the_move() -> None:
    # A moved stream's old one is closed with what it still carried: here a
    # release of a job that ended while the link was down. Without the release
    # on the move (``state_streams``), its files outlive the run. (A seed where
    # that happens, found by trying them in order: the rules that judge
    # silences change which seeds do.)
    config = SimConfig(seed=30, faults=HEARTBEAT_FAULTS, jobs=4)
    without = run(config, scheduler=_NoReleaseOnMove)
    assert without.violation is not None
    assert without.violation.invariant == "outputs-released"
    result = run(config)
    _assert_holds(result)
    assert result.faults["rule:stream-move-released"] > 0


class _NoFailedBeats(ClusterSim):
    """Its executors' heartbeats never say that some failed."""

    def heartbeat(self, executor, unhealthy, links=(), probes=(), failed_beats=0, running=None):  # type: ignore[no-untyped-def]
        return super().heartbeat(executor, unhealthy, links, probes, 0, running)


def test_a_heartbeat_after_a_failed_one_is_unheard_while_either_way_is_cut() -> None:
    # ``executor.link`` gives a failed heartbeat's connection up; the next
    # goes on a new one, whose handshake needs both ways. Cut from the
    # scheduler one way, an executor's heartbeats after its first failure are
    # never made, let alone heard (as on the lab, 2026-12-06): the cut is a
    # silence, as a cut both ways is, and the failed beats it reports when it
    # ends add nothing (the silence was long). Before, the simulation sent
    # them down the old connection: each arrived a deadline late saying one
    # had failed, and a one-way cut of 3.75 s quarantined its executor.
    told = untold = unmade = 0
    for seed in range(5):
        config = SimConfig(seed=seed, faults=(Fault.CUT_FROM_SCHEDULER,), jobs=4)
        result = run(config)
        _assert_holds(result)
        unmade += result.faults["beat:no-connection"]
        told += result.faults["rule:quarantined"]
        untold += _NoFailedBeats(config).run().faults["rule:quarantined"]
    assert unmade > 0
    assert told == untold, (told, untold)


class _Watched(ClusterSim):
    """Counts what the clock and registration faults did to the scheduler."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.last_time = float("-inf")
        self.backwards = self.twice = 0
        self.drifted: set[float] = set()

    def emit(self, make):  # type: ignore[no-untyped-def]
        self.backwards += self.clock() < self.last_time
        self.last_time = self.clock()
        self.drifted |= {p.rate for p in self.procs.values()}
        return super().emit(make)

    def act(self, proc: Proc, action: ex.Action) -> None:
        self.twice += isinstance(action, ex.Register) and proc.register_twice and self.up
        super().act(proc, action)


def test_clock_steps_drifts_and_registrations_taken_twice_hold_every_invariant() -> None:
    # The scheduler's clock steps back and forth (times stored before a step
    # are compared with times after it), executors' clocks run fast and slow
    # (heartbeats early and late), and registrations reach the scheduler twice
    # (a first try whose answer was lost: a registration that never connects,
    # or a resume asked twice).
    faults = (Fault.CLOCK_STEP, Fault.CLOCK_DRIFT, Fault.REGISTER_TWICE)
    backwards = twice = 0
    drifted: set[float] = set()
    for seed in range(6):  # a registration taken twice is rare: seed 5 has one
        config = SimConfig(
            seed=seed, faults=(*faults, Fault.EXECUTOR_CRASH, Fault.SCHEDULER_CRASH), jobs=4
        )
        sim = _Watched(config)
        _assert_holds(sim.run())
        assert sim.result.jobs_ended == sim.result.jobs_accepted >= config.jobs
        backwards += sim.backwards
        drifted |= sim.drifted
        twice += sim.twice
    assert backwards > 0, "the scheduler's clock never went back"
    assert min(drifted) < 0.9 and max(drifted) > 1.1, "no executor's clock drifted"
    assert twice > 0, "no registration was sent twice"


def test_a_run_is_a_function_of_its_seed_and_configuration() -> None:
    a, b = run(SimConfig(seed=11)), run(SimConfig(seed=11))
    assert a.summary() == b.summary() and a.schedule == b.schedule
    assert a.schedule, "the run met no fault"
    assert run(SimConfig(seed=12)).schedule != a.schedule
    # Replayed by its command in another process, whose string hashes (and so
    # the order of any set of ids) differ: the same run.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    args = shlex.split(SimConfig(seed=11).command())[1:]
    out = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, check=True
    ).stdout
    summary, schedule = out.rsplit("faults:", 1)
    assert json.loads(summary) == json.loads(json.dumps(a.summary()))
    assert schedule.split() == a.schedule


def test_the_replay_command_parses_back_into_its_configuration() -> None:
    config = SimConfig(
        seed=7, executors=5, faults=(Fault.CUT, Fault.DRAIN), skip=(1, 4), check_restore=False
    )
    args = shlex.split(config.command())
    assert args[:3] == ["python", "-m", "mangonel.testing.cluster_sim"]
    parsed, shrinking = _parse(args[3:])
    assert parsed == config and not shrinking


class _BothRestores(SimChecks):
    """Restores the whole store at every check too, and counts the checks where
    that and ``RestoreCheck`` (only the keys that changed) disagree, or where the
    live state's documents differ from those encoded afresh."""

    def __init__(self) -> None:
        super().__init__()
        self.checks = self.differ = 0
        self.mine: RestoreCheck | None = None

    def restore_equivalent(self, sim: ClusterSim) -> None:  # type: ignore[override]
        if self.mine is None:
            self.mine = RestoreCheck(sim.new_state)
        whole = state_documents(restored_state(sim.store, sim.new_state))
        self.checks += 1
        self.differ += self.mine.documents(sim.store.load()) != whole
        # The live state's documents, with the texts of unchanged records kept: as encoded afresh.
        self.differ += state_documents(sim.state, self.encodings) != state_documents(sim.state)
        super().restore_equivalent(sim)


def test_restoring_only_what_changed_gives_what_restoring_everything_gives() -> None:
    # ``restore-equals-live`` restores only the jobs whose keys changed since
    # the last write (``sim_restore``): at every write of these runs (scheduler
    # crashes, jobs forgotten, adaptive stages, executors lost) the documents
    # it gives are those a restore of the whole store gives.
    checks = 0
    for config in (
        SimConfig(seed=3, faults=(Fault.SCHEDULER_CRASH,), fault_every_s=1.5, jobs=4),
        SimConfig(seed=8, jobs=8, concurrent=3),
        SimConfig(seed=29),
    ):
        both = _BothRestores()
        _assert_holds(run(config, both))
        assert both.differ == 0, f"{both.differ} of {both.checks} checks differ ({config})"
        checks += both.checks
    assert checks > 300


# ---------------------------------------------------------------- planted bugs
#
# Each test breaks one rule on purpose (in the state machine, the executor's
# state machine, or the shell the simulator plays) and expects the simulator
# to name the invariant it breaks.

QUIET = SimConfig(seed=21, faults=(), jobs=2, liveness_s=60.0)
"""No fault: what fails is the planted bug."""


def _violation(result: SimResult) -> str:
    assert result.violation is not None, "the planted bug went unnoticed"
    return result.violation.invariant


class _EndsTwice(SchedulerState):
    """A cancel of a job that already succeeded cancels it (again)."""

    def handle(self, event: Event) -> list[Command]:
        commands = super().handle(event)
        if isinstance(event, CancelRequested):
            view = self.job(event.job)
            if view is not None and view.state.finished:
                commands.append(JobCancelled(event.event_id, event.job, "again"))
        return commands


class _CancelDone(ClusterSim):
    def watch(self, job: JobId) -> None:
        view = self.state.job(job) if self.up else None
        if view is not None and view.state.finished:
            self.emit(lambda i, t: CancelRequested(i, t, job))
        super().watch(job)


def test_a_job_that_ends_twice_is_caught() -> None:
    sim = _CancelDone(QUIET, scheduler=_EndsTwice)
    assert _violation(sim.run()) == "job-ends-once"


class _ResultTwice(SchedulerState):
    def handle(self, event: Event) -> list[Command]:
        return [
            replace(c, result=c.result + c.result[:1]) if isinstance(c, JobSucceeded) else c
            for c in super().handle(event)
        ]


def test_a_result_partition_given_twice_is_caught() -> None:
    assert _violation(run(QUIET, scheduler=_ResultTwice)) == "result-once"


class _MixedPartitions(ClusterSim):
    """A shuffle writer that writes partition 0's rows into partition 1's file."""

    def work(self, proc: Proc, executor: ExecutorId, spec: TaskSpec) -> ex.TaskOutcome:
        outcome = super().work(proc, executor, spec)
        if isinstance(outcome, ex.Completed) and spec.output.kind is OutputKind.HASH:
            a, b, *rest = outcome.outputs
            home = proc.homes[executor]
            home[a.path], home[b.path] = home[b.path], home[a.path]
            a2, b2 = replace(a, checksum=b.checksum), replace(b, checksum=a.checksum)
            return ex.Completed((a2, b2, *rest))
        return outcome


def test_a_mixed_up_partition_shows_as_a_wrong_checksum() -> None:
    assert _violation(_MixedPartitions(QUIET).run()) == "result-checksum"


class _LaunchOnDraining(SchedulerState):
    """Places new tasks on an executor that is draining."""

    draining: ExecutorId | None = None

    def handle(self, event: Event) -> list[Command]:
        commands = super().handle(event)
        if isinstance(event, ExecutorDraining):
            self.draining = event.executor
        if self.draining is None:
            return commands
        return [
            replace(c, executor=self.draining) if isinstance(c, LaunchTask) else c for c in commands
        ]


def test_a_task_placed_on_an_executor_that_may_not_take_it_is_caught() -> None:
    config = replace(QUIET, faults=(Fault.DRAIN,), fault_every_s=2.0)
    assert _violation(run(config, scheduler=_LaunchOnDraining)) == "launch-on-live"


class _ReleaseEarly(SchedulerState):
    """Releases a map task's files the moment it reports them."""

    def handle(self, event: Event) -> list[Command]:
        commands = super().handle(event)
        if isinstance(event, TaskCompleted) and event.attempt.task.stage == StageId(1):
            job = event.attempt.task.job
            commands.append(ReleaseOutputs(event.event_id, event.executor, job, (StageId(1),)))
        return commands


def test_an_output_read_after_its_release_is_caught() -> None:
    assert _violation(run(QUIET, scheduler=_ReleaseEarly)) == "read-after-release"


class _ForgetsTaskKeys(ClusterSim):
    """A persistence bug: one commit loses the task documents it should write."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        commit, count = self.writer.commit, [0]

        def lossy(puts, deletes):  # type: ignore[no-untyped-def]
            count[0] += 1
            if count[0] == 12:
                puts = {k: v for k, v in puts.items() if "/tasks/" not in k}
            commit(puts, deletes)

        self.writer.commit = lossy  # type: ignore[method-assign]


def test_a_store_that_restores_another_state_is_caught() -> None:
    assert _violation(_ForgetsTaskKeys(QUIET).run()) == "restore-equals-live"


class _NeverLaunchesTheFinalStage(SchedulerState):
    def handle(self, event: Event) -> list[Command]:
        return [
            c
            for c in super().handle(event)
            if not (isinstance(c, LaunchTask) and c.task.attempt.task.stage == StageId(4))
        ]


def test_a_job_that_never_ends_is_caught() -> None:
    assert _violation(run(QUIET, scheduler=_NeverLaunchesTheFinalStage)) == "liveness"


class _KeepsStoppedSlots(ClusterSim):
    """An executor shell that never gives back the slot of a cancelled attempt."""

    def task_ended(self, proc, attempt, outcome):  # type: ignore[no-untyped-def]
        if isinstance(outcome, ex.Stopped) and attempt in proc.running:
            del proc.running[attempt]
            self.feed(proc, ex.TaskFinished(attempt, outcome, 0.1))
            return
        super().task_ended(proc, attempt, outcome)


def test_a_slot_never_given_back_is_caught() -> None:
    config = replace(QUIET, faults=(Fault.CANCEL,), fault_every_s=1.0, jobs=4)
    assert _violation(_KeepsStoppedSlots(config).run()) == "slots-conserved"


class _KeepsReleasedFiles(ExecutorMachine):
    def handle(self, event: ex.Event) -> list[ex.Action]:
        if isinstance(event, ex.OutputsReleased):
            return []
        return super().handle(event)


def test_files_never_deleted_after_their_release_are_caught() -> None:
    assert _violation(run(QUIET, executor=_KeepsReleasedFiles)) == "outputs-released"


class _LosesCounts(SchedulerState):
    """The state's own bookkeeping goes wrong: ``validate`` names it."""

    broken = False

    def handle(self, event: Event) -> list[Command]:
        commands = super().handle(event)
        if isinstance(event, TaskCompleted) and not self.broken:
            job = self._jobs.get(event.attempt.task.job)
            if job is not None:
                job.stages[StageId(4)].tasks.pop()  # a task record goes missing
                self.broken = True
        return commands


def test_a_state_that_breaks_its_own_invariants_is_caught() -> None:
    assert _violation(run(QUIET, scheduler=_LosesCounts)).startswith("stage")


def test_the_shrinker_keeps_only_the_faults_a_failure_needs() -> None:
    config = SimConfig(seed=5, jobs=2, fault_every_s=0.8, faults_until_s=10.0, liveness_s=15.0)
    full = run(config, scheduler=_NeverLaunchesTheFinalStage)
    assert _violation(full) == "liveness" and len(full.schedule) >= 10
    small = shrink(config, SimChecks, scheduler=_NeverLaunchesTheFinalStage)
    again = run(small, scheduler=_NeverLaunchesTheFinalStage)
    assert _violation(again) == "liveness"
    assert len(again.schedule) < len(full.schedule) // 2


# ------------------------------------------------------ bugs the simulation found


def test_seed_29_a_restart_before_an_adaptive_stage_launched_failed_its_job_later() -> None:
    # The restored scheduler's ``SchedulerRecovered`` assigned every task's
    # ``speculative`` (to ``None``), which marked every task changed and wrote a
    # key for each, those of a stage that had not launched included. Adaptive
    # execution then ran that stage as fewer tasks; the key of a task it no
    # longer had stayed, and the next restart could not restore the job (failed
    # as "could not restore this job"): ``restore-equals-live`` caught it.
    _assert_holds(run(SimConfig(seed=29)))


def test_a_restart_writes_no_task_of_a_stage_that_never_launched() -> None:
    store = MemoryStateStore("memory://regression")
    store.acquire("test")
    config = SimConfig(faults=())
    state = new_state(config, SchedulerState)
    writer = StateWriter(store, {})
    known: set[JobId] = set()
    ids = iter(range(1, 10_000))

    def emit(event: Event) -> list[Command]:
        commands = state.handle(event)
        changes = state_changes(state, known)
        if changes is not None:
            puts, deletes = changes
            if isinstance(event, JobSubmitted):
                puts[job_key(event.job, "plan")] = StoredPlan("q", 0.0, 0.0, event.plan)
            writer.commit(puts, deletes)
        return commands

    e1 = ExecutorId("e1")
    emit(ExecutorRegistered(next(ids), 0.0, ExecutorInfo(e1, "h1", "h1:1", 2)))
    emit(ExecutorConnected(next(ids), 0.0, e1))
    job = JobId("j0")
    known.add(job)
    launched = emit(JobSubmitted(next(ids), 0.0, job, synthetic_plan(9, 3)))
    assert not [k for k in store.load() if k.startswith("jobs/j0/tasks/3/")]
    # The scheduler restarts before the join stage (3) launched.
    state = restored_state(store, lambda: new_state(config, SchedulerState))
    writer = StateWriter(store, store.load())
    emit(SchedulerRecovered(next(ids), 1.0))
    assert not [k for k in store.load() if k.startswith("jobs/j0/tasks/3/")]
    emit(ExecutorRegistered(next(ids), 1.0, ExecutorInfo(ExecutorId("x"), "h1", "h1:1", 2), e1))
    launched = emit(ExecutorConnected(next(ids), 1.0, e1))
    # The map tasks finish with small outputs: the join stage is coalesced.
    while not any(
        isinstance(c, LaunchTask) and c.task.attempt.task.stage == StageId(3) for c in launched
    ):
        launch = next(c for c in launched if isinstance(c, LaunchTask))
        outputs = tuple(
            PartitionOutput(p, f"/{launch.task.attempt}/{p}", 1, 100, "c")
            for p in range(launch.task.output.partitions)
        )
        launched = [c for c in launched if c is not launch]
        launched += emit(TaskCompleted(next(ids), 2.0, launch.task.attempt, e1, outputs))
    view = state.job(job)
    assert view is not None and view.stages[2].num_tasks < 3, "the stage was not coalesced"
    assert not read_snapshot(store.load(), "memory://regression").broken


def test_a_batch_runs_the_fault_kinds_it_is_given(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "simulate.py")
    out = tmp_path / "summary.json"
    args = [sys.executable, script, "--seeds", "0:2", "--processes", "1", "--jobs", "2"]
    done = subprocess.run(
        [*args, "--set", "faults=clock-step,register-twice", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["seeds"] == 2 and summary["jobs"] >= 4 and not summary["failing"]
    # Counted with the faults but not injected: task faults, duplicates, and
    # the scheduler's rules that acted (``rule:``).
    injected = {
        k for k in summary["faults"] if not k.startswith(("task:", "rule:")) and k != "duplicate"
    }
    assert injected and injected <= {"clock-step", "register-twice"}
    wrong = subprocess.run([*args, "--set", "faults=clock-jump"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "'clock-jump' is not a valid Fault" in wrong.stderr
    assert "clock-step" in wrong.stderr  # the kinds it could have named
