"""The container image, deploy/compose.yaml and the Kubernetes manifests in deploy/ run
real commands.

No Kubernetes runs where this project is tested, so this checks what can be checked
without it: the image's entry point is the ``mangonel`` command, and every mangonel
container's command line in the manifests and in compose.yaml parses with mangonel's
own CLI parser (an option renamed or removed fails here, not in a cluster). The same
``mangonel scheduler`` / ``mangonel executor`` commands run on separate hosts in
tests/multihost; tests/containers builds the image and runs compose.yaml's cluster.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from mangonel.client.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))


def _mangonel_containers() -> list[tuple[str, dict[str, object]]]:
    found = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                if str(container.get("image", "")).startswith("mangonel"):
                    found.append((f"{path.name}:{container['name']}", container))
    return found


def test_the_image_runs_the_mangonel_command() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    entry = re.search(r"^ENTRYPOINT (.+)$", text, re.M)
    assert entry is not None and json.loads(entry.group(1)) == ["mangonel"]
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["mangonel"] == "mangonel.client.cli:main"
    assert project["requires-python"].startswith(">=3.11")
    assert "FROM python:3.11" in text


def test_the_manifests_name_a_scheduler_and_executors() -> None:
    commands = {c["args"][0] for _, c in _mangonel_containers()}  # type: ignore[index]
    assert commands == {"scheduler", "executor"}


@pytest.mark.parametrize(
    "container", [pytest.param(c, id=name) for name, c in _mangonel_containers()]
)
def test_each_containers_command_parses_with_the_cli(container: dict[str, object]) -> None:
    env = {"POD_NAME": "executor-0"}  # Kubernetes expands $(VAR) from the container's env
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]  # type: ignore[attr-defined]
    parsed = build_parser().parse_args(args)
    assert parsed.command == args[0]
    # Secured as `mangonel certs init DIR` lays it out: the members get DIR/cluster.
    assert parsed.tls_dir == "/etc/mangonel/tls"
    if args[0] == "executor":
        # Peers and clients reach it at its pod's name, which the certificate's
        # wildcard covers ('*.executor.mangonel.svc.cluster.local'), not the
        # wildcard address it binds.
        assert parsed.bind_host == "0.0.0.0"
        assert parsed.advertise_host == "executor-0.executor.mangonel.svc.cluster.local"
        # Both schedulers of the pair, whichever leads, at their cluster port.
        assert parsed.scheduler == "scheduler-0.scheduler:50052,scheduler-1.scheduler:50052"
    else:
        assert parsed.state.startswith("etcd://")
        assert parsed.cluster_port == 50052 and parsed.users_file


def _compose_services() -> dict[str, dict[str, object]]:
    spec = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return {
        name: service
        for name, service in spec["services"].items()
        if "mangonel" in str(service.get("image", ""))
    }


def test_compose_runs_a_scheduler_on_etcd_and_two_executors() -> None:
    services = _compose_services()
    assert sorted(services) == ["executor-1", "executor-2", "scheduler"]
    for name, service in services.items():
        args = service["command"]
        assert isinstance(args, list)
        parsed = build_parser().parse_args(args)
        assert "healthcheck" in service, name
        if args[0] == "executor":
            # Peers and clients reach it by its service name on the compose network.
            assert parsed.bind_host == "0.0.0.0" and parsed.advertise_host == name
            assert parsed.scheduler == "scheduler:50050"
        else:
            assert parsed.state == "etcd://etcd:2379/mangonel/"
            # Deposed (status 3), it must be started again: nothing else leads.
            assert service.get("restart") == "on-failure"
