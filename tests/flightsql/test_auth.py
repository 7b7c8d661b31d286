"""Authentication through the Flight SQL handshake, with a test ``Authenticator``.

The server runs in this process on a ``SchedulerCore`` without executors: logging
in, metadata and prepared statements need no executor. The users authenticator of
the security work plugs in through the same protocol.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from fsql_support import adbc_connect, pack
from google.protobuf import any_pb2

from mangonel.errors import AuthenticationError
from mangonel.proto import flightsql_pb2 as sql_pb
from mangonel.scheduler.core import SchedulerCore
from mangonel.scheduler.events import Limits
from mangonel.scheduler.flightsql import FlightSqlServer
from mangonel.scheduler.state import SchedulerState
from mangonel.security.auth import Principal


class PasswordsForTests:
    """An ``Authenticator``: two users with passwords, random tokens."""

    required = True

    def __init__(self) -> None:
        self.passwords = {"alice": "wonderland", "bob": "builder"}
        self.tokens: dict[str, str] = {}

    def login(self, user: str, password: str, address: str = "") -> str:
        if self.passwords.get(user) != password:
            raise AuthenticationError(f"wrong user name or password for {user!r}")
        token = secrets.token_urlsafe(16)
        self.tokens[token] = user
        return token

    def verify(self, token: str) -> Principal:
        user = self.tokens.get(token)
        if user is None:
            raise AuthenticationError("unknown or expired token: log in again")
        return Principal(user, admin=user == "alice")


@pytest.fixture(scope="module")
def secured(tpch_tables: dict[str, Path]) -> Iterator[FlightSqlServer]:
    core = SchedulerCore(SchedulerState(Limits()))
    for name in ("nation", "region"):
        core.register_table(name, str(tpch_tables[name]))
    server = FlightSqlServer(core, authenticator=PasswordsForTests())
    yield server
    server.shutdown()


def test_adbc_logs_in_with_user_and_password(secured: FlightSqlServer) -> None:
    with adbc_connect(secured.url, username="alice", password="wonderland") as conn:
        objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        tables = objects[0]["catalog_db_schemas"][0]["db_schema_tables"]
        assert sorted(t["table_name"] for t in tables) == ["nation", "region"]
        assert conn.adbc_get_table_schema("region").names == ["r_regionkey", "r_name", "r_comment"]


def test_wrong_password_and_no_credentials_are_refused(secured: FlightSqlServer) -> None:
    with pytest.raises(adbc_driver_manager.Error, match="wrong user name or password"):
        adbc_connect(secured.url, username="alice", password="nope").adbc_get_table_types()
    with flight.connect(secured.url) as client:
        with pytest.raises(flight.FlightUnauthenticatedError, match="needs a user"):
            list(client.do_action(flight.Action("CloseSession", b"")))
        forged = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer forged")])
        with pytest.raises(flight.FlightUnauthenticatedError, match="log in again"):
            list(client.do_action(flight.Action("CloseSession", b""), forged))


def _login(client: flight.FlightClient, user: str, password: str) -> flight.FlightCallOptions:
    header = client.authenticate_basic_token(user, password)
    assert header[1].startswith(b"Bearer ")
    return flight.FlightCallOptions(headers=[header])


def test_prepared_statement_of_another_session_is_refused(secured: FlightSqlServer) -> None:
    with flight.connect(secured.url) as client:
        alice = _login(client, "alice", "wonderland")
        bob = _login(client, "bob", "builder")
        request = sql_pb.ActionCreatePreparedStatementRequest(
            query="SELECT n_name FROM nation WHERE n_nationkey = ?"
        )
        [answer] = client.do_action(flight.Action("CreatePreparedStatement", pack(request)), alice)
        created = sql_pb.ActionCreatePreparedStatementResult()
        assert any_pb2.Any.FromString(answer.body.to_pybytes()).Unpack(created)
        params = pa.ipc.read_schema(pa.py_buffer(created.parameter_schema))
        assert len(params) == 1
        handle = created.prepared_statement_handle
        close = sql_pb.ActionClosePreparedStatementRequest(prepared_statement_handle=handle)
        action = flight.Action("ClosePreparedStatement", pack(close))
        with pytest.raises(flight.FlightUnauthorizedError, match="another session"):
            list(client.do_action(action, bob))
        # Its own session closes it; then it is gone for everyone.
        assert list(client.do_action(action, alice)) == []
        with pytest.raises(pa.ArrowKeyError, match="unknown prepared statement"):
            list(client.do_action(action, alice))


def test_metadata_needs_a_valid_token(secured: FlightSqlServer) -> None:
    descriptor = flight.FlightDescriptor.for_command(pack(sql_pb.CommandGetTableTypes()))
    with flight.connect(secured.url) as client:
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.get_flight_info(descriptor)
        options = _login(client, "bob", "builder")
        info = client.get_flight_info(descriptor, options)
        table = client.do_get(info.endpoints[0].ticket, options).read_all()
    assert table.to_pylist() == [{"table_type": "TABLE"}]


def test_anyone_may_log_in_to_an_open_server(tpch_tables: dict[str, Any]) -> None:
    core = SchedulerCore(SchedulerState(Limits()))
    server = FlightSqlServer(core)
    try:
        with adbc_connect(server.url, username="whoever", password="x") as conn:
            assert conn.adbc_get_table_types() == ["TABLE"]
        with adbc_connect(server.url) as conn:
            assert conn.adbc_get_info()["vendor_name"] == "mangonel"
    finally:
        server.shutdown()


def test_only_an_admin_registers_a_table_with_create_external_table(
    secured: FlightSqlServer, tpch_tables: dict[str, Path]
) -> None:
    ddl = f"CREATE EXTERNAL TABLE orders_ext STORED AS PARQUET LOCATION '{tpch_tables['orders']}'"
    descriptor = flight.FlightDescriptor.for_command(pack(sql_pb.CommandStatementUpdate(query=ddl)))
    with flight.connect(secured.url) as client:
        bob = _login(client, "bob", "builder")
        writer, _ = client.do_put(descriptor, pa.schema([]), bob)
        with pytest.raises(flight.FlightUnauthorizedError, match="only an admin may register"):
            writer.close()
        assert "orders_ext" not in [t.name for t in secured.service.core.tables()]
        alice = _login(client, "alice", "wonderland")
        writer, reader = client.do_put(descriptor, pa.schema([]), alice)
        writer.done_writing()
        answer = sql_pb.DoPutUpdateResult.FromString(reader.read().to_pybytes())
        writer.close()
        assert answer.record_count == 0
    table = next(t for t in secured.service.core.tables() if t.name == "orders_ext")
    assert table.rows == 150_000  # TPC-H SF 0.1's orders, from the files' footers
