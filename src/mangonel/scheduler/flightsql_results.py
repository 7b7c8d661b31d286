"""Reads of result partitions from the executors holding them, for Flight SQL.

The Flight SQL service (``flightsql``) reads a result's first partition for its
schema, a write statement's ``Count`` rows, and, for a client that reads through
the scheduler, each partition it streams on. Every read goes to the executor
holding the partition, over one pooled Flight client per executor (with the
cluster's TLS), and carries the caller's bearer token: on a secured cluster the
executor serves a result ticket bound to a user only with that user's token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa
import pyarrow.flight as flight

from mangonel.proto.batches import fitted
from mangonel.proto.results import ResultView, carried_file, partition_ticket
from mangonel.security import tls
from mangonel.security.auth import AUTHORIZATION
from mangonel.security.tls import TlsMaterial
from mangonel.task import PartitionLocation

FETCH_TIMEOUT_S = 60.0
"""The longest one read of a result partition may take."""

READ_ERRORS = (flight.FlightError, OSError, pa.ArrowException)
"""How a read fails when the executor is gone, unreachable, or refuses it."""


class LostResult(Exception):
    """A result partition could not be read from its executor."""


class ExecutorReads:
    """Reads of result partitions, one pooled Flight client per executor.

    Args:
        tls_material: The scheduler's certificate on a secured cluster (the
            executors speak TLS); ``None``: plain gRPC.
    """

    def __init__(self, tls_material: TlsMaterial | None) -> None:
        self._tls = tls_material
        self._lock = threading.Lock()
        self._clients: dict[str, flight.FlightClient] = {}

    def url(self, address: str) -> str:
        """The Flight location of an executor's ``address``, as clients reach it."""
        return f"{tls.flight_scheme(self._tls)}://{address}"

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()

    def file_schema(self, loc: PartitionLocation, token: str | None) -> pa.Schema:
        """The schema of the partition's file, as its executor serves it.

        Raises:
            LostResult: the executor cannot serve it.
        """
        try:
            reader = self._read(loc.flight_address, partition_ticket(loc), token)
            schema = reader.schema
            reader.cancel()
        except READ_ERRORS as exc:
            raise LostResult(f"executor {loc.executor} ({loc.flight_address}): {exc}") from None
        return schema

    def count(
        self,
        locations: tuple[PartitionLocation, ...],
        token: str | None,
        held: Mapping[str, bytes],
    ) -> int:
        """The sum of the first column's integers over the partitions (a write
        statement's ``Count`` rows); ``held``: the files of them the scheduler
        holds (``JobWatch.result_files``), by path, which need no read.

        Raises:
            flight.FlightError, OSError, pa.ArrowException: a partition cannot be read.
        """
        count = 0
        for loc in locations:
            data = held.get(loc.path)
            table = carried_file(data, loc.rows) if data else None
            if table is None:
                table = self._read(loc.flight_address, partition_ticket(loc), token).read_all()
            if table.num_columns and table.num_rows:
                count += sum(v for v in table.column(0).to_pylist() if isinstance(v, int))
        return count

    def stream(
        self,
        view: ResultView,
        loc: PartitionLocation,
        schema: pa.Schema,
        token: str | None,
        lost: Callable[[BaseException], Exception],
    ) -> flight.FlightDataStream:
        """The partition ``loc`` streamed on as ``view`` asks (renamed and cast to
        ``schema``); a failed read, at its start or midway, raises ``lost(exc)``."""
        try:
            reader = self._read(loc.flight_address, view.ticket, token)
            reader.schema  # noqa: B018 - fails here, not in the stream, when it is gone
        except READ_ERRORS as exc:
            raise lost(exc) from None
        shown = ResultView(view.ticket, view.job, view.partition, schema)

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for chunk in reader:
                    yield shown.apply(chunk.data)
            except READ_ERRORS as exc:
                raise lost(exc) from None

        return flight.GeneratorStream(schema, fitted(batches()))

    def _read(self, address: str, ticket: bytes, token: str | None) -> flight.FlightStreamReader:
        # The caller's token goes along, so that the executor serves a result
        # ticket bound to its user.
        headers = [(AUTHORIZATION.encode(), f"Bearer {token}".encode())] if token else []
        options = flight.FlightCallOptions(timeout=FETCH_TIMEOUT_S, headers=headers)
        return self._client(address).do_get(flight.Ticket(ticket), options)

    def _client(self, address: str) -> flight.FlightClient:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = flight.connect(self.url(address), **tls.flight_client_kwargs(self._tls))
                self._clients[address] = client
            return client
