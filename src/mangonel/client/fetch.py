"""Reading a job's result partitions from the executors' Flight servers.

The ticket of a partition is its ``PartitionLocation.path``; the executor checks
it names a file it wrote. Partitions are concatenated in the order the
scheduler lists them (partition order).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight

from mangonel.errors import MangonelError
from mangonel.task import PartitionLocation


class ResultUnavailableError(Exception):
    """A result partition could not be read (its executor is gone or refused)."""


class FlightPool:
    """One Flight client per executor address, closed together."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self._clients: dict[str, flight.FlightClient] = {}
        self._timeout_s = timeout_s

    def read(self, loc: PartitionLocation) -> pa.Table:
        """The whole partition file as a table.

        Raises:
            ResultUnavailableError: the executor cannot be reached or refused the ticket.
        """
        client = self._clients.get(loc.flight_address)
        if client is None:
            client = flight.connect(f"grpc://{loc.flight_address}")
            self._clients[loc.flight_address] = client
        options = flight.FlightCallOptions(timeout=self._timeout_s)
        try:
            return client.do_get(flight.Ticket(loc.path.encode()), options).read_all()
        except (flight.FlightError, OSError, pa.ArrowException) as exc:
            raise ResultUnavailableError(
                f"result partition {loc.partition} on executor {loc.executor} "
                f"({loc.flight_address}) could not be read: {exc}"
            ) from exc

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def read_result(
    pool: FlightPool, locations: tuple[PartitionLocation, ...], columns: tuple[str, ...]
) -> pa.Table:
    """Concatenate the result partitions and give them the user-facing column names.

    ``columns`` may repeat a name (``SELECT a, a FROM t``); Arrow tables allow that.
    """
    tables = [pool.read(loc) for loc in locations]
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
