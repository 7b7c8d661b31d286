"""TLS for each kind of channel, from one ``SecurityOptions``.

Every channel of a secured cluster is mutual TLS under the cluster CA:

* gRPC (client and executors to the scheduler): ``server_credentials`` demands
  a certificate the CA signed from every caller; ``channel_credentials`` trusts
  only the CA and presents this process's certificate. One port serves clients
  and executors, so the executor service also checks the caller's role: only a
  ``mangonel-node`` certificate may act as an executor (``peer_role``).
* Arrow Flight (shuffle fetches between executors, result reads by clients):
  ``flight_server_kwargs`` and ``flight_client_kwargs``; the tickets are signed
  too (``tickets``).
* The web UI, REST API and metrics: HTTPS (``uvicorn_ssl_kwargs``) without
  client certificates, since browsers rarely have one; the UI's own login (the
  users layer) guards what it shows.

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

from mangonel.security.options import NODE_NAME, SecurityOptions


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes one process needs: its certificate and key, and the CA."""

    cert: bytes
    key: bytes
    ca: bytes

    @classmethod
    def load(cls, options: SecurityOptions | None) -> TlsMaterial | None:
        """The files of ``options``, read; ``None`` without TLS.

        Raises:
            SecurityConfigError: a file is missing or unreadable.
        """
        files = options.read_tls() if options is not None else None
        return None if files is None else cls(*files)


# ----------------------------------------------------------------------- gRPC


def server_credentials(tls: TlsMaterial) -> grpc.ServerCredentials:
    """Serve TLS with this certificate; demand one the CA signed from every caller."""
    return grpc.ssl_server_credentials(
        [(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True
    )


def channel_credentials(tls: TlsMaterial) -> grpc.ChannelCredentials:
    """Trust only the cluster CA; present this process's certificate."""
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
            "process's --tls-ca, or does not name the host dialled (add it with "
            "`mangonel certs init --host NAME`)"
        )
    if tls and ("handshake" in lowered or "ssl" in lowered):
        return "the TLS handshake failed: check that both sides use the same cluster's files"
    if tls:
        return (
            "if it runs, it may have refused this process's certificate (signed by "
            "another CA?) or speak plaintext (started without --tls-dir)"
        )
    return (
        "if it runs with TLS (--tls-dir), connect with the cluster's files too: "
        "--tls-dir DIR, or $MANGONEL_TLS_DIR"
    )


# --------------------------------------------------------------------- Flight


def flight_scheme(tls: TlsMaterial | None) -> str:
    """``grpc+tls`` with TLS, ``grpc`` without."""
    return "grpc" if tls is None else "grpc+tls"


def flight_server_kwargs(tls: TlsMaterial | None) -> dict[str, Any]:
    """``FlightServerBase`` arguments: TLS, and a client certificate from the CA."""
    if tls is None:
        return {}
    import pyarrow.flight as flight

    return {
        "tls_certificates": [flight.CertKeyPair(tls.cert, tls.key)],
        "verify_client": True,
        "root_certificates": tls.ca,
    }


def flight_client_kwargs(tls: TlsMaterial | None) -> dict[str, Any]:
    """``FlightClient`` arguments: trust only the CA, present this certificate."""
    if tls is None:
        return {}
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
