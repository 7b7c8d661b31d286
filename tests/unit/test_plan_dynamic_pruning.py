"""Plan-time pruning of a table's row groups by a filtered dimension's key range
(``plan.dynamic_pruning``, ``plan.probe``).

The pure parts (which row groups a range keeps, when the footers say pruning could
drop any, which filters are deterministic) are checked directly; the rule is
checked through ``plan_query`` on small tables (``pruning_tables``): where it
prunes, EXPLAIN says so and the plan, run task by task (``plan_runner``), answers
as DuckDB does; where it must not (an outer join keeping the table, a filter that
is not deterministic, a dimension too big, a table read by another reader too),
every row group is read. The probe's DuckDB reads no file itself.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result
from plan_runner import run_plan
from pruning_tables import INNER, ROW_GROUPS, write_tables

from mangonel.catalog import RowGroup, Table, load_table
from mangonel.plan import dynamic_pruning, planner
from mangonel.plan.dynamic_pruning import could_drop, deterministic, kept_groups, narrowed
from mangonel.plan.estimate import scan_size
from mangonel.plan.explain import render
from mangonel.plan.physical import DistributedPlan
from mangonel.plan.planner import PlanCache, PlannerConfig, plan_query
from mangonel.plan.probe import KeyRange, Probe
from mangonel.sql.frontend import parse

CONFIG = PlannerConfig(partitions=2, partition_bytes=0, split_rows=2_000)
"""Two row groups a task: ``sales`` is 10 tasks whole."""


def _groups(*ranges: tuple[int, int] | None) -> list[RowGroup]:
    return [
        RowGroup("f", i, 100 + i, 800, {} if r is None else {"k": (r[0], r[1], False)})
        for i, r in enumerate(ranges)
    ]


# ------------------------------------------------------------------ pure parts


def test_a_range_keeps_the_row_groups_it_meets_and_those_without_a_range() -> None:
    groups = _groups((0, 9), (10, 19), (20, 29), None, (30, 39))
    kept = kept_groups(groups, "k", KeyRange(15, 22, 8))
    assert [g.index for g in kept] == [1, 2, 3]
    # Bounds that touch a row group's ends keep it.
    assert [g.index for g in kept_groups(groups, "k", KeyRange(9, 30, 2))] == [0, 1, 2, 3, 4]


def test_an_empty_dimension_or_a_range_no_row_group_meets_keeps_the_smallest() -> None:
    groups = _groups((0, 9), (10, 19), (20, 29))
    assert [g.index for g in kept_groups(groups, "k", KeyRange(None, None, 0))] == [0]
    assert [g.index for g in kept_groups(groups, "k", KeyRange(100, 200, 3))] == [0]


def test_values_of_another_kind_keep_the_row_group() -> None:
    groups = _groups((0, 9), (10, 19))
    found = KeyRange(dt.date(2000, 1, 1), dt.date(2000, 2, 1), 3)
    assert len(kept_groups(groups, "k", found)) == 2


def test_pruning_could_drop_only_where_two_row_groups_do_not_overlap() -> None:
    assert could_drop(_groups((0, 9), (10, 19)), "k")
    assert could_drop(_groups((0, 12), (5, 15), (14, 20)), "k")  # 0-12 and 14-20
    # Every row group spans a common value (a table in no order of the key).
    assert not could_drop(_groups((0, 99), (1, 98), (2, 100)), "k")
    assert not could_drop(_groups((0, 9)), "k")
    assert not could_drop(_groups((0, 9), (10, 19)), "other")


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("d >= DATE '2000-01-01' AND d < CAST('2000-02-01' AS DATE) + INTERVAL 3 DAY", True),
        ("y IN (2000, 2001) OR (m BETWEEN 1 AND 3 AND s LIKE 'a%' AND s IS NOT NULL)", True),
        ("upper(s) = 'A' AND coalesce(y, 0) + 1 > 5", True),
        ("y > random() * 2000", False),
        ("d < current_date", False),
        ("y = my_function(2000)", False),
        ("k IN (SELECT * FROM __sq1)", False),
    ],
)
def test_only_deterministic_filters_are_evaluated(condition: str, expected: bool) -> None:
    select = parse(f"SELECT 1 FROM t WHERE {condition}", {"t", "__sq1"}).query
    where = select.args["where"].this
    assert deterministic(where) is expected


def test_narrowed_statistics_follow_the_kept_row_groups(catalog_: dict[str, Table]) -> None:
    sales = catalog_["sales"]
    kept = list(sales.row_groups[2:4])
    table = narrowed(sales, kept)
    assert table.rows == 2_000
    assert (table.stats["s_date_sk"].low, table.stats["s_date_sk"].high) == (100, 199)
    assert table.stats["s_date_sk"].nulls == 0
    assert table.distinct_counts["s_date_sk"][0] == 100
    # The estimate of a scan of it follows: 2 000 rows, not 20 000.
    assert scan_size(table, "sales", None).rows == 2_000


# ------------------------------------------------------------------- the rule


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_tables(tmp_path_factory.mktemp("pruning"))


@pytest.fixture(scope="module")
def catalog_(tables: dict[str, Path]) -> dict[str, Table]:
    return {name: load_table(name, str(path)) for name, path in tables.items()}


@pytest.fixture(scope="module")
def ref(tables: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    for name, path in tables.items():
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
    yield con
    con.close()


def _sales_scan_text(plan: DistributedPlan) -> str:
    """EXPLAIN's lines about ``sales`` (its scan, and what was pruned from it)."""
    lines = render(plan, with_sql=False).splitlines()
    out = []
    for i, line in enumerate(lines):
        if "table sales" in line:
            out.append(line)
            if i + 1 < len(lines) and "row groups dropped" in lines[i + 1]:
                out.append(lines[i + 1].strip())
    return "\n".join(out)


