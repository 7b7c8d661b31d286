"""``mangonel://`` URLs: how the ibis backend and the SQLAlchemy dialect name a cluster.

``mangonel://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...][?OPTION=VALUE&...]``, with the
options of ``mangonel.connect`` that a tool may need to set in a URL:

* ``tls_ca=FILE``: the cluster CA's certificate (PEM): speak TLS to the cluster.
* ``tls_dir=DIR``: the same from ``DIR`` (``mangonel certs init DIR``, or its
  ``client`` copy).
* ``token=TOKEN``: a bearer token instead of a user name and password.
* ``timeout_s=SECONDS``: the limit on each call (``Session``'s ``timeout_s``).
* ``query_timeout_s=SECONDS``: the most a query may take.

>>> parse_url("mangonel://ann:s3cret@sched:50050?tls_ca=/etc/ca.pem").address
'sched:50050'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from mangonel import defaults
from mangonel.client.session import Session
from mangonel.security.options import SecurityOptions

SCHEME = "mangonel"

OPTIONS = ("tls_ca", "tls_dir", "token", "timeout_s", "query_timeout_s")
"""The options a URL's query string may carry."""


class ConnectOptionError(ValueError):
    """A ``mangonel://`` URL or connect option that cannot be used."""


@dataclass(frozen=True)
class ConnectOptions:
    """What ``mangonel.connect`` needs, read from a URL or keyword arguments."""

    address: str = defaults.SCHEDULER_ADDRESS
    user: str | None = None
    password: str | None = None
    token: str | None = None
    tls_ca: str | None = None
    tls_dir: str | None = None
    timeout_s: float = 60.0
    query_timeout_s: float | None = None

    @classmethod
    def from_mapping(cls, address: str, options: Mapping[str, object]) -> ConnectOptions:
        """Options from keyword arguments or a URL's query string (values may be text).

        Raises:
            ConnectOptionError: an unknown option, or a number that is not one.
        """
        unknown = sorted(set(options) - set(OPTIONS) - {"user", "password"})
        if unknown:
            raise ConnectOptionError(
                f"unknown mangonel connect option(s) {', '.join(unknown)}; "
                f"the options are user, password, {', '.join(OPTIONS)}"
            )

        def text(name: str) -> str | None:
            value = options.get(name)
            return None if value is None or value == "" else str(value)

        def number(name: str) -> float | None:
            value = text(name)
            if value is None:
                return None
            try:
                return float(value)
            except ValueError:
                raise ConnectOptionError(
                    f"{name}={value!r} is not a number of seconds; give e.g. {name}=30"
                ) from None

        if text("tls_ca") and text("tls_dir"):
            raise ConnectOptionError("give tls_ca or tls_dir, not both")
        return cls(
            address=address or defaults.SCHEDULER_ADDRESS,
            user=text("user"),
            password=text("password"),
            token=text("token"),
            tls_ca=text("tls_ca"),
            tls_dir=text("tls_dir"),
            timeout_s=number("timeout_s") or 60.0,
            query_timeout_s=number("query_timeout_s"),
        )

    @property
    def security(self) -> SecurityOptions | None:
        if self.tls_dir:
            return SecurityOptions.from_tls_dir(self.tls_dir, "client")
        if self.tls_ca:
            return SecurityOptions(tls_ca=self.tls_ca)
        return None

    def connect(self) -> Session:
        """A session with these options (it connects on its first call)."""
        return Session(
            self.address,
            timeout_s=self.timeout_s,
            query_timeout_s=self.query_timeout_s,
            security=self.security,
            user=self.user,
            password=self.password,
            token=self.token,
        )


def parse_url(url: str, overrides: Mapping[str, object] | None = None) -> ConnectOptions:
    """The options a ``mangonel://`` URL names; ``overrides`` (keyword arguments) win.

    Raises:
        ConnectOptionError: not a ``mangonel://`` URL, or an option that cannot be used.
    """
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ConnectOptionError(
            f"{url!r} is not a mangonel URL: write mangonel://[user[:password]@]host:port"
        )
    # The host part as written: urlsplit's hostname would lower-case it and keep one
    # host of a comma-separated list.
    hosts = parts.netloc.rpartition("@")[2]
    options: dict[str, object] = dict(parse_qsl(parts.query))
    if parts.username:
        options["user"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    options.update(overrides or {})
    return ConnectOptions.from_mapping(hosts, options)
