"""Fault injection: rules in a JSON file make an executor fail, die, freeze, lose files or
run slow.

``FaultInjector`` implements the executor's ``TaskHooks`` protocol
(``mangonel.executor.hooks``); ``executor.main`` builds one only when the
executor is given ``--faults-file``, so production executors never load this
module.

Chaos tests need faults that hit the same point of a query on every run, so the
rules name *what* to hit (a stage, a partition, the N-th task) rather than *when*.
``LocalCluster.set_faults(index, rules)`` writes the file of executor ``index``
(``--faults-file``); the executor re-reads it when it changes (one ``stat`` at
each task start and end) and applies the rules at these points of a task::

    task start ──▶ kill/freeze (when=task_started), then delay, then fail
    task runs, writes and commits its output files
      (a write statement's task: kill/freeze (when=task_writing) half-way
      through its staged file)
    ──▶ corrupt/delete those files
    ──▶ kill/freeze (when=task_finished, before_report=true)
    ──▶ report to the scheduler
    ──▶ kill/freeze (when=task_finished, before_report=false)

The rules, one JSON object each (a file holds a list of them; ``[]`` clears):

* ``{"action": "fail", "stage": S, "partition": P, "attempt": A}``: that attempt
  fails with the retryable ``ExecutionError("injected fault: ...")``.
  ``partition``: any when absent; ``attempt``: 0 when absent.
* ``{"action": "kill" | "freeze", "when": "task_started" | "task_writing" | "task_finished",
  "stage": S, "attempt": A, "nth": N, "before_report": B}``: SIGKILL / SIGSTOP
  this process at that point of its N-th task (1-based, default 1) of stage S
  (any stage when absent) whose attempt number is A (any when absent: attempt 1
  of a task is its speculative copy or its first re-run). ``when`` defaults to
  ``task_started``; ``before_report`` (only for ``task_finished``) to false.
  Tasks are counted from when the rule was read; a task counts as finished
  only when it wrote its output (failed and cancelled attempts are not counted).
* ``{"action": "fill_disk", "stage": S, "partition": P, "attempt": A, "leave": B}``:
  at that attempt's start, write a ballast file into the executor's work root
  (``testing.limits.BALLAST_NAME``) that leaves about B bytes (default 0) free,
  so the task's shuffle or spill writes meet a full disk mid-write; on a
  ``testing.limits.SmallDisk`` this is quick. The ballast stays until the test
  deletes it (``TestCluster.free_up_disk``).
* ``{"action": "hog_memory", "stage": S, "partition": P, "attempt": A, "bytes": B}``:
  at that attempt's start, allocate and touch B bytes and keep them until the
  process ends: under a cgroup memory limit below that (``TestCluster``'s
  ``executor_memory``), the kernel's OOM killer SIGKILLs the executor mid-task.
* ``{"action": "delay", "seconds": X, "stage": S, "partition": P, "attempt": A}``:
  matching tasks sleep ``X`` seconds at their start (or, with ``"when":
  "task_writing"``, half-way through a write statement's staged file), holding
  their slot, as on a slow executor (a straggler). ``stage``, ``partition``, ``attempt``: any when
  absent. Unlike the other rules, a delay is not spent: it slows every task it
  matches for as long as it is in the file.
* ``{"action": "corrupt" | "delete", "stage": S, "map_partition": M, "partition": P}``:
  right after task M of stage S wrote its output, flip bytes in the middle of
  output partition P's file / delete it, before the report. ``map_partition``
  and ``partition``: any task / every partition of it when absent.

Stage numbers are a job's own (1-based, as in EXPLAIN); a rule does not name a
job and matches the first task that fits after it was read. Each rule but a
delay fires at most once per executor process: a rule is known by its position in the list
and its content, so rewriting the file with the same rules does not re-arm
them, while a new rule (or the same one at a new position) is armed.
"""

from __future__ import annotations

import enum
import json
import logging
import mmap
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mangonel.executor.failures import TaskFailedError
from mangonel.ids import TaskAttemptId
from mangonel.task import ExecutionError, PartitionOutput
from mangonel.testing.limits import fill

