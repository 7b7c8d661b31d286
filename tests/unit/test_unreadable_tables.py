"""Tables kept while their files cannot be read, on real files in a temporary directory.

* ``scheduler.unreadable.UnreadableTables``: a kept table is out of the planner's
  catalog, a query or a write naming it is told why, and it comes back once its
  files can be read (unless it was dropped or registered again meanwhile).
* ``scheduler.commits.CommitThread``: a commit that took effect answers success
  even where the new table's files cannot be read; the table is kept unreadable.
* ``output.commit``: a cleanup that fails after the manifest landed fails nothing.

The real processes: ``tests/objectstore/test_s3_writes.py`` restarts a scheduler
while its object store is away.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mangonel import output
from mangonel.catalog import Table
from mangonel.errors import CatalogError, UnknownTableError
from mangonel.ids import JobId, StageId
from mangonel.output import CommitMode
from mangonel.plan.physical import WriteTarget
from mangonel.scheduler.commits import CommitThread
from mangonel.scheduler.events import CommitWrite, Event, WriteCommitFailed, WriteCommitted
from mangonel.scheduler.hooks import NO_HOOK
from mangonel.scheduler.persist import StoredTable
from mangonel.scheduler.restore import UnreadableTable
from mangonel.scheduler.store import MemoryCatalogStore
from mangonel.scheduler.unreadable import UnreadableTables
from mangonel.task import WriteFormat


def kept(tmp_path: Path) -> tuple[UnreadableTables, MemoryCatalogStore, Path]:
    catalog = MemoryCatalogStore()
    tables = UnreadableTables(threading.RLock(), catalog, threading.Event(), every_s=10)
    path = tmp_path / "t.parquet"
    tables.add("t", UnreadableTable(StoredTable(str(path)), "no such file", time.time()))
    return tables, catalog, path


def test_a_kept_table_is_explained_and_comes_back_once_readable(tmp_path: Path) -> None:
    tables, catalog, path = kept(tmp_path)
    assert "t" not in catalog.snapshot() and [n for n, _ in tables.entries()] == ["t"]
    read_now = r"'t' cannot be read now.*no such file.*DROP TABLE"
    with pytest.raises(CatalogError, match=read_now), tables.explained():
        raise UnknownTableError("table 't' is not in the catalog", table="t")
    # Any other name: as it was.
    with pytest.raises(UnknownTableError, match="other"), tables.explained():
        raise UnknownTableError("table 'other' is not in the catalog", table="other")
    with pytest.raises(CatalogError, match=r"'t' cannot be written now"):
        tables.refuse("t", "written")
    tables.refuse("other", "written")
    assert tables.try_again() == []  # still missing: kept, with the new error
    entry = tables.get("t")
    assert entry is not None and str(path) in entry.error
    pq.write_table(pa.table({"x": [1, 2, 3]}), path)
    assert tables.try_again() == ["t"]
    assert catalog.snapshot()["t"].rows == 3 and tables.entries() == []


def test_a_table_dropped_or_registered_again_is_not_brought_back(tmp_path: Path) -> None:
    tables, catalog, path = kept(tmp_path)
    pq.write_table(pa.table({"x": [1]}), path)
    assert tables.forget("t") is not None
    assert tables.try_again() == [] and "t" not in catalog.snapshot()


class _Harness:
    """A commit thread with its core's callbacks written down."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.events: list[Event] = []
        self.committed: list[Table] = []
        self.unreadable: list[tuple[str, str, str]] = []
        self.done = threading.Event()
        self.thread = CommitThread(
            self.lock,
            self._emit,
            lambda: frozenset(),
            lambda name: True,
            self.committed.append,
            lambda *args: self.unreadable.append(args),
            lambda name: True,
            lambda: NO_HOOK,
            time.time,
        )

    def _emit(self, make):  # type: ignore[no-untyped-def]
        self.events.append(make(1, 0.0))
        self.done.set()
        return []


def test_a_commit_whose_table_cannot_be_read_succeeds_and_keeps_it(tmp_path: Path) -> None:
    location = str(tmp_path / "warehouse" / "t")
    staged = Path(output.attempt_staging(location, "j1", 0, 0))
    staged.mkdir(parents=True)
    (staged / "data_0.parquet").write_text("not parquet")  # its footer cannot be read
    target = WriteTarget(
        location, WriteFormat.PARQUET, StageId(1), ("x",), CommitMode.CREATE, table="t"
    )
    h = _Harness()
    h.thread.put(CommitWrite(0, JobId("j1"), target, ((0, 0),)))
    assert h.done.wait(10)
    h.thread.stop()
    assert [type(e) for e in h.events] == [WriteCommitted], h.events
    assert h.committed == []
    assert [(name, where) for name, where, _ in h.unreadable] == [("t", location)]
    assert output.manifest_files(location) == (f"{location}/part-j1-p00000-data_0.parquet",)


def test_a_cleanup_that_fails_after_the_manifest_fails_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = str(tmp_path / "out")
    staged = Path(output.attempt_staging(location, "j1", 0, 0))
    staged.mkdir(parents=True)
    (staged / "data_0.parquet").write_text("rows")

    def refused(*args: object) -> None:
        raise PermissionError("the store refused the delete")

    monkeypatch.setattr(output, "_sweep", refused)
    done = output.commit(location, "j1", {0: 0}, "parquet", CommitMode.CREATE)
    assert done.added == ("part-j1-p00000-data_0.parquet",)
    assert output.manifest_files(location) == (f"{location}/part-j1-p00000-data_0.parquet",)


def test_a_commit_that_fails_before_its_manifest_still_fails(tmp_path: Path) -> None:
    location = str(tmp_path / "out")
    other = Path(output.attempt_staging(location, "j0", 0, 0))
    other.mkdir(parents=True)
    (other / "data_0.parquet").write_text("rows")
    output.commit(location, "j0", {0: 0}, "parquet", CommitMode.CREATE)
    staged = Path(output.attempt_staging(location, "j1", 0, 0))
    staged.mkdir(parents=True)
    target = WriteTarget(location, WriteFormat.PARQUET, StageId(1), ("x",), CommitMode.CREATE)
    h = _Harness()
    h.thread.put(CommitWrite(0, JobId("j1"), target, ((0, 0),)))
    assert h.done.wait(10)
    h.thread.stop()
    assert [type(e) for e in h.events] == [WriteCommitFailed]
