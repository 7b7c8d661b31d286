"""Tables written in the order of a key: aggregates on it where it is read, and joins
that read only the row groups of the other side a task's keys may meet."""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import replace
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result
from plan_runner import run_plan

from mangonel.catalog import Table, load_table
from mangonel.plan.physical import DistributedPlan, Stage
from mangonel.plan.planner import PlannerConfig, plan_query
from mangonel.task import OutputKind

# 8 scan tasks of f (one row group each), 2 of d
CONFIG = PlannerConfig(split_rows=5_000)
FACT_ROWS = 40_000
KEYS = 10_000


def _write(path: Path, columns: dict[str, list[object]], group_rows: int) -> None:
    pq.write_table(pa.table(columns), path, row_group_size=group_rows)


def _catalog(
    tmp_path: Path, dim_keys: list[int], fact_keys: list[int | None] | None = None
) -> dict[str, Table]:
    fact = fact_keys if fact_keys is not None else [i // 4 for i in range(FACT_ROWS)]
    _write(tmp_path / "f.parquet", {"k": fact, "v": list(range(FACT_ROWS))}, 5_000)
    _write(tmp_path / "d.parquet", {"k": dim_keys, "w": [k % 13 for k in dim_keys]}, 1_000)
    return {t: load_table(t, str(tmp_path / f"{t}.parquet")) for t in ("f", "d")}


def _check(plan: DistributedPlan, tmp_path: Path, sql: str) -> None:
    con = duckdb.connect()
    for t in ("f", "d"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{tmp_path / t}.parquet')")
    assert_same_result(run_plan(plan), con.sql(sql).to_arrow_table(), ordered=False)


def _sliced(plan: DistributedPlan) -> list[Stage]:
    """Stages whose tasks each read their own row groups of a joined table."""
    return [s for s in plan.stages if any(len(side.task_splits) > 1 for side in s.side_scans)]


def test_row_groups_carry_the_exact_ranges_of_integer_and_date_columns(tmp_path: Path) -> None:
    days = [dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in range(4)]
    table = pa.table(
        {
            "i": [5, 1, None, 9],
            "d": days,
            "s": ["a", "b", "c", "d"],
            "x": pa.array([1, 2, 3, 4], pa.decimal128(10, 2)),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    first, second = load_table("t", str(tmp_path / "t.parquet")).row_groups
    assert first.ranges == {"i": (1, 5, False), "d": (days[0], days[1], False)}
    assert second.ranges["i"] == (9, 9, True)  # a NULL there: not grouped in place
    assert "s" not in second.ranges and "x" not in second.ranges


def test_an_aggregate_on_a_key_each_task_holds_whole_runs_where_it_is_read(
    tmp_path: Path,
) -> None:
    catalog = _catalog(tmp_path, list(range(KEYS)))
    sql = "SELECT k, sum(v) AS s, count(*) AS n FROM f GROUP BY k"
    plan = plan_query(sql, catalog, CONFIG)
    assert not any(s.output.kind is OutputKind.HASH for s in plan.stages), "an exchange"
    assert plan.stages[0].num_tasks == 8 and "partial" not in plan.stages[0].label
    _check(plan, tmp_path, sql)


@pytest.mark.parametrize(
    ("fact_keys", "scan_label"),
    [
        # no order: every task has most keys, a partial aggregate would keep 79% of
        # its rows (``PARTIAL_KEEPS``), and the rows are hashed whole
        ([i * 7919 % KEYS for i in range(FACT_ROWS)], "scan f"),
        # a NULL in each task's run: not in place, but each task meets its 1 250
        # keys only (``KeyRanges.spans``), a quarter of its rows
        (
            [None if i % 5_000 == 0 else i // 4 for i in range(FACT_ROWS)],
            "scan f → partial aggregate",
        ),
    ],
    ids=["unordered", "nulls"],
)
def test_an_aggregate_on_a_key_the_tasks_share_crosses_an_exchange(
    tmp_path: Path, fact_keys: list[int | None], scan_label: str
) -> None:
    catalog = _catalog(tmp_path, list(range(KEYS)), fact_keys)
    sql = "SELECT k, sum(v) AS s, count(*) AS n FROM f GROUP BY k"
    plan = plan_query(sql, catalog, CONFIG)
    assert plan.stages[0].label == scan_label
    assert any(s.output.kind is OutputKind.HASH for s in plan.stages)
    _check(plan, tmp_path, sql)


JOINS = {
    "inner": "SELECT f.k, sum(f.v) AS s, max(d.w) AS w FROM f JOIN d ON f.k = d.k "
    "WHERE d.w < 7 GROUP BY f.k",
    "inner, grouped on the other side's key": "SELECT d.k, count(*) AS n FROM f "
    "JOIN d ON f.k = d.k GROUP BY d.k",
    "left": "SELECT f.k, f.v, d.w FROM f LEFT JOIN d ON f.k = d.k AND d.w < 3",
    "semi": "SELECT f.k, f.v FROM f WHERE EXISTS (SELECT 1 FROM d WHERE d.k = f.k AND d.w = 5)",
    "anti": "SELECT f.k, f.v FROM f WHERE NOT EXISTS (SELECT 1 FROM d WHERE d.k = f.k AND d.w = 5)",
}


@pytest.mark.parametrize("sql", JOINS.values(), ids=JOINS.keys())
def test_two_tables_in_key_order_join_in_the_scan_tasks(tmp_path: Path, sql: str) -> None:
    catalog = _catalog(tmp_path, list(range(KEYS)))
    plan = plan_query(sql, catalog, CONFIG)
    (stage,) = _sliced(plan)
    assert stage.scan is not None and stage.scan.table == "f" and stage.num_tasks == 8
    (side,) = stage.side_scans
    assert side.table == "d" and len(side.task_splits) == 8
    # each task reads the one or two of d's 10 row groups its 1 250 keys lie in
    groups = [sum(len(s.row_groups) for s in task) for task in side.task_splits]
    assert max(groups) <= 2, groups
    assert not any(s.output.kind is OutputKind.HASH for s in plan.stages), "an exchange"
    _check(plan, tmp_path, sql)


def test_a_bigger_table_is_joined_into_the_tasks_of_a_filtered_scan_by_key_ranges(
    tmp_path: Path,
) -> None:
    # f kept to 10 in 97 of its rows is estimated smaller than d, but it is in
    # 8 tasks and d in 2: d's row groups go into f's tasks (TPC-H q12's orders
    # into its filtered line items at SF10), where f was broadcast into d's tasks
    # after a stage of its own.
    keys = [i // 4 for i in range(FACT_ROWS)]
    _write(tmp_path / "f.parquet", {"k": keys, "c": [i % 97 for i in range(FACT_ROWS)]}, 5_000)
    _write(
        tmp_path / "d.parquet", {"k": list(range(KEYS)), "w": [k % 13 for k in range(KEYS)]}, 1_000
    )
    catalog = {t: load_table(t, str(tmp_path / f"{t}.parquet")) for t in ("f", "d")}
    sql = "SELECT d.w, count(*) AS n FROM f JOIN d ON f.k = d.k WHERE f.c < 10 GROUP BY d.w"
    plan = plan_query(sql, catalog, CONFIG)
    (stage,) = _sliced(plan)
    assert stage.scan is not None and stage.scan.table == "f" and stage.num_tasks == 8
    (side,) = stage.side_scans
    assert side.table == "d" and len(side.task_splits) == 8
    assert plan.stages[0] is stage, "a stage before the join"
    _check(plan, tmp_path, sql)


def test_a_table_joins_by_key_range_into_spread_tasks_rather_than_wait_for_a_broadcast_stage(
    tmp_path: Path,
) -> None:
    # TPC-H q12 at SF1 on two hosts of one core: the filtered line items in two
    # tasks, ``orders`` in one. By bytes alone, the line items went from a stage
    # of their own into the one ``orders`` task, which then scanned, joined and
    # aggregated every order while the other host idled. That stage costs what
    # an exchange's does (``JoinPlacer._gathered``); reading d by key range in f's
    # tasks reads a third of it twice here (d's middle row group; 9 % of
    # ``orders`` at SF1) and needs no stage.
    keys = [i // 4 for i in range(FACT_ROWS)]
    _write(tmp_path / "f.parquet", {"k": keys, "v": list(range(FACT_ROWS))}, 5_000)
    wide = ["x" * 90 + str(k % 13) for k in range(KEYS)]
    _write(tmp_path / "d.parquet", {"k": list(range(KEYS)), "w": wide}, 3_334)
    catalog = {t: load_table(t, str(tmp_path / f"{t}.parquet")) for t in ("f", "d")}
    sql = "SELECT d.w, count(*) AS n FROM f JOIN d ON f.k = d.k WHERE f.v % 97 = 3 GROUP BY d.w"
    two_hosts = PlannerConfig(split_rows=20_000, slots=2, parallel=2)
    plan = plan_query(sql, catalog, two_hosts)
    (stage,) = _sliced(plan)
    assert plan.stages[0] is stage and stage.num_tasks == 2
    assert stage.scan is not None and stage.scan.table == "f"
    assert [s.num_tasks for s in plan.stages] == [2, 1]
    assert plan.final.scan is None and not plan.final.side_scans, plan.final.label
    _check(plan, tmp_path, sql)
    # One host runs one task at full speed at a time: bytes alone decide there.
    one_host = replace(two_hosts, parallel=1)
    plan = plan_query(sql, catalog, one_host)
    assert not _sliced(plan)
    assert plan.final.scan is not None and plan.final.scan.table == "d", plan.final.label
    _check(plan, tmp_path, sql)


def test_row_groups_whose_ranges_overlap_still_give_each_row_all_its_matches(
    tmp_path: Path,
) -> None:
    # d roughly in key order: each row group's range reaches into its neighbours'
    rng = random.Random(7)
    keys = sorted(range(KEYS), key=lambda k: k + rng.randint(0, 2_500))
    catalog = _catalog(tmp_path, keys)
    sql = JOINS["inner"]
    plan = plan_query(sql, catalog, CONFIG)
    (stage,) = _sliced(plan)
    (side,) = stage.side_scans
    groups = [sum(len(s.row_groups) for s in task) for task in side.task_splits]
    assert 2 < max(groups) < 10, groups
    _check(plan, tmp_path, sql)


def test_a_table_in_no_order_is_not_read_by_key_ranges(tmp_path: Path) -> None:
    keys = list(range(KEYS))
    random.Random(3).shuffle(keys)
    catalog = _catalog(tmp_path, keys)
    sql = JOINS["inner"]
    plan = plan_query(sql, catalog, CONFIG)
    assert not _sliced(plan)
    _check(plan, tmp_path, sql)


def test_a_table_of_several_files_is_read_by_the_row_groups_of_each(tmp_path: Path) -> None:
    _catalog(tmp_path, list(range(KEYS)))
    # d again as a directory of two files, each in key order
    (tmp_path / "d.parquet").unlink()
    folder = tmp_path / "dparts"
    folder.mkdir()
    half = KEYS // 2
    for i, keys in enumerate((list(range(half)), list(range(half, KEYS)))):
        _write(folder / f"part-{i}.parquet", {"k": keys, "w": [k % 13 for k in keys]}, 1_000)
    catalog = {"f": load_table("f", str(tmp_path / "f.parquet")), "d": load_table("d", str(folder))}
    sql = JOINS["inner"]
    plan = plan_query(sql, catalog, CONFIG)
    (stage,) = _sliced(plan)
    (side,) = stage.side_scans
    files = {s.path for task in side.task_splits for s in task}
    assert len(files) == 2 and all(len(task) == 1 for task in side.task_splits)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW f AS SELECT * FROM read_parquet('{tmp_path / 'f.parquet'}')")
    con.execute(f"CREATE VIEW d AS SELECT * FROM read_parquet('{folder}/*.parquet')")
    assert_same_result(run_plan(plan), con.sql(sql).to_arrow_table(), ordered=False)
