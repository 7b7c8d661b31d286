"""The fault-injection rules (``testing.faults``): parsing, matching, firing once.

Signals are recorded by a fake ``signal_self`` instead of being sent, so a kill
rule can be tested without killing pytest. Files are real.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from mangonel.executor.failures import TaskFailedError
from mangonel.executor.shuffle import ShuffleReader
from mangonel.executor.shuffle_write import ShuffleWriter, file_checksum
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.task import ExecutionError, FetchProblem, PartitionLocation, PartitionOutput
from mangonel.testing.faults import FaultFileError, FaultInjector, parse_rules, write_rules


def att(stage: int, partition: int = 0, attempt: int = 0, job: str = "j1") -> TaskAttemptId:
    return TaskAttemptId(TaskId(JobId(job), StageId(stage), partition), attempt)


class Faults:
    """A FaultInjector on a file in ``tmp_path`` that records the signals it sends."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "faults.json"
        self.signals: list[int] = []
        self.sleeps: list[float] = []
        self.injector = FaultInjector(
            str(self.path), "7", signal_self=self.signals.append, sleep=self.sleeps.append
        )

    def set(self, rules: list[dict[str, Any]]) -> None:
        write_rules(str(self.path), rules)


@pytest.fixture()
def faults(tmp_path: Path) -> Faults:
    return Faults(tmp_path)


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("rules", "match"),
    [
        ({"action": "fail", "stage": 1}, "list"),
        ([{"action": "explode", "stage": 1}], "action must be one of"),
        ([{"action": "fail"}], "fail needs a stage"),
        ([{"action": "fail", "stage": 1, "nth": 2}], "takes no nth"),
        ([{"action": "kill", "when": "sometime"}], "when must be"),
        ([{"action": "kill", "stage": 0}], "stage must be an integer >= 1"),
        ([{"action": "kill", "nth": True}], "nth must be an integer"),
        ([{"action": "kill", "before_report": True}], "needs when=task_finished"),
        ([{"action": "corrupt", "partition": "0"}], "partition must be an integer"),
        ([{"action": "delay", "stage": 1}], "delay needs seconds > 0"),
        ([{"action": "delay", "seconds": "2"}], "delay needs seconds > 0"),
        ([{"action": "fail", "stage": 1, "seconds": 2}], "takes no seconds"),
    ],
)
def test_bad_rules_are_refused_with_a_reason(rules: object, match: str) -> None:
    with pytest.raises(FaultFileError, match=match):
        parse_rules(rules)


def test_defaults_follow_the_contract() -> None:
    fail, kill, corrupt = parse_rules(
        [
            {"action": "fail", "stage": 2},
            {"action": "kill"},
            {"action": "corrupt", "stage": 1},
        ]
    )
    assert (fail.partition, fail.attempt) == (None, 0)
    assert (kill.when.value, kill.stage, kill.nth, kill.before_report) == (
        "task_started",
        None,
        1,
        False,
    )
    assert (corrupt.map_partition, corrupt.partition) == (None, None)


def test_write_rules_checks_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    with pytest.raises(FaultFileError):
        write_rules(str(path), [{"action": "nope"}])
    assert not path.exists()
    write_rules(str(path), [])
    assert json.loads(path.read_text()) == []


# ------------------------------------------------------------------- fail


def test_fail_hits_the_named_attempt_once(faults: Faults) -> None:
    faults.set([{"action": "fail", "stage": 2, "partition": 1}])
    faults.injector.task_started(att(1, 1))  # other stage
    faults.injector.task_started(att(2, 0))  # other partition
    faults.injector.task_started(att(2, 1, attempt=1))  # attempt 1: the rule says 0
    with pytest.raises(TaskFailedError) as info:
        faults.injector.task_started(att(2, 1))
    failure = info.value.failure
    assert isinstance(failure, ExecutionError)  # retryable
    assert failure.message.startswith("injected fault: fail stage 2 partition 1 attempt 0")
    assert "executor 7" in failure.message
    faults.injector.task_started(att(2, 1, job="j2"))  # fired once: no more
    assert faults.signals == []


# ------------------------------------------------------------------- delay


def test_delay_slows_every_matching_task_and_is_never_spent(faults: Faults) -> None:
    faults.set(
        [
            {"action": "delay", "seconds": 2, "stage": 1, "partition": 3, "attempt": 0},
            {"action": "delay", "seconds": 0.5, "stage": 1},
        ]
    )
    faults.injector.task_started(att(2, 3))  # other stage: not delayed
    faults.injector.task_started(att(1, 3))  # both match: the longer wins
    faults.injector.task_started(att(1, 3, attempt=1))  # a copy: only the stage-wide one
    faults.injector.task_started(att(1, 3, job="j2"))  # still armed
    assert faults.sleeps == [2.0, 0.5, 2.0]
    assert faults.injector.armed[0].describe() == "delay stage 1 partition 3 attempt 0 by 2 s"
    assert faults.signals == []


# -------------------------------------------------------------- kill / freeze


