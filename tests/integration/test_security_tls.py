"""A secured cluster, with real processes: every channel under TLS, every refusal.

One secured ``LocalCluster`` per module (``secure=True``: a CA, the members'
certificate and a cluster secret in ``tls/cluster``, the CA alone in
``tls/client``, made by ``certs.init_cluster``; users ``root`` (admin), ``alice``
and ``bob``), whose two executors report different hosts, so shuffle partitions
cross between them over Flight (with signed tickets) instead of being read from
disk. Against it:

* a user holding only the client bundle (the CA's certificate) and a password
  queries through the Python API and the command line, over every channel
  (client -> scheduler gRPC, scheduler <-> executor gRPC on the cluster port,
  executor <-> executor Flight, client <- executor Flight, HTTPS web UI), and
  gets DuckDB's answers;
* that bundle cannot mint a token (no secret in it; a token signed with another
  secret is refused), start an executor, or register one at either port;
* an executor with no certificate, another CA's, or a client's cannot register
  (the scheduler's log says why), and a scheduler of another CA cannot command a
  real executor (the executor refuses its TLS);
* a plaintext client, a client of another CA and a certificate that does not
  name the host dialled are refused with a clear ``ClusterError``;
* a forged, expired, unsigned or another session's ticket is refused by the
  executor's Flight server, which logs it and keeps serving the rightful reader;
* plain HTTP to the HTTPS web UI fails; the API wants a token, even over TLS.

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
import grpc
import pyarrow.flight as flight
import pytest
from helpers import assert_same_result, tpch_query, wait_until

from mangonel import LocalCluster
from mangonel.client.cluster import child_env
from mangonel.client.session import Session
from mangonel.errors import AuthenticationError, ClusterError, ForbiddenStatementError
from mangonel.proto import convert
from mangonel.proto import mangonel_pb2 as pb
from mangonel.proto import mangonel_pb2_grpc as pb_grpc
from mangonel.scheduler.main import SchedulerConfig, start_scheduler
from mangonel.security import certs, tls, tokens
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

PASSWORDS = {"root": "root-secret", "alice": "alice-secret", "bob": "bob-secret!"}
USERS = {"root": (PASSWORDS["root"], True), "alice": (PASSWORDS["alice"], False),
         "bob": (PASSWORDS["bob"], False)}  # fmt: skip


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
        users=USERS,
    ) as cluster:
        with cluster.connect() as session:
            for name, path in tpch_tables.items():
                session.register_parquet(name, str(path))
        yield cluster


@pytest.fixture
def reference(duckdb_ref: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Single-process DuckDB on the same files (the suite's ``duckdb_ref``)."""
    return duckdb_ref


def as_user(cluster: LocalCluster, user: str = "alice") -> Session:
    """A session of ``user`` holding the client bundle alone (the cluster's CA) and a password."""
    bundle = SecurityOptions.from_tls_dir(str(cluster.client_tls_dir), "client")
    return Session(cluster.address, security=bundle, user=user, password=PASSWORDS[user])


def check_query(cluster: LocalCluster, reference: duckdb.DuckDBPyConnection) -> None:
    """The cluster answers QUERY as DuckDB does, distributed."""
    with as_user(cluster) as session:
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


