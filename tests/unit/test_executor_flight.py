"""The Flight server serves only files its executor wrote, inside its work dir."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from mangonel.executor.flight import ShuffleFlightServer
from mangonel.executor.shuffle_write import OutputRegistry, ShuffleWriter
from mangonel.ids import JobId, StageId, TaskAttemptId, TaskId


@pytest.fixture()
def writer(tmp_path: Path) -> ShuffleWriter:
    return ShuffleWriter(str(tmp_path / "shuffle"), OutputRegistry())


@pytest.fixture()
def client(writer: ShuffleWriter) -> Iterator[flight.FlightClient]:
    srv = ShuffleFlightServer(writer.root, writer.registry)
    c = flight.FlightClient(f"grpc://127.0.0.1:{srv.port}")
    yield c
    c.close()
    srv.shutdown()


def get(client: flight.FlightClient, ticket: str | bytes) -> pa.Table:
    raw = ticket.encode() if isinstance(ticket, str) else ticket
    return client.do_get(flight.Ticket(raw)).read_all()


def write_one(writer: ShuffleWriter) -> str:
    a = TaskAttemptId(TaskId(JobId("j1"), StageId(1), 0), 0)
    return writer.write_table(a, 0, pa.table({"x": [1, 2, 3]})).path


def test_serves_a_written_file(writer: ShuffleWriter, client: flight.FlightClient) -> None:
    assert get(client, write_one(writer)).column("x").to_pylist() == [1, 2, 3]


@pytest.mark.parametrize("ticket", ["/etc/passwd", "", "relative/part-0.arrow", b"\xff\xfe"])
def test_refuses_paths_outside_the_work_dir(
    writer: ShuffleWriter, client: flight.FlightClient, ticket: str | bytes
) -> None:
    write_one(writer)
    with pytest.raises(
        flight.FlightServerError, match="does not name an output this executor wrote"
    ):
        get(client, ticket)


def test_refuses_a_traversal_out_of_the_work_dir(
    writer: ShuffleWriter, client: flight.FlightClient, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.arrow"
    with pa.OSFile(str(secret), "wb") as f, pa.ipc.new_file(f, pa.schema([("x", pa.int64())])):
        pass
    path = write_one(writer)
    here = os.path.dirname(path)
    escape = os.path.join(here, os.path.relpath(secret, here))
    assert ".." in escape and os.path.realpath(escape) == str(secret)
    with pytest.raises(flight.FlightServerError, match="does not name an output"):
        get(client, escape)


def test_refuses_a_file_in_the_work_dir_it_did_not_write(
    writer: ShuffleWriter, client: flight.FlightClient
) -> None:
    path = write_one(writer)
    planted = os.path.join(os.path.dirname(path), "part-9.arrow")
    with pa.OSFile(planted, "wb") as f, pa.ipc.new_file(f, pa.schema([("x", pa.int64())])):
        pass
    with pytest.raises(flight.FlightServerError, match="does not name an output"):
        get(client, planted)


def test_refuses_a_symlink_out_of_the_work_dir(
    writer: ShuffleWriter, client: flight.FlightClient, tmp_path: Path
) -> None:
    path = write_one(writer)
    link = os.path.join(os.path.dirname(path), "part-7.arrow")
    os.symlink("/etc/passwd", link)
    with pytest.raises(flight.FlightServerError, match="does not name an output"):
        get(client, link)


def test_refuses_a_released_file(writer: ShuffleWriter, client: flight.FlightClient) -> None:
    path = write_one(writer)
    writer.release(JobId("j1"))
    with pytest.raises(flight.FlightServerError, match="does not name an output"):
        get(client, path)


def test_other_flight_methods_are_refused_in_words(client: flight.FlightClient) -> None:
    """Not pyarrow's default: a NotImplementedError with the server's traceback."""
    descriptor = flight.FlightDescriptor.for_command(b"SELECT 1")
    calls = [
        lambda: list(client.list_flights()),
        lambda: client.get_flight_info(descriptor),
        lambda: list(client.do_action(flight.Action("CreatePreparedStatement", b""))),
        lambda: client.do_put(descriptor, pa.schema([("x", pa.int64())]))[0].close(),
        lambda: _exchange(client, descriptor),
    ]
    for call in calls:
        with pytest.raises(flight.FlightServerError) as refused:
            call()
        message = str(refused.value)
        assert "only streams the result and shuffle partitions" in message
        assert "--flight-sql-port" in message
        assert "Traceback" not in message and "_flight.pyx" not in message
    assert list(client.list_actions()) == []
    # pyarrow 26 passes no error of GetSchema through as a Flight error: the
    # words arrive, after them the traceback (and as UNKNOWN).
    with pytest.raises(pa.ArrowException, match="only streams the result and shuffle"):
        client.get_schema(descriptor)


def _exchange(client: flight.FlightClient, descriptor: flight.FlightDescriptor) -> None:
    writer, reader = client.do_exchange(descriptor)
    with writer:
        reader.read_chunk()
