"""TaskRunner: real TaskSpecs run in DuckDB over small Parquet files and shuffle files."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from mangonel.executor import runner as runner_mod
from mangonel.executor import scan as scan_mod
from mangonel.executor.databases import SCAN_DATABASES, locked_connection
from mangonel.executor.failures import TaskCancelledError, TaskFailedError
from mangonel.executor.phases import Phase, PhaseClock
from mangonel.executor.runner import TaskRunner
from mangonel.executor.shuffle import ShuffleReader
from mangonel.executor.shuffle_write import OutputRegistry, ShuffleWriter
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.task import (
    ExecutionError,
    FetchFailed,
    FileSplit,
    FragmentRejected,
    InputLocations,
    InputMode,
    OutputKind,
    OutputSpec,
    PartitionLocation,
    PartitionOutput,
    QueryError,
    ScanSpec,
    TaskSpec,
)

HOST = "host-a"
NOT_RETRIED = (QueryError, FragmentRejected)
"""Failures that end the job at the first attempt: a refused fragment is one."""
SINGLE = OutputSpec(OutputKind.SINGLE)
MODES = ["AIR", "MAIL", "RAIL", "SHIP", "TRUCK", "FOB", "REG AIR"]


def attempt(stage: int, partition: int, n: int = 0) -> TaskAttemptId:
    return TaskAttemptId(TaskId(JobId("job1"), StageId(stage), partition), n)


@pytest.fixture()
def data(tmp_path: Path) -> list[str]:
    """Two Parquet files of 3 row groups each, strings stored as string_view."""
    paths = []
    for f in range(2):
        n = 3000
        base = f * n
        table = pa.table(
            {
                "l_orderkey": pa.array([(base + i) // 4 for i in range(n)], pa.int64()),
                "l_quantity": pa.array([(base + i) % 50 + 1 for i in range(n)], pa.int32()),
                "l_price": pa.array([((base + i) * 37) % 10_000 / 100 for i in range(n)]),
                "l_shipmode": pa.array([MODES[(base + i) % 7] for i in range(n)], pa.string_view()),
            }
        )
        path = str(tmp_path / f"lineitem-{f}.parquet")
        pq.write_table(table, path, row_group_size=1000)
        paths.append(path)
    return paths


@pytest.fixture()
def runner(tmp_path: Path) -> Iterator[TaskRunner]:
    writer = ShuffleWriter(str(tmp_path / "shuffle"), OutputRegistry())
    r = TaskRunner(writer, ShuffleReader(HOST), str(tmp_path / "spill"), "256MB", 1)
    yield r
    r.close()


def scan_spec(
    stage: int,
    partition: int,
    sql: str,
    splits: tuple[FileSplit, ...],
    output: OutputSpec,
    columns: tuple[str, ...],
    scan_columns: tuple[str, ...],
) -> TaskSpec:
    return TaskSpec(
        attempt=attempt(stage, partition),
        sql=sql,
        output=output,
        columns=columns,
        scans=(ScanSpec("lineitem", "lineitem", scan_columns, splits),),
    )


def locations(
    stage: int,
    outputs: dict[int, tuple[PartitionOutput, ...]],
    partition: int,
    executor: str = "e1",
    host: str = HOST,
    address: str = "127.0.0.1:1",
) -> tuple[PartitionLocation, ...]:
    return tuple(
        PartitionLocation(
            executor=ExecutorId(executor),
            host=host,
            flight_address=address,
            stage=StageId(stage),
            map_partition=m,
            partition=partition,
            path=outs[partition].path,
            rows=outs[partition].rows,
            bytes=outs[partition].bytes,
            checksum=outs[partition].checksum,
        )
        for m, outs in sorted(outputs.items())
    )


def read(runner: TaskRunner, out: PartitionOutput) -> pa.Table:
    with pa.memory_map(out.path) as source:
        return pa.ipc.open_file(source).read_all()


def map_stage(runner: TaskRunner, data: list[str]) -> dict[int, tuple[PartitionOutput, ...]]:
    """Stage 1: two scan tasks (row groups 0-1 of file 0; row group 2 of file 0 and
    all of file 1), filtered, partial aggregate, hash(l_shipmode) into 4 partitions."""
    splits = [
        (FileSplit(data[0], (0, 1)),),
        (FileSplit(data[0], (2,)), FileSplit(data[1])),
    ]
    sql = (
        "SELECT l_shipmode AS mode, sum(l_price) AS revenue, count(*) AS n "
        "FROM lineitem WHERE l_quantity > 10 GROUP BY l_shipmode"
    )
    out = OutputSpec(OutputKind.HASH, 4, ("mode",))
    return {
        i: runner.run(
            scan_spec(
                1, i, sql, s, out, ("mode", "revenue", "n"), ("l_shipmode", "l_price", "l_quantity")
            )
        )
        for i, s in enumerate(splits)
    }


def test_scan_hash_then_reduce_matches_duckdb(runner: TaskRunner, data: list[str]) -> None:
    maps = map_stage(runner, data)
    assert all(len(outs) == 4 for outs in maps.values())
    results = []
    for p in range(4):
        spec = TaskSpec(
            attempt=attempt(2, p),
            sql="SELECT mode, sum(revenue) AS revenue, sum(n) AS n FROM s1 GROUP BY mode",
            output=SINGLE,
            columns=("mode", "revenue", "n"),
            inputs=(
                InputLocations(
                    "s1",
                    StageId(1),
                    InputMode.PARTITION,
                    locations(1, maps, p),
                    ("mode", "revenue", "n"),
                ),
            ),
            result=True,  # read here as a client reads it
        )
        (out,) = runner.run(spec)
        results.append(read(runner, out))
    got = pa.concat_tables(results).sort_by("mode")
    expected = duckdb.sql(
        "SELECT l_shipmode AS mode, sum(l_price) AS revenue, count(*) AS n "
        f"FROM read_parquet({data!r}) WHERE l_quantity > 10 GROUP BY 1 ORDER BY 1"
    ).to_arrow_table()
    assert got.column("mode").to_pylist() == expected.column("mode").to_pylist()
    assert got.column("n").to_pylist() == expected.column("n").to_pylist()
    assert got.column("revenue").to_pylist() == pytest.approx(
        expected.column("revenue").to_pylist()
    )


def test_a_stage_keeps_duckdbs_types_and_a_result_gets_arrows(runner: TaskRunner) -> None:
    """A SUM of integers is a HUGEINT, which Arrow has no type for: a stage's rows
    carry it as DuckDB's own (read again, it is a HUGEINT: ``s // 2`` too, where a
    DECIMAL(38, 0) would make a DOUBLE), a query's result as DECIMAL(38, 0), and a
    UUID as a string, as DuckDB gives them to a client."""
    sql = (
        "SELECT k, sum(x) AS s, md5(k::VARCHAR)::UUID AS u "
        "FROM range(10) t(x), (SELECT 1 AS k) GROUP BY k"
    )
    (stage,) = runner.run(TaskSpec(attempt(1, 0), sql, SINGLE, ("k", "s", "u")))
    rows = read(runner, stage)
    assert isinstance(rows.schema.field("s").type, pa.BaseExtensionType)
    final = TaskSpec(
        attempt(2, 0),
        "SELECT s // 2 AS half, typeof(s // 2) AS t, u FROM s1 ORDER BY half",
        SINGLE,
        ("half", "t", "u"),
        inputs=(
            InputLocations(
                "s1", StageId(1), InputMode.ALL, locations(1, {0: (stage,)}, 0), ("k", "s", "u")
            ),
        ),
        result=True,
    )
    (out,) = runner.run(final)
    answer = read(runner, out)
    expected = duckdb.sql(
        "SELECT sum(x) // 2 AS half, typeof(sum(x) // 2) AS t, md5('1')::UUID AS u "
        "FROM range(10) t(x)"
    ).to_arrow_table()
    assert answer.schema == expected.schema
    assert (
        answer.to_pylist()
        == expected.to_pylist()
        == [{"half": 22, "t": "HUGEINT", "u": expected.column("u")[0].as_py()}]
    )


def test_the_phase_clock_times_each_step_of_a_task(runner: TaskRunner, data: list[str]) -> None:
    maps = map_stage(runner, data)
    spec = TaskSpec(
        attempt=attempt(2, 0),
        sql="SELECT mode, sum(n) AS n FROM s1 GROUP BY mode",
        output=OutputSpec(OutputKind.HASH, 2, ("mode",)),
        columns=("mode", "n"),
        inputs=(
            InputLocations(
                "s1", StageId(1), InputMode.PARTITION, locations(1, maps, 0), ("mode", "n")
            ),
        ),
    )
    clock = PhaseClock()
    started = time.perf_counter()
    runner.run(spec, clock=clock)
    wall = time.perf_counter() - started
    s = clock.seconds
    for phase in (Phase.SETUP, Phase.FETCH, Phase.EXECUTE, Phase.WRITE, Phase.CLEANUP):
        assert s[phase] > 0, phase
    assert clock.phase is Phase.IDLE and s[Phase.IDLE] == 0
    assert sum(s.values()) <= wall  # one after the other, never overlapping
    assert 0 < clock.write_io_s < s[Phase.WRITE]
    # Both map outputs lie on this host: mapped, none fetched over Flight.
    assert clock.fetched_local_bytes == sum(outs[0].bytes for outs in maps.values()) > 0
    assert (clock.fetched_remote_bytes, clock.fetch_remote_s) == (0, 0.0)


def test_equal_keys_land_in_one_partition(runner: TaskRunner, data: list[str]) -> None:
    sql = "SELECT l_orderkey AS k, l_shipmode AS mode FROM lineitem"
    out = OutputSpec(OutputKind.HASH, 4, ("k", "mode"))
    outputs = [
        runner.run(
            scan_spec(
                1, i, sql, (FileSplit(path),), out, ("k", "mode"), ("l_orderkey", "l_shipmode")
            )
        )
        for i, path in enumerate(data)
    ]
    seen: dict[tuple[int, str], int] = {}
    total = 0
    for outs in outputs:
        for o in outs:
            table = read(runner, o)
            total += table.num_rows
            assert table.schema.names == ["k", "mode"]
            for key in set(
                zip(table.column("k").to_pylist(), table.column("mode").to_pylist(), strict=True)
            ):
                assert seen.setdefault(key, o.partition) == o.partition
    assert total == 6000
    assert len(set(seen.values())) == 4  # the keys really spread


def test_hash_output_of_many_batches_puts_each_row_in_its_partition(
    runner: TaskRunner, data: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches much smaller than the task's output: every batch is split on its
    # own and its pieces appended, so each file holds rows of several batches.
    monkeypatch.setattr(runner_mod, "BATCH_ROWS", 500)
    spec = scan_spec(
        1,
        0,
        "SELECT l_orderkey AS k, l_price AS price FROM lineitem",
        (FileSplit(data[0]),),
        OutputSpec(OutputKind.HASH, 4, ("k",)),
        ("k", "price"),
        ("l_orderkey", "l_price"),
    )
    outs = runner.run(spec)
    expected = duckdb.sql(
        "SELECT l_orderkey AS k, l_price AS price, hash(l_orderkey) % 4 AS p "
        f"FROM read_parquet({data[0]!r})"
    ).to_arrow_table()
    for out in outs:
        with pa.memory_map(out.path) as source:
            file = pa.ipc.open_file(source)
            assert file.num_record_batches > 1
            got = file.read_all()
        want = expected.filter(pc.equal(expected["p"], out.partition))
        assert out.rows == got.num_rows == want.num_rows > 0
        pairs = zip(got["k"].to_pylist(), got["price"].to_pylist(), strict=True)
        assert sorted(pairs) == sorted(
            zip(want["k"].to_pylist(), want["price"].to_pylist(), strict=True)
        )


_GROW_AND_FREE = textwrap.dedent(
    """
    import ctypes, json, resource, threading
    from mangonel.executor.memory import keep_batch_memory

    libc = ctypes.CDLL(None)
    libc.malloc.restype = libc.realloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    took = keep_batch_memory() if USE else None
    faults = []

    def batches():
        # Three columns grown by doubling to 4 MiB, then freed, as DuckDB
        # builds and releases each Arrow batch, on a slot's own thread.
        for _ in range(6):
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            buffers = []
            for _ in range(3):
                size = 64 * 1024
                p = libc.malloc(size)
                ctypes.memset(p, 1, size)
                while size < 4 * 1024 * 1024:
                    size *= 2
                    p = libc.realloc(p, size)
                    ctypes.memset(p, 1, size)
                buffers.append(p)
            for p in buffers:
                libc.free(p)
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

    thread = threading.Thread(target=batches)
    thread.start()
    thread.join()
    print(json.dumps([took, faults]))
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc")
def test_keep_batch_memory_lets_later_batches_reuse_the_pages_of_earlier_ones() -> None:
    # A fresh process each, so that no earlier allocation moved glibc's thresholds.
    def run(use: bool) -> tuple[bool | None, list[int]]:
        code = f"USE = {use}\n{_GROW_AND_FREE}"
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        took, faults = json.loads(done.stdout)
        return took, faults

    took, faults = run(True)
    assert took is True
    assert max(faults[1:]) < faults[0] // 10  # after the first batch: (almost) no fresh page
    # glibc's defaults, for contrast: every batch faults its pages in again.
    _, default = run(False)
    assert min(default[1:]) > default[0] // 2


