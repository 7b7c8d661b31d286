"""One single-process engine in a child process of its own, driven over a pipe.

``tpch.py`` starts one of these per engine (``duckdb``, ``datafusion``,
``ballista``) so that each engine's peak memory is its own process's high-water
mark, not a mix of every engine the benchmark loaded. Protocol, one JSON object
per line:

- stdin  ``{"op": "query", "sql": ..., "out": PATH}`` → stdout
  ``{"seconds": S, "rows": N}`` (the answer written to ``PATH`` as an Arrow IPC
  file, outside the timed part) or ``{"error": "..."}``;
- stdin  ``{"op": "memory"}`` → ``{"vmhwm_kb": K, "maxrss_kb": K}``;
- end of stdin → exit.

The first line on stdout is ``{"ready": true}`` once the tables are registered,
or ``{"error": ...}`` when the engine cannot start (e.g. ``import ballista``
fails). Anything an engine prints goes to stderr: fd 1 is the protocol's.

Usage (by ``tpch.py`` and ``scaleout.py``, not by hand)::

    python benchmarks/engine_worker.py ENGINE DATA_DIR [THREADS [TABLE,TABLE,...]]

``THREADS`` (DuckDB only; 0 or absent: DuckDB's default, one per core it may run
on) and the tables (default: TPC-H's eight, one ``<table>.parquet`` each).
``$MANGONEL_BENCH_NO_HUGE_PAGES=1``: no transparent huge pages for the engine.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa

TABLES = ("nation", "region", "part", "supplier", "partsupp", "customer", "orders", "lineitem")

Runner = Callable[[str], pa.Table]


def vmhwm_kb(pid: int | str = "self") -> int:
    """Peak resident set (``VmHWM``) of a live process, in KiB; 0 if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def duckdb_runner(data: Path, threads: int = 0, tables: tuple[str, ...] = TABLES) -> Runner:
    import duckdb

    con = duckdb.connect()
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    for name in tables:
        path = str(data / f"{name}.parquet").replace("'", "''")
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
    return lambda sql: con.sql(sql).to_arrow_table()


def datafusion_runner(data: Path) -> Runner:
    import datafusion

    ctx = datafusion.SessionContext()
    for name in TABLES:
        ctx.register_parquet(name, str(data / f"{name}.parquet"))
    return lambda sql: ctx.sql(sql).to_arrow_table()


def ballista_runner(data: Path) -> Runner:
    # Untested here: PyPI's only x86-64 wheel of ``ballista`` needs glibc 2.39.
    # Its Python API mirrors DataFusion's, with a builder for the context
    # (standalone: an in-process scheduler and executor).
    from ballista import BallistaBuilder  # type: ignore[import-not-found,unused-ignore]

    ctx = BallistaBuilder().standalone()
    for name in TABLES:
        ctx.register_parquet(name, str(data / f"{name}.parquet"))
    return lambda sql: ctx.sql(sql).to_arrow_table()


RUNNERS: dict[str, Callable[[Path], Runner]] = {
    "duckdb": duckdb_runner,
    "datafusion": datafusion_runner,
    "ballista": ballista_runner,
}


def reply(out: TextIO, payload: dict[str, Any]) -> None:
    out.write(json.dumps(payload) + "\n")
    out.flush()


def serve(
    engine: str, data: Path, inp: TextIO, out: TextIO, threads: int = 0, tables: str = ""
) -> int:
    try:
        if engine == "duckdb":
            run = duckdb_runner(data, threads, tuple(tables.split(",")) if tables else TABLES)
        else:
            run = RUNNERS[engine](data)
    except Exception as exc:  # the parent prints why the engine is skipped
        reply(out, {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
        return 1
    reply(out, {"ready": True})
    for line in inp:
        request = json.loads(line)
        if request["op"] == "memory":
            maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            reply(out, {"vmhwm_kb": vmhwm_kb(), "maxrss_kb": maxrss})
            continue
        try:
            start = time.perf_counter()
            table = run(request["sql"])
            seconds = time.perf_counter() - start
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            reply(out, {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]})
            continue
        with pa.OSFile(request["out"], "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        reply(out, {"seconds": seconds, "rows": table.num_rows})
    return 0


NO_HUGE_PAGES_ENV = "MANGONEL_BENCH_NO_HUGE_PAGES"
"""Set to 1: the engine's process keeps transparent huge pages from itself, as
mangonel's executors do (``mangonel.executor.memory.set_huge_pages``)."""


def main() -> int:
    if os.environ.get(NO_HUGE_PAGES_ENV) == "1":
        from mangonel.executor.memory import set_huge_pages

        set_huge_pages(False)
    engine, data = sys.argv[1], Path(sys.argv[2])
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    tables = sys.argv[4] if len(sys.argv) > 4 else ""
    # Keep fd 1 for the protocol; whatever the engine prints lands on stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(engine, data, sys.stdin, protocol, threads, tables)


if __name__ == "__main__":
    sys.exit(main())