log = logging.getLogger(__name__)


class FaultFileError(ValueError):
    """The faults file is not a list of valid rules."""


class Action(enum.Enum):
    FAIL = "fail"
    KILL = "kill"
    FREEZE = "freeze"
    CORRUPT = "corrupt"
    DELETE = "delete"
    FILL_DISK = "fill_disk"
    HOG_MEMORY = "hog_memory"
    DELAY = "delay"


class When(enum.Enum):
    TASK_STARTED = "task_started"
    TASK_WRITING = "task_writing"
    """A write statement's writing task, its staged file open and not finished."""
    TASK_FINISHED = "task_finished"


@dataclass(frozen=True)
class FaultRule:
    """One parsed rule; ``None`` fields match anything."""

    action: Action
    stage: int | None = None
    partition: int | None = None
    """``fail``: the task's partition. ``corrupt``/``delete``: the output partition."""
    attempt: int | None = None
    """The task's attempt number; ``None`` matches any (a ``fail`` rule says 0
    when it names none). Not for ``corrupt``/``delete``."""
    when: When = When.TASK_STARTED
    nth: int = 1
    before_report: bool = False
    map_partition: int | None = None
    """``corrupt``/``delete`` only: the task (map partition) whose file is hit."""
    amount: int = 0
    """``fill_disk``: bytes left free (``leave``); ``hog_memory``: bytes taken (``bytes``)."""
    seconds: float = 0.0
    """``delay`` only: how long each matching task sleeps at its start."""

    def describe(self) -> str:
        parts = [self.action.value]
        if self.action in (Action.KILL, Action.FREEZE):
            parts.append(f"at {self.when.value} #{self.nth}")
            if self.when is When.TASK_FINISHED:
                parts.append("before report" if self.before_report else "after report")
        if self.stage is not None:
            parts.append(f"stage {self.stage}")
        if self.map_partition is not None:
            parts.append(f"map partition {self.map_partition}")
        if self.partition is not None:
            parts.append(f"partition {self.partition}")
        if self.action in _AT_ATTEMPT or self.attempt is not None:
            parts.append(f"attempt {self.attempt}")
        if self.action is Action.FILL_DISK:
            parts.append(f"leaving {self.amount} bytes")
        if self.action is Action.HOG_MEMORY:
            parts.append(f"of {self.amount} bytes")
        if self.action is Action.DELAY:
            parts.append(f"by {self.seconds:g} s")
        return " ".join(parts)


_ALLOWED = {
    Action.FAIL: {"stage", "partition", "attempt"},
    Action.KILL: {"when", "stage", "attempt", "nth", "before_report"},
    Action.FREEZE: {"when", "stage", "attempt", "nth", "before_report"},
    Action.CORRUPT: {"stage", "map_partition", "partition"},
    Action.DELETE: {"stage", "map_partition", "partition"},
    Action.FILL_DISK: {"stage", "partition", "attempt", "leave"},
    Action.HOG_MEMORY: {"stage", "partition", "attempt", "bytes"},
    Action.DELAY: {"seconds", "stage", "partition", "attempt", "when"},
}
_AT_ATTEMPT = (Action.FAIL, Action.FILL_DISK, Action.HOG_MEMORY)
"""Actions that hit one attempt of a task at its start."""


