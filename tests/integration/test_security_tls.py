"""A secured cluster, with real processes: every channel under TLS, every refusal.

One secured ``LocalCluster`` per module (``secure=True``: a CA, node and client
certificates and a cluster secret made by ``certs.init_cluster``), whose two
executors report different hosts, so shuffle partitions cross between them over
Flight (with signed tickets) instead of being read from disk. Against it:

* queries over every channel give DuckDB's answers (client -> scheduler gRPC,
  scheduler <-> executor gRPC, executor <-> executor Flight, client <- executor
  Flight, HTTPS web UI);
* an executor with no certificate, another CA's, or a client's cannot register
  (the scheduler's log says why), and a scheduler of another CA cannot command a
  real executor (the executor refuses its TLS);
* a plaintext client, a client of another CA and a certificate that does not
  name the host dialled are refused with a clear ``ClusterError``;
* a forged, expired, unsigned or another session's ticket is refused by the
  executor's Flight server, which logs it and keeps serving the rightful reader;
* plain HTTP to the HTTPS web UI fails.

After each refusal the cluster still answers a query.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.flight as flight
import pytest
from helpers import assert_same_result, tpch_query, wait_until

from mangonel import LocalCluster
from mangonel.client.cluster import child_env
from mangonel.client.session import Session
from mangonel.errors import ClusterError
from mangonel.proto import convert
from mangonel.proto import mangonel_pb2 as pb
from mangonel.proto import mangonel_pb2_grpc as pb_grpc
from mangonel.scheduler.main import SchedulerConfig, start_scheduler
from mangonel.security import certs, tls
from mangonel.security.options import SecurityOptions
from mangonel.security.tickets import (
    SESSION_HEADER,
    TicketSigner,
    session_hash,
)

# A join and an aggregation: scan, shuffle and final stages, partitions crossing
# executors.
QUERY = """
SELECT o_orderpriority, count(*) AS n, sum(l_extendedprice) AS price
FROM orders JOIN lineitem ON l_orderkey = o_orderkey
WHERE l_shipdate >= DATE '1995-01-01'
GROUP BY o_orderpriority
ORDER BY o_orderpriority
"""


@pytest.fixture(scope="module")
def secure_cluster(module_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[LocalCluster]:
    with LocalCluster(
        executors=2,
        work_dir=module_dir / "cluster",
        partitions=4,
        scheduler_args=("--split-rows", "150000"),
        # Different hosts: shuffle partitions go between executors over Flight.
        executor_args_for=lambda i: ["--host-id", f"secure-host-{i}"],
        web_port=0,
        secure=True,
    ) as cluster:
        with cluster.connect() as session:
            for name, path in tpch_tables.items():
                session.register_parquet(name, str(path))
        yield cluster


@pytest.fixture
def reference(duckdb_ref: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Single-process DuckDB on the same files (the suite's ``duckdb_ref``)."""
    return duckdb_ref


def check_query(cluster: LocalCluster, reference: duckdb.DuckDBPyConnection) -> None:
    """The cluster answers QUERY as DuckDB does, distributed."""
    with cluster.connect() as session:
        result = session.sql(QUERY)
    assert len(result.stages) >= 3, result.stages
    assert_same_result(
        result.to_arrow(),
        reference.sql(QUERY).to_arrow_table(),
        ordered=True,
        order_by=["o_orderpriority"],
    )


def read(path: Path) -> bytes:
    return path.read_bytes()


def other_ca_dir(root: Path) -> Path:
    """A second cluster's files: its own CA, certificates and secret."""
    directory = root / "other-ca"
    if not (directory / "ca.pem").exists():
        certs.init_cluster(str(directory))
    return directory


def spawn_executor(address: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """An executor process of this test (its output in ``log``) for the scheduler at ``address``."""
    args = [
        sys.executable, "-m", "mangonel", "--log-level", "info", "executor",
        "--scheduler", address, "--port", "0", "--work-dir", str(log.parent / "work"),
        *extra,
    ]  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=child_env())


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)


def log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


# ------------------------------------------------------------------ legitimate use


