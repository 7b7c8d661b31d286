"""The scheduler's scale, measured without processes (``mangonel.testing.scheduler_sim``).

Drives the pure ``SchedulerState`` with the events of a simulated cluster and
writes every event's changes through the shell's persistence into an
in-memory store. Two curves, each point one run to the end of its jobs:

* ``--executors`` (at ``--tasks`` of the largest size): task events per second,
  and the time to handle one executor loss, against the cluster's size;
* ``--tasks`` (at the largest ``--executors``): the same, and store bytes per
  task event, against the job's size.

Targets (issue 19): 20,000 task events/s on one core; one loss among 1,000
executors in 50 ms or less; store bytes per task event independent of the
job's size. Not a test: timings belong here. Usage::

    .venv/bin/python benchmarks/scheduler_sim.py \\
        [--executors 10,100,1000] [--tasks 1000,10000,100000] [--jobs 10] \\
        [--losses 5] [--loss-every 0] [--max-seconds 600] [--json out.json]

A run that passes ``--max-seconds`` stops early and is marked ``complete:
false`` (its rates are still per event handled).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

from mangonel.testing.scheduler_sim import SimConfig, simulate


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _point(cfg: SimConfig) -> dict[str, Any]:
    summary = simulate(cfg).summary()
    print(
        f"executors={cfg.executors:>5} tasks/job={cfg.tasks_per_job:>7} "
        f"events/s={summary['events_per_s']:>8} "
        f"(with store {summary['events_per_s_with_store']:>7}) "
        f"loss_ms max={summary['loss_ms_max']} "
        f"(failing no job {summary['loss_ms_max_failing_no_job']}; "
        f"{summary['losses_failing_jobs']}/{summary['losses']} failed jobs) "
        f"(most outputs held {summary['outputs_at_loss_max']}: "
        f"{summary['loss_ms_holding_most']} ms) "
        f"store B/event={summary['store_bytes_per_event']:>9} "
        f"jobs ok={summary['jobs_succeeded']} complete={summary['complete']} "
        f"wall={summary['wall_s']}s",
        flush=True,
    )
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--executors",
        type=_sizes,
        default=[10, 100, 1000],
        help="cluster sizes, comma-separated: one point each at the largest --tasks "
        "(default 10,100,1000)",
    )
    ap.add_argument(
        "--tasks",
        type=_sizes,
        default=[1000, 10_000, 100_000],
        help="tasks of each job, comma-separated: one point each at the largest "
        "--executors (default 1000,10000,100000)",
    )
    ap.add_argument("--jobs", type=int, default=10, help="jobs, all running at once")
    ap.add_argument("--slots", type=int, default=8, help="task slots of each executor")
    ap.add_argument("--losses", type=int, default=5, help="executors lost per run")
    ap.add_argument("--loss-every", type=int, default=0, help="and one every N task events")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop each point this long after its setup (wall time; default: run its "
        "jobs to the end)",
    )
    ap.add_argument("--no-store", action="store_true", help="skip the persistence")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    def config(executors: int, tasks: int) -> SimConfig:
        return SimConfig(
            executors=executors,
            slots=args.slots,
            tasks_per_job=tasks,
            jobs=args.jobs,
            concurrent_jobs=args.jobs,
            losses=args.losses,
            loss_every=args.loss_every,
            persist=not args.no_store,
            max_seconds=args.max_seconds,
        )

    top_tasks, top_executors = max(args.tasks), max(args.executors)
    by_executors = [_point(config(e, top_tasks)) for e in args.executors]
    by_tasks = [_point(config(top_executors, t)) for t in args.tasks if t != top_tasks]
    by_tasks.append(by_executors[args.executors.index(top_executors)])
    by_tasks.sort(key=lambda s: int(s["config"]["tasks_per_job"]))
    report = {
        "benchmark": "scheduler_sim",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "command": " ".join(["benchmarks/scheduler_sim.py", *sys.argv[1:]]),
        "by_executors": by_executors,
        "by_tasks": by_tasks,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
