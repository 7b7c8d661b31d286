"""Write statements through Flight SQL's ExecuteUpdate (ADBC), answered with the rows written.

The package's cluster (``fsql_cluster``) has no write root, so ``COPY`` is refused
there; ``CREATE TABLE AS`` writes into its warehouse (beside its SQLite state).
"""

from __future__ import annotations

from typing import Any

import adbc_driver_manager
import duckdb
import pytest
from helpers import assert_same_result


def update(adbc: Any, sql: str) -> int:
    with adbc.cursor() as cur:
        cur.adbc_statement.set_sql_query(sql)
        return int(cur.adbc_statement.execute_update())


def test_create_table_as_insert_and_drop_through_execute_update(
    adbc: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    expected = duckdb_ref.sql("SELECT count(*) FROM lineitem WHERE l_quantity > 45").fetchall()
    written = update(adbc, "CREATE TABLE big_lines AS SELECT * FROM lineitem WHERE l_quantity > 45")
    assert written == expected[0][0] > 0
    assert update(adbc, "INSERT INTO big_lines SELECT * FROM lineitem WHERE l_quantity < 2") > 0
    check = "SELECT count(*) AS n, sum(l_extendedprice) AS s FROM "
    with adbc.cursor() as cur:
        cur.execute(check + "big_lines")
        actual = cur.fetch_arrow_table()
    where = " WHERE l_quantity > 45 OR l_quantity < 2"
    assert_same_result(
        actual, duckdb_ref.sql(check + "lineitem" + where).to_arrow_table(), ordered=False
    )
    assert update(adbc, "DROP TABLE big_lines") == 0
    with pytest.raises(adbc_driver_manager.Error, match="write-root"):
        update(adbc, "COPY region TO '/tmp/mangonel-region' (FORMAT csv)")
    with pytest.raises(adbc_driver_manager.Error, match="ForbiddenStatementError"):
        update(adbc, "SELECT 1")
