"""Users, tokens and job ownership on a real scheduler and real executors.

One cluster for the module, started with a users file and a cluster secret
(``LocalCluster(users=...)``): ``alice`` and ``bob`` are users, ``root`` the
admin. Every refusal is checked three ways: the client gets the right error
with a message that says what to do, the scheduler's log says who was turned
away and why, and the cluster goes on answering the legitimate clients (each
test ends with a good query whose answer is compared with DuckDB's).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import assert_same_result, explain_stage_count, wait_until

import mangonel
from mangonel.client.cluster import child_env
from mangonel.errors import AuthenticationError, JobCancelledError, PermissionDeniedError
from mangonel.security import tokens
from mangonel.security.users import add_user

pytestmark = pytest.mark.timeout(180)

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


@pytest.fixture(scope="module")
def cluster(module_dir: Path, tpch_tables: dict[str, Path]) -> Iterator[Any]:
    with mangonel.LocalCluster(
        executors=2,
        work_dir=str(module_dir / "cluster"),
        partitions=4,
        broadcast_bytes=0,
        users=USERS,
        web_port=0,
    ) as running:
        with running.connect() as root:  # the first admin
            for name, path in tpch_tables.items():
                root.register_parquet(name, str(path))
        yield running


def session(cluster: Any, user: str) -> Any:
    return cluster.connect(user=user, password=PASSWORDS[user])


def scheduler_log(cluster: Any) -> str:
    return Path(cluster.scheduler.log_path).read_text()


def assert_logged(cluster: Any, pattern: str) -> None:
    """The scheduler's log says ``pattern`` (it is written as the refusal happens)."""
    wait_until(lambda: pattern in scheduler_log(cluster), f"the scheduler logs {pattern!r}", 10)


