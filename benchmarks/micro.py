"""Latency of a trivial query, and shuffle throughput against raw Flight loopback.

``latency``: ``SELECT 1`` and ``SELECT count(*) FROM nation`` end to end through
``session.sql`` (submit, plan, schedule, run, fetch the result over Flight,
release), ``LATENCY_RUNS`` runs after ``LATENCY_WARMUP`` warm-up runs; the same
queries on an in-process DuckDB connection for scale.

``shuffle``: a query whose plan moves most of its bytes through hash exchanges
(lineitem ⋈ partsupp with broadcast joins off, so both sides are hash-partitioned
on part and supplier; a three-value aggregate on top keeps the answer tiny; not
lineitem ⋈ orders, which the planner joins where lineitem is read, from the key
ranges of the two tables' row groups, without an exchange). Bytes
shuffled are the bytes written by its map stages (``result.stages``); the rate
is those bytes over the job's time on the scheduler, an end-to-end figure that
includes the Parquet scan and the join. Next to it:

- the shuffle machinery alone, in this process: the same volume written through
  ``ShuffleWriter`` (Arrow IPC + crc32, 4 partitions, in the runner's
  ``BATCH_ROWS`` batches) and read back through
  ``ShuffleReader`` (memory-mapped, checksum verified), which is what the
  executors do on one host;
- raw Flight loopback: a ``pyarrow.flight`` server in a child process serving an
  in-memory table of the same byte size, read with ``do_get`` from this process.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

LATENCY_RUNS = 100
LATENCY_WARMUP = 5
LATENCY_QUERIES = ("SELECT 1", "SELECT count(*) FROM nation")

SHUFFLE_SQL = (
    "SELECT count(*) AS n, sum(l_extendedprice * (1 - l_discount)) AS revenue, "
    "max(ps_supplycost) AS max_cost FROM lineitem "
    "JOIN partsupp ON l_partkey = ps_partkey AND l_suppkey = ps_suppkey"
)
SHUFFLE_REPEAT = 3
FLIGHT_BATCH_ROWS = 1 << 17
"""Rows per batch the loopback server sends (a shuffle file's batches are of this order)."""


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def time_runs(fn: Any, runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def latency(session: Any, duck_con: Any) -> list[dict[str, Any]]:
    """p50/p95 (ms) of each trivial query on mangonel and on in-process DuckDB."""
    rows = []
    for sql in LATENCY_QUERIES:
        for engine, fn in (
            ("mangonel", lambda sql=sql: session.sql(sql)),
            ("duckdb", lambda sql=sql: duck_con.sql(sql).to_arrow_table()),
        ):
            times = time_runs(fn, LATENCY_RUNS, LATENCY_WARMUP)
            rows.append(
                {
                    "query": sql,
                    "engine": engine,
                    "runs": LATENCY_RUNS,
                    "p50_ms": percentile(times, 50) * 1e3,
                    "p95_ms": percentile(times, 95) * 1e3,
                    "min_ms": min(times) * 1e3,
                }
            )
    return rows


# ----------------------------------------------------------------- shuffle


def synthetic_table(nbytes: int) -> pa.Table:
    """About ``nbytes`` of four fixed-width columns (no dictionary tricks)."""
    rows = max(1, nbytes // 32)
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "k": pa.array(rng.integers(0, 1 << 40, rows)),
            "a": pa.array(rng.random(rows)),
            "b": pa.array(rng.random(rows)),
            "c": pa.array(rng.integers(0, 1 << 20, rows)),
        }
    )


def serve_flight(nbytes: int) -> None:
    """Child process: serve ``synthetic_table(nbytes)`` on a free port (printed)."""
    table = synthetic_table(nbytes)
    batches = table.to_batches(max_chunksize=FLIGHT_BATCH_ROWS)

    class Server(flight.FlightServerBase):  # type: ignore[misc]
        def do_get(self, context: Any, ticket: Any) -> Any:
            return flight.RecordBatchStream(
                pa.RecordBatchReader.from_batches(table.schema, batches)
            )

    server = Server("grpc://127.0.0.1:0")
    print(server.port, flush=True)
    sys.stdin.read()  # until the parent closes the pipe
    server.shutdown()


@contextlib.contextmanager
def child_server(option: str, nbytes: int) -> Iterator[str]:
    """Run this file with ``option BYTES`` (a server) in a child process; yield the
    first line it prints (where it listens), stop it after."""
    proc = subprocess.Popen(
        [sys.executable, __file__, option, str(nbytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the child serves until its stdin closes
        proc.wait(10)


def flight_loopback(nbytes: int, repeat: int = SHUFFLE_REPEAT) -> dict[str, Any]:
    """Median rate of ``do_get`` of ``nbytes`` over loopback, from a child server."""
    with child_server("--serve-flight", nbytes) as line:
        client = flight.FlightClient(f"grpc://127.0.0.1:{int(line)}")
        served = client.do_get(flight.Ticket(b"t")).read_all()  # warm-up; size check
        size = served.nbytes
        times = time_runs(lambda: client.do_get(flight.Ticket(b"t")).read_all(), repeat, 0)
        client.close()
    seconds = statistics.median(times)
    return {"bytes": size, "seconds": seconds, "mb_per_s": size / seconds / 1e6}


def serve_shuffle(nbytes: int, partitions: int = 4) -> None:
    """Child process: write ``synthetic_table(nbytes)`` as a map task's ``partitions``
    shuffle files and serve them with the executor's Flight server; print its port and
    the outputs as one JSON line."""
    serve_table(synthetic_table(nbytes), partitions)


def serve_table(table: pa.Table, partitions: int = 4) -> None:
    """Child process: write ``table`` as a map task's ``partitions`` shuffle files and
    serve them with the executor's Flight server; print its port and the outputs as
    one JSON line; serve until the parent closes standard input."""
    import json

    from mangonel.executor.flight import ShuffleFlightServer
    from mangonel.executor.runner import BATCH_ROWS
    from mangonel.executor.shuffle_write import ShuffleWriter
    from mangonel.ids import JobId, StageId, TaskAttemptId, TaskId

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as root:
        writer = ShuffleWriter(root)
        attempt = TaskAttemptId(TaskId(JobId("j"), StageId(1), 0), 0)
        step = -(-table.num_rows // partitions)
        with writer.open(attempt, partitions, table.schema) as sink:
            for p in range(partitions):
                for batch in table.slice(p * step, step).to_batches(BATCH_ROWS):
                    sink.write_batch(p, batch)
            outputs = sink.commit()
        server = ShuffleFlightServer(root, writer.registry)
        described = [
            {"partition": o.partition, "path": o.path, "rows": o.rows, "bytes": o.bytes,
             "checksum": o.checksum}
            for o in outputs
        ]  # fmt: skip
        print(json.dumps({"port": server.port, "outputs": described}), flush=True)
        sys.stdin.read()  # until the parent closes the pipe
        server.shutdown()


def shuffle_remote_read(nbytes: int) -> dict[str, Any]:
    """Median time for a task on another host to read a map task's shuffle files:
    ``ShuffleReader`` fetching them from the executor's Flight server (which checks
    each file's checksum as it streams it) in a child process."""
    import json

    from mangonel.executor.shuffle import ShuffleReader
    from mangonel.ids import ExecutorId, StageId
    from mangonel.task import PartitionLocation

    with child_server("--serve-shuffle", nbytes) as line:
        served = json.loads(line)
        address = f"127.0.0.1:{served['port']}"
        locations = [
            PartitionLocation(ExecutorId("e"), "serving-host", address, StageId(1), 0,
                              o["partition"], o["path"], o["rows"], o["bytes"], o["checksum"])
            for o in served["outputs"]
        ]  # fmt: skip
        reader = ShuffleReader("reading-host")
        reader.read_many(locations)  # warm-up: the connection
        times = time_runs(lambda: reader.read_many(locations), SHUFFLE_REPEAT, 0)
        reader.close()
    size = sum(o["bytes"] for o in served["outputs"])
    seconds = statistics.median(times)
    return {"bytes": size, "seconds": seconds, "mb_per_s": size / seconds / 1e6}


def shuffle_machinery(table: pa.Table, partitions: int = 4) -> dict[str, Any]:
    """Write ``table`` through ``ShuffleWriter`` as ``partitions`` files, read them back."""
    from mangonel.executor.runner import BATCH_ROWS
    from mangonel.executor.shuffle import ShuffleReader
    from mangonel.executor.shuffle_write import ShuffleWriter
    from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
    from mangonel.task import PartitionLocation

    with tempfile.TemporaryDirectory(prefix="bench-shuffle-") as root:
        writer = ShuffleWriter(root)
        reader = ShuffleReader("bench-host")
        rows = table.num_rows
        write_times, read_times = [], []
        for run in range(SHUFFLE_REPEAT):
            attempt = TaskAttemptId(TaskId(JobId(f"j{run}"), StageId(1), 0), 0)
            start = time.perf_counter()
            with writer.open(attempt, partitions, table.schema) as sink:
                step = -(-rows // partitions)
                for p in range(partitions):
                    # in the batches a task writes (one 70 MB batch per file
                    # measured Python's buffer copies and page faults instead)
                    for batch in table.slice(p * step, step).to_batches(BATCH_ROWS):
                        sink.write_batch(p, batch)
                outputs = sink.commit()
            write_times.append(time.perf_counter() - start)
            locations = [
                PartitionLocation(
                    ExecutorId("e"),
                    "bench-host",
                    "",
                    StageId(1),
                    0,
                    o.partition,
                    o.path,
                    o.rows,
                    o.bytes,
                    o.checksum,
                )  # fmt: skip
                for o in outputs
            ]
            start = time.perf_counter()
            back = reader.read_many(locations)
            read_times.append(time.perf_counter() - start)
            if back.num_rows != rows:
                raise RuntimeError(f"shuffle read {back.num_rows} rows, wrote {rows}")
            writer.release(JobId(f"j{run}"))
        file_bytes = sum(o.bytes for o in outputs)
    write_s, read_s = statistics.median(write_times), statistics.median(read_times)
    return {
        "bytes": file_bytes,
        "write_s": write_s,
        "read_s": read_s,
        "write_mb_per_s": file_bytes / write_s / 1e6,
        "read_mb_per_s": file_bytes / read_s / 1e6,
        "write_read_mb_per_s": file_bytes / (write_s + read_s) / 1e6,
    }


def shuffle_query(session: Any) -> dict[str, Any]:
    """Median of ``SHUFFLE_REPEAT`` runs of ``SHUFFLE_SQL`` (after one warm-up)."""
    session.sql(SHUFFLE_SQL)
    results = [session.sql(SHUFFLE_SQL) for _ in range(SHUFFLE_REPEAT)]
    results.sort(key=lambda r: r.scheduler_elapsed_s)
    result = results[len(results) // 2]
    # The last stage writes the answer; every stage before it feeds an exchange.
    shuffled = sum(s.bytes for s in result.stages[:-1])
    if shuffled < 1e6:
        raise RuntimeError(
            f"the shuffle query moved {shuffled} bytes through exchanges: its plan no "
            "longer shuffles; pick another query for SHUFFLE_SQL"
        )
    return {
        "sql": SHUFFLE_SQL,
        "bytes_shuffled": shuffled,
        "scheduler_s": result.scheduler_elapsed_s,
        "client_s": result.elapsed_s,
        "mb_per_s": shuffled / result.scheduler_elapsed_s / 1e6,
        "stages": [
            {
                "stage": s.stage,
                "label": s.label,
                "tasks": s.tasks_total,
                "rows": s.rows,
                "bytes": s.bytes,
                "elapsed_s": s.elapsed_s,
            }
            for s in result.stages
        ],  # fmt: skip
    }


def shuffle(cluster_factory: Any) -> dict[str, Any]:
    """The shuffle query on a cluster with broadcast joins off, then the two references."""
    with cluster_factory() as (session, _cluster):
        query = shuffle_query(session)
    nbytes = query["bytes_shuffled"]
    machinery = shuffle_machinery(synthetic_table(nbytes))
    remote = shuffle_remote_read(nbytes)
    loopback = flight_loopback(nbytes)
    return {
        "query": query,
        "machinery": machinery,
        "remote_read": remote,
        "flight_loopback": loopback,
        "query_vs_flight": query["mb_per_s"] / loopback["mb_per_s"],
        "machinery_vs_flight": machinery["write_read_mb_per_s"] / loopback["mb_per_s"],
        "remote_read_vs_flight": remote["mb_per_s"] / loopback["mb_per_s"],
    }


def latency_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| query | engine | p50 ms | p95 ms | min ms |", "|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| `{r['query']}` | {r['engine']} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} "
            f"| {r['min_ms']:.1f} |"
        )
    return "\n".join(lines)


def shuffle_markdown(s: dict[str, Any]) -> str:
    q, m, f, r = s["query"], s["machinery"], s["flight_loopback"], s["remote_read"]
    mb = q["bytes_shuffled"] / 1e6
    lines = [
        "| measure | MB | seconds | MB/s | vs Flight loopback |",
        "|---|---:|---:|---:|---:|",
        f"| shuffle query end to end (scheduler time) | {mb:.1f} | {q['scheduler_s']:.3f} "
        f"| {q['mb_per_s']:.0f} | {s['query_vs_flight']:.0%} |",
        f"| shuffle files: write (IPC + crc32) | {m['bytes'] / 1e6:.1f} | {m['write_s']:.3f} "
        f"| {m['write_mb_per_s']:.0f} | |",
        f"| shuffle files: read (mmap + crc32) | {m['bytes'] / 1e6:.1f} | {m['read_s']:.3f} "
        f"| {m['read_mb_per_s']:.0f} | |",
        f"| shuffle files: write + read | {m['bytes'] / 1e6:.1f} "
        f"| {m['write_s'] + m['read_s']:.3f} | {m['write_read_mb_per_s']:.0f} "
        f"| {s['machinery_vs_flight']:.0%} |",
        f"| shuffle files: read from another executor (its Flight server) "
        f"| {r['bytes'] / 1e6:.1f} | {r['seconds']:.3f} | {r['mb_per_s']:.0f} "
        f"| {s['remote_read_vs_flight']:.0%} |",
        f"| raw Flight loopback do_get | {f['bytes'] / 1e6:.1f} | {f['seconds']:.3f} "
        f"| {f['mb_per_s']:.0f} | 100% |",
        "",
        f"Shuffle query: `{q['sql']}` (broadcast joins off). Stages:",
        "",
        "| stage | label | tasks | rows out | MB out | elapsed s |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for st in q["stages"]:
        lines.append(
            f"| {st['stage']} | {st['label']} | {st['tasks']} | {st['rows']} "
            f"| {st['bytes'] / 1e6:.1f} | {st['elapsed_s']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-flight":
        serve_flight(int(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--serve-shuffle":
        serve_shuffle(int(sys.argv[2]))
    else:
        name = os.path.basename(__file__)
        raise SystemExit(f"usage: {name} --serve-flight BYTES | --serve-shuffle BYTES")
