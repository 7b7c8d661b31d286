"""The executor's memory and spill budgets, and how they are shared out among its slots.

An executor has one memory budget (``--memory``): everything the process holds
must fit in it, the Python interpreter, Arrow batches in flight, the Flight
server and every slot's DuckDB. Left out, it is ``DEFAULT_SHARE`` of the memory
this process may use: the host's RAM, or its cgroup's limit when that is lower
(a container, a systemd slice, a test harness). Each slot's DuckDB gets an equal
part of ``DUCKDB_SHARE`` of what is left after ``BASE_RESERVE``::

    budget 1 GiB, 2 slots: (1024 - 160) MiB * 0.6 / 2 = 259 MiB per DuckDB

DuckDB keeps its sorts, hash tables and aggregates under that limit by
spilling to its temporary directory; the rest of the budget is headroom for
what DuckDB does not count: the result batches it hands over (``BATCH_ROWS``
rows per slot), the Arrow inputs registered in it, the shuffle writer's
buffers, Flight, and the interpreter itself (``BASE_RESERVE``, measured: an
idle executor's RSS is about 130 MiB with pyarrow, DuckDB and gRPC loaded).

Spill space is budgeted the same way (``--spill``): each slot's DuckDB gets
``max_temp_directory_size`` = spill budget / slots, by default half the free
space of the work root's file system when the executor starts (shuffle files
need the other half). A task that needs more memory than its share and more
spill than its part fails with ``OUT_OF_MEMORY`` or ``DISK_FULL``
(``failures.py``), saying which limit it met.

The same memory is kept in check in the allocators: DuckDB's jemalloc hands
what a task freed back to the kernel past ``RELEASE_ABOVE``
(``release_duckdb_memory``, after each task), and glibc's keeps the memory of
one Arrow batch for the next (``keep_batch_memory``, once per process).

>>> parse_size("512MiB"), parse_size("2GB"), parse_size("1.5g")
(536870912, 2000000000, 1610612736)
>>> format_size(3 * 2**30 // 2)
'1.5 GiB'
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass
from typing import Any

DEFAULT_SHARE = 0.8
"""Share of the memory available to the process that ``--memory`` defaults to."""
DUCKDB_SHARE = 0.6
"""Share of the budget (after ``BASE_RESERVE``) that the slots' DuckDBs get together."""
BASE_RESERVE = 160 * 2**20
"""Budget kept for the process itself (interpreter, libraries, gRPC, Flight)."""
MIN_SLOT_MEMORY = 16 * 2**20
"""The least DuckDB memory limit a slot gets, however small the budget."""
SPILL_SHARE = 0.5
"""Share of the work root's free space that ``--spill`` defaults to."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "kb": 10**3,
    "m": 2**20,
    "mib": 2**20,
    "mb": 10**6,
    "g": 2**30,
    "gib": 2**30,
    "gb": 10**9,
    "t": 2**40,
    "tib": 2**40,
    "tb": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)

_UNLIMITED = 2**60
"""A cgroup v1 limit at or above this means none (the kernel writes about 2**63)."""


def parse_size(text: str | int) -> int:
    """Bytes in a size written as ``"2GB"``, ``"512MiB"``, ``"1.5g"`` or ``"1048576"``.

    ``KB``, ``MB``, ``GB``, ``TB`` are powers of 1000 (as in DuckDB); ``KiB``,
    ``MiB``, ``GiB``, ``TiB`` and the bare letters ``k``, ``m``, ``g``, ``t``
    powers of 1024.

    Raises:
        ValueError: not a size.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (write e.g. 2GB, 512MiB or 1.5g)")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(size: int) -> str:
    """A size for people: ``"1.5 GiB"``, ``"96.0 MiB"``, ``"512 bytes"``."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} bytes"


def host_memory() -> int:
    """The host's physical memory in bytes."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cgroup_memory_limit(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max`` or v1
    ``memory.limit_in_bytes``), the lowest along its path; ``None`` when unlimited
    or unknown."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: the unified hierarchy
            base, name = root, "memory.max"
            if os.path.isdir(os.path.join(root, "unified")):
                base = os.path.join(root, "unified")
        elif "memory" in controllers.split(","):
            base, name = os.path.join(root, "memory"), "memory.limit_in_bytes"
        else:
            continue
        limits += _limits_along(base, path, name)
    return min(limits) if limits else None


def _limits_along(base: str, path: str, name: str) -> list[int]:
    """The limits in ``name`` of the cgroup at ``path`` and each of its ancestors."""
    found = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        try:
            with open(os.path.join(base, *parts[:depth], name)) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _UNLIMITED:
            found.append(int(text))
    return found


def available_memory() -> int:
    """The memory this process may use: the host's, or its cgroup's limit if lower."""
    limit = cgroup_memory_limit()
    host = host_memory()
    return min(host, limit) if limit is not None else host


