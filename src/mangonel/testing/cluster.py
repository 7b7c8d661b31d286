"""``TestCluster``: ``mangonel.LocalCluster`` with fault rules and resource limits for tests.

>>> with TestCluster(executors=2, work_dir=tmp) as cluster:          # doctest: +SKIP
...     cluster.set_faults(1, [{"action": "kill", "when": "task_finished"}])
...     ...  # executor 1 SIGKILLs itself after its next task

Executor *i* (0-based, in start order; ``add_executor`` takes the next) is
started with ``--faults-file work_dir/faults/executor-<i>.json`` and reads its
rules from that file (the rules of ``mangonel.testing.faults``) at each task
start and end; the file need not exist.

Resource limits (``mangonel.testing.limits``; they need root):

* ``executor_memory={i: bytes}``: executor *i* runs in a memory cgroup of its
  own with that hard limit, from its first instruction: past it, the kernel's
  OOM killer SIGKILLs it (``oom_kills(i)`` counts). Give it ``--memory`` too
  (``executor_args_for``) for an executor that lives within its limit.
* ``executor_disks={i: bytes}``: executor *i*'s work root is a tmpfs of that size
  (``disk(i)``: ``fill``, ``free_up``), so it meets a full disk as on a small
  machine.

The cgroups and mounts go when the cluster stops.

Speculative execution is off unless asked for (``speculation=True``): a rule
fires at a chosen point of a chosen task, and a copy of a frozen or slow task
racing it elsewhere would make whether the recovery under test happened a
matter of timing. Everything else is ``LocalCluster``'s.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mangonel.client.cluster import LocalCluster
from mangonel.options import TEST_HOOKS_ENV
from mangonel.testing.faults import write_rules
from mangonel.testing.limits import MemoryCgroup, SmallDisk


class TestCluster(LocalCluster):
    """A ``LocalCluster`` whose executors take fault rules (``set_faults``) and limits.

    Args:
        executor_memory: Executor index -> hard cgroup memory limit in bytes.
        executor_disks: Executor index -> size in bytes of a tmpfs work root.
        **kwargs: ``LocalCluster``'s.
    """

    __test__ = False  # not a pytest test class, whatever its name says

    def __init__(
        self,
        *args: Any,
        executor_memory: Mapping[int, int] | None = None,
        executor_disks: Mapping[int, int] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("speculation", False)
        super().__init__(*args, **kwargs)
        self.executor_memory = dict(executor_memory or {})
        self.executor_disks = dict(executor_disks or {})
        self.cgroups: dict[int, MemoryCgroup] = {}
        self.disks: dict[int, SmallDisk] = {}

    @property
    def faults_dir(self) -> Path:
        """Where the executors' fault-rules files are."""
        return self.work_dir / "faults"

    def faults_path(self, index: int) -> Path:
        """The fault-rules file executor ``index`` reads (it need not exist)."""
        return self.faults_dir / f"executor-{index}.json"

    def _env(self) -> dict[str, str]:
        # The executors take --faults-file, a test-only option.
        return {**super()._env(), TEST_HOOKS_ENV: "1"}

    def executor_options(self, index: int) -> list[str]:
        options = [*super().executor_options(index), "--faults-file", str(self.faults_path(index))]
        if index in self.executor_disks:
            if index not in self.disks:
                path = self.work_dir / "disks" / f"executor-{index}"
                self.disks[index] = SmallDisk(str(path), self.executor_disks[index])
            options += ["--work-dir", self.disks[index].path]  # the last --work-dir wins
        return options

    def executor_command(self, index: int, args: list[str]) -> list[str]:
        if index not in self.executor_memory:
            return args
        if index not in self.cgroups:
            self.cgroups[index] = MemoryCgroup.create(
                f"executor-{index}", self.executor_memory[index]
            )
        return self.cgroups[index].wrap(args)

    def disk(self, index: int) -> SmallDisk:
        """Executor ``index``'s small work disk (it must have one: ``executor_disks``)."""
        return self.disks[index]

    def free_up_disk(self, index: int) -> None:
        """Delete the ballast that filled executor ``index``'s work disk (space returns)."""
        self.disks[index].free_up()

    def oom_kills(self, index: int) -> int:
        """Times the kernel's OOM killer killed a process in executor ``index``'s cgroup."""
        return self.cgroups[index].oom_kills()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for cgroup in self.cgroups.values():
                # OSError: a process is still in it; the test's logs say which.
                with contextlib.suppress(OSError):
                    cgroup.remove()
            for disk in self.disks.values():
                disk.unmount()
                with contextlib.suppress(OSError):
                    os.rmdir(disk.path)

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
