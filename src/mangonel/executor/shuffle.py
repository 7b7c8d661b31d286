"""Reading shuffle files: a task's inputs, memory-mapped on this host or fetched over Flight.

How they are written, and their checksums: ``shuffle_write``.

Reading (``ShuffleReader``): a file on this host is memory-mapped and its
checksum verified over the mapped bytes; a file elsewhere is fetched with Arrow
Flight ``do_get`` (the ticket is its path), and the serving executor verifies
the checksum while it sends, ending the stream in an error before its end when
the file is bad (see ``flight.py``), while the reader checks the row count. A
fetch that fails raises ``FetchFailedError`` naming the map output, so the
scheduler recomputes exactly that, and saying which problem it was
(``FetchProblem``): the file is missing or fails its checksum while its executor
answers (``OUTPUT_LOST``: only that output is made again), or the executor did
not answer after a few tries (``UNREACHABLE``: the scheduler takes it for lost,
with every output it held).

A partition fetched over Flight is never held whole in the executor's memory:
with a ``spool_dir`` (the executor gives each slot one in its spill directory),
its batches are written to a file there as they arrive, and the file is
memory-mapped and unlinked at once, like a local one: the kernel reclaims its
pages under memory pressure, and deletes it when the task lets go of the
table. A full disk while spooling fails the task as ``DISK_FULL``, not the fetch.

``stream_many`` reads the same files for a task that reads its input once: each
is fetched (spooled) or checksummed first, then read batch by batch from its map,
each batch's pages dropped from the process (``MADV_DONTNEED``) once read, so the
pages a task touched do not pile up in its RSS.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, overload

import pyarrow as pa
import pyarrow.flight as flight
from isal import isal_zlib

from mangonel import defaults
from mangonel.executor.failures import (
    FetchFailedError,
    TaskCancelledError,
    TaskFailedError,
    disk_full,
)
from mangonel.executor.flight_clients import FlightClients
from mangonel.executor.peer_rates import PeerRates
from mangonel.executor.shuffle_write import checksum_of, checksum_text
from mangonel.ids import ExecutorId
from mangonel.security.tls import TlsMaterial
from mangonel.task import FetchFailed, FetchProblem, PartitionLocation


class ShuffleReader:
    """Reads map output partitions: memory-mapped when local, Flight when remote.

    One reader per task slot (it caches one Flight client per peer).

    A Flight fetch runs on a thread of its own while the task's thread waits
    for it, so that ``cancel()`` stops the wait at once: neither closing the
    client nor cancelling the stream interrupts a ``do_get`` whose peer has gone
    silent (measured with pyarrow 26: both waited out the call's deadline), and
    a task cancelled because its input's executor was lost must free its slot
    now, not after ``timeout_s``. The abandoned fetch ends by itself at its
    call's deadline (``_ABANDONED_DEADLINE_S``), and its result is dropped.

    A fetch is judged by its progress: it fails (``UNREACHABLE``) when nothing
    arrived for ``timeout_s``, however long it has run, so a big partition on a
    slow link is never failed for being slow. One that received nothing for
    ``RENEW_FETCH_S`` is tried again beside it on a new connection (its own may
    be stuck behind a cut that healed), and the first answer is taken.

    Args:
        host: This executor's host identity (``ExecutorInfo.host``).
        timeout_s: Longest a Flight ``do_get`` may go without receiving anything.
        retries: Tries of a Flight fetch before it fails.
        backoff_s: Wait before the second try; doubled before each next one.
        spool_dir: Where fetched partitions are written as they arrive (created if
            missing); ``None`` reads them into memory.
        tls_material: Fetch over TLS, showing the node certificate; ``None``: plaintext.
        rates: Where the bytes each Flight fetch receives from each peer are
            counted, for the heartbeat (``executor.peer_rates``); ``None``: nowhere.
    """

    def __init__(
        self,
        host: str,
        *,
        timeout_s: float = defaults.FETCH_TIMEOUT_S,
        retries: int = 3,
        backoff_s: float = 0.1,
        spool_dir: str | None = None,
        tls_material: TlsMaterial | None = None,
        rates: PeerRates | None = None,
    ) -> None:
        self.host = host
        self._rates = rates
        self.spool_dir = spool_dir
        if spool_dir is not None:
            os.makedirs(spool_dir, exist_ok=True)
        self.timeout_s = timeout_s
        self.retries = max(1, retries)
        self.backoff_s = backoff_s
        self._clients = FlightClients(tls_material)
        self._cancelled = threading.Event()
        self.fetched = FetchCounts()
        """What the running task read so far (``reset`` starts it anew)."""

    def cancel(self) -> None:
        """Stop the fetch in progress, and every later one until ``reset()``:
        they raise ``TaskCancelledError``. Safe from any thread."""
        self._cancelled.set()

    def reset(self) -> None:
        """Accept fetches again (a new task starts on the slot); count its reads anew."""
        self._cancelled.clear()
        self.fetched = FetchCounts()

    def read(self, location: PartitionLocation) -> pa.Table:
        """One map output partition as a table; raises ``FetchFailedError``."""
        if location.host == self.host and os.path.isfile(location.path):
            self.fetched.local_bytes += location.bytes
            return self._read_local(location)
        return self._counted_flight(location, keep_file=False)

    def read_many(self, locations: Sequence[PartitionLocation]) -> pa.Table:
        """The concatenation of several partitions (at least one)."""
        tables = [self.read(loc) for loc in locations]
        if len(tables) == 1:
            return tables[0]
        # Upstream tasks run the same SQL, so schemas agree up to nullability
        # and null-typed columns of empty results; permissive promotion covers both.
        return pa.concat_tables(tables, promote_options="permissive")

    def stream_many(self, locations: Sequence[PartitionLocation]) -> pa.RecordBatchReader:
        """The concatenation of several partitions (at least one), as a stream read once.

        For a task that reads its input in one pass. Every partition is fetched,
        and a local one's checksum verified, before this returns, so a lost or
        corrupt input raises ``FetchFailedError`` here, as with ``read_many``;
        the batches are read from a memory map as the stream is consumed, and the
        pages of each dropped from the process once DuckDB has moved on. A mapped
        input read whole keeps every page a task touched in its RSS until the
        task lets the map go: about 60 MB at the peak of TPC-H q18 at SF1 with
        the rows in random order, whose one task aggregates every order's
        partial sums (issue 19).
        """
        sources: list[pa.Table | _FileSource] = []
        try:
            for location in locations:
                sources.append(self._open(location))
        except BaseException:
            _close_all(sources)
            raise
        schema = pa.unify_schemas([s.schema for s in sources], promote_options="permissive")
        return pa.RecordBatchReader.from_batches(schema, _concat(sources, schema))

    def close(self) -> None:
        self._clients.close()

    def _open(self, location: PartitionLocation) -> pa.Table | _FileSource:
        if location.host == self.host and os.path.isfile(location.path):
            self.fetched.local_bytes += location.bytes
            return self._open_local(location)
        return self._counted_flight(location, keep_file=True)

    def _counted_flight(
        self, location: PartitionLocation, keep_file: bool
    ) -> pa.Table | _FileSource:
        started = time.perf_counter()
        try:
            return self._read_flight(location, keep_file)
        finally:
            self.fetched.remote_s += time.perf_counter() - started
            self.fetched.remote_bytes += location.bytes

    def _open_local(self, location: PartitionLocation) -> _FileSource:
        try:
            source = _FileSource(location.path)
            checksum = source.checksum()
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise _fail(
                location, f"cannot read local file: {exc}", FetchProblem.OUTPUT_LOST
            ) from exc
        if checksum != location.checksum:
            raise _fail(
                location,
                f"checksum mismatch: expected {location.checksum}, file has {checksum}",
                FetchProblem.OUTPUT_LOST,
            )
        return source

    def _read_local(self, location: PartitionLocation) -> pa.Table:
        try:
            source = pa.memory_map(location.path, "r")
            data = source.read_buffer()
            checksum = checksum_of(data)
            if checksum != location.checksum:
                raise _fail(
                    location,
                    f"checksum mismatch: expected {location.checksum}, file has {checksum}",
                    FetchProblem.OUTPUT_LOST,
                )
            # The table's buffers point into the map, which they keep alive.
            return pa.ipc.open_file(data).read_all()
        except FetchFailedError:
            raise
        except (OSError, pa.ArrowException) as exc:
            # The file is on this host's disk: whatever is wrong is wrong with it,
            # not with the executor that wrote it.
            problem = FetchProblem.OUTPUT_LOST
            raise _fail(location, f"cannot read local file: {exc}", problem) from exc

    @overload
    def _read_flight(
        self, location: PartitionLocation, keep_file: Literal[False] = False
    ) -> pa.Table: ...

    @overload
    def _read_flight(
        self, location: PartitionLocation, keep_file: bool
    ) -> pa.Table | _FileSource: ...

    def _read_flight(
        self, location: PartitionLocation, keep_file: bool = False
    ) -> pa.Table | _FileSource:
        if self._cancelled.is_set():
            raise TaskCancelledError(f"fetch of {location.path} cancelled")
        outcomes: queue.SimpleQueue[pa.Table | _FileSource | BaseException] = queue.SimpleQueue()
        progress = _Progress(location, self._rates)

        def fetch(fresh: bool) -> None:
            try:
                outcomes.put(self._fetch(location, keep_file, progress, fresh))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                outcomes.put(exc)

        def start(fresh: bool) -> None:
            threading.Thread(target=fetch, args=(fresh,), name="flight-fetch", daemon=True).start()

        start(False)
        try:
            return self._wait_for(location, outcomes, progress, start)
        finally:
            progress.detach()

    def _wait_for(
        self,
        location: PartitionLocation,
        outcomes: queue.SimpleQueue[pa.Table | _FileSource | BaseException],
        progress: _Progress,
        start: Callable[[bool], None],
    ) -> pa.Table | _FileSource:
        """Wait for a fetch's threads; the first result, or the last failure;
        raise if it is cancelled or stalls.

        A fetch that received nothing for ``RENEW_FETCH_S`` gets another try on
        a new connection beside it, up to ``RENEWALS`` times: its connection may
        be stuck behind a cut that healed since (TCP backs off, doubling its
        wait: the lab measured readers of a flapping host's outputs waiting
        0.4-1.1 s past the heal). Whichever try finishes first is taken; the
        stall bound (``timeout_s``) still counts from the last bytes received.
        """
        running, renewals, renewed_at = 1, 0, progress.at
        failure: BaseException | None = None
        while True:
            try:
                outcome = outcomes.get(timeout=_CANCEL_POLL_S)
            except queue.Empty:
                outcome = None
            if isinstance(outcome, BaseException):
                running -= 1
                failure = outcome
                if running == 0:
                    raise failure
            elif outcome is not None:
                return outcome
            if self._cancelled.is_set():
                self._give_up(location)
                raise TaskCancelledError(f"fetch of {location.path} cancelled")
            stalled = progress.stalled_s()
            quiet = time.monotonic() - max(progress.at, renewed_at)
            if quiet >= RENEW_FETCH_S and renewals < RENEWALS and stalled <= self.timeout_s:
                renewals += 1
                running += 1
                renewed_at = time.monotonic()
                start(True)
            if stalled > self.timeout_s:
                # Judged by progress, not by its whole duration: a fetch that
                # keeps receiving batches over a slow link is never failed for
                # being slow; one that received nothing for the bound is a
                # frozen or cut-off peer. Abandoned like a cancelled one.
                self._give_up(location)
                raise _fail(
                    location,
                    f"Flight fetch from {location.flight_address} stalled: nothing received "
                    f"for {stalled:.1f} s (--fetch-timeout {self.timeout_s:g} s; "
                    f"{progress.bytes} bytes before)",
                    FetchProblem.UNREACHABLE,
                )

    def _give_up(self, location: PartitionLocation) -> None:
        """A fetch is given up with its calls still running (the reader was
        cancelled, or the peer went silent): the slot's next fetch from that
        peer goes on a new connection (``FlightClients.forget``), not behind
        what these calls sent. Measured on the lab's flapping link: readers
        that reused such a connection waited 0.5 s past the heal, until a copy
        of them ran elsewhere."""
        self._clients.forget(location.flight_address)

    def _fetch(
        self, location: PartitionLocation, keep_file: bool, progress: _Progress, fresh: bool
    ) -> pa.Table | _FileSource:
        """One partition over Flight: a table, or with ``keep_file`` and a spool
        directory the spooled file, opened for plain reads (``stream_many``).
        Each batch received is marked on ``progress`` (the waiting thread
        judges stalls by it). ``fresh``: a renewal (``_wait_for``), on a new
        connection, which is not progress until the peer answers."""
        # The call's own deadline only ends a call the waiting thread gave up on.
        deadline = max(_ABANDONED_DEADLINE_S, 10 * self.timeout_s)
        options = flight.FlightCallOptions(timeout=deadline)
        ticket = flight.Ticket(location.flight_ticket)
        last: Exception | None = None
        for attempt in range(self.retries):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            if self._cancelled.is_set():
                raise TaskCancelledError(f"fetch of {location.path} cancelled")
            address = location.flight_address
            if fresh and not attempt:
                client = self._clients.renew(address)
            else:
                progress.mark(0)
                client = self._clients.get(address)
            try:
                stream = client.do_get(ticket, options)
                progress.mark(0)
                got: pa.Table | _FileSource
                if self.spool_dir is None:
                    got = _read_all(stream, progress)
                    rows = got.num_rows
                elif keep_file:
                    got, rows = _spool_open(stream, self.spool_dir, progress)
                else:
                    got = _spool(stream, self.spool_dir, progress)
                    rows = got.num_rows
            except _SpoolFull as full:
                raise TaskFailedError(disk_full(str(full.__cause__))) from full.__cause__
            except flight.FlightTimedOutError as exc:
                # It had the whole timeout to answer: a frozen or cut-off peer.
                # Another try would only double the wait before the re-run.
                raise _fail(
                    location,
                    f"Flight fetch from {location.flight_address} timed out after "
                    f"{deadline:g} s: {exc}",
                    FetchProblem.UNREACHABLE,
                ) from exc
            except (flight.FlightServerError, flight.FlightUnauthenticatedError) as exc:
                # The peer answered and refused (unknown ticket, bad checksum):
                # another try gets the same answer.
                raise _fail(
                    location, f"executor refused the fetch: {exc}", FetchProblem.OUTPUT_LOST
                ) from exc
            except (flight.FlightError, pa.ArrowException, OSError) as exc:
                last = exc
                self._clients.drop(location.flight_address)
                continue
            if rows != location.rows:
                if isinstance(got, _FileSource):
                    got.close()
                raise _fail(
                    location,
                    f"expected {location.rows} rows, received {rows}",
                    FetchProblem.OUTPUT_LOST,
                )
            return got
        raise _fail(
            location,
            f"Flight fetch from {location.flight_address} failed {self.retries} times: {last}",
            FetchProblem.UNREACHABLE,
        )


class _Progress:
    """When a fetch last received something, and how much so far: written by the
    fetching thread, read by the waiting one (a float and an int: no lock).

    With ``rates``, the fetch counts as open from its peer until the waiting
    thread lets it go (``detach``): an abandoned fetch that goes on receiving
    on its own thread counts no more, neither its bytes nor its time. What it
    received is counted there in the file's bytes, by rows (the file's bytes
    over its rows, each batch's rows): the batches' decoded sizes can be
    several times the bytes on the wire, and the scheduler weighs the rates
    against the files' sizes.
    """

    def __init__(self, location: PartitionLocation, rates: PeerRates | None) -> None:
        self.at = time.monotonic()
        self.bytes = 0
        self._peer: ExecutorId = location.executor
        self._per_row = location.bytes / location.rows if location.rows > 0 else 0.0
        self._rates = rates
        if rates is not None:
            rates.opened(self._peer)

    def mark(self, nbytes: int, rows: int = 0) -> None:
        self.at = time.monotonic()
        self.bytes += nbytes
        rates = self._rates
        if rates is not None and rows:
            rates.received(self._peer, round(rows * self._per_row))

    def detach(self) -> None:
        """The waiting thread is done with the fetch (it ended, or was given up)."""
        rates, self._rates = self._rates, None
        if rates is not None:
            rates.closed(self._peer)

    def stalled_s(self) -> float:
        return time.monotonic() - self.at


def _read_all(stream: flight.FlightStreamReader, progress: _Progress) -> pa.Table:
    batches = []
    for chunk in stream:
        progress.mark(chunk.data.nbytes, chunk.data.num_rows)
        batches.append(chunk.data)
    return pa.Table.from_batches(batches, schema=stream.schema)


def _spool(stream: flight.FlightStreamReader, spool_dir: str, progress: _Progress) -> pa.Table:
    """The stream's batches written to a file in ``spool_dir`` as they arrive, then
    read back memory-mapped (the file is unlinked at once: the map keeps it)."""
    path = os.path.join(spool_dir, f"fetch-{uuid.uuid4().hex[:12]}.arrow")
    try:
        _spool_to(stream, path, progress)
        return pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)


def _spool_open(
    stream: flight.FlightStreamReader, spool_dir: str, progress: _Progress
) -> tuple[_FileSource, int]:
    """Like ``_spool``, but the file is opened for ``stream_many`` (the map keeps
    it after the unlink); and the rows it holds."""
    path = os.path.join(spool_dir, f"fetch-{uuid.uuid4().hex[:12]}.arrow")
    try:
        rows = _spool_to(stream, path, progress)
        return _FileSource(path), rows
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)


def _spool_to(stream: flight.FlightStreamReader, path: str, progress: _Progress) -> int:
    """Write the stream's batches to an IPC file at ``path``, marking each on
    ``progress``; the rows written."""
    rows = 0
    try:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, stream.schema) as out:
            for chunk in stream:
                progress.mark(chunk.data.nbytes, chunk.data.num_rows)
                out.write_batch(chunk.data)
                rows += chunk.data.num_rows
    except OSError as exc:
        if not isinstance(exc, flight.FlightError) and _no_space(exc):
            raise _SpoolFull() from exc
        raise
    return rows


class _FileSource:
    """An Arrow IPC file read batch by batch from a memory map, without a copy,
    whose pages are dropped from the process (``MADV_DONTNEED``) as the reading
    moves on: the page cache keeps them, the task's RSS does not. Reading the
    files with plain reads instead cost the executors 5% more CPU over the 22
    TPC-H queries (SF1, random layout). The map itself goes with the last
    buffer that points into it."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as file:
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.data = pa.py_buffer(self._map)
        self._reader = pa.ipc.open_file(self.data)
        self.schema: pa.Schema = self._reader.schema

    def checksum(self) -> str:
        """``checksum_of`` its bytes, a chunk at a time, each dropped once read."""
        crc = 0
        view = memoryview(self._map)
        try:
            for start in range(0, len(view), _CHECKSUM_CHUNK):
                crc = isal_zlib.crc32(view[start : start + _CHECKSUM_CHUNK], crc)
                self._map.madvise(
                    mmap.MADV_DONTNEED, start, min(_CHECKSUM_CHUNK, len(view) - start)
                )
        finally:
            view.release()
        return checksum_text(crc)

    def batches(self) -> Iterator[pa.RecordBatch]:
        for i in range(self._reader.num_record_batches):
            yield self._reader.get_batch(i)
            # DuckDB asks for the next batch once done with this one; a page
            # read again is only faulted back in from the page cache.
            self.close()

    def close(self) -> None:
        self._map.madvise(mmap.MADV_DONTNEED)


_CHECKSUM_CHUNK = 8 * 1024 * 1024
"""Bytes checksummed before their pages are dropped (a multiple of the page size)."""


def _concat(
    sources: Sequence[pa.Table | _FileSource], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The sources' batches in order, each as ``schema`` (their permissive union);
    each file is closed once read, every one if the stream is dropped early."""
    try:
        for source in sources:
            batches = source.to_batches() if isinstance(source, pa.Table) else source.batches()
            for batch in batches:
                if batch.num_rows:
                    yield batch if batch.schema.equals(schema) else batch.cast(schema)
            if isinstance(source, _FileSource):
                source.close()
    finally:
        _close_all(sources)


def _close_all(sources: Iterable[pa.Table | _FileSource]) -> None:
    for source in sources:
        if isinstance(source, _FileSource):
            source.close()


@dataclass
class FetchCounts:
    """What one task's reads of upstream partitions came to (``ShuffleReader.fetched``)."""

    local_bytes: int = 0
    """Bytes of the files on this host it read (memory-mapped)."""
    remote_bytes: int = 0
    """Bytes of the files it fetched from other hosts over Flight."""
    remote_s: float = 0.0
    """Time in those fetches: transfer, and spooling to disk."""


class _SpoolFull(Exception):
    """Spooling a fetched partition met a full disk (the cause says how)."""


def _no_space(exc: BaseException) -> bool:
    return (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        "No space left on device" in str(exc)
    )


_CANCEL_POLL_S = 0.05
"""How often a task waiting for a fetch looks whether it was cancelled."""

RENEW_FETCH_S = 1.0
"""A Flight fetch that received nothing for this long gets another try on a new
connection (``ShuffleReader._wait_for``): as ``executor.link`` renews its
heartbeats' connection after a second without an answer."""

RENEWALS = 3
"""At most this many renewals of one fetch (each is a thread blocked until its
call's deadline if its peer stays silent)."""

_ABANDONED_DEADLINE_S = 600.0
"""The Flight call's own deadline (or ten fetch timeouts, if longer): it only
ends a ``do_get`` whose waiting thread gave up (stalled or cancelled), since a
silent peer's call is not interrupted otherwise."""


def _fail(location: PartitionLocation, why: str, problem: FetchProblem) -> FetchFailedError:
    return FetchFailedError(
        FetchFailed(
            problem=problem,
            executor=location.executor,
            stage=location.stage,
            map_partition=location.map_partition,
            message=(
                f"fetching partition {location.partition} of stage {location.stage} map task "
                f"{location.map_partition} from executor {location.executor} "
                f"({location.path}): {why}"
            ),
        )
    )
