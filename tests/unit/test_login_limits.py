"""``LoginLimiter``: failed logins counted per user name and per address, time passed in."""

from __future__ import annotations

import pytest

from mangonel import defaults
from mangonel.client.cli import build_parser
from mangonel.security.login_limits import (
    MAX_KEYS,
    LimitedBy,
    LoginLimiter,
    LoginLimits,
    peer_host,
)
from mangonel.security.options import login_limits_from_args

LIMITS = LoginLimits(user_failures=3, address_failures=5, window_s=60.0, lockout_s=100.0)


def test_a_user_name_is_locked_after_its_failures_and_unlocked_after_the_lockout() -> None:
    limiter = LoginLimiter(LIMITS)
    for t in (0.0, 10.0):
        limiter.failed("alice", "10.0.0.1", t)
        assert limiter.check("alice", "10.0.0.1", t) is None
    limiter.failed("alice", "10.0.0.2", 20.0)  # the third, from anywhere
    refusal = limiter.check("alice", "10.0.0.3", 30.0)
    assert refusal is not None and refusal.by is LimitedBy.USER and refusal.key == "alice"
    assert refusal.retry_after_s == pytest.approx(90.0)
    assert refusal.message() == (
        "too many failed logins for user 'alice'; try again in 90 s (or ask an admin to "
        "check the password with `mangonel users add`)"
    )
    assert limiter.check("bob", "10.0.0.3", 30.0) is None  # others are not locked
    assert limiter.check("alice", "10.0.0.3", 119.5) is not None
    assert limiter.check("alice", "10.0.0.3", 120.0) is None  # lockout over
    # ... and its failures start from none: two more do not lock it again.
    limiter.failed("alice", "10.0.0.1", 121.0)
    limiter.failed("alice", "10.0.0.1", 122.0)
    assert limiter.check("alice", "10.0.0.4", 123.0) is None


def test_failures_older_than_the_window_do_not_count() -> None:
    limiter = LoginLimiter(LIMITS)
    for t in (0.0, 40.0, 80.0, 120.0):  # never three within 60 s
        limiter.failed("alice", "", t)
    assert limiter.check("alice", "", 121.0) is None
    limiter.failed("alice", "", 125.0)  # 80, 120, 125: three within 60 s
    assert limiter.check("alice", "", 125.0) is not None


def test_an_address_is_locked_after_failures_of_many_user_names() -> None:
    limiter = LoginLimiter(LIMITS)
    for i in range(5):
        limiter.failed(f"user{i}", "10.0.0.9", float(i))
    refusal = limiter.check("carol", "10.0.0.9", 5.0)
    assert refusal is not None and refusal.by is LimitedBy.ADDRESS
    assert refusal.message() == (
        "too many failed logins from your address 10.0.0.9; try again in 99 s"
    )
    assert limiter.check("carol", "10.0.0.8", 5.0) is None  # another address


def test_success_clears_the_user_names_failures_not_the_addresss() -> None:
    limiter = LoginLimiter(LIMITS)
    for t in (0.0, 1.0):
        limiter.failed("alice", "10.0.0.1", t)
    limiter.succeeded("alice")
    limiter.failed("alice", "10.0.0.1", 2.0)
    assert limiter.check("alice", "10.0.0.7", 3.0) is None  # 1 since the success
    # A guesser with an account of their own cannot clear their address's count.
    limiter.failed("x", "10.0.0.1", 4.0)
    limiter.succeeded("mallory")
    limiter.failed("y", "10.0.0.1", 5.0)  # the fifth from 10.0.0.1
    refusal = limiter.check("mallory", "10.0.0.1", 6.0)
    assert refusal is not None and refusal.by is LimitedBy.ADDRESS


def test_zero_turns_a_limit_off_and_an_unknown_address_is_not_limited() -> None:
    limiter = LoginLimiter(LoginLimits(user_failures=0, address_failures=2, window_s=60))
    for t in range(10):
        limiter.failed("alice", "", float(t))
    assert limiter.check("alice", "", 10.0) is None
    assert len(limiter) == 0
    with pytest.raises(ValueError, match="0 or more"):
        LoginLimits(user_failures=-1)
    with pytest.raises(ValueError, match="positive"):
        LoginLimits(window_s=0)


def test_the_keys_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mangonel.security.login_limits.MAX_KEYS", 10)
    limiter = LoginLimiter(LIMITS)
    for i in range(50):
        limiter.failed(f"user{i}", "", float(i))
    assert len(limiter) == 10
    assert MAX_KEYS >= 10_000  # the real bound leaves room for every real user


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.7:51234", "10.0.0.7"),
        ("ipv6:[::1]:5000", "::1"),
        ("ipv6:[fe80::1%eth0]:1", "fe80::1%eth0"),
        ("unix:/tmp/s", ""),
        ("", ""),
    ],
)
def test_peer_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host


def test_the_schedulers_options_give_the_limits() -> None:
    args = build_parser().parse_args(["scheduler"])
    assert login_limits_from_args(args) == LoginLimits()
    assert LoginLimits().user_failures == defaults.LOGIN_USER_FAILURES
    args = build_parser().parse_args(
        ["scheduler", "--login-failures", "3", "--login-address-failures", "0",
         "--login-lockout", "60"]
    )  # fmt: skip
    assert login_limits_from_args(args) == LoginLimits(3, 0, 60.0, 60.0)
