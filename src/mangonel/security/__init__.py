"""Who may talk to a mangonel cluster, and how its channels are protected.

- ``options``: ``SecurityOptions``, the files a process is given (TLS
  certificate, key and CA, the cluster secret, the users file) and the
  ``--tls-*`` / ``--cluster-secret-file`` / ``--users-file`` options.
- ``certs``: ``init_cluster`` (``mangonel certs init``): a cluster CA, the node
  certificate it signs and the cluster secret (the members' files), and the CA
  alone for the clients, kept apart.
- ``tls``: the TLS settings of each channel (gRPC, Flight, the web UI) from one
  ``SecurityOptions``, and the warning of a process exposed without TLS.
- ``tickets``: signed Flight tickets (HMAC over the file, job, stage, partition,
  expiry and the result's reader: a session or a user), checked by the executors'
  Flight servers.
- ``auth``: ``Principal`` (who a request comes from) and the ``Authenticator``
  interface every front door (the gRPC query service, the web UI and REST API,
  the Flight SQL endpoint) checks credentials with.
- ``users``: the users file (salted scrypt hashes), ``UsersAuthenticator``
  and ``authenticator_for(options)``, the one factory every front door calls.
- ``tokens``: bearer tokens signed (HMAC-SHA256) with the cluster secret.
- ``users_cli``: ``mangonel users add/remove/list/token``.

Without options nothing is protected: a local cluster on loopback runs as
before. This package sits at the bottom of the layers (beside ``storage``): it
imports only ``errors`` and ``defaults`` of mangonel's own modules (and the
third-party ``cryptography``, ``grpc`` and ``pyarrow``).
"""

from mangonel.security.auth import (
    ANONYMOUS,
    AUTHORIZATION,
    BASIC,
    BEARER,
    OPEN,
    Authenticator,
    Principal,
    basic_credentials,
    bearer_token,
)
from mangonel.security.users import UsersAuthenticator, authenticator_for

__all__ = [
    "ANONYMOUS",
    "AUTHORIZATION",
    "BASIC",
    "BEARER",
    "OPEN",
    "Authenticator",
    "Principal",
    "UsersAuthenticator",
    "authenticator_for",
    "basic_credentials",
    "bearer_token",
]
