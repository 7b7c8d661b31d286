"""How a session waits for a scheduler: what it tries again, for how long, how often.

The pure parts (``client.retry``: the backoff, which failures mean "no scheduler
there yet", a stretch of trying) directly.
"""

from __future__ import annotations

import doctest

import pytest

from mangonel.client import retry

# What gRPC 1.85 says, as measured on loopback.
REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
    "Failed to connect to remote host: Connection refused"
)
NO_NAME = (
    "errors resolving no-such-host.invalid:50050: [field:hostname lookup error:address "
    "lookup failed for no-such-host.invalid:50050: Domain name not found]"
)
# A plaintext client at a TLS port; a client of another CA.
SOCKET_CLOSED = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:x: Socket closed"
HANDSHAKE = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:38467: Tls "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED"
)


def test_the_module_examples_hold() -> None:
    assert doctest.testmod(retry).failed == 0


# ------------------------------------------------------------------- backoff


def test_pauses_double_up_to_the_cap() -> None:
    backoff = retry.Backoff(first_s=0.1, max_s=1.0, jitter=0.0)
    assert [round(backoff.next(), 3) for _ in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_jitter_shortens_a_pause_by_at_most_its_share() -> None:
    draws = iter([0.0, 0.999999, 0.5])
    backoff = retry.Backoff(first_s=1.0, max_s=1.0, jitter=0.5, rand=lambda: next(draws))
    assert backoff.next() == 1.0
    assert backoff.next() == pytest.approx(0.5, abs=1e-5)
    assert backoff.next() == pytest.approx(0.75)


def test_the_default_backoff_stays_within_its_bounds() -> None:
    backoff = retry.Backoff()
    pauses = [backoff.next() for _ in range(50)]
    assert all(retry.FIRST_PAUSE_S / 2 <= p <= retry.MAX_PAUSE_S for p in pauses)
    assert max(pauses[10:]) > retry.MAX_PAUSE_S / 2  # grew to the cap's range


# --------------------------------------------------------- what is waited for


@pytest.mark.parametrize(
    ("details", "reason"),
    [
        (REFUSED, "connection refused"),
        (NO_NAME, "the name does not resolve"),
        ("... DNS resolution failed for s1:50050 ...", "the name does not resolve"),
        ("... connect: No route to host (113)", "no route to it"),
        ("... Network is unreachable", "no route to it"),
        (SOCKET_CLOSED, None),
        (HANDSHAKE, None),
        ("GOAWAY received", None),
        ("", None),
    ],
)
def test_only_failures_that_say_no_scheduler_is_there_are_absences(
    details: str, reason: str | None
) -> None:
    assert retry.absent_reason(details) == reason


def test_a_second_other_failure_in_a_row_ends_the_stretch() -> None:
    trying = retry.Trying(started=0.0, until=30.0)
    trying.note(None, 1.0)  # a scheduler that died under the call, perhaps
    assert trying.until == 30.0
    trying.note("connection refused", 2.0)  # it did: now it refuses
    trying.note(None, 3.0)
    assert trying.until == 30.0 and trying.absent is None
    trying.note(None, 4.0)  # twice in a row: something else answers there
    assert trying.until == 4.0


def test_a_pause_never_runs_past_the_end_of_the_stretch() -> None:
    trying = retry.Trying(
        started=0.0, until=10.0, backoff=retry.Backoff(first_s=4.0, max_s=4.0, jitter=0.0)
    )
    assert trying.pause(now=1.0) == 4.0
    assert trying.pause(now=9.5) == 0.5
    assert trying.pause(now=11.0) == 0.0


def test_the_final_error_says_what_was_tried_how_long_and_what_to_check() -> None:
    one = retry.gave_up_message(["s1:50050"], "connection refused", 30.04)
    assert one.startswith("cannot reach the scheduler at s1:50050 (connection refused)")
    assert "tried for 30 s" in one
    assert "mangonel standalone" in one and "--scheduler" in one and "--connect-wait" in one
    two = retry.gave_up_message(["a:1", "b:1"], "connection refused", 2.5)
    assert two.startswith("cannot reach any scheduler of a:1, b:1") and "tried for 2.5 s" in two
