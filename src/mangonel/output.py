"""Written data: where a write's files are staged, how a job's output is committed.

The layout of a location a statement writes (``COPY ... TO``, a warehouse table)::

    <target>/_mangonel_manifest.json                      the committed files: readers
                                                          honour it (``manifest_files``);
                                                          and those a REPLACE retired
    <target>/[k=v/]part-<job>-p<partition>-<name>         committed data files
    <target>/_mangonel_staging/<job>/p<p>-a<attempt>/...  one task attempt's files
    <target>/_mangonel_staging/<job>/_commit.json         the commit's intent

Each task attempt writes only under its own staging directory, a name no other
attempt uses (job, partition, attempt). The scheduler alone commits (``commit``):
it names the one attempt per task whose files win, writes the intent (which
staged file becomes which committed name), moves the files, then replaces the
manifest in one atomic step (a rename on local disk, one PUT on S3), then deletes
the job's staging directory, the losing attempts' files with it. The manifest
remembers the jobs that committed there before it (``Manifest.history``): a
commit run again after a crash finds itself there, even one of no file or one a
later ``REPLACE`` took out, and takes effect once. A ``REPLACE``
keeps the files it took out of the manifest (its ``retired`` list) until the
scheduler, once no job that may have planned on the old manifest still runs,
calls ``delete_retired``; a ``DROP TABLE`` of a warehouse table is such a
replace by nothing (``drop``), after which the manifest goes too. Every step can be
run again after a crash: ``commit`` reads the intent back instead of listing the
staging directory again, moves only what is still staged, and writes the manifest
only if it does not already name the job (as its own or in its history); the
manifest it writes builds on the one there now, which another job's commit may
have written in between (a restarted scheduler commits again in its own order).
``abort`` removes a failed job's staging directory, and what an attempt that
finished too late to be stopped staged after its job ended (a committed job keeps
its visible files); a failed or cancelled attempt removes its own
(``discard_attempt``);
what a killed executor left is swept by the next commit to the location
(every job's staging directory but those of running jobs). docs/architecture.md,
"Writing data", says why this is exactly once and what a reader sees at every
moment.

A local target must be a filesystem that every executor and the scheduler see at
the same path (one host, or a shared mount); ``s3://`` needs nothing shared.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import posixpath
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, replace

import pyarrow.fs as pafs

from mangonel import storage
from mangonel.errors import CatalogError, DroppedLocationError, MangonelError

log = logging.getLogger(__name__)

MANIFEST = "_mangonel_manifest.json"
STAGING = "_mangonel_staging"
INTENT = "_commit.json"


class WriteConflictError(MangonelError):
    """Another job's output was committed to the location first."""


class CommitMode(enum.Enum):
    """What a commit does with what the location held before."""

    CREATE = "create"
    """The location must hold no committed output (``COPY`` without ``OVERWRITE``,
    ``CREATE TABLE``): another job's manifest there is a conflict."""
    REPLACE = "replace"
    """The new manifest replaces the old one, whose files are then deleted
    (``OVERWRITE``, ``CREATE OR REPLACE``)."""
    APPEND = "append"
    """The new manifest lists the old files and the new ones (``INSERT INTO``)."""


