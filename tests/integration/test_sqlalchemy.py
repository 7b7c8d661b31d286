"""SQLAlchemy and pandas on a real 2-executor cluster through the ``mangonel://`` dialect.

The dialect is found by its entry point (``sqlalchemy.create_engine("mangonel://...")``).
The 22 TPC-H queries run through ``pandas.read_sql``; SQLAlchemy Core queries run on
reflected tables; ``sqlalchemy.inspect`` shows the registered tables and their types.
Every answer is compared with single-process DuckDB on the same files. A secured cluster
(TLS and users) is reached with the user, password and ``tls_dir`` in the URL, from
SQLAlchemy and from ibis.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pytest
import sqlalchemy as sa
from helpers import TPCH_ORDER_BY, TPCH_TABLES, assert_same_result, tpch_query

from mangonel.client.dbapi import Cursor

QUERIES = list(range(1, 23))


@pytest.fixture(scope="module")
def engine(cluster: Any, session: Any) -> Iterator[sa.Engine]:
    """An engine on the module's cluster (``session`` registered the TPC-H tables)."""
    eng = sa.create_engine(f"mangonel://{cluster.address}")
    yield eng
    eng.dispose()


def as_reference_types(df: pd.DataFrame, expected: pa.Table) -> pa.Table:
    """pandas' frame as Arrow in the reference's types: a value that does not fit
    its column's type fails here."""
    columns = [
        pa.array(df.iloc[:, i].tolist(), type=field.type, from_pandas=True)
        for i, field in enumerate(expected.schema)
    ]
    return pa.table(columns, names=list(df.columns))


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_tpch_through_pandas_read_sql_matches_duckdb(
    number: int, engine: sa.Engine, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    # coerce_float=False: pandas keeps the driver's Decimals (it makes floats of them
    # by default), so the sums are compared exactly.
    df = pd.read_sql(sa.text(sql), engine, coerce_float=False)
    actual = as_reference_types(df, expected)
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)


