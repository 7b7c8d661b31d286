"""When a session tries the scheduler again, how long, and how often.

A session tries again only while the scheduler is *unavailable*: gRPC's
UNAVAILABLE (nothing listens, the standby does not lead yet, a cut link), never
an answer the scheduler gave (a ``QueryError``, a refused login): an answer is
the scheduler's word, and asking again gets the same one.

Two spans bound the trying, both the caller's settings:

* ``connect_wait_s``: before any scheduler answered this session. The
  failures that say no scheduler is there *yet* are waited out (connection
  refused, a name that does not resolve yet, no route): a scheduler that is
  starting, restarting, or whose standby is taking over; and one that takes
  the connection but sends nothing (frozen, or too busy to). Something that
  takes the connection and answers, but not as a scheduler (TLS on one side
  only, another CA), is a setup error that waiting does not mend: an error once
  it has gone on for ``SETUP_ERROR_S`` (``Trying.note``).
* ``reconnect_s``: once one answered, any unavailability (a restart, a
  failover, a cut) for this long.

Between rounds of every address the session pauses with ``Backoff``: growing
(a restart takes a second or two, a failover a few), capped (a scheduler back
is found within the cap), and with jitter (clients cut off together do not all
call back in the same instant).

>>> b = Backoff(first_s=0.1, max_s=1.0, jitter=0.0)
>>> [b.next() for _ in range(6)]
[0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# The first pause and the longest: gRPC's own reconnect backoff of the session's
# channels grows to 1 s too (``rpc.CHANNEL_OPTIONS``), so a shorter pause would
# mostly meet a channel that does not try yet, and a longer one would find a
# scheduler that is back later than needed.
FIRST_PAUSE_S = 0.1
MAX_PAUSE_S = 1.0

# How long failures that say neither "nothing there" nor "nothing answers" go on,
# in a row, before a session that never reached a scheduler gives up on them. A
# channel repeats its last connection's error to every call until its reconnect
# backoff ends (up to 1 s, ``rpc.CHANNEL_OPTIONS``): a scheduler that died under
# a first call (its connections reset) is reported so for that long, and only a
# failure seen again after it is the setup's, not a restart's.
SETUP_ERROR_S = 2.5

# What gRPC's UNAVAILABLE says (lower case) when no scheduler is at the address
# yet, and how the session says it. gRPC 1.85: "failed to connect to all
# addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote
# host: Connection refused"; "errors resolving h:50050: [...] Domain name not
# found"; a frozen scheduler: "connection attempt timed out before receiving
# SETTINGS frame" (the channel gives a handshake as long as its backoff, from
# 0.1 s). A TLS mismatch says "Socket closed" or "Tls handshake failed": not here.
_ABSENT: tuple[tuple[tuple[str, ...], str], ...] = (
    (("connection refused",), "connection refused"),
    (
        ("errors resolving", "dns resolution failed", "domain name not found", "name not known"),
        "the name does not resolve",
    ),
    (
        ("no route to host", "network is unreachable", "host is unreachable"),
        "no route to it",
    ),
    (("connection timed out", "connect timed out"), "the connection timed out"),
    (("before receiving settings",), "it takes connections but does not answer"),
)


def absent_reason(details: str) -> str | None:
    """Why no scheduler is there, from an UNAVAILABLE call's details; ``None``
    when they say something else (a TLS mismatch, a reset): not worth waiting for.

    >>> absent_reason("failed to connect to all addresses; ... Connection refused")
    'connection refused'
    >>> absent_reason("failed to connect to all addresses; ... Socket closed") is None
    True
    """
    lowered = details.lower()
    for needles, reason in _ABSENT:
        if any(n in lowered for n in needles):
            return reason
    return None


@dataclass
class Backoff:
    """Pauses that double from ``first_s`` up to ``max_s``, each shortened by a
    random share of at most ``jitter`` (``rand`` draws it, in [0, 1))."""

    first_s: float = FIRST_PAUSE_S
    max_s: float = MAX_PAUSE_S
    jitter: float = 0.5
    rand: Callable[[], float] = random.random
    _next_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._next_s = self.first_s

    def next(self) -> float:
        """The next pause (seconds)."""
        pause = self._next_s
        self._next_s = min(self.max_s, 2 * pause)
        return pause * (1.0 - self.jitter * self.rand())


@dataclass
class Trying:
    """One stretch of trying the scheduler again: since when, until when, and why.

    Attributes:
        started: ``time.monotonic()`` of the first failure.
        until: When to give up (``time.monotonic()``).
        absent: Before any scheduler answered: why none is there, when the last
            failure said so (``absent_reason``); ``None`` otherwise.
        others_since: Before any scheduler answered: when the failures in a row
            that said something else began (see ``note``); ``None`` when the
            last failure was an absence.
        told: Whether the caller was told that the session waits.
    """

    started: float
    until: float
    absent: str | None = None
    others_since: float | None = None
    told: bool = False
    backoff: Backoff = field(default_factory=Backoff)

    def note(self, absent: str | None, now: float) -> None:
        """Count a failure before any scheduler answered: ``absent`` says why none
        is there (``absent_reason``), ``None`` for any other failure.

        Other failures in a row for ``SETUP_ERROR_S`` end the stretch: something
        takes the connection but does not answer as a scheduler (TLS on one
        side only, another CA), and waiting does not mend that. Until then they
        are tried again: it may be a scheduler that died under the call, which
        a later try finds refusing connections until it is back.
        """
        self.absent = absent
        if absent is not None:
            self.others_since = None
            return
        if self.others_since is None:
            self.others_since = now
        elif now - self.others_since >= SETUP_ERROR_S:
            self.until = min(self.until, now)

    def pause(self, now: float) -> float:
        """How long to sleep before the next round: the backoff's next pause,
        but never past ``until`` (the last try comes when the span ends)."""
        return max(0.0, min(self.backoff.next(), self.until - now))


def waiting_message(addresses: Sequence[str], reason: str, wait_s: float) -> str:
    """What a session says once when it starts waiting for a scheduler never reached.

    >>> waiting_message(["127.0.0.1:50050"], "connection refused", 30)
    'waiting up to 30 s for the scheduler at 127.0.0.1:50050 (connection refused)'
    """
    return f"waiting up to {round(wait_s, 1):g} s for {_which(addresses)} ({reason})"


def gave_up_message(addresses: Sequence[str], reason: str, waited_s: float) -> str:
    """The error after waiting ``waited_s`` for a scheduler that never answered:
    what was tried, for how long, and what to check."""
    which = _which(addresses)
    them = "it" if len(addresses) == 1 else "one of them"
    return (
        f"cannot reach {which} ({reason}), tried for {round(waited_s, 1):g} s; is {them} running, "
        f"and at that address? start one with `mangonel standalone`, give the right address "
        f"(`mangonel --scheduler`, $MANGONEL_SCHEDULER), or wait longer "
        f"(`mangonel --connect-wait`, connect_wait_s=)"
    )


def _which(addresses: Sequence[str]) -> str:
    if len(addresses) == 1:
        return f"the scheduler at {addresses[0]}"
    return f"any scheduler of {', '.join(addresses)}"
