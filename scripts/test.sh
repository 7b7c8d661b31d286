#!/usr/bin/env bash
# The project's test command: unit, then integration, Flight SQL (the ADBC driver), object
# storage (S3 on moto), web (API, metrics, browser), chaos, then multi-host tests (every
# process on a host of its own; needs root).
#
# Usage: scripts/test.sh [pytest arguments]
#   scripts/test.sh                       the whole suite
#   scripts/test.sh -k tpch -x            the whole suite, filtered
#   scripts/test.sh tests/unit            only these paths (any path argument
#                                         replaces the default suites)
# Runs with the virtualenv at ./.venv (create it with `pip install -e '.[test]'`,
# or let .ci/run do it). Exits non-zero when any test fails or when no test ran
# (pytest's exit code 5), so an empty or mis-collected suite never passes.
set -euo pipefail

cd "$(dirname "$0")/.."
python=".venv/bin/python"
if [[ ! -x "$python" ]]; then
    echo "scripts/test.sh: no virtualenv at .venv; run: python3 -m venv .venv && .venv/bin/pip install -e '.[test]'" >&2
    exit 2
fi

has_path=false
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
        has_path=true
    fi
done

suites=()
if [[ "$has_path" == false ]]; then
    # Only the suites that exist in this checkout: git keeps no empty directories,
    # and pytest fails on a path that is not there.
    for dir in tests/unit tests/integration tests/flightsql tests/objectstore tests/web tests/chaos tests/multihost; do
        if [[ -d "$dir" ]] && compgen -G "$dir/test_*.py" >/dev/null; then
            suites+=("$dir")
        fi
    done
    if [[ ${#suites[@]} -eq 0 ]]; then
        echo "scripts/test.sh: no test files under tests/" >&2
        exit 1
    fi
fi

# Per-test timeout: a hung query fails its test instead of the whole run.
# --durations shows where the suite's time goes.
status=0
"$python" -m pytest -p no:cacheprovider -q --timeout=300 --durations=15 \
    ${suites[@]+"${suites[@]}"} "$@" || status=$?
if [[ $status -eq 5 ]]; then
    echo "scripts/test.sh: pytest collected no tests; failing" >&2
fi
exit "$status"
