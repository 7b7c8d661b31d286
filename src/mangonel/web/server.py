"""Serve the web app from a thread of the scheduler process.

The scheduler is a threaded gRPC server; the web app runs beside it on its own
port, in one thread with its own event loop (uvicorn), and reads the same
``SchedulerCore``. Uvicorn installs no signal handlers outside the main
thread, so the scheduler keeps its own SIGTERM handling.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import uvicorn

from mangonel import defaults
from mangonel.errors import ClusterError
from mangonel.scheduler.core import SchedulerCore
from mangonel.security import tls
from mangonel.security.auth import OPEN, Authenticator
from mangonel.security.options import SecurityOptions
from mangonel.web.app import create_app

log = logging.getLogger(__name__)

DEFAULT_WEB_PORT = defaults.WEB_PORT
"""The web UI's port for ``mangonel scheduler`` and ``standalone`` (``defaults.WEB_PORT``)."""


class WebServer:
    """A running web server: its URL, and ``stop()``."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, url: str) -> None:
        self._server = server
        self._thread = thread
        self.url = url

    def reload_tls(self, security: SecurityOptions) -> None:
        """Serve the certificate and key of ``security``'s files to the connections
        that follow (those open keep theirs): the ``ssl.SSLContext`` uvicorn made
        at start loads them, replacing the pair it had."""
        context = self._server.config.ssl
        if context is not None and security.tls_cert and security.tls_key:
            context.load_cert_chain(security.tls_cert, security.tls_key)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)


def start_web_server(
    core: SchedulerCore,
    host: str,
    port: int,
    scheduler_address: str = "",
    security: SecurityOptions | None = None,
    authenticator: Authenticator = OPEN,
) -> WebServer:
    """Bind ``host:port`` (0 picks a free port) and serve the app in a daemon thread.

    With TLS in ``security`` it serves HTTPS with the scheduler's certificate
    (browsers are not asked for one of theirs) and refuses plain HTTP.
    ``authenticator`` goes to the app (``create_app``), which shows "insecure"
    in its header without TLS.

    Raises:
        ClusterError: the port cannot be bound.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ClusterError(
            f"the web UI cannot listen on {host}:{port} ({exc.strerror}); pick another "
            "port with --web-port, or turn it off with --web-port -1"
        ) from exc
    sock.listen(128)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(core, scheduler_address, authenticator, security is not None and security.tls),
        log_level="warning",
        access_log=False,
        lifespan="off",
        **tls.uvicorn_ssl_kwargs(security),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="web", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise ClusterError(f"the web UI did not start on {host}:{bound}")
        time.sleep(0.01)
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    scheme = "https" if security is not None and security.tls else "http"
    url = f"{scheme}://{shown}:{bound}"
    log.info("web UI at %s", url)
    return WebServer(server, thread, url)
