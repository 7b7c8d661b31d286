"""Fixtures of the multi-host suite; the clusters themselves are started by
``net_support.start_cluster``, once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def lab_root(module_dir: Path) -> Iterator[Path]:
    """The module's lab: hosts' directories and process logs, kept after the run."""
    yield module_dir / "lab"
