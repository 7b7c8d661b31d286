"""Plan-time pruning over object storage (``plan.dynamic_pruning``, ``plan.probe``).

The planner reads a filtered dimension's columns from the store (pyarrow, through
``mangonel.storage``, the object's registered version) to prune the fact table's
row groups. On a real cluster reading the tables from a real S3 server (moto's),
the answer equals DuckDB's over the same files as local files. A store that does not
answer the planner leaves the plan whole (every row group read), with the reason logged:
planning never fails for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers import assert_same_result, explain_stage_count
from pruning_tables import INNER, write_tables
from s3server import S3TestServer

from mangonel import storage
from mangonel.catalog import load_table
from mangonel.plan import planner
from mangonel.plan.explain import render
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.plan.probe import Probe
from mangonel.storage import StorageOptions

BUCKET = "pruning"


@pytest.fixture(scope="module")
def local_tables(module_dir: Path) -> dict[str, Path]:
    return write_tables(module_dir / "data")


@pytest.fixture(scope="module")
def s3_tables(s3: S3TestServer, local_tables: dict[str, Path]) -> dict[str, str]:
    client = s3.client()
    client.create_bucket(Bucket=BUCKET)
    for path in local_tables.values():
        client.upload_file(str(path), BUCKET, path.name)
    return {name: f"s3://{BUCKET}/{path.name}" for name, path in local_tables.items()}


@pytest.fixture(scope="module")
def ref(local_tables: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    for name, path in local_tables.items():
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
    yield con
    con.close()


@pytest.fixture()
def in_process_store(s3_options: StorageOptions, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process plans as a scheduler would: its ``--s3-*`` options, and a probe
    of its own for the test (nothing read before is cached)."""
    before = storage.current_options()
    storage.configure(s3_options)
    fresh = Probe()
    monkeypatch.setattr(planner, "_probe", lambda tables: fresh)
    try:
        yield
    finally:
        fresh.close()
        storage.configure(before)


def test_a_cluster_prunes_by_a_dimension_in_the_store(
    module_dir: Path,
    s3_options: StorageOptions,
    s3_tables: dict[str, str],
    ref: duckdb.DuckDBPyConnection,
) -> None:
    import mangonel

    with mangonel.LocalCluster(
        executors=2,
        work_dir=str(module_dir / "cluster"),
        partitions=2,
        scheduler_args=("--split-rows", "2000"),
        storage=s3_options,
    ) as cluster:
        session = cluster.connect()
        try:
            for name, location in s3_tables.items():
                session.register_parquet(name, location)
            text = session.explain(INNER)
            assert "17 of 20 row groups dropped at plan time" in text, text
            assert explain_stage_count(text) > 1
            expected = ref.sql(INNER).to_arrow_table()
            assert expected.num_rows > 0
            assert_same_result(session.sql(INNER).to_arrow(), expected, ordered=False)
        finally:
            session.close()


def test_a_store_the_planner_cannot_reach_leaves_the_plan_whole(
    s3: S3TestServer,
    s3_tables: dict[str, str],
    in_process_store: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    catalog = {name: load_table(name, location) for name, location in s3_tables.items()}
    config = PlannerConfig(split_rows=2_000)
    sql = INNER.replace("d_date BETWEEN DATE '2000-03-01' AND DATE '2000-04-15'", "d_year = 2001")
    s3.pause()  # every request hangs until the client's timeout
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="mangonel.plan.probe"):
            plan = plan_query(sql, catalog, config)
    finally:
        s3.resume()
    # One try (the options' 2 s request timeout), not the executors' retries.
    assert time.monotonic() - started < 8
    text = render(plan, with_sql=False)
    assert "dropped" not in text and "20000 rows in 10 split(s)" in text, text
    assert "plan-time pruning skipped" in caplog.text and "dates" in caplog.text
    # The store back, the same query is pruned (a failure is not remembered).
    assert "11 of 20 row groups dropped" in render(plan_query(sql, catalog, config))


def test_the_dimension_is_read_by_ranged_gets_of_its_columns(
    s3: S3TestServer, s3_tables: dict[str, str], in_process_store: None
) -> None:
    catalog = {name: load_table(name, location) for name, location in s3_tables.items()}
    sql = INNER.replace("d_date BETWEEN DATE '2000-03-01' AND DATE '2000-04-15'", "d_year = 2002")
    s3.clear_log()
    plan = plan_query(sql, catalog, PlannerConfig(split_rows=2_000))
    assert "dropped" in render(plan, with_sql=False)
    paths = {r.path for r in s3.requests}
    assert paths == {f"/{BUCKET}/dates.parquet"}, paths  # neither sales nor items
