"""Shuffle files: write, read back (memory-mapped and over Flight), verify, release."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from helpers import require_host

from mangonel.executor.failures import FetchFailedError, TaskCancelledError, TaskFailedError
from mangonel.executor.flight import ShuffleFlightServer
from mangonel.executor.peer_rates import PeerRates
from mangonel.executor.shuffle import ShuffleReader
from mangonel.executor.shuffle_write import OutputRegistry, ShuffleWriter, file_checksum
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.task import (
    ExecutionError,
    ExecutionProblem,
    FetchProblem,
    PartitionLocation,
    PartitionOutput,
)
from mangonel.testing.limits import SmallDisk, small_disks_available

HOST = "host-a"


def attempt(job: str = "j1", stage: int = 1, partition: int = 0, n: int = 0) -> TaskAttemptId:
    return TaskAttemptId(TaskId(JobId(job), StageId(stage), partition), n)


def location(
    out: PartitionOutput, address: str = "127.0.0.1:1", host: str = HOST
) -> PartitionLocation:
    return PartitionLocation(
        executor=ExecutorId("e1"),
        host=host,
        flight_address=address,
        stage=StageId(1),
        map_partition=0,
        partition=out.partition,
        path=out.path,
        rows=out.rows,
        bytes=out.bytes,
        checksum=out.checksum,
    )


def flip_a_byte(out: PartitionOutput) -> None:
    """Corrupt a written partition: invert the bits of its middle byte."""
    with open(out.path, "r+b") as f:
        f.seek(out.bytes // 2)
        byte = f.read(1)
        f.seek(out.bytes // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


def sample(rows: int = 10_000) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(range(rows), pa.int64()),
            "s": pa.array([f"v{i % 97}" for i in range(rows)]),
            "d": pa.array([i / 3 for i in range(rows)]),
        }
    )


@pytest.fixture()
def writer(tmp_path: Path) -> ShuffleWriter:
    return ShuffleWriter(str(tmp_path / "shuffle"), OutputRegistry())


@pytest.fixture()
def server(writer: ShuffleWriter) -> Iterator[ShuffleFlightServer]:
    srv = ShuffleFlightServer(writer.root, writer.registry)
    yield srv
    srv.shutdown()


def test_local_round_trip_is_memory_mapped(writer: ShuffleWriter) -> None:
    table = sample()
    out = writer.write_table(attempt(), 0, table)
    assert out.path == os.path.join(writer.root, "j1", "s1", "m0-a0-p0.arrow")
    assert out.rows == table.num_rows
    assert out.bytes == os.path.getsize(out.path)
    assert out.checksum == file_checksum(out.path)
    before = pa.total_allocated_bytes()
    got = ShuffleReader(HOST).read(location(out))
    # Zero copy: the table's buffers live in the memory map, not Arrow's pool.
    assert pa.total_allocated_bytes() - before < table.nbytes // 10
    assert got.equals(table)


def test_checksum_is_zlibs_crc32_of_the_whole_file(writer: ShuffleWriter) -> None:
    # The CRC is kept piece by piece as the IPC writer hands over headers,
    # padding and column buffers; it must be zlib's CRC-32 of the file as a
    # whole, which is what "crc32:" promises whatever library computes it.
    table = sample(50_000)
    with writer.open(attempt(), 1, table.schema) as sink:
        for batch in table.to_batches(max_chunksize=7_000):
            sink.write_batch(0, batch)
        (out,) = sink.commit()
    data = Path(out.path).read_bytes()
    assert out.checksum == f"crc32:{zlib.crc32(data):08x}"
    assert file_checksum(out.path) == out.checksum


def test_flight_round_trip(writer: ShuffleWriter, server: ShuffleFlightServer) -> None:
    table = sample()
    out = writer.write_table(attempt(), 0, table)
    reader = ShuffleReader("host-b")  # another host: must go over Flight
    got = reader.read(location(out, f"127.0.0.1:{server.port}"))
    reader.close()
    assert got.equals(table)


def test_every_partition_is_written_even_empty(writer: ShuffleWriter) -> None:
    table = sample(100)
    with writer.open(attempt(), 3, table.schema) as sink:
        sink.write_table(1, table)
        outs = sink.commit()
    assert [o.partition for o in outs] == [0, 1, 2]
    assert [o.rows for o in outs] == [0, 100, 0]
    reader = ShuffleReader(HOST)
    empty = reader.read(location(outs[2]))
    assert empty.num_rows == 0 and empty.schema.equals(table.schema)


def test_local_checksum_mismatch_is_a_fetch_failure(writer: ShuffleWriter) -> None:
    out = writer.write_table(attempt(), 0, sample())
    flip_a_byte(out)
    with pytest.raises(FetchFailedError) as info:
        ShuffleReader(HOST).read(location(out))
    failure = info.value.failure
    assert (failure.executor, failure.stage, failure.map_partition) == ("e1", 1, 0)
    assert "checksum mismatch" in failure.message
    # The file is bad, its executor is not: only this output is to be made again.
    assert failure.problem is FetchProblem.OUTPUT_LOST


def test_flight_server_refuses_a_corrupt_file(
    writer: ShuffleWriter, server: ShuffleFlightServer
) -> None:
    out = writer.write_table(attempt(), 0, sample())
    with open(out.path, "r+b") as f:
        f.seek(out.bytes // 2)
        f.write(b"\x00\x01\x02\x03")
    reader = ShuffleReader("host-b", retries=1)
    with pytest.raises(FetchFailedError, match="corrupt") as info:
        reader.read(location(out, f"127.0.0.1:{server.port}"))
    assert info.value.failure.problem is FetchProblem.OUTPUT_LOST


def test_a_file_corrupt_past_its_first_batch_fails_the_fetch_after_streaming_begins(
    writer: ShuffleWriter, server: ShuffleFlightServer
) -> None:
    # The server streams each batch as it checks the next slice of the file: the
    # first batches are sent before the damage is found, and the stream then ends
    # in an error, so the reader never takes the rows it got as the partition.
    table = sample(30_000)
    with writer.open(attempt(), 1, table.schema) as sink:
        for batch in table.to_batches(max_chunksize=10_000):
            sink.write_batch(0, batch)
        (out,) = sink.commit()
    with open(out.path, "r+b") as f:
        f.seek(out.bytes * 3 // 4)  # in the last batch's values
        f.write(b"\x00\x01\x02\x03")
    client = flight.FlightClient(f"grpc://127.0.0.1:{server.port}")
    stream = client.do_get(flight.Ticket(out.path.encode()))
    assert stream.read_chunk().data.num_rows == 10_000  # sent before the check failed
    with pytest.raises(flight.FlightServerError, match="corrupt"):
        stream.read_all()
    client.close()
    reader = ShuffleReader("host-b", retries=1)
    with pytest.raises(FetchFailedError, match="corrupt") as info:
        reader.read(location(out, f"127.0.0.1:{server.port}"))
    assert info.value.failure.problem is FetchProblem.OUTPUT_LOST


def test_a_deleted_file_is_an_output_lost_not_a_lost_executor(
    writer: ShuffleWriter, server: ShuffleFlightServer
) -> None:
    out = writer.write_table(attempt(), 0, sample())
    os.remove(out.path)
    # Same host: the path is gone, so the reader asks the executor, which answers.
    reader = ShuffleReader(HOST, retries=1)
    with pytest.raises(FetchFailedError, match="no longer available") as info:
        reader.read(location(out, f"127.0.0.1:{server.port}"))
    assert info.value.failure.problem is FetchProblem.OUTPUT_LOST


def test_unreachable_peer_fails_after_retries(writer: ShuffleWriter, tmp_path: Path) -> None:
    out = writer.write_table(attempt(), 0, sample(10))
    srv = ShuffleFlightServer(writer.root, writer.registry)
    address = f"127.0.0.1:{srv.port}"
    srv.shutdown()  # nothing listens there any more
    reader = ShuffleReader("host-b", retries=2, backoff_s=0.01, timeout_s=5)
    with pytest.raises(FetchFailedError, match="failed 2 times") as info:
        reader.read(location(out, address))
    assert info.value.failure.executor == "e1"
    assert info.value.failure.problem is FetchProblem.UNREACHABLE


def test_release_is_remembered_for_late_attempts(writer: ShuffleWriter) -> None:
    job = attempt().task.job
    assert not writer.is_released(job, StageId(1))
    writer.release(job, [StageId(1)])
    assert writer.is_released(job, StageId(1)) and not writer.is_released(job, StageId(2))
    writer.release(job)
    assert writer.is_released(job, StageId(2))


def test_files_appear_only_by_rename(writer: ShuffleWriter) -> None:
    table = sample(10)
    final = writer.partition_path(attempt(), 0)
    with writer.open(attempt(), 1, table.schema) as sink:
        sink.write_table(0, table)
        directory = os.path.dirname(final)
        assert not os.path.exists(final)
        assert [n.endswith(".tmp") for n in os.listdir(directory)] == [True]
        sink.commit()
    assert os.listdir(directory) == ["m0-a0-p0.arrow"]


def test_a_failed_write_leaves_nothing(writer: ShuffleWriter) -> None:
    table = sample(10)
    with pytest.raises(RuntimeError), writer.open(attempt(), 2, table.schema) as sink:
        sink.write_table(0, table)
        raise RuntimeError("task failed mid-write")
    task = attempt().task
    assert os.listdir(writer.stage_dir(task.job, task.stage)) == []
    assert len(writer.registry) == 0


def test_release_stages_then_job(writer: ShuffleWriter) -> None:
    t = sample(10)
    s1 = writer.write_table(attempt(stage=1), 0, t)
    s2 = writer.write_table(attempt(stage=2), 0, t)
    other = writer.write_table(attempt(job="j2"), 0, t)
    writer.release(JobId("j1"), [StageId(1)])
    assert not os.path.exists(s1.path) and os.path.exists(s2.path)
    assert writer.registry.get(s1.path) is None and writer.registry.get(s2.path) is not None
    writer.release(JobId("j1"))
    assert not os.path.exists(os.path.join(writer.root, "j1"))
    assert os.path.exists(other.path)
    writer.release_all_except([JobId("j2")])
    assert os.path.exists(other.path)
    writer.release_all_except([])
    assert os.listdir(writer.root) == [] and len(writer.registry) == 0


def test_release_refuses_a_job_id_that_walks_out(writer: ShuffleWriter) -> None:
    with pytest.raises(ValueError):
        writer.release(JobId(".."))


def test_a_peer_that_never_answers_fails_after_one_timeout(writer: ShuffleWriter) -> None:
    out = writer.write_table(attempt(), 0, sample(10))
    # Listening but never answering: a frozen (SIGSTOPped) executor looks like this.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        reader = ShuffleReader("host-b", retries=3, backoff_s=0.01, timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(FetchFailedError, match="stalled: nothing received") as info:
            reader.read(location(out, f"127.0.0.1:{silent.getsockname()[1]}"))
        assert time.monotonic() - started < 1.4  # one timeout, not three
        assert info.value.failure.problem is FetchProblem.UNREACHABLE
        reader.close()
    finally:
        silent.close()


class _Trickle(flight.FlightServerBase):  # type: ignore[misc]
    """Serves ``table`` a batch every ``pause_s``, stopping for ``stall_s`` after
    ``stall_after`` batches: a peer behind a slow link, or one cut off mid-stream."""

    def __init__(
        self, table: pa.Table, pause_s: float, stall_after: int = -1, stall_s: float = 0.0
    ) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.table, self.pause_s = table, pause_s
        self.stall_after, self.stall_s = stall_after, stall_s

    def do_get(self, context: object, ticket: flight.Ticket) -> flight.GeneratorStream:
        def batches() -> Iterator[pa.RecordBatch]:
            for i, batch in enumerate(self.table.to_batches(max_chunksize=1000)):
                if i == self.stall_after:
                    time.sleep(self.stall_s)
                time.sleep(self.pause_s)
                yield batch

        return flight.GeneratorStream(self.table.schema, batches())


def test_a_fetch_that_keeps_receiving_is_never_failed_for_being_slow(
    writer: ShuffleWriter,
) -> None:
    # Ten batches 0.25 s apart: 2.5 s in all, five times the 0.5 s bound. Judged
    # by its whole duration, it would have failed after 0.5 s.
    table = sample(10_000)
    out = writer.write_table(attempt(), 0, table)
    with _Trickle(table, pause_s=0.25) as slow:
        reader = ShuffleReader("host-b", retries=1, timeout_s=0.5)
        started = time.monotonic()
        got = reader.read(location(out, f"127.0.0.1:{slow.port}"))
        assert time.monotonic() - started > 2.0
        assert got.equals(table)
        reader.close()


def test_the_reader_measures_what_each_peer_gives_it(
    writer: ShuffleWriter, server: ShuffleFlightServer
) -> None:
    # A trickling peer (ten batches 0.1 s apart) and a fast one, read through
    # one ``PeerRates``: the trickle's rate is its bytes over about a second,
    # the fast peer's many times more; one's own host's files count nothing.
    table = sample(10_000)
    out = writer.write_table(attempt(), 0, table)
    rates = PeerRates()
    with _Trickle(table, pause_s=0.1) as slow:
        reader = ShuffleReader("host-b", retries=1, timeout_s=5, rates=rates)
        trickled = dataclasses.replace(
            location(out, f"127.0.0.1:{slow.port}"), executor=ExecutorId("slow")
        )
        assert reader.read(trickled).equals(table)
        fast = dataclasses.replace(
            location(out, f"127.0.0.1:{server.port}"), executor=ExecutorId("fast")
        )
        assert reader.read(fast).equals(table)
        ShuffleReader(HOST, rates=rates).read(location(out))
        reader.close()
    got = {s.peer: s for s in rates.take()}
    assert set(got) == {"slow", "fast"}
    # Counted in the file's bytes (by rows, a batch at a time: rounding aside).
    for measured in got.values():
        assert abs(measured.bytes - out.bytes) <= 10
    assert got["slow"].busy_s >= 0.9
    assert got["fast"].rate > 3 * got["slow"].rate
    assert rates.take() == []


def test_a_fetch_that_stalls_mid_stream_fails_unreachable_after_the_bound(
    writer: ShuffleWriter,
) -> None:
    table = sample(10_000)
    out = writer.write_table(attempt(), 0, table)
    with _Trickle(table, pause_s=0.05, stall_after=3, stall_s=2.0) as stalled:
        reader = ShuffleReader("host-b", retries=3, timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(FetchFailedError, match="stalled: nothing received") as info:
            reader.read(location(out, f"127.0.0.1:{stalled.port}"))
        assert time.monotonic() - started < 3.0  # the bound after the last batch, once
        assert info.value.failure.problem is FetchProblem.UNREACHABLE
        assert "bytes before" in str(info.value) and " 0 bytes before" not in str(info.value)
        reader.close()


def test_cancel_stops_a_fetch_from_a_silent_peer_at_once(writer: ShuffleWriter) -> None:
    # A reader whose input's executor was declared lost is cancelled by the
    # scheduler: its slot must come free now, not after the fetch timeout.
    out = writer.write_table(attempt(), 0, sample(10))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    reader = ShuffleReader("host-b", timeout_s=30)
    try:
        threading.Timer(0.3, reader.cancel).start()
        started = time.monotonic()
        with pytest.raises(TaskCancelledError):
            reader.read(location(out, f"127.0.0.1:{silent.getsockname()[1]}"))
        assert time.monotonic() - started < 2.0
        # Cancelled until reset: the next task of the slot fetches again.
        with pytest.raises(TaskCancelledError):
            reader.read(location(out, "127.0.0.1:1"))
        reader.reset()
        reader.timeout_s = 0.3
        with pytest.raises(FetchFailedError, match="stalled"):
            reader.read(location(out, f"127.0.0.1:{silent.getsockname()[1]}"))
    finally:
        silent.close()
        reader.close()


def test_a_flight_fetch_is_spooled_to_disk_not_held_in_memory(
    writer: ShuffleWriter, server: ShuffleFlightServer, tmp_path: Path
) -> None:
    table = sample(200_000)
    out = writer.write_table(attempt(), 0, table)
    spool = tmp_path / "fetched"
    reader = ShuffleReader("host-b", spool_dir=str(spool))
    before = pa.total_allocated_bytes()
    got = reader.read(location(out, f"127.0.0.1:{server.port}"))
    # Zero copy, as a local read: the buffers live in the map of the spooled file,
    # which is already unlinked (its space returns when the table goes).
    assert pa.total_allocated_bytes() - before < table.nbytes // 10
    assert got.equals(table)
    assert os.listdir(spool) == []
    reader.close()


def test_a_full_disk_while_spooling_is_disk_full_not_a_fetch_failure(
    writer: ShuffleWriter, server: ShuffleFlightServer, tmp_path: Path
) -> None:
    require_host(None if small_disks_available() else "not root", "a tmpfs mounted as a small disk")
    out = writer.write_table(attempt(), 0, sample(200_000))
    with SmallDisk(str(tmp_path / "disk"), 2**20) as disk:
        reader = ShuffleReader("host-b", spool_dir=disk.path)
        with pytest.raises(TaskFailedError) as raised:
            reader.read(location(out, f"127.0.0.1:{server.port}"))
        reader.close()
        failure = raised.value.failure
        assert isinstance(failure, ExecutionError)
        assert failure.problem is ExecutionProblem.DISK_FULL
        assert os.listdir(disk.path) == []


def _resident_kib(path: str) -> int:
    """Resident KiB of this process's maps of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's first line
                inside = line.rstrip().endswith(path)
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_stream_many_drops_the_pages_it_read_of_local_and_fetched_partitions(
    writer: ShuffleWriter, server: ShuffleFlightServer, tmp_path: Path
) -> None:
    # Two map tasks' partitions: one on this host, one fetched (spooled), and an
    # empty one whose column is null-typed and a non-null field where the others
    # are nullable: the stream is their permissive union, in order.
    table = sample(30_000)
    local = writer.write_table(attempt(n=0), 0, table.slice(0, 12_000))
    with writer.open(attempt(partition=1), 1, table.schema) as sink:
        for batch in table.slice(12_000).to_batches(max_chunksize=5_000):
            sink.write_batch(0, batch)
        (remote,) = sink.commit()
    odd = pa.schema(
        [pa.field("k", pa.int64(), nullable=False), ("s", pa.null()), ("d", pa.float64())]
    )
    empty = writer.write_table(attempt(partition=2), 0, odd.empty_table())
    spool = tmp_path / "fetched"
    reader = ShuffleReader(HOST, spool_dir=str(spool))
    stream = reader.stream_many(
        [
            location(local),
            location(remote, f"127.0.0.1:{server.port}", host="host-b"),
            location(empty),
        ]
    )
    # Fetched before the stream is read; the spooled file is already unlinked.
    assert os.listdir(spool) == []
    assert stream.schema.equals(table.schema)
    batches = list(stream)
    # Zero copy: the batches point into the maps; yet once read, none of the
    # local file's pages is resident in the process (the page cache has them).
    assert os.path.getsize(local.path) > 64 * 1024
    assert _resident_kib(local.path) == 0
    got = pa.Table.from_batches(batches, schema=table.schema)
    reader.close()
    assert got.equals(table)
    # Reading a batch again faults its pages back in: they were only dropped.
    assert _resident_kib(local.path) > 0


