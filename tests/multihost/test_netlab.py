"""The network lab's hosts and faults, with a plain TCP server (no mangonel)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_until
from net_support import require_lab

from mangonel.testing.netlab import Host, NetLab

PORT = 9000
SERVE = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 9000)); s.listen()
while True:
    c, _ = s.accept(); c.sendall(b"x" * 200_000); c.close()
"""
FETCH = """
import socket, sys, time
start = time.monotonic()
try:
    c = socket.create_connection((sys.argv[1], 9000), timeout=1.0); n = 0
    while (d := c.recv(65536)):
        n += len(d)
    print("ok", n, time.monotonic() - start)
except OSError as e:
    print("fail", type(e).__name__, time.monotonic() - start)
"""


@pytest.fixture(scope="module")
def lab(lab_root: Path) -> Iterator[NetLab]:
    require_lab()
    with NetLab(lab_root) as running:
        a, b = running.add_host("alpha"), running.add_host("beta")
        for host in (a, b):
            running.start(host, [sys.executable, "-c", SERVE, host.address])
        wait_until(lambda: _fetch(running, a, b)[0] == "ok", "beta serves")
        yield running


def _fetch(lab: NetLab, client: Host, server: Host) -> list[str]:
    return lab.run(client, [sys.executable, "-c", FETCH, server.address]).stdout.split()


def test_hosts_have_their_own_name_and_directory(lab: NetLab) -> None:
    a, b = lab.host("alpha"), lab.host("beta")
    (b.dir / "only-beta").write_text("b")
    assert lab.run(a, ["hostname"]).stdout.split() == ["alpha"]
    # alpha sees its own directory at /srv/mangonel, and nothing of the other hosts'
    assert lab.run(a, ["ls", "-A", "/srv/mangonel"]).stdout.split() == ["tmp"]
    assert lab.run(a, ["ls", "-A", str(lab.hosts_root)]).stdout.split() == []
    assert lab.run(b, ["cat", "/srv/mangonel/only-beta"]).stdout == "b"


@pytest.mark.parametrize("fault", ["cut", "link_down", "cut_between", "one_way"])
def test_a_fault_silences_the_link_until_healed(lab: NetLab, fault: str) -> None:
    a, b = lab.host("alpha"), lab.host("beta")
    before = lab.traffic(b, a)
    assert _fetch(lab, a, b)[:2] == ["ok", "200000"]
    assert lab.traffic(b, a) - before >= 200_000  # the switch counted the reply
    if fault == "cut":
        lab.cut(b)
    elif fault == "link_down":
        lab.link_down(b)
    elif fault == "cut_between":
        lab.cut_between(a, b)
    else:
        lab.cut_between(a, b, both=False)  # a's SYNs vanish: no connection either way
    try:
        # Silence, not a refusal: the connect waits out its whole timeout.
        assert _fetch(lab, a, b)[:2] == ["fail", "TimeoutError"]
    finally:
        lab.heal()
    assert _fetch(lab, a, b)[:2] == ["ok", "200000"]


def test_a_slow_link_is_slow(lab: NetLab) -> None:
    a, b = lab.host("alpha"), lab.host("beta")
    lab.slow(b, "1mbit")
    try:
        slow = _fetch(lab, a, b)
    finally:
        lab.heal(b)
    # 200 kB at 1 Mbit/s: over a second, less a 32 kB burst.
    assert slow[:2] == ["ok", "200000"] and float(slow[2]) > 1.0, slow
