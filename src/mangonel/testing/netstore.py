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

**Ranged GETs at the cost of the range.** moto answers a GET with a ``Range``
header by reading and copying the whole object, then slicing it
(``_handle_range_header`` on ``FakeKey.value``), so every request would cost the
object's size (232 MB for SF1's lineitem) in this one process, and the store's
time would measure moto rather than the engine. The layer answers the common case
itself (``_RangedGets``): a plain GET of an object, path-style, with one byte
range, is read from the key's own buffer (the spooled temporary file moto keeps
its bytes in), that range only, with the headers moto would send (206,
``Content-Range``, ``Content-Length``, ``ETag``, ``Last-Modified``,
``Content-Type``, ``Accept-Ranges``). Anything else (conditional or versioned
or unsigned GETs, query parameters, several or unsatisfiable ranges, archived
objects, a missing bucket or key, a checksum asked of a key that has one) goes
to moto as before. pyarrow's client asks every GET with
``x-amz-checksum-mode: enabled``, which moto answers with no checksum (it
matches ``ENABLED`` only): those are the layer's.

**Uploading.** The test process cannot reach the store either, so
``NetStore.upload`` runs ``python -m mangonel.testing.netstore upload`` on the
store's host: it reads the local files (every host sees the machine's file
system outside the lab's directories) and puts them through the server's own
S3 API with pyarrow's S3 client. ``NetStore.download`` is the way back: it copies
the objects under a prefix to a local directory, so a test reads what was
written with a reader of its own, not through the cluster.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
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

    def download(
        self, bucket: str, prefix: str, to: Path, timeout: float = _UPLOAD_TIMEOUT_S
    ) -> None:
        """Copy every object under ``s3://<bucket>/<prefix>/`` into the local
        directory ``to`` (keys below the prefix become paths below ``to``); run on
        the store's host, as ``upload``."""
        argv = [sys.executable, "-m", "mangonel.testing.netstore", "download",
                "--endpoint", f"http://127.0.0.1:{PORT}", "--bucket", bucket,
                "--prefix", prefix, "--to", str(Path(to).resolve())]  # fmt: skip
        done = self.lab.run(self.host, argv, timeout=timeout)
        if done.returncode != 0:
            raise ClusterError(f"download from the store failed:\n{done.stdout}\n{done.stderr}")

    def counters(self, http_get: Callable[[str], str]) -> dict[str, ClientCounters]:
        """Client address -> what the store served it so far, read with ``http_get``
        from a lab host (the test's own namespace has no route to the store)."""
        data = json.loads(http_get(f"{self.url}{COUNTERS_PATH}"))
        return {addr: ClientCounters(**c) for addr, c in data.items()}


# ----------------------------------------------------------------- the server


_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_REASONS = {200: "OK", 206: "Partial Content"}
# Request headers that make a GET more than "these bytes of this object": moto
# answers those itself.
_MOTO_ONLY_HEADERS = (
    "HTTP_IF_MATCH",
    "HTTP_IF_NONE_MATCH",
    "HTTP_IF_MODIFIED_SINCE",
    "HTTP_IF_UNMODIFIED_SINCE",
    "HTTP_X_MOTO_ACCOUNT_ID",
    "HTTP_X_AMZ_SERVER_SIDE_ENCRYPTION_CUSTOMER_ALGORITHM",
)


