"""What the cluster's processes hold in memory, checked on real processes (issue 19).

Each check here guards a cut in the cluster's peak memory (``docs/memory.md``): a
change that brings the cost back fails here, not only as a slower creep in the
benchmark's peak RSS.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query

# Scans, broadcasts, hash shuffles, an outer join, a top-n and an anti join.
QUERIES = (9, 13, 18, 21, 22)


def _mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if len(line.split()) > 5}


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_cluster_processes_never_import_pandas(
    number: int, cluster: Any, session: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """pyarrow imports pandas the first time it converts Python values (``pa.array``,
    ``pa.scalar``, ``Schema.empty_table``): about 40 MB of each process's memory,
    which no task and no plan needs."""
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0  # the query ran through every operator
    actual = session.sql(sql).to_arrow()
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)
    processes = {"scheduler": cluster.scheduler.pid}
    processes |= {f"executor {e.index}": e.pid for e in cluster.executors}
    for name, pid in processes.items():
        files = _mapped_files(pid)
        # The check itself must see what it looks for: both load pyarrow.
        assert any("/pyarrow/" in path for path in files), (name, sorted(files)[:20])
        loaded = sorted(path for path in files if "/pandas/" in path)
        assert not loaded, f"the {name} loaded pandas: {loaded[:5]}"
