"""The highly available state store: etcd v3 (``etcd://host:port[,host:port...][/prefix]``).

Layout, under the URL's prefix (``/mangonel/default/`` when it names none):

* ``<prefix>state/<key>``: the scheduler's state, one etcd key per contract key;
* ``<prefix>leader``: the owner of the scheduler that leads, bound to its lease.

Leadership is the leader key. ``acquire`` grants a lease (``ttl_s``, 3 s by
default) and creates the key in a transaction that compares its
``create_revision`` with 0, so exactly one scheduler creates it; the others poll
until it is gone. A daemon thread refreshes the lease every ``ttl_s / 3``; when
etcd says the lease is gone, or no refresh got through before it would have run
out, the store sets ``deposed`` and the scheduler must stop serving. When the
leader dies its lease runs out and etcd deletes the key, so a follower takes over
within ``ttl_s`` plus one poll.

Fencing does not trust that thread: every ``commit`` is ONE transaction whose
compare checks that the leader key's ``create_revision`` is still the one this
scheduler created, with the puts and deletes as its success operations. A leader
whose lease ran out while it was frozen (a GC pause, a partition) fails that
compare even before it notices, and writes nothing.

Limits a commit cannot exceed (etcd refuses the whole transaction): etcd's
``--max-txn-ops`` (128 by default) puts and deletes, and ``--max-request-bytes``
(1.5 MiB by default) in all. They are checked before sending, with a message that
names the limit; pass the server's values as ``max_txn_ops`` / ``max_request_bytes``
(or ``?max_txn_ops=...&max_request_bytes=...`` in the URL) when it was started
with others.

The client is etcd3gw, which speaks to etcd's JSON gateway (``/v3/...``) over
HTTP: pure Python, maintained, no generated gRPC stubs. Several endpoints may be
given: requests go to the first that answers and move to the next when one does
not. A store that reaches none of them at open raises ``StateStoreError`` naming
them, and no store is returned.

A secured etcd (``EtcdAccess``, options of the URL): ``tls_ca=FILE`` speaks HTTPS
and trusts only that CA (etcd's own, or the cluster's); ``tls_cert=FILE&tls_key=FILE``
presents a client certificate (etcd's ``--client-cert-auth``); ``user=NAME&
password_file=FILE`` logs in to etcd's own authentication (``etcdctl auth enable``)
and sends its token with every request, logging in again when etcd drops it.
One or the other: once its authentication is on, etcd refuses requests that come
through its JSON gateway with a client certificate that names a user (etcd 3.5).

Why it is over 600 lines: one store over etcd's JSON gateway. Leadership (the
lease and its keep-alive), the state's keys and the HTTP session they go through
(several endpoints, failover, login tokens) serve one ``StateStore`` and share
that session; each is a class of its own here.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import (
    ConnectionFailedError,
    ConnectionTimeoutError,
    Etcd3Exception,
)

from mangonel.errors import StateStoreError, StateStoreUnreachableError
from mangonel.scheduler.store.base import StateStore

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/mangonel/default/"
DEFAULT_PORT = 2379
DEFAULT_TTL_S = 3
ETCD_MAX_TXN_OPS = 128  # etcd's --max-txn-ops default
ETCD_MAX_REQUEST_BYTES = 1_572_864  # etcd's --max-request-bytes default (1.5 MiB)
_POLL_S = 0.2  # how often a follower looks whether the leader key is gone
_REQUEST_TIMEOUT_S = 10.0
_RANGE_PAGE = 256  # keys per range request in load: bounds one response's size
# Bytes a put or delete costs in the request beyond its key and value (protobuf tags,
# lengths, the lease id, the RequestOp wrapper), rounded up; and the fixed part (the
# compare on the leader key, the failure range, the raft header).
_OP_OVERHEAD = 32
_TXN_OVERHEAD = 512

_T = TypeVar("_T")

_INT_OPTIONS = ("ttl_s", "max_txn_ops", "max_request_bytes")
_ACCESS_OPTIONS = ("tls_ca", "tls_cert", "tls_key", "user", "password_file")


@dataclasses.dataclass(frozen=True)
class EtcdAccess:
    """How to reach a secured etcd; all ``None``: plain HTTP, no login.

    Attributes:
        tls_ca: PEM CA that signed etcd's server certificate: HTTPS when set.
        tls_cert: PEM client certificate for etcd's ``--client-cert-auth``.
        tls_key: Its key.
        user: etcd user to log in as (etcd's own authentication).
        password_file: File holding that user's password (never the URL itself).
    """

    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    user: str | None = None
    password_file: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise StateStoreError("an etcd client certificate needs both tls_cert and tls_key")
        if (self.tls_cert is not None) and self.tls_ca is None:
            raise StateStoreError("an etcd client certificate needs tls_ca (HTTPS) too")
        if (self.user is None) != (self.password_file is None):
            raise StateStoreError("etcd's login needs both user and password_file")

    def password(self) -> str:
        assert self.password_file is not None
        try:
            with open(self.password_file) as f:
                return f.read().strip()
        except OSError as exc:
            raise StateStoreError(
                f"cannot read etcd's password file {self.password_file}: {exc.strerror}"
            ) from exc


class EtcdStateStore(StateStore):
    """A ``StateStore`` in etcd v3, with leadership by lease for a highly available pair.

    Args:
        endpoints: ``host:port`` of one or more members of one etcd cluster.
        prefix: Where this scheduler's keys live (two pairs on one etcd use two prefixes).
        ttl_s: The leader lease's time to live, in whole seconds: how long a dead
            leader keeps the lead (etcd raises it to its own minimum, about 2 s).
        max_txn_ops: The server's ``--max-txn-ops``.
        max_request_bytes: The server's ``--max-request-bytes``.
        url: How the user named the store, for messages.
        access: TLS and login for a secured etcd.

    Raises:
        StateStoreError: no endpoint answers.
    """

    def __init__(
        self,
        endpoints: list[str],
        prefix: str = DEFAULT_PREFIX,
        *,
        ttl_s: int = DEFAULT_TTL_S,
        max_txn_ops: int = ETCD_MAX_TXN_OPS,
        max_request_bytes: int = ETCD_MAX_REQUEST_BYTES,
        url: str | None = None,
        access: EtcdAccess | None = None,
    ) -> None:
        super().__init__()
        if not endpoints:
            raise StateStoreError("an etcd state store needs at least one host:port")
        if ttl_s < 1:
            raise StateStoreError(f"the etcd leader lease TTL must be >= 1 s, not {ttl_s}")
        self.endpoints = [_split_endpoint(e, url or ",".join(endpoints)) for e in endpoints]
        self.prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
        self.url = url or f"etcd://{','.join(endpoints)}{self.prefix}"
        self.ttl_s = ttl_s
        self.max_txn_ops = max_txn_ops
        self.max_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes
        # Base64 makes every key and value 4/3 as long on the wire, plus JSON framing.
        self.max_bytes = max(1, (max_request_bytes - _TXN_OVERHEAD) * 3 // 4 - 64 * max_txn_ops)
        self._state_prefix = (self.prefix + "state/").encode()
        self._leader_key = (self.prefix + "leader").encode()
        self._lock = threading.RLock()
        self.access = access or EtcdAccess()
        self._clients = _Endpoints(self.endpoints, _REQUEST_TIMEOUT_S, self.access)
        # Set while this scheduler leads: its lease, and the leader key's create_revision.
        self._lease_id: int | None = None
        self._leader_revision: int | None = None
        self._keepalive: _KeepAlive | None = None
        self._closed = False
        try:
            # A linearizable read of the leader key: proves the cluster answers and has
            # a raft leader (a member cut off from its quorum would fail it).
            self._call(lambda c: _post(c, "kv/range", {"key": _b64(self._leader_key)}))
        except StateStoreError:
            self._clients.close()
            raise

    @classmethod
    def from_url(cls, url: str) -> EtcdStateStore:
        """Open ``etcd://host:port[,host:port...][/prefix][?ttl_s=3&max_txn_ops=128...]``.

        Options: ``ttl_s``, ``max_txn_ops``, ``max_request_bytes`` (whole
        numbers) and a secured etcd's ``tls_ca``, ``tls_cert``, ``tls_key``,
        ``user``, ``password_file`` (see ``EtcdAccess``).

        >>> EtcdStateStore.from_url("etcd://10.0.0.5:2379,10.0.0.6:2379/prod/")  # doctest: +SKIP
        >>> EtcdStateStore.from_url(  # doctest: +SKIP
        ...     "etcd://10.0.0.5:2379/prod/?tls_ca=/etc/etcd/ca.pem&user=mangonel"
        ...     "&password_file=/etc/mangonel/etcd-password"
        ... )
        """
        scheme, sep, rest = url.partition("://")
        rest, _, query = rest.partition("?")
        netloc, slash, path = rest.partition("/")
        if scheme != "etcd" or not sep or not netloc:
            raise StateStoreError(
                f"state store {url!r} is not an etcd URL: use "
                "etcd://host:port[,host:port...][/prefix], e.g. etcd://127.0.0.1:2379"
            )
        endpoints = [e.strip() for e in netloc.split(",")]
        if any(not e for e in endpoints):
            raise StateStoreError(f"state store {url!r} has an empty host in its endpoint list")
        options: dict[str, int] = {}
        access: dict[str, str] = {}
        for name, values in urllib.parse.parse_qs(query, keep_blank_values=True).items():
            if name in _ACCESS_OPTIONS:
                access[name] = values[-1]
                continue
            if name not in _INT_OPTIONS:
                raise StateStoreError(
                    f"state store {url!r}: unknown option {name!r} "
                    f"(known: {', '.join(_INT_OPTIONS + _ACCESS_OPTIONS)})"
                )
            try:
                options[name] = int(values[-1])
            except ValueError:
                raise StateStoreError(
                    f"state store {url!r}: option {name} must be a whole number, not {values[-1]!r}"
                ) from None
        prefix = slash + path if path.strip("/") else DEFAULT_PREFIX
        return cls(endpoints, prefix, url=url, access=EtcdAccess(**access), **options)

    # -------------------------------------------------------------- leadership

    def acquire(self, owner: str, timeout_s: float | None = None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            self._check_open()
            if self._leader_revision is not None and not self.deposed.is_set():
                return True
            self._stop_keepalive()
        # etcd out of reach for a while (restarting, its name not resolving yet) is one
        # more reason to wait, said once; the wait's end raises it if it lasted till then.
        unreachable: StateStoreUnreachableError | None = None
        while True:
            try:
                # Look first, so that a follower waiting for minutes grants no lease per poll.
                if self._read_leader() is None and self._try_create(owner):
                    return True
                unreachable = None
            except StateStoreUnreachableError as exc:
                if unreachable is None:
                    log.warning("%s; waiting for the lead all the same", exc)
                unreachable = exc
            if deadline is not None and time.monotonic() >= deadline:
                if unreachable is not None:
                    raise unreachable
                return False
            time.sleep(_POLL_S)

    def _try_create(self, owner: str) -> bool:
        sent = time.monotonic()  # the lease cannot start running out before this
        grant = self._call(lambda c: _post(c, "lease/grant", {"TTL": self.ttl_s, "ID": 0}))
        lease_id = int(grant["ID"])
        granted_ttl = int(grant.get("TTL", self.ttl_s))
        key = _b64(self._leader_key)
        txn = {
            "compare": [{"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [
                {"request_put": {"key": key, "value": _b64(owner.encode()), "lease": lease_id}}
            ],
            "failure": [],
        }
        try:
            result = self._call(lambda c: c.transaction(txn))
        except StateStoreError:
            self._revoke(lease_id)
            raise
        if not result.get("succeeded", False):
            self._revoke(lease_id)  # another scheduler was faster
            return False
        with self._lock:
            # The put is the transaction's only write: the key was created at its revision.
            self._lease_id = lease_id
            self._leader_revision = int(result["header"]["revision"])
            self.deposed.clear()
            self._keepalive = _KeepAlive(self, lease_id, granted_ttl, sent)
            self._keepalive.start()
        return True

    def leader(self) -> str | None:
        self._check_open()
        return self._read_leader()

    def _read_leader(self) -> str | None:
        result = self._call(lambda c: _post(c, "kv/range", {"key": _b64(self._leader_key)}))
        kvs = result.get("kvs", [])
        return _unb64(kvs[0].get("value", "")).decode() if kvs else None

    def resign(self) -> None:
        with self._lock:
            lease_id = self._lease_id
            self._lease_id = self._leader_revision = None
            self._stop_keepalive()
        self.deposed.set()
        if lease_id is not None:
            self._revoke(lease_id)

    def _revoke(self, lease_id: int) -> None:
        # Revoking deletes the leader key at once; when etcd cannot be reached the lease
        # runs out by itself within ttl_s, which is as good, only slower.
        with contextlib.suppress(StateStoreError):
            self._call(lambda c: _post(c, "kv/lease/revoke", {"ID": lease_id}))

    # ------------------------------------------------------------------- data

    def load(self) -> dict[str, str]:
        self._check_open()
        start = self._state_prefix
        end = _prefix_end(self._state_prefix)
        out: dict[str, str] = {}
        revision: int | None = None
        while True:
            # Pages pinned to the first page's revision: one consistent snapshot.
            request: dict[str, Any] = {
                "key": _b64(start),
                "range_end": _b64(end),
                "limit": _RANGE_PAGE,
            }
            if revision is not None:
                request["revision"] = revision
            result = self._call(functools.partial(_post, path="kv/range", body=request))
            if revision is None:
                revision = int(result["header"]["revision"])
            kvs = result.get("kvs", [])
            for kv in kvs:
                key = _unb64(kv["key"])
                out[key[len(self._state_prefix) :].decode()] = _unb64(kv.get("value", "")).decode()
            if not result.get("more", False) or not kvs:
                return out
            start = _unb64(kvs[-1]["key"]) + b"\0"

    def commit(self, puts: Mapping[str, str], deletes: Collection[str] = ()) -> None:
        with self._lock:
            self._check_open()
            if self._leader_revision is None:
                raise self._fenced("it does not hold the store (never acquired, or resigned)")
            if self.deposed.is_set():
                raise self._fenced(f"its lease on {self._leader_key.decode()} ran out")
            leader_revision = self._leader_revision
        # etcd refuses a transaction that touches one key twice; put after delete is
        # what the contract means, so a key in both is only put.
        put_ops = [(self._state_key(k), v.encode()) for k, v in puts.items()]
        delete_keys = [self._state_key(k) for k in deletes if k not in puts]
        self._check_limits(put_ops, delete_keys)
        leader = _b64(self._leader_key)
        txn = {
            "compare": [
                {
                    "key": leader,
                    "result": "EQUAL",
                    "target": "CREATE",
                    "create_revision": leader_revision,
                }
            ],
            "success": [
                *({"request_delete_range": {"key": _b64(k)}} for k in delete_keys),
                *({"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in put_ops),
            ],
            "failure": [{"request_range": {"key": leader}}],
        }
        # Retried on the next endpoint after a timeout, the transaction is harmless: it
        # writes the same values, and only while the compare still holds.
        result = self._transact(txn)
        if not result.get("succeeded", False):
            kvs = result["responses"][0]["response_range"].get("kvs", [])
            now = (
                f"{_unb64(kvs[0].get('value', '')).decode()!r} leads now"
                if kvs
                else "nobody leads now"
            )
            raise self._fenced(f"its lease on {self._leader_key.decode()} ran out ({now})")

    def _transact(self, txn: dict[str, Any]) -> dict[str, Any]:
        """Send a commit's transaction; while no endpoint answers, send it again for
        as long as this scheduler's lease may still hold.

        etcd away for a moment (restarting, its members electing a leader) is not a
        lost lead: a restarted etcd keeps its leases, and its clients' refreshes go
        on once it answers. Failing the write at once made the scheduler stop
        (a failed write is fatal) on every such moment, and a standby, or this one
        started again, recover everything. Past the lease's end, counted as the
        refresh thread counts it, the lead may be gone and the error stands.
        """
        waited = False
        while True:
            try:
                result: dict[str, Any] = self._call(lambda c: c.transaction(txn))
            except StateStoreUnreachableError as exc:
                if not self._lease_may_hold():
                    raise
                if not waited:
                    log.warning("%s; the write waits while this scheduler's lease holds", exc)
                    waited = True
                time.sleep(_POLL_S)
                continue
            if waited:
                log.info("the state store %s answers again: the write went through", self.url)
            return result

    def _lease_may_hold(self) -> bool:
        """Whether this scheduler's lease may not have run out yet (its refresh
        thread's conservative count) and it was not deposed."""
        with self._lock:
            keepalive = self._keepalive
            return (
                keepalive is not None
                and not self.deposed.is_set()
                and time.monotonic() < keepalive.expires
            )

    def _state_key(self, key: str) -> bytes:
        return self._state_prefix + key.encode()

    def _check_limits(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        ops = len(puts) + len(deletes)
        if ops > self.max_txn_ops:
            raise StateStoreError(
                f"a commit of {len(puts)} puts and {len(deletes)} deletes to {self.url} "
                f"exceeds etcd's limit of {self.max_txn_ops} operations per transaction "
                "(--max-txn-ops); write fewer, larger keys per state change, or start etcd "
                "with a larger --max-txn-ops and say so in the URL (?max_txn_ops=N)"
            )
        size = _TXN_OVERHEAD + sum(len(k) + len(v) + _OP_OVERHEAD for k, v in puts)
        size += sum(len(k) + _OP_OVERHEAD for k in deletes)
        if size > self.max_request_bytes:
            raise StateStoreError(
                f"a commit of about {size} bytes to {self.url} exceeds etcd's limit of "
                f"{self.max_request_bytes} bytes per request (--max-request-bytes); keep "
                "large values out of the state store, or start etcd with a larger "
                "--max-request-bytes and say so in the URL (?max_request_bytes=N)"
            )

    def close(self) -> None:
        if self._closed:
            return
        self.resign()
        with self._lock:
            self._closed = True
            self._clients.close()

    # --------------------------------------------------------------- private

    def _check_open(self) -> None:
        if self._closed:
            raise StateStoreError(f"the state store {self.url} was closed")

    def _call(self, request: Callable[[Etcd3Client], _T]) -> _T:
        return self._clients.call(request, self.url)

    def _stop_keepalive(self) -> None:
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.stop()

    def _lease_lost(self, lease_id: int, why: str) -> None:
        """Called by the keep-alive thread: the lease is gone, or may be (``why``)."""
        with self._lock:
            if self._lease_id != lease_id:
                return  # resigned or re-acquired meanwhile
            self.deposed_why = self.deposed_why or why
            self.deposed.set()

    def _pause_keepalive_for_test(self) -> None:
        """Stop refreshing the lease without resigning, as a frozen leader would."""
        with self._lock:
            self._stop_keepalive()


class _KeepAlive(threading.Thread):
    """Refreshes the leader lease every TTL/3 until stopped, or until it is lost.

    A refresh that fails is retried (on every endpoint) until the lease would
    have run out counted from the last refresh that got through; past that the
    lease may be gone, so the store is deposed. Its own clients: the store's
    may be busy with a long commit.
    """

    def __init__(self, store: EtcdStateStore, lease_id: int, ttl_s: int, sent: float) -> None:
        super().__init__(name=f"etcd-lease-{lease_id:x}", daemon=True)
        self._store = store
        self._lease_id = lease_id
        self._ttl_s = ttl_s
        self._interval = ttl_s / 3
        self._expires = sent + ttl_s  # counted from when the request went out: conservative
        self._refreshed = sent
        self._stopped = threading.Event()
        self._clients = _Endpoints(
            store.endpoints, timeout_s=max(0.5, self._interval), access=store.access
        )

    def stop(self) -> None:
        self._stopped.set()

    @property
    def expires(self) -> float:
        """When the lease runs out (``time.monotonic``) unless a refresh gets
        through first, counted from when the last one that did was sent."""
        return self._expires

    def run(self) -> None:
        try:
            next_at = time.monotonic() + self._interval
            while not self._stopped.wait(max(0.0, next_at - time.monotonic())):
                sent = time.monotonic()
                try:
                    result = self._clients.call(
                        lambda c: _post(c, "lease/keepalive", {"ID": self._lease_id}),
                        self._store.url,
                    )
                except StateStoreError as exc:
                    if time.monotonic() >= self._expires:
                        self._store._lease_lost(
                            self._lease_id,
                            f"no refresh of its {self._ttl_s} s lease got through for "
                            f"{time.monotonic() - self._refreshed:.1f} s (last: {exc})",
                        )
                        return
                    next_at = time.monotonic() + _POLL_S
                    continue
                ttl = int(result.get("result", {}).get("TTL", 0))
                if ttl <= 0:  # etcd answers without a TTL when the lease is gone
                    self._store._lease_lost(
                        self._lease_id,
                        f"etcd says its lease is gone ({time.monotonic() - self._refreshed:.1f} s "
                        f"after the last refresh that got through, {time.monotonic() - sent:.1f} "
                        f"s after this one was sent; the lease's TTL is {self._ttl_s} s)",
                    )
                    return
                self._expires = sent + ttl
                self._refreshed = sent
                next_at = sent + self._interval
        finally:
            self._clients.close()


class _PinnedSession(requests.Session):
    """A session whose CA is the one it was given, whatever the environment says.

    requests lets ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` win over a session's
    ``verify``: etcd's own CA would be replaced by the system's, which does not
    know it.
    """

    def merge_environment_settings(
        self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
    ) -> dict[str, Any]:
        settings: dict[str, Any] = super().merge_environment_settings(
            url, proxies, stream, verify, cert
        )
        if verify is None:
            settings["verify"] = self.verify
        return settings


class _Endpoints:
    """One etcd3gw client per endpoint; a request goes to the one that last answered."""

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        timeout_s: float,
        access: EtcdAccess | None = None,
    ) -> None:
        self._endpoints = endpoints
        self._timeout_s = timeout_s
        self._access = access or EtcdAccess()
        self._clients: dict[int, Etcd3Client] = {}
        self._current = 0
        self._lock = threading.Lock()

    def call(self, request: Callable[[Etcd3Client], _T], url: str) -> _T:
        # One request at a time per _Endpoints: requests.Session is not thread-safe.
        with self._lock:
            failures = []
            # Unreachable (it may answer later) unless an endpoint failed otherwise: TLS,
            # or an answer that is not etcd's, which waiting does not mend.
            transient = True
            for step in range(len(self._endpoints)):
                index = (self._current + step) % len(self._endpoints)
                try:
                    client = self._client(index)
                    try:
                        result = request(client)
                    except Etcd3Exception as exc:
                        if not (self._access.user and _token_refused(exc)):
                            raise
                        # etcd dropped the token (its TTL, a restart): log in again.
                        self._login(client)
                        result = request(client)
                except (ConnectionFailedError, ConnectionTimeoutError) as exc:
                    host, port = self._endpoints[index]
                    message = _etcd_message(exc)
                    if "SSLError" in message or "SSL:" in message:
                        transient = False
                        message = (
                            f"TLS failed: {message}; check tls_ca (etcd's CA), and tls_cert "
                            "and tls_key when etcd demands client certificates"
                        )
                    failures.append(f"{host}:{port} ({message})")
                    continue
                except (requests.RequestException, ValueError) as exc:
                    # etcd3gw passes on what it does not map: a connection cut mid-answer,
                    # an answer that is not JSON (not etcd at that port?).
                    host, port = self._endpoints[index]
                    failures.append(f"{host}:{port} ({type(exc).__name__}: {exc})")
                    transient = False
                    continue
                except Etcd3Exception as exc:
                    raise StateStoreError(
                        f"the etcd state store {url} refused a request: {_etcd_message(exc)}"
                    ) from exc
                self._current = index
                return result
        error = StateStoreUnreachableError if transient else StateStoreError
        raise error(
            f"cannot reach the etcd state store {url}: no endpoint answered: "
            f"{'; '.join(failures)}. Check that etcd runs and listens there "
            "(etcdctl --endpoints=HOST:PORT endpoint health), that its cluster has a "
            "quorum, and that --state names its client URLs"
        )

    def _client(self, index: int) -> Etcd3Client:
        client = self._clients.get(index)
        if client is None:
            host, port = self._endpoints[index]
            access = self._access
            # api_path fixed: etcd >= 3.4 serves /v3/, and discovering it costs a request.
            session = _PinnedSession()
            if access.tls_ca:
                session.verify = access.tls_ca
            if access.tls_cert and access.tls_key:
                session.cert = (access.tls_cert, access.tls_key)
            client = Etcd3Client(
                host=host,
                port=port,
                protocol="https" if access.tls_ca else "http",
                timeout=self._timeout_s,
                api_path="/v3/",
                session=session,
            )
            if access.user:
                self._login(client)
            self._clients[index] = client
        return client

    def _login(self, client: Etcd3Client) -> None:
        """Log in to etcd's authentication; its token goes with every later request."""
        client.session.headers.pop("Authorization", None)
        reply = _post(
            client,
            "auth/authenticate",
            {"name": self._access.user, "password": self._access.password()},
        )
        token = reply.get("token")
        if not token:
            raise StateStoreError(f"etcd gave no token to user {self._access.user!r}")
        client.session.headers["Authorization"] = str(token)

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.session.close()
            self._clients.clear()


def _post(client: Etcd3Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = client.post(client.get_url(path), json=body)
    return result


def _token_refused(exc: Etcd3Exception) -> bool:
    message = _etcd_message(exc).lower()
    return "token" in message and ("invalid" in message or "expired" in message)


def _split_endpoint(endpoint: str, url: str) -> tuple[str, int]:
    """``host:port``, ``host`` (port 2379) or ``[ipv6]:port`` -> (host, port)."""
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else str(DEFAULT_PORT)
    elif endpoint.count(":") == 1:
        host, _, port = endpoint.partition(":")
    else:  # a bare host, or an IPv6 address without brackets
        host, port = endpoint, str(DEFAULT_PORT)
    if not host:
        raise StateStoreError(f"state store {url!r}: endpoint {endpoint!r} names no host")
    try:
        number = int(port)
    except ValueError:
        raise StateStoreError(
            f"state store {url!r}: endpoint {endpoint!r} has no valid port (use host:2379)"
        ) from None
    if not 0 < number < 65536:
        raise StateStoreError(f"state store {url!r}: port {number} is out of range")
    return host, number


def _etcd_message(exc: Etcd3Exception) -> str:
    detail = exc.detail_text or ""
    if detail.startswith("{"):
        try:
            return str(json.loads(detail).get("error") or detail)
        except ValueError:
            pass
    return detail or str(exc) or type(exc).__name__


def _prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix``."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else b"\0"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)