def test_stream_many_checks_a_local_files_checksum_before_it_streams(
    writer: ShuffleWriter,
) -> None:
    out = writer.write_table(attempt(), 0, sample())
    flip_a_byte(out)
    good = writer.write_table(attempt(partition=1), 0, sample(10))
    with pytest.raises(FetchFailedError) as info:
        ShuffleReader(HOST).stream_many([location(good), location(out)])
    assert "checksum mismatch" in info.value.failure.message
    assert info.value.failure.problem is FetchProblem.OUTPUT_LOST


def test_stream_many_fails_a_fetch_of_the_wrong_row_count(
    writer: ShuffleWriter, server: ShuffleFlightServer, tmp_path: Path
) -> None:
    out = writer.write_table(attempt(), 0, sample(100))
    wrong = dataclasses.replace(location(out, f"127.0.0.1:{server.port}"), rows=99)
    reader = ShuffleReader("host-b", spool_dir=str(tmp_path / "fetched"))
    with pytest.raises(FetchFailedError, match="expected 99 rows, received 100"):
        reader.stream_many([wrong])
    reader.close()


def test_the_reader_counts_what_a_task_read_here_and_over_flight(
    writer: ShuffleWriter, server: ShuffleFlightServer, tmp_path: Path
) -> None:
    table = sample(20_000)
    with writer.open(attempt(), 1, table.schema) as sink:
        sink.write_table(0, table)
        assert sink.io_s > 0  # the writes and their CRC, timed apart from the encoding
        (out,) = sink.commit()
    reader = ShuffleReader(HOST, spool_dir=str(tmp_path / "fetched"))
    here, there = location(out), location(out, f"127.0.0.1:{server.port}", host="host-b")
    reader.read_many([here, there])
    assert (reader.fetched.local_bytes, reader.fetched.remote_bytes) == (out.bytes, out.bytes)
    assert reader.fetched.remote_s > 0
    reader.stream_many([there]).read_all()
    assert reader.fetched.remote_bytes == 2 * out.bytes
    reader.reset()  # the slot's next task counts from nothing
    assert (reader.fetched.local_bytes, reader.fetched.remote_bytes) == (0, 0)
    reader.close()


