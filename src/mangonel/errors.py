"""Every error mangonel shows a user, in one tree.

::

    MangonelError                  base of everything below
    ├── QueryError                 the query cannot run as written
    │   ├── SqlSyntaxError         the parser rejected it (with line and column)
    │   ├── ForbiddenStatementError not a SELECT over catalog tables (COPY, ATTACH, SET, ...)
    │   ├── UnknownTableError      a table that the catalog does not hold
    │   └── BindError              unknown column, wrong types, ... (DuckDB's words)
    ├── CatalogError               registering a table failed (missing path, not Parquet)
    │   └── ObjectStoreError       object storage (S3) failed; names the object
    │       ├── ObjectNotFoundError     no such bucket, key or prefix
    │       ├── ObjectAccessError       credentials missing, unknown or refused
    │       ├── ObjectChangedError      overwritten or deleted since it was registered
    │       └── ObjectStoreUnavailableError  unreachable or timing out, after retries
    ├── InternalError              a bug in mangonel, not in the query (how to report it)
    ├── JobFailedError             the job failed while running (which task, where, why)
    ├── JobCancelledError          the job was cancelled
    ├── QueryTimeoutError          the query outlasted the caller's timeout
    ├── ClusterError               the scheduler or executors cannot be reached
    ├── SecurityError              a request was refused
    │   ├── AuthenticationError    no credentials, or a wrong password, an unknown user,
    │   │                          an expired, forged or malformed token
    │   └── PermissionDeniedError  another user's job, or an admin's action
    └── StateStoreError            the scheduler's state store cannot be opened or written
        └── StoreFencedError       another scheduler took the store over (this one must stop)

Each message says what happened and what to do about it.
"""

from __future__ import annotations


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


class BindError(QueryError):
    """Unknown column, type mismatch or another semantic error."""


class CatalogError(MangonelError):
    """A table could not be registered or read."""


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
    """The job failed while it ran."""


class JobCancelledError(JobFailedError):
    """The job was cancelled before it finished."""


class QueryTimeoutError(MangonelError):
    """The query did not finish (or its result could not be read) within the
    timeout the caller gave it; the message says where it stood."""


class ClusterError(MangonelError):
    """The scheduler or an executor could not be reached."""


class SecurityError(MangonelError):
    """A request was refused: who sent it is not proven, or they may not do it."""


class AuthenticationError(SecurityError):
    """Credentials missing, wrong, expired or forged: log in again with valid ones."""


class PermissionDeniedError(SecurityError):
    """The user is known but may not do this (another user's job, an admin's action)."""


class StateStoreError(MangonelError):
    """The scheduler's durable state (SQLite file, etcd) cannot be opened, read or written."""


class StoreFencedError(StateStoreError):
    """Another scheduler leads now: this one may not write, and must stop serving."""
