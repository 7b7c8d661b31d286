"""Reading a job's result partitions from the executors' Flight servers.

The ticket of a partition is its ``PartitionLocation.path`` (in a secured
cluster, the scheduler's signed ticket, presented with the session's key); the
executor checks it names a file it wrote. A small result's files on a cluster
without tickets come with the job's final status instead (``carried_partition``).
Partitions are concatenated in the order the scheduler lists them (partition order).

A failed read says whether the executor answered (``refused``: the file is gone
or bad, so only running the query again helps) or could not be reached (a dead
process or a cut link: the session asks the scheduler which, and retries the
read while the executor is alive). The Flight channels ping under a read, so a
link cut in the middle of one fails it within the keepalive, not at its timeout.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.flight as flight

from mangonel.errors import ClusterError, MangonelError
from mangonel.proto import mangonel_pb2 as pb
from mangonel.proto.results import carried_file
from mangonel.security import tls
from mangonel.security.tickets import SESSION_HEADER
from mangonel.task import PartitionLocation


class ResultUnavailableError(ClusterError):
    """A result partition could not be read: a ``ClusterError``, in the public
    error tree (``mangonel.errors``), like any executor that cannot be reached.

    Attributes:
        location: The partition.
        refused: The executor answered and refused the ticket (the file is gone
            or corrupt); False when it could not be reached at all.
    """

    def __init__(self, message: str, location: PartitionLocation, refused: bool) -> None:
        super().__init__(message)
        self.location = location
        self.refused = refused


# Errors raised by the executor's Flight server itself: it is there and said no.
_REFUSALS = (flight.FlightServerError, flight.FlightUnauthenticatedError)


class FlightPool:
    """One Flight client per executor address, closed together.

    Args:
        timeout_s: The most one partition's read may take.
        keepalive: gRPC options for the channels (``rpc.keepalive_options``).
        tls_material: Read over TLS, trusting its CA; ``None``: plaintext.
        session_key: Presented with each read (header ``x-mangonel-session``): a
            secured cluster's executors serve a result only to its session.
    """

    def __init__(
        self,
        timeout_s: float = 60.0,
        keepalive: Sequence[tuple[str, int]] = (),
        tls_material: tls.TlsMaterial | None = None,
        session_key: str = "",
    ) -> None:
        self._clients: dict[str, flight.FlightClient] = {}
        self._timeout_s = timeout_s
        self._options = list(keepalive)
        self._tls = tls_material
        self._headers = [(SESSION_HEADER.encode(), session_key.encode())] if session_key else []

    def read(self, loc: PartitionLocation, timeout_s: float | None = None) -> pa.Table:
        """The whole partition file as a table.

        Args:
            loc: The partition.
            timeout_s: Limit of this read, if shorter than the pool's.

        Raises:
            ResultUnavailableError: the executor cannot be reached or refused the ticket.
        """
        client = self._clients.get(loc.flight_address)
        if client is None:
            client = flight.connect(
                f"{tls.flight_scheme(self._tls)}://{loc.flight_address}",
                generic_options=self._options or None,
                **tls.flight_client_kwargs(self._tls),
            )
            self._clients[loc.flight_address] = client
        limit = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        options = flight.FlightCallOptions(timeout=max(0.001, limit), headers=self._headers)
        try:
            return client.do_get(flight.Ticket(loc.flight_ticket), options).read_all()
        except (flight.FlightError, OSError, pa.ArrowException) as exc:
            raise ResultUnavailableError(
                f"result partition {loc.partition} on executor {loc.executor} "
                f"({loc.flight_address}) could not be read: {exc}",
                loc,
                refused=isinstance(exc, _REFUSALS),
            ) from exc

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def carried_partition(loc: pb.PartitionLocation) -> pa.Table | None:
    """A result partition whose file came with the job's final status (a small result
    on a cluster without tickets), or ``None``: read it over Flight."""
    return carried_file(loc.data, loc.rows) if loc.data else None


def assemble_result(tables: Sequence[pa.Table], columns: tuple[str, ...]) -> pa.Table:
    """Concatenate the result partitions and give them the user-facing column names.

    ``columns`` may repeat a name (``SELECT a, a FROM t``); Arrow tables allow that.
    """
    if not tables:
        # No partition at all: the names are known, the types are not.
        return pa.table({f"c{i}": pa.nulls(0) for i in range(len(columns))}).rename_columns(
            list(columns)
        )
    try:
        table = pa.concat_tables(tables)
    except pa.ArrowInvalid:
        # Partitions written by different attempts may differ in string vs string_view.
        table = pa.concat_tables(tables, promote_options="permissive")
    if table.num_columns > len(columns):
        # The final stage may carry helper columns after the user's (e.g. a sort
        # key that is not selected); the user's columns come first.
        table = table.select(list(range(len(columns))))
    if table.num_columns != len(columns):
        raise MangonelError(
            f"internal error: the result has {table.num_columns} columns but the plan "
            f"names {len(columns)}; please report this query"
        )
    return table.rename_columns(list(columns))
