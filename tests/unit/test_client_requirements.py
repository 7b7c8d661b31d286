"""requirements-client.txt pins what pyproject.toml pins: one version of each package.

The client installed into another tool's environment (``pip install --no-deps`` plus
requirements-client.txt, tests/superset) must import the same gRPC and protobuf that the
generated code under ``mangonel/proto`` was made with and the server runs.
"""

from __future__ import annotations

import re
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
