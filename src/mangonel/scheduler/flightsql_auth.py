"""Who a Flight SQL call comes from: logins, bearer tokens and sessions.

``FlightSqlAuthFactory`` reads ``authorization`` on every call of the Flight SQL
service (``flightsql``): ``Basic`` (the handshake) logs in with the
``Authenticator`` and answers ``authorization: Bearer <token>``; ``Bearer`` is
verified. The middleware it makes for the call (``FlightSqlAuthMiddleware``)
names the caller's ``Principal``, its session (the bearer token, one login) and
the token the service forwards to an executor when it reads a result for it.
"""

from __future__ import annotations

import base64
import secrets
import threading
from typing import Any

import pyarrow.flight as flight

from mangonel.errors import AuthenticationError
from mangonel.scheduler.flightsql_front import PEER_HEADER
from mangonel.scheduler.flightsql_wire import code_of, status
from mangonel.security.auth import ANONYMOUS, AUTHORIZATION, Authenticator, Principal
from mangonel.security.auth import bearer_token as parse_bearer
from mangonel.security.login_limits import peer_host

AUTH_MIDDLEWARE = "auth"
"""The name the service's middleware is registered under."""


class FlightSqlAuthMiddleware(flight.ServerMiddleware):  # type: ignore[misc]
    """Who a call comes from, and the token to send back after a login."""

    def __init__(
        self,
        principal: Principal,
        session: str,
        send_token: str | None,
        token: str | None = None,
        peer: str = "",
    ) -> None:
        self.principal = principal
        self.session = session
        self.peer = peer
        """The client's address, as the front saw it (``PEER_HEADER``)."""
        self._send_token = send_token
        self.token = token
        """The caller's bearer token (its login's): what proves it the reader of
        its results to an executor, which this server forwards when it reads them."""

    def sending_headers(self) -> dict[str, str]:
        if self._send_token is None:
            return {}
        return {AUTHORIZATION: f"Bearer {self._send_token}"}


class FlightSqlAuthFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Reads ``authorization`` on every call (``Basic`` logs in, ``Bearer`` is checked).

    An authenticator that issues no token (``OPEN``) still gets each login a
    token of its own, so that each client's prepared statements are its own.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator
        self._open_tokens: set[str] = set()
        self._lock = threading.Lock()

    def start_call(
        self, info: flight.CallInfo, headers: dict[str, list[str]]
    ) -> FlightSqlAuthMiddleware:
        values = headers.get(AUTHORIZATION) or headers.get(AUTHORIZATION.title()) or []
        header: str | None = values[0] if values else None
        peer = (headers.get(PEER_HEADER) or [""])[0]
        try:
            if header is not None and header.startswith("Basic "):
                user, password = _basic(header)
                token = self._auth.login(user, password, peer_host(peer))
                if not token:
                    token = f"open-{secrets.token_hex(16)}"
                    with self._lock:
                        self._open_tokens.add(token)
                return FlightSqlAuthMiddleware(self._principal(token), token, token, token, peer)
            bearer = parse_bearer(header)
            if bearer is not None:
                return FlightSqlAuthMiddleware(self._principal(bearer), bearer, None, bearer, peer)
        except AuthenticationError as exc:
            raise status(code_of(exc), str(exc)) from None
        if self._auth.required:
            raise flight.FlightUnauthenticatedError(
                "this cluster needs a user: connect with a user name and password "
                "(Basic authentication), or send 'authorization: Bearer <token>'"
            )
        return FlightSqlAuthMiddleware(ANONYMOUS, "", None, None, peer)

    def _principal(self, token: str) -> Principal:
        with self._lock:
            minted = token in self._open_tokens
        return ANONYMOUS if minted else self._auth.verify(token)


def _basic(header: str) -> tuple[str, str]:
    encoded = header[len("Basic ") :].strip()
    try:
        # Some clients (Go's Flight client) leave the padding out.
        text = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise AuthenticationError("malformed Basic authorization header") from None
    user, sep, password = text.partition(":")
    if not sep:
        raise AuthenticationError("malformed Basic authorization header: no ':'")
    return user, password


class AcceptHandshake(flight.ServerAuthHandler):  # type: ignore[misc]
    """Lets ``Handshake`` succeed: the middleware did the checking (and answers
    the token in the response headers, where Flight SQL clients read it)."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""
