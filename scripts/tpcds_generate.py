"""Write TPC-DS data as one Parquet file per table, and optionally the 99 queries.

Runs with the generator's virtualenv (``scripts/install-tpcds-generator.sh``:
duckdb 1.5.5 and its ``tpcds`` extension), not the project's::

    .cache/tpcds-generator/bin/python scripts/tpcds_generate.py --scale 0.1 --out DIR
    .cache/tpcds-generator/bin/python scripts/tpcds_generate.py --queries tests/tpcds/queries

The data is DuckDB's ``dsdgen`` (the TPC-DS kit's generator, built into the
extension), deterministic for a scale factor; the queries are the extension's
``tpcds_queries()``, the kit's templates with its default substitutions.
"""

from __future__ import annotations

import argparse
import pathlib

import duckdb
import duckdb_extension_tpcds


def _connect() -> duckdb.DuckDBPyConnection:
    package = pathlib.Path(duckdb_extension_tpcds.__file__).parent
    found = sorted(package.glob("extensions/*/tpcds.duckdb_extension"))
    if not found:
        raise SystemExit(f"no tpcds.duckdb_extension under {package}")
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{found[-1]}'")
    return con


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, help="scale factor of the data (1 = about 1 GB)")
    parser.add_argument("--out", type=pathlib.Path, help="directory for <table>.parquet")
    parser.add_argument("--queries", type=pathlib.Path, help="directory for q01.sql .. q99.sql")
    args = parser.parse_args()
    if (args.scale is None) != (args.out is None) or (args.out is None and args.queries is None):
        parser.error("give --scale with --out, and/or --queries")
    con = _connect()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        con.execute(f"CALL dsdgen(sf={args.scale})")
        tables = con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
        ).fetchall()
        for (table,) in tables:
            con.execute(f"COPY {table} TO '{args.out / table}.parquet' (FORMAT parquet)")
    if args.queries is not None:
        args.queries.mkdir(parents=True, exist_ok=True)
        for number, text in con.execute("SELECT query_nr, query FROM tpcds_queries()").fetchall():
            (args.queries / f"q{number:02d}.sql").write_text(text.strip() + "\n")


if __name__ == "__main__":
    main()