def test_single_output_keeps_order_and_renames(runner: TaskRunner, data: list[str]) -> None:
    spec = scan_spec(
        1,
        0,
        "SELECT l_orderkey, l_price FROM lineitem ORDER BY l_price DESC, l_orderkey",
        (FileSplit(data[1]),),
        SINGLE,
        ("key", "price"),
        ("l_orderkey", "l_price"),
    )
    (out,) = runner.run(spec)
    table = read(runner, out)
    assert table.schema.names == ["key", "price"]
    prices = table.column("price")
    assert pc.all(pc.greater_equal(prices.slice(0, len(prices) - 1), prices.slice(1))).as_py()
    assert out.rows == 3000 and out.path.endswith("job1/s1/m0-a0-p0.arrow")


def test_count_star_scan_reads_no_column(runner: TaskRunner, data: list[str]) -> None:
    spec = scan_spec(
        1,
        0,
        "SELECT count(*) AS n FROM lineitem",
        (FileSplit(data[0], (1, 2)),),
        SINGLE,
        ("n",),
        (),
    )
    (out,) = runner.run(spec)
    assert read(runner, out).column("n").to_pylist() == [2000]


def test_hash_output_of_empty_result_writes_every_partition(
    runner: TaskRunner, data: list[str]
) -> None:
    spec = scan_spec(
        1,
        0,
        "SELECT l_orderkey AS k FROM lineitem WHERE l_quantity < 0",
        (FileSplit(data[0]),),
        OutputSpec(OutputKind.HASH, 3, ("k",)),
        ("k",),
        ("l_orderkey", "l_quantity"),
    )
    outs = runner.run(spec)
    assert [(o.partition, o.rows) for o in outs] == [(0, 0), (1, 0), (2, 0)]
    assert read(runner, outs[2]).schema.names == ["k"]


