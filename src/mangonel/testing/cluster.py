"""``TestCluster``: ``mangonel.LocalCluster`` with fault rules for tests.

>>> with TestCluster(executors=2, work_dir=tmp) as cluster:          # doctest: +SKIP
...     cluster.set_faults(1, [{"action": "kill", "when": "task_finished"}])
...     ...  # executor 1 SIGKILLs itself after its next task

Executor *i* (0-based, in start order; ``add_executor`` takes the next) is
started with ``--faults-file work_dir/faults/executor-<i>.json`` and reads its
rules from that file (the rules of ``mangonel.testing.faults``) at each task
start and end; the file need not exist.

Speculative execution is off unless asked for (``speculation=True``): a rule
fires at a chosen point of a chosen task, and a copy of a frozen or slow task
racing it elsewhere would make whether the recovery under test happened a
matter of timing. Everything else is ``LocalCluster``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mangonel.client.cluster import LocalCluster
from mangonel.testing.faults import write_rules


class TestCluster(LocalCluster):
    """A ``LocalCluster`` whose executors take fault rules (``set_faults``)."""

    __test__ = False  # not a pytest test class, whatever its name says

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("speculation", False)
        super().__init__(*args, **kwargs)

    @property
    def faults_dir(self) -> Path:
        """Where the executors' fault-rules files are."""
        return self.work_dir / "faults"

    def faults_path(self, index: int) -> Path:
        """The fault-rules file executor ``index`` reads (it need not exist)."""
        return self.faults_dir / f"executor-{index}.json"

    def executor_options(self, index: int) -> list[str]:
        return [*super().executor_options(index), "--faults-file", str(self.faults_path(index))]

    def set_faults(self, index: int, rules: Sequence[Mapping[str, Any]]) -> None:
        """Give executor ``index`` these fault rules (``[]`` clears them).

        The file is written atomically; the executor reads it at its next task
        start or end. Rules are checked here first, so a typo fails the test
        instead of silently injecting nothing.

        Raises:
            mangonel.testing.faults.FaultFileError: a rule is not valid.
        """
        write_rules(str(self.faults_path(index)), rules)

    def set_faults_all(self, rules: Sequence[Mapping[str, Any]]) -> None:
        """``set_faults`` for every executor started so far (not for later ones)."""
        for handle in self.executors:
            self.set_faults(handle.index, rules)
