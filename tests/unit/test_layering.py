"""The package layering and the code style, checked by their tools.

The contracts (``[tool.importlinter]`` in pyproject.toml) say which package may
import which: the scheduler and the executor never import each other, ``sql``
knows nothing of ``plan``, production code does not reach into ``testing``, and
no package's modules import each other in a cycle. Ruff holds the style
(``[tool.ruff]``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_import_contracts_are_kept() -> None:
    done = _run(str(BIN / "lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_finds_nothing() -> None:
    checked = _run(str(BIN / "ruff"), "check", "src", "tests", "benchmarks")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    formatted = _run(str(BIN / "ruff"), "format", "--check", "src", "tests", "benchmarks")
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


def test_test_modules_have_unique_names() -> None:
    # The suites have no __init__.py: pytest imports each test module by its base
    # name, and a second module of the same name stops the whole run at collection.
    names = sorted(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert sorted(set(names)) == names, [n for n in set(names) if names.count(n) > 1]
