"""``mangonel.storage`` and the catalog against a real S3 server (moto's), in process.

Locations (object, prefix, glob), footers read with ranged GETs, the version
check, every bad-input case as its typed error naming the object, retries with
backoff, and that DuckDB never reaches for the ``httpfs`` extension.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from s3server import S3TestServer

from mangonel import storage
from mangonel.catalog import load_table
from mangonel.errors import (
    CatalogError,
    ObjectAccessError,
    ObjectChangedError,
    ObjectNotFoundError,
    ObjectStoreUnavailableError,
)
from mangonel.executor import runner as runner_mod
from mangonel.executor.databases import locked_connection
from mangonel.executor.failures import classify
from mangonel.executor.runner import TaskRunner
from mangonel.executor.shuffle import ShuffleReader
from mangonel.executor.shuffle_write import OutputRegistry, ShuffleWriter
from mangonel.ids import JobId, StageId, TaskAttemptId, TaskId
from mangonel.plan.types import TypeOracle
from mangonel.storage import StorageOptions
from mangonel.task import (
    ExecutionError,
    OutputKind,
    OutputSpec,
    QueryError,
    ScanSpec,
    TaskSpec,
)


@pytest.fixture(autouse=True)
def _configured(s3_options: StorageOptions) -> Iterator[None]:
    storage.configure(s3_options)
    yield
    storage.configure(StorageOptions())


# ------------------------------------------------------------------ locations


def test_object_prefix_and_glob_resolve_like_local_paths(s3_tpch: dict[str, str]) -> None:
    parts = tuple(f"s3://tpch/sf0.1/lineitem/part-{i}.parquet" for i in range(3))
    assert storage.list_objects("s3://tpch/sf0.1/lineitem/") == parts
    assert storage.list_objects("s3://tpch/sf0.1/lineitem") == parts
    assert storage.list_objects("s3://tpch/sf0.1/lineitem/part-[01].parquet") == parts[:2]
    assert storage.list_objects("s3://tpch/sf0.1/*.parquet") == tuple(
        f"s3://tpch/sf0.1/{t}.parquet"
        for t in ("customer", "nation", "orders", "part", "partsupp", "region", "supplier")
    )
    # `*` stays within one part of the key, `**` crosses them.
    assert "s3://tpch/sf0.1/lineitem/part-0.parquet" in storage.list_objects(
        "s3://tpch/**/*.parquet"
    )
    assert storage.list_objects("s3://tpch/sf0.1/orders.parquet") == (
        "s3://tpch/sf0.1/orders.parquet",
    )


def test_a_table_from_objects_equals_the_local_one(
    s3_tpch: dict[str, str], tpch_dir: Path, s3: S3TestServer
) -> None:
    local = load_table("lineitem", str(tpch_dir / "lineitem.parquet"))
    start = len(s3.requests)
    remote = load_table("lineitem", s3_tpch["lineitem"])
    assert remote.rows == local.rows == 600_572
    assert remote.schema.equals(local.schema)
    assert len(remote.files) == 3
    assert remote.location == "s3://tpch/sf0.1/lineitem/"
    # Each object's size and ETag, and they travel in the splits.
    client = s3.client()
    sizes = {f: client.head_object(Bucket="tpch", Key=f[len("s3://tpch/") :]) for f in remote.files}
    for path, head in sizes.items():
        assert remote.objects[path].size == head["ContentLength"]
        assert remote.objects[path].version == head["ETag"].strip('"')
    split = remote.splits(100_000)[0][0]
    assert split.version == remote.objects[split.path].version
    # Footers only: ranged GETs, a small part of the objects.
    gets = [r for r in s3.requests[start:] if r.method == "GET" and "/lineitem/" in r.path]
    assert gets and all(r.range for r in gets), gets
    total = sum(h["ContentLength"] for h in sizes.values())
    assert sum(r.sent for r in gets) < total / 20


def test_a_task_reads_only_its_row_groups_and_columns(
    s3_tpch: dict[str, str], s3: S3TestServer, tpch_dir: Path
) -> None:
    uri = "s3://tpch/sf0.1/lineitem/part-1.parquet"
    source = storage.open_object(uri)
    parquet = pq.ParquetFile(source, pre_buffer=True)
    footer = source.bytes_read
    table = parquet.read_row_group(0, columns=["l_quantity"])
    column = parquet.metadata.row_group(0).column(
        parquet.schema_arrow.get_field_index("l_quantity")
    )
    assert table.num_rows == parquet.metadata.row_group(0).num_rows
    fetched = source.bytes_read - footer
    # That column chunk, and nothing else of the 2 row groups x 16 columns.
    assert column.total_compressed_size <= fetched < column.total_compressed_size + 16_384
    assert source.bytes_read < source.version.size / 10


@pytest.mark.parametrize(
    ("sql", "streamed"),
    [
        ('SELECT count(*) AS n FROM "__scan" WHERE n_regionkey = 1', True),
        # Named twice, as the planner writes a copied subquery (TPC-H q20's part filter).
        (
            'SELECT count(*) AS n FROM "__scan" WHERE n_regionkey = 1 AND n_nationkey IN '
            "(SELECT n_nationkey FROM \"__scan\" WHERE n_name < 'P')",
            False,
        ),
        (
            'WITH t AS (SELECT * FROM "__scan" WHERE n_regionkey = 1) SELECT count(*) AS n FROM t',
            False,
        ),
    ],
    ids=["once", "twice", "with"],
)
def test_a_task_reads_an_object_as_often_as_its_fragment_names_it(
    sql: str,
    streamed: bool,
    s3_tpch: dict[str, str],
    tpch_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A split read by pyarrow is streamed only where DuckDB reads it in one pass: a
    fragment that names its scan twice (or through a CTE) reads it whole, where the
    stream, spent by the first read, failed the second."""
    read_scan = runner_mod.read_scan
    handed: list[type] = []

    def spy(*args: Any) -> pa.Table | pa.RecordBatchReader:
        read = read_scan(*args)
        handed.append(type(read))
        return read

    monkeypatch.setattr(runner_mod, "read_scan", spy)
    table = load_table("nation", s3_tpch["nation"])
    (splits,) = table.splits(1_000_000)
    writer = ShuffleWriter(str(tmp_path / "shuffle"), OutputRegistry())
    runner = TaskRunner(writer, ShuffleReader("host"), str(tmp_path / "spill"), "256MB", 1)
    try:
        attempt = TaskAttemptId(TaskId(JobId("job"), StageId(1), 0), 0)
        spec = TaskSpec(
            attempt=attempt,
            sql=sql,
            output=OutputSpec(OutputKind.SINGLE),
            columns=("n",),
            scans=(ScanSpec("__scan", "nation", ("n_nationkey", "n_name", "n_regionkey"), splits),),
        )
        (out,) = runner.run(spec)
        with pa.memory_map(out.path) as source:
            got = pa.ipc.open_file(source).read_all().column("n").to_pylist()
    finally:
        runner.close()
    local = duckdb.connect()
    local.execute(f"CREATE VIEW \"__scan\" AS FROM read_parquet('{tpch_dir / 'nation.parquet'}')")
    expected = [local.execute(sql).fetchall()[0][0]]
    assert got == expected and 0 < expected[0] < 25, (got, expected)
    assert handed == [pa.RecordBatchReader if streamed else pa.Table]


