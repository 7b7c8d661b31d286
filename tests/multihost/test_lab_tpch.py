"""The 22 TPC-H queries on a cluster whose scheduler, executors and client each run
on a host of their own, every answer checked against DuckDB.

The hosts are network, UTS and mount namespaces joined by a switch
(``mangonel.testing.netlab``): the executors have different host names and
cannot see each other's files, so every shuffle byte between them crosses the
switch over Flight, and the client reads results from the executors' advertised
addresses. The tables are Parquet files every host reads at one path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_fallback_as_listed, assert_same_result, tpch_query
from net_support import SHUFFLED, start_cluster

from mangonel.client.status import ExecutorState
from mangonel.testing.netcluster import NetCluster
from mangonel.testing.netlab import MOUNT_POINT

QUERIES = list(range(1, 23))
SPLIT_ROWS = 250_000


@pytest.fixture(scope="module")
def net(lab_root: Path, tpch_tables: dict[str, Path]) -> Iterator[NetCluster]:
    cluster = start_cluster(lab_root, tpch_tables, SPLIT_ROWS)
    yield cluster
    cluster.stop()


def test_every_process_is_on_a_host_of_its_own(net: NetCluster) -> None:
    status = net.client.status()
    executors = [e for e in status.executors if e.state is ExecutorState.ALIVE]
    hosts = {e.host: e.flight_address.rsplit(":", 1)[0] for e in executors}
    assert hosts == {h.name: h.address for h in net.executor_hosts}, status.executors
    assert status.scheduler_address == net.scheduler_address
    for host in net.lab.hosts.values():
        seen = net.run_on(host, ["sh", "-c", f"hostname; ls -A {net.lab.hosts_root}"])
        # Its own name, and no host's directory by the path the test uses.
        assert seen.stdout.split() == [host.name], seen
    # Each executor's work root is on its own disk, out of every other host's sight.
    victim, other = net.executor_hosts
    work = f"{MOUNT_POINT}/work"
    assert victim.outside(work).is_dir() and other.outside(work).is_dir()
    for host in (other, net.client_host, net.scheduler_host):
        seen = net.run_on(host, ["ls", f"{victim.outside(work)}"])
        assert seen.returncode != 0, seen


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_tpch_answer_matches_duckdb(
    number: int, net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0  # an empty reference would prove nothing
    actual = net.client.sql(sql).result.to_arrow()
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)
    # Not the planner's fallback (the whole query in one task): the job's plan is split.
    assert_fallback_as_listed(f"q{number:02d}", net.client.explain(sql), {}, number)


def test_shuffle_bytes_cross_the_switch(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """q21 hashes both sides of its semi and anti joins (five of its seven stages
    write hashed partitions): half of each exchange's rows go to the other
    executor, by Flight over the switch (the switch's per-sender counters), none of
    it by path."""
    a, b = net.executor_hosts
    fetched = "mangonel_shuffle_bytes_fetched_total"
    before = net.metrics()[fetched], net.lab.traffic(a, b), net.lab.traffic(b, a)
    answer = net.client.sql(tpch_query(SHUFFLED))
    after = net.metrics()[fetched], net.lab.traffic(a, b), net.lab.traffic(b, a)
    assert_same_result(
        answer.result.to_arrow(),
        duckdb_ref.sql(tpch_query(SHUFFLED)).to_arrow_table(),
        ordered=True,
        order_by=TPCH_ORDER_BY[SHUFFLED],
    )
    stages = answer.result.stages
    assert len(stages) > 2 and max(s.tasks_total for s in stages) > 1, stages
    given = after[0] - before[0]
    a_to_b, b_to_a = after[1] - before[1], after[2] - before[2]
    print(
        f"q{SHUFFLED}: {given:.0f} shuffle bytes read by tasks; "
        f"switch: {a_to_b} B a->b, {b_to_a} B b->a"
    )
    assert given > 0
    # Between the executors travel only shuffle partitions (and their Flight and
    # TCP framing): with tasks spread over both, a good part of what tasks read.
    assert a_to_b + b_to_a > 0.2 * given, (given, a_to_b, b_to_a)
