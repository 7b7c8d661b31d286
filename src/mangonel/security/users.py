"""The users file, salted password hashes, and the authenticator that reads them.

The users file (``mangonel users add NAME --users-file FILE``) holds one user a
line; ``#`` starts a comment::

    # mangonel users: NAME:ROLE:HASH (mangonel users add/remove)
    alice:user:scrypt$16384$8$1$<salt>$<hash>
    root:admin:scrypt$16384$8$1$<salt>$<hash>

``ROLE`` is ``admin`` (sees and cancels every job, registers and drops tables,
writes data), ``writer`` (its own jobs only, and may run the write statements:
``COPY ... TO``, ``CREATE TABLE ... AS``, ``INSERT``, ``DROP TABLE``) or ``user``
(its own jobs only, queries only). ``HASH`` is scrypt (``hashlib.scrypt``: n, r
and p, then base64 salt and key): a stolen file gives no password away cheaply.
The file is written with mode 0600 and replaced atomically (a reader never sees
half a file); a scheduler reads it again when it changes (and on SIGHUP), so
adding or removing a user needs no restart, and removing one refuses their
tokens at once. A file that cannot be read, or has a bad line, is logged as an
error and the scheduler goes on with the users it read last.

Revoked tokens (``mangonel users revoke``) are kept in the same file, so that
every scheduler that reads it refuses them, and a restart forgets none. A line
starting with ``!`` (no user name can) is one revocation::

    !user:alice:1764892800.25      alice's tokens issued before that Unix time
    !token:9f0c2a7e41d3b8a6:1767484800   that token (its id), until it expires

Removing a user revokes the tokens they hold, so adding the name again later
does not bring them back.

``UsersAuthenticator`` is the ``Authenticator`` of a secured scheduler: every
front door (gRPC, web UI and REST API, Flight SQL) shares one, made by
``authenticator_for(options)``:

- users file and cluster secret: users log in with their password and get a
  token signed with the secret (valid on every scheduler of the cluster, and
  after a restart); a token's user must still be in the file, and the file's
  role wins over the token's.
- users file, no cluster secret: the same, with a random secret of this
  process: tokens die with it (sessions that hold a password log in again).
- TLS (which brings the cluster secret), no users file: nobody logs in with a
  password; tokens signed with the secret (``mangonel users token NAME
  [--admin]``, made by whoever holds the cluster's files) are the only way in.
  Clients present no certificate, so the transport lets everyone through who
  trusts the CA: without this, a CA certificate would make anyone the admin.
- neither: ``OPEN``, everyone is the anonymous admin. On a local cluster on
  loopback that is everyone on the machine.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import logging
import math
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mangonel import defaults
from mangonel.errors import AuthenticationError, LoginThrottledError
from mangonel.security import tokens
from mangonel.security.auth import OPEN, Authenticator, Principal
from mangonel.security.login_limits import LoginLimiter, LoginLimits
from mangonel.security.options import SecurityConfigError, SecurityOptions

log = logging.getLogger(__name__)

ADMIN = "admin"
WRITER = "writer"
USER = "user"
ROLES = (ADMIN, WRITER, USER)

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")
"""A user name: letters, digits, ``_ . @ -``, at most 64, no ``:`` (the file's separator)."""

MIN_PASSWORD_CHARS = 8

# scrypt's cost: n=2**14, r=8 (16 MiB, about 50 ms a check here): the parameters
# RFC 7914 and OWASP give for interactive logins. Stored with each hash, so
# raising them later leaves old hashes readable.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1
_SALT_BYTES = 16
_KEY_BYTES = 32
_MAX_MEM = 64 * 1024 * 1024

_HEADER = "# mangonel users: NAME:ROLE:HASH, one a line (mangonel users add/remove/list)\n"
_REVOKED_HEADER = (
    "# revoked tokens: !user:NAME:ISSUED_BEFORE, !token:ID:EXPIRES (mangonel users revoke)\n"
)
_REVOKED = "!"

WRONG_CREDENTIALS = "wrong user name or password"


class UsersFileError(SecurityConfigError):
    """The users file cannot be read, or a line of it is not ``NAME:ROLE:HASH``."""


@dataclass(frozen=True)
class User:
    """One line of the users file."""

    name: str
    admin: bool
    password_hash: str
    writer: bool = False
    """May run the write statements (``Principal.may_write``); an admin may anyway."""

    @property
    def role(self) -> str:
        return ADMIN if self.admin else WRITER if self.writer else USER


@dataclass(frozen=True)
class Revocations:
    """The tokens refused before they expire (``mangonel users revoke``).

    Attributes:
        users: User name -> Unix time: that user's tokens issued before it are refused.
        tokens: Token id -> when that token expires (after which it is forgotten).
    """

    users: Mapping[str, float] = field(default_factory=dict)
    tokens: Mapping[str, float] = field(default_factory=dict)

    def why_refused(self, claims: tokens.Claims) -> str | None:
        """Why a token with ``claims`` is revoked; ``None``: it is not."""
        if claims.token_id and claims.token_id in self.tokens:
            return f"the token {claims.token_id} was revoked"
        before = self.users.get(claims.user)
        if before is not None and claims.issued_at < before:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(before))
            return f"the tokens of user {claims.user!r} issued before {when} were revoked"
        return None