def test_input_with_no_locations_is_an_empty_table(runner: TaskRunner) -> None:
    spec = TaskSpec(
        attempt=attempt(2, 0),
        sql="SELECT count(*) AS n FROM s1",
        output=SINGLE,
        columns=("n",),
        inputs=(InputLocations("s1", StageId(1), InputMode.ALL, (), ("a", "b")),),
    )
    (out,) = runner.run(spec)
    assert read(runner, out).column("n").to_pylist() == [0]


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        # DuckDB refuses the SQL itself: the planner wrote it wrong, not the user
        ("SELECT no_such_column FROM lineitem", FragmentRejected),  # binder
        ("SELEC 1", FragmentRejected),  # parser
        ("SELECT * FROM no_such_table", FragmentRejected),  # catalog
        # the data refuses the query's own operation: the user's error
        ("SELECT CAST(l_shipmode AS INTEGER) AS x FROM lineitem", QueryError),  # while streaming
    ],
)
def test_query_errors_are_classified_and_the_slot_stays_usable(
    runner: TaskRunner, data: list[str], sql: str, kind: type
) -> None:
    spec = scan_spec(1, 0, sql, (FileSplit(data[0]),), SINGLE, ("x",), ("l_shipmode",))
    with pytest.raises(TaskFailedError) as info:
        runner.run(spec)
    assert type(info.value.failure) is kind
    ok = scan_spec(
        1,
        1,
        "SELECT count(*) AS n FROM lineitem",
        (FileSplit(data[0]),),
        SINGLE,
        ("n",),
        ("l_shipmode",),
    )
    (out,) = runner.run(ok)
    assert read(runner, out).column("n").to_pylist() == [3000]
    # Everything registered by the failed task is gone.
    with pytest.raises(TaskFailedError, match="lineitem"):
        runner.run(TaskSpec(attempt(1, 2), "SELECT * FROM lineitem", SINGLE, ("x",)))


def test_column_count_mismatch_is_a_rejected_fragment(runner: TaskRunner, data: list[str]) -> None:
    spec = scan_spec(1, 0, "SELECT 1 AS a, 2 AS b", (), SINGLE, ("a",), ())
    with pytest.raises(TaskFailedError, match="returns 2 columns") as info:
        runner.run(spec)
    assert isinstance(info.value.failure, FragmentRejected)


def test_missing_scan_file_is_an_execution_error(runner: TaskRunner, tmp_path: Path) -> None:
    spec = scan_spec(
        1,
        0,
        "SELECT * FROM lineitem",
        (FileSplit(str(tmp_path / "gone.parquet")),),
        SINGLE,
        ("x",),
        ("x",),
    )
    with pytest.raises(TaskFailedError) as info:
        runner.run(spec)
    assert isinstance(info.value.failure, ExecutionError)