def test_secured_cluster_answers_over_every_channel(
    secure_cluster: LocalCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    with secure_cluster.connect() as session:
        hosts = {e.host for e in session.status().executors}
        assert len(hosts) == 2, hosts  # shuffles cross executors over Flight
        for number in (3, 12):
            text = tpch_query(number)
            result = session.sql(text)
            assert len(result.stages) >= 2
            assert_same_result(
                result.to_arrow(), reference.sql(text).to_arrow_table(), ordered=False
            )
    check_query(secure_cluster, reference)
    for name in ("scheduler", "executor-0", "executor-1"):
        text = (secure_cluster.log_dir / f"{name}.log").read_text()
        assert "INSECURE" not in text
        assert "refused a Flight ticket" not in text, name


def test_web_ui_speaks_https_only(secure_cluster: LocalCluster) -> None:
    url = secure_cluster.web_url
    assert url.startswith("https://")
    context = ssl.create_default_context(cafile=str(secure_cluster.tls_dir / "ca.pem"))
    with urllib.request.urlopen(f"{url}/api/executors", context=context, timeout=10) as reply:
        assert reply.status == 200
        assert len(json.loads(reply.read())) == 2
    with urllib.request.urlopen(f"{url}/metrics", context=context, timeout=10) as reply:
        assert reply.status == 200
    plain = url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"{plain}/api/executors", timeout=10).read()
    # A client that does not trust the cluster CA refuses the server.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"{url}/api/executors", context=ssl.create_default_context())


# -------------------------------------------------------------- executors refused


@pytest.mark.parametrize("kind", ["no-certificate", "other-ca", "client-certificate"])
def test_executor_without_a_cluster_certificate_cannot_register(
    kind: str,
    secure_cluster: LocalCluster,
    reference: duckdb.DuckDBPyConnection,
    work_dir: Path,
) -> None:
    tls_dir = secure_cluster.tls_dir
    if kind == "no-certificate":
        extra: list[str] = []
        refusal = "WRONG_VERSION_NUMBER"  # gRPC's log: a plaintext hello at a TLS port
    elif kind == "other-ca":  # trusts the cluster CA, shows another CA's node certificate
        other = other_ca_dir(work_dir)
        extra = [
            "--tls-cert", str(other / "node.pem"),
            "--tls-key", str(other / "node-key.pem"),
            "--tls-ca", str(tls_dir / "ca.pem"),
        ]  # fmt: skip
        refusal = "CERTIFICATE_VERIFY_FAILED"
    else:  # the cluster's own CA, but a client's certificate
        extra = [
            "--tls-cert", str(tls_dir / "client.pem"),
            "--tls-key", str(tls_dir / "client-key.pem"),
            "--tls-ca", str(tls_dir / "ca.pem"),
        ]  # fmt: skip
        refusal = "is not a cluster member's (mangonel-node)"
    scheduler_log = secure_cluster.log_dir / "scheduler.log"
    before = scheduler_log.read_text(errors="replace").count(refusal)
    log = work_dir / "executor.log"
    proc = spawn_executor(secure_cluster.address, log, *extra)
    try:
        wait_until(
            lambda: log_has(log, "cannot register with the scheduler"),
            "the executor says it cannot register",
            timeout=30,
        )
        wait_until(
            lambda: scheduler_log.read_text(errors="replace").count(refusal) > before,
            f"the scheduler logs the refusal ({refusal!r})",
            timeout=15,
        )
    finally:
        stop(proc)
    text = log.read_text(errors="replace")
    assert "registered as executor" not in text
    if kind == "client-certificate":
        assert "PERMISSION_DENIED" in text and "cluster member" in text
    with secure_cluster.connect() as session:
        assert len(session.status().executors) == 2
    check_query(secure_cluster, reference)