def _row_groups_read(plan: DistributedPlan) -> int:
    return sum(
        len(split.row_groups) or pq.ParquetFile(split.path).metadata.num_row_groups
        for stage in plan.stages
        for scan in [stage.scan, *stage.side_scans]
        if scan is not None and scan.table == "sales"
        for task in scan.task_splits
        for split in task
    )


def _check(
    sql: str, catalog: dict[str, Table], ref: duckdb.DuckDBPyConnection, empty: bool = False
) -> DistributedPlan:
    plan = plan_query(sql, catalog, CONFIG)
    assert plan.notes == ()  # distributed, not run whole
    expected = ref.sql(sql).to_arrow_table()
    assert (expected.num_rows == 0) is empty
    assert_same_result(run_plan(plan), expected, ordered=False)
    return plan


def test_an_inner_join_with_a_filtered_dimension_prunes_the_table(
    catalog_: dict[str, Table], ref: duckdb.DuckDBPyConnection
) -> None:
    plan = _check(INNER, catalog_, ref)
    text = _sales_scan_text(plan)
    # Keys 60..105 lie in row groups 1 and 2; row group 19 (NULL keys only) has no
    # footer range and is kept.
    assert "17 of 20 row groups dropped at plan time" in text, text
    assert "s_date_sk outside dates's d_date_sk range 60..105 after its filter" in text
    assert _row_groups_read(plan) == 3
    assert "3000 rows in 2 split(s)" in text  # splits sized from the kept rows


def test_a_semi_join_prunes_and_a_null_dimension_key_is_ignored(
    catalog_: dict[str, Table], ref: duckdb.DuckDBPyConnection
) -> None:
    # 2001's keys are 366..730; the dimension's NULL key (also 2001) meets nothing.
    sql = """SELECT count(*) AS n, sum(s_qty) AS q FROM sales
             WHERE EXISTS (SELECT 1 FROM dates WHERE d_date_sk = s_date_sk AND d_year = 2001)"""
    plan = _check(sql, catalog_, ref)
    assert "range 366..730" in _sales_scan_text(plan)
    assert _row_groups_read(plan) == 9  # 7..14 and the NULL one


def test_an_empty_filtered_dimension_keeps_one_row_group_and_an_empty_answer(
    catalog_: dict[str, Table], ref: duckdb.DuckDBPyConnection
) -> None:
    # Empty is the point: no date of 1999 exists, so the join keeps no row.
    sql = """SELECT s_item, sum(s_qty) AS q FROM sales JOIN dates ON s_date_sk = d_date_sk
             WHERE d_year = 1999 GROUP BY s_item"""
    plan = _check(sql, catalog_, ref, empty=True)
    assert "19 of 20 row groups dropped" in _sales_scan_text(plan)
    assert "dates's d_date_sk is empty after its filter" in _sales_scan_text(plan)
    assert _row_groups_read(plan) == 1


