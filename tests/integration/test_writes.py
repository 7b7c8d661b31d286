"""Write statements on a real cluster: COPY TO, CREATE TABLE AS, INSERT INTO, DROP TABLE.

One scheduler and two executor processes (``LocalCluster``), TPC-H SF 0.1 with
scans of at most 100 000 rows, so ``lineitem`` is read (and written) by six
tasks. Every output is read back and compared with what DuckDB's own ``COPY``
or ``CREATE TABLE AS`` of the same query holds; what a reader of the location
sees is exactly the files the manifest names (``output.MANIFEST``).
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from helpers import assert_same_result, wait_until

import mangonel
from mangonel.errors import (
    CatalogError,
    ForbiddenStatementError,
    JobFailedError,
    JobQueryError,
    PermissionDeniedError,
    QueryError,
    UnknownTableError,
)
from mangonel.output import MANIFEST, STAGING

pytestmark = pytest.mark.timeout(180)

LINEITEM_QUERY = (
    "SELECT l_orderkey, l_linenumber, l_quantity, l_extendedprice, l_shipdate, l_comment "
    "FROM lineitem WHERE l_quantity > 10 AND l_orderkey % 8 = 0"
)


@pytest.fixture(scope="module")
def out_root(module_dir: Path) -> Path:
    root = module_dir / "out"
    root.mkdir()
    return root


@pytest.fixture(scope="module")
def cluster(module_dir: Path, out_root: Path) -> Iterator[Any]:
    with mangonel.LocalCluster(
        executors=2,
        work_dir=str(module_dir / "cluster"),
        partitions=4,
        web_port=0,
        scheduler_args=(
            "--split-rows",
            "100000",
            # No straggler copies: under load a copy could win every writing task
            # on one executor, and the test that the writes ran on both would fail
            # for the machine's sake (speculation racing a write: tests/chaos/test_chaos_writes.py).
            "--no-speculation",
            "--write-root",
            str(out_root),
            "--warehouse",
            str(module_dir / "warehouse"),
        ),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def session(cluster: Any, tpch_tables: dict[str, Path]) -> Iterator[Any]:
    client = cluster.connect()
    for name in ("lineitem", "orders", "nation"):
        client.register_parquet(name, str(tpch_tables[name]))
    yield client
    client.close()


def committed(location: Path) -> list[str]:
    """The files the location's manifest names (full paths)."""
    doc = json.loads((location / MANIFEST).read_text())
    return [str(location / f) for f in doc["files"]]


def data_files(location: Path) -> list[str]:
    """Every file under the location but the manifest."""
    return sorted(
        os.path.join(root, f)
        for root, _, names in os.walk(location)
        for f in names
        if f != MANIFEST
    )


def read_back(files: list[str], fmt: str, hive: bool = False) -> pa.Table:
    con = duckdb.connect()
    reader = {"parquet": "read_parquet", "csv": "read_csv", "json": "read_json"}[fmt]
    extra = ", hive_partitioning = true" if hive else ""
    return con.sql(f"SELECT * FROM {reader}({files!r}{extra})").to_arrow_table()


def duckdb_copy(ref: duckdb.DuckDBPyConnection, query: str, target: Path, options: str) -> pa.Table:
    """DuckDB's own COPY of ``query``, read back the way mangonel's output is."""
    count = ref.execute(f"COPY ({query}) TO '{target}' ({options})").fetchone()
    assert count is not None
    return pa.table({"Count": [count[0]]})


