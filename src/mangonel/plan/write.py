"""The plan of a write statement: its query's plan, whose last stage writes its rows.

A write statement (``sql.writes``) writes the rows of a query. Its plan is the
query's plan (``plan_query``), with two changes at the end:

* the query's final stage becomes the **writing stage**: each of its tasks runs
  the final fragment as before and writes its rows to files in its attempt's own
  staging directory (``task.SinkSpec``, ``executor.sink``), so the rows are written
  by the tasks that compute them, on every executor at once; its one output
  row is how many rows it wrote. A query whose last stage is one task (an ORDER
  BY, a LIMIT, a global aggregate) is written by that one task: its order is the
  file's order.
* a new final stage of one task adds those counts up: the statement's result is
  one row, ``Count``, as DuckDB's own ``COPY`` and ``CREATE TABLE AS`` answer.

Which attempt's files are kept is decided when the job ends (``output.commit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from mangonel.catalog import Table
from mangonel.errors import QueryError
from mangonel.ids import StageId
from mangonel.output import CommitMode
from mangonel.plan.physical import DistributedPlan, Stage, StageInput, WriteTarget
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import InputMode, OutputKind, OutputSpec, WriteFormat, WriteOptions

ROWS_COLUMN = "rows"
COUNT_COLUMN = "Count"


def plan_write(
    query: str,
    catalog: Mapping[str, Table],
    config: PlannerConfig,
    *,
    location: str,
    format: WriteFormat,
    mode: CommitMode,
    partition_by: tuple[str, ...] = (),
    table: str = "",
    dialect: str | None = None,
    options: WriteOptions | None = None,
    count: bool = True,
) -> DistributedPlan:
    """Plan a statement that writes the rows of ``query`` to ``location``; its
    answer is one row, ``Count``, or none without ``count`` (``CREATE TABLE t (a INT)``).

    Raises:
        mangonel.errors.QueryError: the query cannot run, its result's column names
            repeat, or a ``PARTITION_BY`` column is not one of them.
    """
    inner = plan_query(query, catalog, config, dialect)
    columns = inner.columns
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise QueryError(
            f"the query's result names {', '.join(repeated)} more than once; a written "
            "file needs distinct column names: rename them with AS"
        )
    missing = [c for c in partition_by if c not in columns]
    if missing:
        raise QueryError(
            f"PARTITION_BY names {', '.join(missing)}, not among the query's columns "
            f"({', '.join(columns)})"
        )
    if partition_by and len(partition_by) == len(columns):
        raise QueryError("PARTITION_BY cannot take every column: no column would be left to write")
    final = inner.final
    writing = replace(
        final,
        columns=(ROWS_COLUMN,),
        label=f"{final.label} → write {format.value}" if final.label else f"write {format.value}",
    )
    count_id = StageId(max(s.id for s in inner.stages) + 1)
    source = f"s{int(final.id)}"
    count = Stage(
        id=count_id,
        sql=f'SELECT CAST(coalesce(sum("{ROWS_COLUMN}"), 0) AS BIGINT) AS "{COUNT_COLUMN}" '
        f"FROM {source}" + ("" if count else " HAVING false"),
        output=OutputSpec(OutputKind.SINGLE),
        num_tasks=1,
        columns=(COUNT_COLUMN,),
        inputs=(StageInput(source, final.id, InputMode.ALL),),
        label="rows written → result",
    )
    target = WriteTarget(
        location=location,
        format=format,
        stage=final.id,
        columns=columns,
        mode=mode,
        partition_by=partition_by,
        table=table,
        options=options or WriteOptions(),
    )
    return replace(
        inner,
        stages=(*inner.stages[:-1], writing, count),
        columns=(COUNT_COLUMN,),
        write=target,
    )
