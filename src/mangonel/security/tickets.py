"""Signed Flight tickets: knowing a file's name is not enough to read it.

An executor's Flight server serves a shuffle or result file to whoever presents
its ticket: Flight asks callers for no certificate, so the ticket is the whole
of the permission. In a cluster with a secret, the scheduler signs every ticket
it hands out (``TicketSigner.sign``), and the executor serves only tickets whose
signature holds, that have not expired, and, for a result, that are presented by
its reader (``TicketSigner.verify``); the scheduler's Flight SQL endpoint applies
the same rule to the results it streams::

    mgt1.<claims: base64url JSON>.<HMAC-SHA256 of the claims: base64url>

The claims name the file (its path, which also names the map attempt that wrote
it), the job, the stage, the map task, the partition, the expiry (unix time)
and, for a result, its one reader:

* ``session``: ``sha256(session key)`` of the ``Session`` (gRPC client) that ran
  the query, which presents the key itself in the ``x-mangonel-session`` header
  of its ``do_get``, so a ticket read off a log or a screen is useless elsewhere;
* ``user``: the user who ran a Flight SQL statement; the reader presents a
  bearer token of that user (``authorization: Bearer``, which Flight SQL
  clients send to every location of a result), checked with the token key of
  the same secret. Another user's token, or none, is refused, admin or not.

The key that signs is derived from the cluster secret (HMAC with a fixed label),
never the secret itself, so the tokens signed with the same secret can never
pass as tickets.

Shuffle tickets live ``defaults.SHUFFLE_TICKET_TTL_S`` (a day: a long query's
consumers must not find their inputs' tickets expired); result tickets as long as
the scheduler keeps the result (``--result-ttl``).

**Probe tickets** (``mgp1.``, ``TicketSigner.sign_probe``): a link probe
(``executor.probes``) asks a peer's Flight server for a stream of synthetic
bytes, no file. Only a cluster member may ask: the prober signs the ticket
itself with a key of its own label, derived from the cluster secret (so a
file ticket never passes as a probe, nor a probe as a file), for at most
``MAX_PROBE_BYTES`` and ``PROBE_TICKET_TTL_S``. Without a cluster secret, a
probe ticket is ``probe:<bytes>``, bounded alike (as a file ticket is a path).

>>> signer = TicketSigner(b"k" * 32, clock=lambda: 1000.0)
>>> raw = signer.sign(TicketClaims("/w/j1/s0/m0-a0-p0.arrow", "j1", 0, 0, 0, 1060.0))
>>> signer.verify(raw).path
'/w/j1/s0/m0-a0-p0.arrow'
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from mangonel.errors import AuthenticationError
from mangonel.security import tokens

PREFIX = b"mgt1."
PROBE_PREFIX = b"mgp1."
UNSIGNED_PROBE = b"probe:"
MAX_PROBE_BYTES = 4 * 1024 * 1024
"""The most one probe may ask a server to stream."""
PROBE_TICKET_TTL_S = 60.0
"""How long a signed probe ticket is honoured (probers sign one per probe)."""
SESSION_HEADER = "x-mangonel-session"
"""Flight (and gRPC) header in which a client presents its session key."""
_KEY_LABEL = b"mangonel flight ticket v1"
_PROBE_KEY_LABEL = b"mangonel link probe v1"


class TicketError(AuthenticationError):
    """A Flight ticket is unsigned, forged, expired, or presented by another session."""


@dataclass(frozen=True)
class TicketClaims:
    """What a ticket grants: one file, until ``expires``, maybe to one session.

    Attributes:
        path: The file (it names job, stage, map task, attempt and partition).
        job: The job the file belongs to.
        stage: The stage that wrote it.
        map_partition: The map task that wrote it.
        partition: The output partition.
        expires: Unix time after which the ticket is refused.
        session: ``session_hash`` of the session that may read it; empty: no
            session asked (a shuffle ticket, which only executors receive).
        user: The user who may read it (with a token of theirs); empty: no
            user asked.
    """

    path: str
    job: str
    stage: int
    map_partition: int
    partition: int
    expires: float
    session: str = ""
    user: str = ""


@dataclass(frozen=True)
class ProbeClaims:
    """What a probe ticket grants: ``nbytes`` of synthetic data, until ``expires``.

    Attributes:
        nbytes: Bytes to stream (at most ``MAX_PROBE_BYTES``).
        expires: Unix time after which the ticket is refused.
        prober: The executor that asked (for the server's log).
    """

    nbytes: int
    expires: float
    prober: str = ""


def is_probe(raw: bytes) -> bool:
    """Whether ``raw`` asks for a link probe, signed or not."""
    return raw.startswith(PROBE_PREFIX) or raw.startswith(UNSIGNED_PROBE)


def unsigned_probe(nbytes: int) -> bytes:
    """The probe ticket of a cluster without a secret."""
    return UNSIGNED_PROBE + str(nbytes).encode()


def read_unsigned_probe(raw: bytes) -> ProbeClaims:
    """The claims of ``probe:<bytes>``; raises ``TicketError`` when malformed,
    signed (a member must check the signature) or too big."""
    text = raw[len(UNSIGNED_PROBE) :] if raw.startswith(UNSIGNED_PROBE) else b""
    if not text.isdigit():
        raise TicketError(f"not a probe ticket: {raw[:40]!r}")
    return ProbeClaims(_bounded(int(text)), float("inf"))


def _bounded(nbytes: int) -> int:
    if not 0 < nbytes <= MAX_PROBE_BYTES:
        raise TicketError(f"a link probe may ask for 1 to {MAX_PROBE_BYTES} bytes, not {nbytes}")
    return nbytes


def session_hash(session_key: str) -> str:
    """What a result ticket holds of a session key (never the key itself)."""
    return hashlib.sha256(session_key.encode()).hexdigest()


def is_signed(raw: bytes) -> bool:
    """Whether ``raw`` has the form of a signed ticket (unsigned ones are a path)."""
    return raw.startswith(PREFIX)


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(data: bytes) -> bytes:
    return base64.urlsafe_b64decode(data + b"=" * (-len(data) % 4))


class TicketSigner:
    """Signs and verifies tickets with a key derived from the cluster secret.

    Args:
        secret: The cluster secret (``SecurityOptions.cluster_secret``).
        clock: Unix time now; tests give their own.
    """

    def __init__(self, secret: bytes, clock: Callable[[], float] = time.time) -> None:
        self._key = hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()
        self._probe_key = hmac.new(secret, _PROBE_KEY_LABEL, hashlib.sha256).digest()
        self._secret = secret  # checks the bearer tokens of user-bound tickets
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    def sign_probe(self, nbytes: int, prober: str) -> bytes:
        """A probe ticket for ``nbytes``, valid ``PROBE_TICKET_TTL_S``."""
        claims = ProbeClaims(_bounded(nbytes), self._clock() + PROBE_TICKET_TTL_S, prober)
        body = _b64(json.dumps(asdict(claims), separators=(",", ":"), sort_keys=True).encode())
        mac = hmac.new(self._probe_key, PROBE_PREFIX + body, hashlib.sha256).digest()
        return PROBE_PREFIX + body + b"." + _b64(mac)

    def verify_probe(self, raw: bytes) -> ProbeClaims:
        """The claims of a valid probe ticket.

        Raises:
            TicketError: unsigned, forged, signed with another key (a file
                ticket), expired, or asking for more than ``MAX_PROBE_BYTES``.
        """
        if not raw.startswith(PROBE_PREFIX):
            raise TicketError(
                "a link probe needs a ticket signed with the cluster secret: only the "
                "cluster's executors may probe this one"
            )
        body, dot, mac = raw[len(PROBE_PREFIX) :].partition(b".")
        try:
            expected = hmac.new(self._probe_key, PROBE_PREFIX + body, hashlib.sha256).digest()
            valid = dot == b"." and hmac.compare_digest(_unb64(mac), expected)
        except (binascii.Error, ValueError):
            valid = False
        if not valid:
            raise TicketError(
                "the probe ticket's signature does not match (forged, or signed with "
                "another cluster secret): refused"
            )
        try:
            claims = ProbeClaims(**json.loads(_unb64(body)))
        except (ValueError, TypeError) as exc:
            raise TicketError(f"the probe ticket's claims cannot be read: {exc}") from exc
        if self._clock() > claims.expires:
            raise TicketError("the probe ticket expired: refused")
        _bounded(claims.nbytes)
        return claims

    def sign(self, claims: TicketClaims) -> bytes:
        """The ticket for ``claims``."""
        body = _b64(json.dumps(asdict(claims), separators=(",", ":"), sort_keys=True).encode())
        mac = hmac.new(self._key, PREFIX + body, hashlib.sha256).digest()
        return PREFIX + body + b"." + _b64(mac)

    def sign_text(self, claims: TicketClaims) -> str:
        """The ticket for ``claims`` as text (it is ASCII), for a wire field."""
        return self.sign(claims).decode("ascii")

    def verify(
        self, raw: bytes, session_key: str | None = None, bearer: str | None = None
    ) -> TicketClaims:
        """The claims of a valid ticket.

        Args:
            raw: The ticket as presented.
            session_key: The session key the caller presented (header
                ``x-mangonel-session``), if any.
            bearer: The bearer token the caller presented (header
                ``authorization``), if any.

        Raises:
            TicketError: unsigned, malformed, forged, expired, or bound to a
                session or user the caller did not prove to be.
        """
        if not is_signed(raw):
            raise TicketError(
                "the ticket is not signed, and this executor serves only tickets the "
                "scheduler signed with the cluster secret; ask the scheduler for the file's "
                "location again"
            )
        body, dot, mac = raw[len(PREFIX) :].partition(b".")
        try:
            given = _unb64(mac)
            expected = hmac.new(self._key, PREFIX + body, hashlib.sha256).digest()
            valid = dot == b"." and hmac.compare_digest(given, expected)
        except (binascii.Error, ValueError):
            valid = False
        if not valid:
            raise TicketError(
                "the ticket's signature does not match (forged, altered, or signed with "
                "another cluster secret): refused"
            )
        try:
            claims = TicketClaims(**json.loads(_unb64(body)))
        except (ValueError, TypeError) as exc:  # signed by us, so a version mismatch
            raise TicketError(f"the ticket's claims cannot be read: {exc}") from exc
        now = self._clock()
        if now > claims.expires:
            raise TicketError(
                f"the ticket for {claims.path} (job {claims.job}) expired "
                f"{now - claims.expires:.0f} s ago; ask the scheduler for a fresh one "
                "(run the query again)"
            )
        if claims.session:
            if not session_key:
                raise TicketError(
                    f"the result ticket of job {claims.job} is bound to the session that "
                    f"ran the query, and no session key came with it (header {SESSION_HEADER})"
                )
            if not hmac.compare_digest(session_hash(session_key), claims.session):
                raise TicketError(
                    f"the result ticket of job {claims.job} belongs to another session: "
                    "only the session that ran the query may read its result"
                )
        if claims.user:
            self._check_reader(claims, bearer)
        return claims

    def _check_reader(self, claims: TicketClaims, bearer: str | None) -> None:
        """Refuse a user-bound ticket unless ``bearer`` is a valid token of its user."""
        if not bearer:
            raise TicketError(
                f"the result ticket of job {claims.job} is bound to the user who ran the "
                "query, and no token came with it (header authorization: Bearer)"
            )
        try:
            reader = tokens.verify(self._secret, bearer, now=self._clock()).user
        except AuthenticationError as exc:
            raise TicketError(f"the token that came with the ticket is refused: {exc}") from exc
        if not hmac.compare_digest(reader.encode(), claims.user.encode()):
            raise TicketError(
                f"the result ticket of job {claims.job} belongs to another user: only the "
                "user who ran the query may read its result"
            )


def session_key_of(request_id: str) -> str:
    """The session key a client put in front of a submission's request id.

    A client submits with ``request_id = f"{session key}.{nonce}"`` (the id is
    kept with the job, so a restarted scheduler still knows whose result it is);
    an id without a dot is its own key.

    >>> session_key_of("k3y.0a1b")
    'k3y'
    """
    return request_id.partition(".")[0]
