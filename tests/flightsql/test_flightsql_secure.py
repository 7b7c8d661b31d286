"""Flight SQL on a secured cluster: TLS, users, signed result tickets; real processes.

``LocalCluster(secure=True, users=...)``: the endpoint speaks TLS with the
scheduler's certificate (its URL is ``grpc+tls://``), clients log in with a user
name and password, and the result endpoints name the executors, whose Flight
servers demand a certificate of the cluster CA and a ticket the scheduler signed.
A client with the cluster's client certificate reads each partition where it is;
one without it falls back to the scheduler's own location (the driver tries the
next location of an endpoint), so both get the whole answer.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import adbc_driver_manager
import duckdb
import pyarrow.flight as flight
import pytest
from fsql_support import adbc_connect, statement
from helpers import ARTIFACTS_DIR, TPCH_ORDER_BY, assert_same_result, tpch_query

from mangonel.proto.results import ResultView

USERS = {"root": ("r00t-pass", True), "alice": ("wonderland", False)}
ROOT = "adbc.flight.sql.client_option.tls_root_certs"
CERT = "adbc.flight.sql.client_option.mtls_cert_chain"
KEY = "adbc.flight.sql.client_option.mtls_private_key"


@pytest.fixture(scope="module")
def secure_cluster(tpch_tables: dict[str, Path]) -> Iterator[Any]:
    import mangonel

    work_dir = ARTIFACTS_DIR / "flightsql" / "_module" / "secure-cluster"
    shutil.rmtree(work_dir, ignore_errors=True)
    with mangonel.LocalCluster(
        executors=2, work_dir=str(work_dir), partitions=4, secure=True, users=USERS
    ) as cluster:
        with cluster.connect() as admin:
            for name, path in tpch_tables.items():
                admin.register_parquet(name, str(path))
        yield cluster


def _pem(cluster: Any, name: str) -> str:
    return (Path(cluster.tls_dir) / name).read_text()


@pytest.mark.parametrize("client_cert", [True, False], ids=["mtls", "ca-only"])
def test_a_secured_query_answers_like_duckdb(
    secure_cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection, client_cert: bool
) -> None:
    url = secure_cluster.flight_sql_url
    assert url.startswith("grpc+tls://")
    options = {ROOT: _pem(secure_cluster, "ca.pem")}
    if client_cert:
        options |= {
            CERT: _pem(secure_cluster, "client.pem"),
            KEY: _pem(secure_cluster, "client-key.pem"),
        }
    sql = tpch_query(3)
    with (
        adbc_connect(url, username="alice", password="wonderland", **options) as conn,
        conn.cursor() as cur,
    ):
        cur.execute(sql)
        actual = cur.fetch_arrow_table()
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert_same_result(actual, expected, ordered=True, order_by=TPCH_ORDER_BY[3])


def test_the_endpoints_carry_signed_tickets(secure_cluster: Any) -> None:
    """A result endpoint's ticket is the scheduler's signature, not a file's path,
    and an executor refuses the bare path of the same file."""

    ca = _pem(secure_cluster, "ca.pem").encode()
    cert = _pem(secure_cluster, "client.pem").encode()
    key = _pem(secure_cluster, "client-key.pem").encode()
    with flight.connect(secure_cluster.flight_sql_url, tls_root_certs=ca) as client:
        token = client.authenticate_basic_token("alice", "wonderland")
        options = flight.FlightCallOptions(headers=[token])
        info = client.get_flight_info(statement("SELECT n_name FROM nation"), options)
    endpoint = info.endpoints[0]
    view = ResultView.decode(endpoint.ticket.ticket)
    assert view is not None and view.ticket.startswith(b"mgt1.")
    executor = str(endpoint.locations[0].uri.decode())
    with flight.connect(executor, tls_root_certs=ca, cert_chain=cert, private_key=key) as ex:
        assert ex.do_get(flight.Ticket(endpoint.ticket.ticket)).read_all().num_rows == 25
        with pytest.raises(flight.FlightUnauthenticatedError, match="ticket refused"):
            ex.do_get(flight.Ticket(view.ticket.split(b".")[0] + b".forged")).read_all()


def test_plaintext_to_the_tls_endpoint_is_refused(secure_cluster: Any) -> None:
    plain = secure_cluster.flight_sql_url.replace("grpc+tls://", "grpc://")
    with pytest.raises(adbc_driver_manager.Error):
        adbc_connect(plain, username="alice", password="wonderland").adbc_get_table_types()
