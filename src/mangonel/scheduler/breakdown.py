"""Where a job's time went: its tasks' phases per stage, and every slot's time in its window.

Pure functions over the attempt history ``Telemetry`` keeps (``AttemptRecord``: the
scheduler's launch and report times, and the ``TaskTimings`` each executor sent with
its report); the web UI, the REST API and ``mangonel sql --stages`` show what they
return, and ``benchmarks/scaleout.py`` ranks it.

**Per stage** (``stage_phases``): the stage's succeeded attempts, their time summed
phase by phase. Each attempt's span, from the scheduler's launch (the command on the
executor's queue, after the durable commit) to its report in the scheduler's hands,
is cut in three:

    launched ─launch─▶ started ─setup fetch execute write cleanup other─▶ ended ─report─▶ reported
    (scheduler)        (slot)                                              (slot)       (scheduler)

``launch`` and ``report`` compare the scheduler's clock with the executor's (Unix
times): on one host exact, across hosts as good as their clocks agree; their sum
(the span less the time on the slot) is exact either way. The spread of the tasks'
time on the slot (median, max) is the stage's skew.

**Per job** (``job_breakdown``): every slot of the cluster over the job's window,
from the submission's arrival (planning included) to the job's end, in slot-seconds.
A slot holds an attempt of the job (its span, split as above; an attempt that failed,
was lost or cancelled is ``wasted``), or it is idle, and then it is idle because

* ``idle_planning``: no attempt was launched yet (planning, the job's first commit);
* ``idle_barrier``: another slot holds an attempt of the job: a stage with fewer tasks
  than slots, one task slower than the others, a stage waiting for one that still runs;
* ``idle_scheduler``: no slot holds one, after the first launch: between a report and
  the launches it causes (the scheduler's event, its commit), and at the end.

The categories add up to the slots times the window (exactly, unless a slot held more
attempts at once than it has: a speculative copy beside its original).

>>> from mangonel.scheduler.breakdown import Span, sweep_idle
>>> idle = sweep_idle([Span("a", 1.0, 3.0)], {"a": 1, "b": 1}, 0.0, 4.0)
>>> idle["a"]
{'planning': 1.0, 'barrier': 0.0, 'scheduler': 1.0}
>>> idle["b"]
{'planning': 1.0, 'barrier': 2.0, 'scheduler': 1.0}
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mangonel.ids import ExecutorId, StageId
from mangonel.scheduler.telemetry import AttemptOutcome, AttemptRecord

PHASES = ("launch", "setup", "fetch", "execute", "write", "cleanup", "other", "report")
"""An attempt's span, in order: the scheduler's launch to its report."""
IDLE = ("planning", "barrier", "scheduler")
"""Why a slot held no attempt (see the module docstring)."""


@dataclass(frozen=True)
class StagePhases:
    """The time of one stage's succeeded attempts, summed phase by phase (seconds)."""

    stage: StageId
    tasks: int
    """Succeeded attempts that reported their timings (the sums are theirs)."""
    executors: int
    """Executors they ran on."""
    seconds: dict[str, float]
    """``PHASES`` -> seconds, summed over the attempts."""
    task_median_s: float
    """Time on the slot (``started`` to ``ended``), median over the attempts."""
    task_max_s: float
    fetched_local_bytes: int = 0
    fetched_remote_bytes: int = 0
    fetch_remote_s: float = 0.0
    """Of ``fetch``: the fetches over Flight."""
    write_io_s: float = 0.0
    """Of ``write``: the file writes and their CRC."""

    @property
    def skew(self) -> float:
        """The slowest attempt's time on the slot over the median (1: no skew)."""
        return self.task_max_s / self.task_median_s if self.task_median_s > 0 else 1.0


@dataclass(frozen=True)
class ExecutorTime:
    """One executor's slot-seconds in a job's window."""

    executor: ExecutorId
    slots: int
    attempts: int
    busy_s: float
    """Holding attempts of the job (launch to report)."""
    idle_s: dict[str, float]
    """``IDLE`` -> slot-seconds."""


