"""The security settings of one process, and the command-line options that give them.

``mangonel certs init DIR`` makes two kinds of credentials, kept apart::

    DIR/ca-key.pem         the CA's key: signs certificates; keep it off every machine
    DIR/ca.pem             the CA's certificate (beside its key, for `certs` to read)
    DIR/cluster/           the cluster members' files (scheduler(s), executors):
        ca.pem             the CA: every member trusts it
        node.pem           certificate of the scheduler(s) and executors (mutual TLS
        node-key.pem       between them: presented and demanded on their own channels)
        cluster-secret     random bytes that sign tokens and shuffle/result tickets
    DIR/client/            all a client holds:
        ca.pem             to check that it talks to the cluster (server-side TLS);
                           a client proves who it is with its user's password or token

``--tls-dir DIR`` takes the files of a process's role: ``DIR/cluster`` or
``DIR/client`` when ``DIR`` holds them, else ``DIR`` itself (one role's copy, or
the single directory of ``certs init`` before the split, whose client certificate
a client no longer presents). ``--tls-cert/--tls-key/--tls-ca`` and
``--cluster-secret-file`` name them one by one and win over the directory. The
scheduler also takes ``--users-file`` (see ``mangonel users add``). With none of
them a process runs unprotected, as a local cluster on loopback always has.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

from mangonel import defaults
from mangonel.errors import MangonelError
from mangonel.security.login_limits import LoginLimits

Role = Literal["node", "client"]
"""``node``: the scheduler and executors (the cluster's members); ``client``: everyone else."""

ROLE_DIRS: dict[str, str] = {"node": "cluster", "client": "client"}
"""The subdirectory of a ``mangonel certs init`` directory that holds a role's files."""

CA_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
SECRET_FILE = "cluster-secret"
MIN_SECRET_BYTES = 32
NODE_NAME = "mangonel-node"
"""Common name of the cluster members' certificate (the scheduler checks it)."""
CLIENT_NAME = "mangonel-client"
"""Common name of a client certificate (``certs init`` made one before clients
needed none; the scheduler still refuses it the members' service)."""


def cert_files(role: Role) -> tuple[str, str]:
    """The certificate and key file names of ``role`` in a TLS directory."""
    return f"{role}.pem", f"{role}-key.pem"


def role_dir(directory: str, role: Role) -> str:
    """The directory of ``role``'s files: ``directory/cluster`` or ``directory/client``
    when ``directory`` holds it (the whole of ``certs init``), else ``directory``."""
    inner = os.path.join(directory, ROLE_DIRS[role])
    return inner if os.path.isdir(inner) else directory


class SecurityConfigError(MangonelError):
    """The security options are incomplete or name files that cannot be used."""


@dataclass(frozen=True)
class SecurityOptions:
    """The files that secure one process; all ``None``: nothing is secured.

    Attributes:
        tls_cert: PEM certificate this process presents (cluster members; a
            client presents none).
        tls_key: PEM private key of ``tls_cert``.
        tls_ca: PEM certificate of the cluster CA: the servers this process
            dials must show a certificate it signed, and so must the members
            that dial a member (mutual TLS between them). Alone: a client's TLS.
        cluster_secret_file: File of random bytes (at least 32) shared by the
            scheduler(s) and executors; signs tokens and tickets.
        users_file: Scheduler only: the users and their salted password hashes
            (``mangonel users add``); ``None`` with TLS on: only the cluster
            secret's holders (tokens it signs) get in.
    """

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    cluster_secret_file: str | None = None
    users_file: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SecurityConfigError(
                "a TLS certificate needs its key: give both --tls-cert and --tls-key (or --tls-dir)"
            )
        if self.tls_cert is not None and self.tls_ca is None:
            raise SecurityConfigError(
                "TLS needs the cluster CA too: give --tls-ca (or --tls-dir) with --tls-cert"
            )

    @classmethod
    def from_tls_dir(
        cls, directory: str, role: Role, users_file: str | None = None
    ) -> SecurityOptions:
        """The files of ``role`` in a directory made by ``mangonel certs init``.

        A member (``node``) gets its certificate, key, the CA and the cluster
        secret; a client the CA alone. ``directory`` is the whole of ``certs
        init`` or one role's copy (``role_dir``).

        >>> SecurityOptions.from_tls_dir("/etc/mangonel/client", "client").tls_cert is None
        True
        """
        directory = role_dir(directory, role)
        ca = os.path.join(directory, CA_FILE)
        if role == "client":
            return cls(tls_ca=ca, users_file=users_file)
        cert, key = cert_files(role)
        return cls(
            tls_cert=os.path.join(directory, cert),
            tls_key=os.path.join(directory, key),
            tls_ca=ca,
            cluster_secret_file=os.path.join(directory, SECRET_FILE),
            users_file=users_file,
        )

    @property
    def tls(self) -> bool:
        """Whether this process speaks TLS."""
        return self.tls_ca is not None

    def check_member(self, what: str) -> None:
        """Refuse a cluster member (``what``: "scheduler", "executor") whose TLS
        lacks its certificate or the cluster secret.

        A member serves TLS with its certificate, and with TLS clients present
        no certificate: the signed tickets and tokens are what keep a stranger
        from the cluster's files and services, so TLS without the secret would
        open them to anyone who reaches a port.

        Raises:
            SecurityConfigError: TLS on, and no certificate or no cluster secret.
        """
        if not self.tls:
            return
        if self.tls_cert is None or self.cluster_secret_file is None:
            missing = "its certificate and key" if self.tls_cert is None else "the cluster secret"
            raise SecurityConfigError(
                f"a {what} with TLS needs the cluster's node certificate and key and the "
                f"cluster secret, and {missing} was not given: start it with --tls-dir "
                "DIR/cluster (of `mangonel certs init DIR`), or --tls-cert, --tls-key, "
                "--tls-ca and --cluster-secret-file"
            )

    @property
    def secured(self) -> bool:
        """Whether any protection is configured."""
        return self.tls or self.cluster_secret_file is not None

    def cluster_secret(self) -> bytes | None:
        """The cluster secret's bytes; ``None`` when not configured.

        Raises:
            SecurityConfigError: the file is missing, unreadable or too short.
        """
        if self.cluster_secret_file is None:
            return None
        try:
            with open(self.cluster_secret_file, "rb") as f:
                secret = f.read().strip()
        except OSError as exc:
            raise SecurityConfigError(
                f"cannot read the cluster secret {self.cluster_secret_file}: {exc.strerror}; "
                "make one with `mangonel certs init DIR`"
            ) from exc
        if len(secret) < MIN_SECRET_BYTES:
            raise SecurityConfigError(
                f"the cluster secret {self.cluster_secret_file} holds {len(secret)} bytes; "
                f"at least {MIN_SECRET_BYTES} are needed (`mangonel certs init DIR` makes one)"
            )
        return secret

    def read_tls(self) -> tuple[bytes | None, bytes | None, bytes] | None:
        """The PEM bytes of (certificate, key, CA); ``None`` without TLS, and no
        certificate or key for a client's options (the CA alone).

        Raises:
            SecurityConfigError: a file is missing or unreadable.
        """
        if self.tls_ca is None:
            return None
        out: list[bytes | None] = []
        for what, path in (
            ("certificate", self.tls_cert),
            ("key", self.tls_key),
            ("CA", self.tls_ca),
        ):
            if path is None:
                out.append(None)
                continue
            try:
                with open(path, "rb") as f:
                    out.append(f.read())
            except OSError as exc:
                if what == "CA":
                    hint = (
                        "; a client needs the cluster's CA certificate: DIR/client/ca.pem "
                        "of `mangonel certs init DIR`"
                    )
                else:
                    hint = (
                        "; the scheduler and executors need the cluster's node files, "
                        "DIR/cluster of `mangonel certs init DIR` (DIR/client is a client's)"
                    )
                raise SecurityConfigError(
                    f"cannot read the TLS {what} {path}: {exc.strerror}{hint}"
                ) from exc
        ca = out[2]
        assert ca is not None
        return out[0], out[1], ca

    def to_args(self) -> list[str]:
        """The command-line options that give these settings."""
        args: list[str] = []
        for flag, value in (
            ("--tls-cert", self.tls_cert),
            ("--tls-key", self.tls_key),
            ("--tls-ca", self.tls_ca),
            ("--cluster-secret-file", self.cluster_secret_file),
            ("--users-file", self.users_file),
        ):
            if value is not None:
                args += [flag, value]
        return args


def add_arguments(parser: argparse.ArgumentParser, *, users: bool = False) -> None:
    """The security options of ``mangonel scheduler``, ``executor`` and ``standalone``.

    Args:
        users: Also ``--users-file`` (processes that authenticate users).
    """
    group = parser.add_argument_group(
        "security",
        "TLS on every channel and signed tokens and tickets; make the files with "
        "`mangonel certs init DIR`. Without these nothing is secured (fine on loopback)",
    )
    group.add_argument(
        "--tls-dir",
        metavar="DIR",
        help="the cluster's files: DIR/cluster of `mangonel certs init DIR` (its CA, the "
        "node certificate and key, and the cluster secret), or DIR itself",
    )
    group.add_argument("--tls-cert", metavar="FILE", help="PEM certificate (overrides --tls-dir)")
    group.add_argument("--tls-key", metavar="FILE", help="PEM key of --tls-cert")
    group.add_argument("--tls-ca", metavar="FILE", help="PEM certificate of the cluster CA")
    group.add_argument(
        "--cluster-secret-file",
        metavar="FILE",
        help="file of random bytes shared by the cluster; signs tokens and tickets",
    )
    if users:
        group.add_argument(
            "--login-failures",
            type=int,
            default=defaults.LOGIN_USER_FAILURES,
            metavar="N",
            help="failed password logins of one user name within --login-lockout that lock "
            "it for that long (default %(default)s; 0: no limit)",
        )
        group.add_argument(
            "--login-address-failures",
            type=int,
            default=defaults.LOGIN_ADDRESS_FAILURES,
            metavar="N",
            help="failed password logins from one client address, of any user names, that "
            "lock it (default %(default)s; 0: no limit)",
        )
        group.add_argument(
            "--login-lockout",
            type=float,
            default=defaults.LOGIN_LOCKOUT_S,
            metavar="S",
            help="seconds over which failed logins count, and that a lock lasts "
            "(default %(default)g)",
        )
        group.add_argument(
            "--users-file",
            metavar="FILE",
            help="users, salted password hashes and revoked tokens (`mangonel users add NAME "
            "--users-file FILE`); read again when it changes and on SIGHUP",
        )


def login_limits_from_args(args: argparse.Namespace) -> LoginLimits:
    """The ``LoginLimits`` of ``--login-failures``, ``--login-address-failures`` and
    ``--login-lockout`` (the window failures count over is the lockout).

    Raises:
        ValueError: a count below 0 or seconds not above 0.
    """
    return LoginLimits(
        user_failures=args.login_failures,
        address_failures=args.login_address_failures,
        window_s=args.login_lockout,
        lockout_s=args.login_lockout,
    )


def options_from_args(args: argparse.Namespace, role: Role) -> SecurityOptions:
    """``SecurityOptions`` from the options ``add_arguments`` defined."""
    base = SecurityOptions()
    tls_dir = getattr(args, "tls_dir", None)
    if tls_dir:
        base = SecurityOptions.from_tls_dir(tls_dir, role)
    given = {
        "tls_cert": getattr(args, "tls_cert", None),
        "tls_key": getattr(args, "tls_key", None),
        "tls_ca": getattr(args, "tls_ca", None),
        "cluster_secret_file": getattr(args, "cluster_secret_file", None),
        "users_file": getattr(args, "users_file", None),
    }
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
