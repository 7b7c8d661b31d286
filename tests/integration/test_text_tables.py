"""CSV and newline-delimited JSON tables on a real cluster: a scheduler and 2 executor
processes, every answer checked against single-process DuckDB reading the same files.

TPC-H SF 0.1 tables are written out as CSV and JSON by DuckDB in the test, registered
(the Python API, ``CREATE EXTERNAL TABLE`` and the CLI), and TPC-H queries run over
them. Each scan of ``lineitem`` and ``orders`` is cut at line boundaries into several
tasks, and the test reads the job's attempts from the REST API to show they ran on
both executors. Around that: files whose lines straddle every split point, quoted
newlines (``multiline``), gzip, bad rows (an error naming the file and line, or
skipped), and ``DROP TABLE``.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query

from mangonel.errors import CatalogError, JobFailedError, QueryError

SPLIT_ROWS = 100_000
"""Rows a scan task reads at most: SF 0.1 ``lineitem`` (600k) is 6 tasks, ``orders`` 2."""
SPLIT_SIZE = 2 * 1024 * 1024
"""Bytes of a chunk: ``lineitem.csv`` (about 75 MB) is some 36, grouped into tasks."""

CSV_TABLES = ("lineitem", "orders", "customer", "nation")
JSON_TABLES = ("orders", "customer")


@pytest.fixture(scope="module")
def text_dir(module_dir: Path, tpch_tables: dict[str, Path]) -> Path:
    """TPC-H tables as ``<name>.csv`` (a header, ``|``-delimited) and ``<name>.json``."""
    out = module_dir / "data"
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    for name in CSV_TABLES:
        src = str(tpch_tables[name])
        con.execute(
            f"COPY (SELECT * FROM read_parquet('{src}')) TO '{out / name}.csv' "
            "(FORMAT csv, HEADER, DELIMITER '|')"
        )
    for name in JSON_TABLES:
        src = str(tpch_tables[name])
        con.execute(
            f"COPY (SELECT * FROM read_parquet('{src}')) TO '{out / name}.json' (FORMAT json)"
        )
    con.close()
    return out


@pytest.fixture(scope="module")
def reference(text_dir: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """DuckDB with the CSV tables as views over the same files (``json_*`` the JSON ones)."""
    con = duckdb.connect()
    for name in CSV_TABLES:
        con.execute(
            f"CREATE VIEW {name} AS SELECT * FROM read_csv('{text_dir / name}.csv', delim='|')"
        )
    for name in JSON_TABLES:
        con.execute(
            f"CREATE VIEW json_{name} AS SELECT * FROM read_json('{text_dir / name}.json', "
            "format='newline_delimited')"
        )
    yield con
    con.close()


@pytest.fixture(scope="module")
def cluster(module_dir: Path) -> Iterator[Any]:
    import mangonel

    with mangonel.LocalCluster(
        executors=2,
        work_dir=str(module_dir / "cluster"),
        partitions=4,
        scheduler_args=("--split-rows", str(SPLIT_ROWS)),
        web_port=0,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def session(cluster: Any, text_dir: Path) -> Iterator[Any]:
    client = cluster.connect()
    for name in CSV_TABLES:
        info = client.register(
            name, str(text_dir / f"{name}.csv"), "csv", delimiter="|", split_size=SPLIT_SIZE
        )
        assert info.format == "csv"
    for name in JSON_TABLES:
        # The SQL spelling of the same registration.
        client.sql(
            f"CREATE EXTERNAL TABLE json_{name} STORED AS JSON LOCATION "
            f"'{text_dir / name}.json' OPTIONS ('split_size' '{SPLIT_SIZE}')"
        )
    yield client
    client.close()


def scan_executors(cluster: Any, job_id: str, table: str) -> tuple[int, set[str]]:
    """The tasks of the job's stage that scans ``table``, and the executors they ran on."""
    with urllib.request.urlopen(f"{cluster.web_url}/api/jobs/{job_id}", timeout=10) as answer:
        detail = json.loads(answer.read())
    stages = [s for s in detail["stages"] if table in s["label"]]
    assert stages, f"no stage scans {table}: {[s['label'] for s in detail['stages']]}"
    stage = max(stages, key=lambda s: s["num_tasks"])
    ran = {a["executor"] for a in detail["attempts"] if a["stage"] == stage["id"]}
    return stage["num_tasks"], ran