def test_kill_counts_tasks_of_its_stage_and_fires_once(faults: Faults) -> None:
    faults.set([{"action": "kill", "when": "task_started", "stage": 3, "nth": 2}])
    faults.injector.task_started(att(3, 0))
    faults.injector.task_started(att(1, 0))  # not stage 3: not counted
    assert faults.signals == []
    faults.injector.task_started(att(3, 1))
    assert faults.signals == [signal.SIGKILL]
    faults.injector.task_started(att(3, 2))
    faults.injector.task_started(att(3, 3))
    assert faults.signals == [signal.SIGKILL]


def test_finished_rules_fire_before_or_after_the_report(faults: Faults) -> None:
    faults.set(
        [
            {"action": "freeze", "when": "task_finished", "before_report": True},
            {"action": "kill", "when": "task_finished", "stage": 2},
        ]
    )
    faults.injector.task_started(att(2))  # started, not finished: nothing
    assert faults.signals == []
    faults.injector.task_finished(att(2), before_report=True)
    assert faults.signals == [signal.SIGSTOP]
    faults.injector.task_finished(att(2), before_report=False)
    assert faults.signals == [signal.SIGSTOP, signal.SIGKILL]


def test_rewriting_the_same_rules_does_not_rearm_them(faults: Faults) -> None:
    rule = {"action": "freeze", "when": "task_started"}
    faults.set([rule])
    faults.injector.task_started(att(1))
    faults.set([rule])  # same rule, same position: it fired already
    faults.injector.task_started(att(1, 1))
    assert faults.signals == [signal.SIGSTOP]
    faults.set([rule, rule])  # a rule at a new position is a new rule
    faults.injector.task_started(att(1, 2))
    assert faults.signals == [signal.SIGSTOP, signal.SIGSTOP]


def test_counting_starts_when_a_rule_is_read(faults: Faults) -> None:
    faults.injector.task_started(att(1, 0))  # no file yet
    faults.set([{"action": "kill", "nth": 2}])
    faults.injector.task_started(att(1, 1))
    assert faults.signals == []
    faults.injector.task_started(att(1, 2))
    assert faults.signals == [signal.SIGKILL]


def test_cleared_missing_or_bad_files_inject_nothing(faults: Faults) -> None:
    faults.set([{"action": "kill"}])
    faults.set([])
    faults.injector.task_started(att(1))
    faults.set([{"action": "kill"}])
    os.remove(faults.path)
    faults.injector.task_started(att(1))
    faults.path.write_text("{not json")
    faults.injector.task_started(att(1))
    assert faults.signals == [] and faults.injector.armed == []
    assert FaultInjector(None).armed == []


# ------------------------------------------------------------ corrupt / delete


def _outputs(tmp_path: Path, attempt: TaskAttemptId, partitions: int) -> list[PartitionOutput]:
    writer = ShuffleWriter(str(tmp_path / "shuffle"))
    table = pa.table({"k": pa.array(range(1000), pa.int64())})
    with writer.open(attempt, partitions, table.schema) as sink:
        for p in range(partitions):
            sink.write_table(p, table)
        return list(sink.commit())


def test_corrupt_flips_bytes_of_the_named_file_only(faults: Faults, tmp_path: Path) -> None:
    faults.set([{"action": "corrupt", "stage": 1, "map_partition": 0, "partition": 1}])
    other = _outputs(tmp_path, att(1, 1), 2)  # map partition 1: untouched
    faults.injector.outputs_written(att(1, 1), other)
    outs = _outputs(tmp_path, att(1, 0), 2)
    faults.injector.outputs_written(att(1, 0), outs)
    assert [file_checksum(o.path) == o.checksum for o in other + outs] == [
        True,
        True,
        True,
        False,
    ]
    # A reader on this host finds it bad, and says the file (not the executor) is lost.
    bad = outs[1]
    loc = PartitionLocation(
        ExecutorId("e1"),
        "h",
        "127.0.0.1:1",
        StageId(1),
        0,
        1,
        bad.path,
        bad.rows,
        bad.bytes,
        bad.checksum,
    )
    with pytest.raises(TaskFailedError) as info:
        ShuffleReader("h").read(loc)
    assert getattr(info.value.failure, "problem", None) is FetchProblem.OUTPUT_LOST
    # Fired: the next task that fits is left alone.
    again = _outputs(tmp_path, att(1, 0, attempt=1), 2)
    faults.injector.outputs_written(att(1, 0, attempt=1), again)
    assert all(file_checksum(o.path) == o.checksum for o in again)


def test_delete_without_partition_removes_every_file_of_the_task(
    faults: Faults, tmp_path: Path
) -> None:
    faults.set([{"action": "delete", "stage": 1}])
    outs = _outputs(tmp_path, att(1, 3), 3)
    faults.injector.outputs_written(att(1, 3), outs)
    assert not any(os.path.exists(o.path) for o in outs)
    later = _outputs(tmp_path, att(1, 4), 3)
    faults.injector.outputs_written(att(1, 4), later)
    assert all(os.path.exists(o.path) for o in later)


def test_kill_may_name_the_attempt_it_hits(faults: Faults) -> None:
    faults.set([{"action": "kill", "stage": 1, "attempt": 1}])
    faults.injector.task_started(att(1, 0))  # attempt 0: not counted
    assert faults.signals == []
    faults.injector.task_started(att(1, 0, attempt=1))  # a copy or a re-run
    assert faults.signals == [signal.SIGKILL]
