"""Write statements into object storage, on a real cluster and a real S3 server (moto's).

A scheduler and 2 executors (``TestCluster``, fault rules on) write TPC-H SF 0.1
query results to ``s3://out/...``: ``COPY`` and a warehouse in S3 for
``CREATE TABLE AS`` / ``INSERT``. Each output is read back through its manifest
and compared with DuckDB's own answer over the local files; one executor is
killed half-way through a staged upload's file and the output is still there once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result, wait_until
from s3server import S3TestServer

from mangonel.errors import CatalogError, PermissionDeniedError
from mangonel.output import MANIFEST, STAGING
from mangonel.storage import StorageOptions
from mangonel.testing.cluster import TestCluster

pytestmark = pytest.mark.timeout(180)

OUT = "out"
QUERY = (
    "SELECT l_orderkey, l_linenumber, l_extendedprice, l_shipmode FROM lineitem "
    "WHERE l_orderkey % 8 = 0"
)


@pytest.fixture(scope="module")
def cluster(module_dir: Path, s3: S3TestServer, tpch_tables: dict[str, Path]) -> Iterator[Any]:
    s3.client().create_bucket(Bucket=OUT)
    options = StorageOptions(
        endpoint_url=s3.url, connect_timeout_s=1.0, request_timeout_s=5.0, attempts=4
    )
    cluster = TestCluster(
        executors=2,
        slots=2,
        work_dir=module_dir / "cluster",
        heartbeat_timeout=2.0,
        storage=options,
        scheduler_args=(
            "--split-rows",
            "100000",
            "--write-root",
            f"s3://{OUT}/copies/",
            "--warehouse",
            f"s3://{OUT}/warehouse",
        ),
    )
    cluster.start()
    try:
        with cluster.connect() as session:
            for name in ("lineitem", "orders"):
                session.register_parquet(name, str(tpch_tables[name]))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def session(cluster: Any) -> Iterator[Any]:
    with cluster.connect() as s:
        yield s


def manifest(s3: S3TestServer, prefix: str) -> dict[str, Any]:
    body = s3.client().get_object(Bucket=OUT, Key=f"{prefix}/{MANIFEST}")["Body"].read()
    doc: dict[str, Any] = json.loads(body)
    return doc


def keys(s3: S3TestServer, prefix: str) -> list[str]:
    """The objects under a prefix, without the empty "directory" markers pyarrow's
    S3 filesystem leaves (keys ending in "/", which no reader takes for a file)."""
    listed = s3.client().list_objects_v2(Bucket=OUT, Prefix=f"{prefix}/")
    return sorted(o["Key"] for o in listed.get("Contents", []) if not o["Key"].endswith("/"))


def read_back(s3: S3TestServer, prefix: str, files: list[str], work: Path) -> pa.Table:
    client = s3.client()
    tables = []
    for i, name in enumerate(files):
        local = work / f"{i}.parquet"
        client.download_file(OUT, f"{prefix}/{name}", str(local))
        tables.append(pq.read_table(local))
    return pa.concat_tables(tables)


def test_copy_to_s3_matches_duckdb(
    session: Any, s3: S3TestServer, duckdb_ref: duckdb.DuckDBPyConnection, work_dir: Path
) -> None:
    result = session.sql(f"COPY ({QUERY}) TO 's3://{OUT}/copies/lineitem/' (FORMAT parquet)")
    expected = duckdb_ref.sql(QUERY).to_arrow_table()
    assert result.to_arrow()["Count"].to_pylist() == [expected.num_rows]
    doc = manifest(s3, "copies/lineitem")
    assert len({f.split("-p")[-1].split("-")[0] for f in doc["files"]}) == 6  # six writers
    listed = keys(s3, "copies/lineitem")
    assert listed == sorted(
        [f"copies/lineitem/{MANIFEST}"] + [f"copies/lineitem/{f}" for f in doc["files"]]
    )
    assert_same_result(
        read_back(s3, "copies/lineitem", doc["files"], work_dir), expected, ordered=False
    )
    with pytest.raises(PermissionDeniedError, match="write root"):
        session.sql(f"COPY ({QUERY}) TO 's3://{OUT}/elsewhere/' (FORMAT parquet)")


def test_create_table_as_and_insert_into_an_s3_warehouse(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    session.sql(
        "CREATE TABLE pricey AS SELECT o_orderkey, o_totalprice FROM orders "
        "WHERE o_totalprice > 400000"
    )
    session.sql(
        "INSERT INTO pricey SELECT o_orderkey, o_totalprice FROM orders WHERE o_totalprice < 1000"
    )
    check = "SELECT count(*) AS n, sum(o_totalprice) AS s FROM "
    where = " WHERE o_totalprice > 400000 OR o_totalprice < 1000"
    actual = session.sql(check + "pricey").to_arrow()
    assert_same_result(
        actual, duckdb_ref.sql(check + "orders" + where).to_arrow_table(), ordered=False
    )
    session.sql("DROP TABLE pricey")


def test_an_executor_killed_mid_write_to_s3_leaves_one_copy(
    cluster: Any,
    session: Any,
    s3: S3TestServer,
    duckdb_ref: duckdb.DuckDBPyConnection,
    work_dir: Path,
) -> None:
    victim = cluster.executors[0]
    cluster.set_faults(0, [{"action": "kill", "when": "task_writing", "stage": 1}])
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome["result"] = session.sql(
            f"COPY ({QUERY}) TO 's3://{OUT}/copies/killed/' (FORMAT parquet)"
        )

    runner = threading.Thread(target=run)
    runner.start()
    wait_until(lambda: not victim.alive(), "the executor dies mid-write", 60)
    assert "injected fault: kill at task_writing" in victim.log_tail(1 << 20)
    runner.join(120)
    assert "result" in outcome, "the COPY did not finish"
    expected = duckdb_ref.sql(QUERY).to_arrow_table()
    assert outcome["result"].to_arrow()["Count"].to_pylist() == [expected.num_rows]
    doc = manifest(s3, "copies/killed")
    assert_same_result(
        read_back(s3, "copies/killed", doc["files"], work_dir), expected, ordered=False
    )
    assert not [k for k in keys(s3, "copies/killed") if f"/{STAGING}/" in k]


def test_a_scheduler_restarted_while_the_store_is_away_keeps_its_tables(
    cluster: Any, session: Any, s3: S3TestServer, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """A table whose files cannot be read when the scheduler starts stays in the
    catalog's store: queries naming it say why, and once the store is back it is
    read again (it used to be dropped for good: its name and, for a warehouse
    table, its location lost)."""
    select = "SELECT o_orderkey, o_totalprice FROM orders WHERE o_totalprice > 400000"
    session.sql(f"CREATE TABLE kept AS {select}")
    check = "SELECT count(*) AS n, sum(o_totalprice) AS s FROM "
    expected = duckdb_ref.sql(check + "orders WHERE o_totalprice > 400000").to_arrow_table()
    cluster.kill_scheduler()
    s3.stop()
    try:
        cluster.restart_scheduler()
        with cluster.connect() as s:
            assert "(1 of them unreadable now)" in cluster.scheduler.log_tail()
            [listed] = s.unreadable_tables()
            assert listed.name == "kept" and listed.location == f"s3://{OUT}/warehouse/kept"
            assert "kept" not in [t.name for t in s.tables()]
            with pytest.raises(CatalogError, match=r"'kept' cannot be read now.*DROP TABLE"):
                s.sql(check + "kept")
            with pytest.raises(CatalogError, match=r"'kept' cannot be written now"):
                s.sql(f"INSERT INTO kept {select}")
            # The cluster serves what it can read.
            n = s.sql("SELECT count(*) AS n FROM orders").to_arrow()["n"].to_pylist()
            assert n == [duckdb_ref.sql("SELECT count(*) FROM orders").fetchall()[0][0]]
    finally:
        s3.start()
    with cluster.connect() as s:
        actual = wait_until(
            lambda: _answer_or_none(s, check + "kept"), "the table read again", timeout=40
        )
        assert_same_result(actual, expected, ordered=False)
        assert s.unreadable_tables() == [] and "kept" in [t.name for t in s.tables()]
        s.sql("DROP TABLE kept")
    assert keys(s3, "warehouse/kept") == []


def _answer_or_none(session: Any, sql: str) -> pa.Table | None:
    try:
        result: pa.Table = session.sql(sql).to_arrow()
    except CatalogError as exc:
        assert "cannot be read now" in str(exc), exc
        return None
    return result