def default_budget() -> int:
    """``--memory`` when not given: ``DEFAULT_SHARE`` of ``available_memory()``."""
    return int(available_memory() * DEFAULT_SHARE)


def default_spill(work_root: str) -> int:
    """``--spill`` when not given: ``SPILL_SHARE`` of the work root's free space now."""
    return int(free_bytes(work_root) * SPILL_SHARE)


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still write on ``path``'s file system."""
    st = os.statvfs(path)
    return int(st.f_bavail * st.f_frsize)


def disk_bytes(path: str) -> int:
    """The size of ``path``'s file system."""
    st = os.statvfs(path)
    return int(st.f_blocks * st.f_frsize)


@dataclass(frozen=True)
class SlotBudget:
    """What one slot's DuckDB may use, and the executor budget it came from.

    Attributes:
        memory: DuckDB ``memory_limit`` in bytes.
        spill: DuckDB ``max_temp_directory_size`` in bytes; ``None`` leaves DuckDB's
            default (90% of the free space).
        budget: The executor's whole memory budget (``--memory``).
        slots: Slots the budget is shared among.
        source: Where the budget came from, for messages (``"--memory"``, ...).
    """

    memory: int
    spill: int | None
    budget: int
    slots: int
    source: str = "--memory"

    @classmethod
    def share(
        cls, budget: int, slots: int, spill: int | None = None, source: str = "--memory"
    ) -> SlotBudget:
        """Share ``budget`` (and ``spill``) out among ``slots``, as the module docstring says.

        >>> SlotBudget.share(2**30, 2).memory // 2**20
        259
        """
        per_slot = int(max(0, budget - BASE_RESERVE) * DUCKDB_SHARE / max(1, slots))
        per_spill = None if spill is None else max(1, spill // max(1, slots))
        return cls(max(MIN_SLOT_MEMORY, per_slot), per_spill, budget, slots, source)

    def describe(self) -> str:
        """``"256.0 MiB of the executor's 1.0 GiB (--memory) over 2 slots"``."""
        return (
            f"{format_size(self.memory)} of the executor's {format_size(self.budget)} "
            f"({self.source}) over {self.slots} slot{'s' if self.slots != 1 else ''}"
        )


RELEASE_ABOVE = 256 * 2**20
"""Freed memory DuckDB's allocator may keep after a task; past it, all of it goes back.

Each purge costs the tasks after it the page faults of the memory they take
again. Measured in CPU seconds of the cluster's processes over the 22 TPC-H
queries (SF1, random layout, each query 3 times on two clusters in turn): a
purge after every task made them 15% slower in wall time; past 32 MiB, 7.5%
more CPU; past 64 MiB, 3.4% (branch ``mem``), and again on main with one scan
database per slot, 8.8% more CPU and 8% more time for a peak of 912 against 995
MiB. Most tasks leave a few MiB; q18's ``lineitem`` aggregate left 80 MB. So
only what SF1 never leaves goes back: a task that freed hundreds of MiB (a big
aggregate at a larger scale) would otherwise hold them in the executor while
its next tasks allocate their own."""

_MALLCTL_ARENAS_ALL = 4096
"""jemalloc's ``MALLCTL_ARENAS_ALL``: the arena index that means all of them."""


class _DuckDBAllocator:
    """The jemalloc that DuckDB's Linux wheels link in (its symbols prefixed
    ``duckdb_je_``), found once; ``mallctl`` is ``None`` where DuckDB was built
    without it."""

    _mallctl: Any = None
    _found = False

    @classmethod
    def mallctl(cls) -> Any:
        if not cls._found:
            cls._found = True
            try:
                import _duckdb  # noqa: PLC0415 - the extension module itself, loaded with duckdb

                library = ctypes.CDLL(_duckdb.__file__)
                function = library.duckdb_je_mallctl
            except (ImportError, OSError, AttributeError):
                return None
            function.argtypes = [
                ctypes.c_char_p,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_size_t,
            ]
            function.restype = ctypes.c_int
            cls._mallctl = function
        return cls._mallctl


def _dirty_bytes(mallctl: Any) -> int | None:
    """Freed bytes DuckDB's jemalloc keeps in all its arenas; ``None`` if unknown."""
    epoch = ctypes.c_uint64(1)
    size = ctypes.c_size_t(ctypes.sizeof(epoch))
    # Stats are a snapshot taken at the last "epoch" write.
    if mallctl(b"epoch", ctypes.byref(epoch), ctypes.byref(size), ctypes.byref(epoch), size):
        return None
    values = []
    for name in (f"stats.arenas.{_MALLCTL_ARENAS_ALL}.pdirty", "arenas.page"):
        value = ctypes.c_size_t()
        size = ctypes.c_size_t(ctypes.sizeof(value))
        if mallctl(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0):
            return None
        values.append(value.value)
    pages, page_size = values
    return int(pages * page_size)


def release_duckdb_memory(above: int = RELEASE_ABOVE) -> bool:
    """Hand the memory DuckDB has freed back to the kernel (after each task),
    where it keeps more than ``above`` bytes of it.

    DuckDB allocates with its own jemalloc, which keeps freed pages for reuse
    and returns them only as they decay, on its next allocations: a database
    that ran a big aggregate kept about 80 MB after the query ended (TPC-H q18,
    3M ``lineitem`` rows grouped into 1.3M orders), for as long as the process
    stayed idle (closing the database or any ``SET memory_limit`` gave them back;
    a slot's databases are locked and stay open). At q18's peak one executor
    held its scan task's freed memory while its aggregate task built its own
    table (issue 19; docs "Memory and disk"). Purging every arena took 6 ms for
    those 80 MB; reading how much is kept, well under 1 ms.

    Returns:
        Whether it purged (``False`` under ``above``, or where DuckDB has no
        jemalloc of its own).
    """
    mallctl = _DuckDBAllocator.mallctl()
    if mallctl is None:
        return False
    dirty = _dirty_bytes(mallctl)
    if dirty is not None and dirty <= above:
        return False
    return int(mallctl(f"arena.{_MALLCTL_ARENAS_ALL}.purge".encode(), None, None, None, 0)) == 0


_MALLOC_MMAP_THRESHOLD = 32 * 1024 * 1024
"""glibc's ``M_MMAP_THRESHOLD`` in an executor: the largest value it accepts
on 64-bit, and the cap of the adaptive threshold it replaces."""
_MALLOC_TRIM_THRESHOLD = 64 * 1024 * 1024
"""glibc's ``M_TRIM_THRESHOLD`` in an executor: free memory a heap keeps on top."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""The ``mallopt`` parameter numbers, from glibc's ``malloc.h``."""


def keep_batch_memory() -> bool:
    """Make glibc keep freed memory for the next Arrow batches (once per executor process).

    DuckDB builds each Arrow batch of a task's result in buffers it grows with
    ``realloc``. With glibc's default, adaptive thresholds, each batch's buffers
    were mapped afresh or the top of the slot thread's heap was handed back to
    the kernel once they were freed, so every batch faulted its pages in again
    (dear in a VM: about 1.5 ms per fresh MB on this project's machines). Fixed
    thresholds (allocations under 32 MiB from the heap, trimmed past 64 MiB
    free) keep that memory for the next batch. Measured on the shuffle query of
    ``benchmarks/micro.py`` (SF1, 276 MB shuffled, 2 executors, median of 10):
    0.67 s before, 0.575 s after; the executors' peak RSS 460 MB before, 500 MB
    after. It changes the C allocator of the whole process.

    Returns:
        Whether glibc took the settings (``False`` without glibc's ``mallopt``).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    took_mmap = int(mallopt(_M_MMAP_THRESHOLD, _MALLOC_MMAP_THRESHOLD)) == 1
    took_trim = int(mallopt(_M_TRIM_THRESHOLD, _MALLOC_TRIM_THRESHOLD)) == 1
    return took_mmap and took_trim


_PR_SET_THP_DISABLE = 41
"""``prctl``'s option that keeps transparent huge pages from this process
(``linux/prctl.h``); its children inherit it."""


def set_huge_pages(allowed: bool) -> bool:
    """Keep transparent huge pages from this process, or let the kernel's mode
    apply to it (``allowed``; a parent that kept them from itself passed that on);
    once per executor process.

    A kernel whose THP mode is ``madvise`` (the default of most distributions)
    backs with 2 MiB pages the regions a program asks for, and DuckDB's
    jemalloc asks for its big ones: each page fault of such a region clears a
    whole 2 MiB page, whatever the task touches of it, and each purge
    (``release_duckdb_memory``) gives it back to be cleared again. On this
    project's VMs, where fresh memory costs about 1.5 ms per MB (the host
    backs it on first touch), the same DuckDB aggregate of a quarter of TPC-H
    SF10's ``lineitem`` (one thread, pinned) took 0.45 to 0.83 s from run to
    run, up to 0.4 s of it in the kernel clearing pages; without huge pages
    0.50 to 0.55 s. TPC-H SF10 q1, q3, q9, q13 and q18 on DuckDB alone, one
    thread: 16.4 to 17.2 s with huge pages, 14.3 to 14.4 s without (q18 4.47
    against 3.52 s). Databases that hold big hash tables advise the same
    (Redis, MongoDB). Executors keep them from themselves unless started with
    ``--huge-pages``.

    Returns:
        Whether the kernel took it (``False`` off Linux, or before 3.15).
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    prctl.restype = ctypes.c_int
    zero = ctypes.c_ulong(0)
    disable = ctypes.c_ulong(0 if allowed else 1)
    return int(prctl(ctypes.c_int(_PR_SET_THP_DISABLE), disable, zero, zero, zero)) == 0
