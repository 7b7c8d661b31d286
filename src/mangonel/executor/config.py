"""Settings of one executor process.

One ``ExecutorConfig`` describes an executor: where the scheduler is, how the
executor names its host, where its Flight server listens, how many task slots it
runs, its memory and spill budgets (shared out among the slots by
``executor.memory``) and how many DuckDB threads each slot may use, where its
files live, how long it drains, and where its fault-injection rules are.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from dataclasses import dataclass, field

from mangonel import defaults, options
from mangonel.executor import memory as mem
from mangonel.security.options import SecurityOptions
from mangonel.security.options import options_from_args as security_options_from_args
from mangonel.storage import StorageOptions
from mangonel.storage import options_from_args as storage_options_from_args

_WILDCARDS = ("0.0.0.0", "::", "")
"""Bind addresses meaning every interface: listened on, never connected to."""


def _default_host() -> str:
    return socket.gethostname()


def _default_slots() -> int:
    return os.cpu_count() or 1


def _default_work_dir() -> str:
    # One root for every executor of this user on this host: each keeps its own
    # locked directories in it, and each sweeps up after the dead (``workdir``).
    return os.path.join(tempfile.gettempdir(), f"mangonel-work-{os.getuid()}")


@dataclass
class ExecutorConfig:
    """Settings of one executor process.

    Attributes:
        scheduler_address: ``host:port`` of the scheduler's gRPC service: its
            cluster port (``--cluster-port``) when the cluster speaks TLS.
        host_id: The name this executor reports as its host (``--host-id``).
            Two executors that report the same host read each other's shuffle
            files from disk instead of over Flight, so it must really identify
            the machine (and its file system).
        bind_host: Interface the Flight server listens on (``--host``).
        advertise_host: Host name put in the Flight address given to others;
            defaults to ``bind_host`` (``127.0.0.1`` is only right on one machine).
            Required when ``bind_host`` is a wildcard (``0.0.0.0``, ``::``),
            which no peer can connect to.
        flight_port: Port of the Flight server; 0 picks a free one.
        slots: Tasks run at the same time, each with its own DuckDB database.
        memory: The executor's memory budget, e.g. ``"2GB"``, ``"512MiB"``:
            the whole process must fit in it; each slot's DuckDB gets a share
            (``executor.memory.SlotBudget``). ``None``: 80% of the host's memory
            or of this process's cgroup limit, whichever is lower.
        memory_limit: Deprecated (``--memory-limit``): DuckDB ``memory_limit`` of
            each slot, overriding the share of ``memory``.
        spill: The executor's spill budget (DuckDB temporary files of all its
            slots), e.g. ``"20GB"``; ``None``: half the work root's free space
            when the executor starts.
        threads: DuckDB threads of each slot; ``None`` means
            ``max(1, cores // slots)`` so that full slots do not oversubscribe.
        cores: The cores this executor's tasks may use (``--cores``; where a
            container's CPU quota is less than the host's count, say); ``None``:
            ``os.cpu_count()``. The scheduler counts how many tasks a host runs
            at full speed at once from it and ``threads`` (``ExecutorInfo``).
        huge_pages: Let the kernel back the process's memory with transparent
            huge pages as its THP mode says (``--huge-pages``); ``False``: keep
            them from it (``executor.memory.set_huge_pages``).
        work_dir: The work root: shuffle and DuckDB spill files live in
            directories of this executor under it (see ``executor.workdir``);
            executors of one host may share it, and each deletes what dead
            ones left behind.
        heartbeat_interval_s: Seconds between heartbeats until the scheduler
            says otherwise (it does, when the executor registers).
        fetch_timeout_s: Longest a Flight ``do_get`` of a shuffle partition may
            receive nothing; a frozen peer then fails the fetch instead of
            hanging the task, and a slow one that keeps sending never does.
        fetch_retries: Tries of one Flight fetch before it is reported failed.
        link_probe_interval_s: Seconds between rounds of link probes to the
            peers the scheduler names (``executor.probes``); 0: no probes.
        drain_timeout_s: On SIGTERM the executor drains: it finishes its tasks
            and serves its outputs until the scheduler lets it go, for at most
            this long; then it exits anyway.
        cleanup_interval_s: How often the work root is swept for directories
            of dead executors (also done at start).
        faults_file: JSON fault-injection rules for tests (``testing.faults``,
            loaded by ``executor.main`` only when set); ``None`` injects nothing.
        index: The executor's number in a ``LocalCluster``; only names it in
            logs and injected faults.
        storage: How to reach object storage for ``s3://`` splits (endpoint,
            region, addressing, timeouts, retries); the AWS environment decides
            what it leaves out. Credentials are never part of it.
        security: TLS files (node role) and the cluster secret: TLS to the
            scheduler and on the Flight server (peers must show a certificate of
            the cluster CA), and only signed tickets served.
    """

    scheduler_address: str = defaults.SCHEDULER_ADDRESS
    host_id: str = field(default_factory=_default_host)
    bind_host: str = defaults.LISTEN_HOST
    advertise_host: str | None = None
    flight_port: int = 0
    slots: int = field(default_factory=_default_slots)
    memory: str | None = None
    memory_limit: str | None = None
    spill: str | None = None
    threads: int | None = None
    cores: int | None = None
    huge_pages: bool = False
    work_dir: str = field(default_factory=_default_work_dir)
    heartbeat_interval_s: float = 1.0
    fetch_timeout_s: float = defaults.FETCH_TIMEOUT_S
    fetch_retries: int = 3
    link_probe_interval_s: float = defaults.LINK_PROBE_INTERVAL_S
    drain_timeout_s: float = defaults.DRAIN_TIMEOUT_S
    cleanup_interval_s: float = defaults.CLEANUP_INTERVAL_S
    faults_file: str | None = None
    index: int | None = None
    storage: StorageOptions = field(default_factory=StorageOptions)
    security: SecurityOptions = field(default_factory=SecurityOptions)

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be at least 1, got {self.slots}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if self.cores is not None and self.cores < 1:
            raise ValueError(f"cores must be at least 1, got {self.cores}")
        if self.fetch_timeout_s <= 0:
            raise ValueError(f"fetch_timeout_s must be positive, got {self.fetch_timeout_s}")
        if self.link_probe_interval_s < 0:
            raise ValueError(
                f"link_probe_interval_s must be at least 0, got {self.link_probe_interval_s}"
            )
        if self.fetch_retries < 1:
            raise ValueError(f"fetch_retries must be at least 1, got {self.fetch_retries}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be at least 0, got {self.drain_timeout_s}")
        if self.cleanup_interval_s <= 0:
            raise ValueError(f"cleanup_interval_s must be positive, got {self.cleanup_interval_s}")
        for name in ("memory", "memory_limit", "spill"):
            value = getattr(self, name)
            if value is not None and mem.parse_size(value) <= 0:
                raise ValueError(f"{name} must be a positive size, got {value!r}")
        if self.bind_host in _WILDCARDS and not self.advertise_host:
            raise ValueError(
                f"the Flight server listens on every interface ({self.bind_host!r}), which "
                "no other host can connect to: give the address others reach this "
                "executor at (--advertise-host)"
            )

    @property
    def threads_per_slot(self) -> int:
        """DuckDB threads each slot uses."""
        if self.threads is not None:
            return self.threads
        return max(1, self.cores_available // self.slots)

    @property
    def cores_available(self) -> int:
        """The cores this executor's tasks may use (``cores``, else the host's)."""
        return self.cores if self.cores is not None else os.cpu_count() or 1

    def slot_budget(self) -> mem.SlotBudget:
        """What each slot's DuckDB may use: its share of the memory and spill budgets."""
        spill = mem.parse_size(self.spill) if self.spill is not None else None
        if spill is None and os.path.isdir(self.work_dir):
            spill = mem.default_spill(self.work_dir)
        if self.memory_limit is not None:
            per_slot = mem.parse_size(self.memory_limit)
            per_spill = None if spill is None else max(1, spill // self.slots)
            return mem.SlotBudget(
                per_slot, per_spill, per_slot * self.slots, self.slots, "--memory-limit per slot"
            )
        if self.memory is not None:
            return mem.SlotBudget.share(mem.parse_size(self.memory), self.slots, spill)
        budget = mem.default_budget()
        return mem.SlotBudget.share(
            budget, self.slots, spill, f"default: {mem.DEFAULT_SHARE:.0%} of available memory"
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExecutorConfig:
        """The config of ``mangonel executor``'s parsed options (``options.Takes.EXECUTOR``).

        Raises:
            ValueError: a setting is out of range.
        """
        given = options.values(args, options.Takes.EXECUTOR)
        given["scheduler_address"] = given.pop("scheduler", defaults.SCHEDULER_ADDRESS)
        return cls(
            **given,
            storage=storage_options_from_args(args),
            security=security_options_from_args(args, "node"),
        )

    def flight_host(self) -> str:
        """The host part of the Flight address given to the scheduler."""
        return self.advertise_host or self.bind_host
