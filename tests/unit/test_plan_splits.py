"""How scans are cut into tasks: by row group, sized from the table."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mangonel.catalog import load_table
from mangonel.plan.planner import PlannerConfig


def test_adaptive_split_size_stays_within_bounds() -> None:
    config = PlannerConfig(partitions=4)
    assert config.split_rows_for(6_000_000) == 750_000  # two tasks per partition
    assert config.split_rows_for(10_000) == 250_000  # small tables: one task
    assert config.split_rows_for(600_000_000) == 2_000_000  # big ones: bounded tasks
    assert PlannerConfig(split_rows=7_500).split_rows_for(6_000_000) == 7_500


def test_splits_never_cut_a_row_group_and_cover_every_row(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": list(range(1000))}), path, row_group_size=100)
    table = load_table("t", str(path))
    splits = table.splits(250)
    assert [sum(s.rows for s in task) for task in splits] == [200, 200, 200, 200, 200]
    groups = [rg for task in splits for s in task for rg in s.row_groups]
    assert groups == list(range(10))
    assert len(table.splits(10_000)) == 1