@dataclass(frozen=True)
class Manifest:
    """What a committed location holds: the job that wrote it last, and its files."""

    job: str
    files: tuple[str, ...]
    """Relative to the location, ``/``-separated, sorted."""
    format: str
    retired: tuple[str, ...] = ()
    """Files a ``REPLACE`` took out of the manifest, not deleted yet: jobs planned on
    the manifest before may still read them (``delete_retired``). No reader lists them."""
    history: tuple[str, ...] = ()
    """The jobs that committed here before ``job``, the latest last (``HISTORY`` at
    most): how a commit run again after a crash knows it took effect, where no file
    says so (it wrote none, or a later ``REPLACE`` retired them)."""
    dropped: bool = False
    """A ``DROP TABLE`` took every file out (``drop``; ``job`` is the drop's id): they
    wait as ``retired`` for their readers, and once they are deleted, the manifest
    goes too (``delete_retired``). A new table's commit replaces it."""

    def names(self, job: str) -> bool:
        """Whether ``job``'s commit took effect here (this manifest or an earlier one)."""
        if self.job == job or job in self.history:
            return True
        # A manifest written before there was a history: a file of the job's says it.
        mark = f"part-{job}-p"
        return any(posixpath.basename(f).startswith(mark) for f in self.files)

    def document(self) -> bytes:
        """The manifest's file."""
        doc: dict[str, object] = {"job": self.job, "format": self.format, "files": list(self.files)}
        if self.retired:
            doc["retired"] = list(self.retired)
        if self.history:
            doc["history"] = list(self.history)
        if self.dropped:
            doc["dropped"] = True
        return json.dumps(doc, indent=1).encode()


HISTORY = 256
"""The most earlier jobs a manifest remembers (``Manifest.history``). A commit runs
again only after a scheduler crash, before any job that was not waiting for its
commit then: fewer later commits than jobs in flight can come before it."""


# --------------------------------------------------------------------- locations


def normalize(location: str) -> str:
    """A target location as stored: an absolute local path or an ``s3://`` URI,
    without a trailing ``/``."""
    if storage.is_remote(location):
        return location.rstrip("/")
    return os.path.abspath(location).rstrip("/") or "/"