class _StuckFirst(flight.FlightServerBase):  # type: ignore[misc]
    """Serves ``table``, but holds the first call for ``hold_s`` before its first
    batch: a connection stuck behind a cut that healed (TCP's back-off)."""

    def __init__(self, table: pa.Table, hold_s: float) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.table, self.hold_s = table, hold_s
        self.peers: list[str] = []
        self._lock = threading.Lock()
        self.release = threading.Event()
        """Set: the held call goes on (the test ends without waiting it out)."""

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> object:
        with self._lock:
            self.peers.append(context.peer())
            first = len(self.peers) == 1
        hold = self.hold_s if first else 0.0

        def batches() -> Iterator[pa.RecordBatch]:
            self.release.wait(hold)
            yield from self.table.to_batches(max_chunksize=1000)

        return flight.GeneratorStream(self.table.schema, batches())


def test_a_fetch_stuck_on_its_connection_is_tried_again_on_a_new_one(
    writer: ShuffleWriter,
) -> None:
    # The first call gets nothing for 30 s; the stall bound is 20 s. After
    # RENEW_FETCH_S without a byte, a second try goes on a new connection (a
    # new client port) and its answer is taken: the fetch neither waits for the
    # stuck one nor fails.
    table = sample(10_000)
    out = writer.write_table(attempt(), 0, table)
    with _StuckFirst(table, hold_s=30.0) as stuck:
        reader = ShuffleReader("host-b", retries=1, timeout_s=20.0)
        started = time.monotonic()
        got = reader.read(location(out, f"127.0.0.1:{stuck.port}"))
        took = time.monotonic() - started
        assert got.equals(table)
        assert took < 15.0, took  # not the 30 s hold, nor the 20 s bound
        assert len(stuck.peers) >= 2 and stuck.peers[0] != stuck.peers[1], stuck.peers
        stuck.release.set()
        reader.close()
        print(f"stuck first call: answered after {took:.2f} s through {stuck.peers}")


def test_a_fetch_given_up_leaves_its_connection_to_the_call_still_on_it(
    writer: ShuffleWriter,
) -> None:
    # The first call is held (a peer cut off mid-fetch); its reader is
    # cancelled. The slot's next fetch from that peer goes on a new connection
    # (a new client port), not behind the call given up; the one after it
    # keeps that new connection.
    table = sample(1_000)
    out = writer.write_table(attempt(), 0, table)
    with _StuckFirst(table, hold_s=30.0) as stuck:
        reader = ShuffleReader("host-b", retries=1, timeout_s=20.0)
        threading.Timer(0.3, reader.cancel).start()
        with pytest.raises(TaskCancelledError):
            reader.read(location(out, f"127.0.0.1:{stuck.port}"))
        reader.reset()
        assert reader.read(location(out, f"127.0.0.1:{stuck.port}")).equals(table)
        assert reader.read(location(out, f"127.0.0.1:{stuck.port}")).equals(table)
        first, second, third = stuck.peers
        assert second != first and third == second, stuck.peers
        stuck.release.set()
        reader.close()
