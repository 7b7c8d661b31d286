"""Reduced semi / anti joins spread over two hosts, on real processes.

The TPC-H queries whose plans spread a reduced semi / anti join over the hosts'
tasks at SF10 (q04's semi join, q21's anti and semi joins, q22's anti join;
``reductions.reduce_by_keys``, ``docs/planner.md``): the kept side's stage hashed
by the join keys, read whole by the far side's tasks and by partition by the join,
the reduced far side hashed alike. Two executors are hosts of one core each
(``--host-id``); at SF 0.1 the exchanges get a partition per host by their bytes
(``--partition-bytes`` 64 KiB, ``--partitions`` 2), and adaptive execution is off,
so that the join stages run as planned, one task on each host. Every answer is
compared with DuckDB's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query

from mangonel.client.session import Session
from mangonel.testing.cluster import TestCluster

pytestmark = pytest.mark.timeout(300)

SPREAD = (
    "--spread-bytes",
    "3355443",
    "--partitions",
    "2",
    "--partition-bytes",
    "65536",
    "--no-adaptive",
)

JOINS = {4: ["semi join → partial aggregate"], 21: ["anti join", "semi join"], 22: ["anti join"]}
"""Each query's spread join stages, by the start of their labels."""


@pytest.fixture(scope="module")
def session(module_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[Session]:
    cluster = TestCluster(
        work_dir=module_dir / "cluster",
        executors=2,
        slots=1,
        scheduler_args=SPREAD,
        executor_args=("--cores", "1", "--threads", "1"),
        executor_args_for=lambda i: ("--host-id", f"host-{i}"),
    )
    with cluster, cluster.connect() as session:
        for name, path in tpch_tables.items():
            session.register_parquet(name, str(path))
        yield session


@pytest.mark.parametrize("number", sorted(JOINS), ids=[f"q{n:02d}" for n in sorted(JOINS)])
def test_reduced_join_ran_on_both_hosts_and_answers_like_duckdb(
    number: int, session: Session, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    result = session.sql(sql)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
    for label in JOINS[number]:
        (join,) = [s for s in result.stages if s.label.startswith(label)]
        assert join.tasks_total == 2, result.stages
        assert join.phases is not None and join.phases.executors == 2, result.stages
