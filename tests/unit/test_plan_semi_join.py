"""Correlated ``[NOT] EXISTS`` bound as SEMI / ANTI joins, and the forms left to sqlglot."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
from helpers import assert_same_result
from plan_runner import run_plan
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify

from mangonel.catalog import load_table
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.sql.optimize import is_semi_join_exists

SCHEMA = {"t": {"k": "BIGINT", "v": "BIGINT"}, "u": {"k": "BIGINT", "w": "BIGINT"}}


def _exists_nodes(sql: str) -> list[bool]:
    query = qualify(sqlglot.parse_one(sql, read="duckdb"), schema=SCHEMA, dialect="duckdb")
    return [is_semi_join_exists(n) for n in query.find_all(exp.Exists)]


@pytest.mark.parametrize(
    ("sql", "taken"),
    [
        ("SELECT k FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.k = t.k)", True),
        ("SELECT k FROM t WHERE v > 1 AND NOT EXISTS (SELECT 1 FROM u WHERE u.w < t.v)", True),
        # not a WHERE conjunct
        ("SELECT k FROM t WHERE v > 1 OR EXISTS (SELECT 1 FROM u WHERE u.k = t.k)", False),
        ("SELECT EXISTS (SELECT 1 FROM u WHERE u.k = t.k) AS e FROM t", False),
        # an aggregate without GROUP BY always has a row: EXISTS is always true
        ("SELECT k FROM t WHERE EXISTS (SELECT count(*) FROM u WHERE u.k = t.k)", False),
        ("SELECT k FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.k = t.k LIMIT 0)", False),
        ("SELECT k FROM t WHERE EXISTS (SELECT u.k FROM u WHERE u.k = t.k GROUP BY u.k)", False),
        # the correlation outside the WHERE clause
        ("SELECT k FROM t WHERE EXISTS (SELECT t.v FROM u WHERE u.k = 1)", False),
        # uncorrelated: runs as a subquery stage, as before
        ("SELECT k FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.k = 1)", False),
    ],
)
def test_which_exists_become_semi_joins(sql: str, taken: bool) -> None:
    assert _exists_nodes(sql) == [taken]


def test_exists_and_not_exists_plan_as_semi_and_anti_joins(tmp_path: Path) -> None:
    pq.write_table(
        pa.table({"k": [i % 50 for i in range(2000)], "v": list(range(2000))}),
        tmp_path / "t.parquet",
        row_group_size=250,
    )
    pq.write_table(
        pa.table({"k": [i % 70 if i % 9 else None for i in range(900)], "w": list(range(900))}),
        tmp_path / "u.parquet",
        row_group_size=200,
    )
    catalog = {n: load_table(n, str(tmp_path / f"{n}.parquet")) for n in ("t", "u")}
    sql = (
        "SELECT k, count(*) AS n FROM t "
        "WHERE EXISTS (SELECT 1 FROM u WHERE u.k = t.k AND u.w > t.v) "
        "AND NOT EXISTS (SELECT 1 FROM u AS u2 WHERE u2.k = t.k + 40) GROUP BY k"
    )
    plan = plan_query(
        sql,
        catalog,
        PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=500),
    )
    text = "\n".join(s.sql for s in plan.stages)
    assert "SEMI JOIN" in text and "ANTI JOIN" in text
    assert "ARRAY_AGG" not in text.upper() and not plan.notes

    con = duckdb.connect()
    for n in ("t", "u"):
        con.execute(f"CREATE VIEW {n} AS SELECT * FROM read_parquet('{tmp_path / n}.parquet')")
    expected = con.sql(sql).to_arrow_table()
    assert_same_result(run_plan(plan), expected, ordered=False)
