"""The security settings of one process, and the command-line options that give them.

A secured cluster shares one directory made by ``mangonel certs init DIR``:

=====================  ======================================================
``ca.pem``             the cluster CA's certificate: every process trusts it
``node.pem``           certificate of the scheduler(s) and executors (signed by
``node-key.pem``       the CA; presented and demanded on the cluster's own
                       channels: mutual TLS)
``client.pem``         certificate a client may present (the clients' own proof
``client-key.pem``     of identity is their user's token or password)
``cluster-secret``     random bytes that sign tokens and shuffle/result tickets
=====================  ======================================================

``--tls-dir DIR`` takes the files of a process's role from there;
``--tls-cert/--tls-key/--tls-ca`` and ``--cluster-secret-file`` name them one by
one and win over the directory. The scheduler also takes ``--users-file`` (see
``mangonel users add``). With none of them a process runs unprotected, as a
local cluster on loopback always has.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

from mangonel.errors import MangonelError

Role = Literal["node", "client"]
"""``node``: the scheduler and executors (the cluster's members); ``client``: everyone else."""

CA_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
SECRET_FILE = "cluster-secret"
MIN_SECRET_BYTES = 32
NODE_NAME = "mangonel-node"
"""Common name of the cluster members' certificate (the scheduler checks it)."""
CLIENT_NAME = "mangonel-client"
"""Common name of the clients' certificate."""


def cert_files(role: Role) -> tuple[str, str]:
    """The certificate and key file names of ``role`` in a TLS directory."""
    return f"{role}.pem", f"{role}-key.pem"


class SecurityConfigError(MangonelError):
    """The security options are incomplete or name files that cannot be used."""


@dataclass(frozen=True)
class SecurityOptions:
    """The files that secure one process; all ``None``: nothing is secured.

    Attributes:
        tls_cert: PEM certificate this process presents.
        tls_key: PEM private key of ``tls_cert``.
        tls_ca: PEM certificate of the cluster CA; peers must present a
            certificate it signed (mutual TLS between cluster members).
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
        given = [f for f in (self.tls_cert, self.tls_key, self.tls_ca) if f]
        if given and len(given) != 3:
            raise SecurityConfigError(
                "TLS needs a certificate, its key and the cluster CA together: give "
                "--tls-dir, or all of --tls-cert, --tls-key and --tls-ca"
            )

    @classmethod
    def from_tls_dir(
        cls, directory: str, role: Role, users_file: str | None = None
    ) -> SecurityOptions:
        """The files of ``role`` in a directory made by ``mangonel certs init``."""
        cert, key = cert_files(role)
        return cls(
            tls_cert=os.path.join(directory, cert),
            tls_key=os.path.join(directory, key),
            tls_ca=os.path.join(directory, CA_FILE),
            cluster_secret_file=os.path.join(directory, SECRET_FILE),
            users_file=users_file,
        )

    @property
    def tls(self) -> bool:
        """Whether this process speaks TLS."""
        return self.tls_cert is not None

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

    def read_tls(self) -> tuple[bytes, bytes, bytes] | None:
        """The PEM bytes of (certificate, key, CA); ``None`` without TLS.

        Raises:
            SecurityConfigError: a file is missing or unreadable.
        """
        if not self.tls:
            return None
        out: list[bytes] = []
        for what, path in (
            ("certificate", self.tls_cert),
            ("key", self.tls_key),
            ("CA", self.tls_ca),
        ):
            assert path is not None
            try:
                with open(path, "rb") as f:
                    out.append(f.read())
            except OSError as exc:
                raise SecurityConfigError(
                    f"cannot read the TLS {what} {path}: {exc.strerror}"
                ) from exc
        return out[0], out[1], out[2]

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
        help="directory made by `mangonel certs init`: its CA, this role's certificate "
        "and key, and the cluster secret",
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
            "--users-file",
            metavar="FILE",
            help="users and salted password hashes (`mangonel users add NAME --users-file FILE`)",
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
