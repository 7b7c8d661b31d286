"""The container image, built and run: deploy/compose.yaml's cluster under podman.

``scripts/build-image.sh`` builds deploy/Dockerfile (its base image made by debootstrap
from Debian's packages when no registry serves it); ``podman-compose`` starts etcd, a
scheduler and two executors from deploy/compose.yaml, each a container on the project's
network, with two additions (made here): the integration suite's planner options and
fault-rule files for the executors. A client container runs the 22 TPC-H queries;
then an executor container is killed with ``podman kill`` while a query's tasks run on
it; then the scheduler's etcd lease is revoked, and compose's restart policy must start
it again. Every answer is compared with single-process DuckDB on the same files.

Needs root, podman, podman-compose and debootstrap (``scripts/install-system-deps.sh
--containers``). The first build makes the base image (about 3 minutes) and the image
(about 2); later runs reuse both while podman keeps them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import TPCH_ORDER_BY, TPCH_TABLES, assert_same_result, tpch_query, wait_until

import mangonel
from mangonel.options import TEST_HOOKS_ENV

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/mangonel:test"
ETCD_IMAGE = "localhost/mangonel-etcd:test"
PROJECT = "mangonel-containers-test"
NETWORK = f"{PROJECT}_default"
CLIENT = Path(__file__).with_name("client.py")

# Building the images takes minutes the first time (in the first test's setup).
pytestmark = pytest.mark.timeout(1800)

QUERIES = list(range(1, 23))
ONE_STAGE = {2, 11, 16}
"""As in integration/test_tpch.py (the same planner options): these plan to one stage."""

# This machine's podman runs with runc (crun refuses a host whose cgroup v1 hierarchy sits
# beside a cgroup2 mount) and lower rlimits than podman's defaults, which a sandboxed host
# may refuse to raise. Both are harmless where they are not needed.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=10000:10000", "nproc=4096:4096"]
[engine]
runtime = "runc"
"""

PLANNER = ["--partitions=4", "--partition-bytes=0", "--no-adaptive", "--split-rows=250000"]


def compose_file_for_test(faults: Path) -> dict[str, Any]:
    """deploy/compose.yaml with what the test adds: the planner's options (as the
    integration suite's) and fault-rule files for the executors. (podman-compose 1.0
    appends an override file's lists to the base's, so the test writes one whole file.)"""
    spec: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    services = spec["services"]
    services["scheduler"]["command"] += PLANNER
    for n in (1, 2):
        executor = services[f"executor-{n}"]
        executor["command"].append(f"--faults-file=/faults/executor-{n}.json")
        # --faults-file is a test-only option: taken only with the hooks on.
        executor.setdefault("environment", {})[TEST_HOOKS_ENV] = "1"
        executor["volumes"].append(f"{faults}:/faults:ro")
    return spec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Compose:
    env: dict[str, str]
    files: list[str]
    grpc_port: int
    data: Path
    faults: Path
    logs: Path

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        done = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done.stdout

    def compose(self, *args: str, timeout: float = 300) -> str:
        files = [a for f in self.files for a in ("-f", f)]
        return self.run("podman-compose", "-p", PROJECT, *files, *args, timeout=timeout)

    def container(self, service: str) -> str:
        return f"{PROJECT}_{service}_1"

    def session(self) -> mangonel.Session:
        """A session from this host, through the scheduler's published port: it sees
        the cluster's status (results are read from the executors, on the network)."""
        return mangonel.connect(f"127.0.0.1:{self.grpc_port}")

    def client(self, out: Path, *args: str, name: str, detach: bool = False) -> str:
        """Run client.py in a container on the cluster's network."""
        out.mkdir(parents=True, exist_ok=True)
        out.chmod(0o777)  # the image runs as an unprivileged user
        command = [
            "podman",
            "run",
            "--name",
            name,
            "--network",
            NETWORK,
            "-v",
            f"{CLIENT}:/work/client.py:ro",
            "-v",
            f"{out}:/out",
            "--entrypoint",
            "python",
        ]
        command += ["-d"] if detach else ["--rm"]
        command += [IMAGE, "/work/client.py", "scheduler:50050", "/out", *args]
        self.run("podman", "rm", "-f", name, check=False)
        try:
            return self.run(*command, timeout=600)
        except AssertionError as exc:  # what the scheduler's container said meanwhile
            raise AssertionError(f"{exc}\n{self.describe('scheduler')}") from None

    def describe(self, service: str) -> str:
        """A container's state and restarts, and the end of its output (stdout and stderr)."""
        name = self.container(service)
        state = self.run(
            "podman",
            "inspect",
            "-f",
            "{{.State.Status}}, {{.RestartCount}} restarts",
            name,
            check=False,
        )
        logs = subprocess.run(
            ["podman", "logs", "-t", name],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=60,
        ).stdout
        return f"{service} ({state.strip()}), its output's end:\n{logs[-6000:]}"

    def save_logs(self) -> None:
        for service in ("etcd", "scheduler", "executor-1", "executor-2"):
            # podman logs writes what the container wrote to its stderr (mangonel's and
            # etcd's logs) on its own stderr.
            done = subprocess.run(
                ["podman", "logs", self.container(service)],
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=60,
            )
            (self.logs / f"{service}.log").write_text(done.stdout)


