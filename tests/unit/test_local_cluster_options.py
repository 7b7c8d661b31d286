"""The command-line options ``LocalCluster`` and ``TestCluster`` give each executor.

No processes: only the options are built (the clusters' behaviour with real
processes is in ``tests/integration``).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from mangonel.client.cluster import EXECUTOR_KEYWORDS, SCHEDULER_KEYWORDS, LocalCluster
from mangonel.options import Takes, option, to_argv
from mangonel.testing.cluster import TestCluster


def test_each_executor_gets_the_shared_options_then_its_own(tmp_path: Path) -> None:
    cluster = LocalCluster(
        work_dir=tmp_path,
        executor_args=("--threads", "1"),
        executor_args_for=lambda i: ("--memory-limit", f"{i + 1}GB"),
    )
    assert cluster.executor_options(0) == ["--threads", "1", "--memory-limit", "1GB"]
    assert cluster.executor_options(2) == ["--threads", "1", "--memory-limit", "3GB"]
    assert LocalCluster(work_dir=tmp_path).executor_options(0) == []


def test_the_test_cluster_adds_each_executors_fault_file(tmp_path: Path) -> None:
    cluster = TestCluster(
        work_dir=tmp_path, executor_args_for=lambda i: ("--memory-limit", f"{i + 1}GB")
    )
    faults = tmp_path.resolve() / "faults" / "executor-1.json"
    assert cluster.faults_path(1) == faults
    assert cluster.executor_options(1) == ["--memory-limit", "2GB", "--faults-file", str(faults)]
    assert not hasattr(LocalCluster(work_dir=tmp_path), "set_faults")


def test_executors_on_one_host_share_its_memory_unless_told(tmp_path: Path) -> None:
    from mangonel.executor.memory import default_budget

    two = LocalCluster(executors=2, work_dir=tmp_path)
    assert two.executor_memory_share() == default_budget() // 2
    assert LocalCluster(executors=4, work_dir=tmp_path).executor_memory_share() * 2 <= (
        two.executor_memory_share()
    )


def _gray_argv(cluster: LocalCluster) -> list[str]:
    gray = ("speculation", "speculation_min_s", "exclusion_failures", "exclusion_s")
    settings = cluster.scheduler_settings()
    return to_argv(Takes.SCHEDULER, {k: settings[k] for k in gray})


def test_speculation_and_exclusion_reach_the_scheduler_only_when_given(tmp_path: Path) -> None:
    assert _gray_argv(LocalCluster(work_dir=tmp_path)) == []
    cluster = LocalCluster(
        work_dir=tmp_path,
        speculation=False,
        speculation_min=0.2,
        exclusion_failures=0,
        exclusion_time=5.0,
    )
    assert _gray_argv(cluster) == [
        "--no-speculation",
        "--speculation-min",
        "0.2",
        "--exclusion-failures",
        "0",
        "--exclusion-time",
        "5.0",
    ]
    assert _gray_argv(LocalCluster(work_dir=tmp_path, speculation=True)) == ["--speculation"]
    # A fault rule must not race a copy of the task it hits: off unless asked for.
    assert _gray_argv(TestCluster(work_dir=tmp_path)) == ["--no-speculation"]
    assert _gray_argv(TestCluster(work_dir=tmp_path, speculation=True)) == ["--speculation"]


def test_scheduler_options_win_and_a_wrong_name_fails_at_once(tmp_path: Path) -> None:
    cluster = LocalCluster(
        work_dir=tmp_path,
        partitions=2,
        scheduler_options={"partitions": 3, "split_rows": 10_000},
    )
    settings = cluster.scheduler_settings()
    assert settings["partitions"] == 3
    assert settings["split_rows"] == 10_000
    with pytest.raises(KeyError, match="split_row"):
        LocalCluster(work_dir=tmp_path, scheduler_options={"split_row": 1})


def test_keywords_that_set_an_option_state_no_default_of_their_own() -> None:
    params = inspect.signature(LocalCluster.__init__).parameters
    for keywords, process in (
        (SCHEDULER_KEYWORDS, Takes.SCHEDULER),
        (EXECUTOR_KEYWORDS, Takes.EXECUTOR),
    ):
        for keyword, dest in keywords.items():
            option(process, dest)  # KeyError: the process takes no such option
            assert params[keyword].default is None, keyword


def test_a_default_cluster_gives_the_scheduler_only_the_tables_local_heartbeat(
    tmp_path: Path,
) -> None:
    heartbeat = option(Takes.SCHEDULER, "heartbeat_timeout_s")
    local = heartbeat.default_for(Takes.STANDALONE)
    assert local != heartbeat.default  # a cluster on one host has its own
    argv = to_argv(Takes.SCHEDULER, LocalCluster(work_dir=tmp_path).scheduler_settings())
    assert argv == ["--heartbeat-timeout", str(local)]
    given = LocalCluster(work_dir=tmp_path, heartbeat_timeout=3.0, max_task_attempts=2)
    assert to_argv(Takes.SCHEDULER, given.scheduler_settings()) == [
        "--heartbeat-timeout",
        "3.0",
        "--max-task-attempts",
        "2",
    ]
