"""Failed logins limited, tokens revoked and the users file reloaded, on a running
secured cluster (TLS, a users file, the cluster secret: ``LocalCluster(secure=True,
users=...)``), at each of its front doors: the gRPC client port, Flight SQL and
the web API. Nothing is restarted: every change reaches the running scheduler.

The last test rotates the scheduler's certificate under a running query (SIGHUP).

The tests share one cluster and run in order: ``alice`` is locked by the first
for the rest of the module, and the failed logins of each test count against
127.0.0.1, so the address test comes from 127.0.0.2 (all of 127/8 is loopback).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2
from helpers import assert_same_result, explain_stage_count, wait_until

from mangonel.client.cluster import child_env
from mangonel.client.status import JobState
from mangonel.errors import AuthenticationError, LoginThrottledError
from mangonel.proto import flightsql_pb2 as sql_pb
from mangonel.security import tokens
from mangonel.security.certs import issue, read_ca, write_pair
from mangonel.testing.cluster import TestCluster

pytestmark = pytest.mark.timeout(240)

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret!", "root": "root-secret"}
USERS = {"alice": (PASSWORDS["alice"], False), "bob": (PASSWORDS["bob"], False),
         "root": (PASSWORDS["root"], True)}  # fmt: skip

# Three stages (two scans, a hash join, an aggregate): it runs distributed.
QUERY = """
SELECT n.n_name, count(*) AS suppliers, sum(s.s_acctbal) AS balance
FROM supplier s JOIN nation n ON s.s_nationkey = n.n_nationkey
GROUP BY n.n_name ORDER BY n.n_name
"""
GOOD = "SELECT count(*) AS n FROM nation"
THROTTLED = "too many failed logins for user 'alice'; try again in"


@pytest.fixture(scope="module")
def cluster(module_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[Any]:
    with TestCluster(  # executors that take fault rules: a delay keeps a query running
        executors=2,
        work_dir=str(module_dir / "cluster"),
        partitions=4,
        broadcast_bytes=0,
        secure=True,
        users=USERS,
        web_port=0,
        scheduler_args=["--login-failures", "4"],  # the address limit stays 20, the default
    ) as running:
        with running.connect() as root:
            for name, path in tpch_tables.items():
                root.register_parquet(name, str(path))
        yield running


# ------------------------------------------------------------------ the doors


def ca_file(cluster: Any) -> Path:
    return Path(cluster.client_tls_dir) / "ca.pem"


def flight_client(cluster: Any) -> flight.FlightClient:
    return flight.connect(cluster.flight_sql_url, tls_root_certs=ca_file(cluster).read_bytes())


def flight_login(cluster: Any, user: str, password: str) -> str:
    """Flight SQL's login (Basic in the handshake): the bearer token it answers."""
    with flight_client(cluster) as client:
        _, value = client.authenticate_basic_token(user, password)
    text = value.decode() if isinstance(value, bytes) else value
    assert text.startswith("Bearer ")
    return text[len("Bearer ") :]


def flight_query(cluster: Any, token: str) -> pa.Schema:
    """A statement's FlightInfo, asked with a bearer token: the schema of its result."""
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
    packed = any_pb2.Any()
    packed.Pack(sql_pb.CommandStatementQuery(query=GOOD), type_url_prefix="type.googleapis.com/")
    descriptor = flight.FlightDescriptor.for_command(packed.SerializeToString())
    with flight_client(cluster) as client:
        return client.get_flight_info(descriptor, options).schema


def web(
    cluster: Any,
    path: str,
    body: dict[str, Any] | None = None,
    token: str | None = None,
    source: str = "127.0.0.1",
) -> tuple[int, dict[str, Any]]:
    """One HTTPS request to the web API, from ``source`` (a loopback address)."""
    url = cluster.web_url.removeprefix("https://")
    host, port = url.split("/")[0].rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca_file(cluster)))
    conn = http.client.HTTPSConnection(
        host, int(port), context=context, timeout=30, source_address=(source, 0)
    )
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(
            "POST" if body is not None else "GET",
            path,
            body=json.dumps(body) if body is not None else None,
            headers=headers,
        )
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")
    finally:
        conn.close()


def grpc_login(cluster: Any, user: str, password: str) -> None:
    with cluster.connect(user=user, password=password) as session:
        session.log_in()


def scheduler_log(cluster: Any) -> str:
    return (Path(cluster.log_dir) / "scheduler.log").read_text()


def assert_logged(cluster: Any, text: str) -> None:
    wait_until(lambda: text in scheduler_log(cluster), f"the scheduler logs {text!r}", 10)


