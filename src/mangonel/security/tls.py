"""TLS for each kind of channel, from one ``SecurityOptions``.

A secured cluster speaks TLS on every channel, under the cluster CA; only the
cluster's members (scheduler, executors) present certificates:

* gRPC, the scheduler's two ports. Its cluster port (``--cluster-port``), where
  executors register and take their tasks, is mutual TLS
  (``ServingCertificates.grpc_credentials(True)``): a caller must show a
  certificate the CA signed, and the executor service checks that it is a
  member's (``is_node``). Its client port (``--port``) is server-side TLS
  (``grpc_credentials(False)``):
  clients check the scheduler's certificate and prove who they are with a
  password or token. Two ports, because gRPC's Python server either demands a
  certificate of every caller of a port or asks none for one.
  ``channel_credentials`` trusts only the CA and presents this process's
  certificate when it has one.
* Arrow Flight (shuffle fetches between executors, result reads by clients, the
  Flight SQL endpoint): server-side TLS (``flight_server_kwargs``); what a
  caller may read is decided by the signed ticket it presents (``tickets``),
  which only the cluster secret's holders make.
* The web UI, REST API and metrics: HTTPS (``uvicorn_ssl_kwargs``); the users
  layer guards what it shows.

A peer always checks that the certificate it is shown names the host it dialled
(gRPC and Flight do this themselves), so ``mangonel certs init --host`` must list
the names and addresses the cluster's machines are reached at.

``ServingCertificates`` lets the scheduler take a new certificate and key
without a restart (SIGHUP): its gRPC ports and the Flight SQL port are served
with ``grpc.dynamic_ssl_server_credentials``, whose fetcher gRPC calls at each
new connection's handshake, and the web UI's ``ssl.SSLContext`` loads the new
pair for the connections that follow. Connections already open keep the
certificate they were made with. An executor cannot: pyarrow's Flight server
takes its certificate once, at start (``FlightServerBase(tls_certificates=)``),
and has no call that changes it; an executor takes a new one when restarted
(drain it first: ``mangonel drain``).

``warn_if_exposed`` is the loud side of the safe default: a process that
listens beyond loopback without TLS logs a warning at start.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from mangonel.security.options import NODE_NAME, SecurityConfigError, SecurityOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes one process needs: the CA, and a member's certificate and key
    (``None`` for a client, which presents none)."""

    cert: bytes | None
    key: bytes | None
    ca: bytes

    def identity(self) -> tuple[bytes, bytes]:
        """This process's key and certificate, to serve with.

        Raises:
            SecurityConfigError: a client's material (no certificate).
        """
        if self.cert is None or self.key is None:
            raise SecurityConfigError(
                "serving TLS needs a certificate and key: give the cluster's node files "
                "(--tls-dir DIR/cluster of `mangonel certs init DIR`)"
            )
        return self.key, self.cert

    @classmethod
    def load(cls, options: SecurityOptions | None) -> TlsMaterial | None:
        """The files of ``options``, read; ``None`` without TLS.

        Raises:
            SecurityConfigError: a file is missing or unreadable.
        """
        files = options.read_tls() if options is not None else None
        return None if files is None else cls(*files)


def check_pair(material: TlsMaterial) -> None:
    """Refuse a certificate that does not parse, or whose key is not its key.

    Raises:
        SecurityConfigError: saying which.
    """
    from cryptography import x509  # only secured processes load ``cryptography``
    from cryptography.hazmat.primitives import serialization

    key_pem, cert_pem = material.identity()
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        x509.load_pem_x509_certificate(material.ca)
    except ValueError as exc:
        raise SecurityConfigError(f"a TLS file is not PEM it should be: {exc}") from None
    raw = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*raw) != key.public_key().public_bytes(*raw):
        raise SecurityConfigError("the TLS key is not the key of the certificate beside it")


class ServingCertificates:
    """The certificate a server presents, read again by ``reload`` (SIGHUP).

    Thread-safe. ``reload`` keeps the pair in use when the new files cannot be
    read, do not parse, or the key does not fit the certificate (a rotation
    caught half-written), and says why in the log.

    Args:
        options: Where the files are.
        material: What was read of them at start.
    """

    def __init__(self, options: SecurityOptions, material: TlsMaterial) -> None:
        material.identity()  # a member's: it serves
        self._options = options
        self._lock = threading.Lock()
        self._material = material
        self._generation = 0
        self._listeners: list[Callable[[SecurityOptions], None]] = []

    @property
    def material(self) -> TlsMaterial:
        with self._lock:
            return self._material

    def reload(self) -> bool:
        """Read the certificate, key and CA again; whether the new ones are in use."""
        try:
            material = TlsMaterial.load(self._options)
            if material is None:
                raise SecurityConfigError("TLS is off in the options")
            check_pair(material)
        except SecurityConfigError as exc:
            log.error("the TLS files cannot be used, so the certificate in use stays: %s", exc)
            return False
        with self._lock:
            changed = material != self._material
            self._material = material
            self._generation += 1 if changed else 0
            listeners = list(self._listeners)
        if changed:
            for listener in listeners:
                listener(self._options)
            log.info("reloaded the TLS certificate %s", self._options.tls_cert)
        else:
            log.info("the TLS files are unchanged: %s", self._options.tls_cert)
        return changed

    def on_reload(self, listener: Callable[[SecurityOptions], None]) -> None:
        """Call ``listener`` with the options after each reload that changed them."""
        with self._lock:
            self._listeners.append(listener)

    def grpc_credentials(self, require_client_auth: bool) -> grpc.ServerCredentials:
        """A port's credentials that follow ``reload``: the client port and Flight
        SQL (no client certificate asked) or the cluster port (one the CA signed)."""
        with self._lock:
            served = [self._generation]
            initial = _configuration(self._material, require_client_auth)

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            # Called by gRPC at each new connection's handshake: None keeps the current.
            with self._lock:
                if self._generation == served[0]:
                    return None
                served[0] = self._generation
                material = self._material
            return _configuration(material, require_client_auth)

        return grpc.dynamic_ssl_server_credentials(
            initial, fetch, require_client_authentication=require_client_auth
        )


