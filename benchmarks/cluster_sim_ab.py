"""The whole-cluster simulation's speed: two source trees side by side, every check on.

Runs the same seeds of ``mangonel.testing.cluster_sim`` on this checkout (``A``)
and on ``--base-src`` (``B``, e.g. ``git archive <commit> src | tar -x -C
/tmp/base``), each batch in a fresh process, A and B alternately (A first in
odd rounds, B first in even ones) so that both see the same load on a shared
machine. Per batch: the CPU seconds of the runs alone (``time.process_time``,
imports excluded), simulated jobs ended, steps, and a digest of every seed's
outcome (its summary and its fault schedule). The two trees must give the
same digests (a run is a pure function of seed and configuration) unless a
behaviour was changed on purpose; the rates are reported as jobs per CPU
second and as the ratio A / B, the median over rounds.

Usage::

    .venv/bin/python benchmarks/cluster_sim_ab.py --base-src /tmp/base/src \\
        [--seeds 0:20] [--rounds 3] [--set jobs=20 --set concurrent=3] [--json out.json]

``--set faults=cut,freeze,...`` names the fault kinds (by their values): the
kinds both trees know, when one tree added kinds (the default is every kind).

Not a test: timings belong here (``BENCHMARKS.md``, "The whole-cluster simulation").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import hashlib, json, sys, time
from dataclasses import fields, replace
from mangonel.testing.cluster_sim import Fault, SimConfig, run

first, end, sets = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
base = SimConfig()
types = {f.name: type(getattr(base, f.name)) for f in fields(SimConfig)}
types["faults"] = lambda names: tuple(Fault(n) for n in names.split(","))
base = replace(base, **{k: types[k](v) for k, v in sets.items()})
digest = hashlib.sha256()
jobs = steps = violations = 0
started = time.process_time()
for seed in range(first, end):
    result = run(replace(base, seed=seed))
    out = result.summary()
    out["schedule"] = result.schedule
    digest.update(json.dumps(out, sort_keys=True).encode())
    jobs += result.jobs_ended
    steps += result.steps
    violations += result.violation is not None
cpu = time.process_time() - started
print(json.dumps({"cpu_s": cpu, "jobs": jobs, "steps": steps, "violations": violations,
                  "digest": digest.hexdigest()[:16]}))
"""


def batch(src: str, first: int, end: int, sets: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src, "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(first), str(end), json.dumps(sets)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-src", required=True, help="the src/ folder of tree B")
    parser.add_argument("--seeds", default="0:20", help="first:end (end excluded)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a SimConfig field"
    )
    parser.add_argument("--json", default="", help="write the rounds and the summary here")
    args = parser.parse_args(argv)
    first, end = (int(x) for x in args.seeds.split(":"))
    sets = dict(item.partition("=")[::2] for item in args.set)
    trees = {"A": str(REPO_ROOT / "src"), "B": args.base_src}
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.rounds):
        order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
        got = {name: batch(trees[name], first, end, sets) for name in order}
        rounds.append(got)
        a, b = got["A"], got["B"]
        print(
            f"round {r + 1}: A {a['jobs'] / a['cpu_s']:.1f} jobs/s ({a['cpu_s']:.2f} s)  "
            f"B {b['jobs'] / b['cpu_s']:.1f} jobs/s ({b['cpu_s']:.2f} s)  "
            f"A/B {b['cpu_s'] / a['cpu_s']:.2f}  digests {a['digest']} {b['digest']}",
            flush=True,
        )
    same = all(g["A"]["digest"] == g["B"]["digest"] for g in rounds)
    summary = {
        "seeds": args.seeds,
        "set": sets,
        "jobs": rounds[0]["A"]["jobs"],
        "steps": rounds[0]["A"]["steps"],
        "violations": {k: rounds[0][k]["violations"] for k in "AB"},
        "jobs_per_cpu_s": {
            k: round(statistics.median(g[k]["jobs"] / g[k]["cpu_s"] for g in rounds), 1)
            for k in "AB"
        },
        "ratio_a_over_b": round(
            statistics.median(g["B"]["cpu_s"] / g["A"]["cpu_s"] for g in rounds), 2
        ),
        "same_outcomes": same,
        "digests": {k: rounds[0][k]["digest"] for k in "AB"},
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