def mangonel_users(cluster: Any, *args: str, stdin: str = "") -> str:
    """``mangonel users ARGS --users-file`` the cluster's, as an admin runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "mangonel", "users", *args, "--users-file", str(cluster.users_file)],
        env=child_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_serves(
    cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection, user: str, password: str
) -> None:
    """``user`` logs in and gets a right answer, distributed."""
    with cluster.connect(user=user, password=password) as session:
        assert explain_stage_count(session.explain(QUERY)) >= 3
        result = session.sql(QUERY)
        assert_same_result(result.to_arrow(), duckdb_ref.sql(QUERY).to_arrow_table(), ordered=True)


# ------------------------------------------------------------------ the tests


def test_failed_logins_lock_a_user_at_every_door(
    cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Four failures (--login-failures 4), spread over the three doors: one count.
    for _ in range(2):
        with pytest.raises(AuthenticationError, match="wrong user name or password"):
            grpc_login(cluster, "alice", "not-her-password")
    with pytest.raises(flight.FlightUnauthenticatedError, match="wrong user name"):
        flight_login(cluster, "alice", "not-her-password")
    status, body = web(cluster, "/api/login", {"user": "alice", "password": "nope-nope"})
    assert status == 401 and "wrong user name or password" in body["detail"]

    # Now even her right password is refused, at each door, saying when to retry.
    with pytest.raises(LoginThrottledError, match=THROTTLED):
        grpc_login(cluster, "alice", PASSWORDS["alice"])
    # RESOURCE_EXHAUSTED, its message alone (pyarrow's client names no class for it).
    with pytest.raises(pa.ArrowException, match=f"resource exhausted .*: {THROTTLED}") as fsql:
        flight_login(cluster, "alice", PASSWORDS["alice"])
    assert "Traceback" not in str(fsql.value)
    status, body = web(cluster, "/api/login", {"user": "alice", "password": PASSWORDS["alice"]})
    assert status == 429 and body["detail"].startswith(THROTTLED)
    assert_logged(cluster, "login refused for user 'alice' from 127.0.0.1: too many failed")
    # Other users of the same address are not locked, and get right answers.
    assert flight_query(cluster, flight_login(cluster, "bob", PASSWORDS["bob"])).names == ["n"]
    assert_serves(cluster, duckdb_ref, "bob", PASSWORDS["bob"])


def test_failed_logins_lock_an_address(cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    # A guesser at 127.0.0.2 going through user names: 20 (the default) lock it.
    for i in range(20):
        status, body = web(
            cluster, "/api/login", {"user": f"guess{i}", "password": "x" * 8}, source="127.0.0.2"
        )
        assert status == 401, body
    status, body = web(
        cluster, "/api/login", {"user": "root", "password": PASSWORDS["root"]}, source="127.0.0.2"
    )
    assert status == 429
    assert body["detail"].startswith("too many failed logins from your address 127.0.0.2")
    # The same user from another address gets in.
    status, body = web(cluster, "/api/login", {"user": "root", "password": PASSWORDS["root"]})
    assert status == 200 and body["user"] == "root"
    assert_serves(cluster, duckdb_ref, "root", PASSWORDS["root"])


def test_a_revoked_token_is_refused_at_once_and_others_keep_working(
    cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    minted = cluster.token("bob")  # as `mangonel users token` makes one
    logged_in = flight_login(cluster, "bob", PASSWORDS["bob"])
    roots = cluster.token("root", admin=True)
    with cluster.connect(token=minted) as session:
        assert session.sql(GOOD).to_arrow().to_pylist() == [{"n": 25}]
    status, _ = web(cluster, "/api/jobs", token=minted)
    assert status == 200

    out = mangonel_users(cluster, "revoke", "--token", minted)
    claims = tokens.unverified_claims(minted)
    assert claims is not None and f"revoked token {claims.token_id} of bob" in out
    # Refused at once, at every door, and saying so; bob's other token still works.
    revoked = f"the token {claims.token_id} was revoked"
    with (
        cluster.connect(token=minted) as session,
        pytest.raises(AuthenticationError, match=revoked),
    ):
        session.sql(GOOD)
    with pytest.raises(flight.FlightUnauthenticatedError, match=revoked):
        flight_query(cluster, minted)
    status, body = web(cluster, "/api/jobs", token=minted)
    assert status == 401 and revoked in body["detail"]
    flight_query(cluster, logged_in)

    # Every token bob holds now: refused; a new login works, and root's token throughout.
    mangonel_users(cluster, "revoke", "bob")
    with pytest.raises(flight.FlightUnauthenticatedError, match="tokens of user 'bob' issued"):
        flight_query(cluster, logged_in)
    flight_query(cluster, flight_login(cluster, "bob", PASSWORDS["bob"]))
    with cluster.connect(token=roots) as root:
        assert explain_stage_count(root.explain(QUERY)) >= 3
        expected = duckdb_ref.sql(QUERY).to_arrow_table()
        assert_same_result(root.sql(QUERY).to_arrow(), expected, ordered=True)
    assert_serves(cluster, duckdb_ref, "bob", PASSWORDS["bob"])


def test_the_users_file_is_reloaded_without_a_restart(
    cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    mangonel_users(cluster, "add", "dave", "--password-stdin", stdin="dave-first-pw\n")
    assert_serves(cluster, duckdb_ref, "dave", "dave-first-pw")
    mangonel_users(cluster, "add", "dave", "--password-stdin", stdin="dave-second-pw\n")
    with pytest.raises(AuthenticationError, match="wrong user name or password"):
        grpc_login(cluster, "dave", "dave-first-pw")
    flight_login(cluster, "dave", "dave-second-pw")

    # A broken file: logged, and the users read last stay.
    users_file = Path(cluster.users_file)
    good = users_file.read_text()
    users_file.write_text(good + "eve:superuser:nothing\n")
    grpc_login(cluster, "dave", "dave-second-pw")
    assert_logged(cluster, "the users file changed and cannot be used")
    with pytest.raises(AuthenticationError, match="wrong user name or password"):
        grpc_login(cluster, "eve", "whatever-pw")
    users_file.write_text(good)

    mangonel_users(cluster, "remove", "dave")
    with pytest.raises(AuthenticationError, match="wrong user name or password"):
        grpc_login(cluster, "dave", "dave-second-pw")

    # SIGHUP reads the file again whatever it looks like, and the scheduler serves on.
    before = scheduler_log(cluster).count("read the users file")
    os.kill(cluster.scheduler.pid, signal.SIGHUP)
    wait_until(
        lambda: scheduler_log(cluster).count("read the users file") > before,
        "the scheduler reads the users file on SIGHUP",
        10,
    )
    assert cluster.scheduler.alive
    assert_serves(cluster, duckdb_ref, "root", PASSWORDS["root"])


def served_certificate(cluster: Any, address: str, member: bool = False) -> bytes:
    """The certificate (DER) a new TLS connection to ``address`` is shown; ``member``:
    present the node certificate, as the cluster port demands."""
    host, port = address.removeprefix("https://").removeprefix("grpc+tls://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca_file(cluster)))
    context.set_alpn_protocols(["h2", "http/1.1"])
    if member:
        node = Path(cluster.member_tls_dir)
        context.load_cert_chain(node / "node.pem", node / "node-key.pem")
    with (
        socket.create_connection((host, int(port)), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_the_certificate_is_rotated_under_a_running_query(
    cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    node = Path(cluster.member_tls_dir)
    addresses = {
        "client port": cluster.address,
        "Flight SQL": cluster.flight_sql_url,
        "web UI": cluster.web_url,
    }
    cluster_port = cluster.cluster_address  # one scheduler: one port
    old = {door: served_certificate(cluster, a) for door, a in addresses.items()}
    old_member = served_certificate(cluster, cluster_port, member=True)
    assert len(set(old.values())) == 1 and old_member in old.values()

    # Each scan task waits 2 s at its start: the query is still running when the
    # certificate changes, and reads its results after.
    cluster.set_faults_all([{"action": "delay", "seconds": 2.0, "stage": 1}])
    with cluster.connect(user="root", password=PASSWORDS["root"]) as root:
        job = root.submit(QUERY)
        wait_until(
            lambda: any(
                s.tasks_running for j in root.status().jobs if j.job_id == job for s in j.stages
            ),  # fmt: skip
            "the query runs tasks",
        )
        # A new node certificate, from the same CA, replaces the files; SIGHUP.
        new = issue(read_ca(str(cluster.tls_dir)), "node")
        write_pair(str(node), "node", new)
        before = scheduler_log(cluster).count("reloaded the TLS certificate")
        os.kill(cluster.scheduler.pid, signal.SIGHUP)
        wait_until(
            lambda: scheduler_log(cluster).count("reloaded the TLS certificate") > before,
            "the scheduler reloads its certificate",
        )
        assert [j.state for j in root.status().jobs if j.job_id == job] == [JobState.RUNNING]
        cluster.set_faults_all([])
        result = root.wait(job)
    assert_same_result(result.to_arrow(), duckdb_ref.sql(QUERY).to_arrow_table(), ordered=True)
    assert len(result.stages) >= 3  # distributed: scans, join, aggregate

    # New connections, at every door of the scheduler, are shown the new certificate.
    fresh = ssl.PEM_cert_to_DER_cert(new.cert.decode())
    for door, address in addresses.items():
        assert served_certificate(cluster, address) == fresh, door
    assert served_certificate(cluster, cluster_port, member=True) == fresh
    # ... and clients that trust the CA carry on: a new login, a new query, each door.
    assert_serves(cluster, duckdb_ref, "bob", PASSWORDS["bob"])
    assert flight_query(cluster, flight_login(cluster, "bob", PASSWORDS["bob"])).names == ["n"]
    status, body = web(cluster, "/api/login", {"user": "bob", "password": PASSWORDS["bob"]})
    assert status == 200 and body["user"] == "bob"

    # A broken pair (another key) is refused: the certificate in use stays.
    (node / "node-key.pem").write_bytes(issue(read_ca(str(cluster.tls_dir)), "node").key)
    os.kill(cluster.scheduler.pid, signal.SIGHUP)
    assert_logged(cluster, "the TLS files cannot be used, so the certificate in use stays")
    assert served_certificate(cluster, cluster.address) == fresh
    write_pair(str(node), "node", new)  # as it was: the cluster stops cleanly
