"""``testing.throttle.CpuThrottle``: a real process held to a quarter of a CPU by a cgroup."""

from __future__ import annotations

import subprocess
import sys
import time

from helpers import require_host

from mangonel.testing.throttle import CpuThrottle, ThrottleError, cgroup_cpu_root


def _controller() -> None:
    try:
        cgroup_cpu_root()
    except ThrottleError as exc:
        require_host(str(exc), "a CPU cgroup controller")


def test_a_throttled_busy_process_is_held_to_its_quota() -> None:
    _controller()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with CpuThrottle("test", cpus=0.25) as slow:
            slow.add(busy.pid)
            assert str(busy.pid) in (slow.path / "cgroup.procs").read_text().split()
            if slow.version == 1:
                assert (slow.path / "cpu.cfs_quota_us").read_text().strip() == "25000"
            else:
                assert (slow.path / "cpu.max").read_text().split() == ["25000", "100000"]
            time.sleep(0.6)  # a few 100 ms periods of a loop that wants the whole CPU
            stat = dict(line.split() for line in (slow.path / "cpu.stat").read_text().splitlines())
            assert int(stat["nr_throttled"]) > 0, stat
            path = slow.path
        assert not path.exists()  # released and removed
    finally:
        busy.kill()
        busy.wait()