def parse_rule(raw: Mapping[str, Any]) -> FaultRule:
    """One rule from its JSON object.

    Raises:
        FaultFileError: unknown action or field, or a value of the wrong type.

    >>> rule = parse_rule({"action": "kill", "when": "task_finished", "stage": 2})
    >>> (rule.action, rule.stage, rule.nth, rule.before_report)
    (<Action.KILL: 'kill'>, 2, 1, False)
    """
    if not isinstance(raw, Mapping):
        raise FaultFileError(f"a rule must be a JSON object, got {raw!r}")
    try:
        action = Action(raw.get("action"))
    except ValueError:
        names = ", ".join(a.value for a in Action)
        raise FaultFileError(f"rule {dict(raw)}: action must be one of {names}") from None
    unknown = set(raw) - _ALLOWED[action] - {"action"}
    if unknown:
        raise FaultFileError(
            f"rule {dict(raw)}: {action.value} takes no {', '.join(sorted(unknown))}"
        )

    def number(key: str, default: int | None, least: int) -> int | None:
        value = raw.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise FaultFileError(f"rule {dict(raw)}: {key} must be an integer >= {least}")
        return value

    when_raw = raw.get("when", When.TASK_STARTED.value)
    try:
        when = When(when_raw)
    except ValueError:
        raise FaultFileError(
            f"rule {dict(raw)}: when must be task_started, task_writing or task_finished"
        ) from None
    before_report = raw.get("before_report", False)
    if not isinstance(before_report, bool):
        raise FaultFileError(f"rule {dict(raw)}: before_report must be true or false")
    if before_report and when is not When.TASK_FINISHED:
        raise FaultFileError(f"rule {dict(raw)}: before_report needs when=task_finished")
    stage = number("stage", None, 1)
    if action in _AT_ATTEMPT and stage is None:
        raise FaultFileError(f"rule {dict(raw)}: {action.value} needs a stage")
    if action is Action.HOG_MEMORY and "bytes" not in raw:
        raise FaultFileError(f"rule {dict(raw)}: hog_memory needs bytes")
    amount = number("leave", 0, 0) if action is Action.FILL_DISK else number("bytes", 1, 1)
    seconds = raw.get("seconds", 0.0)
    if action is Action.DELAY and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0
    ):
        raise FaultFileError(f"rule {dict(raw)}: delay needs seconds > 0")
    return FaultRule(
        action=action,
        stage=stage,
        partition=number("partition", None, 0),
        attempt=number("attempt", 0 if action in _AT_ATTEMPT else None, 0),
        seconds=float(seconds),
        when=when,
        nth=number("nth", 1, 1) or 1,
        before_report=before_report,
        map_partition=number("map_partition", None, 0),
        amount=amount or 0,
    )


def parse_rules(data: object) -> list[FaultRule]:
    """Every rule of a faults file's JSON value (a list of objects)."""
    if not isinstance(data, list):
        raise FaultFileError(f"a faults file holds a JSON list of rules, got {type(data).__name__}")
    return [parse_rule(r) for r in data]


def write_rules(path: str, rules: Sequence[Mapping[str, Any]]) -> None:
    """Check ``rules`` and write them to ``path`` atomically (``[]`` clears).

    Raises:
        FaultFileError: a rule is not valid (nothing is written then).
    """
    parse_rules(list(rules))
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    temp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(temp, "w") as f:
        json.dump(list(rules), f)
    # A rename gives the file a new inode, so a reader that keys on
    # (inode, mtime, size) sees every rewrite, even two in one mtime tick.
    os.replace(temp, path)


def _kill_self(sig: int) -> None:
    """Send ``sig`` to this process through the calling thread.

    SIGSTOP and SIGKILL act on the whole process either way, but a stop sent to
    the process is taken by a thread the kernel chooses (the main thread first),
    which may get a core only milliseconds later, while the calling thread goes
    on with its task: a chaos test saw an executor "freeze" at the start of the
    final task, finish it and report, and only then stop (the breakpoint then
    killed it, and the result with it). Sent to the calling thread, the signal is
    acted on before the call returns.
    """
    signal.pthread_kill(threading.get_ident(), sig)


_Key = tuple[int, str]
"""A rule's identity: its position in the file and its content."""


@dataclass
class _Armed:
    key: _Key
    rule: FaultRule
    seen: int = 0
    """Matching events counted so far (for ``nth``)."""


