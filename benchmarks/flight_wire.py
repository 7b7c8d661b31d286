"""A/B of two source trees on the Flight wire: a partition read, a Flight SQL call, a big result.

Each measure runs in child processes, alternately on this checkout's ``src`` (A) and
``--base-src`` (B), ``--rounds`` times each, so that both see the same load; each
reports wall and CPU seconds (``/proc/PID/stat``, which moves much less with the
machine's load than the wall time):

* ``shuffle``: a task reading a map task's 4 shuffle files (the first 2.4 million rows
  of TPC-H SF1 ``lineitem`` in the runner's batches of 131,072 rows, about 18 MiB each)
  from another executor's Flight server (``ShuffleReader``), as ``micro.py`` measures it;
* ``view``: the same files read through result views, as a Flight SQL client reads a
  result at an executor (A cuts the batches to fit 4 MiB messages: ``proto.batches``);
* ``call``: one Flight SQL ``GetFlightInfo`` + ``DoGet`` of a metadata command on the
  scheduler's Flight SQL port, 400 times after 50 warm-ups (median, in ms);
* ``result``: ``SELECT * FROM lineitem`` at SF1 (6,001,215 rows) on a 2-executor
  ``LocalCluster``, its endpoints read in parallel by ``pyarrow.flight`` clients from
  the executors, then through the scheduler's Flight SQL port (median of 5).

Usage::

    git -C /work/main archive main src | tar -x -C /tmp/base
    .venv/bin/python benchmarks/flight_wire.py --base-src /tmp/base/src [--measures view,call]

Not a test; prints one JSON line per run and a summary of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
LINEITEM_ROWS = 2_400_000
MEASURES = ("shuffle", "view", "call", "result")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tables() -> Path:
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from helpers import ensure_tpch

    return ensure_tpch(1)


# ------------------------------------------------------------------ children


def serve_files() -> None:
    """Child: write the shuffle files and serve them; print where, as one JSON line."""
    import duckdb
    from micro import serve_table

    path = _tables() / "lineitem.parquet"
    serve_table(duckdb.sql(f"SELECT * FROM '{path}' LIMIT {LINEITEM_ROWS}").to_arrow_table(), 4)


def measure_files(kind: str, repeat: int = 5) -> dict[str, Any]:
    """Child: read the served files ``repeat`` times (``shuffle`` or ``view``)."""
    import pyarrow.flight as flight

    from mangonel.executor.shuffle import ShuffleReader
    from mangonel.ids import ExecutorId, StageId
    from mangonel.proto.results import ResultView, result_schema
    from mangonel.task import PartitionLocation

    server = subprocess.Popen(
        [sys.executable, __file__, "--child", "serve"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None and server.stdin is not None
    served = json.loads(server.stdout.readline())
    address = f"127.0.0.1:{served['port']}"
    outputs = served["outputs"]
    if kind == "shuffle":
        locations = [
            PartitionLocation(ExecutorId("e"), "serving-host", address, StageId(1), 0,
                              o["partition"], o["path"], o["rows"], o["bytes"], o["checksum"])
            for o in outputs
        ]  # fmt: skip
        reader = ShuffleReader("reading-host")

        def once() -> None:
            reader.read_many(locations)

        close = reader.close
    else:
        client = flight.connect(f"grpc://{address}")
        first = client.do_get(flight.Ticket(outputs[0]["path"].encode()))
        schema = result_schema(first.schema, tuple(first.schema.names))
        first.cancel()
        tickets = [
            flight.Ticket(ResultView(o["path"].encode(), "j", i, schema).encode())
            for i, o in enumerate(outputs)
        ]

        def once() -> None:
            for ticket in tickets:
                for _ in client.do_get(ticket):
                    pass

        close = client.close
    once()
    times, server_cpu, client_cpu = _timed(once, repeat, server.pid)
    close()
    server.stdin.close()
    server.wait(30)
    size = sum(o["bytes"] for o in outputs)
    return {"mb": size / 1e6, "median_s": statistics.median(times),
            "server_cpu_s": server_cpu, "client_cpu_s": client_cpu}  # fmt: skip


def measure_call() -> dict[str, Any]:
    """Child: Flight SQL round trips (a metadata command) on an in-process scheduler core."""
    import pyarrow.flight as flight
    from google.protobuf import any_pb2

    from mangonel.proto import flightsql_pb2 as sql_pb
    from mangonel.scheduler.core import SchedulerCore
    from mangonel.scheduler.events import Limits
    from mangonel.scheduler.flightsql import FlightSqlServer
    from mangonel.scheduler.state import SchedulerState

    server = FlightSqlServer(SchedulerCore(SchedulerState(Limits())))
    packed = any_pb2.Any()
    packed.Pack(sql_pb.CommandGetTableTypes(), type_url_prefix="type.googleapis.com/")
    descriptor = flight.FlightDescriptor.for_command(packed.SerializeToString())
    client = flight.connect(server.url)

    def once() -> None:
        info = client.get_flight_info(descriptor)
        client.do_get(info.endpoints[0].ticket).read_all()

    for _ in range(50):
        once()
    times = []
    for _ in range(400):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    client.close()
    server.shutdown()
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3}


def measure_result(repeat: int = 5) -> dict[str, Any]:
    """Child: the SF1 lineitem result read from the executors, then through the scheduler."""
    import pyarrow.flight as flight
    from google.protobuf import any_pb2

    import mangonel
    from mangonel.proto import flightsql_pb2 as sql_pb

    packed = any_pb2.Any()
    packed.Pack(sql_pb.CommandStatementQuery(query="SELECT * FROM lineitem"),
                type_url_prefix="type.googleapis.com/")  # fmt: skip
    out: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-wire-") as work,
        mangonel.LocalCluster(executors=2, work_dir=work, partitions=4) as cluster,
    ):
        with cluster.connect() as session:
            session.register_parquet("lineitem", str(_tables() / "lineitem.parquet"))
        with flight.connect(cluster.flight_sql_url) as client:
            info = client.get_flight_info(
                flight.FlightDescriptor.for_command(packed.SerializeToString())
            )

        def reader(where: str) -> Any:
            def read(endpoint: Any) -> int:
                url = endpoint.locations[0].uri.decode() if where == "executors" else None
                with flight.connect(url or cluster.flight_sql_url) as c:
                    return sum(chunk.data.num_rows for chunk in c.do_get(endpoint.ticket))

            return read

        with ThreadPoolExecutor(len(info.endpoints)) as pool:
            for where in ("executors", "scheduler"):
                read = reader(where)
                list(pool.map(read, info.endpoints))
                times = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    rows = sum(pool.map(read, info.endpoints))
                    times.append(time.perf_counter() - start)
                assert rows == 6_001_215, rows
                out[f"from_{where}_median_s"] = statistics.median(times)
    return out


def _timed(fn: Any, repeat: int, server_pid: int) -> tuple[list[float], float, float]:
    server0, client0 = cpu_seconds(server_pid), time.process_time()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    server_cpu = (cpu_seconds(server_pid) - server0) / repeat
    return times, server_cpu, (time.process_time() - client0) / repeat


# -------------------------------------------------------------------- parent


def run_child(src: str, measure: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(
        [sys.executable, __file__, "--child", measure],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-src", help="B's src/ directory (required)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--measures", default=",".join(MEASURES))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child == "serve":
        serve_files()
        return 0
    if args.child:
        child = {
            "shuffle": lambda: measure_files("shuffle"),
            "view": lambda: measure_files("view"),
            "call": measure_call,
            "result": measure_result,
        }[args.child]
        print(json.dumps(child()), flush=True)
        return 0
    if not args.base_src:
        p.error("--base-src is required")
    sides = {"A": str(REPO_ROOT / "src"), "B": args.base_src}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for measure in args.measures.split(","):
        for round_ in range(args.rounds):
            order = ("A", "B") if round_ % 2 == 0 else ("B", "A")
            for side in order:
                result = run_child(sides[side], measure)
                runs.setdefault((measure, side), []).append(result)
                print(json.dumps({"measure": measure, "side": side, **result}), flush=True)
    print("\nmedians over the rounds (A: this checkout, B: --base-src):")
    for (measure, side), results in sorted(runs.items()):
        keys = results[0].keys()
        medians = {k: round(statistics.median(r[k] for r in results), 4) for k in keys}
        print(f"  {measure:8} {side}: {json.dumps(medians)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
