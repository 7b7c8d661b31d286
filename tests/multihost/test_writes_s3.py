"""Every write statement in the multi-host lab, into object storage on a host of its own.

The scheduler, two executors, a client and moto's S3 server each run on a lab
host (``net_support.start_cluster``); the TPC-H SF 0.1 tables are read from the
store, and the writes go back to it: ``COPY ... TO 's3://...'`` as Parquet and as
CSV (with CSV options), and ``CREATE TABLE AS`` / ``INSERT INTO`` with the
warehouse in the store. Each output is copied out of the store from its own
host (``NetStore.download``), read through its manifest by a DuckDB of the
test's own, and compared with what DuckDB's own ``COPY`` / ``CREATE TABLE AS`` /
``INSERT`` of the same statement holds; the writing stage's tasks ran on both
executors, their files crossing the switch to the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from helpers import assert_same_result, duckdb_views_sql
from net_support import STORE_BUCKET, start_cluster

from mangonel.output import MANIFEST, STAGING
from mangonel.testing.netclient import Answer
from mangonel.testing.netcluster import NetCluster

pytestmark = pytest.mark.timeout(300)

SPLIT_ROWS = 100_000
"""lineitem (600,000 rows at SF 0.1) is read, and written, by six tasks."""
OUT = f"s3://{STORE_BUCKET}/out"
WAREHOUSE = f"s3://{STORE_BUCKET}/warehouse"
LINEITEM_QUERY = (
    "SELECT l_orderkey, l_linenumber, l_quantity, l_extendedprice, l_shipdate, "
    "CASE WHEN l_linenumber = 3 THEN NULL ELSE l_comment END AS l_comment "
    "FROM lineitem WHERE l_orderkey % 4 = 0"
)


@pytest.fixture(scope="module")
def net(lab_root: Path, tpch_tables: dict[str, Path]) -> Iterator[NetCluster]:
    tables = {name: tpch_tables[name] for name in ("lineitem", "orders")}
    cluster = start_cluster(
        lab_root,
        tables,
        SPLIT_ROWS,
        object_store=True,
        scheduler_args=("--write-root", f"{OUT}/", "--warehouse", WAREHOUSE),
    )
    yield cluster
    cluster.stop()


def fetched(net: NetCluster, location: str, to: Path) -> list[Path]:
    """The files ``location``'s manifest names, copied out of the store into ``to``;
    nothing staged is left there, and nothing but the manifest and its files."""
    assert net.store is not None and location.startswith(f"s3://{STORE_BUCKET}/")
    net.store.download(STORE_BUCKET, location[len(f"s3://{STORE_BUCKET}/") :], to)
    names = json.loads((to / MANIFEST).read_text())["files"]
    present = sorted(
        str(p.relative_to(to)) for p in to.rglob("*") if p.is_file() and p.name != MANIFEST
    )
    assert not [p for p in present if STAGING in p], present
    assert present == sorted(names), (present, names)
    return [to / name for name in names]


def writers(net: NetCluster, answer: Answer) -> set[str]:
    """The executors on which the writing stage's tasks succeeded; asserts that it
    had several tasks."""
    writing = answer.result.stages[-2]  # the last one adds up the counts
    assert writing.tasks_total == 6, answer.result.stages
    doc = json.loads(net.client.http_get(f"{net.web_url}/api/jobs/{answer.result.job_id}"))
    return {
        a["executor"]
        for a in doc["attempts"]
        if a["stage"] == writing.stage and a["state"] == "succeeded"
    }


def read(files: list[Path], reader: str) -> pa.Table:
    names = [str(f) for f in files]
    return duckdb.connect().sql(f"SELECT * FROM {reader}({names!r})").to_arrow_table()


def test_copy_to_s3_as_parquet_and_csv_matches_duckdb_s_own_copy(
    net: NetCluster, duckdb_ref: duckdb.DuckDBPyConnection, work_dir: Path
) -> None:
    executors = set(net.executor_ids().values())
    assert len(executors) == 2
    for fmt, options, reader in [
        ("parquet", "FORMAT parquet", "read_parquet"),
        (
            "csv",
            "FORMAT csv, DELIMITER '|', QUOTE '''', NULL 'NA', DATEFORMAT '%d/%m/%Y'",
            "read_csv",
        ),
    ]:
        location = f"{OUT}/lineitem_{fmt}"
        answer = net.client.sql(f"COPY ({LINEITEM_QUERY}) TO '{location}/' ({options})")
        reference = work_dir / f"ref.{fmt}"
        count = duckdb_ref.execute(f"COPY ({LINEITEM_QUERY}) TO '{reference}' ({options})")
        expected_count = count.fetchone()
        assert expected_count is not None and expected_count[0] > 100_000
        assert answer.result.to_arrow()["Count"].to_pylist() == [expected_count[0]]
        assert writers(net, answer) == executors
        files = fetched(net, location, work_dir / fmt)
        assert len(files) == 6, files  # one per writing task
        if fmt == "parquet":
            assert_same_result(read(files, reader), read([reference], reader), ordered=False)
            continue
        # CSV: every line DuckDB's own COPY wrote with the same options, byte for byte.
        header, *lines = reference.read_bytes().splitlines()
        ours = [f.read_bytes().splitlines() for f in files]
        assert {body[0] for body in ours} == {header}
        assert sorted(line for body in ours for line in body[1:]) == sorted(lines)
        # The options reached the files: NULLs as NA, dates as DATEFORMAT says.
        assert any(line.endswith(b"|NA") for line in lines)
        assert all(re.search(rb"\|\d\d/\d\d/\d{4}\|", line) for line in lines)


def test_create_table_as_and_insert_into_an_s3_warehouse_match_duckdb(
    net: NetCluster, tpch_tables: dict[str, Path], work_dir: Path
) -> None:
    executors = set(net.executor_ids().values())
    create = f"CREATE TABLE shipped AS {LINEITEM_QUERY}"
    insert = (
        "INSERT INTO shipped SELECT o_orderkey, 0, 1.00, o_totalprice, o_orderdate, o_comment "
        "FROM orders WHERE o_orderkey % 5 = 0"
    )
    ref = duckdb.connect()  # DuckDB's own tables change: not the shared reference
    for statement in duckdb_views_sql(tpch_tables):
        ref.execute(statement)
    created = net.client.sql(create)
    assert_same_result(
        created.result.to_arrow(), ref.execute(create).to_arrow_table(), ordered=True
    )
    assert writers(net, created) == executors
    inserted = net.client.sql(insert)
    assert_same_result(
        inserted.result.to_arrow(), ref.execute(insert).to_arrow_table(), ordered=True
    )
    expected = ref.sql("SELECT * FROM shipped").to_arrow_table()
    # The warehouse's files, read by the test's own DuckDB from what the store holds.
    files = fetched(net, f"{WAREHOUSE}/shipped", work_dir / "shipped")
    assert len(files) > 6, files  # the CREATE's six and the INSERT's own
    on_store = read(files, "read_parquet")
    assert on_store.schema.types == expected.schema.types
    assert_same_result(on_store, expected, ordered=False)
    # And as the cluster reads its table back.
    assert_same_result(
        net.client.sql("SELECT * FROM shipped").result.to_arrow(), expected, ordered=False
    )
    net.client.sql("DROP TABLE shipped")
