"""A real, single-member etcd server for tests: ``EtcdServer``.

The etcd state store and the highly available scheduler pair are tested against
the real thing, not a fake: ``EtcdServer`` starts Debian's ``etcd`` binary as a
child process on free loopback ports with its data in a directory of its own,
waits until it answers, and stops it. ``stop`` and ``kill`` end it (``kill`` is
``SIGKILL``, as a crash); ``start`` brings it back on the same ports and data,
so a test can take etcd away and return it; ``close`` (or leaving the ``with``
block) stops it for good and removes its data. The data lives in a temporary
directory (etcd preallocates 64 MB of log, too much to keep per test); its log,
``etcd.log``, goes to the work directory given, which stays.

>>> with EtcdServer() as etcd:                        # doctest: +SKIP
...     store = open_store(etcd.url("/mangonel/test/"))

With ``tls_dir`` (a directory of ``mangonel certs init``) it serves HTTPS with
the node certificate and, without ``user``, demands a client certificate of that
CA; with ``user`` and ``password`` it turns on etcd's own authentication (a root
user) once started. (Not both: etcd refuses requests that come through its JSON
gateway with a named client certificate once authentication is on.) ``url``
then carries the options the state store needs.

The binary comes from Debian's ``etcd-server`` package, which
``scripts/install-system-deps.sh`` installs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from mangonel.client.cluster import stable_port
from mangonel.security.options import role_dir

_START_TIMEOUT_S = 20.0
_START_ATTEMPTS = 3  # a free port may be taken by someone else before etcd binds it


class EtcdServer:
    """One etcd member on ``127.0.0.1``, started by ``start`` or ``with``.

    Args:
        work_dir: Where ``etcd.log`` goes; the temporary data directory when ``None``.
        max_txn_ops: etcd's ``--max-txn-ops`` (etcd's default 128).
        max_request_bytes: etcd's ``--max-request-bytes`` (etcd's default 1.5 MiB).
        binary: The etcd executable; ``etcd`` on ``PATH`` when ``None``.
        tls_dir: Serve HTTPS with this ``mangonel certs init`` directory's node
            certificate, and (without ``user``) demand client certificates of its CA.
        user: Turn on etcd's authentication with this root user ...
        password: ... and password (its file is ``work_dir/etcd-password``).
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str] | None = None,
        *,
        max_txn_ops: int = 128,
        max_request_bytes: int = 1_572_864,
        binary: str | None = None,
        tls_dir: str | os.PathLike[str] | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        found = binary or shutil.which("etcd")
        if found is None:
            raise RuntimeError(
                "no etcd server on PATH: the etcd state store is tested against a real one. "
                "Install it with scripts/install-system-deps.sh (Debian's etcd-server package)"
            )
        self.binary = found
        self.data_dir = Path(tempfile.mkdtemp(prefix="mangonel-etcd-"))
        self.log_path = Path(work_dir or self.data_dir) / "etcd.log"
        self.max_txn_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes
        self.client_port = 0
        self.peer_port = 0
        # The members' files (``cluster/`` of a ``certs init`` directory).
        self.tls_dir = Path(role_dir(str(tls_dir), "node")) if tls_dir is not None else None
        self.user = user
        self.password = password
        self.password_file = self.log_path.parent / "etcd-password"
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = False

    # ------------------------------------------------------------- addresses

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``, where clients reach it."""
        if not self.client_port:
            raise RuntimeError("the etcd server was never started")
        return f"127.0.0.1:{self.client_port}"

    def url(self, prefix: str = "/mangonel/default/") -> str:
        """A state-store URL for this server: ``etcd://127.0.0.1:PORT/prefix[?options]``."""
        options = []
        if self.tls_dir is not None:
            options.append(f"tls_ca={self.tls_dir / 'ca.pem'}")
            if self.user is None:
                options += [
                    f"tls_cert={self.tls_dir / 'node.pem'}",
                    f"tls_key={self.tls_dir / 'node-key.pem'}",
                ]
        if self.user is not None:
            options += [f"user={self.user}", f"password_file={self.password_file}"]
        query = "?" + "&".join(options) if options else ""
        return f"etcd://{self.endpoint}/{prefix.strip('/')}/{query}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls_dir is not None else "http"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    # ------------------------------------------------------------ life cycle

    def start(self) -> EtcdServer:
        """Start the server (again, on the same ports and data) and wait until it answers."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        error = ""
        # A restart keeps its ports (clients hold the URL); only a first start that
        # lost a race for its free ports tries others.
        attempts = 1 if self._started else _START_ATTEMPTS
        for _ in range(attempts):
            if not self._started:
                self.client_port, self.peer_port = stable_port(), stable_port()
            error = self._start_once()
            if not error:
                if not self._started and self.user is not None:
                    self._enable_auth()
                self._started = True
                return self
        raise RuntimeError(f"etcd did not start ({self.binary}, data in {self.data_dir}): {error}")

    def stop(self) -> None:
        """Stop the server (``SIGTERM``, then ``SIGKILL``); its data stays for ``start``."""
        self._end(signal.SIGTERM)

    def close(self) -> None:
        """Stop the server for good and remove its data."""
        self._end(signal.SIGTERM)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """End the server at once (``SIGKILL``), as a crash; its data stays for ``start``."""
        self._end(signal.SIGKILL)

    def pause(self) -> None:
        """Freeze the server (``SIGSTOP``): it holds its sockets but answers nothing."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server run on (``SIGCONT``)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --------------------------------------------------------------- private

    def _start_once(self) -> str:
        client = f"{self.scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            self.binary,
            "--name=mangonel-test",
            f"--data-dir={self.data_dir / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=mangonel-test={peer}",
            f"--max-txn-ops={self.max_txn_ops}",
            f"--max-request-bytes={self.max_request_bytes}",
            "--logger=zap",
            "--log-level=warn",
        ]
        if self.tls_dir is not None:
            args += [
                f"--cert-file={self.tls_dir / 'node.pem'}",
                f"--key-file={self.tls_dir / 'node-key.pem'}",
            ]
            if self.user is None:  # a trusted CA makes etcd demand client certificates
                args += [f"--trusted-ca-file={self.tls_dir / 'ca.pem'}", "--client-cert-auth"]
        log_path = self.log_path
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                return f"it exited at start; the end of {log_path}:\n{_tail(log_path)}"
            if self._healthy():
                return ""
            time.sleep(0.05)
        self._end(signal.SIGKILL)
        return f"no answer within {_START_TIMEOUT_S:.0f} s; the end of {log_path}:\n" + _tail(
            log_path
        )

    def _context(self) -> ssl.SSLContext | None:
        if self.tls_dir is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls_dir / "ca.pem"))
        context.load_cert_chain(self.tls_dir / "node.pem", self.tls_dir / "node-key.pem")
        return context

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.scheme}://{self.endpoint}/health", timeout=1, context=self._context()
            ) as resp:
                return bool(json.load(resp).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _post(self, path: str, body: dict[str, str], token: str | None = None) -> None:
        request = urllib.request.Request(
            f"{self.scheme}://{self.endpoint}/v3/{path}",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                **({"Authorization": token} if token else {}),
            },
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5, context=self._context()) as resp:
            resp.read()

    def _enable_auth(self) -> None:
        """A root user with ``password``, then authentication on (``etcdctl auth enable``)."""
        assert self.user is not None and self.password is not None
        self.password_file.parent.mkdir(parents=True, exist_ok=True)
        self.password_file.write_text(self.password)
        self._post("auth/user/add", {"name": self.user, "password": self.password})
        self._post("auth/user/grant", {"user": self.user, "role": "root"})
        self._post("auth/enable", {})

    def _end(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
            proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read it: {exc})"
