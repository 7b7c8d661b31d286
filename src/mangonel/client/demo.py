"""``mangonel demo``: TPC-H q12 on a fresh local cluster, with how it ran.

``mangonel demo --kill`` runs q12 fault-free, then again while one executor is
SIGKILLed half-way through its tasks (``run_with_kill``: the others are frozen
until it dies, so that the query needs the outputs it dies with), and shows what
the scheduler saw:
which executor died, when, why, how fast it was written off, which tasks ran
again, and that the answer is the fault-free one. ``benchmarks/seed_kill.py``
measures the same at SF 1, with the kill at a fault rule's exact point
(``testing.kill``). Only the public API is used: ``LocalCluster``, ``Session`` and
the job's progress.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources

from mangonel import defaults
from mangonel.client import render
from mangonel.client.cluster import LocalCluster
from mangonel.client.session import Result, Session
from mangonel.client.status import JobStatus
from mangonel.errors import ClusterError

TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")


def find_tpchgen() -> str:
    """The ``tpchgen-cli`` installed with mangonel: next to this Python, or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise ClusterError("tpchgen-cli is not installed; `pip install tpchgen-cli==4.0.0`")
    return found


def ensure_tpch(cache_dir: str, scale: float = 0.1) -> str:
    """Generate TPC-H Parquet files into ``cache_dir`` unless all 8 are there."""
    if all(os.path.exists(os.path.join(cache_dir, f"{t}.parquet")) for t in TABLES):
        return cache_dir
    os.makedirs(cache_dir, exist_ok=True)
    print(f"generating TPC-H SF {scale} into {cache_dir} ...", file=sys.stderr, flush=True)
    tmp = f"{cache_dir}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    done = subprocess.run(
        [find_tpchgen(), "parquet", "-s", str(scale), f"--output-dir={tmp}"],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"tpchgen-cli failed: {done.stderr.strip()[-500:]}")
    # Move files in only when all exist, so an interrupted run is never taken as done.
    for t in TABLES:
        os.replace(os.path.join(tmp, f"{t}.parquet"), os.path.join(cache_dir, f"{t}.parquet"))
    shutil.rmtree(tmp, ignore_errors=True)
    return cache_dir


DEMO_SPLIT_ROWS = 150_000
"""Rows per scan task in the demos. At SF 0.1 the planner's own sizing reads each
table in one task, and q12 would run as one task of one stage (its join inside
it): nothing distributed to show, and in the kill demo no finished shuffle output
to lose. Four smaller scans of lineitem spread over both executors."""


def q12_text() -> str:
    return resources.files("mangonel.tpch").joinpath("queries/q12.sql").read_text()


def run_demo(
    cache_dir: str,
    executors: int = defaults.LOCAL_EXECUTORS,
    log_level: str = "warning",
    kill: bool = False,
    secure: bool = False,
) -> int:
    """Generate data if needed, start a cluster, run q12 and print its answer and stages.

    With ``kill``, see ``run_kill_demo``. With ``secure`` the cluster is secured
    (``LocalCluster(secure=True)``: TLS on every channel, signed tickets).
    """
    if kill:
        return run_kill_demo(cache_dir, executors, log_level, secure)
    started = time.monotonic()
    data = ensure_tpch(cache_dir)
    kind = (
        "secured local cluster (TLS on every channel, signed tickets)"
        if secure
        else ("local cluster")
    )
    print(
        f"starting a {kind}: 1 scheduler, {executors} executors, scan tasks of "
        f"{DEMO_SPLIT_ROWS} rows ...",
        file=sys.stderr,
    )
    with (
        LocalCluster(
            executors=executors,
            log_level=log_level,
            secure=secure,
            scheduler_options={"split_rows": DEMO_SPLIT_ROWS},
        ) as cluster,
        cluster.connect() as session,
    ):
        for t in TABLES:
            session.register_parquet(t, os.path.join(data, f"{t}.parquet"))
        print("running TPC-H q12 ...\n", file=sys.stderr, flush=True)
        result = session.sql(q12_text())
    print(render.format_table(result.to_arrow()))
    print(f"\n{result.num_rows} rows in {result.elapsed_s:.2f} s\n")
    print(render.format_stages(result.stages))
    print(f"\ntotal time (data, cluster start and stop, query): {time.monotonic() - started:.2f} s")
    return 0