def _configuration(
    material: TlsMaterial, require_client_auth: bool
) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [material.identity()], root_certificates=material.ca if require_client_auth else None
    )


# ----------------------------------------------------------------------- gRPC


def channel_credentials(tls: TlsMaterial) -> grpc.ChannelCredentials:
    """Trust only the cluster CA; present this process's certificate, if it has one."""
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )


def open_channel(
    address: str, tls: TlsMaterial | None, options: list[tuple[str, Any]]
) -> grpc.Channel:
    """A gRPC channel to ``host:port``: TLS with ``tls``, plaintext without."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, channel_credentials(tls), options=options)


def peer_role(context: grpc.ServicerContext) -> str | None:
    """The common name of the caller's (verified) certificate; ``None`` without TLS."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode(errors="replace") if names else None


def is_node(context: grpc.ServicerContext) -> bool:
    """Whether the caller proved to be a cluster member (scheduler or executor)."""
    return peer_role(context) == NODE_NAME


def describe_failure(details: str, tls: bool) -> str:
    """A hint for a connection that failed: what TLS may have to do with it."""
    lowered = details.lower()
    if tls and "hostname verification" in lowered:
        return (
            "the TLS handshake failed: the server's certificate does not name the host dialled; "
            "make its certificates with `mangonel certs init --host NAME` for every name and "
            "address it is reached at, or dial one of the names it holds"
        )
    if tls and "certificate_verify_failed" in lowered:
        return (
            "the TLS handshake failed: the server's certificate is not signed by this "
            "process's CA (--tls-ca, or ca.pem of --tls-dir), or does not name the host "
            "dialled (add it with `mangonel certs init --host NAME`)"
        )
    if tls and ("handshake" in lowered or "ssl" in lowered):
        return "the TLS handshake failed: check that both sides use the same cluster's files"
    if tls:
        return (
            "if it runs, it may speak plaintext (started without --tls-dir), have refused "
            "this process's certificate (signed by another CA?), or this may be its "
            "cluster port, which only members (executors) reach: clients connect to its "
            "--port"
        )
    return (
        "if it runs with TLS (--tls-dir), connect over TLS with the cluster's CA: "
        "--tls-dir DIR/client (of `mangonel certs init DIR`), --tls-ca FILE, or "
        "$MANGONEL_TLS_DIR"
    )


# --------------------------------------------------------------------- Flight


def flight_scheme(tls: TlsMaterial | None) -> str:
    """``grpc+tls`` with TLS, ``grpc`` without."""
    return "grpc" if tls is None else "grpc+tls"


def flight_server_kwargs(tls: TlsMaterial | None) -> dict[str, Any]:
    """``FlightServerBase`` arguments: TLS with this certificate, no client certificate
    asked for (the signed ticket decides what a caller may read)."""
    if tls is None:
        return {}
    import pyarrow.flight as flight

    key, cert = tls.identity()
    return {"tls_certificates": [flight.CertKeyPair(cert, key)]}


def flight_client_kwargs(tls: TlsMaterial | None) -> dict[str, Any]:
    """``FlightClient`` arguments: trust only the CA (and present this certificate, if any)."""
    if tls is None:
        return {}
    if tls.cert is None or tls.key is None:
        return {"tls_root_certs": tls.ca}
    return {"tls_root_certs": tls.ca, "cert_chain": tls.cert, "private_key": tls.key}


# ------------------------------------------------------------------------ web


def uvicorn_ssl_kwargs(options: SecurityOptions | None) -> dict[str, Any]:
    """``uvicorn.Config`` arguments for HTTPS with this process's certificate."""
    if options is None or not options.tls:
        return {}
    return {"ssl_certfile": options.tls_cert, "ssl_keyfile": options.tls_key}


# ---------------------------------------------------------------- the default


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or name) reaches only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(
    log: logging.Logger, what: str, host: str, options: SecurityOptions | None
) -> bool:
    """Log (and return True) when ``what`` listens beyond loopback without TLS."""
    if (options is not None and options.tls) or is_loopback(host):
        return False
    log.warning(
        "INSECURE: the %s listens on %s without TLS: anyone who can reach it can run "
        "queries, read results and join the cluster. Secure it with `mangonel certs init "
        "DIR` and --tls-dir DIR (see README, 'Securing a cluster')",
        what,
        host,
    )
    return True
