"""Test helpers shared by the test suites and the benchmark.

Owns three things every suite needs the same way:

* ``ensure_tpch``: TPC-H Parquet generated once with ``tpchgen-cli`` into a cache
  directory, written to a temporary name and renamed, so a killed run never leaves
  a half-written cache behind.
* ``tpch_query``: the 22 TPC-H queries shipped as package data in ``mangonel.tpch``.
* ``assert_same_result``: compares a mangonel answer with DuckDB's, value by value,
  and says which rows differ when they do.

Comparison rules (``assert_same_result``):

* same column count, same column names (unless ``check_names=False``), same kind of
  type per column (integer, decimal, float, string, date, ...; widths may differ);
* same number of rows;
* integers and decimals exact (``Decimal('1.50') == Decimal('1.5')``), floats equal to
  1e-9 relative (1e-12 absolute, so a sum that cancels to 1e-15 on one side and 0.0 on
  the other still matches), NaN equal to NaN, NULL equal to NULL and to nothing else,
  strings, dates, timestamps and everything else exact;
* ``ordered=False``: rows compared as multisets (both sides sorted by every column,
  NULL-safe); ``ordered=True`` with no ``order_by``: rows compared position by position;
  ``ordered=True`` with ``order_by`` columns: the sort-key columns must match position
  by position, and the rows inside each run of equal sort keys are compared as a
  multiset, because SQL lets tied rows come out in any order.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.types as pat
import pytest

TPCH_TABLES: tuple[str, ...] = (
    "customer",
    "lineitem",
    "nation",
    "orders",
    "part",
    "partsupp",
    "region",
    "supplier",
)

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache"

MAY_SKIP = "MANGONEL_TESTS_MAY_SKIP"
"""Set to 1 on a machine without root to skip, not fail, the tests that need it
(network namespaces, tmpfs mounts, cgroups). CI never sets it."""


def require_host(problem: str | None, what: str) -> None:
    """Go on when the machine can do what a test needs (``problem`` is None);
    otherwise fail the test, saying ``what`` it needs and why it cannot have it.

    A suite that needs root must fail where it cannot run, never pass unseen as
    skipped: only a developer's explicit ``MANGONEL_TESTS_MAY_SKIP=1`` skips it.
    """
    if problem is None:
        return
    message = f"{what}: {problem}"
    if os.environ.get(MAY_SKIP) == "1":
        pytest.skip(message)
    pytest.fail(f"{message} (on a machine without root, {MAY_SKIP}=1 skips such tests)")


ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"

# Output columns of each TPC-H query's final ORDER BY, in order. Used to compare
# answers in order while letting rows tied on every sort key come out in any order.
TPCH_ORDER_BY: dict[int, tuple[str, ...]] = {
    1: ("l_returnflag", "l_linestatus"),
    2: ("s_acctbal", "n_name", "s_name", "p_partkey"),
    3: ("revenue", "o_orderdate"),
    4: ("o_orderpriority",),
    5: ("revenue",),
    6: (),
    7: ("supp_nation", "cust_nation", "l_year"),
    8: ("o_year",),
    9: ("nation", "o_year"),
    10: ("revenue",),
    11: ("value",),
    12: ("l_shipmode",),
    13: ("custdist", "c_count"),
    14: (),
    15: ("s_suppkey",),
    16: ("supplier_cnt", "p_brand", "p_type", "p_size"),
    17: (),
    18: ("o_totalprice", "o_orderdate"),
    19: (),
    20: ("s_name",),
    21: ("numwait", "s_name"),
    22: ("cntrycode",),
}


# --------------------------------------------------------------------------- data


def tpch_dir_name(scale: float) -> str:
    """The cache directory name for one scale factor, e.g. ``tpch-sf0.1``."""
    return f"tpch-sf{scale:g}"


def tpchgen_executable() -> str:
    """``tpchgen-cli`` from the virtualenv that runs this interpreter, else from PATH."""
    local = Path(sys.executable).parent / "tpchgen-cli"
    if local.exists():
        return str(local)
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise RuntimeError(
            "tpchgen-cli is not installed; run `pip install -e '.[test]'` in the virtualenv"
        )
    return found


def ensure_tpch(scale: float, cache_dir: Path = CACHE_DIR) -> Path:
    """TPC-H at ``scale`` as one Parquet file per table; generated on first use.

    The data is written into a temporary directory next to the cache and renamed
    into place, so the cache directory exists only when it is complete. Two runs
    racing each other both generate and one rename wins; the loser uses the winner's.

    Returns:
        The directory holding ``<table>.parquet`` for the eight TPC-H tables.
    """
    target = cache_dir / tpch_dir_name(scale)

    def generate(into: Path) -> None:
        subprocess.run(
            [tpchgen_executable(), "parquet", "-s", f"{scale:g}", "--output-dir", str(into)],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    return cached_tables(target, TPCH_TABLES, "tpchgen-cli", generate)


def cached_tables(
    target: Path, tables: Sequence[str], generator: str, generate: Callable[[Path], None]
) -> Path:
    """``target`` holding ``<table>.parquet`` for every table, generated there first
    when one is missing: into a temporary directory beside it, renamed into place."""
    if all((target / f"{t}.parquet").is_file() for t in tables):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)
    try:
        generate(tmp)
        missing = [t for t in tables if not (tmp / f"{t}.parquet").is_file()]
        if missing:
            raise RuntimeError(f"{generator} did not write {missing} into {tmp}")
        if target.exists():
            # An incomplete cache from an older layout: replace it.
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another run renamed its copy first; it is complete by construction.
            if not all((target / f"{t}.parquet").is_file() for t in tables):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


TPCDS_TABLES: tuple[str, ...] = (
    "call_center", "catalog_page", "catalog_returns", "catalog_sales", "customer",
    "customer_address", "customer_demographics", "date_dim", "household_demographics",
    "income_band", "inventory", "item", "promotion", "reason", "ship_mode", "store",
    "store_returns", "store_sales", "time_dim", "warehouse", "web_page", "web_returns",
    "web_sales", "web_site",
)  # fmt: skip
TPCDS_QUERIES_DIR = REPO_ROOT / "tests" / "tpcds" / "queries"
TPCDS_SF01_DIR = REPO_ROOT / "tests" / "tpcds" / "queries_sf01"
TPCDS_GENERATOR = CACHE_DIR / "tpcds-generator"


def ensure_tpcds(scale: float, cache_dir: Path = CACHE_DIR) -> Path:
    """TPC-DS at ``scale`` as one Parquet file per table; generated on first use.

    The generator is DuckDB 1.5.5's ``tpcds`` extension in a virtualenv of its own
    (``scripts/install-tpcds-generator.sh``, run here when it is missing); the
    cache is written and renamed into place as ``ensure_tpch`` does.

    Returns:
        The directory holding ``<table>.parquet`` for the 24 TPC-DS tables.
    """
    target = cache_dir / f"tpcds-sf{scale:g}"
    if all((target / f"{t}.parquet").is_file() for t in TPCDS_TABLES):
        return target
    subprocess.run([str(REPO_ROOT / "scripts" / "install-tpcds-generator.sh")], check=True)

    def generate(into: Path) -> None:
        subprocess.run(
            [
                str(TPCDS_GENERATOR / "bin" / "python"),
                str(REPO_ROOT / "scripts" / "tpcds_generate.py"),
                "--scale",
                f"{scale:g}",
                "--out",
                str(into),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    return cached_tables(target, TPCDS_TABLES, "the TPC-DS generator", generate)


def tpcds_query(number: int) -> str:
    """The text of TPC-DS query ``number`` (1-99), as checked in under tests/tpcds/queries."""
    return (TPCDS_QUERIES_DIR / f"q{number:02d}.sql").read_text(encoding="utf-8")


def tpcds_sf01_variant(number: int) -> str | None:
    """TPC-DS query ``number`` with other constants, where its standard text returns no
    row at SF 0.1 (``tests/tpcds/queries_sf01``; each file's header says what changed and
    why); ``None`` for the others."""
    path = TPCDS_SF01_DIR / f"q{number:02d}.sql"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def stated_rows(sql: str) -> int:
    """The row count a ``tests/tpcds/queries_sf01`` file's header states (``-- Rows at SF
    0.1: N.``), so that a test can keep it true."""
    found = re.search(r"^-- Rows at SF 0\.1: (\d+)\.$", sql, re.MULTILINE)
    if found is None:
        raise ValueError(f"no '-- Rows at SF 0.1: N.' line in:\n{sql[:400]}")
    return int(found.group(1))


def order_by_outputs(sql: str, names: Sequence[str]) -> list[str] | None:
    """The output columns the outermost ORDER BY of ``sql`` sorts by, in order.

    ``[]`` when there is no ORDER BY; ``None`` when a sort key is not an output
    column (an expression, or a column the SELECT does not return): the order
    then cannot be checked from the answer alone.
    """
    import sqlglot
    from sqlglot import exp

    query = sqlglot.parse_one(sql, read="duckdb")
    order = query.args.get("order")
    if order is None:
        return []
    keys: list[str] = []
    for ordered in order.expressions:
        key = ordered.this
        if isinstance(key, exp.Literal) and key.is_int:
            keys.append(names[int(key.this) - 1])
        elif isinstance(key, exp.Column) and key.name in names:
            keys.append(key.name)
        else:
            return None
    return keys


def shuffled_orders(path: Path | str, directory: Path, group_rows: int = 10_000) -> Path:
    """TPC-H ``orders`` with its rows in a random order, in row groups of
    ``group_rows``: every row group spans about the whole key range, so no join
    reads it by key range (``KeyRanges.range_join``), for tests whose plan must
    hash it."""
    out = directory / "orders.parquet"
    with duckdb.connect() as con:
        con.execute(
            f"COPY (SELECT * FROM read_parquet('{path}') ORDER BY hash(o_orderkey)) "
            f"TO '{out}' (FORMAT parquet, ROW_GROUP_SIZE {group_rows})"
        )
    return out


def tpch_query(number: int) -> str:
    """The text of TPC-H query ``number`` (1-22), from the package data."""
    return (
        resources.files("mangonel")
        .joinpath(f"tpch/queries/q{number:02d}.sql")
        .read_text(encoding="utf-8")
    )


def safe_name(text: str) -> str:
    """A file-system-safe name for a test node id or module name."""
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)
    return keep.strip("_")[:150] or "unnamed"


def duckdb_views_sql(tables: dict[str, Path | str]) -> list[str]:
    """``CREATE VIEW`` statements that expose Parquet locations to a DuckDB connection."""
    statements = []
    for name, location in tables.items():
        path = str(location).replace("'", "''")
        statements.append(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
    return statements


# --------------------------------------------------------------------- comparison

REL_TOL = 1e-9
ABS_TOL = 1e-12
MAX_SHOWN = 5


def duckdb_over(tables: dict[str, Path] | dict[str, str]) -> duckdb.DuckDBPyConnection:
    """A single-process DuckDB with a view over each table's files
    (``duckdb_views_sql``): the reference every answer is compared with."""
    con = duckdb.connect()
    for statement in duckdb_views_sql(dict(tables)):
        con.execute(statement)
    return con


def type_kind(t: pa.DataType) -> str:
    """The kind of an Arrow type that two engines must agree on (widths may differ)."""
    checks: list[tuple[Callable[[pa.DataType], bool], str]] = [
        (pat.is_null, "null"),
        (pat.is_boolean, "boolean"),
        (pat.is_integer, "integer"),
        (pat.is_floating, "float"),
        (pat.is_decimal, "decimal"),
        (lambda x: pat.is_string(x) or pat.is_large_string(x) or pat.is_string_view(x), "string"),
        (
            lambda x: (
                pat.is_binary(x)
                or pat.is_large_binary(x)
                or pat.is_binary_view(x)
                or pat.is_fixed_size_binary(x)
            ),
            "binary",
        ),
        (pat.is_date, "date"),
        (lambda x: pat.is_timestamp(x) and x.tz is None, "timestamp"),
        (lambda x: pat.is_timestamp(x) and x.tz is not None, "timestamp with time zone"),
        (pat.is_time, "time"),
        (lambda x: pat.is_interval(x) or pat.is_duration(x), "interval"),
    ]
    if pat.is_dictionary(t):
        return type_kind(t.value_type)
    for check, kind in checks:
        if check(t):
            return kind
    return str(t)


def _values_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        if not (isinstance(a, int | float) and isinstance(b, int | float)):
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _rows_equal(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(_values_equal(x, y) for x, y in zip(a, b, strict=True))


def _sort_key(value: Any) -> tuple[Any, ...]:
    # NULLs first, NaN after every number; nested values by their text, which is
    # deterministic for equal values and only decides the order of unequal ones.
    if value is None:
        return (0,)
    if isinstance(value, float) and math.isnan(value):
        return (2,)
    if isinstance(value, dict | list):
        return (1, repr(value))
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return (1, value.astimezone(dt.UTC).replace(tzinfo=None))
    return (1, value)


def _multiset_order(rows: list[tuple[Any, ...]], float_cols: set[int]) -> list[tuple[Any, ...]]:
    # Exact columns first: when they identify a row, float noise in the last digits
    # cannot reorder rows differently on the two sides.
    cols = list(range(len(rows[0]))) if rows else []
    order = [i for i in cols if i not in float_cols] + [i for i in cols if i in float_cols]
    return sorted(rows, key=lambda r: tuple(_sort_key(r[i]) for i in order))


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    columns = [_to_pylist(col) for col in table.columns]
    return list(zip(*columns, strict=True)) if columns else [()] * table.num_rows


def _to_pylist(col: pa.ChunkedArray) -> list[Any]:
    t = col.type
    if pat.is_dictionary(t):
        col = col.cast(t.value_type)
    if pat.is_string_view(col.type) or pat.is_large_string(col.type):
        col = col.cast(pa.string())
    if pat.is_interval(col.type):
        # MonthDayNano values are named tuples; compare them as plain tuples.
        return [None if v is None else tuple(v) for v in col.to_pylist()]
    return list(col.to_pylist())


def _format_row(row: tuple[Any, ...]) -> str:
    return "(" + ", ".join(repr(v) for v in row) + ")"


def _describe(table: pa.Table) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in table.schema)


def _diff_message(
    what: str,
    actual: list[tuple[Any, ...]],
    expected: list[tuple[Any, ...]],
    names: list[str],
) -> str | None:
    bad = [
        i for i, (a, e) in enumerate(zip(actual, expected, strict=True)) if not _rows_equal(a, e)
    ]
    if not bad:
        return None
    lines = [f"{len(bad)} of {len(expected)} rows differ ({what}); columns {names}"]
    for i in bad[:MAX_SHOWN]:
        lines.append(f"  row {i}:")
        lines.append(f"    actual   {_format_row(actual[i])}")
        lines.append(f"    expected {_format_row(expected[i])}")
    if len(bad) > MAX_SHOWN:
        lines.append(f"  ... and {len(bad) - MAX_SHOWN} more")
    return "\n".join(lines)


def _runs(keys: list[tuple[Any, ...]]) -> list[tuple[int, int]]:
    """Half-open [start, end) ranges of consecutive equal sort keys."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or not _rows_equal(keys[i], keys[start]):
            runs.append((start, i))
            start = i
    return runs