def test_unreadable_input_is_a_fetch_failure_naming_the_map_output(
    runner: TaskRunner, data: list[str]
) -> None:
    maps = map_stage(runner, data)
    locs = locations(1, maps, 2, executor="e9", host="elsewhere")  # nothing listens there
    runner.reader.retries, runner.reader.backoff_s = 1, 0.0
    spec = TaskSpec(
        attempt=attempt(2, 2),
        sql="SELECT * FROM s1",
        output=SINGLE,
        columns=("mode", "revenue", "n"),
        inputs=(InputLocations("s1", StageId(1), InputMode.PARTITION, locs, ("mode",)),),
    )
    with pytest.raises(TaskFailedError) as info:
        runner.run(spec)
    failure = info.value.failure
    assert isinstance(failure, FetchFailed)
    assert (failure.executor, failure.stage, failure.map_partition) == ("e9", 1, 0)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM glob('/*')",
        "SET threads = 8",
        "SET enable_external_access = true",
        "COPY (SELECT 1) TO '/tmp/mangonel-should-not-exist.csv'",
        "ATTACH '/tmp/mangonel-should-not-exist.db'",
        "INSTALL httpfs",
    ],
)
def test_sql_cannot_reach_files_or_settings(runner: TaskRunner, sql: str) -> None:
    with pytest.raises(TaskFailedError) as info:
        runner.run(TaskSpec(attempt(1, 0), sql, SINGLE, ("x",)))
    assert isinstance(info.value.failure, NOT_RETRIED)
    (out,) = runner.run(
        TaskSpec(attempt(1, 1), "SELECT current_setting('threads') AS t", SINGLE, ("t",))
    )
    assert read(runner, out).column("t").to_pylist() == [1]


def test_cancel_interrupts_a_running_task(runner: TaskRunner) -> None:
    spec = TaskSpec(attempt(1, 0), "SELECT count(*) AS n FROM range(100000000000)", SINGLE, ("n",))
    timer = threading.Timer(0.3, runner.cancel)
    timer.start()
    with pytest.raises(TaskCancelledError):
        runner.run(spec)
    timer.join()
    (out,) = runner.run(TaskSpec(attempt(1, 1), "SELECT 42 AS n", SINGLE, ("n",)))
    assert read(runner, out).column("n").to_pylist() == [42]


def test_cancel_names_an_attempt(runner: TaskRunner) -> None:
    # A cancel for an attempt that has not started yet stops it when it starts...
    runner.cancel(attempt(1, 0))
    with pytest.raises(TaskCancelledError):
        runner.run(TaskSpec(attempt(1, 0), "SELECT 1 AS n", SINGLE, ("n",)))
    # ...and a late cancel of a finished attempt never touches the next one.
    (out,) = runner.run(TaskSpec(attempt(1, 1), "SELECT 1 AS n", SINGLE, ("n",)))
    runner.cancel(attempt(1, 1))
    (out,) = runner.run(TaskSpec(attempt(1, 2), "SELECT 2 AS n", SINGLE, ("n",)))
    assert read(runner, out).column("n").to_pylist() == [2]


def test_a_slot_spills_to_its_temp_directory(tmp_path: Path) -> None:
    writer = ShuffleWriter(str(tmp_path / "shuffle"), OutputRegistry())
    spill = tmp_path / "spill"
    runner = TaskRunner(writer, ShuffleReader(HOST), str(spill), "32MB", 1)
    sql = (
        "SELECT r, md5(r::VARCHAR) || md5((r + 1)::VARCHAR) AS m FROM range(700000) t(r) ORDER BY m"
    )
    try:
        (out,) = runner.run(TaskSpec(attempt(1, 0), sql, SINGLE, ("r", "m")))
    finally:
        runner.close()
    assert out.rows == 700_000


def test_top_n_over_some_row_groups_reads_only_those(runner: TaskRunner, data: list[str]) -> None:
    # Row group 1 of file 0 holds rows 1000-1999, l_orderkey = row // 4. A top-n
    # over a row-number-filtered Parquet read once failed inside DuckDB 2.0.0.
    spec = scan_spec(
        1,
        0,
        "SELECT l_orderkey, l_quantity FROM lineitem ORDER BY l_orderkey DESC LIMIT 3",
        (FileSplit(data[0], (1,)),),
        SINGLE,
        ("k", "q"),
        ("l_orderkey", "l_quantity"),
    )
    (out,) = runner.run(spec)
    assert read(runner, out).column("k").to_pylist() == [499, 499, 499]
    count = scan_spec(
        1, 1, "SELECT count(*) AS n, min(l_orderkey) AS lo FROM lineitem",
        (FileSplit(data[0], (0, 2)),), SINGLE, ("n", "lo"), ("l_orderkey",),
    )  # fmt: skip
    (out,) = runner.run(count)
    assert read(runner, out).to_pylist() == [{"n": 2000, "lo": 0}]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) AS x FROM read_parquet('{other}')",
        "SELECT count(*) AS x FROM read_csv('/etc/passwd')",
        "SET allowed_paths = ['/etc/passwd']",
        "SET threads = 4",
    ],
)
def test_a_scan_task_reads_its_own_files_and_no_other(
    runner: TaskRunner, data: list[str], sql: str
) -> None:
    spec = scan_spec(
        1, 0, sql.format(other=data[1]), (FileSplit(data[0]),), SINGLE, ("x",), ("l_quantity",)
    )
    with pytest.raises(TaskFailedError) as info:
        runner.run(spec)
    assert isinstance(info.value.failure, NOT_RETRIED)
    ok = scan_spec(1, 1, "SELECT count(*) AS x FROM lineitem", (FileSplit(data[0]),), SINGLE,
                   ("x",), ("l_quantity",))  # fmt: skip
    (out,) = runner.run(ok)
    assert read(runner, out).column("x").to_pylist() == [3000]


