"""The work root (``executor.workdir``): locked directories, and sweeping the dead ones.

A "dead owner" is a real child process that claimed a directory and exited (or
was SIGKILLed): the kernel dropped its flock, which is the whole proof the sweep
relies on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mangonel.executor.workdir import LOCK_NAME, WorkRoot

CLAIM_AND_WAIT = textwrap.dedent(
    """
    import sys, time
    from mangonel.executor.workdir import WorkRoot
    owned = WorkRoot(sys.argv[1]).claim(sys.argv[2])
    open(owned.path + "/data.arrow", "w").write("x")
    print("claimed", flush=True)
    time.sleep(60)
    """
)


def owner(root: Path, name: str) -> subprocess.Popen[str]:
    """A child process that owns ``root/name`` until it is killed."""
    child = subprocess.Popen(
        [sys.executable, "-c", CLAIM_AND_WAIT, str(root), name], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "claimed"
    return child


def test_claim_makes_a_locked_directory_that_remove_deletes(tmp_path: Path) -> None:
    work = WorkRoot(str(tmp_path))
    owned = work.claim("exec-1-ab")
    assert os.path.isfile(os.path.join(owned.path, LOCK_NAME))
    assert f"pid {os.getpid()}" in Path(owned.path, LOCK_NAME).read_text()
    assert work.sweep() == []  # ours, and we live
    with pytest.raises(FileExistsError):
        work.claim("exec-1-ab")
    owned.remove()
    owned.remove()  # idempotent
    assert os.listdir(tmp_path) == []


def test_sweep_deletes_what_dead_processes_left_and_only_that(tmp_path: Path) -> None:
    work = WorkRoot(str(tmp_path))
    mine = work.claim("exec-1-aa")
    living = owner(tmp_path, "exec-2-bb")
    dying = owner(tmp_path, "exec-3-cc")
    (tmp_path / "not-ours").mkdir()  # no owner.lock: someone else's, left alone
    (tmp_path / "notes.txt").write_text("a file, not a directory")
    try:
        dying.send_signal(signal.SIGKILL)
        dying.wait(10)
        assert work.sweep() == ["exec-3-cc"]
        assert sorted(os.listdir(tmp_path)) == ["exec-1-aa", "exec-2-bb", "not-ours", "notes.txt"]
        living.send_signal(signal.SIGKILL)
        living.wait(10)
        # Another process's root object sees the same: the lock is the proof.
        assert WorkRoot(str(tmp_path)).sweep() == ["exec-2-bb"]
    finally:
        for child in (living, dying):
            if child.poll() is None:
                child.kill()
                child.wait(10)
    assert os.path.isdir(mine.path)
    mine.remove()


def test_claim_takes_over_a_dead_owners_name(tmp_path: Path) -> None:
    # Names of spill directories include the pid, and pids are reused.
    child = owner(tmp_path, "spill-42-00")
    child.kill()
    child.wait(10)
    owned = WorkRoot(str(tmp_path)).claim("spill-42-00")
    assert os.listdir(owned.path) == [LOCK_NAME]
    owned.remove()


@pytest.mark.parametrize("name", ["", ".hidden", "a/b"])
def test_invalid_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        WorkRoot(str(tmp_path)).claim(name)


def test_a_claim_in_progress_is_not_swept_but_an_abandoned_one_is(tmp_path: Path) -> None:
    # A claim creates ".name.xxxx/" and its lock file a moment before locking it;
    # a sweep by another executor in that moment must leave it alone.
    root = WorkRoot(str(tmp_path))
    fresh = tmp_path / ".exec-1.abcd1234"
    fresh.mkdir()
    (fresh / LOCK_NAME).write_text("")
    assert root.sweep() == []
    assert fresh.exists()
    # One left behind by a process that died mid-claim is old: it goes.
    old = time.time() - 3600
    os.utime(fresh, (old, old))
    assert root.sweep() == [fresh.name]
    assert not fresh.exists()