def compare_results(
    actual: pa.Table,
    expected: pa.Table,
    *,
    ordered: bool,
    order_by: Sequence[str] = (),
    check_names: bool = True,
) -> str | None:
    """Why ``actual`` differs from ``expected``, or None when they match.

    See the module docstring for the rules; ``assert_same_result`` raises with this text.
    """
    if actual.num_columns != expected.num_columns:
        return (
            f"column count differs: actual {actual.num_columns} [{_describe(actual)}], "
            f"expected {expected.num_columns} [{_describe(expected)}]"
        )
    if check_names and actual.column_names != expected.column_names:
        return (
            f"column names differ: actual {actual.column_names}, expected {expected.column_names}"
        )
    for i, (fa, fe) in enumerate(zip(actual.schema, expected.schema, strict=True)):
        ka, ke = type_kind(fa.type), type_kind(fe.type)
        if ka != ke and "null" not in (ka, ke):
            return f"column {i} ({fe.name!r}) has type {fa.type} ({ka}), expected {fe.type} ({ke})"
    if actual.num_rows != expected.num_rows:
        return (
            f"row count differs: actual {actual.num_rows}, expected {expected.num_rows}\n"
            f"first actual rows:   {[_format_row(r) for r in _rows(actual.slice(0, 3))]}\n"
            f"first expected rows: {[_format_row(r) for r in _rows(expected.slice(0, 3))]}"
        )
    names = list(expected.column_names)
    rows_a, rows_e = _rows(actual), _rows(expected)
    float_cols = {i for i, f in enumerate(expected.schema) if type_kind(f.type) == "float"} | {
        i for i, f in enumerate(actual.schema) if type_kind(f.type) == "float"
    }
    if not ordered:
        return _diff_message(
            "compared as multisets, both sides sorted by every column",
            _multiset_order(rows_a, float_cols),
            _multiset_order(rows_e, float_cols),
            names,
        )
    if not order_by:
        return _diff_message("compared in order", rows_a, rows_e, names)
    missing = [c for c in order_by if c not in names]
    if missing:
        raise ValueError(f"order_by names {missing}, not output columns of {names}")
    key_idx = [names.index(c) for c in order_by]
    keys_a = [tuple(r[i] for i in key_idx) for r in rows_a]
    keys_e = [tuple(r[i] for i in key_idx) for r in rows_e]
    message = _diff_message(
        f"sort keys {list(order_by)} compared in order", keys_a, keys_e, list(order_by)
    )
    if message is not None:
        return message
    # The keys match position by position, so the expected side's runs of equal keys
    # are the actual side's too; inside a run, rows may come in any order.
    sorted_a: list[tuple[Any, ...]] = []
    sorted_e: list[tuple[Any, ...]] = []
    for start, end in _runs(keys_e):
        sorted_a += _multiset_order(rows_a[start:end], float_cols)
        sorted_e += _multiset_order(rows_e[start:end], float_cols)
    return _diff_message(
        f"ordered by {list(order_by)}, rows with equal keys compared as multisets",
        sorted_a,
        sorted_e,
        names,
    )


