"""The engines the TPC-H benchmark compares, behind one small interface.

- ``WorkerEngine``: DuckDB, DataFusion or Ballista in a child process of its own
  (``engine_worker.py``), so its peak memory is that process's ``VmHWM``.
- ``MangonelEngine``: a ``LocalCluster`` (a scheduler and N executor processes)
  queried from this process; its peak memory is the sum of the scheduler's and
  the executors' ``VmHWM``, read just before the cluster stops. The client (this
  process) is left out: it holds only the (small) TPC-H answers.

Every engine's ``run`` returns (seconds, answer); the seconds are measured
where the engine runs (inside the worker for the single-process engines, around
``session.sql`` for mangonel: submit to last result byte).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
from engine_worker import NO_HUGE_PAGES_ENV, vmhwm_kb

WORKER = Path(__file__).resolve().parent / "engine_worker.py"


def add_huge_pages_argument(parser: argparse.ArgumentParser) -> None:
    """``--duckdb-no-huge-pages``: the engines' workers run without transparent huge
    pages, as mangonel's executors do (``huge_pages_for_workers`` applies it)."""
    parser.add_argument(
        "--duckdb-no-huge-pages",
        action="store_true",
        help="run DuckDB without transparent huge pages, as mangonel's executors run "
        "(default: the kernel's THP mode, as DuckDB runs out of the box)",
    )


def huge_pages_for_workers(args: argparse.Namespace) -> None:
    """Before the workers start: pass ``--duckdb-no-huge-pages`` on to them."""
    if args.duckdb_no_huge_pages:
        os.environ[NO_HUGE_PAGES_ENV] = "1"  # the workers inherit it


class EngineError(Exception):
    """A query failed on an engine (the benchmark reports it and goes on)."""


class Engine(Protocol):
    name: str

    def run(self, sql: str) -> tuple[float, pa.Table]: ...

    def peak_rss_kb(self) -> tuple[int, int]:
        """(peak RSS in KiB summed over the engine's processes, how many processes)."""
        ...

    def close(self) -> None: ...


class WorkerEngine:
    """A single-process engine in its own child process.

    Args:
        name: ``duckdb``, ``datafusion`` or ``ballista``.
        data: The directory of ``<table>.parquet`` files.
        threads: DuckDB's threads (``None``: its default, a thread per core it may use).
        cpus: The cores the process may run on (``taskset``); ``None``: any.
        tables: The tables to register (``None``: TPC-H's).
    """

    def __init__(
        self,
        name: str,
        data: Path,
        threads: int | None = None,
        cpus: Sequence[int] | None = None,
        tables: Sequence[str] | None = None,
    ) -> None:
        self.name = name
        self._dir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        self._count = 0
        command = [sys.executable, str(WORKER), name, str(data)]
        if threads is not None or tables is not None:
            command += [str(threads or 0), ",".join(tables or ())]
        if cpus is not None:
            command = pinned(command, cpus)
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        first = self._read()
        if "error" in first:
            self.close()
            raise EngineError(first["error"])

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise EngineError(f"{self.name} worker exited with code {self._proc.wait()}")
        return dict(json.loads(line))

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def run(self, sql: str) -> tuple[float, pa.Table]:
        self._count += 1
        out = self._dir / f"answer-{self._count}.arrow"
        answer = self._ask({"op": "query", "sql": sql, "out": str(out)})
        if "error" in answer:
            raise EngineError(answer["error"])
        with pa.memory_map(str(out)) as source:
            table = pa.ipc.open_file(source).read_all()
        out.unlink()
        return float(answer["seconds"]), table

    def peak_rss_kb(self) -> tuple[int, int]:
        memory = self._ask({"op": "memory"})
        return int(memory["vmhwm_kb"] or memory["maxrss_kb"]), 1

    def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)
        for leftover in self._dir.glob("*"):
            leftover.unlink()
        self._dir.rmdir()


class MangonelEngine:
    """Queries through a client session of a running ``LocalCluster``."""

    name = "mangonel"

    def __init__(self, cluster: Any, session: Any) -> None:
        self.cluster = cluster
        self.session = session
        self.last: Any = None
        """The last ``Result`` (stages, scheduler time) for the report."""

    def run(self, sql: str) -> tuple[float, pa.Table]:
        start = time.perf_counter()
        self.last = self.session.sql(sql)
        return time.perf_counter() - start, self.last.to_arrow()

    def pids(self) -> list[int]:
        procs = [self.cluster.scheduler, *self.cluster.executors]
        return [p.pid for p in procs if p is not None and p.alive()]

    def peak_rss_kb(self) -> tuple[int, int]:
        pids = self.pids()
        return sum(vmhwm_kb(pid) for pid in pids), len(pids)

    def close(self) -> None:
        pass  # the session belongs to whoever made it


def pinned(command: Sequence[str], cpus: Sequence[int]) -> list[str]:
    """``command`` run by ``taskset``, on ``cpus`` alone (it and the threads it starts)."""
    return ["taskset", "--cpu-list", ",".join(str(c) for c in cpus), *command]


def ballista_unavailable() -> str | None:
    """Why ``import ballista`` fails in this interpreter, or None when it works."""
    probe = subprocess.run(
        [sys.executable, "-c", "import ballista"], capture_output=True, text=True, check=False
    )
    if probe.returncode == 0:
        return None
    lines = probe.stderr.strip().splitlines()
    why = lines[-1] if lines else f"exit code {probe.returncode}"
    libc = "".join(platform.libc_ver()) or "unknown libc"
    return (
        f"`import ballista` failed ({why}); PyPI's only x86-64 wheel of ballista "
        f"needs glibc 2.39, this machine has {libc}"
    )
