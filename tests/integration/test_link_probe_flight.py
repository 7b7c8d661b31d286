"""A link probe between two executors' real Flight servers (``executor.probes``,
``executor.flight``), with security on (TLS under a cluster CA and the cluster
secret) and off: a member's probe streams its bytes and is timed; a probe
without the cluster's secret, from a prober or an outside client, is refused,
and the server goes on serving.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pyarrow.flight as flight
import pytest

from mangonel import defaults
from mangonel.executor.flight import ShuffleFlightServer
from mangonel.executor.peer_rates import PeerRates
from mangonel.executor.probes import LinkProber
from mangonel.executor.shuffle_write import OutputRegistry
from mangonel.ids import ExecutorId
from mangonel.security.certs import init_cluster
from mangonel.security.options import SecurityOptions
from mangonel.security.tickets import TicketError, TicketSigner, unsigned_probe
from mangonel.security.tls import TlsMaterial
from mangonel.task import ProbeTarget

PEER = ExecutorId("e2")
# What a probe counts: the bytes after its first batch.
COUNTED = defaults.LINK_PROBE_BYTES - defaults.LINK_PROBE_BATCH_BYTES


def server(
    root: Path, material: TlsMaterial | None, signer: TicketSigner | None
) -> ShuffleFlightServer:
    root.mkdir()
    return ShuffleFlightServer(str(root), OutputRegistry(), tls_material=material, signer=signer)


@pytest.fixture()
def secured(tmp_path: Path) -> Iterator[tuple[ShuffleFlightServer, TlsMaterial, bytes, Path]]:
    init_cluster(str(tmp_path / "tls"))
    options = SecurityOptions.from_tls_dir(str(tmp_path / "tls"), "node")
    material = TlsMaterial.load(options)
    secret = options.cluster_secret()
    assert material is not None and secret is not None
    peer = server(tmp_path / "peer", material, TicketSigner(secret))
    yield peer, material, secret, tmp_path / "tls" / "client" / "ca.pem"
    peer.shutdown()


def test_a_members_probe_is_streamed_and_timed_and_anyone_elses_refused(
    secured: tuple[ShuffleFlightServer, TlsMaterial, bytes, Path],
) -> None:
    peer, material, secret, client_ca = secured
    target = ProbeTarget(PEER, f"127.0.0.1:{peer.port}")
    member = LinkProber(tls_material=material, signer=TicketSigner(secret))
    member.aim([target])
    got = member.probe_round()
    assert len(got) == 1 and got[0].peer == PEER
    assert got[0].bytes == COUNTED and got[0].busy_s > 0
    assert member.take() == got and member.take() == []  # for the next heartbeat, once
    # A prober without the cluster's secret, or with another cluster's: refused.
    for signer in (None, TicketSigner(b"x" * 32)):
        outsider = LinkProber(tls_material=material, signer=signer)
        assert outsider.probe(target) is None
        outsider.close()
    assert peer.refused == 2
    # An outside client (the CA alone, as clients hold it) cannot make it stream.
    client = flight.FlightClient(
        f"grpc+tls://127.0.0.1:{peer.port}", tls_root_certs=client_ca.read_bytes()
    )
    try:
        with pytest.raises(flight.FlightUnauthenticatedError, match="only the cluster's"):
            client.do_get(flight.Ticket(unsigned_probe(1024))).read_all()
        # Nor a member's ticket stretched to more than a probe may ask.
        big = TicketSigner(secret)
        with pytest.raises(TicketError):
            big.sign_probe(64 * 1024 * 1024, "e1")
    finally:
        client.close()
    assert peer.refused == 3
    # ... and the server goes on serving the members.
    again = member.probe(target)
    assert again is not None and again.bytes == COUNTED
    member.close()


def test_without_security_a_probe_is_unsigned_and_a_peer_read_from_now_is_not_probed(
    tmp_path: Path,
) -> None:
    peer = server(tmp_path / "peer", None, None)
    try:
        rates = PeerRates()
        prober = LinkProber(rates=rates)
        prober.aim([ProbeTarget(PEER, f"127.0.0.1:{peer.port}")])
        got = prober.probe_round()
        assert [(s.peer, s.bytes) for s in got] == [(PEER, COUNTED)]
        # A fetch from the peer is open: it measures the link, no probe shares it.
        rates.opened(PEER)
        assert prober.probe_round() == []
        rates.closed(PEER)
        assert len(prober.probe_round()) == 1
        assert peer.refused == 0
        prober.close()
    finally:
        peer.shutdown()


def test_a_pause_mid_stream_is_left_out_of_a_probes_time_and_a_slow_stream_is_not(
    tmp_path: Path,
) -> None:
    peer = server(tmp_path / "peer", None, None)
    batches = defaults.LINK_PROBE_BYTES // defaults.LINK_PROBE_BATCH_BYTES
    try:
        target = ProbeTarget(PEER, f"127.0.0.1:{peer.port}")
        for gaps, expected_s in (
            # Every batch 0.1 ms after the last, but one after a 1.5 s stop.
            ([1e-4] * 7 + [1.5] + [1e-4] * (batches - 9), 1e-4 * (batches - 1)),
            # A slow link: every batch 6.5 ms after the last (20 mbit).
            ([6.5e-3] * (batches - 1), 6.5e-3 * (batches - 1)),
        ):
            prober = LinkProber(clock=iter([0.0, *itertools.accumulate(gaps)]).__next__)
            got = prober.probe(target)
            prober.close()
            assert got is not None and got.bytes == COUNTED
            assert got.busy_s == pytest.approx(expected_s)
    finally:
        peer.shutdown()
