"""Write statements through Flight SQL's ExecuteUpdate (ADBC), answered with the rows written.

The package's cluster (``fsql_cluster``) has no write root, so ``COPY`` is refused
there; ``CREATE TABLE AS`` writes into its warehouse (beside its SQLite state).
"""

from __future__ import annotations

from pathlib import Path
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


def test_create_external_table_registers_through_execute_update(
    adbc: Any,
    fsql_cluster: Any,
    tpch_tables: dict[str, Path],
    duckdb_ref: duckdb.DuckDBPyConnection,
    work_dir: Path,
) -> None:
    # A CSV file of its own, registered by the scheduler (not by a mangonel client).
    csv = work_dir / "suppliers.csv"
    duckdb_ref.execute(f"COPY (SELECT * FROM supplier) TO '{csv}' (HEADER, DELIMITER '|')")
    ddl = (
        "CREATE EXTERNAL TABLE suppliers_csv STORED AS CSV "
        f"LOCATION '{csv}' OPTIONS ('delimiter' '|')"
    )
    assert update(adbc, ddl) == 0
    assert update(adbc, ddl.replace("TABLE", "TABLE IF NOT EXISTS", 1)) == 0
    with pytest.raises(adbc_driver_manager.Error, match="CatalogError"):
        update(adbc, ddl.replace("suppliers_csv", "broken").replace(str(csv), "/no/such.csv"))
    check = "SELECT count(*) AS n, sum(s_acctbal) AS b, max(s_name) AS m FROM "
    with adbc.cursor() as cur:
        cur.execute(check + "suppliers_csv")
        actual = cur.fetch_arrow_table()
    expected = duckdb_ref.sql(f"{check} read_csv('{csv}', delim = '|')").to_arrow_table()
    assert_same_result(actual, expected, ordered=False)
    # Registered in the scheduler's catalog: every client sees it.
    with fsql_cluster.connect() as session:
        names = [t.name for t in session.tables()]
    assert "suppliers_csv" in names and "broken" not in names
    assert update(adbc, "DROP TABLE suppliers_csv") == 0