def _fs(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of a location and the location's path on it."""
    if storage.is_remote(location):
        return storage.filesystem(), storage.parse(location).fs_path
    return pafs.LocalFileSystem(), location


def job_staging(target: str, job: str) -> str:
    """Where every attempt of ``job`` stages its files under ``target``."""
    return f"{target}/{STAGING}/{job}"


def attempt_staging(target: str, job: str, partition: int, attempt: int) -> str:
    """The directory only this attempt writes."""
    return f"{job_staging(target, job)}/p{partition}-a{attempt}"


def final_name(job: str, partition: int, staged: str) -> str:
    """The committed name of a staged file (relative to the attempt's directory):
    its hive directories kept, its name prefixed by the job and the task."""
    head, _, name = staged.rpartition("/")
    named = f"part-{job}-p{partition:05d}-{name}"
    return f"{head}/{named}" if head else named


# ---------------------------------------------------------------------- manifest


def read_manifest(target: str) -> Manifest | None:
    """The location's manifest; ``None`` where it has none."""
    fs, base = _fs(target)
    path = f"{base}/{MANIFEST}"

    def load() -> bytes | None:
        if fs.get_file_info(path).type is not pafs.FileType.File:
            return None
        with fs.open_input_stream(path) as f:
            return bytes(f.read())

    # On a store, with its retries, time limits and typed errors (refused
    # credentials, a store down) like every other read of it.
    data = storage.retrying(f"{target}/{MANIFEST}", load) if storage.is_remote(target) else load()
    if data is None:
        return None
    doc = json.loads(data)
    retired = tuple(str(f) for f in doc.get("retired", ()))
    history = tuple(str(j) for j in doc.get("history", ()))
    dropped = bool(doc.get("dropped", False))
    return Manifest(
        str(doc["job"]), tuple(doc["files"]), str(doc["format"]), retired, history, dropped
    )


def manifest_files(location: str) -> tuple[str, ...] | None:
    """The committed files of a location that has a manifest, as full paths or
    URIs; ``None`` where it has none (a plain directory or file).

    Raises:
        CatalogError: the manifest cannot be read.
        DroppedLocationError: the manifest says its table was dropped (``drop``).
    """
    target = normalize(location)
    try:
        manifest = read_manifest(target)
    except (OSError, ValueError, KeyError) as err:
        raise CatalogError(
            f"the manifest of {location!r} ({MANIFEST}) cannot be read: {err}; "
            "write the location again"
        ) from err
    if manifest is None:
        return None
    if manifest.dropped:
        raise DroppedLocationError(
            f"the table at {location!r} was dropped; its files are deleted once the queries "
            "reading them are done"
        )
    return tuple(f"{target}/{f}" for f in manifest.files)


def has_files(target: str) -> bool:
    """Whether anything but mangonel's staging directory lies at ``target``."""
    fs, base = _fs(target)
    info = fs.get_file_info(base)
    if info.type is pafs.FileType.NotFound:
        return False
    if info.type is pafs.FileType.File:
        return True
    for entry in fs.get_file_info(pafs.FileSelector(base, recursive=False)):
        if entry.base_name != STAGING:
            return True
    return False


def _put(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write a small file in one step a reader sees whole or not at all: on local
    disk under a temporary name renamed into place, on S3 one PUT."""
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(posixpath.dirname(path), recursive=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            # A full disk fails the write after the name exists: left there, the
            # empty file would make the location look written (``has_files``).
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
    else:
        with fs.open_output_stream(path) as f:
            f.write(data)


# ------------------------------------------------------------------------ commit


@dataclass(frozen=True)
class Committed:
    """What ``commit`` left: the manifest's files, the ones this job added, and the
    ones it retired (still on disk, for ``delete_retired`` once no reader needs them)."""

    files: tuple[str, ...]
    added: tuple[str, ...]
    retired: tuple[str, ...] = ()


def _list(fs: pafs.FileSystem, base: str) -> list[str]:
    if fs.get_file_info(base).type is not pafs.FileType.Directory:
        return []
    found = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    return sorted(posixpath.relpath(f.path, base) for f in found if f.type is pafs.FileType.File)


def commit(
    target: str,
    job: str,
    winners: Mapping[int, int],
    fmt: str,
    mode: CommitMode,
    after_intent: Callable[[], None] | None = None,
    running: Container[str] = (),
) -> Committed:
    """Make ``job``'s output at ``target`` visible: exactly the files of the attempt
    ``winners[partition]`` of each task. Idempotent: safe to run again after a
    crash at any point of an earlier run.

    Raises:
        WriteConflictError: ``CREATE`` and another job committed there first.
        OSError: the filesystem or store failed (the commit may be run again).
    """
    fs, base = _fs(target)
    staging = f"{base}/{STAGING}/{job}"
    intent_path = f"{staging}/{INTENT}"
    current = read_manifest(target)
    if current is not None and current.names(job):
        # Committed before a crash (and maybe written over since): only the staging
        # directory may be left.
        _remove(fs, staging)
        return Committed(current.files, (), current.retired)
    if mode is CommitMode.CREATE and current is not None:
        # Also where this job's intent is written: a restarted scheduler may have
        # committed another job's first (``abort`` removes what this one moved).
        raise WriteConflictError(
            f"{target} already holds the output of job {current.job}, committed while "
            f"this job ran; write with OVERWRITE to replace it, or to another location"
        )
    if fs.get_file_info(intent_path).type is pafs.FileType.File:
        with fs.open_input_stream(intent_path) as f:
            intent = json.loads(f.read())
        moves = [(str(a), str(b)) for a, b in intent["moves"]]
    else:
        moves = []
        for partition, attempt in sorted(winners.items()):
            src = f"p{partition}-a{attempt}"
            for rel in _list(fs, f"{staging}/{src}"):
                moves.append((f"{src}/{rel}", final_name(job, partition, rel)))
        doc = {"job": job, "moves": moves, "mode": mode.value}
        _put(fs, intent_path, json.dumps(doc).encode())
    if after_intent is not None:
        after_intent()  # a test's crash point: files staged, none moved yet
    for staged, final in moves:
        src, dst = f"{staging}/{staged}", f"{base}/{final}"
        if fs.get_file_info(src).type is pafs.FileType.File:
            if isinstance(fs, pafs.LocalFileSystem):  # S3 has no directories to make
                fs.create_dir(posixpath.dirname(dst), recursive=True)
            fs.move(src, dst)
    added = tuple(sorted(final for _, final in moves))
    # Built on the manifest there now, not the one the intent saw: a restarted
    # scheduler commits in its own order, and another job's may have come between.
    before = current.files if current is not None else ()
    files = tuple(sorted({*before, *added})) if mode is CommitMode.APPEND else added
    # The replaced files stay until the readers planned on the old manifest are
    # done (``delete_retired``): deleting them here failed a scan that was reading
    # them. Those an earlier REPLACE retired and nobody deleted yet (its scheduler
    # restarted) go with this commit's.
    waiting = current.retired if current is not None else ()
    retired = tuple(sorted({*waiting, *before} - set(files)))
    history = (*current.history, current.job)[-HISTORY:] if current is not None else ()
    _put(fs, f"{base}/{MANIFEST}", Manifest(job, files, fmt, retired, history).document())
    # Committed: from here nothing may fail the statement (its client would hear
    # that nothing was written, and a retry would write it twice). What is left
    # staged is swept by the next commit to the location.
    try:
        _remove(fs, staging)
        _sweep(fs, f"{base}/{STAGING}", running)
    except (OSError, MangonelError) as exc:
        log.warning("job %s committed to %s; its staged files stay for now: %s", job, target, exc)
    return Committed(files, added, retired)


def delete_retired(target: str, job: str) -> int:
    """Delete the files ``job``'s commit retired (``Committed.retired``) and take them
    out of the manifest; return how many. Does nothing where a later commit wrote the
    manifest since: that one carried them over, and its own release deletes them.
    After a ``drop`` (``job`` is the drop's id) the manifest goes too, and the
    location with it unless a job stages there (a table made again under the name).
    Idempotent; the caller runs it in the same order as the commits."""
    fs, base = _fs(target)
    current = read_manifest(target)
    if current is None or current.job != job or not (current.retired or current.dropped):
        return 0
    for old in current.retired:
        _delete_file(fs, f"{base}/{old}")
    if current.dropped:
        _delete_file(fs, f"{base}/{MANIFEST}")
        _remove_dropped(fs, base)
    else:
        _put(fs, f"{base}/{MANIFEST}", replace(current, retired=()).document())
    return len(current.retired)


def drop(target: str, drop_id: str) -> Manifest | None:
    """Take every file of a dropped table's location out of its manifest, in one
    step: from here the location holds no committed output, and its files wait as
    retired for the readers planned on them (``delete_retired(target, manifest.job)``).
    Return the manifest that says so (the one there already, where an earlier drop
    wrote it); ``None`` where the location has no manifest (nothing to wait for:
    ``remove_all``).

    Raises:
        OSError, MangonelError: the filesystem or store failed; nothing changed.
    """
    fs, base = _fs(target)
    current = read_manifest(target)
    if current is None or current.dropped:
        return current
    retired = tuple(sorted({*current.retired, *current.files}))
    history = (*current.history, current.job)[-HISTORY:]
    dropped = Manifest(drop_id, (), current.format, retired, history, dropped=True)
    _put(fs, f"{base}/{MANIFEST}", dropped.document())
    return dropped


def _remove_dropped(fs: pafs.FileSystem, base: str) -> None:
    """What is left of a dropped location once its files are deleted: its (hive)
    directories, and the location itself, but never what a job stages there (a
    table made again under the name)."""
    for entry in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
        if entry.base_name != STAGING and entry.type is pafs.FileType.Directory:
            _remove(fs, entry.path)
    if isinstance(fs, pafs.LocalFileSystem):  # a store has no directories to leave
        with contextlib.suppress(OSError):
            os.rmdir(base)  # only if empty: an attempt may be staging there this instant


def waiting_under(root: str) -> list[tuple[str, Manifest]]:
    """The locations directly under ``root`` (a warehouse) whose manifest lists files
    waiting to be deleted (a replace's ``retired``, or a ``drop``'s), with that
    manifest: what a scheduler that stopped before their readers finished left."""
    fs, base = _fs(normalize(root))
    if fs.get_file_info(base).type is not pafs.FileType.Directory:
        return []
    found = []
    for entry in fs.get_file_info(pafs.FileSelector(base)):
        if entry.type is not pafs.FileType.Directory:
            continue
        location = f"{normalize(root)}/{entry.base_name}"
        try:
            manifest = read_manifest(location)
        except (OSError, ValueError, KeyError) as exc:  # that one's files stay
            log.warning("the manifest of %s cannot be read: %s", location, exc)
            continue
        if manifest is not None and (manifest.retired or manifest.dropped):
            found.append((location, manifest))
    return found


def _sweep(fs: pafs.FileSystem, root: str, running: Container[str]) -> None:
    """Remove what jobs that are not ``running`` left staged under ``root``: an attempt
    that finished writing after its job had failed, or one whose executor died."""
    if fs.get_file_info(root).type is not pafs.FileType.Directory:
        return
    for entry in fs.get_file_info(pafs.FileSelector(root)):
        if entry.base_name not in running:
            _remove(fs, entry.path)
    _remove_if_empty(fs, root)


def abort(target: str, job: str) -> None:
    """Remove what ``job`` staged at ``target``, and what a commit of it that failed
    half-way moved; a committed job keeps its files (only what was staged after
    its commit goes)."""
    fs, base = _fs(target)
    current = read_manifest(target)
    staging = f"{base}/{STAGING}/{job}"
    if current is not None and current.names(job):
        # Committed (its manifest is written after its last move): its files stay;
        # what an attempt staged after the commit (a copy that lost, finishing
        # late) goes.
        _remove(fs, staging)
        _remove_if_empty(fs, f"{base}/{STAGING}")
        return
    intent_path = f"{staging}/{INTENT}"
    if fs.get_file_info(intent_path).type is pafs.FileType.File:
        # A commit that failed half-way may have moved some files already.
        with fs.open_input_stream(intent_path) as f:
            intent = json.loads(f.read())
        for _, final in intent["moves"]:
            _delete_file(fs, f"{base}/{final}")
    _remove(fs, staging)
    _remove_if_empty(fs, f"{base}/{STAGING}")


def discard_attempt(staging: str) -> None:
    """Remove what one failed or cancelled attempt staged (``attempt_staging``), and
    its job's staging directories if nothing else is left in them."""
    remote = storage.is_remote(staging)
    fs, path = _fs(staging) if remote else (pafs.LocalFileSystem(), staging)
    _remove(fs, path)
    job_dir = posixpath.dirname(path)
    _remove_if_empty(fs, job_dir)
    _remove_if_empty(fs, posixpath.dirname(job_dir))


def remove_all(target: str) -> None:
    """Delete everything at a location a dropped table owned, one without a manifest."""
    fs, base = _fs(target)
    _remove(fs, base)


def _remove(fs: pafs.FileSystem, path: str) -> None:
    try:
        if fs.get_file_info(path).type is pafs.FileType.Directory:
            fs.delete_dir(path)
    except FileNotFoundError:
        pass


def _remove_if_empty(fs: pafs.FileSystem, path: str) -> None:
    """Remove the staging root once no job stages there (another may start at once:
    its ``create_dir`` makes it again, and a race only leaves an empty directory)."""
    try:
        if fs.get_file_info(path).type is pafs.FileType.Directory and not fs.get_file_info(
            pafs.FileSelector(path)
        ):
            fs.delete_dir(path)
    except OSError:
        pass


def _delete_file(fs: pafs.FileSystem, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)
