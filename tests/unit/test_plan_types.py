"""The type oracle: DuckDB over empty tables, shared between queries on the same tables;
the types of a query's parameters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table, load_table
from mangonel.errors import BindError
from mangonel.plan import types
from mangonel.plan.planner import PlannerConfig, parameter_types, plan_query
from mangonel.plan.types import oracle_for
from mangonel.sql.params import count_parameters, numbered


def test_one_oracle_serves_queries_on_the_same_tables(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), tmp_path / "t.parquet")
    tables = {"t": load_table("t", str(tmp_path / "t.parquet"))}
    first = oracle_for(tables)
    assert oracle_for({"t": load_table("t", str(tmp_path / "t.parquet"))}) is first
    assert first.describe("SELECT a + 1 AS b FROM t") == [("b", "INTEGER")]
    with pytest.raises(BindError, match="nope"):
        first.describe("SELECT nope FROM t")


def test_queries_on_other_tables_share_the_oracle_and_its_duckdb(tmp_path: Path) -> None:
    """Opening DuckDB is most of a short query's first planning: a query over a new
    set of tables adds them to the oracle it finds instead of opening another."""
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), tmp_path / "t.parquet")
    pq.write_table(pa.table({"b": pa.array(["x"])}), tmp_path / "u.parquet")
    t = load_table("t", str(tmp_path / "t.parquet"))
    u = load_table("u", str(tmp_path / "u.parquet"))
    first = oracle_for({"t": t})
    assert oracle_for({"u": u}) is first
    assert oracle_for({"t": t, "u": u}) is first
    assert first.describe("SELECT a, b FROM t, u") == [("a", "INTEGER"), ("b", "VARCHAR")]


def test_an_oracle_never_gives_a_name_two_tables(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), tmp_path / "t.parquet")
    pq.write_table(pa.table({"a": pa.array([1.5])}), tmp_path / "t2.parquet")
    old = load_table("t", str(tmp_path / "t.parquet"))
    new = load_table("t", str(tmp_path / "t2.parquet"))
    first = oracle_for({"t": old})
    second = oracle_for({"t": new})
    assert second is not first
    assert first.describe("SELECT a FROM t") == [("a", "INTEGER")]
    assert second.describe("SELECT a FROM t") == [("a", "DOUBLE")]
    with pytest.raises(ValueError, match="already another table"):
        first.add({"t": new})


def test_a_table_registered_again_with_other_columns_gets_a_new_oracle(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), path)
    before = oracle_for({"t": load_table("t", str(path))})
    pq.write_table(pa.table({"a": pa.array(["x"])}), path)
    after = oracle_for({"t": load_table("t", str(path))})
    assert after is not before
    assert after.describe("SELECT a FROM t") == [("a", "VARCHAR")]


def test_keys_take_the_type_duckdb_compares_them_in_and_a_union_its_own(tmp_path: Path) -> None:
    """A comparison casts a string to the other side's type; a CASE would refuse
    INTEGER with VARCHAR and take VARCHAR over DATE. A set operation's column of
    INTEGER and VARCHAR is VARCHAR."""
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), tmp_path / "t.parquet")
    oracle = oracle_for({"t": load_table("t", str(tmp_path / "t.parquet"))})
    assert oracle.supertype("INTEGER", "VARCHAR") == "INTEGER"
    assert oracle.supertype("VARCHAR", "DATE") == "DATE"
    assert oracle.supertype("JSON", "VARCHAR") == "VARCHAR"
    assert oracle.supertype("VARCHAR", "ENUM('a', 'b')") == "VARCHAR"
    assert oracle.supertype("INTEGER", "BIGINT") == "BIGINT"
    assert oracle.supertype("INTEGER", "VARCHAR", union=True) == "VARCHAR"
    assert oracle.supertype("DATE", "VARCHAR", union=True) == "VARCHAR"
    with pytest.raises(BindError):
        oracle.supertype("INTERVAL", "DATE")


def test_join_keys_of_table_columns_take_the_catalog_types(tmp_path: Path) -> None:
    """Key types of columns a scan passes up come from the catalog (no DuckDB binding
    of the subtree); a key computed above the scans is bound by DuckDB."""
    from sqlglot import exp

    from mangonel.plan.distribute import Distributor
    from mangonel.plan.logical import Filter, Join, JoinKind, Project, Scan

    pq.write_table(
        pa.table({"k": pa.array([1], pa.int32()), "v": pa.array(["x"])}), tmp_path / "t.parquet"
    )
    pq.write_table(pa.table({"k": pa.array([1], pa.int64())}), tmp_path / "u.parquet")
    catalog = {
        "t": load_table("t", str(tmp_path / "t.parquet")),
        "u": load_table("u", str(tmp_path / "u.parquet")),
    }
    oracle = oracle_for(catalog)
    calls: list[str] = []
    describe = oracle.describe

    def counting(sql: str) -> list[tuple[str, str]]:
        calls.append(sql)
        return describe(sql)

    oracle.describe = counting  # type: ignore[method-assign]
    try:
        dist = Distributor(catalog, oracle, {}, 2, 1 << 20, lambda width, rows, spread: 1000)
        t = Scan("t", "a", ["k", "v"], None)
        u = Scan("u", "b", ["k"], None)
        key_a = exp.column("k", table="a", quoted=True)
        key_b = exp.column("k", table="b", quoted=True)
        joined = Filter(Join(t, u, JoinKind.INNER, [key_a], [key_b]), exp.true())
        oracle.table_types("t"), oracle.table_types("u")
        calls.clear()
        assert dist.expr_types(joined, [key_a, key_b]) == ["INTEGER", "BIGINT"]
        assert calls == []
        projected = Project(
            t,
            "p",
            [("k2", exp.column("k", table="a", quoted=True)), ("k3", key_a.copy() + 1)],
        )
        key_p = exp.column("k2", table="p", quoted=True)
        assert dist.expr_types(projected, [key_p]) == ["INTEGER"]  # renamed: still k
        assert calls == []
        assert dist.expr_types(projected, [exp.column("k3", table="p")]) == ["INTEGER"]
        assert len(calls) == 1
    finally:
        # The oracle is shared by later tests' queries: drop the spy, not just replace it.
        del oracle.describe


def test_each_stage_is_bound_once_for_the_key_types_of_its_readers(
    catalog: dict[str, Table],
    duckdb_ref: duckdb.DuckDBPyConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The keys of each UNION are typed by DuckDB over its sides. Each side read
    # from a stage used to be rendered whole, down to the scans, at every level
    # of a chain (TPC-DS q14: 3 of its 3.6 s of planning); a stage read is now
    # bound once and stands in as an empty relation of its types. The sides are
    # not all one task: a union of one-task sides runs in one task and needs no
    # key types (and a side that only scans runs in the union's task).
    seen: list[str] = []
    describe = types.TypeOracle.describe

    def spy(self: types.TypeOracle, sql: str) -> list[tuple[str, str]]:
        seen.append(sql)
        return describe(self, sql)

    monkeypatch.setattr(types.TypeOracle, "describe", spy)
    sql = """
        SELECT k, COUNT(*) AS n FROM (
            (SELECT ps_suppkey % 25 AS k FROM partsupp GROUP BY 1)
            UNION (SELECT s_nationkey + 0 FROM supplier GROUP BY 1)
            UNION (SELECT o_custkey % 25 FROM orders GROUP BY 1)
            UNION (SELECT l_suppkey % 25 FROM lineitem GROUP BY 1)) AS t
        GROUP BY k"""
    config = PlannerConfig(partitions=3, partition_bytes=0, broadcast_bytes=0, split_rows=20_000)
    plan = plan_query(sql, catalog, config)
    # supplier's scan: typed for the first UNION's keys, then bound once as the
    # stage the second UNION reads (and not again for the third)
    assert sum(s.count('AS "supplier.s_nationkey" FROM "supplier"') for s in seen) == 2
    assert_same_result(run_plan(plan), duckdb_ref.sql(sql).to_arrow_table(), ordered=False)


def test_a_stage_of_table_columns_passed_up_is_typed_from_the_catalog(tmp_path: Path) -> None:
    """A stage read whose columns are all table columns passed up unchanged (through
    filters and kept columns) takes the catalog's types, as DuckDB would describe the
    stage; one that computes a column is bound by DuckDB."""
    import datetime as dt

    from sqlglot import exp

    from mangonel.plan.distribute.keys import KeyTypes
    from mangonel.plan.fragment import Renderer
    from mangonel.plan.logical import Filter, Keep, Project, Scan, StageRead

    pq.write_table(
        pa.table(
            {
                "k": pa.array([1], pa.int32()),
                "v": pa.array(["x"]),
                "d": pa.array([dt.date(2000, 1, 1)]),
                "p": pa.array([1], pa.decimal128(7, 2)),
            }
        ),
        tmp_path / "typed.parquet",
    )
    catalog = {"typed": load_table("typed", str(tmp_path / "typed.parquet"))}
    oracle = oracle_for(catalog)
    oracle.table_types("typed")
    calls: list[str] = []
    describe = oracle.describe

    def counting(sql: str) -> list[tuple[str, str]]:
        calls.append(sql)
        return describe(sql)

    oracle.describe = counting  # type: ignore[method-assign]
    try:
        key_types = KeyTypes(oracle, {})
        scan = Scan("typed", "a", ["k", "v", "d", "p"], None)
        kept = Keep(
            Filter(scan, exp.column("k", table="a").eq(1)), [("a", "p"), ("a", "d"), ("a", "k")]
        )
        got = key_types._stage_read_types(StageRead("s1", kept.outputs(), kept))
        assert calls == []
        assert got == [("a.p", "DECIMAL(7,2)"), ("a.d", "DATE"), ("a.k", "INTEGER")]
        assert describe(f"SELECT * FROM ({Renderer().render(kept)}) AS t") == got

        plus = Project(scan, "q", [("k1", exp.column("k", table="a") + 1)])
        computed = key_types._stage_read_types(StageRead("s2", plus.outputs(), plus))
        assert computed == [("q.k1", "INTEGER")] and len(calls) == 1
    finally:
        # The oracle is shared by later tests' queries: drop the spy, not just replace it.
        del oracle.describe


def test_columns_renamed_grouped_windowed_or_unioned_are_typed_as_duckdb_types_them(
    tmp_path: Path,
) -> None:
    """A column passed up by a projection that renames it, by a group key (of a
    ROLLUP too), by a window, or by a set operation keeps a type the planner knows
    without DuckDB, and that type is the one DuckDB gives the rendered subtree; an
    aggregate's value, a window function's, an INTERSECT of two types are DuckDB's
    to bind."""
    from sqlglot import exp

    from mangonel.plan.distribute.keys import KeyTypes
    from mangonel.plan.fragment import Renderer
    from mangonel.plan.logical import Aggregate, Project, Scan, SetKind, SetOp, Window

    pq.write_table(
        pa.table({"k": pa.array([1], pa.int32()), "p": pa.array([1], pa.decimal128(7, 2))}),
        tmp_path / "narrow.parquet",
    )
    pq.write_table(
        pa.table({"k": pa.array([1], pa.int64()), "p": pa.array([1], pa.decimal128(15, 2))}),
        tmp_path / "wide.parquet",
    )
    catalog = {
        name: load_table(name, str(tmp_path / f"{name}.parquet")) for name in ("narrow", "wide")
    }
    oracle = oracle_for(catalog)
    key_types = KeyTypes(oracle, {})
    narrow = Scan("narrow", "n", ["k", "p"], None)
    wide = Scan("wide", "w", ["k", "p"], None)

    def col(table: str, name: str) -> exp.Column:
        return exp.column(name, table=table)

    renamed = Project(narrow, "r", [("key", col("n", "k")), ("price", col("n", "p"))])
    grouped = Aggregate(
        renamed,
        "g",
        [("key", col("r", "key"))],
        [("total", exp.Sum(this=col("r", "price")))],
        grouping=exp.Rollup(expressions=[col("r", "key")]),
    )
    by_key = exp.Order(expressions=[exp.Ordered(this=col("n", "k"))])
    windowed = Window(narrow, "f", [("rn", exp.Window(this=exp.RowNumber(), order=by_key))])
    union = SetOp(SetKind.UNION, False, narrow, wide, "u", ["k", "p"])
    intersect = SetOp(SetKind.INTERSECT, True, narrow, wide, "i", ["k", "p"])
    cases = [
        (renamed, ["INTEGER", "DECIMAL(7,2)"]),
        (grouped, ["INTEGER", None]),
        (windowed, ["INTEGER", "DECIMAL(7,2)", None]),
        (union, ["BIGINT", "DECIMAL(15,2)"]),
        (intersect, [None, None]),
    ]
    for node, known in cases:
        got = [key_types.ref_type(node, ref) for ref in node.outputs()]
        assert got == known, node
        duck = oracle.describe(f"SELECT * FROM ({Renderer().render(node)}) AS t")
        assert [t for t, k in zip([t for _, t in duck], known, strict=True) if k] == [
            k for k in known if k
        ], node


def test_a_process_that_planned_exits_without_duckdb_leak_reports(tmp_path: Path) -> None:
    """The cached oracles' DuckDB objects are gone before the bindings' teardown, which
    reports any still alive as leaks on stderr (the end of every scheduler log)."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": [1, 2, 3]}), path)
    script = (
        "from mangonel.catalog import load_table\n"
        "from mangonel.plan.planner import plan_query\n"
        f"plan_query('SELECT k, count(*) AS n FROM t GROUP BY k', "
        f"{{'t': load_table('t', {str(path)!r})}})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr, done.stderr


def test_parameters_take_the_types_of_where_they_stand(catalog: dict[str, Table]) -> None:
    def kinds(sql: str) -> list[pa.DataType | None]:
        return parameter_types(numbered(sql), count_parameters(sql), catalog)

    assert kinds(
        "SELECT l_orderkey FROM lineitem WHERE l_quantity < ? AND l_shipdate >= ? "
        "AND l_comment LIKE ? AND l_linenumber IN (?, 2) LIMIT ?"
    ) == [pa.decimal128(15, 2), pa.date32(), pa.string(), pa.int32(), pa.int64()]
    # In a subquery, numbered out of order, used twice.
    assert kinds(
        "SELECT o_orderkey FROM orders WHERE o_custkey = $2 AND o_orderkey IN "
        "(SELECT l_orderkey FROM lineitem WHERE l_tax = $1 OR l_discount = $1)"
    ) == [pa.decimal128(15, 2), pa.int64()]
    # Nothing tells the type of a bare parameter: null, the others still typed.
    assert kinds("SELECT ?, o_orderkey FROM orders WHERE o_custkey = ?") == [None, pa.int64()]
    assert kinds("SELECT ? + 1 AS x") == [None]
