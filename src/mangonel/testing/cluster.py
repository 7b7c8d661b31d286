"""``LocalCluster``: a real scheduler and real executor processes on localhost.

>>> with LocalCluster(executors=2) as cluster:                      # doctest: +SKIP
...     with cluster.connect() as session:
...         session.register_parquet("t", "/data/t.parquet")
...         session.sql("SELECT count(*) FROM t").to_pandas()

Every process is started with ``python -m mangonel ...`` on free ports, writes
its stdout and stderr to a log file under ``log_dir`` (``work_dir/logs`` by
default), and is stopped on exit: SIGTERM, then SIGKILL after a bound. A start
that fails stops what it started and raises ``ClusterError`` with the tail of
the failing process's log. On Linux the children also get SIGTERM when the
process that started them dies (``PR_SET_PDEATHSIG``), so a killed test run
leaves no orphans.

Fault injection for chaos tests: ``kill_executor``, ``freeze_executor``,
``thaw_executor``, ``add_executor``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType

from mangonel.client.session import Session
from mangonel.client.status import ExecutorState
from mangonel.errors import ClusterError, MangonelError

_LOG_TAIL_BYTES = 4000
_POLL_S = 0.02
_live_clusters: weakref.WeakSet[LocalCluster] = weakref.WeakSet()


def _die_with_parent() -> None:
    """``preexec_fn``: ask Linux to SIGTERM the child when its parent dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class ProcessHandle:
    """One child process and its log file."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def log_tail(self, limit: int = _LOG_TAIL_BYTES) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")

    def stop(self, timeout_s: float) -> None:
        """SIGTERM (and SIGCONT, in case it is frozen), then SIGKILL after ``timeout_s``."""
        if not self.alive():
            return
        self.signal(signal.SIGTERM)
        self.signal(signal.SIGCONT)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(5)


class ExecutorHandle(ProcessHandle):
    """An executor process; ``id`` is the id the scheduler gave it once registered."""

    def __init__(
        self, index: int, args: list[str], log_path: Path, env: dict[str, str], work_dir: Path
    ) -> None:
        super().__init__(f"executor-{index}", args, log_path, env)
        self.index = index
        self.work_dir = work_dir
        self.id: str | None = None


class LocalCluster:
    """A scheduler and ``executors`` executor processes on localhost.

    Args:
        executors: Executor processes to start.
        work_dir: Root of the executors' work directories and the logs; a new
            temporary directory (removed on a clean stop) when ``None``.
        slots: Task slots of each executor; the executor's default when ``None``.
        partitions: Output partitions of every hash exchange.
        broadcast_bytes: Broadcast threshold of the planner; its default when ``None``.
        heartbeat_timeout: Seconds of executor silence before it is declared lost.
        log_dir: Where the process logs go; ``work_dir/logs`` when ``None``.
        start_timeout: Seconds to wait for the scheduler and every executor.
        stop_timeout: Seconds between SIGTERM and SIGKILL when stopping.
        log_level: Log level of the child processes.
        scheduler_args: Extra command-line options of ``mangonel scheduler``.
        executor_args: Extra command-line options of each ``mangonel executor``.
        scheduler_port: Port of the scheduler; 0 picks a free one.
    """

    def __init__(
        self,
        executors: int = 2,
        work_dir: str | os.PathLike[str] | None = None,
        slots: int | None = None,
        partitions: int = 4,
        broadcast_bytes: int | None = None,
        heartbeat_timeout: float = 5.0,
        log_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 5.0,
        log_level: str = "info",
        scheduler_args: tuple[str, ...] = (),
        executor_args: tuple[str, ...] = (),
        scheduler_port: int = 0,
    ) -> None:
        if executors < 0:
            raise ValueError(f"executors must be at least 0, got {executors}")
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="mangonel-cluster-")).resolve()
        self.log_dir = Path(log_dir).resolve() if log_dir else self.work_dir / "logs"
        self.num_executors = executors
        self.slots = slots
        self.partitions = partitions
        self.broadcast_bytes = broadcast_bytes
        self.heartbeat_timeout = heartbeat_timeout
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.log_level = log_level
        self.scheduler_args = scheduler_args
        self.executor_args = executor_args
        self.scheduler_port = scheduler_port
        self.scheduler: ProcessHandle | None = None
        self.executors: list[ExecutorHandle] = []
        self._address: str | None = None
        self._lock = threading.Lock()
        self._failed = False

    # ------------------------------------------------------------------ life cycle

    @property
    def address(self) -> str:
        """``host:port`` of the scheduler."""
        if self._address is None:
            raise ClusterError("the cluster is not started; use it as a context manager")
        return self._address

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        """Start the scheduler and the executors; wait until all registered."""
        _live_clusters.add(self)
        try:
            self._start_scheduler()
            for _ in range(self.num_executors):
                self._spawn_executor()
            self.wait_for_executors(self.num_executors, self.start_timeout)
        except BaseException:
            self._failed = True
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process (executors first), never leaving one behind."""
        procs: list[ProcessHandle] = [*self.executors]
        if self.scheduler is not None:
            procs.append(self.scheduler)
        for proc in procs:
            proc.signal(signal.SIGTERM)
            proc.signal(signal.SIGCONT)
        for proc in procs:
            proc.stop(self.stop_timeout)
        _live_clusters.discard(self)
        if self._own_work_dir and not self._failed:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _start_scheduler(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        address_file = self.work_dir / "scheduler.address"
        address_file.unlink(missing_ok=True)
        args = [
            sys.executable, "-m", "mangonel", "--log-level", self.log_level,
            "scheduler", "--host", "127.0.0.1", "--port", str(self.scheduler_port),
            "--address-file", str(address_file),
            "--partitions", str(self.partitions),
            "--heartbeat-timeout", str(self.heartbeat_timeout),
        ]  # fmt: skip
        if self.broadcast_bytes is not None:
            args += ["--broadcast-bytes", str(self.broadcast_bytes)]
        args += list(self.scheduler_args)
        self.scheduler = ProcessHandle(
            "scheduler", args, self.log_dir / "scheduler.log", self._env()
        )
        deadline = time.monotonic() + self.start_timeout
        while not address_file.exists():
            self._check_alive(self.scheduler)
            if time.monotonic() > deadline:
                raise self._start_error(self.scheduler, "did not start listening in time")
            time.sleep(_POLL_S)
        self._address = address_file.read_text().strip()

    def _spawn_executor(self) -> ExecutorHandle:
        with self._lock:
            index = len(self.executors)
            work_dir = self.work_dir / f"executor-{index}"
            args = [
                sys.executable, "-m", "mangonel", "--log-level", self.log_level,
                "executor", "--scheduler", self.address, "--port", "0",
                "--work-dir", str(work_dir),
            ]  # fmt: skip
            if self.slots is not None:
                args += ["--slots", str(self.slots)]
            args += list(self.executor_args)
            handle = ExecutorHandle(
                index, args, self.log_dir / f"executor-{index}.log", self._env(), work_dir
            )
            self.executors.append(handle)
            return handle

    def _check_alive(self, proc: ProcessHandle) -> None:
        if not proc.alive():
            raise self._start_error(proc, f"exited with code {proc.process.returncode}")

    def _start_error(self, proc: ProcessHandle, what: str) -> ClusterError:
        tail = proc.log_tail()
        return ClusterError(
            f"{proc.name} (pid {proc.pid}) {what}; its log {proc.log_path} ends with:\n{tail}"
        )

    def wait_for_executors(self, count: int | None = None, timeout: float | None = None) -> None:
        """Wait until ``count`` of our executor processes are registered and alive.

        Raises:
            ClusterError: an executor process exited, or the wait timed out.
        """
        count = len(self.executors) if count is None else count
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        with self.connect() as session:
            while True:
                if self.scheduler is not None:
                    self._check_alive(self.scheduler)
                registered = self._match_ids(session)
                if registered >= count:
                    return
                for handle in self.executors:
                    if handle.id is None:
                        self._check_alive(handle)
                if time.monotonic() > deadline:
                    waiting = [h for h in self.executors if h.id is None] or self.executors
                    raise self._start_error(
                        waiting[0], f"did not register with the scheduler in {timeout} s"
                    )
                time.sleep(_POLL_S * 5)

    def _match_ids(self, session: Session) -> int:
        """Give our handles the ids of the alive executors with their pids."""
        try:
            status = session.status()
        except MangonelError:
            return 0
        alive = {e.pid: e.id for e in status.executors if e.state is ExecutorState.ALIVE}
        for handle in self.executors:
            if handle.pid in alive:
                handle.id = alive[handle.pid]
        return sum(1 for h in self.executors if h.id is not None and h.pid in alive)

    # ------------------------------------------------------------------- clients

    def connect(self) -> Session:
        """A client session with this cluster's scheduler."""
        return Session(self.address)

    # ------------------------------------------------------------ fault injection

    def kill_executor(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) to executor ``index``; wait if it kills."""
        handle = self.executors[index]
        handle.signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            with contextlib.suppress(subprocess.TimeoutExpired):
                handle.process.wait(self.stop_timeout)

    def freeze_executor(self, index: int) -> None:
        """SIGSTOP executor ``index``: it stays connected but answers nothing."""
        self.executors[index].signal(signal.SIGSTOP)

    def thaw_executor(self, index: int) -> None:
        """SIGCONT a frozen executor."""
        self.executors[index].signal(signal.SIGCONT)

    def add_executor(self, wait: bool = True) -> ExecutorHandle:
        """Start one more executor; by default wait until it registered."""
        with self.connect() as session:
            registered = self._match_ids(session)
        handle = self._spawn_executor()
        if wait:
            self.wait_for_executors(registered + 1)
        return handle


@atexit.register
def _stop_all() -> None:
    for cluster in list(_live_clusters):
        cluster.stop()
