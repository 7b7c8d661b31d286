"""The 22 TPC-H queries from object storage on a cluster whose every process,
the store included, runs on a host of its own; every answer checked against DuckDB.

The store is moto's S3 server on a host ``store`` (``mangonel.testing.netstore``);
the TPC-H SF 0.1 tables are uploaded to it from its own host and registered as
``s3://tpch/<table>.parquet``. The scheduler reads their footers from the store,
the executors their row groups, both across the switch: no host reads the
tables' local files. The store counts what it served each client address, and
the switch counts what it carried between each pair of hosts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_fallback_as_listed, assert_same_result, tpch_query
from net_support import SHUFFLED, start_cluster

from mangonel.testing.netcluster import NetCluster
from mangonel.testing.netstore import ClientCounters

QUERIES = list(range(1, 23))
SPLIT_ROWS = 250_000


@pytest.fixture(scope="module")
def net(lab_root: Path, tpch_tables: dict[str, Path]) -> Iterator[NetCluster]:
    cluster = start_cluster(lab_root, tpch_tables, SPLIT_ROWS, object_store=True)
    yield cluster
    cluster.stop()


def served(net: NetCluster) -> dict[str, ClientCounters]:
    assert net.store is not None
    return net.store.counters(net.client.http_get)


def test_tables_are_registered_from_the_store(
    net: NetCluster, tpch_tables: dict[str, Path]
) -> None:
    """Registering read the footers from the store host, by ranged GETs: a small
    part of the objects. Nobody else has fetched anything yet."""
    counts = served(net)
    size = sum(path.stat().st_size for path in tpch_tables.values())
    footers = counts[net.scheduler_host.address].get_bytes
    print(f"register: {footers} B of footers fetched by the scheduler, of {size} B")
    assert 0 < footers < 0.05 * size, (footers, size)
    others = [h.address for h in (*net.executor_hosts, net.client_host)]
    assert not set(others) & set(counts), counts


RANGED_GET = """
import json, sys, urllib.request
url, first, last = sys.argv[1], sys.argv[2], sys.argv[3]
request = urllib.request.Request(url, headers={
    "Range": f"bytes={first}-{last}",
    "Authorization": "AWS4-HMAC-SHA256 Credential=mangonel-lab/20261201/us-east-1/s3/aws4_request, "
    "SignedHeaders=host;range, Signature=0",
})
with urllib.request.urlopen(request, timeout=30) as answer:
    body = answer.read()
    headers = {k.lower(): v for k, v in answer.getheaders()}
print(json.dumps({"status": answer.status, "headers": headers, "body": body.hex()}))
"""


def test_a_ranged_get_across_the_switch_is_those_bytes(
    net: NetCluster, tpch_tables: dict[str, Path]
) -> None:
    """The store answers a ranged GET with exactly the bytes asked for (206, their
    Content-Range and -Length), and counts those bytes only, not the object's."""
    assert net.store is not None
    local = tpch_tables["lineitem"]
    size = local.stat().st_size
    first, last = size // 2, size // 2 + 99_999
    url = f"{net.store.url}/tpch/lineitem.parquet"
    client = net.client_host.address
    before = served(net).get(client, ClientCounters(0, 0))
    done = net.lab.run(
        net.client_host, [sys.executable, "-c", RANGED_GET, url, str(first), str(last)]
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == 206, answer["headers"]
    assert answer["headers"]["content-range"] == f"bytes {first}-{last}/{size}"
    assert answer["headers"]["content-length"] == "100000"
    with local.open("rb") as f:
        f.seek(first)
        assert bytes.fromhex(answer["body"]) == f.read(100_000)
    after = served(net)[client]
    assert (after.requests - before.requests, after.get_bytes - before.get_bytes) == (1, 100_000)


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


def test_executors_fetch_from_the_store_and_shuffle_across_the_switch(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """q21 scans four tables and hashes both sides of its semi and anti joins: each
    executor fetches row groups from the store host (the store's count and the
    switch's agree), and half of each exchange's rows go to the other executor over
    the switch."""
    assert net.store is not None
    store = net.store.host
    a, b = net.executor_hosts
    fetched = "mangonel_shuffle_bytes_fetched_total"

    def snapshot() -> tuple[dict[str, ClientCounters], list[int], float]:
        switch = [
            net.lab.traffic(store, a), net.lab.traffic(store, b),
            net.lab.traffic(a, b), net.lab.traffic(b, a),
        ]  # fmt: skip
        return served(net), switch, net.metrics()[fetched]

    before = snapshot()
    answer = net.client.sql(tpch_query(SHUFFLED))
    after = snapshot()
    assert_same_result(
        answer.result.to_arrow(),
        duckdb_ref.sql(tpch_query(SHUFFLED)).to_arrow_table(),
        ordered=True,
        order_by=TPCH_ORDER_BY[SHUFFLED],
    )
    stages = answer.result.stages
    assert len(stages) > 2 and max(s.tasks_total for s in stages) > 1, stages

    def got(host_address: str) -> int:
        zero = ClientCounters(0, 0)
        return (
            after[0].get(host_address, zero).get_bytes - before[0].get(host_address, zero).get_bytes
        )

    from_store = [got(a.address), got(b.address)]
    switch = [x - y for x, y in zip(after[1], before[1], strict=True)]
    given = after[2] - before[2]
    print(
        f"q{SHUFFLED}: store served {from_store} B to the executors (switch carried "
        f"{switch[:2]} B store->executor); {given:.0f} shuffle bytes read by tasks, "
        f"switch {switch[2]} B a->b, {switch[3]} B b->a"
    )
    # Both executors read their row groups from the store, over the switch: what
    # the switch carried holds what the server sent (plus HTTP, TCP and IP framing).
    assert all(n > 0 for n in from_store), from_store
    assert switch[0] >= from_store[0] and switch[1] >= from_store[1], (switch, from_store)
    # The scheduler planned from the footers it read at register: nothing more.
    assert got(net.scheduler_host.address) == 0, after[0]
    # Between the executors travel only shuffle partitions (and their framing).
    assert given > 0
    assert switch[2] + switch[3] > 0.2 * given, (given, switch)
