# ruff: noqa: E501  (one query per line: the tables of cases read better unwrapped)
"""Bad input is refused with the right error and a message that says what to do.

Every test ends by asking the same cluster a good query: a refused or failed query
must leave the scheduler and the executors serving. The Flight tests speak to an
executor directly, as an attacker on the network would, with tickets that do not
name an output the executor wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.flight as flight
import pytest

from mangonel.errors import (
    BindError,
    CatalogError,
    ForbiddenStatementError,
    JobCancelledError,
    JobFailedError,
    JobQueryError,
    MangonelError,
    QueryError,
    SqlSyntaxError,
    UnknownTableError,
)


def assert_still_serving(session: Any) -> None:
    """The cluster answers a good query after the bad one."""
    result = session.sql("SELECT COUNT(*) AS n FROM nation").to_arrow()
    assert result.column("n").to_pylist() == [25]


@dataclass(frozen=True)
class Bad:
    id: str
    sql: str
    error: type[MangonelError] | tuple[type[MangonelError], ...]
    """The error class; a tuple where either answer is right."""
    message: str
    """A regular expression the error message must match (case-insensitive)."""
    dialect: str | None = None


# What each refusal must tell the user to do, in the front end's words.
ONLY_SELECT = r"select|register"
REGISTER = r"register"
FIX_IT = r"the query cannot run as written; fix it and submit it again"

BAD_QUERIES: list[Bad] = [
    # --- syntax: the message points at the place
    Bad(
        "syntax_error",
        "SELECT n_name,\n  FROM nation\n WHERE (",
        SqlSyntaxError,
        r"line \d+.*col(umn)? \d+",
    ),
    Bad("syntax_unclosed_string", "SELECT 'abc FROM nation", SqlSyntaxError, r"syntax|string|line"),
    Bad("empty_query", "   ", SqlSyntaxError, r"empty|select"),
    Bad("unknown_dialect", "SELECT 1 AS x", QueryError, r"dialect", dialect="no-such-dialect"),
    # --- the catalog and the binder
    Bad(
        "unknown_table",
        "SELECT * FROM no_such_table",
        UnknownTableError,
        r"no_such_table.*" + REGISTER,
    ),
    Bad(
        "unknown_table_in_subquery",
        "SELECT n_name FROM nation WHERE n_nationkey IN (SELECT k FROM missing_t)",
        UnknownTableError,
        r"missing_t",
    ),
    # `main.nation` is `nation` (BI tools qualify every name: `defaults.SCHEMA`); another
    # schema is not in the catalog.
    Bad("schema_qualified_table", "SELECT * FROM sales.nation", UnknownTableError, r"nation"),
    Bad("unknown_column", "SELECT n_no_such_column FROM nation", BindError, r"n_no_such_column"),
    Bad(
        "type_error_string_plus_int",
        "SELECT 'abc' + 1 AS x FROM nation",
        BindError,
        r"\+|function|cast",
    ),
    Bad(
        "type_error_date_vs_int",
        "SELECT o_orderkey FROM orders WHERE o_orderdate > 5",
        BindError,
        r"date|compare|cast",
    ),
    Bad(
        "type_error_date_plus_text",
        "SELECT o_orderdate + o_comment AS x FROM orders",
        BindError,
        r"date|varchar|function|cast",
    ),
    # --- forbidden statements: refused before planning
    # This module's scheduler has no --write-root: COPY ... TO has nowhere to write.
    Bad(
        "copy_to",
        "COPY nation TO '/tmp/mangonel-nation.csv'",
        ForbiddenStatementError,
        "write-root",
    ),
    Bad("copy_from", "COPY nation FROM '/etc/passwd'", ForbiddenStatementError, ONLY_SELECT),
    Bad(
        "attach", "ATTACH '/tmp/mangonel-evil.duckdb' AS evil", ForbiddenStatementError, ONLY_SELECT
    ),
    Bad("install", "INSTALL httpfs", ForbiddenStatementError, ONLY_SELECT),
    Bad("load", "LOAD httpfs", ForbiddenStatementError, ONLY_SELECT),
    Bad("set", "SET threads = 1", ForbiddenStatementError, ONLY_SELECT),
    Bad("pragma", "PRAGMA database_list", ForbiddenStatementError, ONLY_SELECT),
    # CREATE TABLE ... AS SELECT / (columns), INSERT INTO ... SELECT / VALUES and DROP
    # TABLE write (tests/integration/test_writes.py); other shapes of them are refused.
    Bad(
        "create_table",
        "CREATE TABLE t (a INTEGER PRIMARY KEY)",
        ForbiddenStatementError,
        "constraints and defaults are not kept",
    ),
    Bad(
        "create_view", "CREATE VIEW v AS SELECT * FROM nation", ForbiddenStatementError, ONLY_SELECT
    ),
    Bad(
        "insert",
        "INSERT INTO nation (n_nationkey) VALUES (99)",
        QueryError,
        "inserts only into tables it created",
    ),
    Bad("update", "UPDATE nation SET n_name = 'X'", ForbiddenStatementError, ONLY_SELECT),
    Bad("delete", "DELETE FROM nation", ForbiddenStatementError, ONLY_SELECT),
    Bad("drop", "DROP VIEW nation", ForbiddenStatementError, "DROP TABLE"),
    Bad(
        "export_database",
        "EXPORT DATABASE '/tmp/mangonel-export'",
        ForbiddenStatementError,
        ONLY_SELECT,
    ),
    Bad(
        "multi_statement", "SELECT 1 AS x; SELECT 2 AS y", ForbiddenStatementError, r"one|statement"
    ),
    Bad(
        "select_then_drop",
        "SELECT * FROM nation; DROP TABLE nation",
        ForbiddenStatementError,
        r"one|statement",
    ),
    # --- file and system functions hidden anywhere in a SELECT
    Bad("read_csv", "SELECT * FROM read_csv('/etc/passwd')", ForbiddenStatementError, ONLY_SELECT),
    Bad(
        "read_csv_auto",
        "SELECT * FROM read_csv_auto('/etc/passwd')",
        ForbiddenStatementError,
        ONLY_SELECT,
    ),
    Bad(
        "read_text", "SELECT * FROM read_text('/etc/passwd')", ForbiddenStatementError, ONLY_SELECT
    ),
    Bad(
        "read_parquet",
        "SELECT * FROM read_parquet('/tmp/x.parquet')",
        ForbiddenStatementError,
        ONLY_SELECT,
    ),
    Bad("glob", "SELECT * FROM glob('/etc/*')", ForbiddenStatementError, ONLY_SELECT),
    # DuckDB would read the file; to the front end it is an unregistered table name.
    Bad(
        "file_path_as_table",
        "SELECT * FROM '/etc/passwd'",
        (ForbiddenStatementError, UnknownTableError),
        ONLY_SELECT,
    ),
    Bad(
        "read_csv_in_cte",
        "WITH x AS (SELECT * FROM read_csv('/etc/passwd')) SELECT * FROM x",
        ForbiddenStatementError,
        ONLY_SELECT,
    ),
    Bad(
        "read_csv_in_where",
        "SELECT n_name FROM nation WHERE n_name IN (SELECT * FROM read_csv('/etc/passwd'))",
        ForbiddenStatementError,
        ONLY_SELECT,
    ),
    Bad(
        "glob_in_select_list",
        "SELECT n_name, (SELECT COUNT(*) FROM glob('/*')) AS files FROM nation",
        ForbiddenStatementError,
        ONLY_SELECT,
    ),
    Bad(
        "getenv", "SELECT getenv('HOME') AS home FROM nation", ForbiddenStatementError, ONLY_SELECT
    ),
    Bad("duckdb_settings", "SELECT * FROM duckdb_settings()", ForbiddenStatementError, ONLY_SELECT),
    Bad(
        "read_csv_postgres_dialect",
        "SELECT * FROM read_csv('/etc/passwd')",
        ForbiddenStatementError,
        ONLY_SELECT,
        dialect="postgres",
    ),
    # --- failures while running: the job fails with DuckDB's words, as the query's
    # fault (a QueryError that is a JobFailedError too), telling the user to fix it
    Bad(
        "runtime_cast_failure",
        "SELECT CAST(o_comment AS INTEGER) AS x FROM orders",
        JobQueryError,
        r"(convert|conversion|cast).*" + FIX_IT,
    ),
    Bad(
        "runtime_division_by_zero",
        "SELECT o_orderkey // (o_custkey - o_custkey) AS x FROM orders",
        JobQueryError,
        r"division by zero.*" + FIX_IT,
    ),
    # sqlglot decorrelates such a subquery as MAX of its rows: the query answered
    # where DuckDB fails it (``sql.optimize.ONE_ROW``).
    Bad(
        "runtime_correlated_scalar_subquery_of_several_rows",
        "SELECT n_name, (SELECT s_name FROM supplier WHERE s_nationkey = n_nationkey) AS s FROM nation",
        JobQueryError,
        r"more than one row returned by a subquery.*[^.]\. " + FIX_IT,
    ),
    Bad(
        "runtime_scalar_subquery_of_several_rows",
        "SELECT (SELECT n_name FROM nation) AS x",
        JobQueryError,
        r"more than one row returned by a subquery.*[^.]\. " + FIX_IT,
    ),
    Bad(
        "runtime_decimal_overflow",
        "SELECT CAST(l_orderkey AS DECIMAL(2, 0)) AS x FROM lineitem",
        JobQueryError,
        r"(cast|convert|decimal).*" + FIX_IT,
    ),
]
RUNTIME = [b for b in BAD_QUERIES if b.error is JobQueryError]


@pytest.mark.parametrize("bad", BAD_QUERIES, ids=[b.id for b in BAD_QUERIES])
def test_bad_query_is_refused_and_cluster_still_serves(bad: Bad, session: Any) -> None:
    with pytest.raises(bad.error) as caught:
        session.sql(bad.sql, dialect=bad.dialect)
    assert not isinstance(caught.value, JobCancelledError)
    if bad in RUNTIME:  # both: callers catch either
        assert isinstance(caught.value, QueryError) and isinstance(caught.value, JobFailedError)
    message = str(caught.value)
    assert re.search(bad.message, message, re.IGNORECASE | re.DOTALL), message
    assert "root:x:" not in message  # no file content leaks into an error
    assert_still_serving(session)


@pytest.mark.parametrize(
    "bad",
    [b for b in BAD_QUERIES if b not in RUNTIME],
    ids=[b.id for b in BAD_QUERIES if b not in RUNTIME],
)
def test_bad_query_is_refused_by_explain_too(bad: Bad, session: Any) -> None:
    with pytest.raises(bad.error):
        session.explain(bad.sql, dialect=bad.dialect)


def test_forbidden_statement_leaves_no_file(session: Any, tmp_path: Path) -> None:
    target = tmp_path / "copied.csv"
    with pytest.raises(ForbiddenStatementError):
        session.sql(f"COPY (SELECT * FROM nation) TO '{target}'")
    assert not target.exists()
    assert_still_serving(session)


# ------------------------------------------------------------------- catalog input


def test_register_missing_path_is_a_catalog_error(session: Any, tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="exist|path"):
        session.register_parquet("ghost", str(tmp_path / "nope.parquet"))
    assert_still_serving(session)


def test_register_non_parquet_file_is_a_catalog_error(session: Any, tmp_path: Path) -> None:
    text = tmp_path / "notes.parquet"
    text.write_text("this is not parquet\n")
    with pytest.raises(CatalogError, match="parquet"):
        session.register_parquet("notes", str(text))
    assert_still_serving(session)


def test_register_directory_without_parquet_is_a_catalog_error(
    session: Any, tmp_path: Path
) -> None:
    (tmp_path / "readme.txt").write_text("nothing here\n")
    with pytest.raises(CatalogError, match="parquet"):
        session.register_parquet("emptydir", str(tmp_path))
    assert_still_serving(session)


def test_register_invalid_table_name_is_a_catalog_error(
    session: Any, tpch_tables: dict[str, Path]
) -> None:
    with pytest.raises(CatalogError, match="name"):
        session.register_parquet("bad-name; DROP", str(tpch_tables["nation"]))
    assert_still_serving(session)


def test_a_table_registered_in_upper_case_is_named_in_any_case(
    session: Any, tpch_tables: dict[str, Path]
) -> None:
    # Names match without case, as DuckDB's do: the catalog keeps them in lower
    # case (a table registered as "MyNation" failed every query naming it with an
    # internal error, the scheduler's KeyError).
    session.register_parquet("MyNation", str(tpch_tables["nation"]))
    for name in ("MyNation", "mynation", "MYNATION", '"MyNation"'):
        result = session.sql(f"SELECT COUNT(*) AS n FROM {name}").to_arrow()
        assert result.column("n").to_pylist() == [25], name
    assert "mynation" in {t.name for t in session.tables()}
    assert_still_serving(session)


# ------------------------------------------------------------------- flight tickets


def test_flight_ticket_not_naming_an_output_is_refused(
    session: Any, cluster: Any, module_dir: Path, tpch_tables: dict[str, Path]
) -> None:
    executors = session.status().executors
    assert len(executors) >= 2
    addresses = {e.flight_address for e in executors}
    tickets = [
        "/etc/passwd",
        "../../../../../../../../etc/passwd",
        f"{module_dir}/cluster/../../../../../../../../etc/passwd",
        str(tpch_tables["nation"]),  # a readable Parquet file, but not an output
        f"{module_dir}/cluster/no-such-output.arrow",
        "",
    ]
    for address in addresses:
        client = flight.connect(f"grpc://{address}")
        try:
            for ticket in tickets:
                with pytest.raises(flight.FlightError) as caught:
                    client.do_get(flight.Ticket(ticket.encode())).read_all()
                assert "root:x:" not in str(caught.value), ticket
        finally:
            client.close()
    assert_still_serving(session)