@dataclass(frozen=True)
class UsersFile:
    """What a users file holds: its users, and the tokens it revokes."""

    users: dict[str, User] = field(default_factory=dict)
    revoked: Revocations = field(default_factory=Revocations)


# --------------------------------------------------------------------- hashing


def hash_password(password: str) -> str:
    """``scrypt$N$R$P$salt$key`` of ``password`` with a new random salt."""
    salt = secrets.token_bytes(_SALT_BYTES)
    key = hashlib.scrypt(
        password.encode(),
        salt=salt,
        n=_SCRYPT_N,
        r=_SCRYPT_R,
        p=_SCRYPT_P,
        maxmem=_MAX_MEM,
        dklen=_KEY_BYTES,
    )
    return "$".join(
        ["scrypt", str(_SCRYPT_N), str(_SCRYPT_R), str(_SCRYPT_P), _b64(salt), _b64(key)]
    )


def check_password(password: str, encoded: str) -> bool:
    """Whether ``password`` hashes to ``encoded`` (compared in constant time)."""
    try:
        scheme, n, r, p, salt, key = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(key, validate=True)
        actual = hashlib.scrypt(
            password.encode(),
            salt=base64.b64decode(salt, validate=True),
            n=int(n),
            r=int(r),
            p=int(p),
            maxmem=_MAX_MEM,
            dklen=len(expected),
        )
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(actual, expected)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@functools.cache
def _dummy_hash() -> str:
    # A hash of nothing anyone knows: checked for unknown users too, so that how
    # long a refusal takes does not tell which user names exist. Made on first
    # use: importing this module should not cost a hash.
    return hash_password(secrets.token_hex(16))


# ------------------------------------------------------------------ the file


def check_name(name: str) -> str:
    """``name`` if it may name a user; else ``ValueError`` saying what may."""
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"{name!r} cannot name a user: use 1 to 64 letters, digits, '_', '.', '@' or '-' "
            "(not starting with '.', '@' or '-')"
        )
    return name


def check_new_password(password: str) -> str:
    """``password`` if it is long enough; else ``ValueError``."""
    if len(password) < MIN_PASSWORD_CHARS:
        raise ValueError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
    return password


def read_users(path: str) -> dict[str, User]:
    """The users of a users file, by name; an absent file has none.

    Raises:
        UsersFileError: the file cannot be read, or a line is not ``NAME:ROLE:HASH``
            (the message names the line).
    """
    return read_users_file(path).users


