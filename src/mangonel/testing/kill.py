"""An executor SIGKILLed at a fault rule's exact point of a query, for benchmarks.

``benchmarks/seed_kill.py`` measures recovery with the kill after an executor's
N-th task, the same point on every run and machine; ``mangonel demo --kill`` does
the same with the public API alone (``client.demo.run_with_kill``), less exactly.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from mangonel.client.demo import KillReport
from mangonel.client.session import Session
from mangonel.errors import ClusterError
from mangonel.testing.cluster import TestCluster


def run_with_fault_kill(
    cluster: TestCluster, session: Session, sql: str, after_tasks: int
) -> KillReport:
    """Run ``sql``; SIGKILL the first executor in line after its ``after_tasks``-th task.

    The point is set by a fault rule (``cluster.set_faults``), not a timer,
    so the kill lands at the same point of the query on every run and machine:
    the executor stops itself (SIGSTOP) right after reporting that task, and a
    thread waiting on the process (``os.waitid``) sends the SIGKILL and notes the
    time, which the detection latency is measured from.

    Raises:
        ClusterError: fewer than two executors, or the executor ran fewer tasks
            of the query than ``after_tasks`` (so it was not killed).
    """
    alive = session.status().alive_executors()
    if len(alive) < 2:
        raise ClusterError("a kill demo needs at least two executors: one must finish")
    victim = alive[0]
    handle = next(h for h in cluster.executors if h.pid == victim.pid)
    killed_at: list[float] = []

    def kill_when_stopped() -> None:
        # WNOWAIT: the process stays for Popen to reap, stopped or dead.
        info = os.waitid(os.P_PID, handle.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
        if info is not None and info.si_code == os.CLD_STOPPED:
            killed_at.append(time.time())
            os.kill(handle.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_stopped, name="kill-demo", daemon=True)
    killer.start()
    rule = {"action": "freeze", "when": "task_finished", "nth": after_tasks}
    cluster.set_faults(handle.index, [rule])
    submitted = time.time()
    try:
        result = session.sql(sql)
    finally:
        if handle.alive():
            cluster.set_faults(handle.index, [])
    if not killed_at:
        raise ClusterError(
            f"executor {victim.id} ran fewer than {after_tasks} tasks of the query and "
            f"was not killed; use a smaller task count"
        )
    entry = session.status().executor(victim.id)
    lost = entry is not None and entry.reason != ""
    return KillReport(
        executor_id=victim.id,
        pid=victim.pid,
        after_tasks=after_tasks,
        killed_after_s=killed_at[0] - submitted,
        detected_after_s=entry.since - killed_at[0] if entry is not None and lost else None,
        reason=entry.reason if entry is not None else "",
        detail=entry.detail if entry is not None else "",
        result=result,
    )
