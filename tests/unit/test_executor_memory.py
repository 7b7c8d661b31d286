"""The executor's memory and spill budgets (``executor.memory``) and how running
out of either is classified (``executor.failures``)."""

from __future__ import annotations

import errno
import json
import os
import platform
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from helpers import require_host

from mangonel.executor import memory as mem
from mangonel.executor import spill as spill_module
from mangonel.executor.config import ExecutorConfig
from mangonel.executor.failures import TaskFailedError, classify
from mangonel.executor.health import DiskHealth, DiskSpace
from mangonel.executor.runner import TaskRunner
from mangonel.executor.shuffle import ShuffleReader
from mangonel.executor.shuffle_write import ShuffleWriter
from mangonel.ids import JobId, StageId, TaskAttemptId, TaskId
from mangonel.task import ExecutionError, ExecutionProblem, OutputKind, OutputSpec, TaskSpec
from mangonel.testing.faults import (
    Action,
    FaultFileError,
    FaultInjector,
    parse_rule,
    write_rules,
)
from mangonel.testing.limits import SmallDisk, small_disks_available


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2GB", 2_000_000_000),
        ("512MiB", 512 * 2**20),
        ("1.5g", 3 * 2**29),
        ("64 mb", 64_000_000),
        ("1048576", 2**20),
        ("4KiB", 4096),
    ],
)
def test_sizes_parse(text: str, size: int) -> None:
    assert mem.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GB", "2 parsecs", "-1GB", "1.2.3G"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        mem.parse_size(text)


def test_budget_is_shared_among_slots_after_the_reserve() -> None:
    one = mem.SlotBudget.share(2**30, 1, spill=8 * 2**30)
    four = mem.SlotBudget.share(2**30, 4, spill=8 * 2**30)
    assert one.memory == int((2**30 - mem.BASE_RESERVE) * mem.DUCKDB_SHARE)
    assert four.memory == one.memory // 4
    assert four.spill == 2 * 2**30
    assert "of the executor's 1.0 GiB (--memory) over 4 slots" in four.describe()
    # However small the budget, a slot gets something DuckDB can start with.
    assert mem.SlotBudget.share(2**20, 8).memory == mem.MIN_SLOT_MEMORY


def _cgroup_tree(tmp_path: Path, v1_limit: str, v2_limit: str) -> tuple[str, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/outer/inner\n0::/outer/inner\n1:cpu:/x\n")
    root = tmp_path / "fs"
    (root / "memory" / "outer" / "inner").mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "memory" / "outer" / "memory.limit_in_bytes").write_text(v1_limit)
    (root / "memory" / "outer" / "inner" / "memory.limit_in_bytes").write_text(
        "9223372036854771712\n"
    )
    (root / "outer" / "inner").mkdir(parents=True)
    (root / "outer" / "inner" / "memory.max").write_text(v2_limit)
    return str(proc), str(root)


def test_cgroup_limit_is_the_lowest_along_the_path(tmp_path: Path) -> None:
    proc, root = _cgroup_tree(tmp_path, "536870912\n", "max\n")
    assert mem.cgroup_memory_limit(proc, root) == 512 * 2**20
    proc, root = _cgroup_tree(tmp_path / "b", "9223372036854771712\n", "268435456\n")
    assert mem.cgroup_memory_limit(proc, root) == 256 * 2**20


def test_no_cgroup_limit_means_the_host_memory(tmp_path: Path) -> None:
    proc, root = _cgroup_tree(tmp_path, "9223372036854771712\n", "max\n")
    assert mem.cgroup_memory_limit(proc, root) is None
    assert mem.cgroup_memory_limit(str(tmp_path / "missing"), root) is None
    assert 0 < mem.available_memory() <= mem.host_memory()


def test_config_shares_memory_and_spill(tmp_path: Path) -> None:
    config = ExecutorConfig(slots=2, memory="1GiB", spill="4GiB", work_dir=str(tmp_path))
    budget = config.slot_budget()
    assert budget.memory == mem.SlotBudget.share(2**30, 2).memory
    assert budget.spill == 2 * 2**30
    # The deprecated per-slot limit still wins, as it did.
    old = ExecutorConfig(slots=2, memory_limit="300MB", work_dir=str(tmp_path))
    assert old.slot_budget().memory == 300_000_000
    assert old.slot_budget().spill == mem.default_spill(str(tmp_path)) // 2
    default = ExecutorConfig(slots=2, work_dir=str(tmp_path)).slot_budget()
    assert default.budget == mem.default_budget()
    with pytest.raises(ValueError, match="not a size"):
        ExecutorConfig(memory="lots")


