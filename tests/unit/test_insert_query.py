"""``insert_query``: an ``INSERT``'s query cast to the table's columns, by position.

Statements are planned on the scheduler's threads at once, so the cast is made
from several threads together here too (DuckDB's shared default connection
refused the second caller, and one of two concurrent ``INSERT``s failed).
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from mangonel.errors import QueryError
from mangonel.scheduler.writes import insert_query

SCHEMA = pa.schema([("key", pa.int64()), ("price", pa.decimal128(15, 2)), ("note", pa.string())])


def test_the_query_is_cast_to_the_table_columns_by_position() -> None:
    sql = insert_query("SELECT 1, 2.5, 'x'", SCHEMA, ["a", "b", "c"], "t")
    assert sql == (
        'SELECT CAST("q0" AS BIGINT) AS "key", CAST("q1" AS DECIMAL(15,2)) AS "price", '
        'CAST("q2" AS VARCHAR) AS "note" FROM (SELECT 1, 2.5, \'x\') AS __insert("q0", "q1", "q2")'
    )


def test_another_number_of_columns_is_refused() -> None:
    with pytest.raises(QueryError, match="table t has 3 columns .* but the query gives 2"):
        insert_query("SELECT 1, 2", SCHEMA, ["a", "b"], "t")


def test_many_threads_cast_at_once() -> None:
    failures: list[BaseException] = []

    def cast() -> None:
        try:
            for _ in range(100):
                insert_query("SELECT 1, 2.5, 'x'", SCHEMA, ["a", "b", "c"], "t")
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=cast) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_by_name_each_table_column_takes_the_query_column_of_its_name() -> None:
    # In any order and case; a column the query does not name is NULL.
    sql = insert_query("SELECT 'n' AS NOTE, 7 AS key", SCHEMA, ["NOTE", "key"], "t", by_name=True)
    assert sql == (
        'SELECT CAST("q1" AS BIGINT) AS "key", CAST(NULL AS DECIMAL(15,2)) AS "price", '
        'CAST("q0" AS VARCHAR) AS "note" '
        'FROM (SELECT \'n\' AS NOTE, 7 AS key) AS __insert("q0", "q1")'
    )


def test_by_name_a_column_the_table_lacks_or_one_named_twice_is_refused() -> None:
    with pytest.raises(QueryError, match="table t has no column 'cost'"):
        insert_query("SELECT 1 AS key, 2 AS cost", SCHEMA, ["key", "cost"], "t", by_name=True)
    with pytest.raises(QueryError, match="names column 'Key' twice"):
        insert_query("SELECT 1 AS key, 2 AS Key", SCHEMA, ["key", "Key"], "t", by_name=True)


def test_a_column_list_takes_the_query_columns_in_its_order_and_nulls_the_rest() -> None:
    # INSERT INTO t (note, KEY) SELECT ...: the query's columns by position into
    # the named ones, in any case; a column the list leaves out is NULL.
    sql = insert_query("SELECT 'n', 7", SCHEMA, ["a", "b"], "t", columns=["note", "KEY"])
    assert sql == (
        'SELECT CAST("q1" AS BIGINT) AS "key", CAST(NULL AS DECIMAL(15,2)) AS "price", '
        'CAST("q0" AS VARCHAR) AS "note" '
        'FROM (SELECT \'n\', 7) AS __insert("q0", "q1")'
    )


def test_a_column_list_of_another_width_an_unknown_or_a_repeated_column_is_refused() -> None:
    with pytest.raises(QueryError, match="names 2 columns .* but the query gives 1"):
        insert_query("SELECT 1", SCHEMA, ["a"], "t", columns=["key", "note"])
    with pytest.raises(QueryError, match="table t has no column 'cost'"):
        insert_query("SELECT 1, 2", SCHEMA, ["a", "b"], "t", columns=["key", "cost"])
    with pytest.raises(QueryError, match="the column list names column 'KEY' twice"):
        insert_query("SELECT 1, 2", SCHEMA, ["a", "b"], "t", columns=["key", "KEY"])


def test_a_column_of_no_type_takes_nulls_and_fails_on_a_value_saying_why() -> None:
    # A table made from SELECT NULL AS n has a column of DuckDB's NULL type, which
    # DuckDB casts nothing else to: a NULL goes in, any other value fails the
    # statement in words (the cast, written out, was an internal error).
    import duckdb

    schema = pa.schema([("n", pa.null()), ("k", pa.int32())])
    sql = insert_query("SELECT * FROM (VALUES (NULL, 1), (5, 2))", schema, ["a", "b"], "t")
    con = duckdb.connect()
    assert con.sql(sql.replace("(NULL, 1), (5, 2)", "(NULL, 1)")).fetchall() == [(None, 1)]
    with pytest.raises(duckdb.Error, match="column n of table t has no type .* takes only NULL"):
        con.sql(sql).fetchall()
    assert insert_query("SELECT 1", schema, ["k"], "t", by_name=True).startswith(
        'SELECT NULL AS "n", CAST("q0" AS INTEGER) AS "k"'
    )
