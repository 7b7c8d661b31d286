"""mangonel: a distributed SQL query engine whose queries survive lost executors.

>>> import mangonel                                                    # doctest: +SKIP
>>> with mangonel.LocalCluster(executors=2) as cluster, cluster.connect() as s:
...     s.register_parquet("lineitem", "/data/lineitem.parquet")
...     s.sql("SELECT count(*) FROM lineitem").to_pandas()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mangonel.client.fetch import ResultUnavailableError
from mangonel.client.session import Result, Session, connect
from mangonel.errors import (
    AuthenticationError,
    BindError,
    CatalogError,
    ClusterError,
    ForbiddenStatementError,
    InternalError,
    JobCancelledError,
    JobFailedError,
    MangonelError,
    PermissionDeniedError,
    QueryError,
    QueryTimeoutError,
    SqlSyntaxError,
    UnknownTableError,
)

if TYPE_CHECKING:
    from mangonel.client.cluster import LocalCluster

__all__ = [
    "connect",
    "LocalCluster",
    "Session",
    "Result",
    "MangonelError",
    "QueryError",
    "SqlSyntaxError",
    "ForbiddenStatementError",
    "UnknownTableError",
    "BindError",
    "CatalogError",
    "InternalError",
    "JobFailedError",
    "JobCancelledError",
    "QueryTimeoutError",
    "ClusterError",
    "ResultUnavailableError",
    "AuthenticationError",
    "PermissionDeniedError",
]


def __getattr__(name: str) -> Any:
    # LocalCluster pulls in subprocess management; load it only when asked for.
    if name == "LocalCluster":
        from mangonel.client.cluster import LocalCluster

        return LocalCluster
    raise AttributeError(f"module 'mangonel' has no attribute {name!r}")
