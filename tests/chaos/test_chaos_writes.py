"""A write statement's executors fail mid-write; the output is still there exactly once.

Each test starts its own 2-executor ``TestCluster`` (2 slots each; TPC-H SF 0.1,
scans of 100 000 rows: ``lineitem`` is written by six tasks, stage 1) and runs
``COPY (SELECT ... FROM lineitem) TO dir`` while a fault rule
(``mangonel.testing.faults``, ``when: task_writing``) hits a writing task half-way
through its staged file. The test confirms where the fault landed (the executor
stopped with a staged file open and unfinished; the scheduler's attempts), then
reads the location back through its manifest and compares it with DuckDB.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_result, is_stopped, wait_until

from mangonel.client.session import Result
from mangonel.output import MANIFEST, STAGING
from mangonel.testing.cluster import TestCluster

pytestmark = pytest.mark.timeout(150)

QUERY = (
    "SELECT l_orderkey, l_linenumber, l_extendedprice, l_comment FROM lineitem "
    "WHERE l_orderkey % 8 = 0"
)
WRITING = 1
"""The writing stage: the query is one stage (then the count's)."""
FREEZE_MID_WRITE = {"action": "freeze", "when": "task_writing", "stage": WRITING, "attempt": 0}
"""Executor 0 stops half-way through the first file it writes for a task's first
attempt: no other attempt of that task runs before the test sees the file."""


class Writes:
    def __init__(self, cluster: TestCluster, target: Path, reference: Path) -> None:
        self.cluster = cluster
        self.session = cluster.connect()
        self.session.register_parquet("lineitem", str(reference))
        self.target = target
        self.reference = duckdb.connect()
        self.reference.execute(f"CREATE VIEW lineitem AS SELECT * FROM read_parquet('{reference}')")
        self.outcome: dict[str, Any] = {}
        self.runner: threading.Thread | None = None

    def start(self) -> None:
        sql = f"COPY ({QUERY}) TO '{self.target}' (FORMAT parquet)"

        def run() -> None:
            try:
                self.outcome["result"] = self.session.sql(sql)
            except BaseException as exc:  # noqa: BLE001 - reported by finish()
                self.outcome["error"] = exc

        self.runner = threading.Thread(target=run)
        self.runner.start()

    def finish(self) -> Result:
        assert self.runner is not None
        self.runner.join(120)
        assert not self.runner.is_alive(), "the COPY did not finish"
        if "error" in self.outcome:
            raise AssertionError(f"the COPY failed: {self.outcome['error']!r}")
        result: Result = self.outcome["result"]
        return result

    def staged(self) -> list[Path]:
        """Every file staged under the location now."""
        root = self.target / STAGING
        return [Path(r) / f for r, _, names in os.walk(root) for f in names]

    def check_once(self, result: Result) -> dict[str, Any]:
        """The count and the rows are DuckDB's, once; nothing else is there."""
        expected = self.reference.sql(QUERY).to_arrow_table()
        assert result.to_arrow()["Count"].to_pylist() == [expected.num_rows]
        doc = json.loads((self.target / MANIFEST).read_text())
        files = [str(self.target / f) for f in doc["files"]]
        tasks = {f.split("-p")[-1].split("-")[0] for f in doc["files"]}
        assert len(tasks) == 6, doc["files"]
        actual = duckdb.connect().sql(f"SELECT * FROM read_parquet({files!r})").to_arrow_table()
        assert_same_result(actual, expected, ordered=False)
        with urllib.request.urlopen(
            f"{self.cluster.web_url}/api/jobs/{result.job_id}", timeout=10
        ) as answer:
            job: dict[str, Any] = json.load(answer)
        return job


def _writes(work_dir: Path, tpch_tables: dict[str, Path], *, speculation: bool) -> Iterator[Writes]:
    out = work_dir / "out"
    out.mkdir()
    cluster = TestCluster(
        executors=2,
        slots=2,
        work_dir=work_dir / "cluster",
        heartbeat_timeout=2.0,
        web_port=0,
        speculation=speculation,
        speculation_min=0.5,
        scheduler_args=(
            "--split-rows",
            "100000",
            "--write-root",
            str(out),
            "--speculation-quantile",
            "0.5",
        ),
    )
    cluster.start()
    try:
        yield Writes(cluster, out / "lineitem", tpch_tables["lineitem"])
    finally:
        cluster.stop()


@pytest.fixture
def writes(work_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[Writes]:
    """Speculation on: a slow writing attempt gets a copy on the other executor."""
    yield from _writes(work_dir, tpch_tables, speculation=True)


@pytest.fixture
def frozen_writes(work_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[Writes]:
    """Speculation off: a frozen attempt's task runs again only once its executor is
    lost (2 s without a heartbeat) or killed. With it on, a copy could win and the
    job commit, and the commit sweep the frozen attempt's half-written file, before
    the test looked for that file (CI saw it once)."""
    yield from _writes(work_dir, tpch_tables, speculation=False)


def _unfinished(path: Path) -> bool:
    try:
        pq.read_metadata(path)
    except Exception:  # noqa: BLE001 - any reader error: no footer yet
        return True
    return False


def test_an_executor_killed_mid_write_leaves_one_copy(frozen_writes: Writes) -> None:
    writes = frozen_writes
    victim = writes.cluster.executors[0]
    writes.cluster.set_faults(0, [FREEZE_MID_WRITE])
    writes.start()
    wait_until(lambda: is_stopped(victim.pid), "the executor stops mid-write")
    # Confirmed mid-write: its attempt's staged file is there and has no footer.
    partial = [p for p in writes.staged() if _unfinished(p)]
    assert partial, writes.staged()
    writes.cluster.kill_executor(0)
    job = writes.check_once(writes.finish())
    stage = next(s for s in job["stages"] if s["id"] == WRITING)
    assert stage["tasks_rerun"] + stage["outputs_recomputed"] >= 1, stage
    assert not (writes.target / STAGING).exists()
    for p in partial:
        assert not p.exists()


def test_a_frozen_writer_that_thaws_after_the_commit_changes_nothing(
    frozen_writes: Writes,
) -> None:
    writes = frozen_writes
    victim = writes.cluster.executors[0]
    writes.cluster.set_faults(0, [FREEZE_MID_WRITE])
    writes.start()
    wait_until(lambda: is_stopped(victim.pid), "the executor stops mid-write")
    assert any(_unfinished(p) for p in writes.staged()), writes.staged()
    result = writes.finish()  # its tasks ran again on the other executor
    committed = (writes.target / MANIFEST).read_text()
    writes.cluster.set_faults(0, [])
    victim.signal(signal.SIGCONT)
    # The thawed attempt finds itself cut off and cancelled: what it staged goes.
    wait_until(lambda: not writes.staged(), "the thawed attempt's files are removed", 30)
    assert (writes.target / MANIFEST).read_text() == committed
    writes.check_once(result)


def test_two_attempts_of_a_task_both_write_and_one_is_committed(writes: Writes) -> None:
    # Executor 0's writing attempts stall half-way through their files; their
    # speculative copies on executor 1 write theirs and win.
    writes.cluster.set_faults(
        0,
        [
            {
                "action": "delay",
                "seconds": 10,
                "stage": WRITING,
                "attempt": 0,
                "when": "task_writing",
            }
        ],
    )
    writes.start()
    job = writes.check_once(writes.finish())
    stage = next(s for s in job["stages"] if s["id"] == WRITING)
    assert stage["speculated"] >= 1 and stage["speculation_won"] >= 1, stage
    attempts = [a for a in job["attempts"] if a["stage"] == WRITING]
    won = [a for a in attempts if a["kind"] == "speculative" and a["state"] == "succeeded"]
    beaten = [a for a in attempts if a["attempt"] == 0 and a["state"] == "cancelled"]
    assert won and beaten, attempts
    log = writes.cluster.executors[0].log_tail(1 << 20)
    assert "injected fault: delay" in log  # the beaten attempts were mid-write
    wait_until(lambda: not (writes.target / STAGING).exists(), "nothing staged is left", 30)
