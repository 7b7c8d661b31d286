"""Where the scheduler keeps its state: the ``StateStore`` contract (``base``), its
implementations (``sqlite``, ``etcd``, and in ``base`` the in-memory ones) and
``open_store``, which picks one by URL.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mangonel.errors import StateStoreError, StateStoreUnreachableError
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

_RETRY_S = 1.0  # between tries of a store that no server of answered


def open_store(
    url: str, wait_s: float = 0.0, on_wait: Callable[[str], None] | None = None
) -> StateStore:
    """Open the state store named by ``url``.

    ``sqlite:///abs/path.db`` or ``sqlite://relative/path.db`` (or a bare path),
    ``etcd://host:port[,host:port...][/prefix]``, ``memory://``.

    A store that no server of answers (``StateStoreUnreachableError``: etcd not
    started yet, or its name not resolving yet in a container just started) is
    tried again for up to ``wait_s`` seconds; ``on_wait`` hears once that it waits.

    Raises:
        StateStoreError: unknown scheme, or the store cannot be opened or is corrupt.
        StateStoreUnreachableError: no server answered, for ``wait_s`` seconds.
    """
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        try:
            return _open(url)
        except StateStoreUnreachableError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                if not told:
                    raise
                raise StateStoreUnreachableError(
                    f"{exc}; waited {round(wait_s, 1):g} s for it (--state-wait)"
                ) from None
            if not told and on_wait is not None:
                on_wait(f"waiting up to {round(wait_s, 1):g} s for the state store: {exc}")
            told = True
            time.sleep(min(_RETRY_S, left))


def _open(url: str) -> StateStore:
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