def test_scan_databases_opened_ahead_are_locked_down_to_their_own_files(
    runner: TaskRunner, data: list[str]
) -> None:
    """Each new set of files gets the database the slot opened ahead of need; each
    may still read its own files and no other, and change no setting."""
    for n, (mine, other) in enumerate([(data[0], data[1]), (data[1], data[0])]):
        ok = scan_spec(2, n, "SELECT count(*) AS x FROM lineitem", (FileSplit(mine),), SINGLE,
                       ("x",), ("l_quantity",))  # fmt: skip
        (out,) = runner.run(ok)
        assert read(runner, out).column("x").to_pylist() == [3000]
        for k, sql in enumerate(
            [f"SELECT count(*) AS x FROM read_parquet('{other}')", "SET threads = 4"]
        ):
            bad = scan_spec(3, 10 * n + k, sql, (FileSplit(mine),), SINGLE, ("x",),
                            ("l_quantity",))  # fmt: skip
            with pytest.raises(TaskFailedError) as info:
                runner.run(bad)
            assert isinstance(info.value.failure, NOT_RETRIED)
    splits = (FileSplit(data[0]), FileSplit(data[1]))
    both = scan_spec(2, 9, "SELECT count(*) AS x FROM lineitem", splits, SINGLE, ("x",),
                     ("l_quantity",))  # fmt: skip
    (out,) = runner.run(both)
    assert read(runner, out).column("x").to_pylist() == [6000]


def test_a_slot_keeps_a_bounded_number_of_scan_databases(
    runner: TaskRunner, tmp_path: Path
) -> None:
    """Each database costs about 4 MiB however little it read: past the bound the least
    recently used is closed, and a set of files met again gets a database of its own
    again, still locked down to its files."""
    paths = []
    for n in range(SCAN_DATABASES + 2):
        path = str(tmp_path / f"part-{n}.parquet")
        pq.write_table(pa.table({"k": pa.array(range(n + 1), pa.int64())}), path)
        paths.append(path)
    count = "SELECT count(*) AS x FROM lineitem"
    for round_ in range(2):
        for n, path in enumerate(paths):
            spec = scan_spec(4 + round_, n, count, (FileSplit(path),), SINGLE, ("x",), ("k",))
            (out,) = runner.run(spec)
            assert read(runner, out).column("x").to_pylist() == [n + 1]
            assert runner.scan_databases == min(n + 1 + round_ * len(paths), SCAN_DATABASES)
    # The first file's database was closed twice over; the one opened for it again
    # reads it and no other.
    other = f"SELECT count(*) AS x FROM read_parquet('{paths[1]}')"
    bad = scan_spec(6, 0, other, (FileSplit(paths[0]),), SINGLE, ("x",), ("k",))
    with pytest.raises(TaskFailedError) as info:
        runner.run(bad)
    assert isinstance(info.value.failure, NOT_RETRIED)


def test_one_scan_database_serves_every_table_of_a_job(
    runner: TaskRunner, data: list[str], tmp_path: Path
) -> None:
    """Tasks of a job scanning different tables share the slot's one database for the
    job's files; a fragment may read any file of the job's tables and none other."""
    outside = str(tmp_path / "secret.parquet")
    pq.write_table(pa.table({"l_quantity": pa.array([7], pa.int32())}), outside)
    job = (data[0], data[1])
    count = "SELECT count(*) AS x FROM lineitem"
    for n, path in enumerate(job):
        spec = dataclasses.replace(
            scan_spec(1, n, count, (FileSplit(path),), SINGLE, ("x",), ("l_quantity",)),
            job_files=job,
        )
        (out,) = runner.run(spec)
        assert read(runner, out).column("x").to_pylist() == [3000]
    assert (runner.scan_databases, runner.scan_databases_opened) == (1, 1)
    # A task of the job scanning data[0] may read data[1]: its query's table...
    sibling = f"SELECT count(*) AS x FROM read_parquet('{data[1]}')"
    spec = scan_spec(2, 0, sibling, (FileSplit(data[0]),), SINGLE, ("x",), ("l_quantity",))
    (out,) = runner.run(dataclasses.replace(spec, job_files=job))
    assert read(runner, out).column("x").to_pylist() == [3000]
    # ...but no file outside the job, nor change a setting.
    for k, sql in enumerate([f"SELECT count(*) AS x FROM read_parquet('{outside}')",
                             "SET allowed_paths = ['/etc/passwd']"]):  # fmt: skip
        bad = scan_spec(3, k, sql, (FileSplit(data[0]),), SINGLE, ("x",), ("l_quantity",))
        with pytest.raises(TaskFailedError) as info:
            runner.run(dataclasses.replace(bad, job_files=job))
        assert isinstance(info.value.failure, NOT_RETRIED)
    assert runner.scan_databases_opened == 1


def test_a_job_over_fewer_tables_gets_a_database_of_its_own(
    runner: TaskRunner, data: list[str]
) -> None:
    """A database is keyed by exactly its job's files: a later job over a subset of
    them does not run in the wider one, and cannot read the tables it does not scan."""
    count = "SELECT count(*) AS x FROM lineitem"
    wide = scan_spec(1, 0, count, (FileSplit(data[0]),), SINGLE, ("x",), ("l_quantity",))
    runner.run(dataclasses.replace(wide, job_files=(data[0], data[1])))
    other = f"SELECT count(*) AS x FROM read_parquet('{data[1]}')"
    narrow = scan_spec(2, 0, other, (FileSplit(data[0]),), SINGLE, ("x",), ("l_quantity",))
    with pytest.raises(TaskFailedError) as info:
        runner.run(dataclasses.replace(narrow, job_files=(data[0],)))
    assert isinstance(info.value.failure, NOT_RETRIED)
    assert (runner.scan_databases, runner.scan_databases_opened) == (2, 2)
    # The same job's files met again (in another order, from another job): no new one.
    again = scan_spec(3, 0, count, (FileSplit(data[1]),), SINGLE, ("x",), ("l_quantity",))
    (out,) = runner.run(dataclasses.replace(again, job_files=(data[1], data[0])))
    assert read(runner, out).column("x").to_pylist() == [3000]
    assert runner.scan_databases_opened == 2