class FaultInjector:
    """Applies the rules of one faults file to this executor's tasks. Thread-safe.

    A ``TaskHooks`` (``mangonel.executor.hooks``): the executor calls it at
    each task's start, after its files are written, and around its report.

    Args:
        path: The faults file; ``None`` injects nothing. A missing file means no rules.
        label: Names this executor in log lines and injected errors (e.g. its index).
        signal_self: Sends a signal to this process; replaced in unit tests.
        work_dir: The executor's work root, where ``fill_disk`` writes its ballast.
        sleep: How a delay rule waits; replaced in unit tests.
    """

    def __init__(
        self,
        path: str | None,
        label: str = "",
        signal_self: Callable[[int], None] = _kill_self,
        work_dir: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.path = path
        self.label = label
        self.work_dir = work_dir
        self._hogs: list[bytearray] = []
        """Memory taken by ``hog_memory``, kept for the life of the process."""
        self._signal_self = signal_self
        self._sleep = sleep
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._armed: list[_Armed] = []
        self._fired: set[_Key] = set()
        self._counts: dict[_Key, int] = {}

    # ------------------------------------------------------------- the file

    def reload_if_changed(self) -> None:
        """Re-read the file if it changed since the last read (one ``stat``)."""
        if self.path is None:
            return
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if stamp == self._stamp:
                return
            self._stamp = stamp
            if stamp is None:
                self._armed = []
                return
            try:
                with open(self.path) as f:
                    rules = parse_rules(json.load(f))
            except (OSError, ValueError) as exc:
                # A bad file must be loud, but must not take the executor down.
                log.error("ignoring the faults file %s: %s", self.path, exc)
                self._armed = []
                return
            armed = []
            for i, rule in enumerate(rules):
                key = (i, repr(rule))
                if key not in self._fired:
                    armed.append(_Armed(key, rule, self._counts.get(key, 0)))
            self._armed = armed
            log.info("faults file %s: %d rules armed", self.path, len(armed))

    @property
    def armed(self) -> list[FaultRule]:
        with self._lock:
            return [a.rule for a in self._armed]

    # --------------------------------------------------------------- points

    def task_started(self, attempt: TaskAttemptId) -> None:
        """Kill or freeze at a task's start, or fail it.

        Raises:
            TaskFailedError: a ``fail`` rule matched (an ``ExecutionError``).
        """
        self.reload_if_changed()
        self._signal_at(When.TASK_STARTED, attempt, before_report=False)
        self._delay(attempt, When.TASK_STARTED)
        for action in (Action.FILL_DISK, Action.HOG_MEMORY, Action.FAIL):

            def hits(r: FaultRule, action: Action = action) -> bool:
                return (
                    r.action is action
                    and r.stage == attempt.task.stage
                    and r.partition in (None, attempt.task.partition)
                    and r.attempt == attempt.attempt
                )

            rule = self._take(hits)
            if rule is None:
                continue
            log.warning("injected fault: %s on %s at %s", rule.describe(), self._who(), attempt)
            if rule.action is Action.FILL_DISK:
                if self.work_dir is None:
                    raise RuntimeError("fill_disk needs the executor's work root")
                fill(self.work_dir, rule.amount)
            elif rule.action is Action.HOG_MEMORY:
                self._hogs.append(_touched(rule.amount))
            else:
                raise TaskFailedError(
                    ExecutionError(
                        f"injected fault: {rule.describe()} on {self._who()} ({attempt})"
                    )
                )

    def outputs_written(self, attempt: TaskAttemptId, outputs: Sequence[PartitionOutput]) -> None:
        """Corrupt or delete output files the rules name (before the report)."""
        self.reload_if_changed()
        for output in outputs:

            def hits(r: FaultRule, partition: int = output.partition) -> bool:
                return (
                    r.action in (Action.CORRUPT, Action.DELETE)
                    and r.stage in (None, attempt.task.stage)
                    and r.map_partition in (None, attempt.task.partition)
                    and r.partition in (None, partition)
                )

            # A rule without a partition hits every file of the task: it is
            # spent once the task is done, not at its first file.
            rule = self._take(hits, spend=False)
            if rule is None:
                continue
            if rule.action is Action.DELETE:
                os.remove(output.path)
            else:
                _flip_middle(output.path)
            log.warning(
                "injected fault: %s on %s: %s %s",
                rule.describe(),
                self._who(),
                "deleted" if rule.action is Action.DELETE else "corrupted",
                output.path,
            )
        self._spend_file_rules(attempt, outputs)

    def writing(self, attempt: TaskAttemptId) -> None:
        """Kill or freeze a write statement's task half-way through its staged file."""
        self.reload_if_changed()
        self._signal_at(When.TASK_WRITING, attempt, before_report=False)
        self._delay(attempt, When.TASK_WRITING)

    def task_finished(self, attempt: TaskAttemptId, *, before_report: bool) -> None:
        """Kill or freeze after a task wrote its output, before or after its report."""
        self.reload_if_changed()
        self._signal_at(When.TASK_FINISHED, attempt, before_report=before_report)

    # -------------------------------------------------------------- helpers

    def _delay(self, attempt: TaskAttemptId, when: When) -> None:
        """Sleep as long as the longest delay rule matching ``attempt`` here says."""
        with self._lock:
            rules = [
                a.rule
                for a in self._armed
                if a.rule.action is Action.DELAY
                and a.rule.when is when
                and a.rule.stage in (None, attempt.task.stage)
                and a.rule.partition in (None, attempt.task.partition)
                and a.rule.attempt in (None, attempt.attempt)
            ]
        if rules:
            rule = max(rules, key=lambda r: r.seconds)
            log.warning("injected fault: %s on %s at %s", rule.describe(), self._who(), attempt)
            self._sleep(rule.seconds)

    def _who(self) -> str:
        return f"executor {self.label}" if self.label else "this executor"

    def _signal_at(self, when: When, attempt: TaskAttemptId, *, before_report: bool) -> None:
        fire: FaultRule | None = None
        with self._lock:
            for armed in self._armed:
                r = armed.rule
                if (
                    r.action not in (Action.KILL, Action.FREEZE)
                    or r.when is not when
                    or r.before_report is not before_report
                    or r.stage not in (None, attempt.task.stage)
                    or r.attempt not in (None, attempt.attempt)
                ):
                    continue
                armed.seen += 1
                self._counts[armed.key] = armed.seen
                if fire is None and armed.seen >= r.nth:
                    fire = r
                    self._fired.add(armed.key)
            self._armed = [a for a in self._armed if a.key not in self._fired]
        if fire is None:
            return
        sig = signal.SIGKILL if fire.action is Action.KILL else signal.SIGSTOP
        # Logged before the signal: after SIGKILL nothing more is written.
        log.warning("injected fault: %s on %s at %s", fire.describe(), self._who(), attempt)
        for handler in logging.getLogger().handlers:
            handler.flush()
        self._signal_self(sig)
        if fire.action is Action.FREEZE:
            log.warning("thawed after injected freeze at %s", attempt)

    def _take(self, match: Callable[[FaultRule], bool], spend: bool = True) -> FaultRule | None:
        with self._lock:
            for armed in self._armed:
                if match(armed.rule):
                    if spend:
                        self._fired.add(armed.key)
                        self._armed.remove(armed)
                    return armed.rule
        return None

    def _spend_file_rules(self, attempt: TaskAttemptId, outputs: Sequence[PartitionOutput]) -> None:
        partitions = {o.partition for o in outputs}
        with self._lock:
            for armed in self._armed:
                r = armed.rule
                if (
                    r.action in (Action.CORRUPT, Action.DELETE)
                    and r.stage in (None, attempt.task.stage)
                    and r.map_partition in (None, attempt.task.partition)
                    and (r.partition is None or r.partition in partitions)
                ):
                    self._fired.add(armed.key)
            self._armed = [a for a in self._armed if a.key not in self._fired]


def _touched(size: int) -> bytearray:
    """``size`` bytes of memory, every page written (so that it is really taken)."""
    hog = bytearray(size)
    page = mmap.PAGESIZE
    hog[::page] = b"\1" * len(range(0, size, page))
    return hog


def _flip_middle(path: str) -> None:
    """Invert a few bytes in the middle of a file (its checksum then fails)."""
    size = os.path.getsize(path)
    if size == 0:
        return
    start = max(0, size // 2 - 4)
    with open(path, "r+b") as f:
        f.seek(start)
        data = f.read(8)
        f.seek(start)
        f.write(bytes(b ^ 0xFF for b in data))