def assert_same_result(
    actual: pa.Table,
    expected: pa.Table,
    ordered: bool,
    *,
    order_by: Sequence[str] = (),
    check_names: bool = True,
) -> None:
    """Fail with the first differing rows unless ``actual`` matches ``expected``.

    Args:
        actual: the answer under test (mangonel's).
        expected: the reference answer (DuckDB's).
        ordered: whether row order is part of the answer (the query has an ORDER BY).
        order_by: the output columns of the ORDER BY; rows tied on all of them may
            come in any order. Empty with ``ordered=True``: every row's position counts.
        check_names: compare column names too.
    """
    message = compare_results(
        actual, expected, ordered=ordered, order_by=order_by, check_names=check_names
    )
    if message is not None:
        raise AssertionError(message)


# ------------------------------------------------------------------------ explain

_STAGE_TOTAL = re.compile(r"\b(\d+)\s+stages?\b|\bstages?\s*[:=]\s*(\d+)", re.IGNORECASE)
_STAGE_HEADER = re.compile(r"^\W*stage\s*#?\s*(\d+)\b", re.IGNORECASE | re.MULTILINE)


def explain_stage_count(text: str) -> int:
    """The number of stages an ``explain`` text describes.

    Takes the stated total ("Distributed plan: 5 stages", "stages: 5") and checks it
    against the distinct stage headers ("Stage 3 ...") when both are present;
    without a total, counts the headers.
    """
    headers = len(set(_STAGE_HEADER.findall(text)))
    total = _STAGE_TOTAL.search(text)
    if total is None:
        return headers
    stated = int(total.group(1) or total.group(2))
    if headers and headers != stated:
        raise ValueError(f"explain states {stated} stages but describes {headers}:\n{text}")
    return stated


