"""The chaos tests with security on: a kill and a freeze on a secured cluster.

The same tests as ``test_chaos_kill`` and ``test_chaos_freeze`` (their bodies are
called here), on a cluster with TLS on every channel and signed tickets
(``TestCluster(secure=True)``): a re-run task gets fresh shuffle tickets, a thawed
executor registers again with its node certificate, and the answers are DuckDB's.
One query each, to keep the suite's time: q5 (six joins, many shuffles).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos_support import ChaosCluster
from test_chaos_freeze import test_frozen_executor_is_lost_by_heartbeat_timeout as freeze_test
from test_chaos_kill import test_kill_in_reduce_stage as kill_test

pytestmark = pytest.mark.timeout(120)

QUERY = 5


@pytest.fixture(scope="module")
def secure_chaos(module_dir: Path, chaos_data: Path) -> Iterator[ChaosCluster]:
    with ChaosCluster.running(module_dir / "cluster", chaos_data, secure=True) as running:
        assert running.cluster.secure
        yield running


@pytest.fixture
def secure_healthy(secure_chaos: ChaosCluster) -> Iterator[ChaosCluster]:
    secure_chaos.restore()
    yield secure_chaos
    secure_chaos.restore()


def _no_ticket_refused(chaos: ChaosCluster) -> None:
    for path in chaos.cluster.log_dir.glob("executor-*.log"):
        assert "refused a Flight ticket" not in path.read_text(errors="replace"), path


def test_kill_in_reduce_stage_secured(secure_healthy: ChaosCluster) -> None:
    kill_test(QUERY, secure_healthy)
    _no_ticket_refused(secure_healthy)


def test_frozen_executor_is_lost_by_heartbeat_timeout_secured(
    secure_healthy: ChaosCluster,
) -> None:
    freeze_test(QUERY, secure_healthy)
    _no_ticket_refused(secure_healthy)
