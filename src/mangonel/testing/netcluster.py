"""``NetCluster``: a mangonel cluster whose every process runs on a host of its own.

>>> with NetCluster(tmp, executors=2) as cluster:                       # doctest: +SKIP
...     cluster.client.register_parquet("t", "/data/t.parquet")
...     cluster.client.sql("SELECT count(*) FROM t").result.to_arrow()

On a ``NetLab``: a host ``scheduler``, hosts ``executor-0`` … ``executor-<n-1>``
and a host ``client``, each with its own address, host name and directory (see
``testing.netlab``). What each process is given, the same a deployment across
real machines needs:

* the scheduler listens on its host's address (``--host``), gRPC on
  ``SCHEDULER_PORT`` and the web UI, REST API and ``/metrics`` on ``WEB_PORT``,
  with its SQLite state in its host's directory;
* each executor is given the scheduler's address (``--scheduler``), listens for
  Flight on every interface of its host (``--host 0.0.0.0``) and advertises its
  host's address (``--advertise-host``), which the scheduler hands to the other
  executors and to clients with every output location. Its host identity is
  its host name, the default, so no two executors read each other's files by
  path: every shuffle byte between them crosses the network over Flight. Its
  work root, faults file and temporary files are in its host's directory;
* the client (``testing.netclient``) is given the scheduler's address only.

Tables must be readable at the same path from every host: a directory outside
the lab's root, which every host sees, or, with ``object_store=True``, an S3
server on a host ``store`` of its own (``testing.netstore``): the scheduler and
the executors are given its endpoint (``--s3-endpoint-url``) and credentials (in
their environment), and read ``s3://`` tables across the switch.
The processes' logs are ``root/logs/<host>.log``.

Speculative execution is off unless asked for (``speculation=True``), as in
``testing.cluster.TestCluster``: a copy of a frozen or cut-off executor's task
racing it elsewhere would decide by timing whether the recovery a test cuts the
network for happens at all.
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from mangonel import defaults
from mangonel.client.cluster import ProcessHandle
from mangonel.client.status import ClusterStatus, ExecutorState
from mangonel.errors import ClusterError
from mangonel.testing.faults import write_rules
from mangonel.testing.netclient import NETCLIENT_KEY_ENV, ClientHost
from mangonel.testing.netlab import MOUNT_POINT, Host, NetLab
from mangonel.testing.netstore import NetStore

SCHEDULER_PORT = defaults.SCHEDULER_PORT
WEB_PORT = defaults.WEB_PORT
_POLL_S = 0.05


class NetCluster:
    """A scheduler, ``executors`` executors and a client, each on its own lab host.

    Args:
        root: The lab's directory (hosts' directories, logs); kept afterwards.
        executors: Executor hosts, one executor each.
        slots: Task slots of each executor.
        heartbeat_timeout: Seconds of executor silence before it is lost.
        scheduler_args: Extra options of ``mangonel scheduler``.
        executor_args: Extra options of each ``mangonel executor``.
        start_timeout: Seconds to wait for each process to be ready.
        log_level: Log level of the mangonel processes.
        object_store: Also start an S3 server on a host ``store`` (``store``),
            which the scheduler and executors are pointed at.
    """

    def __init__(
        self,
        root: str | Path,
        executors: int = 2,
        slots: int = 1,
        heartbeat_timeout: float = 10.0,
        scheduler_args: Sequence[str] = (),
        executor_args: Sequence[str] = (),
        start_timeout: float = 60.0,
        log_level: str = "info",
        object_store: bool = False,
        speculation: bool = False,
    ) -> None:
        self.lab = NetLab(root)
        self.speculation = speculation
        self.num_executors = executors
        self.slots = slots
        self.heartbeat_timeout = heartbeat_timeout
        self.scheduler_args = tuple(scheduler_args)
        self.executor_args = tuple(executor_args)
        self.start_timeout = start_timeout
        self.log_level = log_level
        self._key = secrets.token_bytes(16)
        self.scheduler: ProcessHandle | None = None
        self.executors: list[ProcessHandle] = []
        self.executor_hosts: list[Host] = []
        self.agent: ProcessHandle | None = None
        self._client: ClientHost | None = None
        self.object_store = object_store
        self.store: NetStore | None = None

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        self.lab.open()
        try:
            self.scheduler_host = self.lab.add_host("scheduler")
            self.executor_hosts = [
                self.lab.add_host(f"executor-{i}") for i in range(self.num_executors)
            ]
            self.client_host = self.lab.add_host("client")
            if self.object_store:
                self.store = NetStore.start(self.lab, self.lab.add_host("store"))
            self._start_scheduler()
            for index in range(self.num_executors):
                self.executors.append(self._start_executor(index))
            self._start_client()
            self.wait_for_executors(self.num_executors)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the executors (SIGINT: at once, no drain), then everything else."""
        for proc in self.executors:
            proc.stop(5.0, signal.SIGINT)
        self.lab.close()

    @property
    def scheduler_address(self) -> str:
        return f"{self.scheduler_host.address}:{SCHEDULER_PORT}"

    @property
    def web_url(self) -> str:
        return f"http://{self.scheduler_host.address}:{WEB_PORT}"

    @property
    def client(self) -> ClientHost:
        """The client on the client host."""
        if self._client is None:
            raise ClusterError("the cluster is not started")
        return self._client

    # ------------------------------------------------------------------- processes

    def _mangonel(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "mangonel", "--log-level", self.log_level, *args]

    def _start_scheduler(self) -> None:
        host = self.scheduler_host
        address_file = f"{MOUNT_POINT}/scheduler.address"
        argv = self._mangonel(
            "scheduler", "--host", host.address, "--port", str(SCHEDULER_PORT),
            "--address-file", address_file, "--state", f"sqlite://{MOUNT_POINT}/state.db",
            "--heartbeat-timeout", str(self.heartbeat_timeout),
            "--web-port", str(WEB_PORT),
            "--speculation" if self.speculation else "--no-speculation",
            *self._store_args(), *self.scheduler_args,
        )  # fmt: skip
        self.scheduler = self.lab.start(host, argv, env=self._store_env())
        self._wait_file(self.scheduler, host.outside(address_file))

    def _start_executor(self, index: int) -> ProcessHandle:
        host = self.executor_hosts[index]
        argv = self._mangonel(
            "executor", "--scheduler", self.scheduler_address,
            "--host", "0.0.0.0", "--advertise-host", host.address,
            "--work-dir", f"{MOUNT_POINT}/work", "--slots", str(self.slots),
            "--index", str(index), "--faults-file", f"{MOUNT_POINT}/faults.json",
            *self._store_args(), *self.executor_args,
        )  # fmt: skip
        return self.lab.start(host, argv, env=self._store_env())

    def _store_args(self) -> list[str]:
        return self.store.args() if self.store else []

    def _store_env(self) -> dict[str, str]:
        return self.store.env() if self.store else {}

    def _start_client(self) -> None:
        host = self.client_host
        socket_inside = f"{MOUNT_POINT}/client.sock"
        argv = [
            sys.executable, "-m", "mangonel.testing.netclient",
            "--scheduler", self.scheduler_address, "--socket", socket_inside,
        ]  # fmt: skip
        self.agent = self.lab.start(host, argv, env={NETCLIENT_KEY_ENV: self._key.hex()})
        socket_path = host.outside(socket_inside)
        self._wait_file(self.agent, socket_path)
        self._client = ClientHost(str(socket_path), self._key)

    def restart_executor(self, index: int) -> ProcessHandle:
        """Start executor ``index`` again on its host (after it exited or was killed)."""
        if self.executors[index].alive():
            raise ClusterError(f"executor {index} still runs")
        self.executors[index] = self._start_executor(index)
        return self.executors[index]

    def _wait_file(self, proc: ProcessHandle, path: Path) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not path.exists():
            if not proc.alive():
                raise ClusterError(
                    f"{proc.name} exited with code {proc.process.returncode}; its log "
                    f"{proc.log_path} ends with:\n{proc.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(f"{proc.name} did not make {path} in time:\n{proc.log_tail()}")
            time.sleep(_POLL_S)

    # --------------------------------------------------------------------- waiting

    def executor_ids(self, status: ClusterStatus | None = None) -> dict[int, str]:
        """Executor index -> the id under which its process is alive now."""
        status = status or self.client.status()
        by_pid = {e.pid: e.id for e in status.executors if e.state is ExecutorState.ALIVE}
        return {i: by_pid[p.pid] for i, p in enumerate(self.executors) if p.pid in by_pid}

    def wait_for_executors(self, count: int, timeout: float | None = None) -> dict[int, str]:
        """Wait until ``count`` of the executor processes are registered and alive."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while True:
            for proc in [self.scheduler, self.agent, *self.executors]:
                if proc is not None and not proc.alive():
                    raise ClusterError(
                        f"{proc.name} exited with code {proc.process.returncode}:\n"
                        f"{proc.log_tail()}"
                    )
            try:
                ids = self.executor_ids()
            except (ClusterError, OSError):
                ids = {}
            if len(ids) >= count:
                return ids
            if time.monotonic() > deadline:
                raise ClusterError(f"{len(ids)} of {count} executors registered in time")
            time.sleep(_POLL_S * 4)

    # ---------------------------------------------------------------------- faults

    def set_faults(self, index: int, rules: Sequence[Mapping[str, Any]]) -> None:
        """Give executor ``index`` these fault rules (``executor.faults``; ``[]`` clears)."""
        path = self.executor_hosts[index].outside(f"{MOUNT_POINT}/faults.json")
        write_rules(str(path), rules)

    def metrics(self) -> dict[str, float]:
        """The scheduler's ``/metrics`` samples (name with labels -> value), read from
        the client host."""
        text = self.client.http_get(f"{self.web_url}/metrics")
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def run_on(self, host: Host, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run a short command on ``host`` (``NetLab.run``)."""
        return self.lab.run(host, argv)
