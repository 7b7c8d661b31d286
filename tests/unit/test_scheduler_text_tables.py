"""A CSV table's columns are fixed at register and survive a scheduler restart."""

from __future__ import annotations

from pathlib import Path

from mangonel.scheduler.core import SchedulerCore
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
