"""Human-readable text of a distributed plan (``mangonel explain``)."""

from __future__ import annotations

import sqlglot

from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.task import InputMode, OutputKind

FALLBACK_NOTE = "note: runs whole in one task, as DuckDB alone plans it"
"""How EXPLAIN begins the line that says a plan fell back (``DistributedPlan.fallback``),
followed by the reason."""


def _output(stage: Stage) -> str:
    if stage.output.kind is OutputKind.HASH:
        return f"hash({', '.join(stage.output.keys)}) into {stage.output.partitions} partitions"
    return "single partition per task"


def _pretty(sql: str) -> str:
    try:
        return sqlglot.transpile(sql, read="duckdb", write="duckdb", pretty=True)[0]
    except sqlglot.errors.SqlglotError:
        return sql


def render(plan: DistributedPlan, with_sql: bool = True) -> str:
    """The stage graph: each stage, its inputs and exchange, and its SQL fragment."""
    lines = [
        f"Distributed plan: {len(plan.stages)} stages; result columns: {', '.join(plan.columns)}"
    ]
    if plan.fallback is not None:
        lines.append(f"{FALLBACK_NOTE}: {plan.fallback}")
    lines += [f"note: {n}" for n in plan.notes]
    for stage in plan.stages:
        final = " (final)" if stage is plan.final else ""
        lines.append("")
        lines.append(f"Stage {stage.id}{final}: {stage.label} — {stage.num_tasks} task(s)")
        if stage.scan is not None:
            rows = sum(s.rows for split in stage.scan.task_splits for s in split)
            lines.append(
                f"  reads  table {stage.scan.table} ({', '.join(stage.scan.columns)}), "
                f"{rows} rows in {len(stage.scan.task_splits)} split(s)"
            )
            if stage.scan.pruned:
                lines.append(f"         {stage.scan.pruned}")
        for side in stage.side_scans:
            rows = sum(s.rows for split in side.task_splits for s in split)
            # A stage of one task scans a table whole where stages of their own
            # scanned it before (one-task stages planned inside their reader).
            how = "whole, in every task" if stage.num_tasks > 1 else "whole"
            if len(side.task_splits) > 1:
                how = "by join key range: each task its row groups"
            lines.append(
                f"  reads  table {side.table} ({', '.join(side.columns)}) as {side.name}: "
                f"{rows} rows, {how}"
            )
            if side.pruned:
                lines.append(f"         {side.pruned}")
        for inp in stage.inputs:
            how = (
                "partition i of each map task"
                if inp.mode is InputMode.PARTITION
                else "all partitions (broadcast/gather)"
            )
            lines.append(f"  reads  stage {inp.stage} as {inp.name}: {how}")
        lines.append(f"  writes {_output(stage)}")
        if with_sql:
            lines.append("  sql:")
            lines += ["    " + line for line in _pretty(stage.sql).splitlines()]
    return "\n".join(lines)
