"""Bad shuffle files during each TPC-H query: found by the reader, made again.

Right after the first executor in line writes stage 1's map output 0, partition 0
(stage 1's first task goes to it on an idle cluster), the file's middle bytes are
flipped (its crc32 no longer matches) or the file is deleted. The task that reads
it must fail its fetch, the map output must be recomputed, and the answer must be
DuckDB's. The executor that wrote it stays up: a bad file is not a dead process.
"""

from __future__ import annotations

from typing import Any

import pytest
from chaos_support import QUERIES, QUERY_IDS, ChaosCluster, outputs_recomputed
from helpers import tpch_query

from mangonel.client.status import ExecutorState

pytestmark = pytest.mark.timeout(90)


def _bad_file(action: str) -> dict[str, Any]:
    return {"action": action, "stage": 1, "map_partition": 0, "partition": 0}


@pytest.mark.parametrize("action", ["corrupt", "delete"])
@pytest.mark.parametrize("number", QUERIES, ids=QUERY_IDS)
def test_bad_shuffle_file_is_recomputed(number: int, action: str, healthy: ChaosCluster) -> None:
    chaos = healthy
    writer = chaos.first_in_line()
    writer_id = writer.id
    chaos.set_faults(writer, [_bad_file(action)])

    result = chaos.session.sql(tpch_query(number))

    chaos.check(number, result)
    assert outputs_recomputed(result, stage=1) > 0, f"stage 1 was not made again: {result.stages}"
    # The reader's attempt could not fetch and ran again once the output was back.
    assert result.tasks_rerun > 0, result.stages
    assert writer.alive()
    assert writer_id is not None
    assert chaos.executor_status(writer_id).state is ExecutorState.ALIVE
