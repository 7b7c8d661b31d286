#!/usr/bin/env bash
# The TPC-DS data generator: DuckDB's `tpcds` extension, which the duckdb wheel
# mangonel uses (2.0) does not ship. duckdb-extension-tpcds 1.5.5 carries the
# extension file for duckdb 1.5.5, so both go into a virtualenv of their own,
# apart from the project's, at .cache/tpcds-generator (or $1). Does nothing
# when it is already there. tests/helpers.py's ensure_tpcds runs
# scripts/tpcds_generate.py with it.
#
# Usage: scripts/install-tpcds-generator.sh [DIR]
set -euo pipefail

cd "$(dirname "$0")/.."
target="${1:-.cache/tpcds-generator}"
if [[ -x "$target/bin/python" ]] && "$target/bin/python" -c 'import duckdb, duckdb_extension_tpcds' 2>/dev/null; then
    exit 0
fi
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
rm -rf "$target"
"$python" -m venv "$target"
"$target/bin/python" -m pip install --quiet duckdb==1.5.5 duckdb-extension-tpcds==1.5.5