@pytest.fixture(scope="module")
def podman_env(module_dir: Path) -> dict[str, str]:
    for tool in ("podman", "podman-compose", "debootstrap", "runc"):
        assert shutil.which(tool), f"{tool} is missing: scripts/install-system-deps.sh --containers"
    conf = module_dir / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


@pytest.fixture(scope="module")
def images(podman_env: dict[str, str], module_dir: Path) -> None:
    """The image of deploy/Dockerfile, and an etcd image from this host's etcd binary
    (no registry serves etcd's own here; compose.yaml takes either)."""
    build = subprocess.run(
        ["scripts/build-image.sh", IMAGE],
        cwd=REPO,
        env=podman_env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    (module_dir / "build.log").write_text(build.stdout + build.stderr)
    assert build.returncode == 0, build.stderr[-3000:]
    etcd = shutil.which("etcd")
    assert etcd, "etcd is missing: scripts/install-system-deps.sh"
    context = module_dir / "etcd-image"
    context.mkdir()
    shutil.copy(etcd, context / "etcd")
    (context / "Containerfile").write_text(
        "FROM docker.io/library/python:3.11-slim-bookworm\nCOPY etcd /usr/local/bin/etcd\n"
    )
    subprocess.run(
        ["podman", "build", "--pull=never", "-t", ETCD_IMAGE, str(context)],
        env=podman_env,
        check=True,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def cluster(
    images: None, podman_env: dict[str, str], module_dir: Path, tpch_dir: Path
) -> Iterator[Compose]:
    faults = module_dir / "faults"
    faults.mkdir()
    for n in (1, 2):
        (faults / f"executor-{n}.json").write_text("[]")
    faults.chmod(0o755)
    data = tpch_dir.resolve()
    compose_file = module_dir / "compose.yaml"
    compose_file.write_text(yaml.safe_dump(compose_file_for_test(faults), sort_keys=False))
    grpc_port = free_port()
    env = {
        **podman_env,
        "MANGONEL_IMAGE": IMAGE,
        "MANGONEL_ETCD_IMAGE": ETCD_IMAGE,
        "MANGONEL_DATA": str(data),
        "MANGONEL_GRPC_PORT": str(grpc_port),
        "MANGONEL_FLIGHT_SQL_PORT": str(free_port()),
        "MANGONEL_WEB_PORT": str(free_port()),
    }
    compose = Compose(
        env,
        [str(compose_file)],
        grpc_port,
        data,
        faults,
        module_dir,
    )
    compose.compose("down", timeout=120)  # what an earlier, interrupted run left
    compose.compose("up", "-d")
    try:
        with compose.session() as session:
            wait_until(
                lambda: len(session.status().alive_executors()) == 2,
                "both executor containers registered",
                timeout=120,
            )
        yield compose
    finally:
        compose.save_logs()
        compose.compose("down", timeout=120)
        compose.run("podman", "network", "rm", "-f", NETWORK, check=False)


def check_answer(out: Path, number: int, duckdb_ref: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    expected = duckdb_ref.sql(tpch_query(number)).to_arrow_table()
    assert expected.num_rows > 0
    actual = pq.read_table(out / f"q{number:02d}.parquet")
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)
    facts: dict[str, Any] = json.loads((out / f"q{number:02d}.json").read_text())
    return facts


def test_containers_are_healthy_and_run_as_a_user(cluster: Compose) -> None:
    for service in ("scheduler", "executor-1", "executor-2"):
        name = cluster.container(service)
        cluster.run("podman", "healthcheck", "run", name)  # exits 0 when healthy
        assert cluster.run("podman", "exec", name, "id", "-u").strip() == "10001"


def test_22_tpch_queries_from_a_client_container(
    cluster: Compose, module_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    out = module_dir / "out-tpch"
    numbers = [str(n) for n in QUERIES]
    cluster.client(out, "--register", "/data", *numbers, name=f"{PROJECT}-client")
    for number in QUERIES:
        facts = check_answer(out, number, duckdb_ref)
        if number in ONE_STAGE:
            assert facts["stages"] == 1, (number, facts)
        else:
            assert facts["stages"] > 1, (number, facts)
    # ... and the run as a whole was spread: more tasks than stages.
    runs = [json.loads((out / f"q{n:02d}.json").read_text()) for n in QUERIES]
    assert sum(f["tasks"] for f in runs) > sum(f["stages"] for f in runs), runs


def test_an_executor_container_killed_mid_query(
    cluster: Compose, module_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Stage 1's tasks on executor-1 wait 5 s at their start: the kill lands while they run.
    rule = [{"action": "delay", "seconds": 5, "stage": 1}]
    (cluster.faults / "executor-1.json").write_text(json.dumps(rule))
    out = module_dir / "out-kill"
    name = f"{PROJECT}-client-kill"
    with cluster.session() as session:
        cluster.client(out, "18", name=name, detach=True)

        def busy_executor_1() -> bool:
            return any(
                e.flight_address.startswith("executor-1:") and e.running_tasks > 0
                for e in session.status().alive_executors()
            )

        wait_until(busy_executor_1, "a task of the query running on executor-1", timeout=120)
        cluster.run("podman", "kill", cluster.container("executor-1"))
        code = cluster.run("podman", "wait", name, timeout=300).strip()
        logs = cluster.run("podman", "logs", name, check=False)
        assert code == "0", logs
        facts = check_answer(out, 18, duckdb_ref)
        assert facts["tasks_rerun"] + facts["outputs_recomputed"] > 0, facts
        lost = [e for e in session.status().executors if e.flight_address.startswith("executor-1:")]
        assert lost and all(e.state.value == "lost" for e in lost), lost
    cluster.run("podman", "rm", "-f", name, check=False)
    # The container comes back, as a restarted executor would.
    (cluster.faults / "executor-1.json").write_text("[]")
    cluster.run("podman", "start", cluster.container("executor-1"))
    with cluster.session() as session:
        wait_until(
            lambda: len(session.status().alive_executors()) == 2,
            "executor-1's container registered again",
            timeout=120,
        )


REVOKE_LEASE = """\
import base64, time, requests
base = "http://etcd:2379/v3"
key = base64.b64encode(b"/mangonel/leader").decode()
for _ in range(300):  # the scheduler leads once it serves: a moment after its start
    kvs = requests.post(base + "/kv/range", json={"key": key}, timeout=10).json().get("kvs")
    if kvs:
        break
    time.sleep(0.1)
requests.post(base + "/lease/revoke", json={"ID": kvs[0]["lease"]}, timeout=10).raise_for_status()
"""


def test_a_scheduler_whose_lease_ran_out_is_started_again_by_compose(
    cluster: Compose, module_dir: Path, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """The scheduler's etcd lease is revoked (as etcd does when its refreshes stop
    getting through): the scheduler stops with status 3, compose's restart policy
    starts it again, it recovers the tables from etcd, and a client's query runs."""
    name = cluster.container("scheduler")
    with cluster.session() as session:  # as the first test did (this one may run alone)
        for table in TPCH_TABLES:
            session.register_parquet(table, f"/data/{table}.parquet")

    def restarts() -> int:
        return int(cluster.run("podman", "inspect", "-f", "{{.RestartCount}}", name).strip())

    before = restarts()
    cluster.run("podman", "exec", name, "python", "-c", REVOKE_LEASE)
    wait_until(lambda: restarts() > before, "the scheduler's container started again", timeout=60)
    logs = subprocess.run(
        ["podman", "logs", name], env=cluster.env, capture_output=True, text=True, timeout=60
    )
    assert "lost the lead of its state store: " in logs.stdout + logs.stderr  # and why
    out = module_dir / "out-restarted"
    # podman's DNS may not answer a container started again for its first 20-40 s (seen
    # with podman 4.3: the scheduler's first lookup of etcd hangs, then fails); the
    # scheduler waits for etcd through that (--state-wait), and the client for it.
    cluster.client(out, "--connect-wait", "120", "3", name=f"{PROJECT}-client-restarted")
    check_answer(out, 3, duckdb_ref)
    # Started once: the scheduler waited for etcd rather than exiting into a loop of restarts.
    assert restarts() == before + 1, cluster.describe("scheduler")
    with cluster.session() as session:
        wait_until(
            lambda: len(session.status().alive_executors()) == 2,
            "both executors registered with the scheduler started again",
            timeout=120,
        )
