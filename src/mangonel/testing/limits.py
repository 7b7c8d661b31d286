"""Resource limits for tests: a cgroup memory limit on a process, a small file system.

Both need root (or a delegated cgroup): tests that use them skip without
(``memory_cgroups_available``, ``small_disks_available``).

``MemoryCgroup`` is a memory cgroup made under this process's own (so whatever
accounts for this process still accounts for its children), with a hard limit.
A process started in it (``wrap`` puts a command line into it before it
``exec``s, so every byte it ever allocates counts) that goes over the limit is
killed by the kernel's OOM killer with SIGKILL, as in a container;
``oom_kills`` counts those kills. cgroup v2 (``memory.max``) and v1
(``memory.limit_in_bytes``) both work.

``SmallDisk`` is a tmpfs of a given size mounted on a directory: an executor
given it as its work root runs out of space when it writes more than that, as
on a full disk (``ENOSPC``). ``fill(leave)`` writes a ballast file that leaves
``leave`` bytes free; ``free_up()`` deletes it.

>>> with MemoryCgroup.create("demo", 256 * 2**20) as cgroup:    # doctest: +SKIP
...     subprocess.run(cgroup.wrap(["python", "-c", "x = bytearray(2**30)"]))
...     assert cgroup.oom_kills() == 1
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Sequence
from types import TracebackType

_V1_ROOT = "/sys/fs/cgroup/memory"
_V2_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")
BALLAST_NAME = "mangonel-ballast"
"""The ballast file ``SmallDisk.fill`` and the ``fill_disk`` fault write (a file,
so the work root's sweep, which only deletes locked directories, leaves it)."""


def _own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup path in the v1 hierarchy of ``controller``, or in v2 (``None``)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller is None and controllers == "":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return None


def _v2_base() -> str | None:
    path = _own_cgroup(None)
    if path is None:
        return None
    for root in _V2_ROOTS:
        if os.path.exists(os.path.join(root, "cgroup.controllers")):
            base = os.path.join(root, path.lstrip("/"))
            controllers = os.path.join(base, "cgroup.subtree_control")
            with contextlib.suppress(OSError), open(controllers) as f:
                if "memory" in f.read().split():
                    return base
    return None


def _v1_base() -> str | None:
    path = _own_cgroup("memory")
    if path is None or not os.path.isdir(_V1_ROOT):
        return None
    base = os.path.join(_V1_ROOT, path.lstrip("/"))
    return base if os.path.isdir(base) else None


def memory_cgroups_available() -> bool:
    """Whether ``MemoryCgroup.create`` can work here (a memory controller we may write)."""
    base = _v1_base() or _v2_base()
    return base is not None and os.access(base, os.W_OK)


class MemoryCgroup:
    """A memory cgroup with a hard limit, under this process's own; see the module docstring."""

    def __init__(self, path: str, v1: bool) -> None:
        self.path = path
        self.v1 = v1

    @classmethod
    def create(cls, name: str, limit: int) -> MemoryCgroup:
        """Make ``mangonel-<name>-<random>`` under this process's cgroup, limited to ``limit``.

        Raises:
            OSError: no writable memory controller (not root, no delegation).
        """
        base, v1 = _v1_base(), True
        if base is None:
            base, v1 = _v2_base(), False
        if base is None:
            raise OSError("no memory cgroup controller that this process may use")
        path = os.path.join(base, f"mangonel-{name}-{secrets.token_hex(3)}")
        os.mkdir(path)
        cgroup = cls(path, v1)
        try:
            cgroup.set_limit(limit)
        except BaseException:
            cgroup.remove()
            raise
        return cgroup

    def set_limit(self, limit: int) -> None:
        """Change the hard limit (bytes); swap is limited to nothing on top of it."""
        if self.v1:
            self._write("memory.limit_in_bytes", str(limit))
            # Without swap accounting the file is missing; with it, no swap either.
            with contextlib.suppress(OSError):
                self._write("memory.memsw.limit_in_bytes", str(limit))
        else:
            self._write("memory.max", str(limit))
            with contextlib.suppress(OSError):
                self._write("memory.swap.max", "0")

    def wrap(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside this cgroup: a shell joins it, then ``exec``s them."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *args]

    def add(self, pid: int) -> None:
        """Move a running process into this cgroup (what it allocated before may not count)."""
        self._write("cgroup.procs", str(pid))

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer killed in this cgroup so far."""
        name, key = ("memory.oom_control", "oom_kill") if self.v1 else ("memory.events", "oom_kill")
        try:
            with open(os.path.join(self.path, name)) as f:
                for line in f:
                    field, _, value = line.partition(" ")
                    if field == key:
                        return int(value)
        except OSError:
            pass
        return 0

    def peak(self) -> int:
        """The most memory the cgroup used at once (bytes; 0 when the kernel does not say)."""
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        try:
            with open(os.path.join(self.path, name)) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return 0

    def remove(self, timeout_s: float = 5.0) -> None:
        """Delete the cgroup once its processes are gone (waits a little for them)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


def small_disks_available() -> bool:
    """Whether ``SmallDisk`` can mount a tmpfs here (root)."""
    return os.geteuid() == 0


def fill(path: str, leave: int = 0) -> str:
    """Write a ballast file in ``path`` so that about ``leave`` bytes stay free; its path.

    It writes in 1 MiB pieces until the file system is that full (or full:
    ``ENOSPC`` ends the fill, not the caller).
    """
    ballast = os.path.join(path, BALLAST_NAME)
    chunk = b"\0" * 2**20
    st = os.statvfs(path)
    want = st.f_bavail * st.f_frsize - leave
    with open(ballast, "ab") as f:
        try:
            while want > 0:
                piece = chunk[: min(len(chunk), want)]
                f.write(piece)
                want -= len(piece)
            f.flush()
        except OSError:
            pass
    return ballast


class SmallDisk:
    """A tmpfs of ``size`` bytes mounted on ``path`` (created if missing); see the module."""

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size
        os.makedirs(path, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", path],
            check=True,
            capture_output=True,
        )

    def free(self) -> int:
        """Bytes free now."""
        st = os.statvfs(self.path)
        return int(st.f_bavail * st.f_frsize)

    def fill(self, leave: int = 0) -> str:
        """Leave about ``leave`` bytes free with a ballast file; its path."""
        return fill(self.path, leave)

    def free_up(self) -> None:
        """Delete the ballast file (space returns)."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.path, BALLAST_NAME))

    def unmount(self) -> None:
        """Unmount (lazily, if a process still has files open there)."""
        result = subprocess.run(["umount", self.path], capture_output=True)
        if result.returncode != 0:
            subprocess.run(["umount", "-l", self.path], capture_output=True)

    def __enter__(self) -> SmallDisk:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unmount()
