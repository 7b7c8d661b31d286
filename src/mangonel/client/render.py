"""Text output of the CLI: aligned result tables and per-stage summaries."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence

import pyarrow as pa

from mangonel.client.status import PHASES, StagePhases, StageStatus

MAX_ROWS = 100
"""Rows printed by default; the rest is summarised in one line."""


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else repr(value)
    if isinstance(value, datetime.datetime | datetime.date | decimal.Decimal):
        return str(value)
    return str(value)


def _is_numeric(dtype: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype)
    )


def format_table(table: pa.Table, max_rows: int = MAX_ROWS) -> str:
    """An aligned text table; numbers to the right, the rest to the left.

    >>> print(format_table(pa.table({"a": [1, 22], "b": ["x", None]})))
    a  | b
    ---+-----
     1 | x
    22 | NULL
    """
    shown = table.slice(0, max_rows)
    names = [str(n) for n in table.column_names]
    columns = [[_cell(v) for v in col.to_pylist()] for col in shown.columns]
    numeric = [_is_numeric(f.type) for f in table.schema]
    widths = [max([len(n), *(len(c) for c in col)]) for n, col in zip(names, columns, strict=True)]

    def line(cells: Sequence[str], header: bool = False) -> str:
        parts = []
        for cell, width, num in zip(cells, widths, numeric, strict=True):
            parts.append(cell.rjust(width) if num and not header else cell.ljust(width))
        return " | ".join(parts).rstrip()

    out = [line(names, header=True), "-+-".join("-" * w for w in widths)]
    out += [line([col[i] for col in columns]) for i in range(shown.num_rows)]
    if table.num_rows > max_rows:
        out.append(f"... {table.num_rows - max_rows} more rows")
    return "\n".join(out)


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def format_stages(stages: Sequence[StageStatus]) -> str:
    """One line per stage: id, label, tasks (and attempts; the planned count where
    adaptive execution ran fewer), rows and bytes out, time."""
    table = pa.table(
        {
            "stage": [s.stage for s in stages],
            "label": [s.label for s in stages],
            "tasks": [
                f"{s.tasks_done}/{s.tasks_total}"
                + (f" (planned {s.tasks_planned})" if s.tasks_planned else "")
                + (f" ({s.attempts} attempts)" if s.attempts > s.tasks_total else "")
                for s in stages
            ],
            "rows out": [s.rows for s in stages],
            "bytes out": [human_bytes(s.bytes) for s in stages],
            "time": [f"{s.elapsed_s:.2f} s" for s in stages],
        }
    )
    return format_table(table, max_rows=len(stages) or 1)


def format_phases(stages: Sequence[StageStatus]) -> str:
    """One line per stage: its tasks' time by phase (seconds, summed over them), the
    executors they ran on, the slowest task's time on its slot against the median, and
    the upstream bytes they fetched over the network (and read on their own host)."""
    timed = [s for s in stages if s.phases is not None]
    columns: dict[str, list[object]] = {"stage": [s.stage for s in timed]}
    columns["tasks"] = [f"{p.tasks} on {p.executors}" for p in _phases(timed)]
    for name in PHASES:
        columns[name] = [f"{p.seconds[name]:.3f}" for p in _phases(timed)]
    columns["slowest/median"] = [
        f"{p.task_max_s:.3f}/{p.task_median_s:.3f} s" for p in _phases(timed)
    ]
    columns["fetched remote (local)"] = [
        f"{human_bytes(p.fetched_remote_bytes)} ({human_bytes(p.fetched_local_bytes)})"
        for p in _phases(timed)
    ]
    return format_table(pa.table(columns), max_rows=len(timed) or 1)


def _phases(stages: Sequence[StageStatus]) -> list[StagePhases]:
    return [s.phases for s in stages if s.phases is not None]