def test_a_task_reads_its_own_files_whatever_its_job_names(
    runner: TaskRunner, data: list[str], tmp_path: Path
) -> None:
    """The task's own files are always readable (a job that named none, or a link to
    one), and an object-store path among the job's files is not given to DuckDB,
    which never reads those (pyarrow does)."""
    link = tmp_path / "link.parquet"
    link.symlink_to(data[1])
    count = "SELECT count(*) AS x FROM lineitem"
    splits = (FileSplit(data[0]), FileSplit(str(link)))
    spec = scan_spec(1, 0, count, splits, SINGLE, ("x",), ("l_quantity",))
    for n, job in enumerate([(), (data[0],), (str(link), "s3://bucket/t/part-0.parquet")]):
        task = dataclasses.replace(spec, attempt=attempt(1, n), job_files=job)
        (out,) = runner.run(task)
        assert read(runner, out).column("x").to_pylist() == [6000]
    # The three name the same two files once resolved (the s3:// one dropped).
    assert runner.scan_databases_opened == 1


# TPC-H q5's join stage at SF10 in miniature: lineitem x (orders x customer), then
# the suppliers of one region on two keys, one of them the nation (25 values).
_THREE_WAY = """
SELECT count(*) FROM (
  SELECT l.*, r.* FROM (
    SELECT l.*, r.* FROM li AS l JOIN oc AS r ON l.orderkey = r.orderkey
  ) AS l JOIN su AS r ON l.nationkey = r.nationkey AND l.suppkey = r.suppkey
)
"""


