"""TLS for each kind of channel, from one ``SecurityOptions``.

A secured cluster speaks TLS on every channel, under the cluster CA; only the
cluster's members (scheduler, executors) present certificates:

* gRPC, the scheduler's two ports. Its cluster port (``--cluster-port``), where
  executors register and take their tasks, is mutual TLS
  (``member_server_credentials``): a caller must show a certificate the CA signed,
  and the executor service checks that it is a member's (``is_node``). Its
  client port (``--port``) is server-side TLS (``client_server_credentials``):
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

``warn_if_exposed`` is the loud side of the safe default: a process that
listens beyond loopback without TLS logs a warning at start.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Any

import grpc

from mangonel.security.options import NODE_NAME, SecurityConfigError, SecurityOptions


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


# ----------------------------------------------------------------------- gRPC


def member_server_credentials(tls: TlsMaterial) -> grpc.ServerCredentials:
    """The cluster port: serve TLS with this certificate; demand one the CA signed
    from every caller."""
    return grpc.ssl_server_credentials(
        [tls.identity()], root_certificates=tls.ca, require_client_auth=True
    )


def client_server_credentials(tls: TlsMaterial) -> grpc.ServerCredentials:
    """The client port: serve TLS with this certificate; ask no caller for one."""
    return grpc.ssl_server_credentials([tls.identity()])


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
