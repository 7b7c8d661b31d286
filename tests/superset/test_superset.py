"""A real Apache Superset on a real 2-executor cluster: SQL Lab and a chart, answers checked.

Superset 6.1 runs from a virtualenv of its own (``scripts/install-superset.sh``: its
pinned packages, and mangonel's client installed into it as a user installs it, the
package without dependencies plus ``requirements-client.txt``), with its metadata in
SQLite under the test's directory, served by gunicorn. Through Superset's REST API the
test adds the cluster as a database (``mangonel://host:port``), runs TPC-H queries in
SQL Lab and creates a pie chart; headless Chromium (Debian's ``chromium``) renders the
chart and its screenshot must show the chart's colours. Every answer is compared with
single-process DuckDB on the same files, and the cluster's job list shows that each
query ran there, in several stages.

Needs Python 3.11, the package index (the first run installs Superset: minutes) and
``chromium`` / ``chromium-driver`` (``scripts/install-system-deps.sh``). A suite of its
own: ``scripts/test.sh tests/superset`` (``.ci/run`` runs it after the main suite).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from helpers import (
    ARTIFACTS_DIR,
    TPCH_ORDER_BY,
    TPCH_TABLES,
    assert_same_result,
    headless_chromium,
    tpch_query,
)
from superset_api import ADMIN, Superset, SupersetApi, start_superset

import mangonel
from mangonel.client.status import JobState

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".cache" / "superset-venv"
PIXELS = Path(__file__).with_name("chart_pixels.py")
SCREENSHOTS = ARTIFACTS_DIR / "superset"

# The first run on a machine installs Superset (minutes) in the first test's setup.
pytestmark = pytest.mark.timeout(1800)

SQL_LAB_QUERIES = [1, 5, 12]
"""Decimals and averages (Q1), a six-table join (Q5), sums of CASEs (Q12). None of them
with a LIMIT of its own: Superset 6.1's SQL Lab sent ``LIMIT 1001`` (its row limit and
one) in place of TPC-H Q3's ``LIMIT 10``, so Q3, Q10 and Q18 answer more rows there
than the query asks for (README, "From a BI tool")."""

DATES = (
    "SELECT l_returnflag, min(l_shipdate) AS first_shipped, max(l_receiptdate) AS last_received "
    "FROM main.lineitem GROUP BY l_returnflag ORDER BY l_returnflag"
)
"""Dates (Superset sends them as ISO text), and a name qualified as BI tools write them."""


# ------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def superset_venv() -> Path:
    """Superset's virtualenv, with this checkout's mangonel client installed into it."""
    done = subprocess.run(
        [str(REPO / "scripts" / "install-superset.sh"), str(VENV)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(
            "scripts/install-superset.sh failed; Superset cannot be started:\n"
            + (done.stdout + done.stderr)[-4000:]
        )
    return VENV


@pytest.fixture(scope="module")
def cluster(module_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[Any]:
    """Two executors, four partitions per exchange, the TPC-H tables registered."""
    with mangonel.LocalCluster(
        executors=2,
        work_dir=module_dir / "cluster",
        partitions=4,
        scheduler_args=("--split-rows", "250000"),
    ) as running:
        with running.connect() as session:
            for name, path in tpch_tables.items():
                session.register_parquet(name, str(path))
        yield running


@pytest.fixture(scope="module")
def superset(superset_venv: Path, module_dir: Path) -> Iterator[Superset]:
    with start_superset(superset_venv, module_dir / "superset") as running:
        yield running


@pytest.fixture(scope="module")
def api(superset: Superset) -> SupersetApi:
    return SupersetApi(superset.url)


@pytest.fixture(scope="module")
def database_id(api: SupersetApi, cluster: Any) -> int:
    """The cluster added to Superset as a database, as a user adds it (URL tested first)."""
    uri = f"mangonel://{cluster.address}"
    assert api.post("/api/v1/database/test_connection/", {"sqlalchemy_uri": uri}) == {
        "message": "OK"
    }
    added = api.post(
        "/api/v1/database/",
        {"database_name": "TPC-H on mangonel", "sqlalchemy_uri": uri, "expose_in_sqllab": True},
    )
    return int(added["id"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with headless_chromium(page_load_timeout_s=120) as driver:
        yield driver


# -------------------------------------------------------------------- helpers


def job_ids(cluster: Any) -> set[str]:
    with cluster.connect() as session:
        return {job.job_id for job in session.status().jobs}


def new_jobs(cluster: Any, before: set[str], reading: str) -> list[Any]:
    """The jobs since ``before`` whose SQL reads table ``reading``."""
    with cluster.connect() as session:
        jobs = session.status().jobs
    return [j for j in jobs if j.job_id not in before and reading in j.sql.lower()]


def as_json_types(table: pa.Table) -> pa.Table:
    """DuckDB's answer in the types Superset's JSON carries: decimals as doubles, dates
    as ISO text (Superset sends both so)."""
    columns = []
    for column in table.columns:
        if pa.types.is_decimal(column.type):
            column = column.cast(pa.float64())
        elif pa.types.is_date(column.type):
            column = column.cast(pa.string())
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def rows_as_table(rows: list[dict[str, Any]], like: pa.Table) -> pa.Table:
    """Superset's JSON rows in ``like``'s schema: a value that does not fit fails here."""
    return pa.Table.from_pylist(rows, schema=like.schema)


# ---------------------------------------------------------------------- tests


def test_superset_lists_mangonel_and_sees_the_tables(api: SupersetApi, database_id: int) -> None:
    # The engine spec came from mangonel's entry point (superset.db_engine_specs).
    engines = {d["engine"]: d for d in api.get("/api/v1/database/available/")["databases"]}
    assert engines["mangonel"]["name"] == "mangonel"
    assert engines["mangonel"]["available_drivers"] == ["mangonel"]
    assert api.get(f"/api/v1/database/{database_id}/schemas/")["result"] == ["main"]
    tables = api.get(f"/api/v1/database/{database_id}/tables/?q=(schema_name:main)")
    assert sorted(t["value"] for t in tables["result"]) == sorted(TPCH_TABLES)
    lineitem = api.get(f"/api/v1/database/{database_id}/table_metadata/?name=lineitem&schema=main")
    types = {c["name"]: c["type"] for c in lineitem["columns"]}
    assert types["l_orderkey"] == "BIGINT"
    assert types["l_extendedprice"].startswith("NUMERIC")
    assert types["l_shipdate"] == "DATE"
    assert types["l_comment"] == "VARCHAR"


@pytest.mark.parametrize(
    ("sql", "order_by"),
    [(tpch_query(n), TPCH_ORDER_BY[n]) for n in SQL_LAB_QUERIES] + [(DATES, ("l_returnflag",))],
    ids=[f"q{n:02d}" for n in SQL_LAB_QUERIES] + ["dates"],
)
def test_queries_in_sql_lab_match_duckdb(
    sql: str,
    order_by: tuple[str, ...],
    api: SupersetApi,
    database_id: int,
    cluster: Any,
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    expected = as_json_types(duckdb_ref.sql(sql).to_arrow_table())
    assert expected.num_rows > 0
    before = job_ids(cluster)
    answer = api.post(
        "/api/v1/sqllab/execute/",
        {
            "database_id": database_id,
            "schema": "main",
            "sql": sql,
            "runAsync": False,
            "queryLimit": 1000,
            "tab": "a query",
        },
    )
    assert answer["status"] == "success", answer
    assert [c["name"] for c in answer["columns"]] == expected.column_names
    assert_same_result(
        rows_as_table(answer["data"], expected), expected, ordered=bool(order_by), order_by=order_by
    )
    # It ran on the cluster, distributed: a job of several stages, which succeeded.
    (job,) = new_jobs(cluster, before, "lineitem")
    assert job.state is JobState.SUCCEEDED
    assert len(job.stages) > 1, job.stages


def test_a_chart_renders_in_chromium(
    api: SupersetApi,
    database_id: int,
    cluster: Any,
    superset: Superset,
    browser: Any,
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    from selenium.webdriver.common.by import By

    dataset = api.post(
        "/api/v1/dataset/", {"database": database_id, "schema": "main", "table_name": "orders"}
    )["id"]
    params = {
        "viz_type": "pie",
        "datasource": f"{dataset}__table",
        "groupby": ["o_orderpriority"],
        "metric": "count",  # the COUNT(*) metric Superset gives every dataset
        "adhoc_filters": [],
        "row_limit": 100,
        "color_scheme": "supersetColors",
        "show_labels": True,
        "show_legend": True,
    }
    chart = api.post(
        "/api/v1/chart/",
        {
            "slice_name": "Orders by priority",
            "viz_type": "pie",
            "datasource_id": dataset,
            "datasource_type": "table",
            "params": json.dumps(params),
        },
    )["id"]

    # The chart's numbers, as Superset queries them for it, against DuckDB's.
    data = api.post(
        "/api/v1/chart/data",
        {
            "datasource": {"id": dataset, "type": "table"},
            "queries": [{"columns": ["o_orderpriority"], "metrics": ["count"], "row_limit": 100}],
            "result_format": "json",
            "result_type": "full",
        },
    )["result"][0]
    assert data["status"] == "success", data
    assert "main.orders" in data["query"]  # Superset qualifies names; mangonel takes them
    expected = duckdb_ref.sql(
        "SELECT o_orderpriority, count(*) AS count FROM orders GROUP BY 1"
    ).to_arrow_table()
    assert_same_result(rows_as_table(data["data"], expected), expected, ordered=False)

    # The chart in a browser, logged in as a user does; its query runs on the cluster.
    before = job_ids(cluster)
    user, password = ADMIN
    browser.get(f"{superset.url}/login/")
    wait(lambda: browser.find_elements(By.ID, "username"), "the login form")
    browser.find_element(By.ID, "username").send_keys(user)
    browser.find_element(By.ID, "password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(lambda: "/login" not in browser.current_url, "the login")
    browser.get(f"{superset.url}/explore/?slice_id={chart}&standalone=1")
    wait(lambda: browser.find_elements(By.CSS_SELECTOR, ".chart-container canvas"), "the chart")
    shot = SCREENSHOTS / "orders-by-priority.png"

    samples: list[dict[str, Any]] = []

    def drawn() -> dict[str, Any] | None:
        # ECharts animates the slices in: read the screenshot until two agree.
        browser.save_screenshot(str(shot))
        now = pixels(superset, shot)
        still = bool(samples) and now == samples[-1] and now["colored"] > 0
        samples.append(now)
        return now if still else None

    try:
        seen = wait(drawn, "a still chart in the screenshot", timeout=120)
    except AssertionError as err:
        raise AssertionError(f"{err}; the last screenshots held {samples[-3:]}") from None
    # Five slices: four in the palette's colours, one grey (not counted as colour);
    # each coloured one a few percent of the 1400x900 page. An error or an empty chart
    # is grey text on a grey page.
    big = [rgb for rgb, share in seen["colors"] if share > 0.01]
    assert seen["colored"] > 0.08, seen
    assert len(big) >= 4, seen
    assert new_jobs(cluster, before, "orders"), "the chart's query did not reach the cluster"


def pixels(superset: Superset, shot: Path) -> dict[str, Any]:
    done = subprocess.run(
        [str(superset.venv / "bin" / "python"), str(PIXELS), str(shot)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def wait(predicate: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.5)
