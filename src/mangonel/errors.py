"""Every error mangonel shows a user, in one tree.

::

    MangonelError                  base of everything below
    ├── QueryError                 the query cannot run as written
    │   ├── SqlSyntaxError         the parser rejected it (with line and column)
    │   ├── ForbiddenStatementError not a SELECT over catalog tables (COPY, ATTACH, SET, ...)
    │   ├── UnknownTableError      a table that the catalog does not hold
    │   ├── BindError              unknown column, wrong types, ... (DuckDB's words)
    │   └── BadRowError            a CSV or JSON table's row does not parse (file and line)
    ├── WriteTargetFullError       a write statement's target file system had no room left
├── CatalogError               registering a table failed (missing path, not Parquet)
    │   └── ObjectStoreError       object storage (S3) failed; names the object
    │       ├── ObjectNotFoundError     no such bucket, key or prefix
    │       ├── ObjectAccessError       credentials missing, unknown or refused
    │       ├── ObjectChangedError      overwritten or deleted since it was registered
    │       └── ObjectStoreUnavailableError  unreachable or timing out, after retries
    ├── InternalError              a bug in mangonel, not in the query (how to report it)
    ├── JobFailedError             the job failed while running (which task, where, why)
    │   ├── JobCancelledError      the job was cancelled
    │   └── Job<X>Error            failed while running for a typed reason: also an <X>Error
    │                              (QueryError, InternalError, WriteTargetFullError,
    │                              ObjectStoreError and the four kinds of it), see ``ErrorType``
    ├── QueryTimeoutError          the query outlasted the caller's timeout
    ├── ClusterError               the scheduler or executors cannot be reached
    │   ├── ResultUnavailableError a result partition could not be read: its executor
    │   │                          is gone or refused the ticket (``client.fetch``;
    │   │                          ``Session`` runs the query again before raising)
    │   └── SchedulerStoppingError the scheduler began to stop under the call, which
    │                              did nothing: the client sends it again (to the
    │                              leader, or to this one once it is back)
    ├── SecurityError              a request was refused
    │   ├── AuthenticationError    no credentials, or a wrong password, an unknown user,
    │   │   │                      an expired, forged, malformed or revoked token
    │   │   └── LoginThrottledError too many failed logins: try again in N s
    │   └── PermissionDeniedError  another user's job, or an admin's action
    └── StateStoreError            the scheduler's state store cannot be opened or written
        ├── StateStoreUnreachableError  no server of it answered (it may, later)
        └── StoreFencedError       another scheduler took the store over (this one must stop)

Each message says what happened and what to do about it, in plain text: every
door a message leaves by (the gRPC API, Flight SQL, the web UI and REST API)
sends it through ``plain_text``, which drops terminal escape sequences (sqlglot
underlines the token it stopped at with them) and control characters.

A job that fails while it runs keeps its error's type on the way to the client:
the executor names it on the task's failure, the scheduler on the job's
(``ErrorType``, whose value is the class's name: ``JobStatus.error_type`` on the
wire, ``error_type`` in the REST API, the prefix of a Flight SQL error), and the
Python client raises a class that is both that error and a ``JobFailedError``
(``job_failure``): ``except ObjectChangedError`` and ``except JobFailedError``
both catch an object overwritten under a running query. Only a ``QueryError``
tells the user to fix the query: that is what DuckDB reports as the query's own
operations failing on the data (a value that does not convert, an overflow, a
division by zero, an invalid argument to a function), since no retry can change
it, and rewriting the query (``TRY_CAST``, a filter) can. A changed object, a
store that is down and a bug of mangonel each say what to do instead.
"""

from __future__ import annotations

import enum
import re
from typing import ClassVar


class MangonelError(Exception):
    """Base class of every error mangonel raises on purpose."""


class QueryError(MangonelError):
    """The query cannot run as written; fix the query."""


class SqlSyntaxError(QueryError):
    """The SQL does not parse."""


class ForbiddenStatementError(QueryError):
    """Only SELECT (and EXPLAIN) over catalog tables may run."""


class UnknownTableError(QueryError):
    """The query names a table the catalog does not hold."""

    def __init__(self, message: str, table: str | None = None) -> None:
        super().__init__(message)
        self.table = table
        """The name, where one table is meant (lower case, as the catalog keys it)."""


class BindError(QueryError):
    """Unknown column, type mismatch or another semantic error."""


class BadRowError(QueryError):
    """A row of a CSV or JSON table cannot be read as its columns say; names the file
    and the line."""


class CatalogError(MangonelError):
    """A table could not be registered or read."""


class DroppedLocationError(CatalogError):
    """The location holds a dropped table, whose files wait for the queries that
    read them before they are deleted (``output.drop``)."""


