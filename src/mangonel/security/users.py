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
half a file); a scheduler reads it again when it changes, so adding or removing
a user needs no restart, and removing one refuses their tokens at once.

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
import os
import re
import secrets
import stat
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from mangonel import defaults
from mangonel.errors import AuthenticationError
from mangonel.security import tokens
from mangonel.security.auth import OPEN, Authenticator, Principal
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
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read()
    except FileNotFoundError:
        return {}
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
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
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
    return users


def write_users(path: str, users: Mapping[str, User]) -> None:
    """Replace the users file atomically with ``users``, readable by its owner only."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".users-", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_HEADER)
            for user in sorted(users.values(), key=lambda u: u.name):
                f.write(f"{user.name}:{user.role}:{user.password_hash}\n")
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
    users = read_users(path)
    new = name not in users
    users[name] = User(name, admin, hash_password(password), writer)
    write_users(path, users)
    return new


def remove_user(path: str, name: str) -> bool:
    """Remove ``name``; False when it was not there. Its tokens are refused from now on."""
    users = read_users(path)
    if users.pop(name, None) is None:
        return False
    write_users(path, users)
    return True


# ------------------------------------------------------------ authenticator


class UsersAuthenticator:
    """Logs users in against a users file; verifies tokens signed with the cluster secret.

    Thread-safe; shared by every front door of one scheduler. Implements
    ``mangonel.security.auth.Authenticator``.

    Args:
        users_file: The users file; ``None``: nobody logs in, tokens only.
        secret: The cluster secret (at least 32 bytes) that signs tokens.
        token_ttl_s: Lifetime of the tokens ``login`` gives.
    """

    required = True

    def __init__(
        self,
        users_file: str | None,
        secret: bytes,
        token_ttl_s: float = defaults.TOKEN_TTL_S,
    ) -> None:
        self.users_file = users_file
        self._secret = secret
        self.token_ttl_s = token_ttl_s
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._users: dict[str, User] = {}
        if users_file is not None:
            self.users()  # a broken file is an error at start, not at the first login

    def users(self) -> dict[str, User]:
        """The users file's users, read again whenever the file changed.

        Raises:
            UsersFileError: it cannot be read.
        """
        if self.users_file is None:
            return {}
        with self._lock:
            try:
                st = os.stat(self.users_file)
                seen = (st.st_mtime_ns, st.st_size, st.st_ino)
            except FileNotFoundError:
                seen = (0, 0, 0)
            if seen != self._seen:
                self._users = read_users(self.users_file)
                self._seen = seen
            return self._users

    def login(self, user: str, password: str) -> str:
        """A token for ``user`` once ``password`` matches the users file's hash.

        Raises:
            AuthenticationError: no users file, an unknown user or a wrong password
                (the latter two say the same to the caller; the log says which).
        """
        if self.users_file is None:
            raise AuthenticationError(
                "this scheduler has no users file, so nobody logs in with a password: "
                "connect with a token its admins make (`mangonel users token NAME "
                "--cluster-secret-file ...`), or ask them to start it with --users-file"
            )
        known = self.users().get(user)
        # Check a hash even for an unknown user: the time taken tells nothing.
        matches = check_password(password, known.password_hash if known else _dummy_hash())
        if known is None or not matches:
            why = "no such user" if known is None else "wrong password"
            log.warning("login refused for user %r: %s", user, why)
            raise AuthenticationError(
                f"login refused: {WRONG_CREDENTIALS} (user {user!r}); check them, or ask an "
                "admin to set the password with `mangonel users add`"
            )
        return tokens.mint(self._secret, user, admin=known.admin, ttl_s=self.token_ttl_s)

    def verify(self, token: str) -> Principal:
        """The principal of a valid token.

        Raises:
            AuthenticationError: malformed, forged or expired (``tokens``), or its
                user was removed from the users file.
        """
        claims = tokens.verify(self._secret, token)
        if self.users_file is None:
            return Principal(claims.user, claims.admin)
        known = self.users().get(claims.user)
        if known is None:
            raise AuthenticationError(
                f"the token's user {claims.user!r} is not in the users file any more; "
                "ask an admin to add the user again"
            )
        return Principal(known.name, known.admin, known.writer)


def authenticator_for(options: SecurityOptions) -> Authenticator:
    """The authenticator a process with ``options`` checks users with.

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
    return UsersAuthenticator(options.users_file, secret)
