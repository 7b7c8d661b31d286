"""``mangonel demo --kill``: q12 at SF 0.1 with one executor SIGKILLed half-way.

The demo is what a newcomer runs to see recovery; it must keep telling the truth:
an executor really died at the fault rule's point, the scheduler wrote it off,
work was recomputed, and the answer is the fault-free one (exit code 0).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mangonel.client.demo import run_demo

pytestmark = pytest.mark.timeout(120)


def test_kill_demo_recovers_and_says_so(tpch_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(str(tpch_dir), executors=2, kill=True) == 0

    out = capsys.readouterr().out
    assert re.search(r"executor exec-\S+ \(pid \d+\) was SIGKILLed", out), out
    lost = re.search(r"the scheduler marked it lost (\d+) ms later: connection lost", out)
    assert lost is not None, out
    recomputed = re.search(r"(\d+) finished outputs lost and recomputed", out)
    assert recomputed is not None and int(recomputed.group(1)) > 0, out
    assert re.search(r"exec-\S+\s+pid \d+\s+lost \(connection lost", out), out
    assert "the answer matches the fault-free run: yes" in out