def read_users_file(path: str) -> UsersFile:
    """The users of a users file and the tokens it revokes; an absent file has none.

    Raises:
        UsersFileError: the file cannot be read, or a line is not ``NAME:ROLE:HASH``
            or a revocation (the message names the line).
    """
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read()
    except FileNotFoundError:
        return UsersFile()
    except OSError as exc:
        raise UsersFileError(f"cannot read the users file {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "the users file %s can be read by others (mode %o): `chmod 600 %s`",
            path,
            stat.S_IMODE(mode),
            path,
        )
    users: dict[str, User] = {}
    revoked_users: dict[str, float] = {}
    revoked_tokens: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(_REVOKED):
            _read_revocation(line, revoked_users, revoked_tokens, f"line {number} of {path}")
            continue
        parts = line.split(":")
        if (
            len(parts) != 3
            or not NAME_PATTERN.fullmatch(parts[0])
            or parts[1] not in ROLES
            or not parts[2].startswith("scrypt$")
        ):
            raise UsersFileError(
                f"line {number} of the users file {path} is not NAME:ROLE:HASH with ROLE "
                "admin, writer or user; fix it, or write the file with `mangonel users add`"
            )
        users[parts[0]] = User(parts[0], parts[1] == ADMIN, parts[2], parts[1] == WRITER)
    return UsersFile(users, Revocations(revoked_users, revoked_tokens))


def _read_revocation(
    line: str, users: dict[str, float], token_ids: dict[str, float], where: str
) -> None:
    kind, _, rest = line[len(_REVOKED) :].partition(":")
    key, _, when = rest.rpartition(":")
    try:
        at = float(when)
    except ValueError:
        at = math.nan
    if kind not in ("user", "token") or not key or not math.isfinite(at):
        raise UsersFileError(
            f"{where} is not a revocation (!user:NAME:TIME or !token:ID:EXPIRES); fix "
            "it, or write the file with `mangonel users revoke`"
        )
    if kind == "user":
        users[key] = max(at, users.get(key, at))
    else:
        token_ids[key] = at


def write_users(path: str, users: Mapping[str, User], revoked: Revocations | None = None) -> None:
    """Replace the users file atomically with ``users`` and the revocations, of
    which those of tokens expired are dropped; readable by its owner only."""
    revoked = revoked or Revocations()
    now = time.time()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".users-", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_HEADER)
            for user in sorted(users.values(), key=lambda u: u.name):
                f.write(f"{user.name}:{user.role}:{user.password_hash}\n")
            live = {i: exp for i, exp in revoked.tokens.items() if exp > now}
            if revoked.users or live:
                f.write(_REVOKED_HEADER)
            for name, before in sorted(revoked.users.items()):
                f.write(f"{_REVOKED}user:{name}:{before:.3f}\n")
            for token_id, expires in sorted(live.items()):
                f.write(f"{_REVOKED}token:{token_id}:{expires:.0f}\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def add_user(
    path: str, name: str, password: str, *, admin: bool = False, writer: bool = False
) -> bool:
    """Add ``name`` (or set its password and role); True when it is new.

    Raises:
        ValueError: the name or password is not acceptable.
        UsersFileError: the file cannot be read.
    """
    check_name(name)
    check_new_password(password)
    file = read_users_file(path)
    new = name not in file.users
    file.users[name] = User(name, admin, hash_password(password), writer)
    write_users(path, file.users, file.revoked)
    return new


def remove_user(path: str, name: str, now: float | None = None) -> bool:
    """Remove ``name``; False when it was not there. Its tokens are refused from now
    on, and stay refused if the name is added again (``revoke_user``)."""
    file = read_users_file(path)
    if file.users.pop(name, None) is None:
        return False
    write_users(path, file.users, _revoked_user(file.revoked, name, now))
    return True


