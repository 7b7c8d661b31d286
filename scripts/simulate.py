"""Run many seeds of the whole-cluster simulation on all cores, with a summary.

    python scripts/simulate.py --seeds 0:10000              # every core
    nice -n 19 python scripts/simulate.py --seeds 0:500 --processes 1 --jobs 20
    python scripts/simulate.py --seeds 0:200 --set faults=clock-step,clock-drift,cut

Each seed is one run of ``mangonel.testing.cluster_sim`` (a pure function of
the seed and the options); a line of progress shows seeds done, steps per
second, jobs and violations. At the end: the totals (seeds, steps, scheduler
events, jobs by outcome, faults injected by kind) as JSON (also written to
``--out``), and for each failing seed the one command that replays it.
Exits 1 when any seed broke an invariant.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections import Counter
from dataclasses import fields, replace
from typing import Any

from mangonel.testing.cluster_sim import Fault, SimConfig, run


def _one(args: tuple[SimConfig, int]) -> dict[str, Any]:
    base, seed = args
    config = replace(base, seed=seed)
    result = run(config)
    out = result.summary()
    out["command"] = config.command() if result.violation else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0:100", help="first:end (end excluded)")
    parser.add_argument("--processes", type=int, default=multiprocessing.cpu_count())
    parser.add_argument("--jobs", type=int, default=SimConfig.jobs, help="jobs per seed")
    parser.add_argument("--executors", type=int, default=SimConfig.executors)
    parser.add_argument(
        "--check-restore",
        type=int,
        default=1,
        help="1: check after every persisted event that the store restores into the "
        "live state (the costly check); 0: skip it (restarts still run from the store)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other SimConfig field, e.g. --set tasks=20 --set fault_every_s=1.5; "
        "faults=KIND,KIND,... for the fault kinds (Fault values)",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="stop after this long (wall clock) and summarise the seeds done; 0: no bound",
    )
    parser.add_argument("--out", default="", help="write the summary here as JSON")
    args = parser.parse_args(argv)
    first, end = (int(x) for x in args.seeds.split(":"))
    base = SimConfig(
        jobs=args.jobs,
        concurrent=max(1, min(3, args.jobs)),
        executors=args.executors,
        check_restore=bool(args.check_restore),
    )
    types = {f.name: type(getattr(base, f.name)) for f in fields(SimConfig)}
    for item in args.set:
        name, _, value = item.partition("=")
        if name == "faults":
            try:
                kinds = tuple(Fault(k) for k in value.split(",") if k)
            except ValueError as exc:
                known = ",".join(k.value for k in Fault)
                parser.error(f"--set {item}: {exc}; the kinds are {known}")
            base = replace(base, faults=kinds)
            continue
        if name not in types or name == "skip":
            parser.error(f"--set {item}: not a SimConfig field of a plain type")
        base = replace(base, **{name: types[name](value)})
    totals: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    started = time.perf_counter()
    work = [(base, seed) for seed in range(first, end)]
    with multiprocessing.Pool(args.processes) as pool:
        for done, out in enumerate(pool.imap_unordered(_one, work, chunksize=4), 1):
            totals["seeds"] += 1
            totals["steps"] += out["steps"]
            totals["scheduler_events"] += out["scheduler_events"]
            for kind in ("succeeded", "failed", "cancelled"):
                totals[f"jobs_{kind}"] += out[kind]
            faults.update(out["faults"])
            if out["violation"]:
                failures.append(out)
                print(f"\nseed {out['seed']}: {out['violation']}", file=sys.stderr, flush=True)
            if args.max_minutes and time.perf_counter() - started > args.max_minutes * 60:
                pool.terminate()
                break
            if done % 10 == 0 or done == len(work):
                spent = time.perf_counter() - started
                jobs = sum(totals[k] for k in totals if k.startswith("jobs_"))
                print(
                    f"\r{done}/{len(work)} seeds  {totals['steps'] / spent:,.0f} steps/s  "
                    f"{jobs:,} jobs  {len(failures)} failing",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
    print(file=sys.stderr)
    spent = time.perf_counter() - started
    summary = {
        "config": base.command(),
        "seeds_asked": f"{first}:{end}",
        **totals,
        "jobs": sum(totals[k] for k in totals if k.startswith("jobs_")),
        "faults_injected": sum(faults.values()),
        "faults": dict(sorted(faults.items())),
        "wall_s": round(spent, 1),
        "steps_per_s": round(totals["steps"] / spent),
        "failing": [{"seed": f["seed"], "violation": f["violation"]} for f in failures],
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(summary, fh, indent=1)
    for f in failures:
        print(f"seed {f['seed']}: {f['violation']}\n  replay: {f['command']} --shrink")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