@dataclass(frozen=True)
class JobBreakdown:
    """Every slot's time in a job's window, by what it was doing (slot-seconds)."""

    window_s: float
    """Planning plus the job's run: the submission's arrival to the job's end."""
    planning_s: float
    slots: int
    seconds: dict[str, float]
    """``PHASES`` (succeeded attempts), ``wasted`` (the others) and ``idle_`` + ``IDLE``."""
    executors: tuple[ExecutorTime, ...] = field(default_factory=tuple)
    attempts_timed: int = 0
    """Attempts whose time on the slot came from their executor's report; the others
    (still running, lost, cancelled) count as ``wasted`` or, still running, as
    ``other``."""

    @property
    def capacity_s(self) -> float:
        return self.window_s * self.slots

    def ranked(self) -> list[tuple[str, float]]:
        """(category, slot-seconds), the biggest first."""
        return sorted(self.seconds.items(), key=lambda kv: -kv[1])


@dataclass(frozen=True)
class Span:
    """An interval a slot of ``executor`` was held (Unix times)."""

    executor: str
    start: float
    end: float


def split_attempt(record: AttemptRecord, end: float) -> dict[str, float]:
    """An attempt's span (its launch to ``end``, its report's arrival) by ``PHASES``.

    Without timings (no report, or one without them) the whole span is ``other``.
    Where the clocks disagree (a slot that started before its launch), the launch is
    taken as 0 and the report as what the span leaves over.
    """
    span = max(0.0, end - record.launched_wall)
    parts = dict.fromkeys(PHASES, 0.0)
    t = record.timings
    if t is None:
        parts["other"] = span
        return parts
    run = t.run_s
    parts["launch"] = min(span, max(0.0, t.started_at - record.launched_wall))
    parts.update(
        setup=t.setup_s,
        fetch=t.fetch_s,
        execute=t.execute_s,
        write=t.write_s,
        cleanup=t.cleanup_s,
        other=t.other_s,
    )
    parts["report"] = max(0.0, span - parts["launch"] - run)
    on_slot = span - parts["launch"] - parts["report"]
    if run > on_slot > 0:  # the slot's time exceeds the span: skewed clocks
        scale = on_slot / run
        for name in ("setup", "fetch", "execute", "write", "cleanup", "other"):
            parts[name] *= scale
    return parts


def _end(record: AttemptRecord) -> float:
    """When the attempt stopped holding its slot, as the scheduler saw it (Unix time)."""
    if record.reported_wall is not None:
        return record.reported_wall
    return record.launched_wall + (record.elapsed_s or 0.0)


def stage_phases(records: Iterable[AttemptRecord]) -> dict[StageId, StagePhases]:
    """Per stage, the phases of its succeeded attempts that reported their timings."""
    by_stage: dict[StageId, list[AttemptRecord]] = defaultdict(list)
    for r in records:
        if r.outcome is AttemptOutcome.SUCCEEDED and r.timings is not None:
            by_stage[r.attempt.task.stage].append(r)
    out: dict[StageId, StagePhases] = {}
    for stage, done in sorted(by_stage.items()):
        sums = dict.fromkeys(PHASES, 0.0)
        for r in done:
            for name, seconds in split_attempt(r, _end(r)).items():
                sums[name] += seconds
        runs = [r.timings.run_s for r in done if r.timings is not None]
        timed = [r.timings for r in done if r.timings is not None]
        out[stage] = StagePhases(
            stage=stage,
            tasks=len(done),
            executors=len({r.executor for r in done}),
            seconds=sums,
            task_median_s=statistics.median(runs),
            task_max_s=max(runs),
            fetched_local_bytes=sum(t.fetched_local_bytes for t in timed),
            fetched_remote_bytes=sum(t.fetched_remote_bytes for t in timed),
            fetch_remote_s=sum(t.fetch_remote_s for t in timed),
            write_io_s=sum(t.write_io_s for t in timed),
        )
    return out