def assert_still_serving(cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    """A legitimate user still gets right answers, distributed."""
    with session(cluster, "alice") as alice:
        assert explain_stage_count(alice.explain(QUERY)) >= 3
        result = alice.sql(QUERY)
    assert_same_result(
        result.to_arrow(), duckdb_ref.sql(QUERY).to_arrow_table(), ordered=True, order_by=["n_name"]
    )


# ------------------------------------------------------------------ logging in


def test_right_password_runs_a_distributed_query(
    cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    with session(cluster, "alice") as alice:
        result = alice.sql(QUERY)
        assert alice.user == "alice" and not alice.admin
        own = {j.job_id: j for j in alice.status().jobs}
    assert_same_result(
        result.to_arrow(), duckdb_ref.sql(QUERY).to_arrow_table(), ordered=True, order_by=["n_name"]
    )
    assert len(result.stages) >= 3 and sum(s.tasks_total for s in result.stages) > 3
    assert own[result.job_id].owner == "alice"
    assert_logged(cluster, "user 'alice' logged in")


@pytest.mark.parametrize(
    ("user", "password", "why"),
    [("alice", "not-her-password", "wrong password"), ("mallory", "whatever1", "no such user")],
)
def test_wrong_password_or_unknown_user_is_refused(
    cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection, user: str, password: str, why: str
) -> None:
    refused = pytest.raises(AuthenticationError, match="wrong user name or password")
    with cluster.connect(user=user, password=password) as bad, refused as info:
        bad.sql(GOOD)
    assert user in str(info.value)
    assert_logged(cluster, f"login refused for user {user!r}: {why}")
    assert_logged(cluster, "refused Authenticate from")
    assert_still_serving(cluster, duckdb_ref)


def test_no_credentials_are_refused(cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    with mangonel.connect(cluster.address) as anonymous:
        with pytest.raises(AuthenticationError, match="only known users.*--user"):
            anonymous.sql(GOOD)
        with pytest.raises(AuthenticationError):
            anonymous.status()
    assert_logged(cluster, "refused Submit from")
    assert_still_serving(cluster, duckdb_ref)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("forged", "signature is not valid"),
        ("expired", "expired at .* log in again"),
        ("malformed", "malformed"),
        ("altered", "signature is not valid"),
    ],
)
def test_bad_tokens_are_refused(
    cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection, kind: str, message: str
) -> None:
    secret = Path(cluster.cluster_secret_file).read_bytes().strip()
    if kind == "forged":  # the right claims, signed with a secret of the attacker's
        token = tokens.mint(b"y" * 64, "root", admin=True)
    elif kind == "expired":  # issued two hours ago for one hour, by the real secret
        token = tokens.mint(secret, "alice", admin=False, ttl_s=3600, now=time.time() - 7200)
    elif kind == "malformed":
        token = "not-a-token"
    else:  # alice's real token, her claims changed to admin's
        real = tokens.mint(secret, "alice", admin=False)
        head, claims, signature = real.split(".")
        forged = tokens._b64(json.dumps({**json.loads(tokens._unb64(claims)), "a": True}).encode())
        token = f"{head}.{forged}.{signature}"
    with cluster.connect(token=token) as bad, pytest.raises(AuthenticationError, match=message):
        bad.sql(GOOD)
    assert_logged(cluster, "refused Submit from")
    assert_still_serving(cluster, duckdb_ref)


def test_a_minted_token_gets_in_with_the_files_role(cluster: Any) -> None:
    # A token that claims admin for alice: the users file says she is not.
    token = cluster.token("alice", admin=True)
    with cluster.connect(token=token) as alice:
        assert alice.sql(GOOD).to_arrow().column("n").to_pylist() == [25]
        with pytest.raises(PermissionDeniedError, match="only an admin may register"):
            alice.register_parquet("nation2", "/nonexistent.parquet")
        with pytest.raises(PermissionDeniedError, match="only an admin may drop"):
            alice.drop_table("nation")
        assert "nation" in {t.name for t in alice.tables()}  # any user reads the catalog
    assert_logged(cluster, "refused DropTable from")


# --------------------------------------------------------------- job ownership


def test_users_see_and_cancel_only_their_own_jobs(
    cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    with session(cluster, "alice") as alice, session(cluster, "bob") as bob:
        bobs = bob.submit(QUERY)
        with pytest.raises(PermissionDeniedError, match=f"job {bobs} belongs to another user"):
            alice.cancel(bobs)
        with pytest.raises(PermissionDeniedError):
            alice.wait(bobs)
        assert bobs not in {j.job_id for j in alice.status().jobs}
        assert bobs in {j.job_id for j in bob.status().jobs}
        # Alice's refused cancel left it alone: bob gets his full answer.
        result = bob.wait(bobs)
    assert_same_result(
        result.to_arrow(), duckdb_ref.sql(QUERY).to_arrow_table(), ordered=True, order_by=["n_name"]
    )
    assert_logged(cluster, "refused CancelJob from")
    assert_logged(cluster, "refused WatchJob from")


def test_the_admin_sees_and_cancels_every_job(cluster: Any) -> None:
    with session(cluster, "bob") as bob, session(cluster, "root") as root:
        job = bob.submit(QUERY)
        listed = {j.job_id: j for j in root.status().jobs}
        assert listed[job].owner == "bob"
        cancelled = root.cancel(job)
        if cancelled:
            with pytest.raises(JobCancelledError, match="cancelled by root"):
                bob.wait(job)
        else:  # it had finished already: bob still reads it
            assert bob.wait(job).num_rows == 25


# ------------------------------------------------------------- REST API, CLI


def http(
    url: str, token: str | None = None, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_rest_api_wants_a_token(cluster: Any) -> None:
    web = cluster.web_url
    for path in ("/api/jobs", "/api/cluster", "/api/executors", "/metrics"):
        status, headers, body = http(web + path)
        assert status == 401, path
        assert headers.get("www-authenticate", headers.get("WWW-Authenticate")) == "Bearer"
    assert "log in" in json.loads(body)["detail"]
    assert_logged(cluster, "refused GET /metrics from 127.0.0.1")

    forged = tokens.mint(b"z" * 40, "root", admin=True)
    status, _, body = http(web + "/api/jobs", token=forged)
    assert status == 401 and "signature is not valid" in json.loads(body)["detail"]
    status, _, body = http(web + "/api/jobs", token="mgt1.x.y")
    assert status == 401 and "malformed" in json.loads(body)["detail"]

    status, _, body = http(web + "/api/login", body={"user": "alice", "password": "nope"})
    assert status == 401 and "wrong user name or password" in json.loads(body)["detail"]

    status, headers, body = http(
        web + "/api/login", body={"user": "alice", "password": PASSWORDS["alice"]}
    )
    assert status == 200
    cookie = headers.get("set-cookie", headers.get("Set-Cookie", ""))
    assert "mangonel_token=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    alice_token = json.loads(body)["token"]

    with session(cluster, "bob") as bob:
        bobs = bob.sql(GOOD).job_id
    status, _, body = http(web + "/api/jobs", token=alice_token)
    assert status == 200
    owners = {j["owner"] for j in json.loads(body)}
    assert owners <= {"alice"}
    status, _, _ = http(f"{web}/api/jobs/{bobs}", token=alice_token)
    assert status == 403
    status, _, _ = http(f"{web}/api/jobs/{bobs}/cancel", token=alice_token, body={})
    assert status == 403
    status, _, body = http(web + "/metrics", token=alice_token)
    assert status == 200 and b"mangonel_" in body
    root_token = cluster.token("root", admin=True)
    status, _, body = http(web + "/api/jobs", token=root_token)
    assert bobs in {j["id"] for j in json.loads(body)}
    status, _, body = http(web + "/api/session", token=alice_token)
    assert json.loads(body) == {
        "authenticated": True,
        "user": "alice",
        "admin": False,
        "login_required": True,
        "tls": False,
        "problem": "",
    }


def test_cli_logs_in_with_the_password_from_the_environment(cluster: Any) -> None:
    def mangonel_cli(*args: str, password: str) -> subprocess.CompletedProcess[str]:
        env = child_env()
        env["MANGONEL_PASSWORD"] = password
        return subprocess.run(
            [sys.executable, "-m", "mangonel", "--scheduler", cluster.address, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    ok = mangonel_cli("--user", "alice", "sql", GOOD, password=PASSWORDS["alice"])
    assert ok.returncode == 0, ok.stderr
    assert "25" in ok.stdout
    bad = mangonel_cli("--user", "alice", "sql", GOOD, password="wrong-one")
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: login refused: wrong user name or password")
    assert "Traceback" not in bad.stderr


def test_owners_and_tokens_survive_a_scheduler_restart(cluster: Any) -> None:
    # Last in the module: the scheduler comes back on a new web port.
    with session(cluster, "bob") as bob:
        job = bob.sql(GOOD).job_id
    bob_token = cluster.token("bob")
    cluster.kill_scheduler()
    cluster.restart_scheduler()
    # The owner came back from the state store; the token (the secret is a file) still
    # gets bob in without a password.
    bob = cluster.connect(token=bob_token)
    with bob, session(cluster, "alice") as alice, session(cluster, "root") as root:
        assert job in {j.job_id for j in bob.status().jobs}
        assert job in {j.job_id for j in root.status().jobs}
        assert job not in {j.job_id for j in alice.status().jobs}
        with pytest.raises(PermissionDeniedError):
            alice.cancel(job)
        assert bob.cancel(job) is False  # it had finished


# --------------------------------------------------------------------- writing


def test_only_admins_and_writers_write(cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    create = "CREATE TABLE nations_by_writer AS SELECT n_nationkey, n_name FROM nation"
    with session(cluster, "alice") as alice, pytest.raises(PermissionDeniedError, match="writer"):
        alice.sql(create)
    add_user(str(cluster.users_file), "wendy", "wendy-secret", writer=True)
    with cluster.connect(user="wendy", password="wendy-secret") as wendy:
        counted = wendy.sql(create).to_arrow()
        assert counted["Count"].to_pylist() == [25]
        actual = wendy.sql("SELECT * FROM nations_by_writer").to_arrow()
        expected = duckdb_ref.sql("SELECT n_nationkey, n_name FROM nation").to_arrow_table()
        assert_same_result(actual, expected, ordered=False)
    with session(cluster, "alice") as alice, pytest.raises(PermissionDeniedError):
        alice.sql("DROP TABLE nations_by_writer")
    with session(cluster, "root") as root:
        root.sql("DROP TABLE nations_by_writer")
