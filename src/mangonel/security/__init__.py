"""Who may talk to a mangonel cluster, and how its channels are protected.

- ``options``: ``SecurityOptions``, the files a process is given (TLS
  certificate, key and CA, the cluster secret, the users file) and the
  ``--tls-*`` / ``--cluster-secret-file`` / ``--users-file`` options.
- ``auth``: ``Principal`` (who a request comes from) and the ``Authenticator``
  interface every front door (the gRPC query service, the web UI and REST API,
  the Flight SQL endpoint) checks credentials with.
- ``users``: the users file (salted scrypt hashes), ``UsersAuthenticator``
  and ``authenticator_for(options)``, the one factory every front door calls.
- ``tokens``: bearer tokens signed (HMAC-SHA256) with the cluster secret.
- ``users_cli``: ``mangonel users add/remove/list/token``.

Without options nothing is protected: a local cluster on loopback runs as
before. This package sits at the bottom of the layers (beside ``storage``): it
imports only ``errors`` and ``defaults`` of mangonel's own modules.
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
