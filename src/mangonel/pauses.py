"""Long pauses of Python's garbage collector, logged in the process they stop.

A collection holds the GIL from start to end: in the scheduler it stops the
event loop, planning and every gRPC handler at once, in an executor every task
thread's Python side. Such a pause shows up as a query that was slow once for no
reason; ``watch`` makes the process's log say so: every collection longer than
``SLOW_COLLECTION_S`` is logged with its generation, its length and what it
freed.

``settle`` takes what a process holds once it has started (modules, classes,
functions, the planner's dialect tables, the bindings of pyarrow and DuckDB:
about 90,000 objects in a scheduler) out of the collector's sight for good
(``gc.freeze``): they live until the process exits, and every full collection
used to walk them all again (35-50 ms in the scheduler on an idle machine, 100
ms while the executors' DuckDB threads held both cores).

The collector's callback only notes the pause (it runs inside the collection,
where allocating objects of one's own or taking the logging handlers' locks is
not safe); a daemon thread logs what was noted, within ``LOG_EVERY_S``.
"""

from __future__ import annotations

import atexit
import collections
import gc
import logging
import threading
import time

SLOW_COLLECTION_S = 0.05
"""A collection at least this long is logged (a warm TPC-H query's task takes
about 0.1 s: a 50 ms pause is half of it)."""

LOG_EVERY_S = 1.0
"""How often the noted pauses are written to the log."""

log = logging.getLogger(__name__)

_noted: collections.deque[tuple[float, int, float, int]] = collections.deque(maxlen=64)
_started_at = 0.0
_watch_lock = threading.Lock()
_watching = False
_settled = False
_settling = False


def watch() -> None:
    """Time this process's collections from now on (once; later calls do nothing)."""
    global _watching
    with _watch_lock:
        if _watching:
            return
        _watching = True
    gc.callbacks.append(_on_collection)
    threading.Thread(target=_log_noted, name="gc-pauses", daemon=True).start()


def settle() -> None:
    """Free what is garbage now, then freeze the rest: call once the process has started.

    Frozen objects are never collected: anything cyclic among them that becomes
    garbage later stays (a start's objects do not), so this is for the end of a
    start, not for later. At exit they are unfrozen, so that the interpreter's
    last collection frees them (what it leaves, nanobind's bindings of pyarrow
    and DuckDB report as leaks).
    """
    global _settled, _settling
    _settling = True  # asked for, at a start: not a pause to report
    try:
        gc.collect()
    finally:
        _settling = False
    gc.freeze()
    with _watch_lock:
        if not _settled:
            _settled = True
            atexit.register(gc.unfreeze)


def _on_collection(phase: str, info: dict[str, int]) -> None:
    global _started_at
    now = time.perf_counter()
    if phase == "start":
        _started_at = now
    elif now - _started_at >= SLOW_COLLECTION_S and not _settling:
        # deque.append of a tuple: no lock, and the deque drops the oldest when full.
        _noted.append((time.time(), info["generation"], now - _started_at, info["collected"]))


def _log_noted() -> None:
    while True:
        time.sleep(LOG_EVERY_S)
        while _noted:
            at, generation, elapsed, collected = _noted.popleft()
            log.warning(
                "garbage collection of generation %d took %.0f ms at %s (it freed %d "
                "objects): every Python thread of this process waited",
                generation,
                elapsed * 1e3,
                time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1e3) % 1000:03d}",
                collected,
            )
