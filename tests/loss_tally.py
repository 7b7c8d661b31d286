"""The false losses of a test run: executors the scheduler declared lost that came
back alive, counted from the scheduler logs its clusters left (under
``test-artifacts`` and pytest's temporary directories, every suite alike), and
printed at the end of the run (``pytest_terminal_summary`` in ``tests/conftest.py``)
so that CI's log shows them.

The scheduler logs every loss with its evidence (``executor X lost (reason):
...``) and every return of a lost executor (``executor X came back after it was
lost: ...``, ``HealthChange.CAME_BACK``; also the counter
``mangonel_executors_false_losses_total``). A false loss is not a failure in
itself (a frozen executor is lost on purpose, and comes back when thawed): the
count is there to be read, and to move only when a test means it to.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _pytest.terminal import TerminalReporter

_LOST = re.compile(r"executor (\S+) lost \((.*?)\)")
_BACK = re.compile(r"executor (\S+) came back after it was lost: (.*)")


@dataclass
class Tally:
    """Losses and false losses found in the logs under some directories."""

    logs: int = 0
    lost: Counter[str] = field(default_factory=Counter)
    """Reason -> losses."""
    came_back: list[str] = field(default_factory=list)
    """One line per false loss: where, which executor, what became of it."""

    def add(self, root: Path, since: float) -> None:
        """Count the scheduler logs under ``root`` written to since ``since``."""
        for log in sorted(root.rglob("*.log")):
            if log.stat().st_mtime < since:
                continue  # left by an earlier run (a test not selected this time)
            text = log.read_text(errors="replace")
            if "mangonel.scheduler" not in text:
                continue  # not a scheduler's log
            self.logs += 1
            # One line per loss: the state machine's DeclareExecutorLost, or the
            # shell's for a stream that closed.
            self.lost.update(reason for _, reason in _LOST.findall(text))
            for executor, what in _BACK.findall(text):
                self.came_back.append(f"{log.relative_to(root.parent)}: {executor}: {what}")


@dataclass
class Tallies:
    """The directories a run's clusters wrote their logs in: ``test-artifacts``
    (each module's folder, its module-wide and per-test clusters alike) and
    pytest's temporary directories (clusters in a test's ``tmp_path``)."""

    suite: str
    roots: list[Path] = field(default_factory=list)
    since: float = field(default_factory=time.time)

    def summary(self, reporter: TerminalReporter) -> None:
        if not self.roots:
            return
        tally = Tally()
        for root in self.roots:
            if root.exists():
                tally.add(root, self.since)
        losses = sum(tally.lost.values())
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(tally.lost.items())) or "none"
        reporter.write_sep("-", f"{self.suite}: executor losses and false losses")
        reporter.write_line(
            f"{losses} executor(s) declared lost ({reasons}) in {tally.logs} scheduler "
            f"log(s); {len(tally.came_back)} false loss(es): lost, then came back alive"
        )
        for line in tally.came_back:
            reporter.write_line(f"  {line}")
