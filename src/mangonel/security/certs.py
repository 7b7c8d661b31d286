"""The cluster's trust: a CA, the certificates it signs, and the cluster secret.

``init_cluster(DIR)`` (``mangonel certs init DIR``) writes two kinds of
credentials apart, the files ``SecurityOptions.from_tls_dir`` reads:

* ``DIR/ca.pem`` / ``DIR/ca-key.pem``: a new CA, the cluster's root of trust.
  Its key signs certificates; keep it off the cluster's machines and the
  clients' once the certificates are made.
* ``DIR/cluster/``: what the scheduler(s) and executors get. ``node.pem`` /
  ``node-key.pem``, their certificate, usable as a server and as a client
  certificate (they dial each other); its common name ``mangonel-node`` is what
  the scheduler demands of a process that registers as an executor, and its
  names (subject alternative names) are ``localhost``, ``127.0.0.1`` and ``::1``
  plus every ``--host``: a peer that dials a name the certificate does not hold
  refuses it. ``cluster-secret``: 32 random bytes (hex) that sign tickets and
  tokens. ``ca.pem``.
* ``DIR/client/``: what a client gets, ``ca.pem`` alone: it checks that it talks
  to the cluster; it proves who it is with a password or token, never with a
  certificate, so nothing a client holds can mint a token or pass as a member.

Every key is an ECDSA P-256 key written with mode 0600; the certificates are
valid for ``days`` (default a year). All cryptography is the ``cryptography``
package's; nothing here is hand-rolled.

>>> init_cluster("/tmp/tls", hosts=["db1.example.com", "10.0.0.5"])  # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mangonel.security.options import (
    CA_FILE,
    CA_KEY_FILE,
    CLIENT_NAME,
    NODE_NAME,
    ROLE_DIRS,
    SECRET_FILE,
    Role,
    cert_files,
)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
DEFAULT_DAYS = 365


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM-encoded."""

    cert: bytes
    key: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mangonel"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _validity(days: float, start: datetime.datetime | None) -> tuple[datetime.datetime, ...]:
    # A minute back: clocks of the cluster's machines differ a little.
    begin = start or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    return begin, begin + datetime.timedelta(days=days)


def make_ca(
    common_name: str = "mangonel cluster CA",
    days: float = 10 * DEFAULT_DAYS,
    start: datetime.datetime | None = None,
) -> Issued:
    """A new self-signed CA certificate and its key."""
    key = _key()
    begin, end = _validity(days, start)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _san(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # unique, in order
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue(
    ca: Issued,
    role: Role,
    hosts: Sequence[str] = (),
    *,
    loopback: bool = True,
    days: float = DEFAULT_DAYS,
    start: datetime.datetime | None = None,
) -> Issued:
    """A certificate for ``role`` signed by ``ca``.

    Args:
        ca: The CA (its certificate and key).
        role: ``node`` (server and client certificate, common name
            ``mangonel-node``) or ``client`` (client only, ``mangonel-client``).
        hosts: DNS names and IP addresses peers reach a node at.
        loopback: Also ``localhost``, ``127.0.0.1`` and ``::1``.
        days: How long it is valid.
        start: When it becomes valid (tests make expired ones); now when ``None``.
    """
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key made by `mangonel certs init`")
    key = _key()
    begin, end = _validity(days, start)
    node = role == "node"
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if node:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(NODE_NAME if node else CLIENT_NAME))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    names = _san([*(LOOPBACK_NAMES if loopback else ()), *hosts])
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def new_secret() -> bytes:
    """A new cluster secret: 32 random bytes, as 64 hex digits (a text file)."""
    return secrets.token_hex(32).encode()


def _write(path: str, data: bytes, private: bool) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class CertsExistError(FileExistsError):
    """``init_cluster`` would overwrite a cluster's files."""


def init_cluster(
    directory: str,
    hosts: Sequence[str] = (),
    *,
    loopback: bool = True,
    days: float = DEFAULT_DAYS,
    force: bool = False,
) -> list[str]:
    """Make a cluster CA, the members' certificate and secret, and the clients' CA copy.

    Args:
        directory: Created if missing (mode 0700), with ``cluster/`` and ``client/``.
        hosts: Names and addresses of the machines the scheduler(s) and
            executors run on (the node certificate's names), beside loopback's.
        loopback: Include ``localhost``, ``127.0.0.1`` and ``::1``.
        days: Validity of the node certificate.
        force: Overwrite the files of an earlier ``init_cluster``.

    Returns:
        The paths written.

    Raises:
        CertsExistError: ``directory`` already holds a CA and ``force`` is False.
    """
    os.makedirs(directory, mode=0o700, exist_ok=True)
    ca_path = os.path.join(directory, CA_FILE)
    if os.path.exists(ca_path) and not force:
        raise CertsExistError(
            f"{directory} already holds a cluster CA ({CA_FILE}); a new one would lock out "
            "every process that has the old files. Use another directory, or --force"
        )
    ca = make_ca()
    node = issue(ca, "node", hosts, loopback=loopback, days=days)
    cert_name, key_name = cert_files("node")
    members, clients = ROLE_DIRS["node"], ROLE_DIRS["client"]
    files: dict[str, tuple[bytes, bool]] = {
        CA_FILE: (ca.cert, False),
        CA_KEY_FILE: (ca.key, True),
        os.path.join(members, CA_FILE): (ca.cert, False),
        os.path.join(members, cert_name): (node.cert, False),
        os.path.join(members, key_name): (node.key, True),
        os.path.join(members, SECRET_FILE): (new_secret(), True),
        os.path.join(clients, CA_FILE): (ca.cert, False),
    }
    for sub in (members, clients):
        os.makedirs(os.path.join(directory, sub), mode=0o700, exist_ok=True)
    written = []
    for name, (data, private) in files.items():
        path = os.path.join(directory, name)
        _write(path, data, private)
        written.append(path)
    return written


def write_pair(directory: str, role: Role, issued: Issued) -> None:
    """Write ``issued`` as ``role``'s certificate and key in ``directory`` (tests:
    ``certs init`` makes no client certificate, ``issue`` still can)."""
    cert_name, key_name = cert_files(role)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    _write(os.path.join(directory, cert_name), issued.cert, False)
    _write(os.path.join(directory, key_name), issued.key, True)


def read_ca(directory: str) -> Issued:
    """The CA certificate and key of a directory made by ``init_cluster``."""
    with open(os.path.join(directory, CA_FILE), "rb") as f:
        cert = f.read()
    with open(os.path.join(directory, CA_KEY_FILE), "rb") as f:
        key = f.read()
    return Issued(cert, key)