class ObjectStoreError(CatalogError):
    """Object storage (S3 or an S3-compatible server) failed; the message names the object."""


class ObjectNotFoundError(ObjectStoreError):
    """The bucket, the object or the prefix does not exist."""


class ObjectAccessError(ObjectStoreError):
    """The store refused the request: credentials missing, unknown, wrong or not allowed."""


class ObjectChangedError(ObjectStoreError):
    """An object was overwritten or deleted after its table was registered."""


class ObjectStoreUnavailableError(ObjectStoreError):
    """The store could not be reached or did not answer in time, even after retries."""


class InternalError(MangonelError):
    """A bug in mangonel, not in the query (the planner wrote SQL that DuckDB
    refuses, though the query binds): the message says how to report it."""


class JobFailedError(MangonelError):
    """The job failed while it ran.

    Where the scheduler knows why in a type, the client raises a subclass that is
    that type too (``job_failure``); this class itself: no more precise type
    (attempts used up, executors lost, none alive).
    """

    advice: ClassVar[str] = ""
    """What to do, as the end of the job's message (the scheduler appends it)."""


class JobCancelledError(JobFailedError):
    """The job was cancelled before it finished."""


class QueryTimeoutError(MangonelError):
    """The query did not finish (or its result could not be read) within the
    timeout the caller gave it; the message says where it stood."""


class ClusterError(MangonelError):
    """The scheduler or an executor could not be reached."""


class SchedulerStoppingError(ClusterError):
    """The scheduler began to stop (a restart, a handover) while it served the call,
    which did nothing (a ``DROP TABLE`` refused by its stopping commit thread): the
    gRPC service answers ``UNAVAILABLE``, and the client sends the call again, to
    the leader or to this scheduler once it is back."""


class SecurityError(MangonelError):
    """A request was refused: who sent it is not proven, or they may not do it."""


class AuthenticationError(SecurityError):
    """Credentials missing, wrong, expired or forged: log in again with valid ones."""


class LoginThrottledError(AuthenticationError):
    """Too many failed logins of this user name, or from this address: the message
    says in how many seconds to try again (``security.login_limits``)."""


class PermissionDeniedError(SecurityError):
    """The user is known but may not do this (another user's job, an admin's action)."""


class WriteTargetFullError(MangonelError):
    """A write statement's target (the ``COPY`` location, the warehouse) ran out of
    space while its tasks wrote; the message names the location and its file system.
    Nothing of the statement was committed, and its staged files were removed."""


class StateStoreError(MangonelError):
    """The scheduler's durable state (SQLite file, etcd) cannot be opened, read or written."""


class StateStoreUnreachableError(StateStoreError):
    """No server of the state store answered (connection refused or timed out, its name
    not resolving): it may answer later, unlike a store that refused or is damaged."""


class StoreFencedError(StateStoreError):
    """Another scheduler leads now: this one may not write, and must stop serving."""


# ------------------------------------------------------- failed while running


class JobQueryError(QueryError, JobFailedError):
    """The query's own operations failed on the data while it ran (a value that
    does not convert, an overflow, a division by zero): fix the query."""

    advice = "The query cannot run as written; fix it and submit it again."


class JobInternalError(InternalError, JobFailedError):
    """A bug in mangonel met while the job ran (DuckDB refused the SQL the planner
    wrote, or the plan cannot run): report it."""

    advice = (
        "This is a bug in mangonel, not in the query: please report it with the query's "
        "text and this message; the scheduler's log has more under the job's id."
    )


class JobObjectStoreError(ObjectStoreError, JobFailedError):
    """A table's object could not be read while the job ran (no longer Parquet,
    or the store failed in a way no more precise class names)."""

    advice = (
        "Check that the object is still there and still Parquet, register the table "
        "again if it changed, then run the query again."
    )


class JobObjectNotFoundError(ObjectNotFoundError, JobFailedError):
    """A table's object was gone when the job read it."""

    advice = "Register the table again (its objects changed), then run the query again."


class JobObjectAccessError(ObjectAccessError, JobFailedError):
    """The store refused the executors' reads of a table's object."""

    advice = (
        "Check the credentials in the executors' environment and that they may read "
        "the bucket, then run the query again."
    )


class JobObjectChangedError(ObjectChangedError, JobFailedError):
    """A table's object was overwritten or deleted after the table was registered
    (or while the job read it)."""

    advice = (
        "A file of a table the query reads changed after the table was registered: "
        "register the table again to read what it holds now, then run the query again."
    )


