"""The executor's Arrow Flight server: serves the files its tasks wrote.

Downstream tasks on other hosts fetch shuffle partitions here, and the client
fetches the final result partitions here. A ticket is the file's path as
reported in ``PartitionOutput.path``. Since a ticket comes from the network, it
is never opened as given: its resolved real path must lie inside this
executor's shuffle directory *and* be a file this executor wrote (listed in the
``OutputRegistry``), otherwise the call is refused. While sending, the server
verifies the file against the checksum it computed when writing (a slice of the
file after each batch goes out) and ends the stream in an error, not at its end,
when they differ: a peer never takes a torn file as valid data. Checking the whole
file before the first batch made a fetch from another executor 69 % of the raw
Flight loopback rate; checking as it streams, 92 % (``benchmarks/micro.py``, 314 MB).

In a secured cluster the server speaks TLS (asking callers for no certificate:
clients hold the CA alone) and, given the cluster secret (which TLS requires),
serves only tickets the scheduler signed (``security.tickets``): a forged or
expired ticket, or a result ticket presented by anyone but its reader (the
session that ran the query, with its key; the Flight SQL user, with a token of
theirs) is refused with ``FlightUnauthenticatedError`` and logged, and the
server goes on serving.

A link probe (``executor.probes``) asks for ``n`` synthetic bytes instead of a
file: a probe ticket (``security.tickets``), which in a secured cluster only a
member can sign, for at most ``MAX_PROBE_BYTES``; the server streams the same
prebuilt batch of ``LINK_PROBE_BATCH_BYTES`` until ``n`` bytes went out, with
no disk and no checksum. Unsigned or forged probes are refused and logged as
forged file tickets are: an outside client cannot make an executor stream.

A Flight SQL client reads a result partition through a view ticket
(``proto.results.ResultView``): the partition's own ticket, checked as above,
plus the schema the client expects; the batches are renamed, trimmed and cast
to it as they go out.

Through a view, every batch goes out cut to fit one gRPC message of any
client (``proto.batches``): a file's batches are as large as DuckDB made them
(up to 18 MiB), which only ``pyarrow.flight``'s client, the peers' and the Python
client's, accepts whole. Cut, they cost the server up to a third more CPU per
byte sent, which a shuffle does not pay.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from isal import isal_zlib

from mangonel import defaults
from mangonel.executor.shuffle_write import OutputRegistry, checksum_text
from mangonel.proto.batches import fitted
from mangonel.proto.results import ResultView
from mangonel.security import tls
from mangonel.security.auth import AUTHORIZATION, bearer_token
from mangonel.security.tickets import (
    SESSION_HEADER,
    ProbeClaims,
    TicketError,
    TicketSigner,
    is_probe,
    is_signed,
    read_unsigned_probe,
)
from mangonel.task import PartitionOutput

log = logging.getLogger(__name__)

_HEADERS = "headers"


class _Headers(flight.ServerMiddleware):  # type: ignore[misc]
    """Holds a call's headers, for ``do_get`` to read the session key and token."""

    def __init__(self, headers: dict[str, list[str]]) -> None:
        self.headers = headers


class _HeadersFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> _Headers:
        return _Headers(headers)