@pytest.mark.parametrize("number", [1, 3, 12])
def test_tpch_over_csv_is_distributed_and_matches_duckdb(
    number: int, cluster: Any, session: Any, reference: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(number)
    expected = reference.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    result = session.sql(sql)
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
    tasks, executors = scan_executors(cluster, result.job_id, "lineitem")
    assert tasks >= 5, f"lineitem was scanned by {tasks} task(s)"
    assert len(executors) == 2, f"lineitem's scan ran on {executors} only"


def test_tpch_q13_over_json_is_distributed_and_matches_duckdb(
    cluster: Any, session: Any, reference: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(13).replace("customer", "json_customer").replace("orders", "json_orders")
    expected = reference.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    result = session.sql(sql)
    order_by = TPCH_ORDER_BY[13]
    assert_same_result(result.to_arrow(), expected, ordered=True, order_by=order_by)
    tasks, _ = scan_executors(cluster, result.job_id, "json_orders")
    assert tasks >= 2, f"json_orders was scanned by {tasks} task(s)"


def test_inferred_schema_is_duckdbs(session: Any, reference: duckdb.DuckDBPyConnection) -> None:
    """The columns inferred at register (once, from a sample) type the values as
    DuckDB reading the whole file does."""
    tables = {t.name: t for t in session.tables()}
    for name in ("lineitem", "json_orders"):
        expected = reference.sql(f"SELECT * FROM {name} LIMIT 0").to_arrow_table().schema
        assert [c[0] for c in tables[name].columns] == expected.names
        assert [c[1] for c in tables[name].columns] == [str(f.type) for f in expected]


def test_lines_straddling_every_split_point_are_read_once(
    session: Any, work_dir: Path, reference: duckdb.DuckDBPyConnection
) -> None:
    """Lines of 2 to 306 bytes cut into 9973-byte chunks, grouped into 3 tasks: the
    split points fall inside lines, some right after a newline; every line is read
    exactly once (``tests/unit/test_textfiles.py`` tries every split point of a
    small file)."""
    path = work_dir / "ragged.csv"
    duckdb.sql(
        "COPY (SELECT i AS id, repeat('x', (i * 7919) % 300) AS pad FROM range(210000) t(i)) "
        f"TO '{path}' (FORMAT csv, HEADER)"
    )
    session.register("ragged", str(path), "csv", split_size=9973)
    sql = (
        "SELECT count(*) AS n, count(DISTINCT id) AS d, sum(id) AS s, sum(length(pad)) AS p "
        "FROM ragged"
    )
    result = session.sql(sql)
    expected = reference.sql(sql.replace("ragged", f"read_csv('{path}')")).to_arrow_table()
    assert_same_result(result.to_arrow(), expected, ordered=False)
    assert max(s.tasks_total for s in result.stages) >= 3


def test_quoted_newlines_need_multiline(
    session: Any, work_dir: Path, reference: duckdb.DuckDBPyConnection
) -> None:
    """A split could start inside a quoted field that holds a newline: register refuses
    such a file unless ``multiline=true``, which reads each file whole in one task."""
    folder = work_dir / "notes"
    folder.mkdir()
    for part in range(3):
        with open(folder / f"part-{part}.csv", "w") as f:
            f.write("id,note\n")
            for i in range(part * 1000, part * 1000 + 1000):
                f.write(f'{i},"line one of {i}\nline two, with a comma"\n')
    with pytest.raises(CatalogError, match="multiline=true"):
        session.register("notes", str(folder), "csv", split_size=500)
    session.register("notes", str(folder), "csv", split_size=500, multiline=True)
    sql = "SELECT count(*) AS n, sum(id) AS s, sum(length(note)) AS l FROM notes"
    result = session.sql(sql)
    glob = str(folder / "*.csv")
    expected = reference.sql(sql.replace("notes", f"read_csv('{glob}')")).to_arrow_table()
    assert_same_result(result.to_arrow(), expected, ordered=False)
    assert expected.column("n")[0].as_py() == 3000


def test_gzip_file_is_read_whole(
    session: Any, text_dir: Path, work_dir: Path, reference: duckdb.DuckDBPyConnection
) -> None:
    target = work_dir / "orders.csv.gz"
    with open(text_dir / "orders.csv", "rb") as src, gzip.open(target, "wb") as out:
        shutil.copyfileobj(src, out)
    session.register("orders_gz", str(target), "csv", delimiter="|", split_size=SPLIT_SIZE)
    sql = "SELECT o_orderstatus, count(*) AS n, sum(o_totalprice) AS t FROM orders_gz GROUP BY 1"
    result = session.sql(sql)
    expected = reference.sql(sql.replace("orders_gz", "orders")).to_arrow_table()
    assert_same_result(result.to_arrow(), expected, ordered=False)
    scans = [s for s in result.stages if "orders_gz" in s.label]
    assert scans and scans[0].tasks_total == 1


def _bad_file(path: Path, bad_line: int) -> None:
    with open(path, "w") as f:
        f.write("k,v\n")
        for line in range(2, 30_002):
            f.write("oops,1\n" if line == bad_line else f"{line},{line % 10}\n")


def test_bad_row_names_file_and_line_or_is_skipped(
    session: Any, work_dir: Path, reference: duckdb.DuckDBPyConnection
) -> None:
    path = work_dir / "bad.csv"
    bad_line = 27_123  # far past the first split, in a later task's bytes
    _bad_file(path, bad_line)
    session.register(
        "bad", str(path), "csv", columns=[("k", "BIGINT"), ("v", "INTEGER")], split_size=20_000
    )
    with pytest.raises(JobFailedError) as failed:
        session.sql("SELECT sum(k) AS s FROM bad")
    assert isinstance(failed.value, QueryError)
    message = str(failed.value)
    assert f"{path}, line {bad_line}" in message, message
    assert "ignore_errors=true" in message
    session.register(
        "bad_skipped",
        str(path),
        "csv",
        columns={"k": "BIGINT", "v": "INTEGER"},
        split_size=20_000,
        ignore_errors=True,
    )
    sql = "SELECT count(*) AS n, sum(k) AS s FROM bad_skipped"
    result = session.sql(sql)
    expected = reference.sql(
        f"SELECT count(*) AS n, sum(k) AS s FROM read_csv('{path}', "
        "columns={'k': 'BIGINT', 'v': 'INTEGER'}, header=true, ignore_errors=true)"
    ).to_arrow_table()
    assert_same_result(result.to_arrow(), expected, ordered=False)
    assert expected.column("n")[0].as_py() == 29_999
    # The cluster goes on serving.
    assert session.sql("SELECT count(*) AS n FROM nation").to_arrow().column(0)[0].as_py() == 25


def test_bad_options_and_columns_are_refused_clearly(session: Any, text_dir: Path) -> None:
    path = str(text_dir / "nation.csv")
    with pytest.raises(CatalogError, match="unknown option 'delimeter'"):
        session.register("x", path, "csv", delimeter="|")
    with pytest.raises(CatalogError, match="one character"):
        session.register("x", path, "csv", delimiter="||")
    with pytest.raises(CatalogError, match="declared columns do not parse"):
        session.register("x", path, "csv", columns=[("a", "NOSUCHTYPE")])
    with pytest.raises(CatalogError, match="unknown table format"):
        session.register("x", path, "xml")
    with pytest.raises(CatalogError, match="takes no options"):
        session.register("x", path, "parquet", delimiter="|")


def test_create_external_table_and_drop_table(
    session: Any, text_dir: Path, reference: duckdb.DuckDBPyConnection
) -> None:
    session.sql(
        "CREATE EXTERNAL TABLE nation_decl (n_nationkey INTEGER, n_name VARCHAR, "
        "n_regionkey INTEGER, n_comment VARCHAR) STORED AS CSV "
        f"LOCATION '{text_dir / 'nation.csv'}' OPTIONS ('delimiter' '|', 'header' 'true')"
    )
    info = {t.name: t for t in session.tables()}["nation_decl"]
    assert info.columns[0] == ("n_nationkey", "int32")
    sql = "SELECT n_regionkey, count(*) AS n FROM nation_decl GROUP BY 1"
    expected = reference.sql(sql.replace("nation_decl", "nation")).to_arrow_table()
    assert_same_result(session.sql(sql).to_arrow(), expected, ordered=False)
    session.sql("DROP TABLE nation_decl")
    assert "nation_decl" not in {t.name for t in session.tables()}
    assert (text_dir / "nation.csv").exists()  # only the registration went
    session.sql("DROP TABLE IF EXISTS nation_decl")


def test_cli_registers_a_csv_table(cluster: Any, session: Any, text_dir: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mangonel",
            "--scheduler",
            cluster.address,
            "register",
            "--format",
            "csv",
            "--option",
            "delimiter=|",
            "nation_cli",
            str(text_dir / "nation.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "registered nation_cli" in done.stdout
    n = session.sql("SELECT count(*) AS n FROM nation_cli").to_arrow().column(0)[0].as_py()
    assert n == 25
