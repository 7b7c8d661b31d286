"""How a task attempt fails: one exception carrying a typed ``TaskFailure``.

The scheduler decides what to do from the failure's type, so the executor must
say *why* precisely:

* ``FragmentRejected``: DuckDB refused the fragment's SQL itself (binder,
  parser, catalog errors). The planner wrote that SQL, and the user's query
  bound as a whole before it was planned, so it is a bug in mangonel: the job
  fails at once, as an internal error.
* ``QueryError``: the query's own operations fail on the data (conversion,
  out of range, type errors at run time, a file function refused). Running it
  again anywhere gives the same error, so the job fails at once.
* ``FetchFailed``: an upstream map output could not be read (its executor is
  gone, or the file fails its checksum). It names that map output, so exactly
  it is recomputed.
* ``ExecutionError``: anything else (out of memory, I/O, an internal error);
  another attempt may succeed. Two kinds are told apart (``ExecutionProblem``):
  ``OUT_OF_MEMORY``, DuckDB's ``OutOfMemoryException`` or Python's
  ``MemoryError``: the message says the slot's limit and the executor's budget
  it is a share of, and what to change; ``DISK_FULL``, ``ENOSPC`` (or a quota)
  while writing shuffle or spill files, or DuckDB's spill cap reached
  (``max_temp_directory_size``, also an ``OutOfMemoryException``): the executor
  then reports itself unhealthy until space returns (``executor.health``).

A writing task (``executor.sink``) whose *target* fills up, not the executor's
work directory, is a ``QueryError`` of type ``WRITE_TARGET_FULL``
(``write_target_full``): every attempt writes to that one file system, so the
job fails at once with a message naming it, and the executor stays healthy:
its own disk has room, and it keeps serving other queries.

Object storage (``mangonel.storage``): an object that is gone, changed since it
was registered, refused or not Parquet is a ``QueryError`` (every attempt would
meet the same object); a store that did not answer after its own retries is an
``ExecutionError``, so the task is tried again, a bounded number of times. Each
carries the store's error as its ``error_type`` (``ErrorType.of``), which the
job's failure and the client's error keep: the user is told that the object
changed or that the store was away, not that the query is wrong.
"""

from __future__ import annotations

import errno
import os
import shutil

import duckdb

from mangonel.errors import BadRowError, CatalogError, ErrorType, ObjectStoreUnavailableError
from mangonel.executor.memory import SlotBudget, format_size
from mangonel.task import (
    ExecutionError,
    ExecutionProblem,
    FetchFailed,
    FragmentRejected,
    QueryError,
    TaskFailure,
)

# DuckDB's exception classes raised before a statement runs, from its text and the
# schemas alone: a fragment that meets one was written wrong by the planner.
_FRAGMENT_ERRORS: tuple[type[BaseException], ...] = (
    duckdb.BinderException,
    duckdb.CatalogException,
    duckdb.ParserException,
    duckdb.SyntaxException,
)

# The same by the prefix of DuckDB's message (see ``_QUERY_ERROR_PREFIXES``).
_FRAGMENT_ERROR_PREFIXES: tuple[str, ...] = (
    "Binder Error",
    "Catalog Error",
    "Parser Error",
    "Syntax Error",
)

# DuckDB's exception classes whose cause lies in the statement itself. Everything
# else DuckDB raises (OutOfMemoryException, IOException, InternalException,
# InterruptException, ...) is about the run, and a retry may help.
_QUERY_ERRORS: tuple[type[BaseException], ...] = (
    duckdb.ProgrammingError,  # InvalidInput, InvalidType (and the fragment errors above)
    duckdb.DataError,  # Conversion, OutOfRange, TypeMismatch
    duckdb.NotSupportedError,
    duckdb.PermissionException,  # a file function or setting the lock refused
    duckdb.IntegrityError,
)

# The same kinds by the prefix of DuckDB's message: an error raised while an
# Arrow stream is being read reaches Python as a bare OSError that keeps only
# the message ("Conversion Error: Could not convert ...").
_QUERY_ERROR_PREFIXES: tuple[str, ...] = (
    "Invalid Input Error",
    "Invalid Type Error",
    "Conversion Error",
    "Out of Range Error",
    "Type Mismatch Error",
    "Mismatch Type Error",
    "Not implemented Error",
    "Permission Error",
    "Constraint Error",
)


class TaskFailedError(Exception):
    """A task attempt failed; ``failure`` says why, in the scheduler's types.

    Args:
        failure: The typed reason, reported to the scheduler as is.
    """

    def __init__(self, failure: TaskFailure) -> None:
        super().__init__(failure.message)
        self.failure: TaskFailure = failure


class FetchFailedError(TaskFailedError):
    """An upstream map output could not be read; ``failure`` names it."""

    failure: FetchFailed

    def __init__(self, failure: FetchFailed) -> None:
        super().__init__(failure)
        self.failure = failure


class TaskCancelledError(Exception):
    """The task was cancelled while it ran (the scheduler asked for it)."""


