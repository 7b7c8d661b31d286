"""A one-line progress bar for ``mangonel sql``: stages and tasks done, rows, re-runs.

::

    [##########----------]  50%  stages 2/5  tasks 9/18 (2 running)  12.3k rows  1.4 s

Redrawn in place (carriage return) on a terminal, at most every 0.1 s, and
cleared when the query ends so the result prints on a clean line; elsewhere
(``--progress`` into a file) one line per second.
"""

from __future__ import annotations

import time
from typing import TextIO

from mangonel.client.status import JobStatus

WIDTH = 24


def human_count(n: int) -> str:
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"


def progress_line(status: JobStatus) -> str:
    """The bar's text for one progress update of a job.

    Rows are the rows written so far by the final stage's finished tasks,
    i.e. of the result.
    """
    total = sum(s.tasks_total for s in status.stages)
    done = sum(min(s.tasks_done, s.tasks_total) for s in status.stages)
    running = sum(s.tasks_running for s in status.stages)
    stages_done = sum(s.tasks_done >= s.tasks_total for s in status.stages)
    share = done / total if total else 0.0
    filled = round(WIDTH * share)
    rows = status.stages[-1].rows if status.stages else 0
    parts = [
        f"[{'#' * filled}{'-' * (WIDTH - filled)}] {share:4.0%}",
        f"stages {stages_done}/{len(status.stages)}",
        f"tasks {done}/{total}" + (f" ({running} running)" if running else ""),
        f"{human_count(rows)} rows",
        f"{status.elapsed_s:.1f} s",
    ]
    if status.tasks_rerun or status.outputs_recomputed:
        parts.append(f"{status.tasks_rerun} re-run, {status.outputs_recomputed} recomputed")
    return "  ".join(parts)


class ProgressBar:
    """Draws ``progress_line`` on ``stream`` as updates arrive (``on_progress``)."""

    def __init__(self, stream: TextIO, min_interval_s: float | None = None) -> None:
        self.stream = stream
        # Not a terminal (a log file): one line per update, fewer of them.
        self.tty = stream.isatty()
        self.min_interval_s = min_interval_s or (0.1 if self.tty else 1.0)
        self._last = 0.0
        self._width = 0

    def update(self, status: JobStatus) -> None:
        now = time.monotonic()
        if now - self._last < self.min_interval_s:
            return
        self._last = now
        line = progress_line(status)
        if not self.tty:
            self.stream.write(line + "\n")
            self.stream.flush()
            return
        pad = max(0, self._width - len(line))
        self._width = len(line)
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()

    def clear(self) -> None:
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