def test_a_user_with_the_client_bundle_and_a_password_queries_over_every_channel(
    secure_cluster: LocalCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    # All a client holds: the CA's certificate.
    assert sorted(p.name for p in secure_cluster.client_tls_dir.iterdir()) == ["ca.pem"]
    with secure_cluster.connect() as root:
        hosts = {e.host for e in root.status().executors}
        assert len(hosts) == 2, hosts  # shuffles cross executors over Flight
    with as_user(secure_cluster) as session:
        for number in (3, 12):
            text = tpch_query(number)
            result = session.sql(text)
            assert len(result.stages) >= 2
            assert_same_result(
                result.to_arrow(), reference.sql(text).to_arrow_table(), ordered=False
            )
        assert session.user == "alice" and not session.admin
    check_query(secure_cluster, reference)
    for name in ("scheduler", "executor-0", "executor-1"):
        text = (secure_cluster.log_dir / f"{name}.log").read_text()
        assert "INSECURE" not in text
        assert "refused a Flight ticket" not in text, name


def test_web_ui_speaks_https_only(secure_cluster: LocalCluster) -> None:
    url = secure_cluster.web_url
    assert url.startswith("https://")
    context = ssl.create_default_context(cafile=str(secure_cluster.client_tls_dir / "ca.pem"))
    # Trusting the CA lets no one in: the API wants a user's token.
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(f"{url}/api/executors", context=context, timeout=10)
    with as_user(secure_cluster, "root") as root:
        root.log_in()
        bearer = {"Authorization": f"Bearer {root.token}"}
    request = urllib.request.Request(f"{url}/api/executors", headers=bearer)
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:
        assert reply.status == 200
        assert len(json.loads(reply.read())) == 2
    metrics = urllib.request.Request(f"{url}/metrics", headers=bearer)
    with urllib.request.urlopen(metrics, context=context, timeout=10) as reply:
        assert reply.status == 200
    plain = url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"{plain}/api/executors", timeout=10).read()
    # A client that does not trust the cluster CA refuses the server.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"{url}/api/executors", context=ssl.create_default_context())


# -------------------------------------------------------------- executors refused


@pytest.mark.parametrize(
    "kind", ["no-certificate", "other-ca", "client-certificate", "client-port"]
)
def test_executor_without_a_cluster_certificate_cannot_register(
    kind: str,
    secure_cluster: LocalCluster,
    reference: duckdb.DuckDBPyConnection,
    work_dir: Path,
) -> None:
    members = secure_cluster.member_tls_dir
    secret = ["--cluster-secret-file", str(members / "cluster-secret")]
    address = secure_cluster.cluster_address
    if kind == "no-certificate":
        extra: list[str] = []
        refusal = "WRONG_VERSION_NUMBER"  # gRPC's log: a plaintext hello at a TLS port
    elif kind == "other-ca":  # trusts the cluster CA, shows another CA's node certificate
        other = other_ca_dir(work_dir) / "cluster"
        extra = [
            "--tls-cert", str(other / "node.pem"),
            "--tls-key", str(other / "node-key.pem"),
            "--tls-ca", str(members / "ca.pem"), *secret,
        ]  # fmt: skip
        refusal = "CERTIFICATE_VERIFY_FAILED"
    elif kind == "client-certificate":  # the cluster's own CA, but a client's certificate
        ca = certs.read_ca(str(secure_cluster.tls_dir))
        certs.write_pair(str(work_dir), "client", certs.issue(ca, "client"))
        extra = [
            "--tls-cert", str(work_dir / "client.pem"),
            "--tls-key", str(work_dir / "client-key.pem"),
            "--tls-ca", str(members / "ca.pem"), *secret,
        ]  # fmt: skip
        refusal = "is not a cluster member's (mangonel-node)"
    else:  # a real member's files, at the port that serves clients (and asks no certificate)
        extra = ["--tls-dir", str(members)]
        address = secure_cluster.address
        refusal = "none: the client port asks for none"
    scheduler_log = secure_cluster.log_dir / "scheduler.log"
    before = scheduler_log.read_text(errors="replace").count(refusal)
    log = work_dir / "executor.log"
    proc = spawn_executor(address, log, *extra)
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
    if kind == "client-port":
        assert "PERMISSION_DENIED" in text and "this port serves clients" in text
        assert secure_cluster.cluster_address in text  # it says where to register instead
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
        members = str(secure_cluster.member_tls_dir)
        proc = spawn_executor(fake.cluster_address, log, "--tls-dir", members)
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
        assert "not signed by this process's CA" in text
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


