"""Who a request comes from, and the one interface that decides it.

Every front door of the scheduler (the gRPC query service, the web UI and REST
API, the Flight SQL endpoint) authenticates the same way: a client logs in once
with a user name and password (or already holds a token) and then sends
``authorization: Bearer <token>`` with each request. An ``Authenticator`` turns
credentials into a token (``login``) and a token into a ``Principal``
(``verify``). ``OPEN`` is the authenticator of an unsecured cluster: everyone
is the anonymous admin.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Protocol

from mangonel.errors import PermissionDeniedError

BASIC = "Basic "
"""Prefix of an ``authorization`` value with ``base64(user:password)`` (HTTP Basic;
what Flight SQL clients such as ADBC send for their first call)."""

BEARER = "Bearer "
"""Prefix of the ``authorization`` header / gRPC metadata value that carries a token."""

AUTHORIZATION = "authorization"
"""The header (HTTP) and metadata key (gRPC, Flight) of the bearer token."""


@dataclass(frozen=True)
class Principal:
    """The user a request comes from.

    Attributes:
        user: The user's name; ``anonymous`` on an unsecured cluster.
        admin: Sees and cancels every user's jobs and may register tables.
        writer: May write data (``may_write``) without being an admin.
    """

    user: str
    admin: bool = False
    writer: bool = False
    """The users file's ``writer`` role: may run the write statements."""

    @property
    def may_write(self) -> bool:
        """Whether this user may run the write statements (``COPY ... TO``, ``CREATE
        TABLE ... AS``, ``INSERT``, ``DROP TABLE``): the admins and the writers."""
        return self.admin or self.writer

    def require_admin(self, what: str) -> None:
        """Refuse ``what`` (registering or dropping tables) to a user who is no admin:
        the one check of every door that takes it (gRPC, Flight SQL).

        Raises:
            PermissionDeniedError: the user is not an admin.
        """
        if not self.admin:
            raise PermissionDeniedError(
                f"only an admin may {what}; {self.user!r} is not one (`mangonel users add "
                f"NAME --admin` makes one)"
            )

    def may_see(self, owner: str) -> bool:
        """Whether this user may see (watch, read, cancel) a job ``owner`` submitted."""
        return self.admin or self.user == owner

    def check_sees(self, job: str, owner: str) -> None:
        """The ownership check of every front door (gRPC, Flight SQL, web), each
        of which turns the error into its own refusal.

        Raises:
            PermissionDeniedError: ``job`` is another user's (``may_see``).
        """
        if not self.may_see(owner):
            raise PermissionDeniedError(
                f"job {job} belongs to another user; {self.user!r} may see and cancel only "
                "their own jobs (an admin may see all)"
            )

    def check_reads(self, job: str, owner: str) -> None:
        """A result's partitions are read by the user who ran the query only, admin
        or not: the rule the executors apply to its tickets.

        Raises:
            PermissionDeniedError: ``job`` is another user's.
        """
        if self.user != owner:
            raise PermissionDeniedError(
                f"the result of job {job} is another user's: only the user who ran the "
                "query may read it"
            )

    @property
    def sees_hosts(self) -> bool:
        """Whether this user sees the particulars of the cluster's hosts (executors'
        host names, pids, why one was lost or is unhealthy, which name paths): the
        admins, who run the hosts. Every front door (gRPC status, the web API) asks
        this; other users see what the cluster can do for them (states, slots,
        running tasks, the Flight addresses they read results at)."""
        return self.admin


ANONYMOUS = Principal("anonymous", admin=True)

HIDDEN_UNHEALTHY = "takes no task for now: its host is in trouble (an admin sees which)"
"""What a user who does not see hosts (``Principal.sees_hosts``) is told of an
unhealthy executor, whose own words name its work directory."""


class Authenticator(Protocol):
    """Checks credentials; raises ``errors.AuthenticationError`` on bad ones."""

    @property
    def required(self) -> bool:
        """Whether requests without a token are refused."""
        ...

    def login(self, user: str, password: str, address: str = "") -> str:
        """A bearer token for ``user`` after checking ``password``; ``address`` is
        the client's host (``login_limits.peer_host``), ``""`` when unknown: failed
        logins are limited per user name and per address."""
        ...

    def verify(self, token: str) -> Principal:
        """The principal a token was issued to; refuses expired or forged ones."""
        ...


class OpenAuthenticator:
    """An unsecured cluster's: no credentials asked, everyone is ``ANONYMOUS``."""

    required = False

    def login(self, user: str, password: str, address: str = "") -> str:
        return ""

    def verify(self, token: str) -> Principal:
        return ANONYMOUS


OPEN: Authenticator = OpenAuthenticator()


def bearer_token(header: str | None) -> str | None:
    """The token of an ``authorization`` value, ``None`` when it carries no bearer token."""
    if header and header.startswith(BEARER):
        return header[len(BEARER) :].strip() or None
    return None


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """The user and password of a ``Basic`` ``authorization`` value; ``None`` when
    it is not one (or not base64 of ``user:password``).

    >>> basic_credentials("Basic " + base64.b64encode(b"alice:pw:x").decode())
    ('alice', 'pw:x')
    """
    if not header or not header.startswith(BASIC):
        return None
    try:
        text = base64.b64decode(header[len(BASIC) :].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = text.partition(":")
    return (user, password) if sep and user else None
