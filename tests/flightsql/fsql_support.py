"""Helpers of the Flight SQL suite: the ADBC driver's connection, and Flight SQL
commands packed by hand for a plain ``pyarrow.flight`` client (forged tickets,
malformed commands: what the driver does not let a test do).

A module of its own, not ``conftest``: pytest runs every suite in one process,
where ``conftest`` names whichever suite's was imported first.
"""

from __future__ import annotations

from typing import Any

import pyarrow.flight as flight
from google.protobuf import any_pb2

from mangonel.proto import flightsql_pb2 as sql_pb


def adbc_connect(url: str, **db_kwargs: str) -> Any:
    """A DB-API connection of the ADBC Flight SQL driver (autocommit: no transactions)."""
    import adbc_driver_flightsql.dbapi

    return adbc_driver_flightsql.dbapi.connect(url, db_kwargs=db_kwargs, autocommit=True)


def pack(message: Any) -> bytes:
    """A Flight SQL message packed in ``google.protobuf.Any``, as clients send them."""
    packed = any_pb2.Any()
    packed.Pack(message, type_url_prefix="type.googleapis.com/")
    return bytes(packed.SerializeToString())


def statement(sql: str) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(pack(sql_pb.CommandStatementQuery(query=sql)))


def read_endpoints(info: flight.FlightInfo, scheduler: flight.FlightClient) -> Any:
    """Every endpoint of ``info`` read where it says (its first location, or ``scheduler``)."""
    import pyarrow as pa

    tables = []
    for endpoint in info.endpoints:
        locations = [str(loc.uri.decode()) for loc in endpoint.locations]
        if locations and not locations[0].startswith("arrow-flight-reuse-connection"):
            with flight.connect(locations[0]) as client:
                tables.append(client.do_get(endpoint.ticket).read_all())
        else:
            tables.append(scheduler.do_get(endpoint.ticket).read_all())
    return pa.concat_tables(tables) if tables else info.schema.empty_table()


def raw_status(
    url: str, method: str, body: bytes, metadata: tuple[tuple[str, str], ...] = ()
) -> tuple[Any, str]:
    """Call a Flight method with plain gRPC, as a client in any language does, on a
    connection of its own, and return the status code and message it ended with
    (``OK``, "" if it did not fail).

    Args:
        url: ``grpc://host:port``.
        method: ``GetFlightInfo``, ``GetSchema`` or ``PollFlightInfo`` (one message
            in, one out), or ``DoAction`` (one in, a stream out).
        body: The serialized request.
    """
    import grpc

    path = f"/arrow.flight.protocol.FlightService/{method}"
    with own_channel(url) as channel:
        try:
            if method == "DoAction":
                list(channel.unary_stream(path)(body, metadata=metadata))
            else:
                channel.unary_unary(path)(body, metadata=metadata)
        except grpc.RpcError as err:
            return err.code(), err.details()  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, ""


def own_channel(url: str) -> Any:
    """A gRPC channel on a connection of its own (grpcio shares one between the
    channels of a process by default): a client that never logged in has its
    connection for a session."""
    import grpc

    options = [("grpc.use_local_subchannel_pool", 1)]
    return grpc.insecure_channel(url.removeprefix("grpc://"), options=options)
