"""Where the scheduler keeps its state: the ``StateStore`` contract (``base``), its
implementations (``sqlite``, ``etcd``, and in ``base`` the in-memory ones) and
``open_store``, which picks one by URL.
"""

from __future__ import annotations

from mangonel.errors import StateStoreError
from mangonel.scheduler.store.base import (
    CatalogStore,
    MemoryCatalogStore,
    MemoryStateStore,
    StateStore,
)

__all__ = [
    "CatalogStore",
    "MemoryCatalogStore",
    "MemoryStateStore",
    "StateStore",
    "open_store",
]


def open_store(url: str) -> StateStore:
    """Open the state store named by ``url``.

    ``sqlite:///abs/path.db`` or ``sqlite://relative/path.db`` (or a bare path),
    ``etcd://host:port[,host:port...][/prefix]``, ``memory://``.

    Raises:
        StateStoreError: unknown scheme, or the store cannot be opened or is corrupt.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "sqlite", url
    if scheme == "memory":
        return MemoryStateStore(url)
    if scheme == "sqlite":
        from mangonel.scheduler.store.sqlite import SqliteStateStore

        if not rest:
            raise StateStoreError(f"state store {url!r} names no file: use sqlite:///path/state.db")
        return SqliteStateStore(rest, url=url)
    if scheme == "etcd":
        from mangonel.scheduler.store.etcd import EtcdStateStore

        return EtcdStateStore.from_url(url)
    raise StateStoreError(
        f"unknown state store {url!r}: use sqlite:///path/state.db, etcd://host:2379 or memory://"
    )
