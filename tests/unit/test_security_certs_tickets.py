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

from mangonel.proto import convert
from mangonel.proto import mangonel_pb2 as pb
from mangonel.scheduler.tickets import TicketIssuer
from mangonel.security import certs, tls
from mangonel.security.options import SecurityConfigError, SecurityOptions
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


def test_init_cluster_keeps_the_members_files_apart_from_the_clients(tmp_path: Path) -> None:
    directory = tmp_path / "tls"
    written = certs.init_cluster(str(directory), hosts=["db1.example.com", "10.0.0.5"])
    names = sorted(os.path.relpath(p, directory) for p in written)
    assert names == [
        "ca-key.pem", "ca.pem", "client/ca.pem",
        "cluster/ca.pem", "cluster/cluster-secret", "cluster/node-key.pem", "cluster/node.pem",
    ]  # fmt: skip
    # All a client gets is the CA's certificate: nothing that signs a token or a
    # certificate, nothing that passes as a member.
    assert sorted(os.listdir(directory / "client")) == ["ca.pem"]
    for private in ("ca-key.pem", "cluster/node-key.pem", "cluster/cluster-secret"):
        assert stat.S_IMODE((directory / private).stat().st_mode) == 0o600, private
    ca = _cert(directory / "ca.pem")
    assert _cert(directory / "client" / "ca.pem") == ca == _cert(directory / "cluster" / "ca.pem")
    node = _cert(directory / "cluster" / "node.pem")
    assert node.issuer == ca.subject
    node.verify_directly_issued_by(ca)
    san = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "db1.example.com"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == [
        "127.0.0.1", "::1", "10.0.0.5",
    ]  # fmt: skip
    node_usage = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(node_usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    cn = node.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == certs.NODE_NAME
    # --tls-dir takes the whole directory or one role's copy alike.
    for given in (directory, directory / "cluster"):
        options = SecurityOptions.from_tls_dir(str(given), "node")
        assert options.tls_cert == str(directory / "cluster" / "node.pem")
        assert len(options.cluster_secret() or b"") == 64
        assert tls.TlsMaterial.load(options) is not None
    for given in (directory, directory / "client"):
        client = SecurityOptions.from_tls_dir(str(given), "client")
        assert client == SecurityOptions(tls_ca=str(directory / "client" / "ca.pem"))
        material = tls.TlsMaterial.load(client)
        assert material is not None and material.cert is None and material.ca == ca_bytes(ca)
        assert client.cluster_secret() is None


def ca_bytes(ca: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return ca.public_bytes(serialization.Encoding.PEM)


def test_a_directory_made_before_the_split_still_reads(tmp_path: Path) -> None:
    """The single directory of an older ``certs init`` (every file side by side,
    a client certificate among them): members read it as before, and a client
    takes only its CA from it (it presents no certificate any more)."""
    ca = certs.make_ca()
    (tmp_path / "ca.pem").write_bytes(ca.cert)
    (tmp_path / "cluster-secret").write_bytes(certs.new_secret())
    certs.write_pair(str(tmp_path), "node", certs.issue(ca, "node"))
    certs.write_pair(str(tmp_path), "client", certs.issue(ca, "client"))
    node = SecurityOptions.from_tls_dir(str(tmp_path), "node")
    assert node.tls_cert == str(tmp_path / "node.pem") and node.cluster_secret() is not None
    client = SecurityOptions.from_tls_dir(str(tmp_path), "client")
    assert client == SecurityOptions(tls_ca=str(tmp_path / "ca.pem"))


def test_a_member_with_tls_needs_its_certificate_and_the_secret(tmp_path: Path) -> None:
    from mangonel.security.options import SecurityConfigError

    certs.init_cluster(str(tmp_path))
    SecurityOptions.from_tls_dir(str(tmp_path), "node").check_member("executor")
    SecurityOptions().check_member("executor")  # no TLS: nothing to check
    client = SecurityOptions.from_tls_dir(str(tmp_path), "client")
    with pytest.raises(SecurityConfigError, match="its certificate and key was not given"):
        client.check_member("executor")
    no_secret = dataclasses.replace(
        SecurityOptions.from_tls_dir(str(tmp_path), "node"), cluster_secret_file=None
    )
    with pytest.raises(SecurityConfigError, match="the cluster secret was not given"):
        no_secret.check_member("scheduler")
    with pytest.raises(SecurityConfigError, match="needs its key"):
        SecurityOptions(tls_cert="c.pem", tls_ca="ca.pem")
    with pytest.raises(SecurityConfigError, match="cluster CA too"):
        SecurityOptions(tls_cert="c.pem", tls_key="k.pem")


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


def test_a_flight_sql_result_ticket_is_good_only_for_its_user() -> None:
    from mangonel.security import tokens

    signer = TicketSigner(SECRET, clock=lambda: 1000.0)
    raw = signer.sign(_claims(user="root"))
    root = tokens.mint(SECRET, "root", admin=True, now=990.0)
    assert signer.verify(raw, bearer=root).user == "root"
    alice = tokens.mint(SECRET, "alice", admin=False, now=990.0)
    with pytest.raises(TicketError, match="belongs to another user"):
        signer.verify(raw, bearer=alice)
    with pytest.raises(TicketError, match="no token came with it"):
        signer.verify(raw)
    # A token of root's name signed with another secret proves nothing.
    with pytest.raises(TicketError, match="token that came with the ticket is refused"):
        signer.verify(raw, bearer=tokens.mint(b"t" * 64, "root", admin=True))
    # A session key is no substitute for the user's token.
    with pytest.raises(TicketError, match="no token came with it"):
        signer.verify(raw, session_key="key-a")
    issuer = TicketIssuer(signer, shuffle_ttl_s=86400, result_ttl_s=600)
    loc = convert.partition_location_from_proto(
        pb.PartitionLocation(stage=1, map_partition=0, partition=2, path="/w/j9/s1/x.arrow")
    )
    signed = issuer.sign_location(loc, "j9", "root")
    assert signer.verify(signed.flight_ticket, bearer=root).partition == 2
    anyone = issuer.sign_location(loc, "j9", "")  # no users: the anonymous admin's
    assert signer.verify(anyone.flight_ticket).user == ""


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
    # Flight asks callers for no certificate: the signed ticket decides.
    assert set(tls.flight_server_kwargs(material)) == {"tls_certificates"}
    assert tls.flight_client_kwargs(material)["tls_root_certs"] == material.ca
    assert tls.uvicorn_ssl_kwargs(options) == {
        "ssl_certfile": str(tmp_path / "cluster" / "node.pem"),
        "ssl_keyfile": str(tmp_path / "cluster" / "node-key.pem"),
    }
    client = tls.TlsMaterial.load(SecurityOptions.from_tls_dir(str(tmp_path), "client"))
    assert client is not None
    assert tls.flight_client_kwargs(client) == {"tls_root_certs": material.ca}
    with pytest.raises(SecurityConfigError, match="serving TLS needs a certificate"):
        tls.flight_server_kwargs(client)


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
    options = SecurityOptions(tls_ca="ca.pem") if secured else SecurityOptions()
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
        ("Socket closed", True, "clients connect to its --port"),
    ],
)
def test_connection_failures_get_a_hint(details: str, tls_on: bool, hint: str) -> None:
    assert hint in tls.describe_failure(details, tls_on)


def test_certs_init_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mangonel.client.cli import main

    target = tmp_path / "tls"
    assert main(["certs", "init", str(target), "--host", "db1.example.com"]) == 0
    out = capsys.readouterr().out
    assert "wrote 7 files" in out and "db1.example.com" in out
    assert f"--tls-dir {target / 'cluster'}" in out and f"--tls-dir {target / 'client'}" in out
    node = _cert(target / "cluster" / "node.pem")
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
    args = parser.parse_args(["--tls-ca", "/etc/ca.pem", "sql", "SELECT 1"])
    assert args.tls_ca == "/etc/ca.pem"
    assert parser.parse_args(["scheduler", "--port", "0"]).cluster_port is None
    args = parser.parse_args(["standalone", "--secure", "--tls-dir", "/tmp/x"])
    assert args.secure and args.tls_dir == "/tmp/x"
