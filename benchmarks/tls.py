"""What security costs on its own: Flight fetch throughput and small-call latency, TLS vs plain.

The TPC-H comparison (``tpch.py --secure``) shows the cost in whole queries; this
isolates the two places TLS can cost at all:

- **Flight throughput** (the shuffle fetch and the result read): a child process
  serves an in-memory table of ``--mib`` MiB over ``pyarrow.flight`` (as the
  executors' server does), read with ``do_get`` from this process, plaintext and
  then mutual TLS with the certificates of ``mangonel certs init``; the plaintext
  and TLS runs alternate, median of ``--repeat``.
- **Ticket checks**: signing and verifying one ticket (``security.tickets``).
- **Small-call latency**: ``ListTables`` to a scheduler (in this process), plain and
  mutual TLS, on a connection already open (the handshake is paid once per
  channel), median of 300 after 20 warm-up calls.

Usage::

    .venv/bin/python benchmarks/tls.py --mib 256 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.flight as flight

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import micro  # noqa: E402

from mangonel.security import certs, tls, tokens  # noqa: E402
from mangonel.security.options import SecurityOptions  # noqa: E402
from mangonel.security.tickets import TicketClaims, TicketSigner  # noqa: E402

CHILD = """
import sys, pyarrow.flight as flight
sys.path.insert(0, {bench!r})
import micro
from mangonel.security import tls
from mangonel.security.options import SecurityOptions
options = SecurityOptions.from_tls_dir({tls_dir!r}, "node")
material = tls.TlsMaterial.load(options) if {secure} else None
table = micro.synthetic_table({nbytes})
class Server(flight.FlightServerBase):
    def do_get(self, context, ticket):
        return flight.RecordBatchStream(table)
location = f"{{tls.flight_scheme(material)}}://127.0.0.1:0"
server = Server(location, **tls.flight_server_kwargs(material))
print(server.port, flush=True)
server.serve()
"""


def flight_rate(tls_dir: str, nbytes: int, secure: bool) -> float:
    """MB/s of one ``do_get`` of ``nbytes`` from a child server."""
    code = CHILD.format(
        bench=str(REPO_ROOT / "benchmarks"), tls_dir=tls_dir, secure=secure, nbytes=nbytes
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        material = (
            tls.TlsMaterial.load(SecurityOptions.from_tls_dir(tls_dir, "client"))
            if secure
            else None
        )
        client = flight.FlightClient(
            f"{tls.flight_scheme(material)}://127.0.0.1:{port}",
            **tls.flight_client_kwargs(material),
        )
        client.do_get(flight.Ticket(b"warm")).read_all()
        start = time.perf_counter()
        got = client.do_get(flight.Ticket(b"x")).read_all()
        elapsed = time.perf_counter() - start
        client.close()
        return got.nbytes / elapsed / 1e6
    finally:
        proc.kill()
        proc.wait()


def ticket_cost(runs: int = 20_000) -> tuple[float, float]:
    signer = TicketSigner(b"s" * 64)
    claims = TicketClaims("/work/j1/s3/m12-a0-p7.arrow", "j1", 3, 12, 7, time.time() + 60)
    start = time.perf_counter()
    for _ in range(runs):
        raw = signer.sign(claims)
    sign_us = (time.perf_counter() - start) / runs * 1e6
    start = time.perf_counter()
    for _ in range(runs):
        signer.verify(raw)
    return sign_us, (time.perf_counter() - start) / runs * 1e6


def call_latency(tls_dir: str, secure: bool, runs: int = 300) -> float:
    """Median ms of ``ListTables`` on an open channel to an in-process scheduler."""
    from mangonel.proto import mangonel_pb2 as pb
    from mangonel.proto import mangonel_pb2_grpc as pb_grpc
    from mangonel.scheduler.main import SchedulerConfig, start_scheduler

    node = SecurityOptions.from_tls_dir(tls_dir, "node") if secure else SecurityOptions()
    server = start_scheduler(SchedulerConfig(port=0, state="memory://", security=node))
    try:
        material = (
            tls.TlsMaterial.load(SecurityOptions.from_tls_dir(tls_dir, "client"))
            if secure
            else None
        )
        # A secured scheduler lets clients in by token (they show no certificate).
        metadata: tuple[tuple[str, str], ...] = ()
        secret = node.cluster_secret()
        if secret is not None:
            metadata = (("authorization", f"Bearer {tokens.mint(secret, 'bench', admin=True)}"),)
        channel = tls.open_channel(server.address, material, [])
        stub = pb_grpc.QueryServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pb.ListTablesRequest()
        times = micro.time_runs(lambda: stub.ListTables(request, metadata=metadata), runs, 20)
        channel.close()
        return statistics.median(times) * 1000
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB served by one do_get")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each, alternating")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        certs.init_cluster(tmp)
        plain, secure = [], []
        for _ in range(args.repeat):
            plain.append(flight_rate(tmp, args.mib << 20, False))
            secure.append(flight_rate(tmp, args.mib << 20, True))
        p, s = statistics.median(plain), statistics.median(secure)
        sign_us, verify_us = ticket_cost()
        lat_plain, lat_tls = call_latency(tmp, False), call_latency(tmp, True)
    print("| measure | plain | TLS | TLS / plain |\n|---|---:|---:|---:|")
    print(f"| Flight do_get of {args.mib} MiB, MB/s | {p:.0f} | {s:.0f} | {s / p:.2f} |")
    print(f"| gRPC ListTables, open channel, ms | {lat_plain:.2f} | {lat_tls:.2f} | "
          f"{lat_tls / lat_plain:.2f} |")  # fmt: skip
    print(f"\nticket: sign {sign_us:.1f} µs, verify {verify_us:.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
