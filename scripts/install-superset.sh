#!/usr/bin/env bash
# Apache Superset in a virtualenv of its own, with mangonel's client installed into it the
# way a user installs it into any tool's environment: the package without its
# dependencies, then requirements-client.txt. tests/superset runs this (it is quick when
# the environment is there) and starts Superset from the environment it makes.
#
# Usage: scripts/install-superset.sh [VENV]      (default: .cache/superset-venv)
#
# Superset's packages come from tests/superset/superset-requirements.txt (all pinned);
# the environment is remade when that file changes. mangonel's client is reinstalled
# from this checkout every time (seconds), so the tests run the code beside them.
set -euo pipefail

cd "$(dirname "$0")/.."
# Superset's environment sees only what is installed into it, not a checkout on the path.
unset PYTHONPATH
venv="${1:-.cache/superset-venv}"
lock="tests/superset/superset-requirements.txt"

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then
            python="$candidate"
            break
        fi
    done
fi
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
    echo "scripts/install-superset.sh: needs Python 3.11 (Superset 6.1 and mangonel both run on it)" >&2
    exit 1
}

stamp="$venv/.superset-requirements.sha256"
want="$(sha256sum "$lock" | cut -d' ' -f1)"
# A venv made under another path (a moved or renamed cache) keeps scripts whose
# first line names an interpreter that is gone: made again too.
# (Read only when it is there: under pipefail a failed head would end the script.)
interpreter=""
if [[ -f "$venv/bin/superset" ]]; then
    interpreter="$(head -n 1 "$venv/bin/superset" | cut -c3-)"
fi
if [[ ! -x "$venv/bin/superset" || ! -x "$interpreter" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    # The lock names every package: no resolving (--no-deps), and no byte-compiling of
    # Superset's many modules that the tests never import (--no-compile). 85 s instead
    # of 4.5 minutes on the 2-core machine the suite was written on; pip check then
    # proves the lock whole.
    "$venv/bin/python" -m pip install --quiet --no-deps --no-compile -r "$lock"
    "$venv/bin/python" -m pip check
    echo "$want" >"$stamp"
fi

# The client: mangonel without the server's dependencies (Superset pins sqlalchemy<2 and
# pyarrow<19, which they do not fit), then the few packages the client imports.
"$venv/bin/python" -m pip uninstall --quiet --yes mangonel 2>/dev/null || true
"$venv/bin/python" -m pip install --quiet -r requirements-client.txt
"$venv/bin/python" -m pip install --quiet --no-deps .
# Fails here, not in the middle of a test, when the dialect or the engine spec does not load.
"$venv/bin/python" - <<'EOF'
from importlib.metadata import entry_points

import sqlalchemy
from sqlalchemy.dialects import registry

registry.load("mangonel")
(spec,) = [ep for ep in entry_points(group="superset.db_engine_specs") if ep.name == "mangonel"]
spec.load()
print(f"scripts/install-superset.sh: mangonel's client on SQLAlchemy {sqlalchemy.__version__}")
EOF
