"""Fixtures of the chaos suite: its data, one cluster per module, repaired after each test.

* ``chaos_data``: TPC-H SF 0.01 with small row groups (``chaos_support.chaos_tpch``).
* ``chaos``: a ``ChaosCluster`` (scheduler, 3 executors, the tables registered, a
  DuckDB reference on the same files) started once per module under
  ``test-artifacts/<module>/_module/cluster``; the process logs stay there.
* ``healthy``: ``chaos``, restored before and after the test to exactly 3 registered,
  running, fault-free executors, so each test starts from the same cluster whatever
  the one before it killed. A test that leaves it beyond repair errors in teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos_support import ChaosCluster, chaos_tpch


@pytest.fixture(scope="session")
def chaos_data() -> Path:
    return chaos_tpch()


@pytest.fixture(scope="module")
def chaos(module_dir: Path, chaos_data: Path) -> Iterator[ChaosCluster]:
    with ChaosCluster.running(module_dir / "cluster", chaos_data) as running:
        yield running


@pytest.fixture
def healthy(chaos: ChaosCluster) -> Iterator[ChaosCluster]:
    chaos.restore()
    yield chaos
    chaos.restore()