def test_scheduler_of_another_ca_cannot_command_an_executor(
    secure_cluster: LocalCluster, work_dir: Path
) -> None:
    other = other_ca_dir(work_dir)
    fake = start_scheduler(
        SchedulerConfig(
            port=0, state="memory://", security=SecurityOptions.from_tls_dir(str(other), "node")
        )
    )
    log = work_dir / "executor.log"
    try:
        # A real executor with the cluster's files, told to join the fake scheduler.
        proc = spawn_executor(fake.address, log, "--tls-dir", str(secure_cluster.tls_dir))
        try:
            wait_until(
                lambda: log_has(log, "cannot register with the scheduler"),
                "the executor refuses the fake scheduler",
                timeout=30,
            )
        finally:
            stop(proc)
        text = log.read_text(errors="replace")
        assert "CERTIFICATE_VERIFY_FAILED" in text, text[-2000:]
        assert "not signed by this process's --tls-ca" in text
        assert not fake.core.executors()
    finally:
        fake.stop()


# ---------------------------------------------------------------- clients refused


def test_plaintext_client_gets_a_clear_error(secure_cluster: LocalCluster) -> None:
    with (
        Session(secure_cluster.address, timeout_s=10) as session,
        pytest.raises(ClusterError, match="--tls-dir"),
    ):
        session.tables()