def _byte_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a one-range ``Range`` header on an object of ``size``
    bytes, as S3 reads it; None where moto should answer (several ranges, an
    unparsable or unsatisfiable one, which moto turns into its error)."""
    match = _RANGE.fullmatch(header.strip())
    if match is None or size == 0:
        return None
    first, last = match.group(1), match.group(2)
    if first:
        begin = int(first)
        end = size - 1 if not last else min(int(last), size - 1)
    elif last:  # the last N bytes
        if int(last) == 0:
            return None
        begin, end = size - min(int(last), size), size - 1
    else:
        return None
    if begin > end:
        return None
    return begin, end


class _RangedGets:
    """Answers a plain ranged GET of an object from the key's buffer, reading the
    range only (see the module docstring); ``None`` for any other request."""

    def __call__(self, environ: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes] | None:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.s3.models import FakeKey, s3_backends
        from moto.s3.utils import ARCHIVE_STORAGE_CLASSES

        header = environ.get("HTTP_RANGE", "")
        if environ.get("REQUEST_METHOD") != "GET" or not header or environ.get("QUERY_STRING"):
            return None
        if any(environ.get(name) for name in _MOTO_ONLY_HEADERS):
            return None
        if not environ.get("HTTP_AUTHORIZATION"):  # unsigned: moto checks the ACLs
            return None
        # PATH_INFO is percent-decoded, its UTF-8 bytes as latin-1 (PEP 3333).
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
        bucket_name, _, key_name = path.lstrip("/").partition("/")
        if not bucket_name or not key_name:
            return None
        account = os.environ.get("MOTO_ACCOUNT_ID", DEFAULT_ACCOUNT_ID)
        backend = s3_backends[account]["aws"]
        bucket = backend.buckets.get(bucket_name)
        key = bucket.keys.get(key_name) if bucket is not None else None
        if not isinstance(key, FakeKey) or key.storage_class in ARCHIVE_STORAGE_CLASSES:
            return None
        # moto sends a key's checksum only to "ENABLED" (pyarrow's client asks with
        # "enabled", so gets none), and drops it from a part of the object: moto's.
        if key.checksum_algorithm and environ.get("HTTP_X_AMZ_CHECKSUM_MODE") == "ENABLED":
            return None
        span = _byte_range(header, key.size)
        if span is None:
            return None
        begin, end = span
        with key.lock:  # the key's buffer has one file position: moto reads under it too
            fields = dict(key.response_dict)  # its ETag is computed here if not yet
            key._value_buffer.seek(begin)
            data = key._value_buffer.read(end - begin + 1)
        fields.update(key.metadata)
        fields.update(
            {
                "Accept-Ranges": "bytes",
                "content-range": f"bytes {begin}-{end}/{key.size}",
                "content-length": str(len(data)),
                "x-amzn-requestid": secrets.token_hex(26),
                "Access-Control-Allow-Origin": "*",  # as moto's server adds to each answer
            }
        )
        if key.version_id != "null":
            fields["x-amz-version-id"] = key.version_id
        return 206, [(k, str(v)) for k, v in fields.items()], data


class _Counting:
    """WSGI layer in front of moto: per-client counts, the counters' page, and
    ranged GETs at the cost of the range (``_RangedGets``)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.ranged = _RangedGets()
        self.lock = threading.Lock()
        self.counts: dict[str, list[int]] = {}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == COUNTERS_PATH:
            with self.lock:
                body = {a: {"requests": r, "get_bytes": b} for a, (r, b) in self.counts.items()}
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        answer = self.ranged(environ)
        if answer is not None:
            status, headers, data = answer
            start_response(f"{status} {_REASONS[status]}", headers)
        else:
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


def _filesystem(endpoint: str) -> Any:
    import pyarrow.fs as pafs

    env = client_env()
    return pafs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=endpoint,
        scheme="http",
        region=REGION,
        force_virtual_addressing=False,
        allow_bucket_creation=True,
    )


def _upload(endpoint: str, bucket: str, objects: list[str]) -> None:
    import pyarrow.fs as pafs

    fs = _filesystem(endpoint)
    fs.create_dir(bucket)
    for item in objects:
        key, _, local = item.partition("=")
        began = time.monotonic()
        pafs.copy_files(local, f"{bucket}/{key}", destination_filesystem=fs)
        size = os.path.getsize(local)
        print(f"s3://{bucket}/{key}: {size} bytes in {time.monotonic() - began:.1f} s", flush=True)


def _download(endpoint: str, bucket: str, prefix: str, to: str) -> None:
    import pyarrow.fs as pafs

    fs = _filesystem(endpoint)
    base = f"{bucket}/{prefix.strip('/')}"
    selector = pafs.FileSelector(base, recursive=True)
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        local = os.path.join(to, info.path[len(base) + 1 :])
        os.makedirs(os.path.dirname(local), exist_ok=True)
        pafs.copy_files(info.path, local, source_filesystem=fs)
        print(f"s3://{info.path}: {info.size} bytes", flush=True)


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
    download = commands.add_parser("download", help="copy a prefix's objects to a directory")
    download.add_argument("--endpoint", required=True)
    download.add_argument("--bucket", required=True)
    download.add_argument("--prefix", required=True)
    download.add_argument("--to", required=True, help="the local directory")
    args = parser.parse_args(argv)
    if args.command == "serve":
        _serve(args.port, args.ready_file)
    elif args.command == "upload":
        _upload(args.endpoint, args.bucket, args.objects)
    else:
        _download(args.endpoint, args.bucket, args.prefix, args.to)


if __name__ == "__main__":
    main()
