"""An executor SIGKILLed while it reads a split of a CSV table: the answer is still
DuckDB's over the same file, and the split was read again elsewhere, once.

The chaos cluster (3 executors of 2 slots), with TPC-H SF 0.01 ``lineitem`` written as
CSV and cut into 64 KiB chunks, so its scan is several tasks. The first executor to
start a task of the scan stage is killed there (a breakpoint, not a sleep).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from chaos_support import (
    ChaosCluster,
    FirstToReach,
    freeze_rule,
    kill,
    start_chaos_cluster,
    tasks_rerun,
    wait_exit,
)
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def csv_chaos(module_dir: Path, chaos_data: Path) -> Iterator[ChaosCluster]:
    path = module_dir / "lineitem.csv"
    duckdb.sql(
        f"COPY (SELECT * FROM read_parquet('{chaos_data / 'lineitem.parquet'}')) "
        f"TO '{path}' (FORMAT csv, HEADER)"
    )
    reference = duckdb.connect()
    reference.execute(f"CREATE VIEW lineitem AS SELECT * FROM read_csv('{path}')")
    cluster = start_chaos_cluster(module_dir / "cluster")
    try:
        with cluster.connect() as session:
            session.register("lineitem", str(path), "csv", split_size=64 * 1024)
            yield ChaosCluster(cluster, session, reference)
    finally:
        cluster.stop()
        reference.close()


def test_kill_while_reading_a_csv_split(csv_chaos: ChaosCluster) -> None:
    chaos = csv_chaos
    sql = tpch_query(1)
    with FirstToReach(chaos, freeze_rule("task_started", stage=1), kill) as point:
        result = chaos.session.sql(sql)
    expected = chaos.reference.sql(sql).to_arrow_table()
    assert_same_result(result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[1])
    hit = point.require_hit()
    wait_exit(hit.handle, timeout=5)
    assert hit.handle.process.returncode == -9
    scan = next(s for s in result.stages if s.stage == 1)
    assert "lineitem" in scan.label and scan.tasks_total >= 3, result.stages
    # The task it had started ran again on another executor.
    assert tasks_rerun(result, stage=1) > 0, result.stages