def revoke_user(path: str, name: str, now: float | None = None) -> bool:
    """Refuse every token of ``name`` issued before ``now`` (default: the clock);
    False when no such user is in the file (nothing is written)."""
    file = read_users_file(path)
    if name not in file.users:
        return False
    write_users(path, file.users, _revoked_user(file.revoked, name, now))
    return True


def revoke_token(path: str, claims: tokens.Claims) -> None:
    """Refuse the token ``claims`` were read from, until it expires.

    Raises:
        ValueError: the token has no id (made by a mangonel before ids).
    """
    if not claims.token_id:
        raise ValueError("this token has no id; revoke every token of its user instead")
    file = read_users_file(path)
    token_ids = {**file.revoked.tokens, claims.token_id: claims.expires_at}
    write_users(path, file.users, Revocations(file.revoked.users, token_ids))


def _revoked_user(revoked: Revocations, name: str, now: float | None) -> Revocations:
    at = time.time() if now is None else now
    return Revocations({**revoked.users, name: at}, revoked.tokens)


# ------------------------------------------------------------ authenticator


class UsersAuthenticator:
    """Logs users in against a users file; verifies tokens signed with the cluster secret.

    Thread-safe; shared by every front door of one scheduler, and so is its
    ``LoginLimiter``: failed logins at one door count at every other. Implements
    ``mangonel.security.auth.Authenticator``.

    Args:
        users_file: The users file; ``None``: nobody logs in, tokens only.
        secret: The cluster secret (at least 32 bytes) that signs tokens.
        token_ttl_s: Lifetime of the tokens ``login`` gives.
        limits: How many failed logins lock a user name or an address.
        clock: Monotonic seconds, for the login limits (tests pass their own).
    """

    required = True

    def __init__(
        self,
        users_file: str | None,
        secret: bytes,
        token_ttl_s: float = defaults.TOKEN_TTL_S,
        limits: LoginLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.users_file = users_file
        self._secret = secret
        self.token_ttl_s = token_ttl_s
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._file = UsersFile()
        self._limiter = LoginLimiter(limits)
        self._clock = clock
        # One user name's logins are checked one at a time (a stripe of locks, not a
        # lock per name: names cost no memory): else a burst of parallel guesses
        # would all be checked before the first failure counted.
        self._login_locks = [threading.Lock() for _ in range(_LOGIN_STRIPES)]
        if users_file is not None:
            with self._lock:
                # A broken file is an error at start, not at the first login.
                self._file = read_users_file(users_file)
                self._seen = _signature(users_file)

    def users(self) -> dict[str, User]:
        """The users file's users, read again whenever the file changed.

        A file that changed and cannot be read (a bad line, a half-written file
        of an editor) is logged as an error once, and the users read last stay.
        """
        return self._current().users

    def reload(self) -> None:
        """Read the users file again now, changed or not (SIGHUP)."""
        with self._lock:
            self._seen = None
        self._current()

    def _current(self) -> UsersFile:
        if self.users_file is None:
            return self._file
        with self._lock:
            seen = _signature(self.users_file)
            if seen != self._seen:
                self._seen = seen
                try:
                    self._file = read_users_file(self.users_file)
                except UsersFileError as exc:
                    log.error(
                        "the users file changed and cannot be used, so the users read last "
                        "stay (%d of them): %s",
                        len(self._file.users),
                        exc,
                    )
                else:
                    log.info(
                        "read the users file %s: %d users", self.users_file, len(self._file.users)
                    )
            return self._file

    def login(self, user: str, password: str, address: str = "") -> str:
        """A token for ``user`` once ``password`` matches the users file's hash.

        Args:
            address: The client's host (``login_limits.peer_host``); ``""``: unknown.

        Raises:
            LoginThrottledError: too many failed logins of ``user`` or from
                ``address`` lately (``login_limits``); the password is not checked.
            AuthenticationError: no users file, an unknown user or a wrong password
                (the latter two say the same to the caller; the log says which).
        """
        if self.users_file is None:
            raise AuthenticationError(
                "this scheduler has no users file, so nobody logs in with a password: "
                "connect with a token its admins make (`mangonel users token NAME "
                "--cluster-secret-file ...`), or ask them to start it with --users-file"
            )
        stripe = self._login_locks[hash(user) % _LOGIN_STRIPES]
        with stripe:
            return self._login(user, password, address)

    def _login(self, user: str, password: str, address: str) -> str:
        with self._lock:
            refusal = self._limiter.check(user, address, self._clock())
        if refusal is not None:
            log.warning(
                "login refused for user %r from %s: too many failed logins of the %s",
                user,
                address or "an unknown address",
                refusal.by.value,
            )
            raise LoginThrottledError(refusal.message())
        known = self.users().get(user)
        # Check a hash even for an unknown user: the time taken tells nothing.
        matches = check_password(password, known.password_hash if known else _dummy_hash())
        with self._lock:
            if known is None or not matches:
                self._limiter.failed(user, address, self._clock())
            else:
                self._limiter.succeeded(user)
        if known is None or not matches:
            why = "no such user" if known is None else "wrong password"
            log.warning("login refused for user %r: %s (from %s)", user, why, address or "?")
            raise AuthenticationError(
                f"login refused: {WRONG_CREDENTIALS} (user {user!r}); check them, or ask an "
                "admin to set the password with `mangonel users add`"
            )
        return tokens.mint(self._secret, user, admin=known.admin, ttl_s=self.token_ttl_s)

    def verify(self, token: str) -> Principal:
        """The principal of a valid token.

        Raises:
            AuthenticationError: malformed, forged or expired (``tokens``), revoked,
                or its user was removed from the users file.
        """
        claims = tokens.verify(self._secret, token)
        if self.users_file is None:
            return Principal(claims.user, claims.admin)
        file = self._current()
        known = file.users.get(claims.user)
        if known is None:
            raise AuthenticationError(
                f"the token's user {claims.user!r} is not in the users file any more; "
                "ask an admin to add the user again"
            )
        revoked = file.revoked.why_refused(claims)
        if revoked is not None:
            raise AuthenticationError(
                f"{revoked} (`mangonel users revoke`); log in again, or ask an admin for a "
                "new token"
            )
        return Principal(known.name, known.admin, known.writer)


_LOGIN_STRIPES = 64


def _signature(path: str) -> tuple[int, int, int]:
    """What tells that a file changed: its mtime, size and inode (a replace by
    rename changes the inode even within one mtime tick)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def authenticator_for(options: SecurityOptions, limits: LoginLimits | None = None) -> Authenticator:
    """The authenticator a process with ``options`` checks users with; ``limits``:
    of failed password logins (``login_limits``; the defaults when ``None``).

    ``OPEN`` without a users file and without TLS; else a ``UsersAuthenticator``
    (see this module's docstring for the combinations).

    Raises:
        SecurityConfigError: the cluster secret or users file cannot be read, or
            TLS without a cluster secret.
    """
    if options.users_file is None:
        if not options.tls:
            # No accounts: everyone who reaches the scheduler is the admin.
            return OPEN
        # TLS lets in everyone who trusts the CA (clients show no certificate):
        # only the cluster secret's tokens decide who gets in.
        tokens_only = options.cluster_secret()
        if tokens_only is None:
            raise SecurityConfigError(
                "a scheduler with TLS needs the cluster secret: its tokens are how clients "
                "get in (--tls-dir DIR/cluster, or --cluster-secret-file)"
            )
        return UsersAuthenticator(None, tokens_only)
    secret = options.cluster_secret()
    if secret is None:
        log.warning(
            "no cluster secret: tokens are signed with a random key of this process and "
            "are void after a restart; give --cluster-secret-file (or --tls-dir) to keep them"
        )
        secret = secrets.token_bytes(32)
    return UsersAuthenticator(options.users_file, secret, limits=limits)