def test_a_query_through_the_engine_ran_distributed(
    engine: sa.Engine, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(3)
    with engine.connect() as con:
        result = con.exec_driver_sql(sql)
        cursor = result.cursor
        rows = result.fetchall()
    assert isinstance(cursor, Cursor) and cursor.result is not None
    stages = cursor.result.stages
    assert len(stages) > 1 and sum(s.tasks_total for s in stages) > len(stages), stages
    assert [tuple(r) for r in rows] == duckdb_ref.sql(sql).fetchall()


def test_inspect_shows_the_tables_columns_and_types(
    engine: sa.Engine, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    inspector = sa.inspect(engine)
    assert inspector.get_schema_names() == ["main"]
    assert set(TPCH_TABLES) <= set(inspector.get_table_names())
    assert inspector.get_view_names() == []
    assert inspector.has_table("lineitem") and not inspector.has_table("no_such_table")
    # DuckDB's type of each column, and the SQLAlchemy type the dialect must give it.
    expected_type = {
        "BIGINT": sa.BIGINT,
        "INTEGER": sa.INTEGER,
        "VARCHAR": sa.VARCHAR,
        "DATE": sa.DATE,
        "DECIMAL(15,2)": sa.NUMERIC,
    }
    for table in TPCH_TABLES:
        reference = duckdb_ref.sql(f"DESCRIBE {table}").fetchall()
        columns = inspector.get_columns(table)
        assert [c["name"] for c in columns] == [r[0] for r in reference]
        for column, (name, duck_type, *_) in zip(columns, reference, strict=True):
            assert isinstance(column["type"], expected_type[duck_type]), (table, name)
            if duck_type.startswith("DECIMAL"):
                assert (column["type"].precision, column["type"].scale) == (15, 2)
    assert inspector.get_pk_constraint("nation")["constrained_columns"] == []
    with pytest.raises(sa.exc.NoSuchTableError):
        inspector.get_columns("no_such_table")


def test_core_queries_on_reflected_tables_with_parameters(
    engine: sa.Engine, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    md = sa.MetaData()
    nation = sa.Table("nation", md, autoload_with=engine)
    region = sa.Table("region", md, autoload_with=engine)
    query = (
        sa.select(region.c.r_name, sa.func.count().label("n"))
        .select_from(nation.join(region, nation.c.n_regionkey == region.c.r_regionkey))
        .where(nation.c.n_name.not_in(["CHINA", "O'HARE"]), nation.c.n_name.like("%A%"))
        .group_by(region.c.r_name)
        .order_by(sa.desc("n"), region.c.r_name)
        .limit(3)
    )
    with engine.connect() as con:
        rows = con.execute(query).fetchall()
    expected = duckdb_ref.sql(
        "SELECT r_name, count(*) AS n FROM nation JOIN region ON n_regionkey = r_regionkey "
        "WHERE n_name NOT IN ('CHINA', 'O''HARE') AND n_name LIKE '%A%' "
        "GROUP BY r_name ORDER BY n DESC, r_name LIMIT 3"
    ).fetchall()
    assert len(expected) == 3
    assert [tuple(r) for r in rows] == expected
    names = [
        r[0]
        for r in duckdb_ref.sql(
            "SELECT n_name FROM nation WHERE n_regionkey = 1 AND n_name >= 'B' ORDER BY n_name"
        ).fetchall()
    ]
    assert len(names) > 1
    text = sa.text(
        "SELECT n_name FROM nation WHERE n_regionkey = :r AND n_name >= :after ORDER BY 1"
    )
    df = pd.read_sql(text, engine, params={"r": 1, "after": "B"})
    assert df["n_name"].tolist() == names
    # The driver's own placeholders (qmark), as pandas users write them.
    plain = "SELECT n_name FROM nation WHERE n_regionkey = ? AND n_name >= ? ORDER BY 1"
    assert pd.read_sql(plain, engine, params=(1, "B"))["n_name"].tolist() == names


def test_read_sql_table_reads_a_whole_table(
    engine: sa.Engine, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    df = pd.read_sql_table("region", engine)
    assert df.sort_values("r_regionkey").values.tolist() == [
        list(r) for r in duckdb_ref.sql("SELECT * FROM region ORDER BY r_regionkey").fetchall()
    ]


def test_errors_say_what_happened_and_the_engine_keeps_serving(engine: sa.Engine) -> None:
    with engine.connect() as con:
        with pytest.raises(sa.exc.ProgrammingError, match="no_such_table"):
            con.exec_driver_sql("SELECT * FROM no_such_table")
        with pytest.raises(sa.exc.ProgrammingError):
            con.exec_driver_sql("CREATE TABLE t (x INTEGER PRIMARY KEY)")
        with pytest.raises(sa.exc.ProgrammingError):
            con.exec_driver_sql("SELEC 1 FROM nation")
        assert con.exec_driver_sql("SELECT count(*) FROM nation").scalar() == 25


def test_a_percent_sign_without_parameters_is_sent_as_written(
    engine: sa.Engine, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = "SELECT count(*) AS n FROM nation WHERE n_name LIKE '%AN%'"
    ((expected,),) = duckdb_ref.sql(sql).fetchall()
    assert expected > 0
    with engine.connect() as con:
        assert con.exec_driver_sql(sql).scalar() == expected
    assert pd.read_sql(sql, engine)["n"].tolist() == [expected]


def test_bad_urls_are_refused_with_what_to_write() -> None:
    with pytest.raises(sa.exc.ArgumentError, match="unknown mangonel connect option"):
        sa.create_engine("mangonel://127.0.0.1:1?tls=yes").connect()
    with pytest.raises(sa.exc.ArgumentError, match="no databases"):
        sa.create_engine("mangonel://127.0.0.1:1/tpch").connect()


# ------------------------------------------------------------- a secured cluster

USERS = {"ann": ("ann-password", True)}


@pytest.fixture(scope="module")
def secure_cluster(module_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[Any]:
    """TLS everywhere and one user; a client holds the CA alone (``client_tls_dir``)."""
    import mangonel

    with mangonel.LocalCluster(
        executors=2,
        work_dir=module_dir / "secure",
        partitions=4,
        secure=True,
        users=USERS,
        scheduler_args=("--split-rows", "250000"),
    ) as running:
        with running.connect() as session:
            for name in ("orders", "nation"):
                session.register_parquet(name, str(tpch_tables[name]))
        yield running


def test_a_secured_cluster_through_the_url(
    secure_cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    tls = secure_cluster.client_tls_dir
    url = f"mangonel://ann:ann-password@{secure_cluster.address}?tls_dir={tls}"
    sql = "SELECT o_orderpriority, count(*) AS n FROM orders GROUP BY 1 ORDER BY 1"
    engine = sa.create_engine(url)
    try:
        assert pd.read_sql(sa.text(sql), engine).values.tolist() == [
            list(r) for r in duckdb_ref.sql(sql).fetchall()
        ]
        wrong = sa.create_engine(url.replace("ann-password", "wrong"))
        with pytest.raises(sa.exc.OperationalError, match="(?i)password|authenticat"):
            wrong.connect().exec_driver_sql("SELECT 1 FROM nation")
        wrong.dispose()
    finally:
        engine.dispose()


def test_a_secured_cluster_from_ibis(
    secure_cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    import ibis

    con = ibis.mangonel.connect(
        secure_cluster.address,
        user="ann",
        password="ann-password",
        tls_ca=str(secure_cluster.client_tls_dir / "ca.pem"),
    )
    try:
        nation = con.table("nation")
        got = nation.group_by("n_regionkey").agg(n=nation.count()).order_by("n_regionkey")
        expected = duckdb_ref.sql(
            "SELECT n_regionkey, count(*) AS n FROM nation GROUP BY 1 ORDER BY 1"
        ).to_arrow_table()
        assert_same_result(got.to_pyarrow(), expected, ordered=True)
    finally:
        con.disconnect()
