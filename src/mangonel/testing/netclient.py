"""A client that lives on a lab host and runs a test's requests there.

A test process sits in the machine's own network namespace, which has no route
to a ``NetLab``'s hosts. So a test's client is this small server, started on the
client host (``python -m mangonel.testing.netclient``): it holds a ``Session``
with the scheduler, whose gRPC and Flight traffic crosses the lab's switch, and
answers requests on a Unix socket in its host's directory. File-system sockets
do not belong to a network namespace, so the test reaches it through the
socket's path as the test sees it (``ClientHost``).

Requests are ``(operation, *arguments)`` tuples, answered ``("ok", value)`` or
``("error", text)``, pickled by ``multiprocessing.connection`` with a key given
in ``NETCLIENT_KEY_ENV``. Each connection is served by a thread of its own, so
a test can wait for a query on one connection and ask for the status on another.
A query's answer is the whole ``Result`` with its Arrow table, and the client
host's clock when the last byte was read (``finished_at``: one machine, one
clock).
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
import traceback
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from mangonel.client.session import Result, Session
from mangonel.client.status import ClusterStatus
from mangonel.errors import ClusterError

NETCLIENT_KEY_ENV = "MANGONEL_NETCLIENT_KEY"
"""The authentication key of the socket (hex), given to both ends."""


@dataclass(frozen=True)
class Answer:
    """A query's result as the client host saw it."""

    result: Result
    started_at: float
    """``time.time()`` on the client host when the query was sent."""
    finished_at: float
    """``time.time()`` on the client host once the last byte was read."""

    @property
    def elapsed_s(self) -> float:
        """From the query sent to its last byte read, on the client host."""
        return self.finished_at - self.started_at


class ClientHost:
    """The test's side: one connection to the client host's server per request.

    Args:
        socket_path: The server's socket, as the test sees it.
        key: The authentication key (the server's ``NETCLIENT_KEY_ENV``).
    """

    def __init__(self, socket_path: str, key: bytes) -> None:
        self.socket_path = socket_path
        self._key = key

    def call(self, operation: str, *args: Any) -> Any:
        """Send one request and wait for its answer.

        Raises:
            ClusterError: the request failed on the client host (the text says why).
        """
        with Client(self.socket_path, family="AF_UNIX", authkey=self._key) as conn:
            conn.send((operation, *args))
            kind, value = conn.recv()
        if kind != "ok":
            raise ClusterError(f"{operation} on the client host failed:\n{value}")
        return value

    def ping(self) -> bool:
        return bool(self.call("ping"))

    def register_parquet(self, name: str, path: str) -> None:
        self.call("register_parquet", name, path)

    def sql(
        self,
        query: str,
        timeout_s: float | None = None,
        session: Mapping[str, Any] | None = None,
    ) -> Answer:
        """Run ``query`` on the client host.

        Args:
            query: The SQL text.
            timeout_s: The query's deadline (``Session.sql``'s ``timeout_s``).
            session: Options of a ``Session`` made for this query alone
                (``timeout_s``, ``reconnect_s``, ``keepalive_s``, ...); the
                connection's own session when ``None``.
        """
        answer: Answer = self.call("sql", query, timeout_s, dict(session or {}))
        return answer

    def explain(self, query: str) -> str:
        return str(self.call("explain", query))

    def status(self) -> ClusterStatus:
        status: ClusterStatus = self.call("status")
        return status

    def cancel(self, job_id: str) -> bool:
        """Cancel a job (``Session.cancel``); False when it had finished already."""
        return bool(self.call("cancel", job_id))

    def http_get(self, url: str) -> str:
        """GET ``url`` from the client host (the scheduler's REST API, ``/metrics``)."""
        return str(self.call("http_get", url))


class _Server:
    def __init__(self, scheduler: str) -> None:
        self.scheduler = scheduler
        self._local = threading.local()

    def session(self) -> Session:
        # One session per connection thread: a Session is not shared between
        # concurrent queries.
        session: Session | None = getattr(self._local, "session", None)
        if session is None:
            session = Session(self.scheduler)
            self._local.session = session
        return session

    def serve(self, conn: Connection) -> None:
        try:
            while True:
                try:
                    request = conn.recv()
                except EOFError:
                    return
                try:
                    conn.send(("ok", self.handle(*request)))
                except Exception:  # noqa: BLE001 - any failure goes back to the test
                    conn.send(("error", traceback.format_exc()))
        finally:
            conn.close()
            session = getattr(self._local, "session", None)
            if session is not None:
                session.close()

    def handle(self, operation: str, *args: Any) -> Any:
        if operation == "ping":
            return True
        if operation == "register_parquet":
            self.session().register_parquet(args[0], args[1])
            return None
        if operation == "sql":
            query, timeout_s, options = args
            started = time.time()
            if not options:
                result = self.session().sql(query, timeout_s=timeout_s)
                return Answer(result, started, time.time())
            with Session(self.scheduler, **options) as session:
                result = session.sql(query, timeout_s=timeout_s)
                finished = time.time()
            return Answer(result, started, finished)
        if operation == "explain":
            return self.session().explain(args[0])
        if operation == "status":
            return self.session().status()
        if operation == "cancel":
            return self.session().cancel(args[0])
        if operation == "http_get":
            # No proxy from the environment: the lab's hosts reach only each other.
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(args[0], timeout=30) as reply:
                return reply.read().decode()
        raise ValueError(f"unknown operation {operation!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mangonel.testing.netclient")
    parser.add_argument("--scheduler", required=True, help="host:port of the scheduler")
    parser.add_argument("--socket", required=True, help="the Unix socket to serve on")
    parser.add_argument("--log-level", default="info", help="of the session's log, on stderr")
    args = parser.parse_args(argv)
    # The session logs how it rode out a fault (a watch reconnected, a result
    # read again): the host's log is where a test looks for it.
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
    )
    key = bytes.fromhex(os.environ.pop(NETCLIENT_KEY_ENV))
    server = _Server(args.scheduler)
    with Listener(args.socket, family="AF_UNIX", authkey=key) as listener:
        print(f"netclient serving on {args.socket} for {args.scheduler}", flush=True)
        while True:
            conn = listener.accept()
            threading.Thread(target=server.serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    # Run the module's imported copy, not this __main__ one: answers must pickle
    # as mangonel.testing.netclient.Answer, which the test can unpickle.
    from mangonel.testing import netclient

    netclient.main()