def _join_conditions_bottom_up(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The conditions of each hash join in DuckDB's plan, the innermost first."""
    con.register("li", pa.table({"orderkey": range(200_000), "suppkey": range(200_000)}))
    nations = [i % 25 for i in range(20_000)]
    con.register("oc", pa.table({"orderkey": range(20_000), "nationkey": nations}))
    con.register("su", pa.table({"suppkey": range(400), "nationkey": nations[:400]}))
    (node,) = json.loads(con.execute("EXPLAIN (FORMAT json) " + _THREE_WAY).fetchall()[0][1])
    found: list[str] = []

    def walk(n: dict[str, Any]) -> None:
        for child in n.get("children", []):
            walk(child)
        if n["name"] == "HASH_JOIN":
            found.append(json.dumps(n["extra_info"].get("Conditions")))

    walk(node)
    return found


def test_task_databases_keep_the_planners_join_order(tmp_path: Path) -> None:
    # Without statistics on its Arrow inputs, DuckDB's own reordering joins the
    # 20 000 orders to the 400 suppliers on the nation first: 320 000 rows here,
    # billions at SF10. The planner ordered the joins from the footers.
    plain = duckdb.connect()
    first = _join_conditions_bottom_up(plain)[0]
    assert "nationkey" in first and "orderkey" not in first  # the trap is real
    locked = locked_connection(str(tmp_path / "spill"), None, 1)
    first, second = _join_conditions_bottom_up(locked)
    assert "orderkey" in first and "nationkey" not in first
    assert "nationkey" in second


def _top_join_build_side(con: duckdb.DuckDBPyConnection) -> str:
    """The columns DuckDB's outermost hash join builds its table on (its right child)."""
    n = 200_000
    con.register(
        "li",
        pa.table(
            {
                "l_orderkey": pa.array(range(n), pa.int64()),
                "l_partkey": pa.array([i % 20_000 for i in range(n)], pa.int64()),
            }
        ),
    )
    con.register("p", pa.table({"p_partkey": pa.array(range(0, 20_000, 20), pa.int64())}))
    con.register("o", pa.table({"o_orderkey": pa.array(range(150_000), pa.int64())}))
    # TPC-H q9's lineitem task in miniature: the planner put the lineitem rows that
    # meet a part (10 000 of 200 000) on the right, the broadcast orders on the left.
    sql = (
        "SELECT count(*) FROM (SELECT l.*, r.* FROM o AS l JOIN (SELECT l.*, r.* FROM li AS l"
        " JOIN p AS r ON l.l_partkey = r.p_partkey) AS r ON l.o_orderkey = r.l_orderkey)"
    )
    assert con.execute(sql).fetchall() == [(7_500,)]
    (node,) = json.loads(con.execute("EXPLAIN (FORMAT json) " + sql).fetchall()[0][1])
    while node["name"] != "HASH_JOIN":
        (node,) = node["children"]
    return json.dumps(node["children"][1])


def test_task_databases_build_on_the_side_the_planner_put_right(tmp_path: Path) -> None:
    # DuckDB guesses the join of lineitem with the parts as big as lineitem and builds
    # on the 150 000 orders instead: at SF1 about 170 MB a task where the 10 000 rows
    # the planner put on the right take a few.
    assert "o_orderkey" in _top_join_build_side(duckdb.connect())  # the trap is real
    locked = locked_connection(str(tmp_path / "spill"), None, 1)
    build = _top_join_build_side(locked)
    assert "l_partkey" in build and "o_orderkey" not in build


def _operators(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[int, str]]:
    """(depth, operator) of DuckDB's plan of ``sql``, root first."""
    (node,) = json.loads(con.execute("EXPLAIN (FORMAT json) " + sql).fetchall()[0][1])
    found: list[tuple[int, str]] = []

    def walk(n: dict[str, Any], depth: int) -> None:
        found.append((depth, n["name"]))
        for child in n.get("children", []):
            walk(child, depth + 1)

    walk(node, 0)
    return found


def test_task_databases_aggregate_after_the_join(tmp_path: Path) -> None:
    # TPC-H q18's lineitem task in miniature: many rows joined to a few broadcast
    # keys, then grouped. DuckDB's partial aggregate pushdown groups all the rows
    # before the join; a task's database joins first (the join keeps few rows).
    sql = (
        "SELECT t.k, t.price, sum(t.qty) FROM (SELECT l.*, r.* FROM li AS l "
        "JOIN o AS r ON l.orderkey = r.k) AS t GROUP BY t.k, t.price"
    )

    def plan(con: duckdb.DuckDBPyConnection) -> list[tuple[int, str]]:
        con.register(
            "li", pa.table({"orderkey": [i // 4 for i in range(200_000)], "qty": range(200_000)})
        )
        con.register("o", pa.table({"k": list(range(0, 50_000, 1000)), "price": range(50)}))
        return _operators(con, sql)

    def groups_below_join(ops: list[tuple[int, str]]) -> bool:
        join = min(depth for depth, name in ops if name == "HASH_JOIN")
        return any(name == "HASH_GROUP_BY" and depth > join for depth, name in ops)

    assert groups_below_join(plan(duckdb.connect()))  # the trap is real
    locked = locked_connection(str(tmp_path / "spill"), None, 1)
    ops = plan(locked)
    assert not groups_below_join(ops)
    assert [name for _, name in ops].count("HASH_GROUP_BY") == 1


def test_side_scans_are_read_whole_by_the_task_next_to_its_split(
    runner: TaskRunner, data: list[str], tmp_path: Path
) -> None:
    """A task reads its split of one table and, whole, the small tables it joins:
    each under its own name, files readable by its SQL, none other. A small file
    with a ``file_row_number`` column is read through pyarrow instead."""
    pq.write_table(
        pa.table({"mode": pa.array(MODES[:3]), "rank": pa.array([1, 2, 3], pa.int32())}),
        tmp_path / "modes.parquet",
    )
    pq.write_table(
        pa.table({"file_row_number": pa.array([5, 6], pa.int64())}), tmp_path / "odd.parquet"
    )
    sql = (
        "SELECT m.rank AS r, count(*) AS n FROM lineitem AS l JOIN modes AS m "
        "ON l.l_shipmode = m.mode WHERE l.l_quantity IN (SELECT file_row_number FROM odd) "
        "GROUP BY m.rank"
    )
    spec = TaskSpec(
        attempt=attempt(1, 0),
        sql=sql,
        output=SINGLE,
        columns=("r", "n"),
        scans=(
            ScanSpec(
                "lineitem", "lineitem", ("l_shipmode", "l_quantity"), (FileSplit(data[0], (1,)),)
            ),
            ScanSpec(
                "modes", "modes", ("mode", "rank"), (FileSplit(str(tmp_path / "modes.parquet")),)
            ),
            ScanSpec(
                "odd", "odd", ("file_row_number",), (FileSplit(str(tmp_path / "odd.parquet")),)
            ),
        ),
    )
    (out,) = runner.run(spec)
    expected = duckdb.sql(
        f"SELECT m.rank AS r, count(*) AS n FROM read_parquet('{data[0]}') AS l "
        f"JOIN read_parquet('{tmp_path / 'modes.parquet'}') AS m ON l.l_shipmode = m.mode "
        "WHERE l.l_quantity IN (5, 6) AND l.l_orderkey BETWEEN 250 AND 499 GROUP BY m.rank"
    ).to_arrow_table()
    got = read(runner, out)
    assert sorted(got.to_pylist(), key=str) == sorted(expected.to_pylist(), key=str)
    assert got.num_rows > 0
    # a side scan without a split of its own: still only the files it names
    other = TaskSpec(
        attempt=attempt(2, 0),
        sql=f"SELECT count(*) AS n FROM read_parquet('{data[1]}')",
        output=SINGLE,
        columns=("n",),
        scans=(
            ScanSpec("modes", "modes", ("mode",), (FileSplit(str(tmp_path / "modes.parquet")),)),
        ),
    )
    with pytest.raises(TaskFailedError) as info:
        runner.run(other)
    assert isinstance(info.value.failure, NOT_RETRIED)


def test_a_fragment_with_its_own_with_clause_reads_its_scan(
    runner: TaskRunner, data: list[str]
) -> None:
    # The scan is put in front of the fragment as a CTE, or as a view for a
    # fragment that starts with WITH itself.
    for sql in (
        "SELECT count(*) AS n FROM lineitem WHERE l_quantity > 10",
        "WITH big AS (SELECT * FROM lineitem WHERE l_quantity > 10) SELECT count(*) AS n FROM big",
    ):
        spec = scan_spec(1, 0, sql, (FileSplit(data[0], (0,)),), SINGLE, ("n",), ("l_quantity",))
        (out,) = runner.run(spec)
        expected = duckdb.sql(
            f"SELECT count(*) FROM read_parquet('{data[0]}') "
            "WHERE l_quantity > 10 AND l_orderkey < 250"
        ).fetchall()
        assert read(runner, out).column("n").to_pylist() == [expected[0][0]]


def test_an_input_named_once_is_streamed_and_one_named_twice_read_whole(
    runner: TaskRunner, data: list[str]
) -> None:
    # A stream can be read once: an input the fragment names once is streamed
    # (its pages never mapped: issue 19), one it names twice (a self-join here)
    # must be read whole, or the second read would see no rows.
    maps = map_stage(runner, data)
    streamed: list[int] = []
    stream_many = runner.reader.stream_many

    def spy(locs: Any) -> pa.RecordBatchReader:
        streamed.append(len(locs))
        return stream_many(locs)

    runner.reader.stream_many = spy  # type: ignore[method-assign]
    cols = ("mode", "revenue", "n")
    once = 'SELECT mode, sum(revenue) AS revenue, sum(n) AS n FROM "s1" GROUP BY mode'
    twice = (
        'SELECT a.mode, sum(a.revenue) AS revenue, sum(b.n) AS n FROM "s1" AS a '
        'JOIN "s1" AS b ON a.mode = b.mode GROUP BY a.mode'
    )
    got: dict[str, list[pa.Table]] = {"once": [], "twice": []}
    for name, sql in (("once", once), ("twice", twice)):
        for p in range(4):
            spec = TaskSpec(
                attempt=attempt(2 if name == "once" else 3, p),
                sql=sql,
                output=SINGLE,
                columns=cols,
                inputs=(
                    InputLocations(
                        "s1", StageId(1), InputMode.PARTITION, locations(1, maps, p), cols
                    ),
                ),
                result=True,  # read here as a client reads it
            )
            (out,) = runner.run(spec)
            got[name].append(read(runner, out))
    assert streamed == [2, 2, 2, 2]  # the four "once" tasks, each over both map tasks
    rows = duckdb.sql(
        "SELECT l_shipmode AS mode, sum(l_price) AS revenue, count(*) AS n "
        f"FROM read_parquet({data!r}) WHERE l_quantity > 10 GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert len(rows) > 1
    for name, tables in got.items():
        result = pa.concat_tables(tables).sort_by("mode")
        assert result.column("mode").to_pylist() == [r[0] for r in rows]
        # A self-join on the mode multiplies each side's rows by the other's: the
        # partials of one mode are one row per map task that saw it.
        per_mode = {r[0]: r for r in rows}
        for mode, revenue, n in zip(*(result.column(c).to_pylist() for c in cols), strict=True):
            copies = 1 if name == "once" else _map_rows(maps, mode)
            assert revenue == pytest.approx(per_mode[mode][1] * copies), (name, mode)
            assert n == per_mode[mode][2] * copies, (name, mode)


def _map_rows(maps: dict[int, tuple[PartitionOutput, ...]], mode: str) -> int:
    """How many map tasks wrote a partial row for ``mode``."""
    seen = 0
    for outs in maps.values():
        for out in outs:
            with pa.memory_map(out.path) as source:
                table = pa.ipc.open_file(source).read_all()
            seen += table.column("mode").to_pylist().count(mode)
    return seen


def test_read_once_only_where_the_fragment_names_the_input_once_without_with() -> None:
    assert runner_mod.read_once('SELECT * FROM "s1"', "s1")
    assert not runner_mod.read_once('SELECT * FROM "s1" a JOIN "s1" b USING (k)', "s1")
    assert not runner_mod.read_once('WITH x AS (SELECT * FROM "s1") SELECT * FROM x', "s1")
    assert not runner_mod.read_once("SELECT * FROM s1", "s1")  # unquoted: read whole
    assert runner_mod.read_once('SELECT * FROM "s12" JOIN "s1" USING (k)', "s1")


def test_the_first_task_of_a_job_has_its_catalog_files_learned_ahead(
    runner: TaskRunner, tmp_path: Path
) -> None:
    """A task's job files (its catalog's) have their footers and column types read on
    a low-priority thread, so the first task to scan each table need not; a catalog
    of more files than ``LEARN_AHEAD_FILES`` is left to the tasks."""
    files = []
    for n in range(3):
        path = str(tmp_path / f"t{n}.parquet")
        pq.write_table(pa.table({"k": pa.array([n], pa.int64()), "s": ["x"]}), path)
        files.append(path)
    other = str(tmp_path / "other.parquet")
    pq.write_table(pa.table({"k": pa.array([9], pa.int64())}), other)
    spec = dataclasses.replace(
        scan_spec(1, 0, "SELECT count(*) AS x FROM lineitem", (FileSplit(files[0]),), SINGLE,
                  ("x",), ("k",)),
        job_files=tuple(files),
    )  # fmt: skip
    (out,) = runner.run(spec)
    assert read(runner, out).column("x").to_pylist() == [1]

    def known(path: str) -> bool:
        with scan_mod._TYPES_LOCK:
            types = any(k[0] == path for k in scan_mod._TYPES)
        with scan_mod._METADATA_LOCK:
            return types and any(k[0] == path for k in scan_mod._METADATA)

    # The learner's queue is one thread: what runs after it has seen the files learned.
    priority = scan_mod._LEARNER.submit(
        lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    ).result(timeout=30)
    assert all(known(p) for p in files[1:]), "the job's other files were not learned ahead"
    assert priority == 19  # the learner runs on cores the tasks leave idle
    assert scan_mod._TYPES[(files[2], *_stat(files[2]), "s")] == ("VARCHAR", "VARCHAR")
    many = (other, *(f"{other}-{n}" for n in range(scan_mod.LEARN_AHEAD_FILES)))
    scan_mod.learn_ahead(many)
    scan_mod._LEARNER.submit(lambda: None).result(timeout=30)
    assert not known(other)


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


def test_a_whole_query_task_has_duckdb_order_its_joins(runner: TaskRunner, data: list[str]) -> None:
    """A task that runs the user's query whole (a plan that fell back) gets a database
    with DuckDB's join order on; a planned fragment's keeps it off, as the planner
    placed its joins. Both stay locked down and confined to the task's files."""
    sql = "SELECT current_setting('disabled_optimizers') AS d, count(*) AS n FROM lineitem"
    for n, whole in enumerate((False, True, False)):
        spec = dataclasses.replace(
            scan_spec(1, n, sql, (FileSplit(data[0]),), SINGLE, ("d", "n"), ("l_orderkey",)),
            whole_query=whole,
        )
        (out,) = runner.run(spec)
        disabled, rows = read(runner, out).to_pylist()[0].values()
        assert rows == 3000
        assert ("join_order" in disabled) is not whole, (whole, disabled)
        assert "build_side_probe_side" in disabled or whole, disabled
    # With no file to scan (its tables gathered from stages, or read from a store).
    (out,) = runner.run(
        TaskSpec(attempt(2, 0), sql.split(",")[0], SINGLE, ("d",), whole_query=True)
    )
    assert "join_order" not in read(runner, out).column("d").to_pylist()[0]
    with pytest.raises(TaskFailedError) as info:
        runner.run(
            TaskSpec(
                attempt(2, 1), "SET disabled_optimizers = ''", SINGLE, ("x",), whole_query=True
            )
        )
    assert isinstance(info.value.failure, NOT_RETRIED)
