"""The executor's work root: one locked directory per owner, and the sweep of dead ones.

Every directory an executor process writes lives directly under its *work root*
(``ExecutorConfig.work_dir``), which several executors of one host may share::

    <work root>/
      exec-3-9f2c/          one life of an executor (its id from the scheduler)
        owner.lock          flock()ed by the live process; pid and time inside
        shuffle/<job>/s<stage>/m<map>-a<attempt>-p<p>.arrow
      spill-4711-0b1e/      DuckDB spill files of one process (one per slot)
        owner.lock
        slot-0/ slot-1/

**Who may delete what.** A directory is stale when no live process holds the
``fcntl.flock`` on its ``owner.lock``. The kernel drops a flock when the
process holding it dies, however it dies (SIGKILL and out-of-memory kills
included), so a lock that can be taken is proof that the owner is gone, and
the sweep (``WorkRoot.sweep``: at start, then every few seconds) deletes those
directories. A frozen (SIGSTOPped) process still holds its locks: its files
stay until it thaws and retires them itself, or dies.

Why not let the scheduler say which executors are lost? Lost is not dead: a
frozen or cut-off executor is lost to the scheduler but alive, and may still
be writing into its directory; deleting under it would be a race. And the
scheduler may be gone too (restarted), while the lock is always right. Why not
a pid file? Pids are reused, and a pid says nothing across pid namespaces; a
flock is released by the kernel exactly when it must be. The one requirement
is that the work root is on a local file system (flock over NFS is not reliable),
which shuffle files want anyway.

A directory is created under a temporary dot-name with its lock already held
and then renamed into place, so a sweep never sees one of ours without a
lock. Directories without an ``owner.lock`` are not ours and are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import time

log = logging.getLogger(__name__)

LOCK_NAME = "owner.lock"


_CLAIM_GRACE_S = 60.0
"""A temporary ``.name.xxxx`` directory younger than this is a claim in progress."""


class OwnedDir:
    """A directory under the work root that this process holds locked.

    Args:
        path: The directory.
        fd: Open descriptor of its ``owner.lock``, flock()ed exclusively.
    """

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def remove(self) -> None:
        """Delete the directory, then let go of its lock (idempotent).

        The lock is held until the files are gone, so no sweep of another
        process races this deletion.
        """
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None

    def __repr__(self) -> str:
        return f"OwnedDir({self.path!r})"


class WorkRoot:
    """The work root: claims this process's directories and sweeps dead ones.

    Args:
        root: The directory (created if missing).
    """

    def __init__(self, root: str) -> None:
        os.makedirs(root, exist_ok=True)
        self.root = os.path.realpath(root)

    def claim(self, name: str) -> OwnedDir:
        """Create ``<root>/<name>`` with its lock held by this process.

        Raises:
            FileExistsError: a live process owns a directory of that name.
        """
        if not name or name.startswith(".") or os.sep in name:
            raise ValueError(f"invalid work directory name {name!r}")
        final = os.path.join(self.root, name)
        if os.path.lexists(final) and not self._remove_if_stale(name):
            raise FileExistsError(f"{final} belongs to a live process")
        temp = os.path.join(self.root, f".{name}.{secrets.token_hex(4)}")
        os.mkdir(temp)
        fd = os.open(os.path.join(temp, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, f"pid {os.getpid()} since {time.time():.3f}\n".encode())
            os.rename(temp, final)
        except BaseException:
            os.close(fd)
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return OwnedDir(final, fd)

    def sweep(self) -> list[str]:
        """Delete every directory whose owner is dead; return their names.

        Safe to run from several processes at once: whoever takes a dead
        owner's lock first deletes the directory, the others skip it.
        """
        removed = []
        try:
            names = os.listdir(self.root)
        except OSError as exc:
            log.warning("cannot list the work root %s: %s", self.root, exc)
            return []
        for name in sorted(names):
            try:
                if self._remove_if_stale(name):
                    removed.append(name)
            except OSError as exc:  # one bad entry must not stop the sweep
                log.warning("cannot clean up %s: %s", os.path.join(self.root, name), exc)
        if removed:
            log.info("removed %d directories of dead executors: %s", len(removed), removed)
        return removed

    def _remove_if_stale(self, name: str) -> bool:
        path = os.path.join(self.root, name)
        if os.path.islink(path) or not os.path.isdir(path):
            return False
        if name.startswith(".") and time.time() - os.path.getmtime(path) < _CLAIM_GRACE_S:
            # A directory being claimed: its lock file exists a moment before it is
            # locked, and taking the lock in that moment would delete a live claim.
            return False
        try:
            fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR)
        except FileNotFoundError:
            return False  # not ours (or already being deleted)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # its owner lives (this process included)
            shutil.rmtree(path, ignore_errors=True)
            return True
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
