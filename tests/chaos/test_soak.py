"""The randomized fault run (``scripts/soak.py``), short: every kind of fault, every
answer right, every write there exactly once.

The script itself is what runs: a real ``LocalCluster`` with SQLite state, three
clients querying TPC-H at once and one writing a table of its own (INSERTs of
several tasks' files, CREATE TABLE AS and DROP, CREATE OR REPLACE) and reading it
back, executors killed, frozen and drained and the scheduler killed and frozen at
random, each answer compared with DuckDB's. Seed 8 picks all five kinds of fault among
its first five (the order of the kinds depends on the seed alone). Then the same
with two schedulers over a real etcd, one leading and one standing by, the leader
killed first: a failover in the middle of it all; and etcd itself killed and
frozen too (``--etcd-faults``).
Its first run, on a scheduler that could not restore a queued job, failed at the
first scheduler kill: every later restart refused the store. The longer runs and
how to make them are in the README.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO_ROOT

pytestmark = pytest.mark.timeout(300)


FAULTS = {
    "kill_executor",
    "freeze_executor",
    "drain_executor",
    "kill_scheduler",
    "freeze_scheduler",
}
ETCD_FAULTS = {"kill_etcd", "freeze_etcd"}


def soak(
    work_dir: Path, *args: str, faults: set[str] = FAULTS, minutes: float = 0.75
) -> dict[str, Any]:
    """Run ``scripts/soak.py`` for ``minutes`` (45 s) with one writer and ``args``;
    its report, once every check of a run without a failure held, every kind of
    ``faults`` done among them."""
    report_path = work_dir / "soak.json"
    printed = work_dir / "soak.out"  # each statement and fault as it happened, kept
    with printed.open("w") as out:
        done = subprocess.run(
            [
                sys.executable,
                str(REPO_ROOT / "scripts" / "soak.py"),
                "--minutes", str(minutes),
                "--fault-every", "3",
                "--writers", "1",
                "--json", str(report_path),
                "--work-dir", str(work_dir / "soak"),
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=280,
        )  # fmt: skip
    assert report_path.exists(), printed.read_text()[-6000:]
    report: dict[str, Any] = json.loads(report_path.read_text())
    assert report["failures"] == [], report["failures"]
    assert done.returncode == 0 and report["ok"], printed.read_text()[-3000:]
    assert report["queries"] >= 20 and report["correct"] == report["queries"], report
    # The writer wrote each way and read its table back, and writes met faults.
    assert {"insert_select", "insert_values", "create_table_as", "drop"} <= set(
        report["by_write"]
    ), report["by_write"]
    assert report["checks"] >= 3 and report["writes_met_faults"] >= 1, report
    # Every kind of fault happened, the scheduler's kill and freeze among them.
    assert set(report["faults"]) == faults, report["faults"]
    return report


def test_a_short_randomized_fault_run_answers_every_query_right(work_dir: Path) -> None:
    soak(work_dir, "--seed", "8")


def test_a_randomized_fault_run_with_a_standby_scheduler_fails_over_under_it(
    work_dir: Path,
) -> None:
    # Seed 3763 kills the leading scheduler first: the standby takes the lead of the
    # etcd store while the writer and the clients run; etcd is then frozen and
    # killed too: each of the seven kinds came within 45 s (7 or 8 faults), and the
    # run lasts 60 s so that a slower machine sees them all too. Its run with seed 91
    # found a write's lost answer given after 38 s: the client asked the dead
    # scheduler alone whether the executor holding it was lost.
    args = ("--seed", "3763", "--state", "etcd", "--schedulers", "2", "--etcd-faults")
    report = soak(work_dir, *args, faults=FAULTS | ETCD_FAULTS, minutes=1.0)
    assert report["schedulers"] == 2
    assert report["leader_faults"].get("kill_scheduler", 0) >= 1, report["leader_faults"]