_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded")
_OUT_OF_MEMORY_PREFIX = "Out of Memory Error"
_SPILL_CAP_SETTING = "max_temp_directory_size"


def classify(exc: BaseException, budget: SlotBudget | None = None) -> TaskFailure:
    """Map an exception raised while running a task to a typed failure.

    Args:
        exc: What the task raised.
        budget: The slot's memory and spill limits, named in an out-of-memory
            or disk-full message.

    >>> classify(duckdb.BinderException("Binder Error: no column x"))
    FragmentRejected(message='Binder Error: no column x')
    >>> classify(duckdb.ConversionException("Conversion Error: Could not convert 'a'"))
    QueryError(message="Conversion Error: Could not convert 'a'")
    """
    if isinstance(exc, TaskFailedError):
        return exc.failure
    message = str(exc) or type(exc).__name__
    if isinstance(exc, ObjectStoreUnavailableError):
        return ExecutionError(message, error_type=ErrorType.OBJECT_STORE_UNAVAILABLE)
    if isinstance(exc, BadRowError):  # a CSV or JSON row that does not parse
        return QueryError(message)
    if isinstance(exc, CatalogError):  # an object gone, changed, refused, not Parquet
        return QueryError(message, ErrorType.of(exc))
    if isinstance(exc, _FRAGMENT_ERRORS) or (
        isinstance(exc, OSError) and message.startswith(_FRAGMENT_ERROR_PREFIXES)
    ):
        return FragmentRejected(message)
    if isinstance(exc, _QUERY_ERRORS) or (
        isinstance(exc, OSError) and message.startswith(_QUERY_ERROR_PREFIXES)
    ):
        return QueryError(message)
    if _is_disk_full(exc):
        return disk_full(message)
    if isinstance(exc, duckdb.OutOfMemoryException | MemoryError) or message.startswith(
        _OUT_OF_MEMORY_PREFIX
    ):
        if _SPILL_CAP_SETTING in message:
            return spill_cap_reached(message, budget)
        return out_of_memory(message, budget)
    return ExecutionError(f"{type(exc).__name__}: {message}")


def out_of_memory(detail: str, budget: SlotBudget | None) -> ExecutionError:
    """The failure of a task that needed more memory than its slot's share."""
    share = f"its slot's share, {budget.describe()}" if budget else "its slot's memory"
    return ExecutionError(
        f"out of memory: the task needed more than {share}; raise the executors' "
        f"--memory or lower their --slots (DuckDB said: {_first_line(detail)})",
        ExecutionProblem.OUT_OF_MEMORY,
    )


def spill_cap_reached(detail: str, budget: SlotBudget | None) -> ExecutionError:
    """The failure of a task that spilled more than its slot's part of the spill budget."""
    cap = f" ({format_size(budget.spill)} per slot)" if budget and budget.spill is not None else ""
    return ExecutionError(
        f"disk full: the task spilled more than its slot's part of the executor's spill "
        f"budget{cap}; give the executors more disk (--spill, --work-dir) or memory "
        f"(--memory), or lower their --slots (DuckDB said: {_first_line(detail)})",
        ExecutionProblem.DISK_FULL,
    )


def disk_full(detail: str) -> ExecutionError:
    """The failure of a task that found no room in the work directory."""
    return ExecutionError(
        f"disk full: no space left in the executor's work directory for shuffle or "
        f"spill files ({_first_line(detail)}); the task runs again on another executor, "
        f"and this one takes no task until space returns",
        ExecutionProblem.DISK_FULL,
    )


def write_target_full(target: str, work_dir: str, exc: BaseException) -> QueryError | None:
    """The failure of a writing task whose local ``target`` ran out of space, or
    ``None`` where ``exc`` is not that (another error, or the full disk is the
    executor's own ``work_dir`` too: then ``classify``'s ``DISK_FULL``).

    The target is blamed when DuckDB's message names it, or when it lies on another
    file system than the work directory (DuckDB may spill there as it writes).
    """
    if not _is_disk_full(exc):
        return None
    message = str(exc)
    try:
        elsewhere = os.stat(_existing(target)).st_dev != os.stat(_existing(work_dir)).st_dev
    except OSError:
        elsewhere = False
    if target not in message and not elsewhere:
        return None
    mount = _mount_point(target)
    try:
        usage = shutil.disk_usage(_existing(target))
        room = f"{format_size(usage.free)} free of {format_size(usage.total)}"
    except OSError:
        room = "its size unknown"
    return QueryError(
        f"disk full: the write target {target} ran out of space (its file system, mounted "
        f"at {mount}, has {room} after the job's staged files were removed): nothing was "
        f"written (DuckDB said: {_first_line(message)})",
        ErrorType.WRITE_TARGET_FULL,
    )


def _existing(path: str) -> str:
    """``path``, or its nearest ancestor that exists."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _mount_point(path: str) -> str:
    """The mount point of the file system ``path`` lies on."""
    path = os.path.realpath(_existing(path))
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def _is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is a full disk."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(current) for text in _DISK_FULL_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
