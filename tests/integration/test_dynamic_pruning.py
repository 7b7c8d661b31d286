"""Plan-time pruning on a real cluster: the scheduler process evaluates a filtered
dimension's key range on its real rows, drops the row groups of ``sales`` outside
it, and the executors' answer equals single-process DuckDB's over the same files.

``sales`` (``pruning_tables``) is 20 row groups of 1 000 rows in date order; scan
tasks read 2 000 rows, so it is 10 tasks whole, and the pruned scans below are
still several tasks (the plans are distributed, not one DuckDB task).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import assert_same_result, explain_stage_count
from pruning_tables import INNER, write_tables


@pytest.fixture(scope="module")
def tables(module_dir: Path) -> dict[str, Path]:
    return write_tables(module_dir / "data")


@pytest.fixture(scope="module")
def cluster(module_dir: Path) -> Iterator[Any]:
    import mangonel

    with mangonel.LocalCluster(
        executors=2,
        work_dir=str(module_dir / "cluster"),
        partitions=2,
        scheduler_args=("--split-rows", "2000"),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def session(cluster: Any, tables: dict[str, Path]) -> Iterator[Any]:
    client = cluster.connect()
    for name, path in tables.items():
        client.register_parquet(name, str(path))
    yield client
    client.close()


@pytest.fixture(scope="module")
def ref(tables: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    for name, path in tables.items():
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
    yield con
    con.close()


def _run(session: Any, ref: duckdb.DuckDBPyConnection, sql: str) -> int:
    """Run ``sql`` on the cluster, compare with DuckDB; the reference's row count."""
    expected = ref.sql(sql).to_arrow_table()
    assert_same_result(session.sql(sql).to_arrow(), expected, ordered=False)
    return int(expected.num_rows)


def test_an_inner_join_reads_only_the_row_groups_of_the_dimensions_range(
    session: Any, ref: duckdb.DuckDBPyConnection
) -> None:
    text = session.explain(INNER)
    assert "17 of 20 row groups dropped at plan time" in text, text
    assert "s_date_sk outside dates's d_date_sk range 60..105 after its filter" in text
    assert "table sales (s_date_sk, s_item, s_qty), 3000 rows in 2 split(s)" in text
    assert explain_stage_count(text) > 1
    assert _run(session, ref, INNER) > 0


def test_a_semi_join_is_pruned_and_answers_as_duckdb(
    session: Any, ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """SELECT s_item, count(*) AS n, sum(s_qty) AS q FROM sales
             WHERE EXISTS (SELECT 1 FROM dates WHERE d_date_sk = s_date_sk AND d_year = 2001)
             GROUP BY s_item"""
    text = session.explain(sql)
    assert "11 of 20 row groups dropped" in text and "range 366..730" in text, text
    assert explain_stage_count(text) > 1
    assert _run(session, ref, sql) == 7


def test_an_empty_range_gives_the_empty_answer(
    session: Any, ref: duckdb.DuckDBPyConnection
) -> None:
    # Empty is the point: 1999 has no date, so no sale meets one.
    sql = """SELECT s_item, sum(s_qty) AS q FROM sales JOIN dates ON s_date_sk = d_date_sk
             WHERE d_year = 1999 GROUP BY s_item"""
    text = session.explain(sql)
    assert "19 of 20 row groups dropped" in text
    assert "dates's d_date_sk is empty after its filter" in text, text
    assert _run(session, ref, sql) == 0


def test_an_outer_join_keeping_the_sales_reads_them_all(
    session: Any, ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """SELECT s_item, count(*) AS n, count(d_date_sk) AS matched FROM sales
             LEFT JOIN (SELECT * FROM dates WHERE d_year = 2001) d ON s_date_sk = d_date_sk
             GROUP BY s_item"""
    text = session.explain(sql)
    assert "dropped" not in text
    assert "20000 rows in 10 split(s)" in text, text
    assert _run(session, ref, sql) == 7


def test_a_dimension_file_rewritten_in_place_is_read_again(
    session: Any, ref: duckdb.DuckDBPyConnection, tables: dict[str, Path], module_dir: Path
) -> None:
    """The probe caches a dimension's columns by its files' identity: a file written
    again under the same path (re-registered) gives the new range."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = module_dir / "data" / "days.parquet"
    sql = """SELECT count(*) AS n FROM sales JOIN days ON s_date_sk = d_date_sk
             WHERE d_mark IN (1, 2)"""
    # 100 days, 10 keys apart from ``first``; marks 1 and 2 are keys first+10, first+20.
    for first in (0, 490):
        days = pa.table(
            {
                "d_date_sk": pa.array([first + 10 * i for i in range(100)], pa.int32()),
                "d_mark": pa.array(range(100), pa.int32()),
            }
        )
        pq.write_table(days, path)
        session.register_parquet("days", str(path))
        ref.execute(f"CREATE OR REPLACE VIEW days AS SELECT * FROM read_parquet('{path}')")
        text = session.explain(sql)
        assert f"range {first + 10}..{first + 20}" in text, text
        assert _run(session, ref, sql) == 1