def _oom_runner(tmp_path: Path, budget: mem.SlotBudget) -> tuple[TaskRunner, TaskSpec]:
    writer = ShuffleWriter(str(tmp_path / "shuffle"))
    runner = TaskRunner(writer, ShuffleReader("h"), str(tmp_path / "spill"), budget, 1)
    attempt = TaskAttemptId(TaskId(JobId("j"), StageId(1), 0), 0)
    # A list aggregate cannot spill: it holds every value of its group in memory.
    sql = "SELECT list(i || repeat('x', 100)) AS l FROM range(2000000) t(i)"
    spec = TaskSpec(attempt, sql, OutputSpec(OutputKind.SINGLE, 1), ("l",))
    return runner, spec


def test_a_task_out_of_memory_says_how_much_it_had(tmp_path: Path) -> None:
    budget = mem.SlotBudget.share(256 * 2**20, 2)
    runner, spec = _oom_runner(tmp_path, budget)
    with pytest.raises(TaskFailedError) as raised:
        runner.run(spec)
    failure = raised.value.failure
    assert isinstance(failure, ExecutionError)
    assert failure.problem is ExecutionProblem.OUT_OF_MEMORY
    assert failure.message.startswith("out of memory: the task needed more than")
    assert budget.describe() in failure.message
    assert "--memory" in failure.message and "--slots" in failure.message
    runner.close()


def test_spilling_past_the_cap_is_a_full_disk(tmp_path: Path) -> None:
    budget = mem.SlotBudget(mem.MIN_SLOT_MEMORY, 2 * 2**20, 2**30, 1)
    writer = ShuffleWriter(str(tmp_path / "shuffle"))
    runner = TaskRunner(writer, ShuffleReader("h"), str(tmp_path / "spill"), budget, 1)
    attempt = TaskAttemptId(TaskId(JobId("j"), StageId(1), 0), 0)
    sql = "SELECT i, md5(i::VARCHAR) AS m FROM range(1000000) t(i) ORDER BY m"
    spec = TaskSpec(attempt, sql, OutputSpec(OutputKind.SINGLE, 1), ("i", "m"))
    with pytest.raises(TaskFailedError) as raised:
        runner.run(spec)
    failure = raised.value.failure
    assert isinstance(failure, ExecutionError)
    assert failure.problem is ExecutionProblem.DISK_FULL
    assert "2.0 MiB per slot" in failure.message
    runner.close()


def test_a_spilling_task_completes_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    budget = mem.SlotBudget(48 * 2**20, 2**30, 2**30, 1)
    writer = ShuffleWriter(str(tmp_path / "shuffle"))
    runner = TaskRunner(writer, ShuffleReader("h"), str(tmp_path / "spill"), budget, 1)
    attempt = TaskAttemptId(TaskId(JobId("j"), StageId(1), 0), 0)
    sql = "SELECT i, md5(i::VARCHAR) AS m FROM range(2000000) t(i) ORDER BY m"
    spec = TaskSpec(attempt, sql, OutputSpec(OutputKind.SINGLE, 1), ("i", "m"))
    with caplog.at_level("INFO", logger="mangonel.executor.runner"):
        (output,) = runner.run(spec)
    assert output.rows == 2_000_000
    assert any("spilled" in r.message for r in caplog.records)
    table = pa.ipc.open_file(pa.memory_map(output.path)).read_all()
    assert table.column("m").to_pylist()[:3] == sorted(table.column("m").to_pylist()[:3])
    runner.close()