def test_command_line_client_with_and_without_the_cluster_files(
    secure_cluster: LocalCluster,
) -> None:
    base = [sys.executable, "-m", "mangonel", "--scheduler", secure_cluster.address]
    query = ["sql", "SELECT count(*) AS n FROM nation"]
    env = child_env()
    ok = subprocess.run(
        [*base, "--tls-dir", str(secure_cluster.tls_dir), *query],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "25" in ok.stdout
    env.pop("MANGONEL_TLS_DIR", None)
    refused = subprocess.run([*base, *query], capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: cannot reach the scheduler")
    assert "--tls-dir" in refused.stderr


def test_client_of_another_ca_is_refused(secure_cluster: LocalCluster, work_dir: Path) -> None:
    other = SecurityOptions.from_tls_dir(str(other_ca_dir(work_dir)), "client")
    with (
        Session(secure_cluster.address, timeout_s=10, security=other) as session,
        pytest.raises(ClusterError, match="TLS handshake failed"),
    ):
        session.tables()
    # Trusting the right CA but showing another CA's certificate: the server refuses.
    mixed = dataclasses.replace(other, tls_ca=str(secure_cluster.tls_dir / "ca.pem"))
    with (
        Session(secure_cluster.address, timeout_s=10, security=mixed) as session,
        pytest.raises(ClusterError, match="refused this process's certificate"),
    ):
        session.tables()


def test_expired_client_certificate_is_refused(
    secure_cluster: LocalCluster, work_dir: Path
) -> None:
    ca = certs.read_ca(str(secure_cluster.tls_dir))
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    certs.write_pair(str(work_dir), "client", certs.issue(ca, "client", days=1, start=past))
    expired = SecurityOptions(
        tls_cert=str(work_dir / "client.pem"),
        tls_key=str(work_dir / "client-key.pem"),
        tls_ca=str(secure_cluster.tls_dir / "ca.pem"),
    )
    scheduler_log = secure_cluster.log_dir / "scheduler.log"
    before = scheduler_log.read_text(errors="replace").count("certificate has expired")
    with (
        Session(secure_cluster.address, timeout_s=10, security=expired) as session,
        pytest.raises(ClusterError, match="refused this process's certificate"),
    ):
        session.tables()
    wait_until(
        lambda: scheduler_log.read_text(errors="replace").count("certificate has expired") > before,
        "the scheduler logs the expired certificate",
        timeout=10,
    )
    with secure_cluster.connect() as session:  # the rightful clients still get in
        assert {t.name for t in session.tables()} >= {"lineitem", "orders"}


def test_certificate_that_does_not_name_the_host_is_refused(work_dir: Path) -> None:
    elsewhere = work_dir / "elsewhere"
    certs.init_cluster(str(elsewhere), hosts=["db.mangonel.invalid"], loopback=False)
    scheduler = start_scheduler(
        SchedulerConfig(
            port=0, state="memory://", security=SecurityOptions.from_tls_dir(str(elsewhere), "node")
        )
    )
    try:
        client = SecurityOptions.from_tls_dir(str(elsewhere), "client")
        with (
            Session(scheduler.address, timeout_s=10, security=client) as session,
            pytest.raises(ClusterError, match="does not name the host dialled"),
        ):
            session.tables()
    finally:
        scheduler.stop()


# ---------------------------------------------------------------- tickets refused


def _finished_job(cluster: LocalCluster, session_key: str) -> pb.JobStatus:
    """Run QUERY through the raw gRPC API; the final status with signed result locations."""
    material = tls.TlsMaterial.load(cluster.client_security)
    channel = tls.open_channel(cluster.address, material, [])
    try:
        stub = pb_grpc.QueryServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.Submit(
            pb.SubmitRequest(sql=QUERY, request_id=f"{session_key}.0001"), timeout=30
        )
        final = None
        for status in stub.WatchJob(pb.WatchJobRequest(job_id=reply.job_id), timeout=120):
            final = status
        assert final is not None and final.state == pb.JOB_STATE_SUCCEEDED, final
        return final
    finally:
        channel.close()


def test_result_tickets_are_signed_and_bound_to_the_session(
    secure_cluster: LocalCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    tls_dir = secure_cluster.tls_dir
    final = _finished_job(secure_cluster, "session-a")
    locations = [convert.partition_location_from_proto(m) for m in final.result]
    assert locations and all(loc.ticket.startswith("mgt1.") for loc in locations)
    loc = locations[0]
    client = flight.FlightClient(
        f"grpc+tls://{loc.flight_address}",
        tls_root_certs=read(tls_dir / "ca.pem"),
        cert_chain=read(tls_dir / "client.pem"),
        private_key=read(tls_dir / "client-key.pem"),
    )

    def get(ticket: bytes, key: str | None) -> Any:
        headers = [(SESSION_HEADER.encode(), key.encode())] if key is not None else []
        options = flight.FlightCallOptions(timeout=10, headers=headers)
        return client.do_get(flight.Ticket(ticket), options).read_all()

    signer = TicketSigner((tls_dir / "cluster-secret").read_bytes().strip())
    claims = signer.verify(loc.flight_ticket, "session-a")
    forged_path = loc.ticket[:-4] + ("AAAA" if not loc.ticket.endswith("AAAA") else "BBBB")
    expired = signer.sign(dataclasses.replace(claims, expires=time.time() - 5))
    other_cluster = TicketSigner(b"x" * 32).sign(claims)
    refusals = {
        "another session": (loc.flight_ticket, "session-b", "belongs to another session"),
        "no session key": (loc.flight_ticket, None, "no session key came with it"),
        "forged signature": (forged_path.encode(), "session-a", "signature does not match"),
        "another secret": (other_cluster, "session-a", "signature does not match"),
        "expired": (expired, "session-a", "expired"),
        "unsigned path": (loc.path.encode(), "session-a", "not signed"),
    }
    try:
        for what, (ticket, key, message) in refusals.items():
            with pytest.raises(flight.FlightUnauthenticatedError, match=message):
                get(ticket, key)
            # ... and the executor keeps serving the rightful reader.
            assert get(loc.flight_ticket, "session-a").num_rows == loc.rows, what
        # The whole result, read by its session, is DuckDB's answer.
        tables = [
            get(m.flight_ticket, "session-a")
            for m in locations
            if m.flight_address == loc.flight_address
        ]
        assert sum(t.num_rows for t in tables) > 0
    finally:
        client.close()
    logs = "".join(
        (secure_cluster.log_dir / f"executor-{i}.log").read_text(errors="replace") for i in (0, 1)
    )
    assert logs.count("refused a Flight ticket") >= len(refusals)
    assert session_hash("session-a") == claims.session
    check_query(secure_cluster, reference)


def test_shuffle_fetch_with_a_plaintext_or_foreign_client_is_refused(
    secure_cluster: LocalCluster, work_dir: Path
) -> None:
    with secure_cluster.connect() as session:
        address = session.status().executors[0].flight_address
    other = other_ca_dir(work_dir)
    attempts = {
        "plaintext": flight.FlightClient(f"grpc://{address}"),
        "no certificate": flight.FlightClient(
            f"grpc+tls://{address}", tls_root_certs=read(secure_cluster.tls_dir / "ca.pem")
        ),
        "other CA": flight.FlightClient(
            f"grpc+tls://{address}",
            tls_root_certs=read(secure_cluster.tls_dir / "ca.pem"),
            cert_chain=read(other / "node.pem"),
            private_key=read(other / "node-key.pem"),
        ),
    }
    for what, client in attempts.items():
        with pytest.raises(flight.FlightUnavailableError):
            client.do_get(flight.Ticket(b"x"), flight.FlightCallOptions(timeout=5)).read_all()
        client.close()
        assert what


# ------------------------------------------------------------------ loud defaults


def test_scheduler_on_every_interface_without_tls_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="mangonel.scheduler.main")
    exposed = start_scheduler(SchedulerConfig(host="0.0.0.0", port=0, state="memory://"))
    exposed.stop()
    assert "INSECURE: the scheduler listens on 0.0.0.0 without TLS" in caplog.text
    caplog.clear()
    quiet = start_scheduler(SchedulerConfig(host="127.0.0.1", port=0, state="memory://"))
    quiet.stop()
    assert "INSECURE" not in caplog.text


# ------------------------------------------------------------------- etcd, secured


def test_state_store_on_an_etcd_with_tls_and_client_certificates(work_dir: Path) -> None:
    from mangonel.errors import StateStoreError
    from mangonel.scheduler.store import open_store
    from mangonel.testing.etcd import EtcdServer

    tls_dir = work_dir / "etcd-tls"
    certs.init_cluster(str(tls_dir))
    with EtcdServer(work_dir, tls_dir=tls_dir) as etcd:
        url = etcd.url("/mangonel/secure/")
        assert "tls_ca=" in url and "tls_cert=" in url
        store = open_store(url)
        try:
            assert store.acquire("test", timeout_s=5)
            store.commit({"a": "1"})
            assert store.load()["a"] == "1"
        finally:
            store.close()
        # Plain HTTP to its HTTPS port: refused, and the message says where to look.
        with pytest.raises(StateStoreError, match="cannot reach the etcd state store"):
            open_store(url.split("?")[0])
        # TLS without a client certificate: etcd demands one.
        with pytest.raises(StateStoreError, match="TLS failed"):
            open_store(f"{url.split('?')[0]}?tls_ca={tls_dir / 'ca.pem'}")
        # A client that does not trust etcd's CA refuses etcd.
        other = other_ca_dir(work_dir)
        with pytest.raises(StateStoreError, match="TLS failed"):
            open_store(url.replace(str(tls_dir / "ca.pem"), str(other / "ca.pem")))


def test_state_store_on_an_etcd_with_tls_and_its_own_authentication(work_dir: Path) -> None:
    from mangonel.errors import StateStoreError
    from mangonel.scheduler.store import open_store
    from mangonel.testing.etcd import EtcdServer

    tls_dir = work_dir / "etcd-tls"
    certs.init_cluster(str(tls_dir))
    with EtcdServer(work_dir, tls_dir=tls_dir, user="root", password="s3cret-pw") as etcd:
        url = etcd.url("/mangonel/secure/")
        assert "tls_ca=" in url and "user=root" in url and "s3cret" not in url
        store = open_store(url)
        try:
            assert store.acquire("test", timeout_s=5)
            store.commit({"a": "1"})
            assert store.load()["a"] == "1"
        finally:
            store.close()
        # No login: etcd's authentication refuses.
        with pytest.raises(StateStoreError, match="refused a request"):
            open_store(f"{url.split('?')[0]}?tls_ca={tls_dir / 'ca.pem'}")
        wrong = work_dir / "wrong-password"
        wrong.write_text("nope")
        with pytest.raises(StateStoreError, match="authentication failed"):
            open_store(url.replace(str(etcd.password_file), str(wrong)))
