"""The executor's Arrow Flight server: serves the files its tasks wrote.

Downstream tasks on other hosts fetch shuffle partitions here, and the client
fetches the final result partitions here. A ticket is the file's path as
reported in ``PartitionOutput.path``. Since a ticket comes from the network, it
is never opened as given: its resolved real path must lie inside this
executor's shuffle directory *and* be a file this executor wrote (listed in the
``OutputRegistry``), otherwise the call is refused. Before sending, the server
verifies the file against the checksum it computed when writing, so a peer
never receives a torn file as valid data.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.flight as flight

from mangonel.executor.shuffle import OutputRegistry, checksum_of
from mangonel.scheduler.events import PartitionOutput


class ShuffleFlightServer(flight.FlightServerBase):  # type: ignore[misc]
    """Serves this executor's output files over Arrow Flight ``do_get``.

    The server listens as soon as it is constructed (gRPC threads handle the
    calls); ``serve()`` need not be called. Stop it with ``shutdown()``.

    Args:
        root: The shuffle directory; every served file lies under it.
        registry: The files this executor wrote.
        bind_host: Interface to listen on.
        port: Port to listen on; 0 picks a free one (see ``port``).
    """

    def __init__(
        self, root: str, registry: OutputRegistry, bind_host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(location=f"grpc://{bind_host}:{port}")
        self._root = os.path.realpath(root)
        self._registry = registry

    # Authentication of peers will sit here, in one place, when channels get a
    # shared secret or TLS client certificates (see ARCHITECTURE.md).

    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.RecordBatchStream:
        """Stream the record batches of the output file the ticket names."""
        path, output = self._resolve(ticket.ticket)
        try:
            source = pa.memory_map(path, "r")
            data = source.read_buffer()
        except OSError as exc:
            raise flight.FlightServerError(
                f"output {path} is no longer available on this executor: {exc}"
            ) from exc
        checksum = checksum_of(data)
        if checksum != output.checksum:
            raise flight.FlightServerError(
                f"output {path} is corrupt: checksum {checksum}, written as {output.checksum}"
            )
        # Zero-copy: the batches point into the memory map, which they keep
        # alive even if the file is released (unlinked) while streaming.
        return flight.RecordBatchStream(pa.ipc.open_file(data).read_all())

    def _resolve(self, raw: bytes) -> tuple[str, PartitionOutput]:
        """The real path a ticket names, if it is an output this executor wrote."""
        try:
            given = raw.decode("utf-8")
        except UnicodeDecodeError:
            given = repr(raw)
            real = ""
        else:
            real = os.path.realpath(given) if given and "\0" not in given else ""
        inside = bool(real) and real.startswith(self._root + os.sep)
        output = self._registry.get(real) if inside else None
        if output is None:
            raise flight.FlightServerError(
                f"ticket {given!r} does not name an output this executor wrote"
            )
        return real, output