def _spill_file(directory: Path, name: str, size: int) -> Path:
    """A DuckDB-like temporary file of ``size`` bytes written out (blocks allocated)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(b"x" * size)
    return path


def test_the_slot_spill_watch_sees_files_gone_before_the_task_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The case the watch exists for: DuckDB deletes its files inside the query.
    monkeypatch.setattr(spill_module, "_SPILL_POLL_S", 0.001)
    watch = spill_module.SpillWatch(str(tmp_path))
    try:
        watch.start()
        path = _spill_file(tmp_path / "scan-1", "duckdb_temp_storage-0.tmp", 1 << 20)
        deadline = time.monotonic() + 10
        while watch.peak < 1 << 20:
            assert time.monotonic() < deadline, "the watch never looked at the slot's files"
            time.sleep(0.001)
        path.unlink()
        assert watch.stop() >= 1 << 20
    finally:
        watch.close()


def test_the_slot_spill_watch_starts_from_zero_for_each_task(tmp_path: Path) -> None:
    watch = spill_module.SpillWatch(str(tmp_path))
    try:
        watch.start()
        path = _spill_file(tmp_path, "a.tmp", 256 * 1024)
        _spill_file(tmp_path, "not-a-spill-file.arrow", 1 << 20)
        first = watch.stop()
        assert 256 * 1024 <= first < 1 << 20
        path.unlink()
        # Between tasks the thread sleeps: a file written then is nobody's spill.
        path = _spill_file(tmp_path, "b.tmp", 512 * 1024)
        path.unlink()
        watch.start()
        assert watch.stop() == 0
        watch.start()
        _spill_file(tmp_path, "c.tmp", 128 * 1024)
        assert 128 * 1024 <= watch.stop() < 256 * 1024
    finally:
        watch.close()


def test_a_slot_watches_its_spill_on_one_thread_for_all_its_tasks(tmp_path: Path) -> None:
    writer = ShuffleWriter(str(tmp_path / "shuffle"))
    # Thread objects, not idents: a watcher of an earlier test that ends meanwhile
    # leaves its ident (its pthread's address) free for this runner's watcher.
    before = {t for t in threading.enumerate() if t.name == "spill-watch"}
    runner = TaskRunner(writer, ShuffleReader("h"), str(tmp_path / "spill"), None, 1)
    try:
        for i in range(3):
            attempt = TaskAttemptId(TaskId(JobId("j"), StageId(1), i), 0)
            spec = TaskSpec(attempt, "SELECT 1 AS x", OutputSpec(OutputKind.SINGLE, 1), ("x",))
            (output,) = runner.run(spec)
            assert output.rows == 1
        watchers = {t for t in threading.enumerate() if t.name == "spill-watch"} - before
        assert len(watchers) == 1
    finally:
        runner.close()


def test_enospc_anywhere_in_the_cause_chain_is_a_full_disk() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise pa.ArrowIOError("write failed") from inner
    except pa.ArrowIOError as exc:
        failure = classify(exc)
    assert isinstance(failure, ExecutionError)
    assert failure.problem is ExecutionProblem.DISK_FULL
    io = classify(duckdb.IOException("IO Error: Could not write: No space left on device"))
    assert isinstance(io, ExecutionError) and io.problem is ExecutionProblem.DISK_FULL
    other = classify(duckdb.IOException("IO Error: Cannot open file"))
    assert isinstance(other, ExecutionError) and other.problem is ExecutionProblem.OTHER


def test_disk_health_low_water_and_hold() -> None:
    health = DiskHealth(hold_s=10)
    big = 100 * 2**30
    assert health.check(DiskSpace("/w", 300 * 2**20, big), now=0) == ""
    # Under 256 MiB free on a big disk is full; on a 64 MiB disk, under 5% is.
    assert "is full" in health.check(DiskSpace("/w", 200 * 2**20, big), now=0)
    assert health.check(DiskSpace("/w", 4 * 2**20, 64 * 2**20), now=0) == ""
    assert "is full" in health.check(DiskSpace("/w", 2**20, 64 * 2**20), now=0)
    # After a disk-full failure it stays unhealthy for hold_s, however much is free.
    health.disk_full(now=100)
    assert "found /w full" in health.check(DiskSpace("/w", big, big), now=105)
    assert health.check(DiskSpace("/w", big, big), now=110) == ""


def test_fill_disk_and_hog_memory_rules_parse() -> None:
    fill = parse_rule({"action": "fill_disk", "stage": 2, "leave": 4096})
    assert (fill.action, fill.stage, fill.amount, fill.attempt) == (Action.FILL_DISK, 2, 4096, 0)
    hog = parse_rule({"action": "hog_memory", "stage": 1, "bytes": 2**30})
    assert (hog.action, hog.amount) == (Action.HOG_MEMORY, 2**30)
    with pytest.raises(FaultFileError, match="needs bytes"):
        parse_rule({"action": "hog_memory", "stage": 1})
    with pytest.raises(FaultFileError, match="needs a stage"):
        parse_rule({"action": "fill_disk"})
    with pytest.raises(FaultFileError, match="takes no bytes"):
        parse_rule({"action": "fill_disk", "stage": 1, "bytes": 1})


def test_fill_disk_fault_leaves_the_work_root_full(tmp_path: Path) -> None:
    require_host(None if small_disks_available() else "not root", "a tmpfs mounted as a small disk")
    with SmallDisk(str(tmp_path / "disk"), 8 * 2**20) as disk:
        rules = tmp_path / "faults.json"
        write_rules(str(rules), [{"action": "fill_disk", "stage": 1, "leave": 2**20}])
        injector = FaultInjector(str(rules), "0", work_dir=disk.path)
        attempt = TaskAttemptId(TaskId(JobId("j"), StageId(1), 3), 0)
        injector.task_started(attempt)
        assert disk.free() <= 2**20 + 64 * 2**10
        writer = ShuffleWriter(os.path.join(disk.path, "shuffle"))
        table = pa.table({"x": pa.array(range(1_000_000))})
        with pytest.raises(OSError) as raised:
            writer.write_table(attempt, 0, table)
        assert isinstance(classify(raised.value), ExecutionError)
        assert classify(raised.value).problem is ExecutionProblem.DISK_FULL  # type: ignore[union-attr]
        # The attempt's files are gone, temporary and final alike.
        assert [f for _, _, fs in os.walk(writer.root) for f in fs] == []
        disk.free_up()
        assert disk.free() > 7 * 2**20


_AGGREGATE_THEN_RELEASE = textwrap.dedent(
    """
    import json, sys
    import duckdb
    from mangonel.executor.memory import release_duckdb_memory

    def anon_mib():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) // 1024

    # A locked-down slot database, as the runner's: SET memory_limit (which
    # also gives the memory back) is out of reach once a task has run.
    con = duckdb.connect(config={"threads": 1})
    con.execute("SET lock_configuration = true")
    before = anon_mib()
    con.sql("SELECT i, sum(i) FROM range(5000000) t(i) GROUP BY i").fetchall()
    held = anon_mib() - before
    releasing = sys.argv[1] == "release"
    # Under the default threshold (RELEASE_ABOVE, 256 MiB) it stays ...
    by_default = release_duckdb_memory() if releasing else None
    # ... and past a lower one it goes.
    released = release_duckdb_memory(64 * 2**20) if releasing else None
    after = anon_mib() - before
    # What a small query leaves stays for the next one.
    con.sql("SELECT i % 7, count(*) FROM range(10000) t(i) GROUP BY 1").fetchall()
    again = release_duckdb_memory(64 * 2**20) if releasing else None
    print(json.dumps([held, after, by_default, released, again]))
    """
)


@pytest.mark.skipif(platform.system() != "Linux", reason="DuckDB links jemalloc on Linux")
def test_release_duckdb_memory_gives_back_what_an_idle_database_kept() -> None:
    # A fresh process each, so that nothing else allocated in DuckDB's arenas.
    def run(mode: str) -> tuple[int, int, bool | None, bool | None, bool | None]:
        done = subprocess.run(
            [sys.executable, "-c", _AGGREGATE_THEN_RELEASE, mode],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        held, after, by_default, released, again = json.loads(done.stdout.splitlines()[-1])
        return held, after, by_default, released, again

    held, after, by_default, released, again = run("release")
    assert by_default is False
    assert released is True
    assert again is False
    assert held > 80  # the aggregate's table, freed by DuckDB, kept by its allocator
    assert after < held // 4
    # Without it the idle database keeps that memory.
    held, after, _, _, _ = run("keep")
    assert after > held // 2
