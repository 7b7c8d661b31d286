"""The distributed plan: stages, their SQL fragments, inputs and outputs.

This is the contract between the planner (which produces a ``DistributedPlan``)
and the runtime (the scheduler schedules its stages' tasks, the executors run
them). It holds no behaviour beyond a few derived properties.

A stage runs ``num_tasks`` tasks. Each task runs the stage's ``sql`` in DuckDB,
where every name in ``inputs`` (and ``scan.name``) is a relation registered for
that task:

* ``scan``: task *i* reads ``scan.task_splits[i]`` (Parquet files and row groups)
  of ``scan.table``, only ``scan.columns``.
* ``side_scans``: other tables the tasks scan themselves, each under its own name:
  with one group of splits, every task reads it (a small dimension table scanned
  where it is joined instead of in a stage of its own that is then broadcast);
  with one group per task, task *i* reads ``task_splits[i]`` (the row groups whose
  key range meets the range of task *i*'s own scan: a join by key range).
* ``StageInput`` with ``InputMode.PARTITION``: task *i* reads output partition *i*
  of every map task of the upstream stage (hash-partitioned exchange).
* ``StageInput`` with ``InputMode.ALL``: every task reads every output partition
  of every map task of the upstream stage (broadcast, or gather into one task).

The task's result is split by ``output``: ``HASH`` into ``output.partitions``
partitions by ``hash(keys) % partitions`` (the keys are DuckDB expressions over
the fragment's output columns, already cast to one type on both sides of a
join), or ``SINGLE`` into partition 0. Partitions are numbered from 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mangonel.ids import StageId
from mangonel.output import CommitMode
from mangonel.task import FileSplit, InputMode, OutputSpec, WriteFormat, WriteOptions


@dataclass(frozen=True)
class ScanInput:
    """A catalog table read by a stage, one group of splits per task."""

    name: str
    table: str
    columns: tuple[str, ...]
    task_splits: tuple[tuple[FileSplit, ...], ...]
    pruned: str = ""
    """Why some row groups of the table are not read at all, for EXPLAIN (e.g. ``92
    of 96 row groups dropped: ...``, ``plan.dynamic_pruning``); empty: none were."""

    def splits_of(self, task: int) -> tuple[FileSplit, ...]:
        """What task ``task`` reads: its own group of splits, or the one group of all."""
        return self.task_splits[task if len(self.task_splits) > 1 else 0]


@dataclass(frozen=True)
class StageInput:
    """Another stage's output, read by this stage under ``name``."""

    name: str
    stage: StageId
    mode: InputMode


@dataclass(frozen=True)
class Stage:
    """One stage: a SQL fragment run by ``num_tasks`` tasks."""

    id: StageId
    sql: str
    output: OutputSpec
    num_tasks: int
    columns: tuple[str, ...]
    scan: ScanInput | None = None
    inputs: tuple[StageInput, ...] = ()
    label: str = ""
    """A short human description, e.g. ``scan lineitem`` or ``join + partial agg``."""
    side_scans: tuple[ScanInput, ...] = ()
    """Other tables the tasks scan: one group of splits for all, or one per task."""
    whole_query: bool = False
    """The stage runs the user's query whole (a plan that fell back, ``Opaque``):
    DuckDB orders its joins and places its aggregates itself, as it does for
    the query alone, where every other stage's SQL has them placed by the
    planner (``executor.databases.lock_down``)."""

    @property
    def upstream(self) -> tuple[StageId, ...]:
        return tuple(i.stage for i in self.inputs)


@dataclass(frozen=True)
class WriteTarget:
    """Where a write statement's rows go (``COPY ... TO``, ``CREATE TABLE AS``,
    ``INSERT INTO``), and how its output is committed (``output.commit``).

    The tasks of ``stage`` write their rows to files in their staging directories;
    the plan's final stage adds up how many they wrote (the statement's result).
    """

    location: str
    """``output.normalize``d: an absolute local path or an ``s3://`` URI."""
    format: WriteFormat
    stage: StageId
    columns: tuple[str, ...]
    """The files' column names (the query's result columns)."""
    mode: CommitMode
    partition_by: tuple[str, ...] = ()
    table: str = ""
    """A warehouse table the commit (re)registers (``CREATE TABLE``, ``INSERT``)."""
    options: WriteOptions = WriteOptions()
    """``COPY``'s compression, row groups, CSV header and delimiter."""


@dataclass(frozen=True)
class DistributedPlan:
    """Stages in topological order; the last one produces the result.

    ``columns`` are the result's column names as the user wrote them (they may
    repeat); the final stage's own column names are internal.
    """

    stages: tuple[Stage, ...]
    columns: tuple[str, ...]
    sql: str = ""
    notes: tuple[str, ...] = field(default=())
    """Planner remarks shown by EXPLAIN, e.g. why a part runs as a single partition."""
    readable_files: tuple[str, ...] = field(default=())
    """The local files of every table in the catalog the query was planned against,
    which its scan tasks' databases may read (``TaskSpec.job_files``): every user
    may query every table, so a fragment reads nothing its user could not, and one
    scan database per slot serves every query over that catalog. Empty where the
    catalog has more than ``planner.READABLE_FILES_LIMIT`` files (the tasks then
    name the files the plan itself scans)."""
    pruned_by: tuple[tuple[str, int, str], ...] = field(default=())
    """The files (path, size, version) of the dimensions whose key ranges pruned the
    plan's scans while planning (``plan.dynamic_pruning``): the plan is right only
    while they hold the rows read then, and a plan cache reuses it only while a local
    one keeps its size and modification time (``probe.unchanged``)."""
    write: WriteTarget | None = None
    """Set for a write statement: where its rows go."""
    dropped: str = ""
    """For the query that answers a ``DROP TABLE`` (the drop itself is done as the
    statement is submitted): the table it dropped."""
    fallback: str | None = None
    """Why the whole query runs as one task that scans its tables (the binder
    raised ``Unsupported``: ``plan.planner``), or ``None`` where the planner split it.
    EXPLAIN shows it as a note, and the scheduler counts the jobs that ran so
    (``mangonel_plan_fallbacks_total``)."""

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    @property
    def took_effect(self) -> bool:
        """Whether the statement changed something once its job succeeded (a write
        committed, a table dropped): an answer lost after that is never a reason to
        run it again (``JobStatus.took_effect``; the client's ``Session.sql``)."""
        return self.write is not None or bool(self.dropped)

    def stage(self, stage_id: StageId) -> Stage:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)

    def consumers(self, stage_id: StageId) -> tuple[Stage, ...]:
        return tuple(s for s in self.stages if stage_id in s.upstream)
