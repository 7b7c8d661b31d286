"""Ballista's CREATE EXTERNAL TABLE and DROP TABLE, parsed (sqlglot reads neither whole)."""

from __future__ import annotations

import pytest

from mangonel.errors import SqlSyntaxError
from mangonel.sql.ddl import CreateExternalTable, parse_ddl


def test_create_external_table_with_columns_and_options() -> None:
    statement = parse_ddl(
        "-- orders as text\n"
        'CREATE EXTERNAL TABLE IF NOT EXISTS "My Orders" (o_orderkey BIGINT, '
        "o_totalprice DECIMAL(15, 2), o_comment VARCHAR) STORED AS csv "
        "LOCATION 's3://b/orders/' OPTIONS ('delimiter' '|', 'header' = 'false', "
        "'split_size' 1000);"
    )
    assert statement == CreateExternalTable(
        name="My Orders",
        location="s3://b/orders/",
        format="csv",
        columns=(
            ("o_orderkey", "BIGINT"),
            ("o_totalprice", "DECIMAL(15, 2)"),
            ("o_comment", "VARCHAR"),
        ),
        options=(("delimiter", "|"), ("header", "false"), ("split_size", "1000")),
        if_not_exists=True,
    )


def test_create_external_table_in_any_order_without_columns() -> None:
    statement = parse_ddl("create external table t location '/d/t/' stored as NDJSON")
    assert statement == CreateExternalTable("t", "/d/t/", "ndjson")


def test_other_statements_are_not_ddl() -> None:
    assert parse_ddl("DROP TABLE IF EXISTS t") is None  # the scheduler's (sql.writes)
    assert parse_ddl("SELECT 'CREATE EXTERNAL TABLE t' AS x") is None
    assert parse_ddl("SELECT * FROM external_events") is None


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        ("CREATE EXTERNAL TABLE t STORED AS XML LOCATION 'x'", "STORED AS XML"),
        ("CREATE EXTERNAL TABLE t STORED AS CSV", "missing LOCATION"),
        ("CREATE EXTERNAL TABLE t LOCATION 'x'", "missing STORED AS"),
        ("CREATE EXTERNAL TABLE t (a) STORED AS CSV LOCATION 'x'", "needs a type"),
        ("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION x", "the location, quoted"),
        ("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION 'x' OPTIONS ('a' b)", "quoted"),
    ],
)
def test_mistakes_say_what_and_where(sql: str, problem: str) -> None:
    with pytest.raises(SqlSyntaxError, match=problem) as raised:
        parse_ddl(sql)
    assert "CREATE EXTERNAL TABLE name" in str(raised.value)