class JobObjectStoreUnavailableError(ObjectStoreUnavailableError, JobFailedError):
    """The store did not answer the job's reads, even after every retry."""

    advice = (
        "The object store did not answer, even after retries: run the query again once "
        "it is reachable."
    )


class JobWriteTargetFullError(WriteTargetFullError, JobFailedError):
    """A write statement's target file system filled up while the job wrote to it."""

    advice = (
        "Nothing was written: free space on that file system (or give it more), or write "
        "to another location, then run the statement again."
    )


class ErrorType(enum.Enum):
    """Why a job failed while it ran, as the error class it is blamed on.

    The value is that class's name, which the wire carries
    (``JobStatus.error_type``); ``raised`` is the class a client raises for it,
    both that class and a ``JobFailedError``.

    >>> ErrorType.of(ObjectChangedError("s3://b/k was overwritten")).raised.__name__
    'JobObjectChangedError'
    """

    JOB_FAILED = "JobFailedError"
    """No more precise type: attempts used up, executors lost, none alive."""
    QUERY = "QueryError"
    INTERNAL = "InternalError"
    OBJECT_STORE = "ObjectStoreError"
    OBJECT_NOT_FOUND = "ObjectNotFoundError"
    OBJECT_ACCESS = "ObjectAccessError"
    OBJECT_CHANGED = "ObjectChangedError"
    OBJECT_STORE_UNAVAILABLE = "ObjectStoreUnavailableError"
    WRITE_TARGET_FULL = "WriteTargetFullError"

    @classmethod
    def of(cls, exc: BaseException) -> ErrorType:
        """The type of ``exc``: its nearest class among the members' (else ``JOB_FAILED``)."""
        names = {t.value: t for t in cls}
        for klass in type(exc).__mro__:
            if klass.__name__ in names and klass.__module__ == __name__:
                return names[klass.__name__]
        return cls.JOB_FAILED

    @property
    def raised(self) -> type[JobFailedError]:
        """The class a client raises for a job that failed so."""
        return _RAISED[self]

    @property
    def advice(self) -> str:
        """What to do about it: the end of the job's message ("" for ``JOB_FAILED``,
        whose messages each say it)."""
        return self.raised.advice


_RAISED: dict[ErrorType, type[JobFailedError]] = {
    ErrorType.JOB_FAILED: JobFailedError,
    ErrorType.QUERY: JobQueryError,
    ErrorType.INTERNAL: JobInternalError,
    ErrorType.OBJECT_STORE: JobObjectStoreError,
    ErrorType.OBJECT_NOT_FOUND: JobObjectNotFoundError,
    ErrorType.OBJECT_ACCESS: JobObjectAccessError,
    ErrorType.OBJECT_CHANGED: JobObjectChangedError,
    ErrorType.OBJECT_STORE_UNAVAILABLE: JobObjectStoreUnavailableError,
    ErrorType.WRITE_TARGET_FULL: JobWriteTargetFullError,
}


def job_failure(error_type: str, message: str) -> JobFailedError:
    """The error a client raises for a job that ended without a result.

    Args:
        error_type: ``JobStatus.error_type``: an ``ErrorType`` value or
            ``JobCancelledError``; anything else (empty from an older scheduler,
            or a type a newer one knows) gives a plain ``JobFailedError``.
        message: The job's error, as the scheduler wrote it.

    >>> type(job_failure("ObjectChangedError", "...")).__name__
    'JobObjectChangedError'
    >>> type(job_failure("SomethingNew", "...")).__name__
    'JobFailedError'
    """
    if error_type == JobCancelledError.__name__:
        return JobCancelledError(message)
    try:
        kind = ErrorType(error_type)
    except ValueError:
        kind = ErrorType.JOB_FAILED
    return kind.raised(message)


_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
"""Terminal escape sequences: CSI (colours, underline: ``ESC [ 4 m``), OSC, and the
two-character ones."""
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def plain_text(message: str) -> str:
    """``message`` without terminal escape sequences and control characters (line
    breaks and tabs stay): how an error's text leaves mangonel.

    >>> plain_text("near '\\x1b[4m=\\x1b[0m'")
    "near '='"
    """
    return _CONTROLS.sub("", _ESCAPES.sub("", message))


def then(message: str, more: str) -> str:
    """``message``, then the sentence ``more``: a full stop between them unless
    ``message`` ends a sentence already (DuckDB's own errors end in "." or "!").

    >>> then("Division by zero.", "Fix the query.")
    'Division by zero. Fix the query.'
    >>> then("no file", "Check the path.")
    'no file. Check the path.'
    """
    if not more:
        return message
    stripped = message.rstrip()
    return f"{stripped} {more}" if stripped.endswith((".", "!", "?")) else f"{stripped}. {more}"