# ------------------------------------------------------------------ bad input


def test_missing_bucket_wrong_key_and_empty_glob_name_the_object(s3_tpch: dict[str, str]) -> None:
    with pytest.raises(ObjectNotFoundError, match="bucket 'nosuchbucket'.*does not exist"):
        load_table("t", "s3://nosuchbucket/t.parquet")
    with pytest.raises(ObjectNotFoundError, match="s3://tpch/sf0.1/nope.parquet"):
        load_table("t", "s3://tpch/sf0.1/nope.parquet")
    with pytest.raises(ObjectNotFoundError, match=r"s3://tpch/sf0.1/\*.csv"):
        load_table("t", "s3://tpch/sf0.1/*.csv")
    with pytest.raises(CatalogError, match="names no bucket"):
        load_table("t", "s3:///t.parquet")


def test_an_object_that_is_not_parquet(s3_tpch: dict[str, str], s3: S3TestServer) -> None:
    s3.client().put_object(Bucket="tpch", Key="junk/notes.parquet", Body=b"not parquet at all")
    with pytest.raises(CatalogError, match="s3://tpch/junk/notes.parquet.*not a readable Parquet"):
        load_table("t", "s3://tpch/junk/notes.parquet")


def test_wrong_and_missing_credentials(
    s3_tpch: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(ObjectAccessError, match="s3://tpch/sf0.1/nation.parquet") as wrong:
        load_table("t", "s3://tpch/sf0.1/nation.parquet")
    assert "not-the-secret" not in str(wrong.value)
    assert "check the credentials" in str(wrong.value)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    started = time.monotonic()
    with pytest.raises(ObjectAccessError, match="no credentials were given") as missing:
        load_table("t", "s3://tpch/sf0.1/nation.parquet")
    assert "s3://tpch/sf0.1/nation.parquet" in str(missing.value)
    assert time.monotonic() - started < 10


def test_credentials_from_a_profile(
    s3_tpch: dict[str, str], s3: S3TestServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[reader]\naws_access_key_id = {s3.access_key}\naws_secret_access_key = {s3.secret_key}\n"
    )
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "reader")
    assert load_table("nation", s3_tpch["nation"]).rows == 25


