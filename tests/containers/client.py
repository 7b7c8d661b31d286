"""The client container's part of test_compose.py: run TPC-H queries on the compose
cluster and write each answer (Parquet) and how it ran (JSON) under the output folder.

Runs inside the image (``python /work/client.py ...``), so it uses nothing but mangonel.

Usage: client.py SCHEDULER OUT [--register DATA_DIR] [--connect-wait S] QUERY_NUMBER...
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

import pyarrow.parquet as pq

import mangonel

TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scheduler")
    parser.add_argument("out", type=Path)
    parser.add_argument("--register", metavar="DATA_DIR")
    parser.add_argument("--connect-wait", type=float, default=30.0, metavar="SECONDS")
    parser.add_argument("queries", type=int, nargs="+")
    args = parser.parse_args()
    with mangonel.connect(args.scheduler, connect_wait_s=args.connect_wait) as session:
        if args.register:
            for name in TABLES:
                session.register_parquet(name, f"{args.register}/{name}.parquet")
        for number in args.queries:
            sql = (
                resources.files("mangonel")
                .joinpath(f"tpch/queries/q{number:02d}.sql")
                .read_text(encoding="utf-8")
            )
            result = session.sql(sql)
            pq.write_table(result.to_arrow(), args.out / f"q{number:02d}.parquet")
            facts = {
                "job_id": result.job_id,
                "stages": len(result.stages),
                "tasks": sum(s.tasks_total for s in result.stages),
                "tasks_rerun": result.tasks_rerun,
                "outputs_recomputed": result.outputs_recomputed,
            }
            (args.out / f"q{number:02d}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main()
