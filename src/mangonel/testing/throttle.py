"""A slow executor for tests and benchmarks: a process held to part of a CPU by a cgroup.

A delay rule (``testing.faults``) makes chosen tasks sleep; a throttled process
is slow the way a busy or failing machine is: every thread, every task, its
Flight server and its heartbeats get ``cpus`` CPUs' worth of time per period.
The kernel enforces it with the CFS bandwidth controller:

* cgroup v1 (``/sys/fs/cgroup/cpu``): ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``;
* cgroup v2 (``cgroup.controllers`` lists ``cpu``): ``cpu.max`` ("quota period").

Moving a pid into ``cgroup.procs`` moves all its threads; children it starts
later are born inside. Needs root (or a delegated cgroup).

>>> with CpuThrottle("slow-executor", cpus=0.25) as slow:  # doctest: +SKIP
...     slow.add(executor.pid)
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from types import TracebackType

__all__ = ["CpuThrottle", "ThrottleError", "cgroup_cpu_root"]

_V1_ROOT = Path("/sys/fs/cgroup/cpu")
_V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
_PERIOD_US = 100_000
"""The kernel's default CFS period (100 ms)."""


class ThrottleError(RuntimeError):
    """No cgroup CPU controller this process may use (not root, or not mounted)."""


def cgroup_cpu_root() -> tuple[Path, int]:
    """Where CPU-controller cgroups can be made, and the cgroup version (1 or 2).

    Raises:
        ThrottleError: no writable CPU controller is mounted.
    """
    if (_V1_ROOT / "cpu.cfs_quota_us").exists() and os.access(_V1_ROOT, os.W_OK):
        return _V1_ROOT, 1
    for root in _V2_ROOTS:
        controllers = root / "cgroup.controllers"
        usable = controllers.exists() and "cpu" in controllers.read_text().split()
        if usable and os.access(root, os.W_OK):
            return root, 2
    raise ThrottleError(
        "no writable cgroup CPU controller: need /sys/fs/cgroup/cpu (v1) or a cgroup v2 "
        "hierarchy with the cpu controller, and root"
    )


class CpuThrottle:
    """A cgroup whose processes share at most ``cpus`` CPUs (0.25: a quarter of one).

    Args:
        name: Part of the cgroup's directory name (a random suffix is added).
        cpus: CPUs' worth of time per period the group's threads may use together.

    Raises:
        ThrottleError: no cgroup CPU controller may be used.
    """

    def __init__(self, name: str, cpus: float) -> None:
        if cpus <= 0:
            raise ValueError(f"cpus must be > 0, got {cpus:g}")
        root, self.version = cgroup_cpu_root()
        self.root = root
        self.cpus = cpus
        self.path = root / f"mangonel-{name}-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        quota = max(1000, int(cpus * _PERIOD_US))
        try:
            if self.version == 1:
                (self.path / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                _enable_v2_cpu(root)
                (self.path / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
        except OSError as exc:
            self.path.rmdir()
            raise ThrottleError(f"cannot set a CPU quota in {self.path}: {exc}") from exc
        self.pids: list[int] = []

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))
        self.pids.append(pid)

    def release(self, pid: int) -> None:
        """Give ``pid`` its CPU back (move it to the root group); gone already is fine."""
        with contextlib.suppress(OSError):  # the process has exited
            (self.root / "cgroup.procs").write_text(str(pid))
        if pid in self.pids:
            self.pids.remove(pid)

    def close(self) -> None:
        """Release every process still in the group and remove it."""
        procs = self.path / "cgroup.procs"
        if not self.path.exists():
            return
        for line in procs.read_text().split():
            self.release(int(line))
        with contextlib.suppress(OSError):  # a process on its way out still holds it
            self.path.rmdir()

    def __enter__(self) -> CpuThrottle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _enable_v2_cpu(root: Path) -> None:
    control = root / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")
