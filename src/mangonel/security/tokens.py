"""Bearer tokens: who holds one, until when, signed with the cluster secret.

A token is three dot-separated parts, ``mgt1.<claims>.<signature>``:

- ``claims``: base64url (no padding) of a compact JSON object: ``u`` the user,
  ``a`` whether an admin, ``iat`` and ``exp`` (Unix seconds, issued to the
  millisecond, so that a revocation of "every token issued before now" spares a
  token of the next login, and expires), ``n`` a random nonce (two tokens of one
  second differ; the token's id, by which ``mangonel users revoke`` names it);
- ``signature``: base64url of HMAC-SHA256 over ``mgt1.<claims>``, keyed with a
  key derived from the cluster secret for this purpose alone (the same secret
  signs shuffle and result tickets with other keys, so neither can pass for
  the other).

``verify`` checks the signature (``hmac.compare_digest``) before it trusts a
single claim, then the expiry; the three ways a token fails each say so:
``MalformedTokenError`` (not a token at all, or cut short),
``ForgedTokenError`` (signed with another secret, or altered) and
``ExpiredTokenError``. A token says nothing secret (anyone can read its
claims): it must travel over TLS on an untrusted network.

>>> secret = b"x" * 32
>>> token = mint(secret, "alice", admin=False, ttl_s=60, now=1000.0)
>>> verify(secret, token, now=1010.0).user
'alice'
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from mangonel import defaults
from mangonel.errors import AuthenticationError

PREFIX = "mgt1"
"""Version tag of the token format: the first part of every token."""

_KEY_LABEL = b"mangonel bearer token v1"


class MalformedTokenError(AuthenticationError):
    """The text is not a mangonel token (cut short, mangled, or something else pasted)."""


class ForgedTokenError(AuthenticationError):
    """The token's signature does not match: another cluster's secret, or altered claims."""


class ExpiredTokenError(AuthenticationError):
    """The token was valid but its lifetime is over."""


@dataclass(frozen=True)
class Claims:
    """What a valid token says.

    Attributes:
        user: Whom it was issued to.
        admin: Whether with the admin role (as it was at issue time).
        issued_at: Unix seconds.
        expires_at: Unix seconds; refused from then on.
        token_id: The token's nonce: names it to ``mangonel users revoke``.
    """

    user: str
    admin: bool
    issued_at: float
    expires_at: float
    token_id: str = ""


def _key(secret: bytes) -> bytes:
    # One key per purpose from one secret (an HMAC as the derivation function):
    # a ticket signed with the secret is never a valid token signature.
    return hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    # Strict: a character outside the alphabet is an error, not skipped.
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def mint(
    secret: bytes,
    user: str,
    *,
    admin: bool,
    ttl_s: float = defaults.TOKEN_TTL_S,
    now: float | None = None,
) -> str:
    """A token for ``user``, valid for ``ttl_s`` seconds from ``now`` (default: the clock)."""
    if ttl_s <= 0:
        raise ValueError(f"a token's lifetime must be positive, got {ttl_s:g} s")
    issued = round(time.time() if now is None else now, 3)
    claims = {
        "u": user,
        "a": admin,
        "iat": issued,
        "exp": int(issued) + max(1, round(ttl_s)),
        "n": secrets.token_hex(8),
    }
    body = f"{PREFIX}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}"
    signature = hmac.new(_key(secret), body.encode("ascii"), hashlib.sha256).digest()
    return f"{body}.{_b64(signature)}"


def verify(secret: bytes, token: str, *, now: float | None = None) -> Claims:
    """The claims of a token this cluster's secret signed and that has not expired.

    Raises:
        MalformedTokenError: it is not a token.
        ForgedTokenError: its signature does not match (another secret, or altered).
        ExpiredTokenError: it expired.
    """
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise MalformedTokenError(
            f"the token is malformed (a mangonel token has three parts and starts with "
            f"{PREFIX!r}); copy it whole, or log in again with a user name and password"
        )
    body = f"{parts[0]}.{parts[1]}"
    try:
        signature = _unb64(parts[2])
        raw = _unb64(parts[1])
    except (binascii.Error, ValueError):
        raise MalformedTokenError(
            "the token is malformed (not base64url); copy it whole, or log in again"
        ) from None
    expected = hmac.new(_key(secret), body.encode("ascii", "replace"), hashlib.sha256).digest()
    if not hmac.compare_digest(signature, expected):
        raise ForgedTokenError(
            "the token's signature is not valid: it was not issued by this cluster, was "
            "altered, or the cluster secret changed since; log in again for a new one"
        )
    try:
        claims = json.loads(raw)
        user, admin, token_id = claims["u"], claims["a"], claims.get("n", "")
        issued, expires = float(claims["iat"]), float(claims["exp"])
        if not all(isinstance(v, str) for v in (user, token_id)) or not isinstance(admin, bool):
            raise TypeError("claims of the wrong type")
    except (ValueError, KeyError, TypeError):
        # Signed by us but unreadable: only a mangonel of another token version makes these.
        raise MalformedTokenError(
            "the token's claims cannot be read (made by another mangonel version?); log in again"
        ) from None
    current = time.time() if now is None else now
    if current >= expires:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expires))
        raise ExpiredTokenError(
            f"the token of user {user!r} expired at {when} ({current - expires:.0f} s ago); "
            "log in again, or ask for a new token (`mangonel users token`)"
        )
    return Claims(user, admin, issued, expires, token_id)


def unverified_claims(token: str) -> Claims | None:
    """What a token says, *without verifying it*: for a client that plans its next
    login, or ``mangonel users revoke`` (which needs no secret to name a token),
    never for letting anyone in; ``None`` when unreadable."""
    try:
        claims = json.loads(_unb64(token.strip().split(".")[1]))
        return Claims(
            str(claims["u"]),
            bool(claims["a"]),
            float(claims["iat"]),
            float(claims["exp"]),
            str(claims.get("n", "")),
        )
    except (IndexError, ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        return None


def expires_at(token: str) -> float | None:
    """When a token says it expires, *without verifying it*: for a client that
    plans its next login, never for a decision; ``None`` when unreadable."""
    claims = unverified_claims(token)
    return None if claims is None else claims.expires_at
