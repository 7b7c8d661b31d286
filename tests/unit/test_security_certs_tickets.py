"""The pure parts of cluster security: certificates, tickets, TLS settings, warnings."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mangonel.proto import mangonel_pb2 as pb
from mangonel.scheduler.tickets import TicketIssuer
from mangonel.security import certs, tls
from mangonel.security.options import SecurityOptions
from mangonel.security.tickets import (
    TicketClaims,
    TicketError,
    TicketSigner,
    session_hash,
    session_key_of,
)

SECRET = b"s" * 64


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_init_cluster_writes_a_ca_node_and_client_certificates_and_a_secret(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "tls"
    written = certs.init_cluster(str(directory), hosts=["db1.example.com", "10.0.0.5"])
    names = sorted(os.path.basename(p) for p in written)
    assert names == [
        "ca-key.pem", "ca.pem", "client-key.pem", "client.pem",
        "cluster-secret", "node-key.pem", "node.pem",
    ]  # fmt: skip
    for private in ("ca-key.pem", "node-key.pem", "client-key.pem", "cluster-secret"):
        assert stat.S_IMODE((directory / private).stat().st_mode) == 0o600, private
    ca = _cert(directory / "ca.pem")
    node = _cert(directory / "node.pem")
    client = _cert(directory / "client.pem")
    for issued in (node, client):
        assert issued.issuer == ca.subject
        issued.verify_directly_issued_by(ca)
    san = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "db1.example.com"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == [
        "127.0.0.1", "::1", "10.0.0.5",
    ]  # fmt: skip
    node_usage = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(node_usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    client_usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(client_usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]  # it cannot serve
    cn = node.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == certs.NODE_NAME
    options = SecurityOptions.from_tls_dir(str(directory), "node")
    assert options.cluster_secret() is not None and len(options.cluster_secret() or b"") == 64
    assert tls.TlsMaterial.load(options) is not None


def test_init_cluster_refuses_to_overwrite_a_ca(tmp_path: Path) -> None:
    certs.init_cluster(str(tmp_path))
    before = (tmp_path / "ca.pem").read_bytes()
    with pytest.raises(certs.CertsExistError, match="already holds a cluster CA"):
        certs.init_cluster(str(tmp_path))
    assert (tmp_path / "ca.pem").read_bytes() == before
    certs.init_cluster(str(tmp_path), force=True)
    assert (tmp_path / "ca.pem").read_bytes() != before


def test_expired_certificate_can_be_made_for_tests(tmp_path: Path) -> None:
    ca = certs.make_ca()
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    old = certs.issue(ca, "node", days=1, start=past)
    assert x509.load_pem_x509_certificate(old.cert).not_valid_after_utc < past + (
        datetime.timedelta(days=2)
    )


# --------------------------------------------------------------------- tickets


def _claims(**changes: object) -> TicketClaims:
    base = TicketClaims("/w/j1/s0/m2-a0-p1.arrow", "j1", 0, 2, 1, expires=2000.0)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_ticket_round_trip_and_every_refusal() -> None:
    now = [1000.0]
    signer = TicketSigner(SECRET, clock=lambda: now[0])
    raw = signer.sign(_claims())
    assert signer.verify(raw) == _claims()
    # Any change to the claims or the signature is forgery.
    body, _, mac = raw.rpartition(b".")
    with pytest.raises(TicketError, match="signature does not match"):
        signer.verify(body.replace(b"mgt1.e", b"mgt1.f") + b"." + mac)
    with pytest.raises(TicketError, match="signature does not match"):
        signer.verify(body + b"." + mac[:-2] + b"xx")
    with pytest.raises(TicketError, match="signature does not match"):
        signer.verify(b"mgt1.garbage")
    with pytest.raises(TicketError, match="signature does not match"):
        TicketSigner(b"t" * 64).verify(raw)
    with pytest.raises(TicketError, match="not signed"):
        signer.verify(b"/w/j1/s0/m2-a0-p1.arrow")
    now[0] = 2001.0
    with pytest.raises(TicketError, match="expired 1 s ago"):
        signer.verify(raw)


def test_result_ticket_is_good_only_for_its_session() -> None:
    signer = TicketSigner(SECRET, clock=lambda: 1000.0)
    raw = signer.sign(_claims(session=session_hash("key-a")))
    assert signer.verify(raw, "key-a").session == session_hash("key-a")
    with pytest.raises(TicketError, match="another session"):
        signer.verify(raw, "key-b")
    with pytest.raises(TicketError, match="no session key"):
        signer.verify(raw)
    assert session_key_of("key-a.00ff") == "key-a"
    assert session_key_of("plain") == "plain"


def test_issuer_signs_launch_inputs_and_results_on_the_wire() -> None:
    signer = TicketSigner(SECRET, clock=lambda: 1000.0)
    issuer = TicketIssuer(signer, shuffle_ttl_s=86400, result_ttl_s=600)
    loc = pb.PartitionLocation(stage=1, map_partition=3, partition=2, path="/w/j9/s1/x.arrow")
    launch = pb.ExecutorCommand(
        launch=pb.LaunchTask(
            task=pb.TaskSpec(
                attempt=pb.TaskAttemptId(job="j9", stage=2),
                inputs=[pb.InputLocations(locations=[loc, loc])],
            )
        )
    )
    issuer.sign_launch(launch)
    for signed in launch.launch.task.inputs[0].locations:
        claims = signer.verify(signed.ticket.encode())
        assert (claims.job, claims.stage, claims.map_partition, claims.partition) == ("j9", 1, 3, 2)
        assert claims.expires == 1000.0 + 86400 and claims.session == ""
    cancel = pb.ExecutorCommand(cancel=pb.CancelTask())
    issuer.sign_launch(cancel)  # nothing to sign
    status = pb.JobStatus(job_id="j9", result=[loc])
    issuer.sign_result(status, "key-a.0001")
    claims = signer.verify(status.result[0].ticket.encode(), "key-a")
    assert claims.expires == 1600.0 and claims.session == session_hash("key-a")


# ------------------------------------------------------------ settings, defaults


def test_without_tls_nothing_changes() -> None:
    assert tls.TlsMaterial.load(None) is None
    assert tls.TlsMaterial.load(SecurityOptions()) is None
    assert tls.flight_scheme(None) == "grpc"
    assert tls.flight_server_kwargs(None) == {} and tls.flight_client_kwargs(None) == {}
    assert tls.uvicorn_ssl_kwargs(SecurityOptions()) == {}


def test_tls_settings_of_each_channel(tmp_path: Path) -> None:
    certs.init_cluster(str(tmp_path))
    options = SecurityOptions.from_tls_dir(str(tmp_path), "node")
    material = tls.TlsMaterial.load(options)
    assert material is not None
    assert tls.flight_scheme(material) == "grpc+tls"
    assert tls.flight_server_kwargs(material)["verify_client"] is True
    assert tls.flight_client_kwargs(material)["tls_root_certs"] == material.ca
    assert tls.uvicorn_ssl_kwargs(options) == {
        "ssl_certfile": str(tmp_path / "node.pem"),
        "ssl_keyfile": str(tmp_path / "node-key.pem"),
    }


@pytest.mark.parametrize(
    ("host", "secured", "warns"),
    [
        ("127.0.0.1", False, False),
        ("localhost", False, False),
        ("::1", False, False),
        ("0.0.0.0", False, True),
        ("10.1.2.3", False, True),
        ("db1.example.com", False, True),
        ("0.0.0.0", True, False),
    ],
)
def test_listening_beyond_loopback_without_tls_warns(
    host: str, secured: bool, warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    options = SecurityOptions("c.pem", "k.pem", "ca.pem") if secured else SecurityOptions()
    log = logging.getLogger("test.security")
    with caplog.at_level(logging.WARNING, logger="test.security"):
        assert tls.warn_if_exposed(log, "scheduler", host, options) is warns
    assert ("INSECURE" in caplog.text) is warns


@pytest.mark.parametrize(
    ("details", "tls_on", "hint"),
    [
        ("Socket closed", False, "--tls-dir"),
        ("Hostname Verification Check failed.", True, "does not name the host dialled"),
        ("CERTIFICATE_VERIFY_FAILED: unable to get local issuer", True, "not signed by"),
        ("Socket closed", True, "refused this process's certificate"),
    ],
)
def test_connection_failures_get_a_hint(details: str, tls_on: bool, hint: str) -> None:
    assert hint in tls.describe_failure(details, tls_on)


def test_certs_init_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mangonel.client.cli import main

    target = tmp_path / "tls"
    assert main(["certs", "init", str(target), "--host", "db1.example.com"]) == 0
    out = capsys.readouterr().out
    assert "wrote 7 files" in out and "db1.example.com" in out and "--tls-dir" in out
    node = _cert(target / "node.pem")
    san = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "db1.example.com" in san.get_values_for_type(x509.DNSName)
    assert main(["certs", "init", str(target)]) == 1
    assert "already holds a cluster CA" in capsys.readouterr().err


def test_security_options_travel_on_every_command_line() -> None:
    from mangonel.client.cli import build_parser
    from mangonel.security.options import options_from_args

    parser = build_parser()
    for command in ("scheduler", "executor"):
        args = parser.parse_args([command, "--tls-dir", "/etc/tls"])
        got = options_from_args(args, "node")
        assert got.tls_cert == "/etc/tls/node.pem" and got.tls_ca == "/etc/tls/ca.pem"
        assert got.cluster_secret_file == "/etc/tls/cluster-secret"
        again = options_from_args(parser.parse_args([command, *got.to_args()]), "node")
        assert again == got
    args = parser.parse_args(["sql", "SELECT 1", "--tls-dir", "/etc/tls"])
    assert args.tls_dir == "/etc/tls"
    args = parser.parse_args(["standalone", "--secure", "--tls-dir", "/tmp/x"])
    assert args.secure and args.tls_dir == "/tmp/x"