def explain_fallback(text: str) -> str | None:
    """Why the plan an ``explain`` text describes runs the whole query as one task over
    its tables (the planner's fallback, ``DistributedPlan.fallback``), or ``None``
    where the planner split it. A planned query may be one stage too, so a stage
    count cannot tell them apart."""
    from mangonel.plan.explain import FALLBACK_NOTE

    for line in text.splitlines():
        if line.startswith(FALLBACK_NOTE + ": "):
            return line[len(FALLBACK_NOTE) + 2 :]
    return None


def assert_fallback_as_listed(what: str, text: str, listed: dict[Any, str], key: Any) -> None:
    """The ``explain`` text of ``what`` falls back to one task exactly where ``key`` is in
    ``listed`` (a suite's queries known to fall back, each with the reason): a new
    fallback fails, and so does a listed query the planner now splits."""
    why = explain_fallback(text)
    if key in listed:
        assert why is not None, f"{what} no longer falls back ({listed[key]}): unlist it"
    else:
        assert why is None, f"{what} runs whole in one task, not distributed: {why}\n{text}"


# ------------------------------------------------------------------------ polling


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll ``predicate`` until it returns something true; return that.

    Raises:
        AssertionError: ``timeout`` seconds passed first; the message says ``what``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting until {what}")
        time.sleep(0.02)


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP): state ``T`` in ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def most_at_once(attempts: list[dict[str, Any]]) -> int:
    """The most of a job's task ``attempts`` (``/api/jobs/<id>``'s) that ran at one
    time, by the scheduler's clock (an attempt ends when its report arrives; what
    that event launched starts then)."""
    edges = sorted(
        [(a["launched_at"] + a["elapsed_s"], -1) for a in attempts]
        + [(a["launched_at"], 1) for a in attempts]
    )
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
"""Debian's browser and its driver (``scripts/install-system-deps.sh``)."""


@contextlib.contextmanager
def headless_chromium(page_load_timeout_s: float) -> Iterator[Any]:
    """A Selenium driver of headless Chromium, quit on exit; the test fails (never
    skips) where the browser or its driver is missing."""
    import pytest  # the benchmarks import this module too, without a test run

    # Selenium must not look for (or download) a browser or a driver of its own.
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            pytest.fail(f"{path} is missing: run scripts/install-system-deps.sh (as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,900",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(page_load_timeout_s)
    try:
        yield driver
    finally:
        driver.quit()
