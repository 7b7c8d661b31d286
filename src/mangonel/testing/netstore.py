"""An object store on a lab host of its own: moto's S3 server, counting what it serves.

>>> store = NetStore.start(lab, lab.add_host("store"))                # doctest: +SKIP
>>> store.upload({"tpch/orders.parquet": Path("/data/orders.parquet")})
>>> # processes started with store.env() and --s3-endpoint-url store.url read
>>> # s3://tpch/tpch/orders.parquet across the lab's switch.

The server (``python -m mangonel.testing.netstore serve``) is moto's S3 in server
mode, listening on every interface of its host at ``PORT``. Its buckets live in
its memory (large objects spill to its host's ``TMPDIR``). It does not check
credentials, but clients sign requests as with any S3, so every process that
reads it is given fake ones (``NetStore.env``): the same variables a real
deployment sets.

**Counting.** A WSGI layer in front of moto counts, per client address, the
requests and the bytes of the bodies it sent back to GETs (object data: footers
and column chunks), as ``benchmarks/objectstore.py`` counts at its in-process
server. ``GET /_mangonel/counters`` answers them as JSON; the machine's own
namespace has no route into the lab, so a test reads them from a lab host
(``NetStore.counters`` takes the GET to use, such as the client host's
``http_get``).

**Uploading.** The test process cannot reach the store either, so
``NetStore.upload`` runs ``python -m mangonel.testing.netstore upload`` on the
store's host: it reads the local files (every host sees the machine's file
system outside the lab's directories) and puts them through the server's own
S3 API with pyarrow's S3 client.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mangonel.client.cluster import ProcessHandle
from mangonel.errors import ClusterError
from mangonel.testing.netlab import MOUNT_POINT, Host, NetLab

PORT = 9000
"""The store's port on its host (MinIO's; the host is alone on its address)."""
REGION = "us-east-1"
COUNTERS_PATH = "/_mangonel/counters"
_UPLOAD_TIMEOUT_S = 600.0
_POLL_S = 0.05


def client_env() -> dict[str, str]:
    """The environment of a process that reads the store: fake credentials (the
    server does not check them, but requests are signed), the region, and nothing
    of the machine's own AWS setup, no EC2 metadata lookups."""
    return {
        "AWS_ACCESS_KEY_ID": "mangonel-lab",
        "AWS_SECRET_ACCESS_KEY": "mangonel-lab-secret",
        "AWS_REGION": REGION,
        "AWS_CONFIG_FILE": "/nonexistent/mangonel-lab-aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/mangonel-lab-aws-credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@dataclass(frozen=True)
class ClientCounters:
    """What the store served one client address."""

    requests: int
    get_bytes: int
    """Bytes of the bodies of GET responses (object data)."""


class NetStore:
    """The test's handle on a store server running on a lab host.

    Args:
        lab: The lab.
        host: The store's host.
        process: The server's process.
    """

    def __init__(self, lab: NetLab, host: Host, process: ProcessHandle) -> None:
        self.lab = lab
        self.host = host
        self.process = process

    @classmethod
    def start(cls, lab: NetLab, host: Host, timeout: float = 60.0) -> NetStore:
        """Start the server on ``host`` and wait until it listens."""
        ready = f"{MOUNT_POINT}/store.ready"
        argv = [sys.executable, "-m", "mangonel.testing.netstore", "serve",
                "--port", str(PORT), "--ready-file", ready]  # fmt: skip
        process = lab.start(host, argv, name=f"{host.name}-s3")
        path = host.outside(ready)
        deadline = time.monotonic() + timeout
        while not path.exists():
            if not process.alive():
                raise ClusterError(
                    f"the store on {host.name} exited with code {process.process.returncode}:"
                    f"\n{process.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(f"the store on {host.name} did not start:\n{process.log_tail()}")
            time.sleep(_POLL_S)
        return cls(lab, host, process)

    @property
    def url(self) -> str:
        """The endpoint every lab host reaches the store at (``--s3-endpoint-url``)."""
        return f"http://{self.host.address}:{PORT}"

    def env(self) -> dict[str, str]:
        """The environment of a process that reads the store (``client_env``)."""
        return client_env()

    def args(self) -> list[str]:
        """The options of ``mangonel scheduler`` and ``executor`` that point at the store."""
        return ["--s3-endpoint-url", self.url, "--s3-addressing", "path"]

    def upload(
        self, objects: Mapping[str, Path], bucket: str, timeout: float = _UPLOAD_TIMEOUT_S
    ) -> None:
        """Put each local file at ``s3://<bucket>/<key>`` (key -> file), making the
        bucket if it is missing; run on the store's host (see the module docstring)."""
        argv = [sys.executable, "-m", "mangonel.testing.netstore", "upload",
                "--endpoint", f"http://127.0.0.1:{PORT}", "--bucket", bucket]  # fmt: skip
        for key, path in objects.items():
            argv += [f"{key}={Path(path).resolve()}"]
        done = self.lab.run(self.host, argv, timeout=timeout)
        if done.returncode != 0:
            raise ClusterError(f"upload to the store failed:\n{done.stdout}\n{done.stderr}")

    def counters(self, http_get: Callable[[str], str]) -> dict[str, ClientCounters]:
        """Client address -> what the store served it so far, read with ``http_get``
        from a lab host (the test's own namespace has no route to the store)."""
        data = json.loads(http_get(f"{self.url}{COUNTERS_PATH}"))
        return {addr: ClientCounters(**c) for addr, c in data.items()}


# ----------------------------------------------------------------- the server


class _Counting:
    """WSGI layer in front of moto: per-client counts, and the counters' page."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.counts: dict[str, list[int]] = {}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == COUNTERS_PATH:
            with self.lock:
                body = {a: {"requests": r, "get_bytes": b} for a, (r, b) in self.counts.items()}
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        data = b"".join(self.app(environ, start_response))
        sent = len(data) if environ["REQUEST_METHOD"] == "GET" else 0
        with self.lock:
            count = self.counts.setdefault(environ.get("REMOTE_ADDR", "?"), [0, 0])
            count[0] += 1
            count[1] += sent
        return [data]


def _serve(port: int, ready_file: str) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    # No line per request: werkzeug's request log would cost the store more than
    # some requests do (a TPC-H query at SF1 makes hundreds); the counters count.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = _Counting(DomainDispatcherApplication(create_backend_app))
    server = make_server("0.0.0.0", port, app, True, request_handler=MotoRequestHandler)
    Path(ready_file).write_text(f"{port}\n")
    print(f"moto S3 serving on 0.0.0.0:{port}", flush=True)
    server.serve_forever()


def _upload(endpoint: str, bucket: str, objects: list[str]) -> None:
    import pyarrow.fs as pafs

    env = client_env()
    fs = pafs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=endpoint,
        scheme="http",
        region=REGION,
        force_virtual_addressing=False,
        allow_bucket_creation=True,
    )
    fs.create_dir(bucket)
    for item in objects:
        key, _, local = item.partition("=")
        began = time.monotonic()
        pafs.copy_files(local, f"{bucket}/{key}", destination_filesystem=fs)
        size = os.path.getsize(local)
        print(f"s3://{bucket}/{key}: {size} bytes in {time.monotonic() - began:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mangonel.testing.netstore")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve moto's S3 on every interface")
    serve.add_argument("--port", type=int, default=PORT)
    serve.add_argument("--ready-file", required=True, help="written once the port listens")
    upload = commands.add_parser("upload", help="put local files into the store")
    upload.add_argument("--endpoint", required=True)
    upload.add_argument("--bucket", required=True)
    upload.add_argument("objects", nargs="+", metavar="KEY=FILE")
    args = parser.parse_args(argv)
    if args.command == "serve":
        _serve(args.port, args.ready_file)
    else:
        _upload(args.endpoint, args.bucket, args.objects)


if __name__ == "__main__":
    main()
