"""``mangonel users``: manage the users file, and make tokens for scripts.

::

    mangonel users add alice --users-file users            # asks for the password
    echo "$PW" | mangonel users add bob --admin --users-file users --password-stdin
    mangonel users list --users-file users
    mangonel users remove alice --users-file users         # her tokens stop working
    mangonel users token etl --users-file users --cluster-secret-file tls/cluster-secret
    mangonel users revoke etl --users-file users           # etl's tokens made until now
    mangonel users revoke --token "$TOKEN" --users-file users   # that token alone

A running scheduler reads the file again when it changes (or on SIGHUP): no
restart needed, and a revoked token is refused at its next call.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time

from mangonel import defaults
from mangonel.errors import MangonelError
from mangonel.security import tokens
from mangonel.security.options import SecurityOptions
from mangonel.security.users import (
    MIN_PASSWORD_CHARS,
    add_user,
    check_name,
    check_new_password,
    read_users,
    remove_user,
    revoke_token,
    revoke_user,
)

USERS_FILE_ENV = "MANGONEL_USERS_FILE"


class UsersCommandError(MangonelError):
    """A ``mangonel users`` command cannot do what it was asked."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``users`` command and its subcommands, under ``mangonel``'s subparsers."""
    p = sub.add_parser(
        "users",
        help="manage the users who may log in (the scheduler's --users-file)",
        description="Add, remove and list the users of a users file (salted scrypt "
        "password hashes, mode 0600), and make tokens for scripts and BI tools. A "
        "scheduler started with --users-file FILE lets these users in and reads the "
        "file again whenever it changes.",
    )
    commands = p.add_subparsers(dest="users_command", metavar="ACTION", required=True)

    def users_file(q: argparse.ArgumentParser, required: bool = True) -> None:
        default = os.environ.get(USERS_FILE_ENV)
        q.add_argument(
            "--users-file",
            metavar="FILE",
            default=default,
            required=required and default is None,
            help=f"the users file (default: ${USERS_FILE_ENV})",
        )

    q = commands.add_parser(
        "add",
        help="add a user, or set a user's password and role",
        description="Add a user (or set the password and role of one already there). "
        f"The password (at least {MIN_PASSWORD_CHARS} characters) is asked for twice, "
        "or read from stdin's first line with --password-stdin.",
    )
    q.add_argument("name", help="user name: letters, digits, '_', '.', '@', '-'")
    q.add_argument(
        "--admin",
        action="store_true",
        help="an admin sees and cancels every user's jobs and registers and drops tables",
    )
    q.add_argument(
        "--writer",
        action="store_true",
        help="a writer may run COPY ... TO, CREATE TABLE ... AS, INSERT and DROP TABLE",
    )
    q.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    users_file(q)

    q = commands.add_parser("remove", help="remove a user", description="Remove a user; "
                            "the user's tokens are refused from then on.")  # fmt: skip
    q.add_argument("name")
    users_file(q)

    q = commands.add_parser("list", help="list the users and their roles")
    users_file(q)

    q = commands.add_parser(
        "token",
        help="make a token for a script or BI tool",
        description="Print a bearer token for NAME, signed with the cluster secret: "
        "give it to `mangonel --token`, $MANGONEL_TOKEN, the REST API (Authorization: "
        "Bearer ...) or Prometheus (bearer_token). With --users-file the user must be "
        "listed there and gets the role the file gives; without one (a scheduler with "
        "a cluster secret and no users file) --admin decides the role.",
    )
    q.add_argument("name")
    q.add_argument(
        "--cluster-secret-file",
        metavar="FILE",
        required=True,
        help="the scheduler's cluster secret (e.g. DIR/cluster-secret of `mangonel certs init`)",
    )
    q.add_argument(
        "--ttl",
        type=float,
        default=defaults.MINTED_TOKEN_TTL_S,
        metavar="S",
        help="seconds the token is valid (default %(default)g: 30 days)",
    )
    q.add_argument("--admin", action="store_true", help="admin role (without --users-file)")
    users_file(q, required=False)

    q = commands.add_parser(
        "revoke",
        help="refuse tokens before they expire",
        description="Refuse every token of user NAME made until now (by a login or "
        "`mangonel users token`), or the one token given with --token. The revocation "
        "is written to the users file, which every scheduler reading it obeys from the "
        "token's next call (gRPC, Flight SQL, web UI), a restart included. Logging in "
        "again still works: to keep a user out, also `mangonel users remove` them or "
        "set a new password. Results already handed out stay readable at the executors "
        "for the life of their tickets (the scheduler's --result-ttl at most).",
    )
    q.add_argument("name", nargs="?", help="the user whose tokens to revoke")
    q.add_argument("--token", metavar="TOKEN", help="revoke this token only (the whole token)")
    users_file(q)


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        if not sys.stdin.isatty():
            raise UsersCommandError(
                "no terminal to ask for the password on; pipe it in with --password-stdin"
            )
        password = getpass.getpass(f"password for {args.name}: ")
        check_new_password(password)
        if getpass.getpass("again: ") != password:
            raise UsersCommandError("the passwords differ; nothing was changed")
    return check_new_password(password)


