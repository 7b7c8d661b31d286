"""Tokens, the users file and ``UsersAuthenticator``: no processes, no network.

Each way a credential fails has its own message; these tests pin what each
says, that a refusal never lets the caller in, and that the file is written
the way a file of password hashes must be (0600, atomically).
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from mangonel.client.cli import main as cli_main
from mangonel.errors import AuthenticationError, LoginThrottledError, PermissionDeniedError
from mangonel.security import (
    OPEN,
    Principal,
    UsersAuthenticator,
    authenticator_for,
    basic_credentials,
    bearer_token,
    tokens,
)
from mangonel.security.login_limits import LoginLimits
from mangonel.security.options import SecurityConfigError, SecurityOptions
from mangonel.security.users import (
    UsersFileError,
    add_user,
    check_password,
    hash_password,
    read_users,
    read_users_file,
    remove_user,
    revoke_token,
    revoke_user,
)

SECRET = b"s" * 32
OTHER_SECRET = b"o" * 32


# ----------------------------------------------------------------------- tokens


def test_a_token_carries_its_user_role_and_expiry() -> None:
    token = tokens.mint(SECRET, "alice", admin=True, ttl_s=60, now=1000.0)
    claims = tokens.verify(SECRET, token, now=1059.0)
    assert (claims.user, claims.admin, claims.issued_at, claims.expires_at) == (
        "alice",
        True,
        1000.0,
        1060.0,
    )
    assert tokens.expires_at(token) == 1060.0


def test_two_tokens_of_one_second_differ() -> None:
    one = tokens.mint(SECRET, "alice", admin=False, now=1000.0)
    two = tokens.mint(SECRET, "alice", admin=False, now=1000.0)
    assert one != two


def test_an_expired_token_is_refused_as_expired() -> None:
    token = tokens.mint(SECRET, "alice", admin=False, ttl_s=60, now=1000.0)
    with pytest.raises(tokens.ExpiredTokenError, match=r"'alice' expired at .*\(1 s ago\).*log in"):
        tokens.verify(SECRET, token, now=1061.0)
    with pytest.raises(tokens.ExpiredTokenError):
        tokens.verify(SECRET, token, now=1060.0)  # the expiry second itself is out


def test_a_token_of_another_secret_is_refused_as_forged() -> None:
    token = tokens.mint(OTHER_SECRET, "root", admin=True)
    with pytest.raises(tokens.ForgedTokenError, match="not issued by this cluster"):
        tokens.verify(SECRET, token)


def test_altered_claims_are_refused_as_forged() -> None:
    head, claims, signature = tokens.mint(SECRET, "alice", admin=False).split(".")
    raised = {**json.loads(tokens._unb64(claims)), "a": True, "exp": 4_000_000_000}
    altered = f"{head}.{tokens._b64(json.dumps(raised).encode())}.{signature}"
    with pytest.raises(tokens.ForgedTokenError):
        tokens.verify(SECRET, altered)


def test_a_forged_expired_token_says_forged_not_expired() -> None:
    # The signature is checked before any claim is believed.
    token = tokens.mint(OTHER_SECRET, "alice", admin=False, ttl_s=1, now=1000.0)
    with pytest.raises(tokens.ForgedTokenError):
        tokens.verify(SECRET, token)


@pytest.mark.parametrize(
    "text", ["", "garbage", "mgt1.abc", "mgt2.a.b", "mgt1.!!!.???", "Bearer mgt1.a.b.c"]
)
def test_malformed_tokens_are_refused_as_malformed(text: str) -> None:
    with pytest.raises(tokens.MalformedTokenError, match="malformed"):
        tokens.verify(SECRET, text)


def test_token_errors_are_authentication_errors() -> None:
    for cls in (tokens.MalformedTokenError, tokens.ForgedTokenError, tokens.ExpiredTokenError):
        assert issubclass(cls, AuthenticationError)


# ------------------------------------------------------------------- passwords


def test_password_hashes_are_salted_and_checked() -> None:
    one, two = hash_password("correct horse"), hash_password("correct horse")
    assert one != two and one.startswith("scrypt$16384$8$1$")
    assert check_password("correct horse", one) and check_password("correct horse", two)
    assert not check_password("correct horsf", one)
    assert not check_password("correct horse", "scrypt$broken")
    assert not check_password("correct horse", "md5$x$y")


# ------------------------------------------------------------------ users file


def test_the_users_file_is_private_and_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "users"
    assert add_user(str(path), "alice", "alice-secret")
    assert add_user(str(path), "root", "root-secret", admin=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    inode = path.stat().st_ino
    assert not add_user(str(path), "alice", "alice-newer!")  # updated, not new
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["users"]  # no temp file left
    users = read_users(str(path))
    assert {(u.name, u.admin) for u in users.values()} == {("alice", False), ("root", True)}
    assert check_password("alice-newer!", users["alice"].password_hash)
    assert "alice-newer!" not in path.read_text()
    assert remove_user(str(path), "alice") and not remove_user(str(path), "alice")
    assert set(read_users(str(path))) == {"root"}


def test_a_users_file_others_can_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "users"
    add_user(str(path), "alice", "alice-secret")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        read_users(str(path))
    assert "can be read by others (mode 644)" in caplog.text


@pytest.mark.parametrize(
    ("line", "number"),
    [("alice:user", 2), ("alice:superuser:scrypt$1", 2), ("al ice:user:scrypt$1", 2)],
)
def test_a_bad_line_of_the_users_file_is_named(tmp_path: Path, line: str, number: int) -> None:
    path = tmp_path / "users"
    path.write_text(f"# comment\n{line}\n")
    with pytest.raises(UsersFileError, match=f"line {number} of the users file"):
        read_users(str(path))


@pytest.mark.parametrize(
    ("name", "password", "message"),
    [
        ("al:ice", "long-enough", "cannot name a user"),
        ("-x", "long-enough", "cannot name a user"),
        ("alice", "short", "at least 8 characters"),
    ],
)
def test_bad_names_and_short_passwords_are_refused(
    tmp_path: Path, name: str, password: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        add_user(str(tmp_path / "users"), name, password)


# ---------------------------------------------------------------- authenticator


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "users"
    add_user(str(path), "alice", "alice-secret")
    add_user(str(path), "root", "root-secret", admin=True)
    return path


def test_login_gives_a_token_verify_gives_the_user(users_file: Path) -> None:
    auth = UsersAuthenticator(str(users_file), SECRET)
    assert auth.required
    token = auth.login("alice", "alice-secret")
    who = auth.verify(token)
    assert (who.user, who.admin) == ("alice", False)
    assert who.may_see("alice") and not who.may_see("bob")
    root = auth.verify(auth.login("root", "root-secret"))
    assert root.admin and root.may_see("bob")


def test_wrong_password_and_unknown_user_say_the_same_and_log_which(
    users_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auth = UsersAuthenticator(str(users_file), SECRET)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(AuthenticationError, match="wrong user name or password") as wrong:
            auth.login("alice", "not-it")
        with pytest.raises(AuthenticationError, match="wrong user name or password") as unknown:
            auth.login("mallory", "whatever")
    assert str(wrong.value).replace("alice", "X") == str(unknown.value).replace("mallory", "X")
    assert "login refused for user 'alice': wrong password" in caplog.text
    assert "login refused for user 'mallory': no such user" in caplog.text
    assert "not-it" not in caplog.text  # passwords never reach the log


def test_the_file_is_read_again_when_it_changes(users_file: Path) -> None:
    auth = UsersAuthenticator(str(users_file), SECRET)
    token = auth.login("alice", "alice-secret")
    add_user(str(users_file), "alice", "alice-secret", admin=True)  # promoted
    assert auth.verify(token).admin  # the file's role wins over the token's
    remove_user(str(users_file), "alice")
    with pytest.raises(AuthenticationError, match="not in the users file any more"):
        auth.verify(token)
    with pytest.raises(AuthenticationError):
        auth.login("alice", "alice-secret")


def test_without_a_users_file_nobody_logs_in_but_tokens_get_in() -> None:
    auth = UsersAuthenticator(None, SECRET)
    with pytest.raises(AuthenticationError, match="no users file.*--users-file"):
        auth.login("alice", "alice-secret")
    who = auth.verify(tokens.mint(SECRET, "etl", admin=False))
    assert (who.user, who.admin) == ("etl", False)
    with pytest.raises(tokens.ForgedTokenError):
        auth.verify(tokens.mint(OTHER_SECRET, "etl", admin=True))


def test_authenticator_for_the_options(tmp_path: Path, users_file: Path) -> None:
    assert authenticator_for(SecurityOptions()) is OPEN
    assert OPEN.verify("").admin and not OPEN.required
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    # A secret without users and without TLS: no accounts, no tokens asked.
    assert authenticator_for(SecurityOptions(cluster_secret_file=str(secret))) is OPEN
    # With TLS clients show no certificate, so only the secret's tokens let them in:
    # a CA certificate, which every client holds, makes nobody the admin.
    tls_only = authenticator_for(
        SecurityOptions(tls_ca=str(tmp_path / "ca.pem"), cluster_secret_file=str(secret))
    )
    assert tls_only.required
    assert tls_only.verify(tokens.mint(SECRET, "ops", admin=True)).admin
    with pytest.raises(tokens.ForgedTokenError):
        tls_only.verify(tokens.mint(OTHER_SECRET, "ops", admin=True))
    with pytest.raises(AuthenticationError, match="no users file"):
        tls_only.login("ops", "whatever-pw")
    with pytest.raises(SecurityConfigError, match="needs the cluster secret"):
        authenticator_for(SecurityOptions(tls_ca=str(tmp_path / "ca.pem")))
    with_secret = authenticator_for(
        SecurityOptions(cluster_secret_file=str(secret), users_file=str(users_file))
    )
    token = with_secret.login("alice", "alice-secret")
    # Another scheduler of the cluster (same secret) takes the token.
    again = authenticator_for(
        SecurityOptions(cluster_secret_file=str(secret), users_file=str(users_file))
    )
    assert again.verify(token).user == "alice"
    # Without a secret, each process signs with its own random key.
    one = authenticator_for(SecurityOptions(users_file=str(users_file)))
    two = authenticator_for(SecurityOptions(users_file=str(users_file)))
    with pytest.raises(tokens.ForgedTokenError):
        two.verify(one.login("alice", "alice-secret"))
    short = tmp_path / "short"
    short.write_bytes(b"x" * 8)
    with pytest.raises(SecurityConfigError, match="at least 32"):
        authenticator_for(
            SecurityOptions(cluster_secret_file=str(short), users_file=str(users_file))
        )


def test_a_broken_users_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text("alice\n")
    with pytest.raises(UsersFileError, match="line 1"):
        UsersAuthenticator(str(path), SECRET)


# ---------------------------------------------------- limits, revocation, reload


def test_failed_logins_lock_the_user_then_the_address(
    users_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    limits = LoginLimits(user_failures=2, address_failures=4, window_s=60, lockout_s=30)
    auth = UsersAuthenticator(str(users_file), SECRET, limits=limits, clock=lambda: now[0])
    for _ in range(2):
        with pytest.raises(AuthenticationError, match="wrong user name or password"):
            auth.login("alice", "not-it", "10.0.0.1")
    # Locked: even the right password is refused, and says when to come back.
    with pytest.raises(LoginThrottledError, match=r"user 'alice'; try again in 30 s"):
        auth.login("alice", "alice-secret", "10.0.0.2")
    assert auth.verify(auth.login("root", "root-secret", "10.0.0.1")).admin
    now[0] = 31.0
    assert auth.verify(auth.login("alice", "alice-secret", "10.0.0.2")).user == "alice"
    # Unknown names count against the address they come from.
    for name in ("a1", "a2", "a3", "a4"):
        with pytest.raises(AuthenticationError, match="wrong user name"):
            auth.login(name, "whatever", "10.0.0.9")
    throttled = pytest.raises(LoginThrottledError, match="from your address 10.0.0.9; try again")
    with caplog.at_level(logging.WARNING), throttled:
        auth.login("root", "root-secret", "10.0.0.9")
    assert "too many failed logins of the address" in caplog.text
    assert auth.login("root", "root-secret", "10.0.0.1")


def test_parallel_guesses_are_counted_before_more_are_checked(users_file: Path) -> None:
    limits = LoginLimits(user_failures=3, address_failures=100, window_s=60, lockout_s=60)
    auth = UsersAuthenticator(str(users_file), SECRET, limits=limits)
    refusals: list[Exception] = []

    def guess(i: int) -> None:
        try:
            auth.login("alice", f"guess-{i}", f"10.0.1.{i}")
        except AuthenticationError as exc:
            refusals.append(exc)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    throttled = [e for e in refusals if isinstance(e, LoginThrottledError)]
    assert len(refusals) == 10 and len(throttled) == 7  # 3 passwords checked, no more


def test_revoked_tokens_are_refused_and_others_are_not(users_file: Path) -> None:
    now = time.time()
    auth = UsersAuthenticator(str(users_file), SECRET)
    old = tokens.mint(SECRET, "alice", admin=False, now=now - 10)
    one = tokens.mint(SECRET, "alice", admin=False, now=now - 5)
    root = tokens.mint(SECRET, "root", admin=True, now=now - 10)
    claims = tokens.unverified_claims(one)
    assert claims is not None and claims.token_id
    revoke_token(str(users_file), claims)
    with pytest.raises(AuthenticationError, match=f"token {claims.token_id} was revoked"):
        auth.verify(one)
    assert auth.verify(old).user == "alice"  # only that one
    assert revoke_user(str(users_file), "alice", now=now - 1)
    with pytest.raises(AuthenticationError, match="tokens of user 'alice' issued before"):
        auth.verify(old)
    assert auth.verify(tokens.mint(SECRET, "alice", admin=False, now=now)).user == "alice"
    assert auth.verify(root).admin
    assert not revoke_user(str(users_file), "nobody")
    # Kept in the file: a new process (a restart) refuses them too, and adding a
    # user keeps the revocations.
    add_user(str(users_file), "bob", "bob-secret!")
    again = UsersAuthenticator(str(users_file), SECRET)
    for token in (old, one):
        with pytest.raises(AuthenticationError, match="revoked"):
            again.verify(token)
    assert set(read_users(str(users_file))) == {"alice", "bob", "root"}


def test_a_removed_user_added_again_does_not_get_old_tokens_back(users_file: Path) -> None:
    auth = UsersAuthenticator(str(users_file), SECRET)
    token = tokens.mint(SECRET, "alice", admin=False, now=time.time() - 5)
    remove_user(str(users_file), "alice")
    add_user(str(users_file), "alice", "alice-new-secret")
    with pytest.raises(AuthenticationError, match="revoked"):
        auth.verify(token)
    assert auth.verify(auth.login("alice", "alice-new-secret")).user == "alice"


def test_expired_token_revocations_are_dropped_when_the_file_is_written(
    users_file: Path,
) -> None:
    gone = tokens.unverified_claims(tokens.mint(SECRET, "alice", admin=False, ttl_s=1, now=1.0))
    live = tokens.unverified_claims(tokens.mint(SECRET, "alice", admin=False))
    assert gone is not None and live is not None
    revoke_token(str(users_file), gone)
    revoke_token(str(users_file), live)
    assert set(read_users_file(str(users_file)).revoked.tokens) == {live.token_id}


def test_a_bad_users_file_keeps_the_users_read_last(
    users_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auth = UsersAuthenticator(str(users_file), SECRET)
    token = auth.login("alice", "alice-secret")
    good = users_file.read_text()
    with caplog.at_level(logging.ERROR):
        users_file.write_text(good + "mallory:superuser:x\n")
        assert auth.verify(token).user == "alice"
        assert auth.login("root", "root-secret")
    assert "the users file changed and cannot be used, so the users read last stay" in caplog.text
    assert "line 4 of the users file" in caplog.text
    users_file.write_text(good.replace("alice:", "alicia:"))
    with pytest.raises(AuthenticationError, match="not in the users file"):
        auth.verify(token)
    with pytest.raises(UsersFileError, match="not a revocation"):
        users_file.write_text(good + "!user:alice:soon\n")
        read_users_file(str(users_file))


def test_reload_reads_a_file_whose_change_went_unseen(users_file: Path) -> None:
    auth = UsersAuthenticator(str(users_file), SECRET)
    st = os.stat(users_file)
    users = read_users(str(users_file))
    text = users_file.read_text()
    # alice's password set to root's: the same size, mtime and inode, a change
    # that the stat check misses (an editor within one mtime tick).
    users_file.write_text(text.replace(users["alice"].password_hash, users["root"].password_hash))
    os.utime(users_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(AuthenticationError, match="wrong user name or password"):
        auth.login("alice", "root-secret")
    auth.reload()
    assert auth.verify(auth.login("alice", "root-secret")).user == "alice"


# ----------------------------------------------------------------- the commands


def test_users_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    users = str(tmp_path / "users")
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    monkeypatch.setattr("sys.stdin", io.StringIO("alice-secret\n"))
    assert cli_main(["users", "add", "alice", "--users-file", users, "--password-stdin"]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("root-secret\n"))
    assert (
        cli_main(["users", "add", "root", "--admin", "--users-file", users, "--password-stdin"])
        == 0
    )
    assert cli_main(["users", "list", "--users-file", users]) == 0
    out = capsys.readouterr().out
    assert "added user alice" in out and "added admin root" in out
    assert "alice\tuser" in out and "root\tadmin" in out
    assert stat.S_IMODE(os.stat(users).st_mode) == 0o600

    args = ["users", "token", "root", "--users-file", users, "--cluster-secret-file", str(secret)]
    assert cli_main([*args, "--ttl", "120"]) == 0
    token = capsys.readouterr().out.strip()
    claims = tokens.verify(SECRET, token)
    assert claims.user == "root" and claims.admin
    assert 119 <= claims.expires_at - time.time() <= 121

    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert cli_main(["users", "add", "bob", "--users-file", users, "--password-stdin"]) == 1
    assert cli_main([*args[:2], "nobody", *args[3:]]) == 1
    assert cli_main(["users", "remove", "nobody", "--users-file", users]) == 1
    err = capsys.readouterr().err
    assert "error: a password needs at least 8 characters" in err
    assert "error: no user 'nobody'" in err
    assert cli_main(["users", "remove", "alice", "--users-file", users]) == 0
    assert set(read_users(users)) == {"root"}

    assert cli_main(["users", "revoke", "--token", token, "--users-file", users]) == 0
    assert cli_main(["users", "revoke", "root", "--users-file", users]) == 0
    out = capsys.readouterr().out
    assert f"revoked token {claims.token_id} of root" in out
    assert "revoked the tokens of root made until now" in out
    revoked = read_users_file(users).revoked
    assert claims.token_id in revoked.tokens and "root" in revoked.users
    assert cli_main(["users", "revoke", "--users-file", users]) == 1
    assert cli_main(["users", "revoke", "--token", "nope", "--users-file", users]) == 1
    assert cli_main(["users", "revoke", "nobody", "--users-file", users]) == 1
    err = capsys.readouterr().err
    assert "name a user" in err and "not a mangonel token" in err and "no user 'nobody'" in err


# ------------------------------------------------------------ header parsing


def test_authorization_values() -> None:
    assert bearer_token("Bearer mgt1.a.b") == "mgt1.a.b"
    assert bearer_token("Bearer ") is None and bearer_token("Basic x") is None
    assert bearer_token(None) is None
    encoded = base64.b64encode(b"alice:pass:word").decode()
    assert basic_credentials(f"Basic {encoded}") == ("alice", "pass:word")
    assert basic_credentials("Basic !!!") is None
    assert basic_credentials("Basic " + base64.b64encode(b"nocolon").decode()) is None
    assert basic_credentials("Bearer mgt1.a.b") is None


def test_one_ownership_check_for_every_front_door() -> None:
    ann, bob, root = Principal("ann"), Principal("bob"), Principal("root", admin=True)
    ann.check_sees("j1", "ann")
    root.check_sees("j1", "ann")  # an admin sees every job
    with pytest.raises(PermissionDeniedError, match="job j1 belongs to another user; 'bob'"):
        bob.check_sees("j1", "ann")
    # A result's partitions are its reader's alone, admin or not.
    ann.check_reads("j1", "ann")
    with pytest.raises(PermissionDeniedError, match="the result of job j1 is another user's"):
        root.check_reads("j1", "ann")
