"""One Flight client per peer address, made on first use and kept: the shuffle
reader's fetches and the link prober's probes each hold such a pool.

A client is dropped (closed, made again on next use) after a call through it
failed, so that a broken channel is not reused, and replaced by a new one when a
fetch through it stalled (``renew``: its connection may be stuck behind a cut
that healed), and forgotten when a fetch through it was given up (``forget``:
the next call makes a new one); ``close`` closes them all.
"""

from __future__ import annotations

import contextlib
import threading

import pyarrow.flight as flight

from mangonel.security.tls import TlsMaterial, flight_client_kwargs, flight_scheme


class FlightClients:
    """Flight clients by ``host:port``, thread-safe, TLS where ``tls`` says so."""

    def __init__(self, tls: TlsMaterial | None) -> None:
        self._tls = tls
        self._lock = threading.Lock()
        self._clients: dict[str, flight.FlightClient] = {}

    def get(self, address: str) -> flight.FlightClient:
        """The client of ``address``, made if there is none."""
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = flight.FlightClient(
                    f"{flight_scheme(self._tls)}://{address}", **flight_client_kwargs(self._tls)
                )
                self._clients[address] = client
            return client

    def renew(self, address: str) -> flight.FlightClient:
        """A new client of ``address`` (a new connection), kept from now on; the
        old one is left to the calls still on it, not closed (closing does not
        interrupt them) and goes when they end."""
        client = flight.FlightClient(
            f"{flight_scheme(self._tls)}://{address}", **flight_client_kwargs(self._tls)
        )
        with self._lock:
            self._clients[address] = client
        return client

    def forget(self, address: str) -> None:
        """Forget the client of ``address``, not closed: a call still on it was
        given up (its task cancelled, or it stalled) and goes on to its own
        deadline. Its connection may be stuck behind a cut (TCP retransmits
        what the call sent, backing off); the next call makes a new one
        rather than queue behind it after the heal."""
        with self._lock:
            self._clients.pop(address, None)

    def drop(self, address: str) -> None:
        """Close and forget the client of ``address`` (a call through it failed)."""
        with self._lock:
            client = self._clients.pop(address, None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def close(self) -> None:
        """Close every client."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
