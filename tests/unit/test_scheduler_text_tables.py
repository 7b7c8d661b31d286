"""A CSV table's columns are fixed at register and survive a scheduler restart; a
name registered again over a warehouse table stands for the user's files."""

from __future__ import annotations

from pathlib import Path

from mangonel.scheduler.core import SchedulerCore
from mangonel.scheduler.persist import StoredTable, encode, table_key
from mangonel.scheduler.state import Limits, SchedulerState
from mangonel.scheduler.store import MemoryStateStore
from mangonel.task import FileFormat


def _core(store: MemoryStateStore) -> SchedulerCore:
    return SchedulerCore(SchedulerState(Limits()), store=store)


def test_a_restarted_scheduler_reads_with_the_columns_of_register(tmp_path: Path) -> None:
    """Inference runs once: a file whose start changed since (its sample would now
    say VARCHAR) is read after a restart with the columns it was registered with,
    and with its options."""
    path = tmp_path / "t.csv"
    path.write_text("a;b\n1;x\n2;y\n")
    store = MemoryStateStore()
    store.acquire("test")
    first = _core(store)
    first.recover()
    table = first.register_table("t", str(path), FileFormat.CSV, {"delimiter": ";"})
    assert table.text is not None
    assert table.text.columns == (("a", "BIGINT"), ("b", "VARCHAR"))
    path.write_text("a;b\nnot a number;x\n")
    second = _core(store)
    second.recover()
    (again,) = second.tables()
    assert again.text == table.text
    assert again.options == {"delimiter": ";"}
    assert again.schema.equals(table.schema)
    assert second.drop_table("t")
    third = _core(store)
    third.recover()
    assert third.tables() == []


def test_a_name_registered_over_a_warehouse_table_drops_without_its_files(
    tmp_path: Path,
) -> None:
    """``DROP TABLE`` deletes the files of a table the warehouse owns; registering
    the name again over the user's own files must take that ownership away."""
    owned = tmp_path / "warehouse" / "t"
    owned.mkdir(parents=True)
    (owned / "part-0.csv").write_text("a\n1\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "part-0.csv").write_text("a\n2\n")
    store = MemoryStateStore()
    store.acquire("test")
    store.commit({table_key("t"): encode(StoredTable(str(owned), "csv", owned=True))})
    core = _core(store)
    core.recover()
    core.register_table("t", str(mine), FileFormat.CSV)
    assert core.drop_table("t")
    assert (mine / "part-0.csv").exists() and owned.exists()
