"""Fixtures every suite may use: TPC-H data, a DuckDB reference, per-test work directories.

* ``tpch_dir``: TPC-H SF 0.1 as ``<table>.parquet`` files, generated once with
  ``tpchgen-cli`` into ``<repo>/.cache/tpch-sf0.1`` and reused by later runs.
* ``tpch_tables``: table name -> Parquet path, for registering with any engine.
* ``duckdb_ref``: one DuckDB connection with the eight tables as views over the same
  files, the reference every mangonel answer is compared with.
* ``work_dir``: an empty directory named after the test, under ``<repo>/test-artifacts``;
  kept after the run so a failure's files and logs can be read.
* ``module_dir``: the same for a whole test module (for module-scoped clusters).

At the end of a run it prints the executors its clusters' schedulers declared lost,
and which of them came back alive (false losses: ``loss_tally``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from _pytest.terminal import TerminalReporter
from helpers import ARTIFACTS_DIR, TPCH_TABLES, duckdb_views_sql, ensure_tpch, safe_name
from loss_tally import Tallies

from mangonel.catalog import Table, load_table
from mangonel.options import TEST_HOOKS_ENV

# The processes the tests start take the test-only options (--faults-file,
# --crash-file); a production command line refuses them.
os.environ[TEST_HOOKS_ENV] = "1"

TPCH_TEST_SCALE = 0.1


@pytest.fixture(scope="session")
def tpch_dir() -> Path:
    """The directory of TPC-H SF 0.1 Parquet files (one per table)."""
    return ensure_tpch(TPCH_TEST_SCALE)


@pytest.fixture(scope="session")
def tpch_tables(tpch_dir: Path) -> dict[str, Path]:
    """TPC-H table name -> its Parquet file."""
    return {name: tpch_dir / f"{name}.parquet" for name in TPCH_TABLES}


@pytest.fixture(scope="session")
def catalog(tpch_dir: Path) -> dict[str, Table]:
    """The TPC-H tables as the planner's catalog (their footers read once)."""
    return {t: load_table(t, str(tpch_dir / f"{t}.parquet")) for t in TPCH_TABLES}


@pytest.fixture(scope="session")
def duckdb_ref(tpch_tables: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    """Single-process DuckDB with the TPC-H tables as views over the same Parquet files."""
    con = duckdb.connect()
    for statement in duckdb_views_sql(dict(tpch_tables)):
        con.execute(statement)
    yield con
    con.close()


def _fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@pytest.fixture
def work_dir(request: pytest.FixtureRequest) -> Path:
    """An empty work directory named after this test, kept after the run."""
    module = safe_name(request.node.module.__name__)
    return _fresh_dir(ARTIFACTS_DIR / module / safe_name(request.node.name))


@pytest.fixture(scope="module")
def module_dir(request: pytest.FixtureRequest) -> Path:
    """An empty work directory named after this test module, kept after the run."""
    return _fresh_dir(ARTIFACTS_DIR / safe_name(request.module.__name__) / "_module")


TALLIES = Tallies("all suites", [ARTIFACTS_DIR])
"""Where this run's scheduler logs are, for its false losses (``loss_tally``)."""


@pytest.fixture(scope="session", autouse=True)
def _count_losses(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Clusters in a test's ``tmp_path`` count too, not only those in ``test-artifacts``."""
    TALLIES.roots.append(tmp_path_factory.getbasetemp())


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    TALLIES.summary(terminalreporter)