def run(args: argparse.Namespace) -> int:
    """Carry out ``mangonel users ACTION``; return the exit code.

    Raises:
        MangonelError: the file cannot be read or written, or the input is wrong.
    """
    try:
        return _run(args)
    except ValueError as exc:  # a bad name, password or --ttl
        raise UsersCommandError(str(exc)) from None
    except OSError as exc:
        raise UsersCommandError(f"cannot write the users file {args.users_file}: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    action = args.users_command
    if action == "add":
        check_name(args.name)
        new = add_user(
            args.users_file, args.name, _password(args), admin=args.admin, writer=args.writer
        )
        role = "admin" if args.admin else "writer" if args.writer else "user"
        print(f"{'added' if new else 'updated'} {role} {args.name} in {args.users_file}")
        return 0
    if action == "remove":
        if not remove_user(args.users_file, args.name):
            raise UsersCommandError(f"no user {args.name!r} in {args.users_file}")
        print(f"removed {args.name} from {args.users_file}")
        return 0
    if action == "list":
        users = read_users(args.users_file)
        if not users:
            print(f"no users in {args.users_file}; add one with `mangonel users add NAME`")
        for user in sorted(users.values(), key=lambda u: u.name):
            print(f"{user.name}\t{user.role}")
        return 0
    if action == "token":
        check_name(args.name)
        secret = SecurityOptions(cluster_secret_file=args.cluster_secret_file).cluster_secret()
        assert secret is not None  # a file was given
        admin = args.admin
        if args.users_file:
            listed = read_users(args.users_file).get(args.name)
            if listed is None:
                raise UsersCommandError(
                    f"no user {args.name!r} in {args.users_file}; add it with "
                    "`mangonel users add` first"
                )
            admin = listed.admin
        print(tokens.mint(secret, args.name, admin=admin, ttl_s=args.ttl))
        return 0
    if action == "revoke":
        return _revoke(args)
    raise UsersCommandError(f"unknown action {action!r}")


def _revoke(args: argparse.Namespace) -> int:
    if (args.name is None) == (args.token is None):
        raise UsersCommandError(
            "name a user (`mangonel users revoke NAME`: all of its tokens made until now) "
            "or give one token (`--token TOKEN`), not both"
        )
    if args.name is not None:
        if not revoke_user(args.users_file, args.name):
            raise UsersCommandError(f"no user {args.name!r} in {args.users_file}")
        print(f"revoked the tokens of {args.name} made until now, in {args.users_file}")
        return 0
    claims = tokens.unverified_claims(args.token)
    if claims is None:
        raise UsersCommandError(
            "that is not a mangonel token (three parts, starting 'mgt1.'); copy it whole"
        )
    revoke_token(args.users_file, claims)
    print(
        f"revoked token {claims.token_id} of {claims.user} (it would have expired at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(claims.expires_at))}), "
        f"in {args.users_file}"
    )
    return 0
