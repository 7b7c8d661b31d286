"""A real S3 server for tests: moto's, in this process, with faults and a request log.

``S3TestServer`` serves moto's S3 (and IAM) on 127.0.0.1 on a free port. Its
state lives in this process, so ``stop()`` then ``start()`` on the same port
brings back the same buckets (a store that went away and came back). Faults:

* ``pause()``: every request waits until ``resume()`` (a store that hangs:
  clients meet their timeouts);
* ``fail_next(n)``: the next ``n`` requests get ``503 Slow Down`` (a store that
  fails for a moment);
* ``stop()``: the port is closed (connection refused) until ``start()``;
* ``denied(bucket, prefix)``: a context in which the store refuses the user of
  ``enable_auth`` every request for the objects under ``prefix`` (403 Access
  Denied), as a bucket policy that changed would.

``requests`` logs every request (method, path, Range header, bytes sent back),
so a test or a benchmark counts what clients fetched from the store.

``enable_auth()`` makes the server check credentials (moto's IAM): it creates a
user allowed everything and returns its access key; requests signed with
anything else are refused. moto keeps its buckets, users and that setting per
process: ``reset()`` forgets them (a second server in the process needs it).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import requests
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server

REGION = "us-east-1"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None
    status: int
    sent: int
    """Bytes of the response body."""


class _Faulty:
    """WSGI middleware: the request log, pauses and injected 503s."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.log: list[Request] = []
        self.running = threading.Event()
        self.running.set()
        self.failures = 0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        self.running.wait()
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        with self.lock:
            fail = self.failures > 0 and not path.startswith("/moto-api")
            if fail:
                self.failures -= 1
        if fail:
            body = (
                b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                b"<Message>Please reduce your request rate.</Message></Error>"
            )
            start_response("503 Slow Down", [("Content-Type", "application/xml")])
            self._record(method, path, environ.get("HTTP_RANGE"), 503, 0)
            return [body]
        status: list[int] = []

        def record_status(code: str, headers: Any, *args: Any) -> Any:
            status.append(int(code.split()[0]))
            return start_response(code, headers, *args)

        data = b"".join(self.app(environ, record_status))
        self._record(method, path, environ.get("HTTP_RANGE"), status[0] if status else 0, len(data))
        return [data]

    def _record(self, method: str, path: str, rng: str | None, status: int, sent: int) -> None:
        with self.lock:
            self.log.append(Request(method, path, rng, status, sent))


class S3TestServer:
    """moto's S3 on 127.0.0.1 (see the module docstring)."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._app = _Faulty(DomainDispatcherApplication(create_backend_app))
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.access_key = "testing"
        self.secret_key = "testing"

    # ------------------------------------------------------------- life cycle

    def start(self) -> S3TestServer:
        deadline = time.monotonic() + 10
        while True:
            try:
                self._server = make_server(
                    "127.0.0.1", self.port, self._app, True, request_handler=MotoRequestHandler
                )
                break
            except OSError:  # the old socket of a restart may linger a moment
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the port: clients get connection refused (buckets are kept)."""
        self._app.running.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ----------------------------------------------------------------- faults

    def pause(self) -> None:
        self._app.running.clear()

    def resume(self) -> None:
        self._app.running.set()

    def fail_next(self, count: int) -> None:
        with self._app.lock:
            self._app.failures = count

    # -------------------------------------------------------------- the log

    @property
    def requests(self) -> list[Request]:
        with self._app.lock:
            return list(self._app.log)

    def clear_log(self) -> None:
        with self._app.lock:
            self._app.log.clear()

    def bytes_sent(self, since: int = 0) -> int:
        """Bytes of object data sent back by GETs (log entries from ``since`` on)."""
        return sum(r.sent for r in self.requests[since:] if r.method == "GET" and r.range)

    # ---------------------------------------------------------------- access

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def reset(self) -> None:
        """Forget every bucket, user and the credential checks (moto keeps them per
        process, not per server: a second server in this process starts with them)."""
        for path, data in (("/moto-api/reset-auth", b"inf"), ("/moto-api/reset", b"")):
            requests.post(f"{self.url}{path}", data=data, timeout=10).raise_for_status()
        self.access_key = self.secret_key = "testing"

    def enable_auth(self) -> tuple[str, str]:
        """Check credentials from now on; return the (access key, secret) allowed everything."""
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        iam.create_user(UserName="mangonel")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        iam.put_user_policy(
            UserName="mangonel", PolicyName="everything", PolicyDocument=json.dumps(policy)
        )
        key = iam.create_access_key(UserName="mangonel")["AccessKey"]
        requests.post(f"{self.url}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        return self.access_key, self.secret_key

    @contextlib.contextmanager
    def denied(self, bucket: str, prefix: str) -> Iterator[None]:
        """Refuse the ``enable_auth`` user the objects under ``bucket/prefix`` within."""
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Deny", "Action": "s3:*", "Resource": f"arn:aws:s3:::{bucket}/{prefix}*"}
            ],
        }
        iam.put_user_policy(
            UserName="mangonel", PolicyName="denied", PolicyDocument=json.dumps(policy)
        )
        try:
            yield
        finally:
            iam.delete_user_policy(UserName="mangonel", PolicyName="denied")

    def env(self) -> dict[str, str]:
        """The environment of a process that may read this store (no endpoint: an option)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            # Nothing of the developer's own AWS setup, and no EC2 metadata lookups.
            "AWS_CONFIG_FILE": "/nonexistent/mangonel-test-aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/mangonel-test-aws-credentials",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