# ------------------------------------------------------------------ --kill


@dataclass(frozen=True)
class KillReport:
    """One executor SIGKILLed in the middle of a query, and what the scheduler did.

    Attributes:
        executor_id: The killed executor's id at the scheduler.
        pid: Its process id.
        after_tasks: It had finished this many of the query's tasks when killed.
        killed_after_s: Submission to the SIGKILL, seen from the client.
        detected_after_s: The SIGKILL to the scheduler marking it lost (both wall
            clocks of this machine); ``None`` if it was not marked lost.
        reason: Why the scheduler says it was lost, e.g. ``connection lost``.
        detail: The scheduler's detail on the loss.
        result: The query's result.
    """

    executor_id: str
    pid: int
    after_tasks: int
    killed_after_s: float
    detected_after_s: float | None
    reason: str
    detail: str
    result: Result

    @property
    def tasks_total(self) -> int:
        return sum(s.tasks_total for s in self.result.stages)

    @property
    def tasks_rerun(self) -> int:
        """Attempts cut off by the kill (or failing after it) that ran again."""
        return self.result.tasks_rerun

    @property
    def outputs_recomputed(self) -> int:
        """Finished outputs that died with the executor and were made again."""
        return self.result.outputs_recomputed


def halfway_tasks(fault_free: Result, executors: int) -> int:
    """The task count at which one executor is half-way through its share of a query
    (rounded down: q12's six tasks on two executors, 1). Rounded up, the kill could
    come after the executor's last scan task, when the final task may already have
    read every output: a CI run under load killed it there and nothing was left to
    recompute."""
    total = sum(s.tasks_total for s in fault_free.stages)
    return max(1, total // max(1, executors) // 2)


def run_with_kill(
    cluster: LocalCluster, session: Session, sql: str, after_tasks: int
) -> KillReport:
    """Run ``sql``; SIGKILL one executor once it has finished ``after_tasks`` of its tasks.

    Public API only: ``LocalCluster``'s processes and the job's progress
    (``on_progress``). The other executors are frozen (SIGSTOP) from the submission
    to the kill, so that the query cannot get past the victim's outputs before it
    dies: the tasks they were given wait, the stages that read the victim's outputs
    with them, and those outputs must be made again. They are thawed right after
    the SIGKILL, which is when the detection latency is measured from. (A progress
    update comes at most every 0.1 s: a query all of whose tasks the victim could
    finish in that time would still end without it; q12's do not.)

    Raises:
        ClusterError: fewer than two executors, or the query finished before the
            victim finished ``after_tasks`` tasks (so it was not killed).
    """
    alive = session.status().alive_executors()
    if len(alive) < 2:
        raise ClusterError("a kill demo needs at least two executors: one must finish")
    victim = alive[0]
    handles = {h.pid: h for h in cluster.executors}
    others = [handles[e.pid] for e in alive[1:]]
    killed: list[tuple[float, int]] = []  # (when, the victim's finished tasks)

    def on_progress(job: JobStatus) -> None:
        done = sum(min(s.tasks_done, s.tasks_total) for s in job.stages)
        if killed or done < after_tasks:
            return
        killed.append((time.time(), done))
        handles[victim.pid].signal(signal.SIGKILL)
        for handle in others:
            cluster.thaw_executor(handle.index)

    for handle in others:
        cluster.freeze_executor(handle.index)
    submitted = time.time()
    try:
        result = session.sql(sql, on_progress=on_progress)
    finally:
        for handle in others:
            cluster.thaw_executor(handle.index)
    if not killed:
        raise ClusterError(
            f"executor {victim.id} finished fewer than {after_tasks} tasks of the query "
            "and was not killed; use a smaller task count"
        )
    killed_at, tasks = killed[0]
    entry = session.status().executor(victim.id)
    lost = entry is not None and entry.reason != ""
    return KillReport(
        executor_id=victim.id,
        pid=victim.pid,
        after_tasks=tasks,
        killed_after_s=killed_at - submitted,
        detected_after_s=entry.since - killed_at if entry is not None and lost else None,
        reason=entry.reason if entry is not None else "",
        detail=entry.detail if entry is not None else "",
        result=result,
    )


def same_answer(a: Result, b: Result) -> bool:
    """Whether two results of one query hold the same rows in the same order."""
    return bool(a.to_arrow().equals(b.to_arrow()))


def describe_kill(report: KillReport, fault_free: Result) -> str:
    """What happened, in a few lines for people."""
    detected = (
        f"{report.detected_after_s * 1000:.0f} ms later"
        if report.detected_after_s is not None
        else "never (it is not marked lost!)"
    )
    why = " - ".join(x for x in (report.reason, report.detail) if x) or "unknown"
    return "\n".join(
        [
            f"executor {report.executor_id} (pid {report.pid}) was SIGKILLed "
            f"{report.killed_after_s:.2f} s into the query,",
            f"  once it had finished {report.after_tasks} of the query's "
            f"{report.tasks_total} tasks (the others frozen until then)",
            f"the scheduler marked it lost {detected}: {why}",
            f"tasks run again: {report.tasks_rerun} cut off or failed, "
            f"{report.outputs_recomputed} finished outputs lost and recomputed",
            f"query time: {report.result.elapsed_s:.2f} s with the kill, "
            f"{fault_free.elapsed_s:.2f} s fault-free",
        ]
    )


def run_kill_demo(
    cache_dir: str,
    executors: int = defaults.LOCAL_EXECUTORS,
    log_level: str = "warning",
    secure: bool = False,
) -> int:
    """q12 fault-free, then with one executor killed half-way; print what happened.

    Returns 0 when the answer with the kill is the fault-free one, else 1.
    """
    data = ensure_tpch(cache_dir)
    print(
        f"starting a local cluster: 1 scheduler, {executors} executors, scan tasks of "
        f"{DEMO_SPLIT_ROWS} rows ...",
        file=sys.stderr,
    )
    with (
        LocalCluster(
            executors=executors,
            log_level=log_level,
            scheduler_options={"split_rows": DEMO_SPLIT_ROWS},
            secure=secure,
        ) as cluster,
        cluster.connect() as session,
    ):
        for t in TABLES:
            session.register_parquet(t, os.path.join(data, f"{t}.parquet"))
        print("running TPC-H q12 fault-free (twice: the first run warms up) ...", file=sys.stderr)
        fault_free = min((session.sql(q12_text()) for _ in range(2)), key=lambda r: r.elapsed_s)
        nth = halfway_tasks(fault_free, executors)
        print(
            f"running it again; one executor is killed once it has finished {nth} "
            f"task{'' if nth == 1 else 's'} "
            f"(half-way through its share) ...\n",
            file=sys.stderr,
            flush=True,
        )
        report = run_with_kill(cluster, session, q12_text(), nth)
        status = session.status()
    print(describe_kill(report, fault_free))
    print()
    print(render.format_table(report.result.to_arrow()))
    print()
    print(render.format_stages(report.result.stages))
    print()
    print("executors at the end:")
    for e in status.executors:
        why = f" ({e.reason}: {e.detail})" if e.reason else ""
        print(f"  {e.id}  pid {e.pid}  {e.state.value}{why}")
    matches = same_answer(report.result, fault_free)
    print(f"\nthe answer matches the fault-free run: {'yes' if matches else 'NO'}")
    return 0 if matches else 1
