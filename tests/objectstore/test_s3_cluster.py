"""Tables in object storage on a real cluster: a scheduler and 2 executor processes
reading TPC-H SF 0.1 from a real S3 server (moto's), every answer checked against
single-process DuckDB over the same data as local files.

The bad-input cases each end in a typed error naming the object, and the cluster
answers a good query after each. Credentials reach the processes only through
their environment; the test checks they appear nowhere mangonel writes or serves.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, explain_stage_count, tpch_query
from s3server import S3TestServer

from mangonel.errors import (
    CatalogError,
    JobFailedError,
    ObjectAccessError,
    ObjectChangedError,
    ObjectNotFoundError,
    ObjectStoreUnavailableError,
)
from mangonel.storage import StorageOptions

QUERIES = list(range(1, 23))
GOOD_QUERY = "SELECT count(*) AS n, sum(l_quantity) AS q FROM lineitem"
# Said of a query only when the query itself is wrong.
FIX_IT = "fix it and submit it again"


@pytest.fixture(scope="module")
def cluster_options(s3: S3TestServer) -> StorageOptions:
    # Short: a store that hangs fails a registration in 3 x ~2.5 s.
    return StorageOptions(
        endpoint_url=s3.url, connect_timeout_s=1.0, request_timeout_s=2.0, attempts=3
    )


@pytest.fixture(scope="module")
def cluster(
    module_dir: Path, s3_tpch: dict[str, str], cluster_options: StorageOptions
) -> Iterator[Any]:
    import mangonel

    with mangonel.LocalCluster(
        executors=2,
        work_dir=str(module_dir / "cluster"),
        partitions=4,
        scheduler_args=("--split-rows", "250000"),
        storage=cluster_options,
        web_port=0,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def session(cluster: Any, s3_tpch: dict[str, str]) -> Iterator[Any]:
    client = cluster.connect()
    for name, location in s3_tpch.items():
        info = client.register_parquet(name, location)
        assert info.location == location
    yield client
    client.close()


def assert_serves(session: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    """The cluster still answers a query over object storage, correctly."""
    expected = duckdb_ref.sql(GOOD_QUERY).to_arrow_table()
    assert_same_result(session.sql(GOOD_QUERY).to_arrow(), expected, ordered=False)


# ----------------------------------------------------------------------- TPC-H


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_tpch_from_object_storage_matches_duckdb(
    number: int, session: Any, cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0  # an empty reference would prove nothing
    result = session.sql(sql)
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
    # The job ran distributed: its plan was split, not run whole in one task (the
    # planner's fallback).
    with urllib.request.urlopen(f"{cluster.web_url}/api/jobs/{result.job_id}", timeout=10) as r:
        job = json.loads(r.read())
    assert job["fallback"] is None, f"q{number:02d} ran whole in one task: {job['fallback']}"


def test_the_plans_are_distributed_over_the_objects(session: Any) -> None:
    text = session.explain(tpch_query(3))
    assert explain_stage_count(text) > 1, text
    tables = {t.name: t for t in session.tables()}
    assert len(tables["lineitem"].files) == 3
    assert all(f.startswith("s3://tpch/sf0.1/lineitem/part-") for f in tables["lineitem"].files)


def test_a_query_fetches_only_the_columns_it_needs(
    session: Any, s3: S3TestServer, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """q6 reads 4 of lineitem's 16 columns: every byte comes by a ranged GET, and far
    fewer bytes than the objects hold."""
    start = len(s3.requests)
    actual = session.sql(tpch_query(6)).to_arrow()
    assert_same_result(actual, duckdb_ref.sql(tpch_query(6)).to_arrow_table(), ordered=False)
    gets = [r for r in s3.requests[start:] if r.method == "GET" and "/lineitem/" in r.path]
    assert gets and all(r.range for r in gets), gets
    client = s3.client()
    total = sum(
        client.head_object(Bucket="tpch", Key=f"sf0.1/lineitem/part-{i}.parquet")["ContentLength"]
        for i in range(3)
    )
    fetched = sum(r.sent for r in gets)
    assert 0 < fetched < total / 2, (fetched, total)


# ------------------------------------------------------------------- locations


def test_register_by_object_prefix_and_glob(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    session.register_parquet("li_glob", "s3://tpch/sf0.1/lineitem/part-*.parquet")
    session.register_parquet("li_prefix", "s3://tpch/sf0.1/lineitem")
    session.register_parquet("li_part", "s3://tpch/sf0.1/lineitem/part-1.parquet")
    sql = "SELECT count(*) AS n, sum(l_extendedprice) AS p, min(l_orderkey) AS k FROM {}"
    expected = duckdb_ref.sql(sql.format("lineitem")).to_arrow_table()
    for name in ("li_glob", "li_prefix"):
        assert_same_result(session.sql(sql.format(name)).to_arrow(), expected, ordered=False)
    part = session.sql(sql.format("li_part")).to_arrow()
    assert 0 < part.column("n")[0].as_py() < expected.column("n")[0].as_py()


def test_cli_register_and_tables(cluster: Any, s3_tpch: dict[str, str]) -> None:
    def mangonel(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mangonel", "--scheduler", cluster.address, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = mangonel("register", "cli_orders", "s3://tpch/sf0.1/orders.parquet")
    assert done.returncode == 0, done.stderr
    assert "150000" in done.stdout + done.stderr
    listed = mangonel("tables")
    assert "s3://tpch/sf0.1/orders.parquet" in listed.stdout
    bad = mangonel("register", "cli_bad", "s3://tpch/sf0.1/missing.parquet")
    assert bad.returncode == 1
    assert "s3://tpch/sf0.1/missing.parquet" in bad.stderr and "Traceback" not in bad.stderr


# ------------------------------------------------------------------- bad input


def test_interval_and_uuid_columns_read_from_the_store_as_duckdb_reads_them(
    session: Any, s3: S3TestServer, tmp_path: Path
) -> None:
    # An object is read with pyarrow, which gives Parquet's INTERVAL as 12 raw
    # bytes: decoded into intervals (``parquet_schema.as_read``), as DuckDB reads them.
    local = tmp_path / "typed.parquet"
    duckdb.connect().execute(
        "COPY (SELECT i AS k, CASE WHEN i % 9 = 0 THEN NULL ELSE INTERVAL (i) DAY "
        "+ INTERVAL 1 MONTH + INTERVAL (i * 7) MILLISECOND END AS iv, md5(i::VARCHAR)::UUID AS u "
        f"FROM range(5000) t(i)) TO '{local}' (FORMAT parquet, ROW_GROUP_SIZE 1000)"
    )
    s3.client().upload_file(str(local), "tpch", "typed/typed.parquet")
    session.register_parquet("typed", "s3://tpch/typed/typed.parquet")
    ref = duckdb.connect()
    for check in (
        "SELECT * FROM typed",
        "SELECT count(*) AS n, max(iv) AS top, min(u) AS low FROM typed "
        "WHERE iv > INTERVAL 2 MONTH",
    ):
        expected = ref.sql(check.replace("typed", f"read_parquet('{local}')")).to_arrow_table()
        assert expected.num_rows > 0
        assert_same_result(session.sql(check).to_arrow(), expected, ordered=False)


def test_missing_bucket_and_wrong_key(session: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ObjectNotFoundError, match="bucket 'nosuchbucket'"):
        session.register_parquet("t", "s3://nosuchbucket/lineitem/")
    assert_serves(session, duckdb_ref)
    with pytest.raises(ObjectNotFoundError, match="s3://tpch/sf0.1/lineitem.parquet"):
        session.register_parquet("t", "s3://tpch/sf0.1/lineitem.parquet")
    assert_serves(session, duckdb_ref)


def test_an_object_that_is_not_parquet(
    session: Any, s3: S3TestServer, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    s3.client().put_object(Bucket="tpch", Key="junk/data.parquet", Body=b"PAR1 but no more")
    with pytest.raises(CatalogError, match="s3://tpch/junk/data.parquet.*not a readable Parquet"):
        session.register_parquet("junk", "s3://tpch/junk/data.parquet")
    assert_serves(session, duckdb_ref)


@pytest.mark.parametrize("change", ["overwritten", "deleted"])
def test_an_object_changed_after_register_fails_the_query(
    change: str,
    session: Any,
    s3: S3TestServer,
    tpch_dir: Path,
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    client = s3.client()
    key = f"changing/{change}/nation.parquet"
    client.upload_file(str(tpch_dir / "nation.parquet"), "tpch", key)
    session.register_parquet(f"nation_{change}", f"s3://tpch/{key}")
    assert session.sql(f"SELECT count(*) AS n FROM nation_{change}").to_arrow()[0][0].as_py() == 25
    if change == "overwritten":
        client.upload_file(str(tpch_dir / "region.parquet"), "tpch", key)
    else:
        client.delete_object(Bucket="tpch", Key=key)
    started = time.monotonic()
    with pytest.raises(ObjectChangedError, match=f"s3://tpch/{key} was {change}") as raised:
        session.sql(f"SELECT max(n_name) AS m FROM nation_{change}")
    # Failed at the first attempt, not retried with backoff: every one would meet it.
    assert time.monotonic() - started < 5
    # Typed, and what it always was too; it tells what to do, and does not blame the query.
    assert isinstance(raised.value, JobFailedError)
    message = str(raised.value)
    assert "register the table again to read what it holds now" in message, message
    assert FIX_IT not in message and "cannot run as written" not in message, message
    assert_serves(session, duckdb_ref)


def test_a_store_that_stays_away_fails_the_query_as_unavailable(
    session: Any, s3: S3TestServer, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """The store's port closes after the table is registered: each task attempt gives
    up after the store's tries, and the job after its attempts, with the store's error.
    One object, one scan task: no executor fails the three distinct tasks that would
    exclude it."""
    session.register_parquet("nation_away", "s3://tpch/sf0.1/nation.parquet")
    s3.stop()
    try:
        with pytest.raises(ObjectStoreUnavailableError, match="did not answer") as raised:
            session.sql("SELECT max(n_name) AS m FROM nation_away")
    finally:
        s3.start()
    assert isinstance(raised.value, JobFailedError)
    message = str(raised.value)
    assert "s3://tpch/sf0.1/nation.parquet" in message, message
    assert re.search(r"failed [2-9] attempts", message), message  # retried, then given up
    assert "run the query again once it is reachable" in message, message
    assert FIX_IT not in message, message
    assert_serves(session, duckdb_ref)


def test_access_refused_while_running_fails_the_query_as_an_access_error(
    session: Any, s3: S3TestServer, tpch_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """Registered while allowed, then refused (a bucket policy changed): the query fails
    at its first attempt with the store's refusal, typed, naming the object."""
    key = "refused/nation.parquet"
    s3.client().upload_file(str(tpch_dir / "nation.parquet"), "tpch", key)
    session.register_parquet("nation_refused", f"s3://tpch/{key}")
    started = time.monotonic()
    with s3.denied("tpch", "refused/"), pytest.raises(ObjectAccessError) as raised:
        session.sql("SELECT max(n_name) AS m FROM nation_refused")
    assert time.monotonic() - started < 5  # not retried: every attempt is refused
    assert isinstance(raised.value, JobFailedError)
    message = str(raised.value)
    assert f"access to s3://tpch/{key} was refused" in message, message
    assert "check the credentials" in message.lower() and FIX_IT not in message, message
    assert_serves(session, duckdb_ref)


