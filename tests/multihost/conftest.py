"""Fixtures of the multi-host suite; the clusters themselves are started by
``net_support.start_cluster``, once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.terminal import TerminalReporter
from loss_tally import Tallies


@pytest.fixture(scope="module")
def lab_root(module_dir: Path) -> Iterator[Path]:
    """The module's lab: hosts' directories and process logs, kept after the run."""
    yield module_dir / "lab"


TALLIES = Tallies("multihost")


@pytest.fixture(scope="module", autouse=True)
def _count_losses(module_dir: Path) -> None:
    """Every module's scheduler logs count towards the suite's false losses."""
    TALLIES.roots.append(module_dir.parent)


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    TALLIES.summary(terminalreporter)