def writing_attempts(cluster: Any, job_id: str, stage: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{cluster.web_url}/api/jobs/{job_id}", timeout=10) as answer:
        doc = json.load(answer)
    return [a for a in doc["attempts"] if a["stage"] == stage and a["state"] == "succeeded"]


def test_copy_parquet_is_written_by_the_tasks_on_every_executor(
    cluster: Any,
    session: Any,
    duckdb_ref: duckdb.DuckDBPyConnection,
    out_root: Path,
    work_dir: Path,
) -> None:
    target = out_root / "lineitem_big"
    result = session.sql(f"COPY ({LINEITEM_QUERY}) TO '{target}' (FORMAT parquet)")
    expected_count = duckdb_copy(duckdb_ref, LINEITEM_QUERY, work_dir / "ref", "FORMAT parquet")
    assert_same_result(result.to_arrow(), expected_count, ordered=True)
    assert expected_count["Count"][0].as_py() > 50_000
    # Exactly the manifest's files are there, nothing staged is left.
    files = committed(target)
    assert data_files(target) == sorted(files)
    assert not (target / STAGING).exists()
    expected = read_back([str(work_dir / "ref")], "parquet")
    assert_same_result(read_back(files, "parquet"), expected, ordered=False)
    # Written in parallel: six writing tasks, on both executors.
    status = session.status().job(result.job_id)
    writing = status.stages[-2]
    assert writing.tasks_total == 6, status.stages
    attempts = writing_attempts(cluster, result.job_id, writing.stage)
    assert len({a["executor"] for a in attempts}) == 2, attempts
    assert len({f.split("-p")[-1].split("-")[0] for f in files}) == 6


def test_copy_csv_partitioned_and_json_match_duckdb(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection, out_root: Path, work_dir: Path
) -> None:
    query = (
        "SELECT l_returnflag, l_linestatus, l_shipmode, count(*) AS n, sum(l_quantity) AS q "
        "FROM lineitem GROUP BY ALL"
    )
    target = out_root / "by_flag"
    result = session.sql(
        f"COPY ({query}) TO '{target}' (FORMAT csv, PARTITION_BY (l_returnflag, l_linestatus))"
    )
    options = "FORMAT csv, PARTITION_BY (l_returnflag, l_linestatus)"
    expected_count = duckdb_copy(duckdb_ref, query, work_dir / "ref_csv", options)
    assert_same_result(result.to_arrow(), expected_count, ordered=True)
    files = committed(target)
    assert all("l_returnflag=" in f and "/l_linestatus=" in f for f in files), files
    ref_files = data_files(work_dir / "ref_csv")
    actual = read_back(files, "csv", hive=True).select(["l_shipmode", "n", "q"])
    expected = read_back(ref_files, "csv", hive=True).select(["l_shipmode", "n", "q"])
    assert_same_result(actual, expected, ordered=False)
    flags = read_back(files, "csv", hive=True).select(["l_returnflag", "l_linestatus", "n"])
    ref_flags = read_back(ref_files, "csv", hive=True).select(["l_returnflag", "l_linestatus", "n"])
    assert_same_result(flags, ref_flags, ordered=False)

    target = out_root / "nation_json"
    query = "SELECT n_nationkey, n_name, n_regionkey FROM nation"
    session.sql(f"COPY ({query}) TO '{target}' (FORMAT json)")
    duckdb_copy(duckdb_ref, query, work_dir / "ref.json", "FORMAT json")
    assert_same_result(
        read_back(committed(target), "json"),
        read_back([str(work_dir / "ref.json")], "json"),
        ordered=False,
    )


def test_an_ordered_copy_is_written_in_order_by_one_task(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection, out_root: Path, work_dir: Path
) -> None:
    query = "SELECT o_orderkey, o_totalprice FROM orders ORDER BY o_totalprice DESC LIMIT 500"
    target = out_root / "top_orders"
    result = session.sql(f"COPY ({query}) TO '{target}' (FORMAT parquet)")
    assert result.to_arrow()["Count"].to_pylist() == [500]
    files = committed(target)
    assert len(files) == 1
    duckdb_copy(duckdb_ref, query, work_dir / "ref.parquet", "FORMAT parquet")
    expected = read_back([str(work_dir / "ref.parquet")], "parquet")
    assert_same_result(
        read_back(files, "parquet"), expected, ordered=True, order_by=["o_totalprice"]
    )


def test_copy_onto_files_needs_overwrite_which_replaces_them(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection, out_root: Path
) -> None:
    target = out_root / "nations"
    session.sql(f"COPY (SELECT * FROM nation WHERE n_regionkey = 1) TO '{target}' (FORMAT parquet)")
    first = committed(target)
    with pytest.raises(QueryError, match="OVERWRITE"):
        session.sql(f"COPY (SELECT * FROM nation) TO '{target}' (FORMAT parquet)")
    assert committed(target) == first
    session.sql(f"COPY (SELECT * FROM nation) TO '{target}' (FORMAT parquet, OVERWRITE)")
    second = committed(target)
    assert not set(first) & set(second)
    assert data_files(target) == sorted(second)  # the replaced files are gone
    expected = duckdb_ref.sql("SELECT * FROM nation").to_arrow_table()
    assert_same_result(read_back(second, "parquet"), expected, ordered=False)
    # mangonel's own readers honour the manifest.
    session.register_parquet("nations_copy", str(target))
    actual = session.sql("SELECT count(*) AS n, sum(n_nationkey) AS s FROM nations_copy").to_arrow()
    reference = duckdb_ref.sql("SELECT count(*) AS n, sum(n_nationkey) AS s FROM nation")
    assert_same_result(actual, reference.to_arrow_table(), ordered=False)


def test_create_table_as_insert_and_drop_match_duckdb(
    session: Any, tpch_tables: dict[str, Path], module_dir: Path
) -> None:
    ref = duckdb.connect()
    ref.execute(f"CREATE VIEW orders AS SELECT * FROM read_parquet('{tpch_tables['orders']}')")
    create = (
        "CREATE TABLE big_orders AS SELECT o_orderkey, o_custkey, o_totalprice, o_orderdate "
        "FROM orders WHERE o_totalprice > 300000"
    )
    insert = (
        "INSERT INTO big_orders SELECT o_orderkey, o_custkey, o_totalprice * 2, o_orderdate "
        "FROM orders WHERE o_totalprice < 2000"
    )
    check = "SELECT * FROM big_orders"
    counted = session.sql(create).to_arrow()
    assert_same_result(counted, ref.execute(create).to_arrow_table(), ordered=True)
    assert_same_result(
        session.sql(check).to_arrow(), ref.sql(check).to_arrow_table(), ordered=False
    )
    counted = session.sql(insert).to_arrow()
    assert_same_result(counted, ref.execute(insert).to_arrow_table(), ordered=True)
    assert_same_result(
        session.sql(check).to_arrow(), ref.sql(check).to_arrow_table(), ordered=False
    )
    location = module_dir / "warehouse" / "big_orders"
    assert len(json.loads((location / MANIFEST).read_text())["files"]) >= 2

    with pytest.raises(QueryError, match="exists"):
        session.sql(create)
    assert session.sql(create.replace("TABLE", "TABLE IF NOT EXISTS")).to_arrow().num_rows == 1
    replace = "CREATE OR REPLACE TABLE big_orders AS SELECT o_orderkey FROM orders LIMIT 7"
    session.sql(replace)
    assert session.sql("SELECT count(*) AS n FROM big_orders").to_arrow()["n"].to_pylist() == [7]
    assert len(data_files(location)) == len(committed(location))

    session.sql("DROP TABLE big_orders")
    assert not location.exists()
    with pytest.raises(UnknownTableError):
        session.sql(check)
    with pytest.raises(UnknownTableError):
        session.sql("DROP TABLE big_orders")
    session.sql("DROP TABLE IF EXISTS big_orders")
    with pytest.raises(QueryError, match="registered from files"):
        session.sql("INSERT INTO nation SELECT * FROM nation")


TYPED = (
    "SELECT o_orderkey AS k, INTERVAL (o_orderdate - DATE '1992-01-01') DAY + INTERVAL 1 MONTH "
    "+ INTERVAL (o_orderkey % 1000) MILLISECOND AS iv, "
    "md5(o_comment)::UUID AS u, [o_orderkey, o_custkey] AS ks, "
    "{'p': o_totalprice, 's': o_orderstatus} AS st, MAP {'c': o_custkey} AS m, "
    "o_orderdate::TIMESTAMP AS ts, "
    "('x' || o_orderkey::VARCHAR)::BLOB AS b FROM orders WHERE o_orderkey % 16 = 0"
)


def test_a_table_of_many_types_reads_back_what_it_wrote(
    session: Any, tpch_tables: dict[str, Path], tmp_path: Path
) -> None:
    # What mangonel writes it reads again: an INTERVAL column (DuckDB writes
    # Parquet's INTERVAL, which pyarrow reads as raw bytes: the table could not be
    # read at all), UUIDs, lists, structs, maps. The reference is DuckDB's own
    # Parquet of the same query, read back. (Its intervals have one month each:
    # DuckDB's Parquet writer keeps one of two intervals equal as intervals, 4
    # months 737 days and 2 months 797 days, in its dictionary, so its file would
    # differ from mangonel's, written by other tasks, in how an equal one is
    # spelled. A HUGEINT is left out: mangonel's files keep every digit of it as
    # a DECIMAL(38, 0), as a DuckDB table's reads; DuckDB's COPY makes a DOUBLE.)
    ref = duckdb.connect()
    ref.execute(f"CREATE VIEW orders AS SELECT * FROM read_parquet('{tpch_tables['orders']}')")
    ref.execute(f"COPY ({TYPED}) TO '{tmp_path / 'typed.parquet'}' (FORMAT parquet)")
    session.sql(f"CREATE TABLE typed AS {TYPED}")
    try:
        for check in (
            "SELECT * FROM typed",
            "SELECT iv, count(*) AS n, max(ts + iv) AS latest FROM typed GROUP BY iv",
            "SELECT a.k, b.u FROM typed a JOIN typed b ON a.u = b.u AND a.iv = b.iv "
            "WHERE a.k < 20000",
        ):
            expected = ref.sql(
                check.replace("typed", f"read_parquet('{tmp_path / 'typed.parquet'}')")
            ).to_arrow_table()
            assert expected.num_rows > 0
            assert_same_result(session.sql(check).to_arrow(), expected, ordered=False)
    finally:
        session.sql("DROP TABLE typed")


def test_insert_by_name_into_columns_of_any_case_matches_duckdb(
    session: Any, tpch_tables: dict[str, Path]
) -> None:
    # INSERT ... BY NAME takes each column from the query's column of its name
    # (it went by position, so a query naming them in another order failed, or
    # swapped two columns of one type); the table's columns are spelled in mixed
    # case, which its readers must find however they spell them, and so is its
    # name (a table named in upper case was created, then named in no query).
    ref = duckdb.connect()
    ref.execute(f"CREATE VIEW nation AS SELECT * FROM read_parquet('{tpch_tables['nation']}')")
    statements = (
        'CREATE TABLE "Named" AS SELECT n_nationkey AS "NationKey", n_name AS "Name", '
        'n_comment AS "Comment" FROM nation WHERE n_regionkey = 1',
        'INSERT INTO NAMED BY NAME SELECT n_comment AS "Comment", n_nationkey + 100 AS nationkey, '
        "n_name AS NAME FROM nation WHERE n_regionkey = 2",
        "INSERT INTO named BY NAME SELECT 'no comment' AS comment, n_nationkey + 200 AS NationKey "
        "FROM nation WHERE n_regionkey = 3",
    )
    try:
        for statement in statements:
            assert_same_result(
                session.sql(statement).to_arrow(), ref.execute(statement).to_arrow_table(), True
            )
        for check in (
            "SELECT * FROM named",
            "SELECT nationkey, upper(name) AS n FROM named WHERE COMMENT <> 'no comment'",
        ):
            assert_same_result(
                session.sql(check).to_arrow(), ref.sql(check).to_arrow_table(), ordered=False
            )
        with pytest.raises(QueryError, match="table named has no column 'extra'"):
            session.sql("INSERT INTO named BY NAME SELECT 1 AS nationkey, 2 AS extra")
        assert "named" in {t.name for t in session.tables()}
    finally:
        session.sql("DROP TABLE IF EXISTS Named")
    assert "named" not in {t.name for t in session.tables()}


def test_insert_into_a_column_list_and_a_sum_past_two_to_the_53_match_duckdb(
    session: Any, tpch_tables: dict[str, Path]
) -> None:
    # INSERT INTO t (b, a) writes the query's columns into those it names, the
    # others NULL (it was refused). A SUM of integers is a HUGEINT, made of the
    # partial sums of several tasks: written, it keeps every digit (DECIMAL(38, 0),
    # as a DuckDB table's HUGEINT reads), where DuckDB's Parquet writer would make
    # a DOUBLE of it.
    ref = duckdb.connect()
    ref.execute(f"CREATE VIEW orders AS SELECT * FROM read_parquet('{tpch_tables['orders']}')")
    statements = (
        "CREATE TABLE listed (k BIGINT, status VARCHAR, total HUGEINT)",
        "INSERT INTO listed (status, k) SELECT o_orderstatus, o_orderkey FROM orders "
        "WHERE o_orderkey < 200",
        "INSERT INTO listed (TOTAL, Status) SELECT sum(o_orderkey::HUGEINT * 10000000000007), "
        "o_orderstatus FROM orders GROUP BY 2",
        "INSERT INTO listed (k) VALUES (1), (2)",
    )
    try:
        for statement in statements:
            session.sql(statement)
            ref.execute(statement)
        check = "SELECT * FROM listed"
        expected = ref.sql(check).to_arrow_table()
        assert max(v or 0 for v in expected.column("total").to_pylist()) > 2**53
        assert_same_result(session.sql(check).to_arrow(), expected, ordered=False)
        with pytest.raises(QueryError, match="names 2 columns .* but the query gives 1"):
            session.sql("INSERT INTO listed (k, status) SELECT 1")
        with pytest.raises(QueryError, match="table listed has no column 'extra'"):
            session.sql("INSERT INTO listed (k, extra) SELECT 1, 2")
    finally:
        session.sql("DROP TABLE IF EXISTS listed")


def test_a_failed_write_leaves_nothing_visible(cluster: Any, session: Any, out_root: Path) -> None:
    # Only the last of the six scan tasks meets a row it cannot convert: the other
    # five have written and staged their files by the time the job fails.
    query = (
        "SELECT l_orderkey, CAST(CASE WHEN l_orderkey > 590000 THEN 'x' ELSE '1' END AS INTEGER) "
        "AS v FROM lineitem"
    )
    target = out_root / "doomed"
    with pytest.raises(JobQueryError, match="[Cc]onversion|convert"):
        session.sql(f"COPY ({query}) TO '{target}' (FORMAT parquet)")
    wait_until(lambda: not (target / STAGING).exists(), "the staged files are removed")
    assert not (target / MANIFEST).exists()
    assert not target.exists() or data_files(target) == []
    with pytest.raises(CatalogError):
        session.register_parquet("doomed", str(target))
    # The cluster still serves, and the location can be written.
    session.sql(f"COPY (SELECT 1 AS one) TO '{target}' (FORMAT parquet)")
    assert len(committed(target)) == 1


def test_writes_outside_the_write_roots_are_refused(
    session: Any, out_root: Path, work_dir: Path
) -> None:
    outside = work_dir / "outside"
    outside.mkdir()
    (out_root / "escape").symlink_to(outside)
    for location in (
        str(outside / "x"),
        f"{out_root}/../{out_root.name}-sibling/x",
        str(out_root / "escape" / "x"),
        "s3://bucket/x",
    ):
        with pytest.raises(PermissionDeniedError, match="write root"):
            session.sql(f"COPY (SELECT 1 AS one) TO '{location}' (FORMAT parquet)")
    assert os.listdir(outside) == []
    with pytest.raises(ForbiddenStatementError, match="FORMAT"):
        session.sql(f"COPY (SELECT 1 AS one) TO '{out_root}/y' (FORMAT xlsx)")
    assert session.sql("SELECT 1 AS one").to_arrow()["one"].to_pylist() == [1]


def test_two_writes_to_one_location_at_once(
    session: Any, cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection, out_root: Path
) -> None:
    """Two COPYs to one empty location: one wins, the other is told; two INSERTs both append."""
    target = out_root / "contested"
    queries = [
        "SELECT o_orderkey, o_totalprice FROM orders WHERE o_orderkey % 2 = 0",
        "SELECT o_orderkey, o_totalprice FROM orders WHERE o_orderkey % 2 = 1",
    ]
    outcomes: list[Any] = [None, None]

    def run(i: int) -> None:
        with cluster.connect() as own:
            try:
                outcomes[i] = own.sql(f"COPY ({queries[i]}) TO '{target}' (FORMAT parquet)")
            except Exception as exc:  # noqa: BLE001 - checked below
                outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    won = [i for i, o in enumerate(outcomes) if not isinstance(o, Exception)]
    lost = [o for o in outcomes if isinstance(o, Exception)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert isinstance(lost[0], QueryError | JobFailedError)
    assert "OVERWRITE" in str(lost[0])
    expected = duckdb_ref.sql(queries[won[0]]).to_arrow_table()
    assert_same_result(read_back(committed(target), "parquet"), expected, ordered=False)
    assert data_files(target) == sorted(committed(target))

    session.sql("CREATE TABLE contested AS SELECT o_orderkey, o_totalprice FROM orders LIMIT 0")
    inserts: list[Any] = [None, None]

    def insert(i: int) -> None:
        with cluster.connect() as own:
            try:
                inserts[i] = own.sql(f"INSERT INTO contested {queries[i]}")
            except Exception as exc:  # noqa: BLE001 - told below
                inserts[i] = exc

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r is not None and not isinstance(r, Exception) for r in inserts), inserts
    actual = session.sql("SELECT * FROM contested").to_arrow()
    both = f"{queries[0]} UNION ALL {queries[1]}"
    assert_same_result(actual, duckdb_ref.sql(both).to_arrow_table(), ordered=False)
    session.sql("DROP TABLE contested")


def test_copy_options_compression_row_groups_header_and_delimiter_match_duckdb(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection, out_root: Path, work_dir: Path
) -> None:
    # CSV: gzip, no header, '|': read back as DuckDB reads its own COPY with the same.
    target = out_root / "options_csv"
    options = "FORMAT csv, COMPRESSION gzip, HEADER false, DELIMITER '|'"
    result = session.sql(f"COPY ({LINEITEM_QUERY}) TO '{target}' ({options})")
    expected_count = duckdb_copy(duckdb_ref, LINEITEM_QUERY, work_dir / "ref.csv.gz", options)
    assert_same_result(result.to_arrow(), expected_count, ordered=True)
    files = committed(target)
    assert len(files) == 6 and all(f.endswith(".csv.gz") for f in files), files
    with gzip.open(files[0], "rt") as f:
        first = f.readline()
    assert "|" in first and "l_orderkey" not in first, first  # no header line
    ref_files = [str(work_dir / "ref.csv.gz")]

    def csv(paths: list[str]) -> pa.Table:
        return (
            duckdb.connect()
            .sql(f"SELECT * FROM read_csv({paths!r}, delim = '|', header = false)")
            .to_arrow_table()
        )

    assert_same_result(csv(files), csv(ref_files), ordered=False)

    # Parquet: zstd, row groups of about 4,000 rows instead of DuckDB's 122,880.
    target = out_root / "options_parquet"
    options = "FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 4000"
    session.sql(f"COPY ({LINEITEM_QUERY}) TO '{target}' ({options})")
    files = committed(target)
    meta = duckdb.connect().sql(
        f"SELECT DISTINCT file_name, row_group_id, row_group_num_rows, compression "
        f"FROM parquet_metadata({files!r})"
    )
    rows = meta.fetchall()
    assert {r[3] for r in rows} == {"ZSTD"}, rows
    groups = {(r[0], r[1]): r[2] for r in rows}
    assert len(groups) > 2 * len(files) and max(groups.values()) <= 8192, groups
    duckdb_copy(duckdb_ref, LINEITEM_QUERY, work_dir / "ref_zstd", options)
    expected = read_back([str(work_dir / "ref_zstd")], "parquet")
    assert_same_result(read_back(files, "parquet"), expected, ordered=False)

    # JSON: zstd-compressed lines.
    target = out_root / "options_json"
    query = "SELECT n_nationkey, n_name, n_regionkey FROM nation"
    session.sql(f"COPY ({query}) TO '{target}' (FORMAT json, COMPRESSION zstd)")
    files = committed(target)
    assert files and all(f.endswith(".json.zst") for f in files), files
    duckdb_copy(duckdb_ref, query, work_dir / "ref.json.zst", "FORMAT json, COMPRESSION zstd")
    expected = read_back([str(work_dir / "ref.json.zst")], "json")
    assert_same_result(read_back(files, "json"), expected, ordered=False)

    # An option DuckDB's COPY has but mangonel does not write is refused, saying what is.
    with pytest.raises(ForbiddenStatementError, match="COMPRESSION, ROW_GROUP_SIZE"):
        session.sql(f"COPY ({query}) TO '{out_root / 'quoted'}' (FORMAT csv, FORCE_QUOTE *)")
    assert not (out_root / "quoted").exists()


def test_create_table_with_columns_then_insert_values_match_duckdb(
    session: Any, tpch_tables: dict[str, Path]
) -> None:
    ref = duckdb.connect()
    ref.execute(f"CREATE VIEW orders AS SELECT * FROM read_parquet('{tpch_tables['orders']}')")
    statements = [
        "CREATE TABLE typed (k BIGINT, name VARCHAR, price DECIMAL(12, 2), day DATE)",
        "INSERT INTO typed VALUES (1, 'one', 1.5, DATE '2024-01-02'), (2, NULL, 20, NULL)",
        "INSERT INTO typed SELECT o_orderkey, o_orderstatus, o_totalprice, o_orderdate "
        "FROM orders WHERE o_orderkey % 100 = 0",
        "INSERT INTO typed VALUES (3, 'three', '7.25', '2024-03-04')",
    ]
    check = "SELECT * FROM typed"
    first = statements[0]
    answer = session.sql(first).to_arrow()  # as DuckDB's: no row, a Count column
    assert answer.num_rows == 0 and answer.column_names == ["Count"]
    assert ref.execute(first).fetchall() == []
    # Empty, with DuckDB's column names (an answer of no partition carries no types:
    # ``fetch.assemble_result``; the table's own are checked once it has rows, below).
    empty = session.sql(check).to_arrow()
    assert empty.num_rows == 0 and empty.column_names == ["k", "name", "price", "day"]
    for statement in statements[1:]:
        counted = session.sql(statement).to_arrow()
        assert_same_result(counted, ref.execute(statement).to_arrow_table(), ordered=True)
    expected = ref.sql(check).to_arrow_table()
    assert expected.num_rows > 1000
    actual = session.sql(check).to_arrow()
    assert actual.schema.types == expected.schema.types
    assert_same_result(actual, expected, ordered=False)
    with pytest.raises(JobQueryError, match="Conversion"):
        session.sql("INSERT INTO typed VALUES ('not a number', 'x', 1, NULL)")
    assert_same_result(session.sql(check).to_arrow(), expected, ordered=False)
    session.sql("DROP TABLE typed")


def test_csv_and_json_outputs_read_back_as_tables_through_their_manifest(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection, out_root: Path
) -> None:
    check = (
        "SELECT count(*) AS n, sum(l_quantity) AS q, max(l_comment) AS c, "
        "count(DISTINCT l_shipdate) AS d FROM "
    )
    expected = duckdb_ref.sql(f"{check} ({LINEITEM_QUERY})").to_arrow_table()
    for fmt, options, register in [
        ("csv", "COMPRESSION gzip, DELIMITER '|'", {"delimiter": "|"}),
        ("csv", "HEADER false", {"header": False}),
        ("json", "COMPRESSION zstd", {}),
    ]:
        target = out_root / f"readable_{fmt}_{len(options)}"
        session.sql(f"COPY ({LINEITEM_QUERY}) TO '{target}' (FORMAT {fmt}, {options})")
        files = committed(target)
        assert len(files) == 6, files  # one per writing task
        # A stray file in the directory is no part of the output: readers skip it.
        stray = target / files[0].rsplit("/", 1)[1].replace("part-", "stray-")
        stray.write_bytes(Path(files[0]).read_bytes())
        name = f"readable_{fmt}_{len(options)}"
        columns = [
            ("l_orderkey", "BIGINT"),
            ("l_linenumber", "BIGINT"),
            ("l_quantity", "DECIMAL(15,2)"),
            ("l_extendedprice", "DECIMAL(15,2)"),
            ("l_shipdate", "DATE"),
            ("l_comment", "VARCHAR"),
        ]
        session.register(name, str(target), format=fmt, columns=columns, **register)
        actual = session.sql(check + name).to_arrow()
        assert_same_result(actual, expected, ordered=False)


CSV_TEXT_QUERY = (
    "SELECT l_orderkey, l_linenumber, "
    # Text that must be quoted or escaped: the delimiter, both quote characters, a backslash.
    "l_comment || ', ''' || l_returnflag || '\"\\' AS said, "
    "CASE WHEN l_linenumber % 3 = 0 THEN NULL ELSE l_shipmode END AS mode, "
    "CASE WHEN l_linenumber = 2 THEN NULL ELSE l_shipdate END AS shipped, "
    "CAST(l_commitdate AS TIMESTAMP) + to_seconds(l_orderkey % 86400) AS committed_at "
    "FROM lineitem WHERE l_orderkey % 8 = 0"
)


def data_lines(paths: list[Path], header: bool) -> tuple[set[bytes], list[bytes]]:
    """The files' header lines (each one's first, when ``header``) and their other lines."""
    headers: set[bytes] = set()
    lines: list[bytes] = []
    for path in paths:
        body = path.read_bytes().splitlines()
        if header:
            headers.add(body.pop(0))
        lines.extend(body)
    return headers, sorted(lines)


CSV_OPTION_CASES = {
    # id: (COPY's options, DuckDB's read_csv arguments, register's options): the same
    # choices in three spellings.
    "quoted": (
        "QUOTE '''', ESCAPE '\\', NULL 'NA', DATEFORMAT '%d/%m/%Y', "
        "TIMESTAMPFORMAT '%d/%m/%Y %H:%M:%S'",
        "quote = '''', escape = '\\', nullstr = 'NA', dateformat = '%d/%m/%Y', "
        "timestampformat = '%d/%m/%Y %H:%M:%S'",
        {
            "quote": "'",
            "escape": "\\",
            "null": "NA",
            "dateformat": "%d/%m/%Y",
            "timestampformat": "%d/%m/%Y %H:%M:%S",
        },
    ),
    "unquoted": (
        "DELIMITER '|', QUOTE '', ESCAPE '', NULLSTR '\\N', HEADER false, "
        "DATE_FORMAT '%Y%m%d', TIMESTAMP_FORMAT '%Y-%m-%dT%H:%M:%S'",
        "delim = '|', quote = '', escape = '', nullstr = '\\N', header = false, "
        "dateformat = '%Y%m%d', timestampformat = '%Y-%m-%dT%H:%M:%S'",
        {
            "delimiter": "|",
            "quote": "",
            "null": "\\N",
            "header": False,
            "date_format": "%Y%m%d",
            "timestamp_format": "%Y-%m-%dT%H:%M:%S",
        },
    ),
}


@pytest.mark.parametrize(
    ("options", "read", "register"), CSV_OPTION_CASES.values(), ids=CSV_OPTION_CASES.keys()
)
def test_copy_csv_quote_escape_null_and_date_formats_match_duckdb_byte_for_byte(
    cluster: Any,
    session: Any,
    duckdb_ref: duckdb.DuckDBPyConnection,
    out_root: Path,
    work_dir: Path,
    options: str,
    read: str,
    register: dict[str, Any],
) -> None:
    target = out_root / work_dir.name
    copy_options = f"FORMAT csv, {options}"
    result = session.sql(f"COPY ({CSV_TEXT_QUERY}) TO '{target}' ({copy_options})")
    reference = work_dir / "ref.csv"
    expected_count = duckdb_copy(duckdb_ref, CSV_TEXT_QUERY, reference, copy_options)
    assert_same_result(result.to_arrow(), expected_count, ordered=True)
    # Written by six tasks on both executors, each one a file of its own.
    writing = session.status().job(result.job_id).stages[-2]
    assert writing.tasks_total == 6
    attempts = writing_attempts(cluster, result.job_id, writing.stage)
    assert len({a["executor"] for a in attempts}) == 2, attempts
    files = [Path(f) for f in committed(target)]
    assert len(files) == 6, files
    # Byte for byte: every line DuckDB's own COPY wrote, and no other, each
    # written once (the files split the rows; their order within is the tasks').
    header = "HEADER false" not in options
    headers, lines = data_lines(files, header)
    ref_headers, ref_lines = data_lines([reference], header)
    assert headers == ref_headers
    assert lines == ref_lines
    assert len(lines) == expected_count["Count"][0].as_py()
    # The options did reach the files (not DuckDB's defaults written twice).
    text = b"\n".join(lines)
    if "QUOTE ''''" in options:
        assert b"'" in text and b"NA" in text and b"\\'" in text
    else:
        assert b"\\N" in text and b'"' in text and b"|" in text
    # Parsed back with the same options, the rows are the query's.
    con = duckdb.connect()
    names = [str(f) for f in files]
    actual = con.sql(f"SELECT * FROM read_csv({names!r}, {read})").to_arrow_table()
    expected = con.sql(f"SELECT * FROM read_csv('{reference}', {read})").to_arrow_table()
    assert actual.num_rows > 10_000
    assert_same_result(actual, expected, ordered=False)
    direct = duckdb_ref.sql(CSV_TEXT_QUERY).to_arrow_table()
    assert_same_result(actual, direct, ordered=False, check_names=header)
    # Registered as a CSV table with the same options, the output reads back, on the
    # cluster, as the query's rows (the table's types declared: DuckDB's of the query).
    types = duckdb_ref.sql(f"DESCRIBE {CSV_TEXT_QUERY}").fetchall()
    name = f"written_{len(options)}"
    session.register(name, str(target), "csv", [(c[0], c[1]) for c in types], **register)
    assert_same_result(session.sql(f"SELECT * FROM {name}").to_arrow(), direct, ordered=False)
    # Inferred from a sample instead, the dates are dates again (the formats were used).
    session.register(f"{name}_sniffed", str(target), "csv", **register)
    sniffed = session.sql(f"SELECT * FROM {name}_sniffed").to_arrow()
    assert sniffed.schema.types[-2:] == direct.schema.types[-2:], sniffed.schema
    assert_same_result(sniffed, direct, ordered=False, check_names=header)
    session.sql(f"DROP TABLE {name}")
    session.sql(f"DROP TABLE {name}_sniffed")


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("QUOTE 'ab'", "QUOTE takes one quoted character, or '' for none"),
        ("ESCAPE '\\\\'", "ESCAPE takes one quoted character"),
        ("NULLSTR ('a', 'b')", "NULLSTR takes one quoted text"),
        ("NULL ','", "DELIMITER ',' appears in NULLSTR ','"),
        ("DELIMITER '\"'", "QUOTE '\"' \\(DuckDB's default\\) appears in DELIMITER"),
        ("DATEFORMAT '%Q'", "DATEFORMAT '%Q': .*%Q.*DATEFORMAT takes a quoted strftime format"),
        ("TIMESTAMPFORMAT 7", "TIMESTAMPFORMAT takes a quoted strftime format"),
    ],
)
def test_a_bad_csv_option_is_refused_naming_it_and_the_cluster_serves_on(
    session: Any, out_root: Path, option: str, words: str
) -> None:
    target = out_root / "refused_csv"
    with pytest.raises(ForbiddenStatementError, match=words):
        session.sql(f"COPY (SELECT n_name FROM nation) TO '{target}' (FORMAT csv, {option})")
    assert not target.exists()
    assert session.sql("SELECT count(*) AS n FROM nation").to_arrow()["n"].to_pylist() == [25]
