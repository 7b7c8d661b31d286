"""The type oracle: DuckDB over empty tables, shared between queries on the same tables."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mangonel.catalog import load_table
from mangonel.errors import BindError
from mangonel.plan.types import oracle_for


def test_one_oracle_serves_queries_on_the_same_tables(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), tmp_path / "t.parquet")
    tables = {"t": load_table("t", str(tmp_path / "t.parquet"))}
    first = oracle_for(tables)
    assert oracle_for({"t": load_table("t", str(tmp_path / "t.parquet"))}) is first
    assert first.describe("SELECT a + 1 AS b FROM t") == [("b", "INTEGER")]
    with pytest.raises(BindError, match="nope"):
        first.describe("SELECT nope FROM t")


def test_a_table_registered_again_with_other_columns_gets_a_new_oracle(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), path)
    before = oracle_for({"t": load_table("t", str(path))})
    pq.write_table(pa.table({"a": pa.array(["x"])}), path)
    after = oracle_for({"t": load_table("t", str(path))})
    assert after is not before
    assert after.describe("SELECT a FROM t") == [("a", "VARCHAR")]