def test_an_object_overwritten_or_deleted_after_register(
    s3_tpch: dict[str, str], s3: S3TestServer, tpch_dir: Path
) -> None:
    client = s3.client()
    client.upload_file(str(tpch_dir / "nation.parquet"), "tpch", "tmp/nation.parquet")
    table = load_table("n", "s3://tpch/tmp/nation.parquet")
    expected = table.objects["s3://tpch/tmp/nation.parquet"]
    storage.open_object("s3://tpch/tmp/nation.parquet", expected).close()  # unchanged: fine
    client.upload_file(str(tpch_dir / "region.parquet"), "tpch", "tmp/nation.parquet")
    with pytest.raises(ObjectChangedError, match="s3://tpch/tmp/nation.parquet was overwritten"):
        storage.open_object("s3://tpch/tmp/nation.parquet", expected)
    client.delete_object(Bucket="tpch", Key="tmp/nation.parquet")
    with pytest.raises(ObjectChangedError, match="s3://tpch/tmp/nation.parquet was deleted"):
        storage.open_object("s3://tpch/tmp/nation.parquet", expected)


def test_object_failures_are_classified_for_the_scheduler() -> None:
    # Every attempt would meet the same object: not retried.
    assert isinstance(classify(ObjectChangedError("s3://b/k was deleted")), QueryError)
    assert isinstance(classify(ObjectNotFoundError("s3://b/k")), QueryError)
    assert isinstance(classify(ObjectAccessError("s3://b/k")), QueryError)
    # The store was away even after its retries: another attempt may find it back.
    assert isinstance(classify(ObjectStoreUnavailableError("s3://b/k")), ExecutionError)


# ------------------------------------------------------------ retries, timeouts


def test_a_store_that_fails_for_a_moment_is_retried(
    s3_tpch: dict[str, str], s3: S3TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    start = len(s3.requests)
    s3.fail_next(2)
    table = load_table("nation", s3_tpch["nation"])
    assert table.rows == 25
    statuses = [r.status for r in s3.requests[start:]]
    assert statuses[:2] == [503, 503] and 200 in statuses[2:] or 206 in statuses[2:], statuses
    assert "try 2 of 4" in caplog.text and "try 3 of 4" in caplog.text


def test_a_store_that_hangs_times_out_with_a_clear_error(
    s3_tpch: dict[str, str], s3: S3TestServer
) -> None:
    options = StorageOptions(
        endpoint_url=s3.url, connect_timeout_s=0.5, request_timeout_s=1.0, attempts=2, backoff_s=0.1
    )
    storage.configure(options)
    s3.pause()
    started = time.monotonic()
    try:
        with pytest.raises(ObjectStoreUnavailableError, match="s3://tpch/sf0.1/nation.parquet"):
            load_table("t", s3_tpch["nation"])
    finally:
        s3.resume()
    # Two tries of about the request timeout each, then the error: no hang.
    assert time.monotonic() - started < 8


def test_a_store_that_is_not_there(s3_tpch: dict[str, str]) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    storage.configure(StorageOptions(endpoint_url=f"http://127.0.0.1:{port}", attempts=2))
    with pytest.raises(ObjectStoreUnavailableError, match="did not answer.*after 2 tries"):
        load_table("t", "s3://tpch/sf0.1/nation.parquet")


# -------------------------------------------------------------------- options


def test_options_come_from_the_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert StorageOptions().endpoint() == "http://minio:9000"
    assert StorageOptions().resolved_region() == "eu-west-3"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:9000")
    assert StorageOptions().endpoint() == "http://s3-only:9000"
    given = StorageOptions(endpoint_url="http://other:1", region="us-west-2")
    assert given.endpoint() == "http://other:1"
    assert given.resolved_region() == "us-west-2"


def test_options_travel_as_command_line_flags() -> None:
    options = StorageOptions(
        endpoint_url="http://minio:9000",
        region="eu-west-1",
        addressing="virtual",
        connect_timeout_s=0.5,
        request_timeout_s=3.0,
        attempts=2,
        backoff_s=0.05,
    )
    parser = argparse.ArgumentParser()
    storage.add_arguments(parser)
    assert storage.options_from_args(parser.parse_args(options.to_args())) == options
    assert storage.options_from_args(parser.parse_args([])) == StorageOptions()
    assert StorageOptions().to_args() == []


# --------------------------------------------------------------------- DuckDB


def test_duckdb_never_installs_or_loads_an_extension(tmp_path: Path) -> None:
    """A task database that is allowed to read an s3:// path still cannot: DuckDB
    would need httpfs, and it fails at once instead of downloading it."""
    uri = "s3://tpch/sf0.1/nation.parquet"
    con = locked_connection(str(tmp_path / "spill"), None, 1, [uri])
    settings = con.execute(
        "SELECT current_setting('autoinstall_known_extensions'), "
        "current_setting('autoload_known_extensions')"
    ).fetchone()
    assert settings == (False, False)
    started = time.monotonic()
    with pytest.raises(duckdb.Error) as caught:
        con.execute(f"SELECT count(*) FROM read_parquet('{uri}')").fetchall()
    assert time.monotonic() - started < 5
    assert "httpfs" in str(caught.value), caught.value
    con.close()
    oracle = TypeOracle({})
    assert oracle._con.execute(
        "SELECT current_setting('autoinstall_known_extensions')"
    ).fetchone() == (False,)
