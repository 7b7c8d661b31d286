"""A real Apache Superset for the tests: started from its own virtualenv, driven by its REST API.

``start_superset`` writes a ``superset_config.py`` (metadata in SQLite under the test's
directory), runs ``superset db upgrade``, ``fab create-admin`` and ``init``, and starts
gunicorn on a free port. ``SupersetApi`` logs in as that admin (a JWT, then the CSRF
token Superset asks of every write) and calls the API with the standard library alone.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADMIN = ("admin", "superset-test-password")

CONFIG = """\
SECRET_KEY = {secret!r}
SQLALCHEMY_DATABASE_URI = "sqlite:///{db}"
# Results of SQL Lab and charts are not cached between tests (a stale cache would
# answer instead of the cluster).
DATA_CACHE_CONFIG = {{"CACHE_TYPE": "NullCache"}}
"""


class SupersetError(AssertionError):
    """A Superset API call answered with an error status."""


@dataclass
class Superset:
    url: str
    venv: Path
    home: Path
    log: Path
    process: subprocess.Popen[bytes]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _environment(venv: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
        SUPERSET_CONFIG_PATH=str(home / "superset_config.py"),
        SUPERSET_HOME=str(home),
        FLASK_APP="superset",
    )
    return env


@contextlib.contextmanager
def start_superset(venv: Path, home: Path, timeout_s: float = 180.0) -> Iterator[Superset]:
    """Superset set up afresh in ``home`` and served on localhost; stopped on exit."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "superset_config.py").write_text(
        CONFIG.format(secret=os.urandom(24).hex(), db=home / "superset.db")
    )
    env = _environment(venv, home)
    log = home / "superset.log"
    superset = str(venv / "bin" / "superset")
    user, password = ADMIN
    with open(log, "ab") as out:
        for args in (
            ["db", "upgrade"],
            ["fab", "create-admin", "--username", user, "--password", password]
            + ["--firstname", "Ada", "--lastname", "Admin", "--email", "admin@example.com"],
            ["init"],
        ):
            step = subprocess.run(
                [superset, *args], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600
            )
            if step.returncode != 0:
                raise AssertionError(f"superset {' '.join(args)} failed: see {log}")
        port = free_port()
        process = subprocess.Popen(
            [str(venv / "bin" / "gunicorn"), "--workers=1", "--threads=4", "--timeout=300"]
            + [f"--bind=127.0.0.1:{port}", "superset.app:create_app()"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise AssertionError(f"Superset exited ({process.returncode}): see {log}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"Superset did not answer /health in {timeout_s} s: {log}")
            time.sleep(0.5)
        yield Superset(url, venv, home, log, process)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


class SupersetApi:
    """Superset's REST API as its admin."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        self._headers: dict[str, str] = {"Content-Type": "application/json"}
        user, password = ADMIN
        login = self.post(
            "/api/v1/security/login",
            {"username": user, "password": password, "provider": "db", "refresh": False},
        )
        self._headers["Authorization"] = f"Bearer {login['access_token']}"
        csrf = self.get("/api/v1/security/csrf_token/")["result"]
        self._headers.update({"X-CSRFToken": csrf, "Referer": url})

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers=self._headers
        )
        try:
            with self._opener.open(request, timeout=300) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as err:
            raise SupersetError(
                f"{method} {path} answered {err.code}: {err.read().decode()[:2000]}"
            ) from None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)