def job_breakdown(
    records: Sequence[AttemptRecord],
    slots: Mapping[ExecutorId, int],
    submitted_wall: float,
    elapsed_s: float,
    planning_s: float = 0.0,
) -> JobBreakdown:
    """Every slot's time over a job's window, by ``PHASES``, ``wasted`` and idle reason.

    Args:
        records: The job's attempts (``Telemetry.attempts``).
        slots: The cluster's executors and their slots (an executor an attempt ran on
            that is not listed counts with one slot).
        submitted_wall: Unix time the job was created (after planning).
        elapsed_s: The job's time from then to its end (or to now, if it runs).
        planning_s: The planning before ``submitted_wall``.
    """
    start, end = submitted_wall - planning_s, submitted_wall + max(0.0, elapsed_s)
    counted = {e: max(1, n) for e, n in slots.items()}
    for r in records:
        counted.setdefault(r.executor, 1)
    seconds = dict.fromkeys((*PHASES, "wasted", *(f"idle_{i}" for i in IDLE)), 0.0)
    spans: list[Span] = []
    busy: dict[str, float] = defaultdict(float)
    attempts: dict[str, int] = defaultdict(int)
    timed = 0
    for r in records:
        stop = min(end, _end(r) if r.outcome is not AttemptOutcome.RUNNING else end)
        begin = max(start, r.launched_wall)
        if stop <= begin:
            continue
        spans.append(Span(r.executor, begin, stop))
        busy[r.executor] += stop - begin
        attempts[r.executor] += 1
        if r.timings is not None:
            timed += 1
        if r.outcome is AttemptOutcome.SUCCEEDED:
            for name, value in split_attempt(r, stop).items():
                seconds[name] += value
        elif r.outcome is AttemptOutcome.RUNNING:
            seconds["other"] += stop - begin
        else:
            seconds["wasted"] += stop - begin
    idle = sweep_idle(spans, counted, start, end)
    for per in idle.values():
        for reason, value in per.items():
            seconds[f"idle_{reason}"] += value
    executors = tuple(
        ExecutorTime(ExecutorId(e), n, attempts[e], busy[e], idle[e])
        for e, n in sorted(counted.items())
    )
    return JobBreakdown(
        window_s=end - start,
        planning_s=planning_s,
        slots=sum(counted.values()),
        seconds=seconds,
        executors=executors,
        attempts_timed=timed,
    )


def sweep_idle(
    spans: Sequence[Span], slots: Mapping[str, int], start: float, end: float
) -> dict[str, dict[str, float]]:
    """Each executor's idle slot-seconds in [start, end], by ``IDLE`` reason.

    A slot is idle where the executor holds fewer spans than it has slots; the reason
    is the moment's: before the first span ``planning``, while any executor holds a
    span ``barrier``, else ``scheduler``. One pass over the spans' ends in time order.
    """
    idle = {e: dict.fromkeys(IDLE, 0.0) for e in slots}
    changes: list[tuple[float, int, str]] = []
    for s in spans:
        lo, hi = max(start, s.start), min(end, s.end)
        if hi > lo:
            changes += [(lo, 1, s.executor), (hi, -1, s.executor)]
    changes.sort(key=lambda c: (c[0], c[1]))  # at one instant, ends before starts
    held: dict[str, int] = defaultdict(int)
    holding = 0
    started = False
    now = start
    for t, delta, executor in [*changes, (end, 0, "")]:
        if t > now:
            reason = "barrier" if holding else ("scheduler" if started else "planning")
            for e, n in slots.items():
                free = n - held[e]
                if free > 0:
                    idle[e][reason] += free * (t - now)
            now = t
        if delta:
            held[executor] += delta
            holding += delta
            started = True
    return idle
