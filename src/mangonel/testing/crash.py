"""Crash points: rules in a JSON file make the scheduler kill itself at a chosen moment.

For crash tests only (``mangonel scheduler --crash-file PATH``, a hidden
option). ``CrashPoints`` implements the shell's ``scheduler.hooks.EventHook``;
``scheduler.main`` wires it in only when that option is given.

A test needs the scheduler to die at the same point of a query on every run,
so a rule names *what* to die after, and *when* relative to the
store::

    event handled by the state machine
    ──▶ its new state committed to the store
    ──▶ die here with "point": "persisted" (the default): the state is
        durable, none of its commands was carried out
    ──▶ its commands carried out (tasks sent, watchers told)
    ──▶ die here with "point": "executed"

and at points between events: ``"commit-intent"`` and ``"committed"`` in a
write's commit (``CommitThread``; its event is ``WriteCommitted``), and
``"dropped"`` once a ``DROP TABLE`` took effect, before its job is written (or
before the admins' ``DropTable`` call is answered), and
``"recovering"`` once a restarted scheduler read the store back, before its first
write (no event for either: ``"*"``).

A rule, one JSON object (a file holds a list of them):

* ``"event"``: the event's class name (``JobSubmitted``, ``TaskCompleted``,
  ...), or ``"*"`` for any;
* ``"commands"`` (optional): fire only when the event's commands include one of
  this class (``LaunchTask``, ``JobSucceeded``, ...);
* ``"stage"`` (optional): a stage number, or ``"final"`` for the job's last
  stage; matched against a ``TaskCompleted`` event's task, or, with
  ``"commands": "LaunchTask"``, against the launched tasks;
* ``"nth"`` (default 1): fire at the N-th match, counted from when the rule
  was read;
* ``"action"`` (default ``"kill"``): ``"freeze"`` stops the process (SIGSTOP)
  instead, for the test to fault something else at that point (fill the store's
  disk, stop etcd) before it sends SIGCONT.

The file is read again when it changes (one ``stat`` per event that is
persisted), so a test writes rules into a running scheduler, and clears them
before starting it again. The process dies by SIGKILL: no cleanup, no flush,
as in a real crash.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mangonel.ids import StageId
from mangonel.scheduler.events import Command, Event, TaskCompleted
from mangonel.task import LaunchTask

log = logging.getLogger(__name__)

POINTS = ("persisted", "executed", "commit-intent", "committed", "dropped", "recovering")
FREEZE_SETTLE_S = 1.0
"""How long a thread that froze its process sleeps on (the time it takes the stop to land)."""


class CrashAction(enum.Enum):
    """What a rule does to the scheduler when it fires."""

    KILL = "kill"
    FREEZE = "freeze"


@dataclass(frozen=True)
class CrashRule:
    event: str
    point: str = "persisted"
    commands: str | None = None
    stage: int | str | None = None
    nth: int = 1
    action: CrashAction = CrashAction.KILL


def parse_rules(data: object) -> list[CrashRule]:
    """Rules from decoded JSON; ``ValueError`` names what is wrong."""
    if not isinstance(data, list):
        raise ValueError("a crash file holds a JSON list of rules")
    rules = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("event"), str):
            raise ValueError(f"a crash rule is an object with an 'event': {item!r}")
        try:
            action = CrashAction(item.get("action", "kill"))
        except ValueError:
            raise ValueError(f"'action' is 'kill' or 'freeze': {item!r}") from None
        rule = CrashRule(**{**item, "action": action})
        if rule.point not in POINTS:
            raise ValueError(f"'point' is one of {POINTS}: {item!r}")
        if rule.stage is not None and rule.stage != "final" and not isinstance(rule.stage, int):
            raise ValueError(f"'stage' is a number or 'final': {item!r}")
        if rule.nth < 1:
            raise ValueError(f"'nth' counts from 1: {item!r}")
        rules.append(rule)
    return rules


class CrashPoints:
    """Checks each persisted event against the rules of one file (an ``EventHook``).

    Args:
        path: The rules file (it need not exist).
        final_stage: The final stage of a job, by job id (``None`` once forgotten).
    """

    def __init__(self, path: str, final_stage: Callable[[str], StageId | None]) -> None:
        self.path = path
        self._final_stage = final_stage
        self._mtime: tuple[int, int, int] | None = None
        self._rules: list[CrashRule] = []
        self._counts: list[int] = []

    def check(self, event: Event, commands: Sequence[Command], point: str) -> None:
        self._reload()
        for i, rule in enumerate(self._rules):
            if rule.point != point or not self._matches(rule, event, commands):
                continue
            self._counts[i] += 1
            if self._counts[i] == rule.nth and rule.action is CrashAction.FREEZE:
                log.critical(
                    "crash rule %s fired at event %d: freezing the scheduler",
                    rule,
                    event.event_id,
                )
                for handler in logging.getLogger().handlers:
                    handler.flush()
                os.kill(os.getpid(), signal.SIGSTOP)
                # The stop reaches this thread a moment after ``kill`` returns (seen:
                # the commit it should have held ran to its end first); asleep, the
                # thread does nothing more until the test's SIGCONT.
                time.sleep(FREEZE_SETTLE_S)
            elif self._counts[i] == rule.nth:
                log.critical(
                    "crash rule %s fired at event %d: killing the scheduler", rule, event.event_id
                )
                for handler in logging.getLogger().handlers:
                    handler.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    def _matches(self, rule: CrashRule, event: Event, commands: Sequence[Command]) -> bool:
        if rule.event not in ("*", type(event).__name__):
            return False
        if rule.commands is not None and not any(
            type(c).__name__ == rule.commands for c in commands
        ):
            return False
        if rule.stage is None:
            return True
        if rule.commands == "LaunchTask":
            return any(
                self._stage_matches(rule.stage, c.task.attempt.task.job, c.task.attempt.task.stage)
                for c in commands
                if isinstance(c, LaunchTask)
            )
        if isinstance(event, TaskCompleted):
            task = event.attempt.task
            return self._stage_matches(rule.stage, task.job, task.stage)
        return False

    def _stage_matches(self, wanted: int | str, job: str, stage: StageId) -> bool:
        if wanted == "final":
            return stage == self._final_stage(job)
        return stage == wanted

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
            # Not the time alone: two writes within one clock tick look the same.
            mtime: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            mtime = None
        if mtime == self._mtime:
            return
        self._mtime = mtime
        rules: list[CrashRule] = []
        if mtime is not None:
            try:
                with open(self.path) as f:
                    rules = parse_rules(json.load(f))
            except (OSError, ValueError, TypeError) as exc:
                log.error("ignoring the crash file %s: %s", self.path, exc)
        self._rules, self._counts = rules, [0] * len(rules)