class ShuffleFlightServer(flight.FlightServerBase):  # type: ignore[misc]
    """Serves this executor's output files over Arrow Flight ``do_get``.

    The server listens as soon as it is constructed (gRPC threads handle the
    calls); ``serve()`` need not be called. Stop it with ``shutdown()``.

    Args:
        root: The shuffle directory; every served file lies under it.
        registry: The files this executor wrote.
        bind_host: Interface to listen on.
        port: Port to listen on; 0 picks a free one (see ``port``).
        tls_material: Serve TLS with its certificate; ``None``: plaintext.
        signer: Serve only tickets it verifies; ``None``: a ticket is a path.
    """

    def __init__(
        self,
        root: str,
        registry: OutputRegistry,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        tls_material: tls.TlsMaterial | None = None,
        signer: TicketSigner | None = None,
    ) -> None:
        super().__init__(
            location=f"{tls.flight_scheme(tls_material)}://{bind_host}:{port}",
            middleware={_HEADERS: _HeadersFactory()},
            **tls.flight_server_kwargs(tls_material),
        )
        self._root = os.path.realpath(root)
        self._registry = registry
        self._signer = signer
        self.refused = 0
        """Tickets refused as unsigned, forged, expired or another session's."""

    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.RecordBatchStream:
        """Stream the record batches of the output file the ticket names
        (or a probe's synthetic bytes)."""
        if is_probe(ticket.ticket):
            return self._probe(context, ticket.ticket)
        try:
            view = ResultView.decode(ticket.ticket)
        except ValueError as exc:
            raise flight.FlightServerError(str(exc)) from None
        raw = self._check_ticket(context, ticket.ticket if view is None else view.ticket)
        path, output = self._resolve(raw)
        try:
            source = pa.memory_map(path, "r")
            data = source.read_buffer()
        except OSError as exc:
            raise flight.FlightServerError(
                f"output {path} is no longer available on this executor: {exc}"
            ) from exc
        try:
            reader = pa.ipc.open_file(data)
        except pa.ArrowInvalid as exc:
            raise flight.FlightServerError(f"output {path} is corrupt: {exc}") from exc
        # Zero-copy: the batches point into the memory map, which they keep
        # alive even if the file is released (unlinked) while streaming.
        batches = _checked(reader, data, output, path)
        if view is not None:
            return flight.GeneratorStream(view.schema, fitted(view.apply(b) for b in batches))
        # Cut to messages of at most ``BATCH_BYTES`` (zero-copy slices): a reader
        # judges a fetch by the batches it receives (``ShuffleReader``), and one
        # batch of tens of megabytes on a slow link would look like a stall.
        return flight.GeneratorStream(reader.schema, fitted(batches))

    # Every other Flight method is refused in words a client can act on. Not
    # pyarrow's default (``NotImplementedError``, which reaches the client with the
    # server's traceback pasted into the message), nor ``ArrowNotImplementedError``
    # (gRPC UNIMPLEMENTED, but with the same traceback): ``FlightServerError``
    # travels as UNKNOWN with the message alone.

    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Iterator[Any]:
        raise _only_do_get("ListFlights")

    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        raise _only_do_get("GetFlightInfo")

    def get_schema(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.SchemaResult:
        raise _only_do_get("GetSchema")

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        raise _only_do_get("DoPut")

    def do_exchange(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        raise _only_do_get("DoExchange")

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return []

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[Any]:
        raise _only_do_get(f"action {action.type!r}")

    def _probe(self, context: flight.ServerCallContext, raw: bytes) -> flight.GeneratorStream:
        """A link probe's stream: its ticket checked, then ``nbytes`` of one
        prebuilt batch (the last one cut), from memory."""
        try:
            if self._signer is None:
                claims: ProbeClaims = read_unsigned_probe(raw)
            else:
                claims = self._signer.verify_probe(raw)
        except TicketError as exc:
            raise self._refused(context, "a link probe", "probe", exc) from exc
        rows = _PROBE_BATCH.num_rows
        full, rest = divmod(claims.nbytes // 8, rows)
        batches = [_PROBE_BATCH] * full + ([_PROBE_BATCH.slice(0, rest)] if rest else [])
        return flight.GeneratorStream(_PROBE_BATCH.schema, iter(batches))

    def _check_ticket(self, context: flight.ServerCallContext, raw: bytes) -> bytes:
        """The path a ticket grants, once its signature, expiry and session hold."""
        if self._signer is None:
            if is_signed(raw):
                raise flight.FlightUnauthenticatedError(
                    "this executor has no cluster secret and cannot check a signed ticket: "
                    "start it with the cluster's --cluster-secret-file (or --tls-dir)"
                )
            return raw
        headers: _Headers | None = context.get_middleware(_HEADERS)
        given = headers.headers if headers is not None else {}
        keys = given.get(SESSION_HEADER, [])
        authorization = given.get(AUTHORIZATION, [])
        bearer = bearer_token(authorization[0]) if authorization else None
        try:
            claims = self._signer.verify(raw, keys[0] if keys else None, bearer)
        except TicketError as exc:
            raise self._refused(context, "a Flight ticket", "ticket", exc) from exc
        return claims.path.encode()

    def _refused(
        self, context: flight.ServerCallContext, what: str, short: str, exc: TicketError
    ) -> flight.FlightUnauthenticatedError:
        """Count and log a refused ticket or probe; the error its caller gets."""
        self.refused += 1
        log.warning(
            "refused %s from %s (%s): %s",
            what,
            context.peer(),
            context.peer_identity().decode(errors="replace") or "no certificate",
            exc,
        )
        return flight.FlightUnauthenticatedError(f"{short} refused: {exc}")

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


_PROBE_ROWS = defaults.LINK_PROBE_BATCH_BYTES // 8
_PROBE_BATCH = pa.record_batch(
    [
        pa.Array.from_buffers(
            pa.int64(), _PROBE_ROWS, [None, pa.py_buffer(os.urandom(_PROBE_ROWS * 8))]
        )
    ],
    names=["probe"],
)
"""What a probe streams, over and over (built once: a probe costs the server no CPU
beyond sending it). From a buffer of random bytes, which no compression shrinks, and
not ``pa.array(range(...))``: pyarrow imports pandas to convert a Python sequence,
which no cluster process loads (``tests/integration/test_process_memory.py``)."""


def _only_do_get(what: str) -> flight.FlightServerError:
    return flight.FlightServerError(
        f"{what} is not served here: this is a mangonel executor's Flight port, which only "
        "streams the result and shuffle partitions of tickets the scheduler handed out "
        "(DoGet); Flight SQL clients connect to the scheduler's Flight SQL port "
        "(--flight-sql-port, 50051 by default)"
    )


def _checked(
    reader: pa.ipc.RecordBatchFileReader, data: pa.Buffer, output: PartitionOutput, path: str
) -> Iterator[pa.RecordBatch]:
    """The file's batches, its checksum computed a slice after each one is handed over
    (while gRPC sends it) and compared before the stream ends: a file found corrupt
    ends the stream with an error, so the reader never takes its rows as data."""
    count = reader.num_record_batches
    step = -(-data.size // max(1, count))
    crc = 0
    for i in range(count):
        yield reader.get_batch(i)
        crc = isal_zlib.crc32(memoryview(data)[i * step : (i + 1) * step], crc)
    crc = isal_zlib.crc32(memoryview(data)[count * step :], crc)
    checksum = checksum_text(crc)
    if checksum != output.checksum:
        raise flight.FlightServerError(
            f"output {path} is corrupt: checksum {checksum}, written as {output.checksum}"
        )