def test_command_line_user_with_the_client_bundle_and_a_password(
    secure_cluster: LocalCluster,
) -> None:
    base = [sys.executable, "-m", "mangonel", "--scheduler", secure_cluster.address]
    query = ["sql", "SELECT count(*) AS n FROM nation"]
    env = child_env()
    for name in ("MANGONEL_TLS_DIR", "MANGONEL_TLS_CA", "MANGONEL_TOKEN", "MANGONEL_USER"):
        env.pop(name, None)
    env["MANGONEL_PASSWORD"] = PASSWORDS["alice"]
    bundle = secure_cluster.client_tls_dir
    for files in (["--tls-dir", str(bundle)], ["--tls-ca", str(bundle / "ca.pem")]):
        ok = subprocess.run(
            [*base, *files, "--user", "alice", *query],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        assert "25" in ok.stdout
    # The bundle without a password: the CA lets no one in.
    env.pop("MANGONEL_PASSWORD")
    anonymous = subprocess.run(
        [*base, "--tls-dir", str(bundle), *query],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert anonymous.returncode == 1
    assert "lets only known users in" in anonymous.stderr
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


def test_expired_member_certificate_is_refused(
    secure_cluster: LocalCluster, work_dir: Path
) -> None:
    """The cluster port checks a member's certificate: an expired one is refused."""
    ca = certs.read_ca(str(secure_cluster.tls_dir))
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    certs.write_pair(str(work_dir), "node", certs.issue(ca, "node", days=1, start=past))
    expired = SecurityOptions(
        tls_cert=str(work_dir / "node.pem"),
        tls_key=str(work_dir / "node-key.pem"),
        tls_ca=str(secure_cluster.client_tls_dir / "ca.pem"),
    )
    scheduler_log = secure_cluster.log_dir / "scheduler.log"
    before = scheduler_log.read_text(errors="replace").count("certificate has expired")
    with (
        Session(secure_cluster.cluster_address, timeout_s=10, security=expired) as session,
        pytest.raises(ClusterError, match="refused this process's certificate"),
    ):
        session.tables()
    wait_until(
        lambda: scheduler_log.read_text(errors="replace").count("certificate has expired") > before,
        "the scheduler logs the expired certificate",
        timeout=10,
    )
    with as_user(secure_cluster) as session:  # the rightful clients still get in
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


# -------------------------------------------------- what the client bundle cannot do


def test_the_client_bundle_cannot_mint_a_token(
    secure_cluster: LocalCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    bundle = secure_cluster.client_tls_dir
    assert not (bundle / "cluster-secret").exists()
    mint = subprocess.run(
        [sys.executable, "-m", "mangonel", "users", "token", "root", "--admin",
         "--cluster-secret-file", str(bundle / "cluster-secret")],
        capture_output=True, text=True, env=child_env(), timeout=60,
    )  # fmt: skip
    assert mint.returncode == 1 and "cannot read the cluster secret" in mint.stderr
    assert "mgt1." not in mint.stdout
    # A token signed with anything but the cluster's secret is refused, admin claims or not.
    ca = SecurityOptions.from_tls_dir(str(bundle), "client")
    for secret in (b"y" * 64, (bundle / "ca.pem").read_bytes()):
        forged = tokens.mint(secret, "root", admin=True)
        with (
            Session(secure_cluster.address, security=ca, token=forged) as session,
            pytest.raises(AuthenticationError, match="signature is not valid"),
        ):
            session.tables()
    check_query(secure_cluster, reference)


def test_the_client_bundle_cannot_pass_as_an_executor(
    secure_cluster: LocalCluster, work_dir: Path
) -> None:
    bundle = str(secure_cluster.client_tls_dir)
    # An executor process given the bundle does not start: it has no certificate to serve
    # its Flight files with, nor the secret to check tickets with.
    log = work_dir / "executor.log"
    proc = spawn_executor(secure_cluster.cluster_address, log, "--tls-dir", bundle)
    assert proc.wait(60) == 1
    said = log.read_text(errors="replace")
    assert "cannot read the TLS certificate" in said and "DIR/client is a client's" in said
    # By hand, over a channel that trusts the CA and shows nothing: the client port refuses
    # every executor call, the cluster port the TLS handshake.
    material = tls.TlsMaterial.load(SecurityOptions.from_tls_dir(bundle, "client"))
    request = pb.RegisterExecutorRequest(host="intruder", flight_address="127.0.0.1:1", slots=4)
    for address, code, says in (
        (secure_cluster.address, grpc.StatusCode.PERMISSION_DENIED, "this port serves clients"),
        (secure_cluster.cluster_address, grpc.StatusCode.UNAVAILABLE, ""),
    ):
        channel = tls.open_channel(address, material, [])
        try:
            stub = pb_grpc.ExecutorControlStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as refused:
                stub.RegisterExecutor(request, timeout=10)
        finally:
            channel.close()
        error: Any = refused.value
        assert error.code() == code, error
        assert says in error.details()
    with secure_cluster.connect() as root:
        assert {e.host for e in root.status().executors} == {"secure-host-0", "secure-host-1"}


def test_tls_without_users_lets_in_only_the_secrets_tokens(work_dir: Path) -> None:
    """Clients show no certificate, so without a users file the CA must not make anyone
    the admin: only a token signed with the cluster secret gets in."""
    directory = work_dir / "tls"
    certs.init_cluster(str(directory))
    scheduler = start_scheduler(
        SchedulerConfig(
            port=0, state="memory://", security=SecurityOptions.from_tls_dir(str(directory), "node")
        )
    )
    bundle = SecurityOptions.from_tls_dir(str(directory / "client"), "client")
    secret = (directory / "cluster" / "cluster-secret").read_bytes().strip()
    try:
        with (
            Session(scheduler.address, security=bundle) as anonymous,
            pytest.raises(AuthenticationError, match="lets only known users in"),
        ):
            anonymous.tables()
        with (
            Session(scheduler.address, security=bundle, user="root", password="whatever-1") as pw,
            pytest.raises(AuthenticationError, match="no users file"),
        ):
            pw.tables()
        forged = tokens.mint(b"z" * 64, "ops", admin=True)
        with (
            Session(scheduler.address, security=bundle, token=forged) as bad,
            pytest.raises(AuthenticationError, match="signature is not valid"),
        ):
            bad.tables()
        minted = tokens.mint(secret, "ops", admin=True)
        with Session(scheduler.address, security=bundle, token=minted) as ops:
            assert ops.tables() == []
    finally:
        scheduler.stop()


# ---------------------------------------------------------------- tickets refused


def _finished_job(cluster: LocalCluster, session_key: str) -> pb.JobStatus:
    """Run QUERY through the raw gRPC API as alice, with the client bundle alone; the
    final status with signed result locations."""
    material = tls.TlsMaterial.load(cluster.client_security)
    channel = tls.open_channel(cluster.address, material, [])
    bearer = (("authorization", f"Bearer {cluster.token('alice')}"),)
    try:
        stub = pb_grpc.QueryServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.Submit(
            pb.SubmitRequest(sql=QUERY, request_id=f"{session_key}.0001"),
            timeout=30,
            metadata=bearer,
        )
        final = None
        for status in stub.WatchJob(
            pb.WatchJobRequest(job_id=reply.job_id), timeout=120, metadata=bearer
        ):
            final = status
        assert final is not None and final.state == pb.JOB_STATE_SUCCEEDED, final
        return final
    finally:
        channel.close()


def test_result_tickets_are_signed_and_bound_to_the_session(
    secure_cluster: LocalCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    final = _finished_job(secure_cluster, "session-a")
    locations = [convert.partition_location_from_proto(m) for m in final.result]
    assert locations and all(loc.ticket.startswith("mgt1.") for loc in locations)
    loc = locations[0]
    # A client with the CA alone reads where the result is.
    client = flight.FlightClient(
        f"grpc+tls://{loc.flight_address}",
        tls_root_certs=read(secure_cluster.client_tls_dir / "ca.pem"),
    )

    def get(ticket: bytes, key: str | None) -> Any:
        headers = [(SESSION_HEADER.encode(), key.encode())] if key is not None else []
        options = flight.FlightCallOptions(timeout=10, headers=headers)
        return client.do_get(flight.Ticket(ticket), options).read_all()

    secret_file = secure_cluster.member_tls_dir / "cluster-secret"
    signer = TicketSigner(secret_file.read_bytes().strip())
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
    # The executors' link probes of each other (every 2 s) carry tickets they
    # signed with the cluster secret: none was refused.
    assert "refused a link probe" not in logs
    assert session_hash("session-a") == claims.session
    check_query(secure_cluster, reference)


def test_executor_flight_refuses_plaintext_a_foreign_ca_and_unsigned_tickets(
    secure_cluster: LocalCluster, work_dir: Path
) -> None:
    with secure_cluster.connect() as session:
        address = session.status().executors[0].flight_address
    other = other_ca_dir(work_dir)
    ca = read(secure_cluster.client_tls_dir / "ca.pem")
    unavailable = {
        "plaintext": flight.FlightClient(f"grpc://{address}"),
        "trusting another CA": flight.FlightClient(
            f"grpc+tls://{address}", tls_root_certs=read(other / "ca.pem")
        ),
    }
    for what, client in unavailable.items():
        with pytest.raises(flight.FlightUnavailableError):
            client.do_get(flight.Ticket(b"x"), flight.FlightCallOptions(timeout=5)).read_all()
        client.close()
        assert what
    # The CA alone gets through TLS (clients read results so), and then the ticket
    # decides: one the scheduler did not sign is refused.
    with (
        flight.FlightClient(f"grpc+tls://{address}", tls_root_certs=ca) as client,
        pytest.raises(flight.FlightUnauthenticatedError, match="not signed"),
    ):
        client.do_get(flight.Ticket(b"/etc/passwd"), flight.FlightCallOptions(timeout=5)).read_all()


# ------------------------------------------------------------ nothing of the hosts

HOST_QUESTIONS = [
    "SELECT current_setting('memory_limit') AS m FROM nation",
    "SELECT current_setting('temp_directory') AS spill",  # an executor's path, with its pid
    "SELECT version() AS v",
]


def test_no_user_learns_a_host_setting(secure_cluster: LocalCluster) -> None:
    """Settings, paths, versions, pids: refused to every user (the admin too) at the
    gRPC and web front doors (Flight SQL: ``tests/flightsql``), and a user's status
    and executor list name no host and no pid."""
    for user in ("alice", "root"):
        with as_user(secure_cluster, user) as session:
            for sql in HOST_QUESTIONS:
                with pytest.raises(ForbiddenStatementError, match="answers about the cluster"):
                    session.sql(sql)
                with pytest.raises(ForbiddenStatementError, match="answers about the cluster"):
                    session.explain(sql)
    context = ssl.create_default_context(cafile=str(secure_cluster.client_tls_dir / "ca.pem"))
    with as_user(secure_cluster) as alice:
        alice.log_in()
        bearer = {"Authorization": f"Bearer {alice.token}", "Content-Type": "application/json"}
        for sql in HOST_QUESTIONS:
            body = json.dumps({"sql": sql}).encode()
            request = urllib.request.Request(
                f"{secure_cluster.web_url}/api/explain", data=body, headers=bearer, method="POST"
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, context=context, timeout=10)
            assert "answers about the cluster" in refused.value.read().decode()
        seen = alice.status().executors
        assert seen and all(e.pid == 0 and e.host == "" and e.flight_address for e in seen)
        request = urllib.request.Request(f"{secure_cluster.web_url}/api/executors", headers=bearer)
        with urllib.request.urlopen(request, context=context, timeout=10) as reply:
            listed = json.loads(reply.read())
        assert listed and all(e["pid"] == 0 and e["host"] == "" for e in listed)
    with secure_cluster.connect() as root:  # the admins run the hosts: they see them
        pids = {e.pid for e in root.status().executors}
    assert pids == {e.pid for e in secure_cluster.executors}


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
            open_store(url.replace(str(tls_dir / "cluster" / "ca.pem"), str(other / "ca.pem")))


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
