"""Whether a statement is an EXPLAIN, asked by the client without the planner."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mangonel.sql.explain import is_explain


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("EXPLAIN SELECT 1", True),
        ("  explain\nSELECT 1", True),
        ("ExPlAiN SELECT 1", True),
        ("SELECT 'explain'", False),
        ("explained", False),
        ("WITH explain AS (SELECT 1) SELECT * FROM explain", False),
    ],
)
def test_is_explain(sql: str, expected: bool) -> None:
    assert is_explain(sql) is expected


def test_the_client_runs_a_query_without_importing_the_planner() -> None:
    # A client process's first query imported the planner and sqlglot (0.2 to
    # 0.3 s) to match one regular expression.
    code = (
        "import sys\n"
        "import mangonel\n"
        "from mangonel.client import session\n"
        "assert session.is_explain('EXPLAIN SELECT 1')\n"
        "print(sorted(m for m in sys.modules if m == 'sqlglot' or m.startswith('mangonel.plan')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout
