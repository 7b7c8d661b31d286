"""What a link probe costs, and how far a healthy link's probes stay from "slow".

An executor's Flight server (``executor.flight``) and a ``LinkProber``
(``executor.probes``) in this process, over loopback, with and without TLS
and signed probe tickets (a cluster CA and secret made for the run). For
``--probes`` probes of ``defaults.LINK_PROBE_BYTES`` each, one after the other:

* wall time and this process's CPU time per probe (server and prober together:
  an upper bound of what one probe costs the two executors), and what that is
  per executor at the default interval (``LINK_PROBE_PEERS`` probes every
  ``LINK_PROBE_INTERVAL_S``, and as many served);
* the probes' timed seconds (``LinkSample.busy_s``: the median gap between
  batches times their number) at the median, 99th percentile and maximum,
  against ``state_links.PROBE_MIN_S``, below which no probe can find a link
  slow: the margin a healthy link keeps on this machine, at its present load
  (``uptime`` is printed). With ``--busy N``, N processes spin on the CPU
  meanwhile (a busy CPU: the false mark to fear), at this process's own
  priority or, run under ``nice``, ahead of it.

Usage::

    .venv/bin/python benchmarks/link_probes.py [--probes 300] [--busy 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mangonel import defaults
from mangonel.executor.flight import ShuffleFlightServer
from mangonel.executor.probes import LinkProber
from mangonel.executor.shuffle_write import OutputRegistry
from mangonel.ids import ExecutorId
from mangonel.scheduler.state_links import PROBE_MIN_S
from mangonel.security.certs import init_cluster
from mangonel.security.options import SecurityOptions
from mangonel.security.tickets import TicketSigner
from mangonel.security.tls import TlsMaterial
from mangonel.task import ProbeTarget


def measure(root: Path, probes: int, secure: bool) -> dict[str, Any]:
    material: TlsMaterial | None = None
    signer: TicketSigner | None = None
    if secure:
        init_cluster(str(root / "tls"))
        options = SecurityOptions.from_tls_dir(str(root / "tls"), "node")
        material = TlsMaterial.load(options)
        secret = options.cluster_secret()
        assert secret is not None
        signer = TicketSigner(secret)
    (root / "peer").mkdir()
    server = ShuffleFlightServer(
        str(root / "peer"), OutputRegistry(), tls_material=material, signer=signer
    )
    prober = LinkProber(tls_material=material, signer=signer)
    target = ProbeTarget(ExecutorId("peer"), f"127.0.0.1:{server.port}")
    try:
        for _ in range(5):  # connect, warm up
            prober.probe(target)
        busy: list[float] = []
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(probes):
            sample = prober.probe(target)
            if sample is None:
                raise AssertionError("a probe over loopback failed")
            busy.append(sample.busy_s)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finally:
        prober.close()
        server.shutdown()
    busy.sort()
    per_interval = 2 * defaults.LINK_PROBE_PEERS  # probes made and served per executor
    cpu_ms = 1000 * cpu / probes
    return {
        "tls": secure,
        "probes": probes,
        "wall_ms_per_probe": 1000 * wall / probes,
        "cpu_ms_per_probe": cpu_ms,
        "cpu_share_per_executor": cpu_ms * per_interval / (1000 * defaults.LINK_PROBE_INTERVAL_S),
        "timed_ms_median": 1000 * statistics.median(busy),
        "timed_ms_p99": 1000 * busy[min(len(busy) - 1, int(0.99 * len(busy)))],
        "timed_ms_max": 1000 * busy[-1],
        "probe_min_ms": 1000 * PROBE_MIN_S,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--probes", type=int, default=300, help="probes per case (300)")
    parser.add_argument(
        "--busy", type=int, default=0, help="processes spinning on the CPU meanwhile (0)"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    spin = [sys.executable, "-c", "while True: pass"]
    hogs = [subprocess.Popen(spin) for _ in range(args.busy)]
    try:
        for secure in (False, True):
            with tempfile.TemporaryDirectory(prefix="mangonel-probes-") as tmp:
                rows.append(measure(Path(tmp), args.probes, secure))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    load_after = os.getloadavg()
    print(
        f"{defaults.LINK_PROBE_BYTES // 1024} KiB probes over loopback, "
        f"{args.probes} per case, {args.busy} process(es) spinning; "
        f"load average before {load_before}, after {load_after}"
    )
    print(
        "| TLS | wall per probe | CPU per probe (both ends) | CPU share per executor "
        f"at {defaults.LINK_PROBE_INTERVAL_S:g} s | timed: median | p99 | max | slow needs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {'on' if r['tls'] else 'off'} | {r['wall_ms_per_probe']:.2f} ms "
            f"| {r['cpu_ms_per_probe']:.2f} ms | {100 * r['cpu_share_per_executor']:.2f} % "
            f"| {r['timed_ms_median']:.2f} ms | {r['timed_ms_p99']:.2f} ms "
            f"| {r['timed_ms_max']:.2f} ms | {r['probe_min_ms']:.0f} ms |"
        )
    if args.json:
        out = {
            "busy": args.busy,
            "load_before": load_before,
            "load_after": load_after,
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
