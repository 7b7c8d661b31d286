"""Runs a DistributedPlan inside one process, task by task, with DuckDB.

A test double for the planner's unit tests: it follows the contract in
``mangonel.plan.physical`` (what each task reads, how it splits its output)
without processes or files, so a wrong plan shows up as a wrong answer here
before it reaches a cluster.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from mangonel.plan.physical import DistributedPlan, ScanInput
from mangonel.task import InputMode, OutputKind


def _read_split(scan: ScanInput, task: int) -> pa.Table:
    parts = []
    for split in scan.splits_of(task):
        f = pq.ParquetFile(split.path)
        groups = list(split.row_groups) or list(range(f.metadata.num_row_groups))
        parts.append(f.read_row_groups(groups, columns=list(scan.columns)))
    return pa.concat_tables(parts)


def run_plan(plan: DistributedPlan) -> pa.Table:
    outputs: dict[int, list[list[pa.Table]]] = {}
    con = duckdb.connect()
    for stage in plan.stages:
        per_task: list[list[pa.Table]] = []
        for task in range(stage.num_tasks):
            names = []
            if stage.scan is not None:
                con.register(stage.scan.name, _read_split(stage.scan, task))
                names.append(stage.scan.name)
            for side in stage.side_scans:  # one group for every task, or one a task
                con.register(side.name, _read_split(side, task))
                names.append(side.name)
            for inp in stage.inputs:
                up = outputs[inp.stage]
                if inp.mode is InputMode.PARTITION:
                    tables = [m[task] for m in up]
                else:
                    tables = [p for m in up for p in m]
                con.register(inp.name, pa.concat_tables(tables))
                names.append(inp.name)
            result = con.sql(stage.sql).to_arrow_table()
            assert result.column_names == list(stage.columns), (result.column_names, stage.columns)
            if stage.output.kind is OutputKind.SINGLE:
                per_task.append([result])
            else:
                n = stage.output.partitions
                con.register("__out", result)
                keys = ", ".join(stage.output.keys)
                parts = []
                for p in range(n):
                    parts.append(
                        con.sql(
                            f"SELECT * EXCLUDE (__p) FROM (SELECT *, hash({keys}) % {n} AS __p "
                            f"FROM __out) WHERE __p = {p}"
                        ).to_arrow_table()
                    )
                con.unregister("__out")
                per_task.append(parts)
            for name in names:
                con.unregister(name)
        outputs[stage.id] = per_task
    final = pa.concat_tables([m[0] for m in outputs[plan.final.id]])
    final = final.select(list(range(len(plan.columns))))
    return final.rename_columns(list(plan.columns))
