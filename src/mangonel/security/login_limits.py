"""How many failed password logins a user name, and a client address, may make.

Pure logic: the time arrives as an argument, so the tests drive it without a
clock. ``UsersAuthenticator`` holds one ``LoginLimiter`` for every front door of a
scheduler (gRPC, Flight SQL, the web UI), so failures at one door count at the
others too::

    allowed ──(limit failures within window_s)──> locked ──(lockout_s passed)──> allowed

A user name is locked after ``LoginLimits.user_failures`` failed logins within
``window_s``; a client address after ``address_failures`` (of any user names: a
guesser going through names). A locked key is refused *before* its password is
checked: a guess during the lockout tells nothing, and costs the scheduler no
hash. A successful login clears its user name's failures (not its address's: a
guesser with an account of their own could otherwise clear theirs at will).

The counts live in the scheduler's memory: a restart, or a second scheduler of
a highly available pair, starts from none (a guesser gains one more round of
``user_failures`` tries per restart).

>>> limiter = LoginLimiter(LoginLimits(user_failures=2, address_failures=10, window_s=60,
...                                    lockout_s=30))
>>> for t in (0.0, 1.0):
...     limiter.failed("alice", "10.0.0.7", now=t)
>>> limiter.check("alice", "10.0.0.7", now=2.0).retry_after_s
29.0
>>> limiter.check("alice", "10.0.0.7", now=31.0) is None
True
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field

from mangonel import defaults

MAX_KEYS = 100_000
"""User names and addresses with failures remembered at most: a guesser spraying
names or addresses cannot grow the scheduler's memory without bound (the
oldest are forgotten first)."""


class LimitedBy(enum.Enum):
    """What a refused login was counted against."""

    USER = "user"
    ADDRESS = "address"


@dataclass(frozen=True)
class LoginLimits:
    """How many failures lock a key, over how long, and for how long.

    Attributes:
        user_failures: Failed logins of one user name that lock it; 0: no limit.
        address_failures: Failed logins from one address that lock it; 0: no limit.
        window_s: Seconds over which failures are counted.
        lockout_s: Seconds a locked key is refused.
    """

    user_failures: int = defaults.LOGIN_USER_FAILURES
    address_failures: int = defaults.LOGIN_ADDRESS_FAILURES
    window_s: float = defaults.LOGIN_WINDOW_S
    lockout_s: float = defaults.LOGIN_LOCKOUT_S

    def __post_init__(self) -> None:
        if self.user_failures < 0 or self.address_failures < 0:
            raise ValueError("a login limit is a count of failures, 0 or more")
        if self.window_s <= 0 or self.lockout_s <= 0:
            raise ValueError("the login window and lockout are positive seconds")

    def limit(self, by: LimitedBy) -> int:
        return self.user_failures if by is LimitedBy.USER else self.address_failures


@dataclass(frozen=True)
class Refusal:
    """A login refused because its user name or address failed too often.

    Attributes:
        by: Which of the two was locked.
        key: The user name or address.
        retry_after_s: Seconds until it is unlocked.
    """

    by: LimitedBy
    key: str
    retry_after_s: float

    def message(self) -> str:
        """What the client is told (the same words at every front door)."""
        wait = max(1, math.ceil(self.retry_after_s))
        if self.by is LimitedBy.USER:
            return (
                f"too many failed logins for user {self.key!r}; try again in {wait} s (or "
                "ask an admin to check the password with `mangonel users add`)"
            )
        return f"too many failed logins from your address {self.key}; try again in {wait} s"


@dataclass
class _Failures:
    """One key's failures within the window, or the end of its lockout."""

    times: deque[float] = field(default_factory=deque)
    locked_until: float | None = None


class LoginLimiter:
    """Counts failed logins by user name and by address; says when to refuse one.

    Not thread-safe: its owner calls it under a lock.
    """

    def __init__(self, limits: LoginLimits | None = None) -> None:
        self.limits = limits or LoginLimits()
        self._keys: dict[tuple[LimitedBy, str], _Failures] = {}

    def check(self, user: str, address: str, now: float) -> Refusal | None:
        """Why a login of ``user`` from ``address`` is refused now; ``None``: let it
        be checked. The user name's lock is told first (it is what its owner can
        act on). An empty ``address`` (unknown) is not limited."""
        for by, key in self._pairs(user, address):
            failures = self._keys.get((by, key))
            if failures is not None and failures.locked_until is not None:
                if now < failures.locked_until:
                    return Refusal(by, key, failures.locked_until - now)
                del self._keys[(by, key)]  # the lockout is over: start afresh
        return None

    def failed(self, user: str, address: str, now: float) -> None:
        """Count a failed login (a wrong password, or an unknown user name)."""
        for by, key in self._pairs(user, address):
            limit = self.limits.limit(by)
            if limit == 0:
                continue
            failures = self._keys.pop((by, key), None) or _Failures()
            self._keys[(by, key)] = failures  # the most recent last: forgotten last
            times = failures.times
            while times and times[0] <= now - self.limits.window_s:
                times.popleft()
            times.append(now)
            if len(times) >= limit:
                failures.locked_until = now + self.limits.lockout_s
                times.clear()
        while len(self._keys) > MAX_KEYS:
            del self._keys[next(iter(self._keys))]

    def succeeded(self, user: str) -> None:
        """A login of ``user`` succeeded: its user name's failures are forgotten."""
        self._keys.pop((LimitedBy.USER, user), None)

    def __len__(self) -> int:
        """User names and addresses remembered (failures or a lockout)."""
        return len(self._keys)

    @staticmethod
    def _pairs(user: str, address: str) -> list[tuple[LimitedBy, str]]:
        pairs = [(LimitedBy.USER, user)]
        if address:
            pairs.append((LimitedBy.ADDRESS, address))
        return pairs


def peer_host(peer: str) -> str:
    """The host of a gRPC peer (``ipv4:10.0.0.7:51234``, ``ipv6:[::1]:51234``) or of
    ``host:port``, without the port: the key an address is limited by (every
    connection of a client comes from another port). ``""`` when unknown.

    >>> peer_host("ipv4:10.0.0.7:51234"), peer_host("ipv6:[::1]:5000"), peer_host("unix:/s")
    ('10.0.0.7', '::1', '')
    """
    scheme, sep, rest = peer.partition(":")
    if not sep or scheme not in ("ipv4", "ipv6"):
        return ""
    if rest.startswith("["):
        return rest[1:].partition("]")[0]
    return rest.rpartition(":")[0] or rest
