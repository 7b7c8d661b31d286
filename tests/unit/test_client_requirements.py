"""The client alone: requirements-client.txt pins what pyproject.toml pins, and the
driver and dialect import nothing else of the server's dependencies.

The client installed into another tool's environment (``pip install --no-deps`` plus
requirements-client.txt, tests/superset) must import the same gRPC and protobuf that the
generated code under ``mangonel/proto`` was made with and the server runs.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def pins(lines: list[str]) -> dict[str, str]:
    found = {}
    for line in lines:
        if m := re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]]+?)(\[[^\]]*\])?\s*==\s*([^\s;#]+)\s*", line):
            found[m[1].lower()] = m[3]
    return found


def test_the_client_pins_the_servers_grpc_and_protobuf() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    server = pins(project["dependencies"])
    client_lines = (REPO / "requirements-client.txt").read_text().splitlines()
    client = pins([line for line in client_lines if not line.lstrip().startswith("#")])
    assert set(client) == {"grpcio", "protobuf"}
    for name, version in client.items():
        assert server[name] == version, f"{name}: client {version}, server {server[name]}"


SERVER_ONLY = (
    "sqlglot duckdb pandas cattrs fastapi uvicorn prometheus_client etcd3gw isal cryptography"
)


def test_the_driver_and_dialect_import_none_of_the_servers_other_packages() -> None:
    # What requirements-client.txt leaves out must not be imported by the client: in
    # Superset's environment those are older versions (sqlglot 28, pandas 2.1) or absent.
    code = (
        "import sys, mangonel.client.dbapi, mangonel.client.sqlalchemy_dialect\n"
        f"print(sorted(set({SERVER_ONLY.split()!r}) & {{m.split('.')[0] for m in sys.modules}}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
