"""A session's login: once, the token on every call, again before it expires and
when the scheduler refuses it; a token-only session gets ``AuthenticationError``.

The real ``QueryService`` servicer and ``UsersAuthenticator`` in an in-process
gRPC server on loopback, over a fake core with no executors and no jobs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from mangonel.client import session as session_module
from mangonel.client.session import Session
from mangonel.errors import AuthenticationError
from mangonel.proto import mangonel_pb2_grpc as pb_grpc
from mangonel.scheduler.service import QueryServiceServicer
from mangonel.security import OPEN, UsersAuthenticator, tokens
from mangonel.security.users import add_user


class FakeCore:
    def now(self) -> float:
        return time.time()

    def executors(self) -> list[Any]:
        return []

    def jobs(self) -> list[Any]:
        return []


class CountingAuthenticator(UsersAuthenticator):
    logins = 0

    def login(self, user: str, password: str, address: str = "") -> str:
        self.logins += 1
        return super().login(user, password, address)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[QueryServiceServicer, str, Path]]:
    users = tmp_path / "users"
    add_user(str(users), "alice", "alice-secret")
    servicer = QueryServiceServicer(
        FakeCore(),  # type: ignore[arg-type]
        "test",
        authenticator=CountingAuthenticator(str(users), b"a" * 32, token_ttl_s=60.0),
    )
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_QueryServiceServicer_to_server(servicer, grpc_server)  # type: ignore[no-untyped-call]
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    yield servicer, f"127.0.0.1:{port}", users
    grpc_server.stop(0)


def logins(servicer: QueryServiceServicer) -> int:
    assert isinstance(servicer.auth, CountingAuthenticator)
    return servicer.auth.logins


class ShiftedClock:
    """The ``time`` module as the session sees it, its monotonic clock ``ahead_s`` on."""

    def __init__(self, ahead_s: float) -> None:
        self.ahead_s = ahead_s

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead_s

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_session_logs_in_once_and_again_before_expiry(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    servicer, address, _ = server
    with Session(address, user="alice", password="alice-secret") as session:
        session.status()
        session.status()
        assert logins(servicer) == 1
        assert session.user == "alice" and not session.admin
        # 55 s of the token's 60 s lifetime pass for the session (the server's
        # clock does not move): over 90 % is over, so it logs in before the call.
        monkeypatch.setattr(session_module, "time", ShiftedClock(55.0))
        session.status()
        assert logins(servicer) == 2


def test_a_refused_token_makes_a_session_log_in_again(server: Any) -> None:
    servicer, address, users = server
    with Session(address, user="alice", password="alice-secret") as session:
        session.status()
        # The scheduler restarted with another secret: the session's token is void.
        servicer.auth = CountingAuthenticator(str(users), b"b" * 32)
        session.status()
        assert logins(servicer) == 1  # the new authenticator's first


def test_a_token_only_session_is_refused_once_it_expires(server: Any) -> None:
    servicer, address, _ = server
    token = tokens.mint(b"a" * 32, "alice", admin=False, ttl_s=3)
    with Session(address, token=token) as session:
        session.status()
        time.sleep(3.1)
        with pytest.raises(AuthenticationError, match="expired"):
            session.status()


def test_a_wrong_password_is_refused_at_the_first_call(server: Any) -> None:
    _, address, _ = server
    refused = pytest.raises(AuthenticationError, match="wrong user name or password")
    with Session(address, user="alice", password="wrong-one") as session, refused:
        session.status()


def test_credentials_must_be_whole() -> None:
    with pytest.raises(ValueError, match="needs a user name"):
        Session("127.0.0.1:1", password="x")
    with pytest.raises(ValueError, match="needs a password"):
        Session("127.0.0.1:1", user="alice")


def test_a_login_to_an_unsecured_scheduler_happens_once(server: Any) -> None:
    servicer, address, _ = server
    servicer.auth = OPEN
    with Session(address, user="alice", password="alice-secret") as session:
        session.status()
        session.status()
        assert session.user == "anonymous" and session.admin
        assert session.token is None
        assert session._login.logged_in and not session._login.due()