def test_the_pruning_of_two_dimensions_is_combined(
    catalog_: dict[str, Table], ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """SELECT count(*) AS n FROM sales
             JOIN dates d1 ON s_date_sk = d1.d_date_sk
             JOIN dates d2 ON s_date_sk = d2.d_date_sk
             WHERE d1.d_year = 2001
               AND d2.d_date BETWEEN DATE '2000-12-01' AND DATE '2001-02-28'"""
    plan = _check(sql, catalog_, ref)
    # 2001 (366..730: row groups 7 to 14) and the winter (335..424: 6 to 8): 7 and 8,
    # and the one of NULL keys only.
    assert _row_groups_read(plan) == 3, _sales_scan_text(plan)


def test_an_outer_join_keeping_the_table_does_not_prune(
    catalog_: dict[str, Table], ref: duckdb.DuckDBPyConnection
) -> None:
    sql = """SELECT count(*) AS n, count(d_date_sk) AS matched FROM sales
             LEFT JOIN (SELECT * FROM dates WHERE d_year = 2001) d ON s_date_sk = d_date_sk"""
    plan = _check(sql, catalog_, ref)
    assert "dropped" not in _sales_scan_text(plan)
    assert _row_groups_read(plan) == ROW_GROUPS


def test_a_filter_that_is_not_deterministic_is_not_evaluated(
    catalog_: dict[str, Table], ref: duckdb.DuckDBPyConnection
) -> None:
    # ``d_date_sk + random() >= 0`` holds on every row (keys are not negative), so
    # the answer is known; but the filter is not deterministic, and the dimension
    # it is part of is not evaluated while planning.
    sql = """SELECT count(*) AS n FROM sales JOIN dates ON s_date_sk = d_date_sk
             WHERE d_year = 2001 AND d_date_sk + random() >= 0"""
    plan = _check(sql, catalog_, ref)
    assert _row_groups_read(plan) == ROW_GROUPS
    # The same query without it is pruned.
    plan = _check(sql.replace("AND d_date_sk + random() >= 0", ""), catalog_, ref)
    assert _row_groups_read(plan) == 9


def test_a_dimension_too_big_is_not_evaluated(
    catalog_: dict[str, Table], ref: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dynamic_pruning, "DIMENSION_BYTES", 1_000)  # dates reads ~10 KB
    plan = _check(INNER, catalog_, ref)
    assert _row_groups_read(plan) == ROW_GROUPS


def test_a_filter_keeping_most_of_the_dimension_is_not_evaluated(
    catalog_: dict[str, Table], ref: duckdb.DuckDBPyConnection
) -> None:
    # Before June 2001: 517 of the 1 201 dates, more than DIMENSION_KEEPS by the
    # estimates. Evaluated, it would drop 8 row groups; the cheap check says that a
    # filter keeping that much most often keeps keys from all over the range.
    sql = """SELECT count(*) AS n FROM sales JOIN dates ON s_date_sk = d_date_sk
             WHERE d_date < DATE '2001-06-01'"""
    plan = _check(sql, catalog_, ref)
    assert _row_groups_read(plan) == ROW_GROUPS


class _Recorder:
    """A range source that counts what the rule asks (and answers nothing)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def key_range(self, table: Table, columns: object, sql: str, key: str) -> KeyRange | None:
        self.asked.append(f"{table.name}.{key}")
        return None


def test_nothing_is_evaluated_where_the_footers_say_nothing_could_drop(
    catalog_: dict[str, Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _Recorder()
    monkeypatch.setattr(planner, "_probe", lambda tables: recorder)
    # Every row group of sales holds every s_item (0..6): no range of items could
    # drop one, and the items are not read.
    plan_query(
        "SELECT count(*) AS n FROM sales JOIN items ON s_item = i_item WHERE i_class = 'class1'",
        catalog_,
        CONFIG,
    )
    assert recorder.asked == []
    plan_query(INNER, catalog_, CONFIG)
    assert recorder.asked == ["dates.dates.d_date_sk"]


def test_a_table_another_reader_needs_whole_is_not_pruned(
    catalog_: dict[str, Table], ref: duckdb.DuckDBPyConnection
) -> None:
    # The CTE joins with a filter and is read twice: computed once for both readers
    # (``pushdown``'s shared nodes), and the second reader needs all of its rows.
    sql = """WITH s AS (SELECT s_date_sk, s_qty FROM sales JOIN items ON s_item = i_item
                        WHERE i_class <> 'class9')
             SELECT (SELECT count(*) FROM s JOIN dates ON s_date_sk = d_date_sk
                     WHERE d_year = 2001) AS in_2001,
                    (SELECT count(*) FROM s) AS every_sale"""
    plan = _check(sql, catalog_, ref)
    assert _row_groups_read(plan) == ROW_GROUPS


def test_a_probe_that_cannot_read_leaves_the_plan_whole(
    tables: dict[str, Path],
    ref: duckdb.DuckDBPyConnection,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    # The scheduler's host lost the dimension's file (another host's path): the
    # plan reads every row group and says why in the log.
    moved = tmp_path / "dates.parquet"
    moved.write_bytes(tables["dates"].read_bytes())
    catalog = {name: load_table(name, str(path)) for name, path in tables.items()}
    catalog["dates"] = load_table("dates", str(moved))
    moved.unlink()
    with caplog.at_level(logging.WARNING, logger="mangonel.plan.probe"):
        plan = plan_query(INNER, catalog, CONFIG)
    assert _row_groups_read(plan) == ROW_GROUPS
    assert "plan-time pruning skipped" in caplog.text and "dates" in caplog.text


def test_a_cached_plan_is_planned_again_when_its_dimension_file_changes(
    tables: dict[str, Path], tmp_path: Path
) -> None:
    """Pruning depends on the dimension's rows: a plan cache must not keep a plan
    whose dimension file was written again in place (without a new register)."""
    dates = tmp_path / "dates.parquet"
    dates.write_bytes(tables["dates"].read_bytes())
    catalog = {name: load_table(name, str(path)) for name, path in tables.items()}
    catalog["dates"] = load_table("dates", str(dates))
    cache = PlanCache()
    first = cache.plan(INNER, catalog, CONFIG)
    assert first.pruned_by and first.pruned_by[0][0] == str(dates)
    assert cache.plan(INNER, catalog, CONFIG) is first
    # The same rows one day later: keys 59..104 now hold the dates of March.
    shifted = pq.read_table(dates)
    keys = pa.compute.add(shifted.column("d_date_sk"), 1000)
    pq.write_table(shifted.set_column(0, "d_date_sk", keys), dates)
    again = cache.plan(INNER, catalog, CONFIG)
    assert again is not first
    assert "range 1060..1105" in render(again, with_sql=False)
    assert (cache.hits, cache.misses) == (1, 2)


# ------------------------------------------------------------------ lock-down


def test_the_probe_reads_no_file_and_changes_no_setting(
    catalog_: dict[str, Table], tables: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    probe = Probe()
    try:
        dates = catalog_["dates"]
        # The dimension's own rows come in as Arrow: its SQL reads them.
        sql = "SELECT * FROM __dimension WHERE d_year = 2000"
        found = probe.key_range(dates, ["d_date_sk", "d_year"], sql, "d_date_sk")
        assert found is not None and (found.low, found.high, found.keys) == (0, 365, 366)
        assert [f[0] for f in found.files] == [str(tables["dates"])]
        # SQL that names a file, even one of the catalog's, reads nothing.
        for escape in (
            f"SELECT d_date_sk FROM read_parquet('{tables['sales']}')",
            "SELECT 1 AS d_date_sk FROM read_csv('/etc/passwd')",
        ):
            with caplog.at_level(logging.WARNING, logger="mangonel.plan.probe"):
                assert probe.key_range(dates, ["d_date_sk"], escape, "d_date_sk") is None
        assert "Permission Error" in caplog.text
        with pytest.raises(duckdb.Error, match="lock"):
            probe._con.execute("SET enable_external_access = true")
    finally:
        probe.close()
