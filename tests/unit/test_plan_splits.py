"""How scans are cut into tasks (by row group, sized from the bytes read) and how many
partitions an exchange gets (from its estimated bytes)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result, tpch_query
from plan_runner import run_plan

from mangonel.catalog import Table, load_table
from mangonel.plan.config import ONE_WAVE_SPLITS, TWO_TASKS_SPLITS
from mangonel.plan.distribute import stages
from mangonel.plan.planner import PlannerConfig, plan_query


def test_adaptive_split_size_follows_the_bytes_scanned_within_bounds() -> None:
    config = PlannerConfig(split_bytes=64_000_000)
    assert config.split_rows_for(64.0) == 1_000_000  # 64 MB of 64-byte rows
    assert config.split_rows_for(32.0) == 2_000_000  # narrower rows: more per task
    assert config.split_rows_for(1000.0) == 250_000  # wide ones: not below the minimum
    assert config.split_rows_for(1.0) == 4_000_000  # nor above the maximum
    assert PlannerConfig(split_rows=7_500).split_rows_for(64.0) == 7_500


def test_scan_tasks_of_several_waves_are_made_whole_waves_of_fewer_tasks() -> None:
    # 96-byte rows: 2M rows a task by the bytes, so 6M rows are 3 tasks.
    assert PlannerConfig().scan_split_rows(96.0, 6_000_000) == 2_097_152  # slots unknown
    assert PlannerConfig(slots=2).scan_split_rows(96.0, 6_000_000) == 3_000_000  # 2 tasks
    assert PlannerConfig(slots=3).scan_split_rows(96.0, 6_000_000) == 2_097_152  # one wave
    assert PlannerConfig(slots=4).scan_split_rows(96.0, 6_000_000) == 2_097_152  # one wave
    # 10M rows, 5 tasks: 4 of 2.5M on 2 slots (two whole waves), 3 on 3 slots.
    assert PlannerConfig(slots=2).scan_split_rows(96.0, 10_000_000) == 2_500_000
    assert PlannerConfig(slots=3).scan_split_rows(96.0, 10_000_000) == 3_333_334
    # Fewer tasks would be above ``max_split_rows`` (12M in 2 tasks): left as it is.
    assert PlannerConfig(slots=2).scan_split_rows(96.0, 12_000_000) == 2_097_152
    # A split size fixed by the settings is not changed.
    assert PlannerConfig(split_rows=1000, slots=2).scan_split_rows(96.0, 3000) == 1000


def test_a_scan_of_three_tasks_runs_as_two_on_two_slots(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    n = 300_000
    pq.write_table(pa.table({"k": list(range(n))}), path, row_group_size=25_000)
    catalog = {"t": load_table("t", str(path))}
    sql = "SELECT k FROM t WHERE k % 7 = 0"

    def scan_tasks(slots: int) -> list[int]:
        # 8-byte rows: split_bytes of 800 kB is 100k rows a task, 3 tasks.
        config = PlannerConfig(split_bytes=800_000, min_split_rows=1, slots=slots)
        scan = plan_query(sql, catalog, config).stages[0]
        assert scan.scan is not None
        return [sum(split.rows for split in splits) for splits in scan.scan.task_splits]

    assert scan_tasks(0) == [100_000] * 3
    assert scan_tasks(3) == [100_000] * 3
    assert scan_tasks(2) == [150_000] * 2


def test_where_cores_bound_the_tasks_at_once_a_scan_is_whole_waves_of_bigger_tasks() -> None:
    # ``parallel`` below the slots: two slots whose host's cores one task already
    # fills run one task at full speed; a scan is whole waves of that many tasks,
    # each reading up to ``ONE_WAVE_SPLITS`` splits' worth (rows and bytes), and
    # two tasks at least where tasks of ``TWO_TASKS_SPLITS`` splits' worth are several.
    assert (ONE_WAVE_SPLITS, TWO_TASKS_SPLITS) == (16, 4)
    assert PlannerConfig(slots=2, parallel=1).scan_split_rows(16.0, 6_000_000) == 6_000_000
    # 15 splits of 4M rows: one task of 16 splits would do, four of 4 splits are
    # several, so two.
    assert PlannerConfig(slots=2, parallel=1).scan_split_rows(16.0, 60_000_000) == 30_000_000
    # 96-byte rows: four splits' bytes (768 MiB) are 8.4M rows, so 9M rows are 2 tasks.
    assert PlannerConfig(slots=2, parallel=1).scan_split_rows(96.0, 9_000_000) == 4_500_000
    # ... and 16 splits' bytes (3 GiB) 33.5M rows: 200M rows are 6 tasks.
    assert PlannerConfig(slots=2, parallel=1).scan_split_rows(96.0, 200_000_000) == 33_333_334
    # Two of four slots at full speed: 10M rows of 96 bytes in one wave of two.
    assert PlannerConfig(slots=4, parallel=2).scan_split_rows(96.0, 10_000_000) == 5_000_000
    # Every slot at full speed (``parallel`` = slots, hosts of their own cores):
    # each host runs its share of a scan one task after another, so whole waves of
    # bigger tasks too (15 splits -> 2 tasks, one on each of two hosts; 29 -> one
    # wave of 8) ...
    assert PlannerConfig(slots=2, parallel=2).scan_split_rows(16.0, 60_000_000) == 30_000_000
    assert PlannerConfig(slots=8, parallel=8).scan_split_rows(96.0, 60_000_000) == 7_500_000
    # ... and no more tasks than run at once: as before.
    assert PlannerConfig(slots=2, parallel=2).scan_split_rows(16.0, 6_000_000) == 4_000_000
    assert PlannerConfig(slots=2, parallel=2).scan_split_rows(96.0, 6_000_000) == 3_000_000
    # As many tasks as run at once, or fewer: as before.
    assert PlannerConfig(slots=4, parallel=2).scan_split_rows(16.0, 6_000_000) == 4_000_000
    # Never smaller tasks than the slots alone make: rows too wide (or splits too
    # small) for the splits' bytes to reach the minimum split.
    config = PlannerConfig(slots=2, parallel=1, split_bytes=1 << 20)
    assert config.scan_split_rows(26.0, 600_000) == 300_000  # as with parallel unknown
    assert PlannerConfig(slots=4, parallel=1).scan_split_rows(16000.0, 2_000_000) == 250_000
    # Not unknown slots, nor a split size the settings fix.
    assert PlannerConfig(parallel=1).scan_split_rows(16.0, 6_000_000) == 4_000_000
    config = PlannerConfig(split_rows=1000, slots=2, parallel=1)
    assert config.scan_split_rows(16.0, 3000) == 1000


def test_a_scan_in_one_wave_gives_the_same_rows(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-H q06 at SF 0.1 (600k rows) with splits of at most 160k rows: several tasks on
    # two slots, one where one task runs at full speed; the same answer as DuckDB's.
    sql = tpch_query(6)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    tasks = {}
    for parallel in (2, 1):
        config = PlannerConfig(max_split_rows=160_000, slots=2, parallel=parallel)
        plan = plan_query(sql, catalog, config)
        tasks[parallel] = plan.stages[0].num_tasks
        assert_same_result(run_plan(plan), expected, ordered=False)
    assert tasks[2] > 1 and tasks[1] == 1, tasks


def test_where_hosts_run_tasks_at_once_a_scan_of_one_split_is_spread_over_them() -> None:
    # Two hosts of one core each (``parallel`` 2): 1.5M rows of 96 bytes are one
    # split by the bytes (192 MiB a task), and would keep the second host idle.
    assert PlannerConfig(slots=2, parallel=2).scan_split_rows(96.0, 1_500_000) == 750_000
    assert PlannerConfig(slots=4, parallel=4).scan_split_rows(96.0, 1_500_000) == 375_000
    # One task at full speed at a time (one host), or the count unknown: one split.
    assert PlannerConfig(slots=2, parallel=1).scan_split_rows(96.0, 1_500_000) == 2_097_152
    assert PlannerConfig(slots=2).scan_split_rows(96.0, 1_500_000) == 2_097_152
    # Each share reads at least ``spread_bytes`` (32 MiB here): 600k rows of 128
    # bytes are two tasks of 300k on four hosts, and 1.5M rows of 16 bytes (23 MiB)
    # stay one task, where the fixed costs of a second outweigh its core.
    wide = 32 << 20
    assert (
        PlannerConfig(slots=4, parallel=4, spread_bytes=wide).scan_split_rows(128.0, 600_000)
        == 300_000
    )
    assert (
        PlannerConfig(slots=2, parallel=2, spread_bytes=wide).scan_split_rows(16.0, 1_500_000)
        == 4_000_000
    )
    # Enough splits already: as before.
    assert PlannerConfig(slots=2, parallel=2).scan_split_rows(96.0, 6_000_000) == 3_000_000
    # A split size the settings fix is kept.
    assert (
        PlannerConfig(split_rows=2_000_000, slots=2, parallel=2).scan_split_rows(96.0, 1_500_000)
        == 2_000_000
    )


def test_a_spread_scan_gives_the_same_rows(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-H q13 at SF 0.1 (150k orders in two row groups): one task where one task
    # runs at full speed; on two hosts (``parallel`` 2), with thresholds scaled
    # down to SF 0.1, the orders scan is two tasks, and the answer is DuckDB's.
    sql = tpch_query(13)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    widest = {}
    for parallel in (1, 2):
        config = PlannerConfig(slots=2, parallel=parallel, spread_bytes=1 << 20)
        plan = plan_query(sql, catalog, config)
        widest[parallel] = max(s.num_tasks for s in plan.stages)
        assert_same_result(run_plan(plan), expected, ordered=True)
    assert widest == {1: 1, 2: 2}, widest


def test_exchanges_get_partitions_by_their_estimated_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    n = 400_000
    # k in no order: every row group holds keys of the whole range, so the groups are
    # not each in one scan task (``test_plan_clustered`` has the ordered case)
    keys = [i * 7919 % n for i in range(n)]
    pq.write_table(
        pa.table({"k": keys, "v": [i % 7 for i in range(n)]}), path, row_group_size=50_000
    )
    catalog = {"t": load_table("t", str(path))}
    # 8 scan tasks of k (3.2 MB). k is unique: a partial aggregate would keep every
    # row (``PARTIAL_KEEPS``), so the rows of k are hashed whole, all 3.2 MB of them.
    sql = "SELECT k, count(*) AS c FROM t GROUP BY k"

    def aggregate_tasks(partitions: int, partition_bytes: int) -> int:
        config = PlannerConfig(partitions, partition_bytes, split_rows=50_000)
        plan = plan_query(sql, catalog, config)
        return next(s.num_tasks for s in plan.stages if s.label.startswith("aggregate"))

    assert aggregate_tasks(4, 64 << 20) == 1
    assert aggregate_tasks(4, 2 << 20) == 2
    assert aggregate_tasks(4, 1200 << 10) == 3
    assert aggregate_tasks(4, 512 << 10) == 4
    assert aggregate_tasks(3, 512 << 10) == 3  # never more than ``partitions``
    assert aggregate_tasks(4, 0) == 4  # 0: always ``partitions``


def test_where_hosts_run_tasks_at_once_an_exchange_is_spread_over_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Several hosts running a task each at once: an exchange of at least
    # ``SPREAD_PARTITION_BYTES`` a partition gets one for each of them, whatever its
    # size by ``partition_bytes`` (the scheduler merges partitions that turn out
    # small). The floor (4 MiB) is scaled down to this 3.2 MB exchange.
    path = tmp_path / "t.parquet"
    n = 400_000
    keys = [i * 7919 % n for i in range(n)]
    pq.write_table(
        pa.table({"k": keys, "v": [i % 7 for i in range(n)]}), path, row_group_size=50_000
    )
    catalog = {"t": load_table("t", str(path))}
    sql = "SELECT k, count(*) AS c FROM t GROUP BY k"

    def aggregate_tasks(parallel: int, floor: int) -> int:
        monkeypatch.setattr(stages, "SPREAD_PARTITION_BYTES", floor)
        config = PlannerConfig(4, 64 << 20, split_rows=50_000, slots=4, parallel=parallel)
        plan = plan_query(sql, catalog, config)
        return next(s.num_tasks for s in plan.stages if s.label.startswith("aggregate"))

    assert stages.SPREAD_PARTITION_BYTES == 4 << 20
    assert aggregate_tasks(4, 512 << 10) == 4
    assert aggregate_tasks(4, 1200 << 10) == 2  # 3.2 MB: two shares of at least 1200 KiB
    assert aggregate_tasks(4, 4 << 20) == 1  # too small to spread
    assert aggregate_tasks(1, 512 << 10) == 1  # one task at full speed at a time


def test_exchanges_of_several_waves_are_sized_to_whole_waves_of_the_slots(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.parquet"
    n = 400_000
    keys = [i * 7919 % n for i in range(n)]
    pq.write_table(
        pa.table({"k": keys, "v": [i % 7 for i in range(n)]}), path, row_group_size=50_000
    )
    catalog = {"t": load_table("t", str(path))}
    # As above: 3.2 MB hashed whole, 3 partitions of 1200 KiB by the bytes alone.
    sql = "SELECT k, count(*) AS c FROM t GROUP BY k"

    def aggregate_tasks(partitions: int, slots: int) -> int:
        config = PlannerConfig(partitions, 1200 << 10, split_rows=50_000, slots=slots)
        plan = plan_query(sql, catalog, config)
        return next(s.num_tasks for s in plan.stages if s.label.startswith("aggregate"))

    assert aggregate_tasks(4, slots=0) == 3  # the slots unknown: the bytes decide
    assert aggregate_tasks(4, slots=2) == 4  # 2 waves of 2, not 2 and then 1
    assert aggregate_tasks(3, slots=2) == 2  # 4 is above ``partitions``: one wave
    assert aggregate_tasks(4, slots=3) == 3  # one whole wave already
    assert aggregate_tasks(4, slots=8) == 3  # one wave: more would only add fixed costs
    assert aggregate_tasks(4, slots=1) == 3  # every count is whole waves of one slot


def test_a_partial_aggregate_is_estimated_from_the_groups_each_task_meets(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.parquet"
    n = 400_000
    # k unique and in no order, g of 7 values, r of 100k (4 rows each), h one value;
    # 8 scan tasks
    pq.write_table(
        pa.table(
            {
                "k": [i * 7919 % n for i in range(n)],
                "g": [i % 7 for i in range(n)],
                "r": [i * 7919 % n // 4 for i in range(n)],
                "h": [1] * n,
            }
        ),
        path,
        row_group_size=50_000,
    )
    catalog = {"t": load_table("t", str(path))}
    config = PlannerConfig(16, 512 << 10, split_rows=50_000)

    def partitions(sql: str) -> int:
        plan = plan_query(sql, catalog, config)
        (partial,) = [s for s in plan.stages if "partial aggregate" in s.label]
        return partial.output.partitions

    # 7 groups: 7 partial rows a task, 56 bytes each; not a quarter of 3.2 MB (TPC-H
    # q01's four groups had two partitions and a stage more for them)
    assert partitions("SELECT g, count(*) AS c FROM t GROUP BY g") == 1
    # 100k groups of 4 rows: a task of 50k rows meets 39k of them, so the partial rows
    # are 79% of the input (9.6 MB: 7.6 MB), not a quarter (TPC-H q18's lineitem by
    # order in a random order). Two keys, or it would be hashed whole (below).
    assert partitions("SELECT r, h, sum(k) AS s FROM t GROUP BY r, h") == 15
    # a key whose count is unknown (an expression) keeps the quarter of 3.2 MB
    assert partitions("SELECT r % 1000 AS m, count(*) AS c FROM t GROUP BY r % 1000") == 2


def test_an_aggregate_whose_partial_rows_would_be_most_of_its_input_is_hashed_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.parquet"
    n = 400_000
    # r: 100k groups of 4 rows in no order; 8 scan tasks each meet 39k of them
    pq.write_table(
        pa.table({"r": [i * 7919 % n // 4 for i in range(n)], "g": [i % 7 for i in range(n)]}),
        path,
        row_group_size=50_000,
    )
    catalog = {"t": load_table("t", str(path))}
    config = PlannerConfig(4, 512 << 10, split_rows=50_000)
    plan = plan_query("SELECT r, sum(g) AS s FROM t GROUP BY r", catalog, config)
    scan = plan.stages[0]
    assert scan.num_tasks == 8 and scan.label == "scan t", scan.label
    assert scan.output.keys == ('"t.r"',), scan.output
    # 7 groups: each task's partial rows are 7
    plan = plan_query("SELECT g, sum(r) AS s FROM t GROUP BY g", catalog, config)
    assert "partial aggregate" in plan.stages[0].label
    # two keys: the product of their counts may be far above the groups there are
    # (both are 100k x 7 capped at the rows here), so the partial phase stays
    plan = plan_query("SELECT r, g, count(*) AS c FROM t GROUP BY r, g", catalog, config)
    assert "partial aggregate" in plan.stages[0].label


def test_splits_never_cut_a_row_group_and_cover_every_row(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": list(range(1000))}), path, row_group_size=100)
    table = load_table("t", str(path))
    splits = table.splits(250)
    # ceil(1000 / 250) = 4 tasks, as even as whole row groups allow
    assert [sum(s.rows for s in task) for task in splits] == [200, 300, 200, 300]
    groups = [rg for task in splits for s in task for rg in s.row_groups]
    assert groups == list(range(10))
    assert len(table.splits(10_000)) == 1
    assert [sum(s.rows for s in task) for task in table.splits(500)] == [500, 500]
    assert len(table.splits(1)) == 10  # never more tasks than row groups


def test_a_scan_that_tasks_of_four_splits_cut_is_two_tasks_so_its_joins_go_by_key_range(
    catalog: dict[str, Table], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # TPC-H q03 at SF 0.1, splits of at most 40k rows: ``lineitem``'s 600k rows
    # are 15 splits, one task of sixteen splits' worth on one slot, four of four:
    # so two. Each joins its key range of ``orders`` (both written in order-key
    # order) with no exchange; one task would hash both tables.
    config = PlannerConfig(max_split_rows=40_000, slots=1, parallel=1)
    plan = plan_query(tpch_query(3), catalog, config)
    (scan,) = [s for s in plan.stages if s.scan is not None and s.scan.table == "lineitem"]
    assert scan.num_tasks == 2
    (orders,) = [side for side in scan.side_scans if side.table == "orders"]
    first, second = (orders.splits_of(t) for t in range(2))
    assert first != second  # each task its own row groups of orders
    assert not any(s.inputs for s in plan.stages if s is not plan.stages[-1])
    expected = duckdb_ref.sql(tpch_query(3)).to_arrow_table()
    assert_same_result(run_plan(plan), expected, ordered=True)