def test_a_store_that_hangs_fails_the_registration_in_time(
    session: Any, s3: S3TestServer, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    s3.pause()
    started = time.monotonic()
    try:
        with pytest.raises(ObjectStoreUnavailableError, match="s3://tpch/sf0.1/part.parquet"):
            session.register_parquet("part_again", "s3://tpch/sf0.1/part.parquet")
    finally:
        s3.resume()
    assert time.monotonic() - started < 20
    assert_serves(session, duckdb_ref)


def test_a_store_that_goes_away_for_a_second_is_retried(
    session: Any, cluster: Any, s3: S3TestServer, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """The store's port is closed when the query starts and opens again a second
    later: the executors' reads are refused, retried with backoff, and succeed."""
    s3.stop()
    restart = threading.Timer(1.0, s3.start)
    restart.start()
    try:
        assert_serves(session, duckdb_ref)
    finally:
        restart.join()
    logs = "".join(p.read_text() for p in Path(cluster.log_dir).glob("executor-*.log"))
    assert "try 2 of 3" in logs and "Could not connect" in logs


# --------------------------------------------------------------------- secrets


def test_credentials_appear_nowhere(session: Any, cluster: Any, s3: S3TestServer) -> None:
    """Not in the logs, the state store, the REST API, /metrics, EXPLAIN or the tables."""
    secrets = [s3.secret_key, s3.access_key]
    session.sql(tpch_query(1)).to_arrow()
    seen: dict[str, str] = {
        "explain": session.explain(tpch_query(1)),
        "tables": repr(session.tables()),
    }
    for path in ("/api/cluster", "/api/executors", "/api/jobs", "/metrics"):
        with urllib.request.urlopen(cluster.web_url + path, timeout=10) as answer:
            seen[path] = answer.read().decode()
    for job in json.loads(seen["/api/jobs"])[:5]:
        job_id = job["id"] if isinstance(job, dict) else job
        with urllib.request.urlopen(f"{cluster.web_url}/api/jobs/{job_id}", timeout=10) as answer:
            seen[f"/api/jobs/{job_id}"] = answer.read().decode()
    for path in Path(cluster.work_dir).rglob("*"):
        if path.is_file() and (path.suffix in (".log", ".db") or "state" in path.name):
            seen[str(path)] = path.read_bytes().decode(errors="replace")
    assert any("scheduler-state.db" in k for k in seen), sorted(seen)
    assert any(k.endswith("executor-0.log") for k in seen), sorted(seen)
    for where, text in seen.items():
        for secret in secrets:
            assert secret not in text, f"a credential appears in {where}"
