"""TPC-H and TPC-DS from object storage as planned by default: small tables, one task.

At SF 0.1 and the default split sizes, most plans are one stage whose task scans
every table it reads, each an Arrow stream that pyarrow reads from S3
(``scan.read_scan``). Such a fragment may name one scan twice: TPC-H q20's
filter on ``part``, a subquery the planner copies into the filter that cuts
``lineitem`` down, read it twice, and the stream failed its second read ("This
RecordBatchReader has already been consumed"), where local files, read by
DuckDB's own reader, are read again. ``test_s3_cluster.py`` runs with small
splits, whose plans are several stages, and never met it. TPC-DS met it too:
q33, q56 and q60 name a filter on ``item`` twice, q58 and q83 one on ``date_dim``
(the only one-stage TPC-DS plans at SF 0.1 that name a scan twice).

A scheduler and 2 executor processes read the tables from a real S3 server
(moto's), every TPC-H table registered the same way in each layout (one object
per table, a prefix, a glob), TPC-DS one object per table; every answer is
checked against single-process DuckDB over the same data as local files.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import (
    TPCDS_TABLES,
    TPCH_ORDER_BY,
    assert_same_result,
    duckdb_views_sql,
    ensure_tpcds,
    explain_stage_count,
    order_by_outputs,
    tpcds_query,
    tpch_query,
)
from s3server import S3TestServer

from mangonel.storage import StorageOptions

QUERIES = list(range(1, 23))
LAYOUTS = ("object", "prefix", "glob")
"""The ways every table is registered (``s3_tpch_layouts``)."""
TPCDS_READ_TWICE = [33, 56, 58, 60, 83]
"""The TPC-DS queries whose one-stage plan at SF 0.1 names a scan twice."""
TPCDS_EMPTY = frozenset({58, 83})
"""Of those, the ones whose answer at SF 0.1 has no row, DuckDB's included: they
still prove that the task read its scan twice and finished."""

_SCAN_NAME = re.compile(r"\bas (__scan\d*)\b")


@pytest.fixture(scope="module")
def cluster(module_dir: Path, s3: S3TestServer) -> Iterator[Any]:
    import mangonel

    # The scheduler's defaults: no --split-rows, no partitions given.
    with mangonel.LocalCluster(
        executors=2,
        work_dir=str(module_dir / "cluster"),
        storage=StorageOptions(endpoint_url=s3.url),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def s3_tpcds(s3: S3TestServer) -> dict[str, str]:
    """TPC-DS SF 0.1 in ``s3://tpcds/``, one object per table: name -> location."""
    data = ensure_tpcds(0.1)
    client = s3.client()
    client.create_bucket(Bucket="tpcds")
    for name in TPCDS_TABLES:
        client.upload_file(str(data / f"{name}.parquet"), "tpcds", f"sf0.1/{name}.parquet")
    return {name: f"s3://tpcds/sf0.1/{name}.parquet" for name in TPCDS_TABLES}


@pytest.fixture(scope="module")
def tpcds_ref() -> Iterator[duckdb.DuckDBPyConnection]:
    data = ensure_tpcds(0.1)
    con = duckdb.connect()
    for statement in duckdb_views_sql({name: data / f"{name}.parquet" for name in TPCDS_TABLES}):
        con.execute(statement)
    yield con
    con.close()


@pytest.fixture(scope="module")
def session(cluster: Any) -> Iterator[Any]:
    client = cluster.connect()
    yield client
    client.close()


def use_layout(session: Any, locations: dict[str, str]) -> None:
    """Register every table at its location in one layout (those not there already)."""
    registered = {t.name: t.location for t in session.tables()}
    for name, location in locations.items():
        if registered.get(name) != location:
            assert session.register_parquet(name, location).location == location


def scans_named_twice(explain: str) -> set[str]:
    """The scans a fragment of the plan names more than once."""
    return {name for name in _SCAN_NAME.findall(explain) if explain.count(f'"{name}"') > 1}


def assert_tpch_matches(number: int, session: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0  # an empty reference would prove nothing
    actual = session.sql(sql).to_arrow()
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_q20_reads_a_scan_twice_in_one_task_from_each_layout(
    layout: str,
    session: Any,
    s3_tpch_layouts: dict[str, dict[str, str]],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    use_layout(session, s3_tpch_layouts[layout])
    tables = {t.name: t for t in session.tables()}
    assert len(tables["lineitem"].files) == (1 if layout == "object" else 3)
    text = session.explain(tpch_query(20))
    # The case this test is for: one task, whose fragment reads a scan of S3 twice.
    assert explain_stage_count(text) == 1, text
    assert scans_named_twice(text), text
    assert_tpch_matches(20, session, duckdb_ref)


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_tpch_planned_by_default_from_object_storage_matches_duckdb(
    number: int,
    session: Any,
    s3_tpch_layouts: dict[str, dict[str, str]],
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    # Several objects per table: a task's scan reads several objects.
    use_layout(session, s3_tpch_layouts["prefix"])
    assert_tpch_matches(number, session, duckdb_ref)


@pytest.mark.parametrize("number", TPCDS_READ_TWICE, ids=[f"q{n:02d}" for n in TPCDS_READ_TWICE])
def test_tpcds_reading_a_scan_twice_in_one_task_matches_duckdb(
    number: int,
    session: Any,
    s3_tpcds: dict[str, str],
    tpcds_ref: duckdb.DuckDBPyConnection,
) -> None:
    use_layout(session, s3_tpcds)
    sql = tpcds_query(number)
    text = session.explain(sql)
    assert explain_stage_count(text) == 1, text
    assert scans_named_twice(text), text
    expected = tpcds_ref.sql(sql).to_arrow_table()
    assert (expected.num_rows == 0) == (number in TPCDS_EMPTY), expected.num_rows
    actual = session.sql(sql).to_arrow()
    order_by = order_by_outputs(sql, expected.column_names)
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by or ())
