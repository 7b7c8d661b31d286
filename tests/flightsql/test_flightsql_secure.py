"""Flight SQL on a secured cluster: TLS, users, user-bound result tickets; real processes.

``LocalCluster(secure=True, users=...)``: the endpoint speaks TLS with the
scheduler's certificate (its URL is ``grpc+tls://``), clients hold the client
bundle alone (the cluster's CA) and log in with a user name and password, and
the result endpoints name the executors, whose Flight servers ask for no
certificate and serve a partition only for a ticket the scheduler signed for the
user who ran the statement, presented with that user's token (the ADBC driver
sends its token to every location). Another user replaying the ticket, at an
executor or at the scheduler, is refused.
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


def _ca(cluster: Any) -> bytes:
    """The client bundle: the CA's certificate, all a client holds."""
    bundle = Path(cluster.client_tls_dir)
    assert sorted(p.name for p in bundle.iterdir()) == ["ca.pem"]
    return (bundle / "ca.pem").read_bytes()


def _refusals(cluster: Any) -> int:
    return sum(
        (Path(cluster.log_dir) / f"executor-{i}.log").read_text().count("refused a Flight ticket")
        for i in range(2)
    )


def test_a_secured_query_answers_like_duckdb(
    secure_cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    url = secure_cluster.flight_sql_url
    assert url.startswith("grpc+tls://")
    before = _refusals(secure_cluster)
    sql = tpch_query(3)
    with (
        adbc_connect(
            url, username="alice", password="wonderland", **{ROOT: _ca(secure_cluster).decode()}
        ) as conn,
        conn.cursor() as cur,
    ):
        cur.execute(sql)
        actual = cur.fetch_arrow_table()
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert_same_result(actual, expected, ordered=True, order_by=TPCH_ORDER_BY[3])
    # The driver read every partition at its executor (with alice's token): none was
    # refused there and left to the scheduler's fallback.
    assert _refusals(secure_cluster) == before


def _login(cluster: Any, user: str) -> tuple[flight.FlightClient, flight.FlightCallOptions]:
    client = flight.connect(cluster.flight_sql_url, tls_root_certs=_ca(cluster))
    token = client.authenticate_basic_token(user, USERS[user][0])
    return client, flight.FlightCallOptions(headers=[token], timeout=30)


def test_the_endpoints_carry_user_bound_tickets(secure_cluster: Any) -> None:
    """A result endpoint's ticket is the scheduler's signature, not a file's path; an
    executor serves it to a client with the CA alone and the user's token, and refuses
    it without the token, and the bare path of the same file."""
    client, alice = _login(secure_cluster, "alice")
    with client:
        info = client.get_flight_info(statement("SELECT n_name FROM nation"), alice)
    endpoint = info.endpoints[0]
    view = ResultView.decode(endpoint.ticket.ticket)
    assert view is not None and view.ticket.startswith(b"mgt1.")
    executor = str(endpoint.locations[0].uri.decode())
    with flight.connect(executor, tls_root_certs=_ca(secure_cluster)) as ex:
        assert ex.do_get(endpoint.ticket, alice).read_all().num_rows == 25
        with pytest.raises(flight.FlightUnauthenticatedError, match="no token came with it"):
            ex.do_get(endpoint.ticket).read_all()
        with pytest.raises(flight.FlightUnauthenticatedError, match="ticket refused"):
            ex.do_get(flight.Ticket(view.ticket.split(b".")[0] + b".forged"), alice).read_all()


def test_another_user_cannot_replay_a_result_ticket(secure_cluster: Any) -> None:
    """The admin's endpoint ticket, presented by another user at the executor or at the
    scheduler, is refused; the admin still reads it at both."""
    admin, root = _login(secure_cluster, "root")
    other, alice = _login(secure_cluster, "alice")
    with admin, other:
        info = admin.get_flight_info(statement("SELECT r_name FROM region"), root)
        endpoint = info.endpoints[0]
        executor = str(endpoint.locations[0].uri.decode())
        with flight.connect(executor, tls_root_certs=_ca(secure_cluster)) as ex:
            with pytest.raises(flight.FlightUnauthenticatedError, match="another user"):
                ex.do_get(endpoint.ticket, alice).read_all()
            assert ex.do_get(endpoint.ticket, root).read_all().num_rows > 0
        with pytest.raises(flight.FlightUnauthorizedError, match="another user's"):
            other.do_get(endpoint.ticket, alice).read_all()
        assert admin.do_get(endpoint.ticket, root).read_all().num_rows > 0
    log = Path(secure_cluster.log_dir) / "executor-0.log"
    logs = log.read_text() + (Path(secure_cluster.log_dir) / "executor-1.log").read_text()
    assert "belongs to another user" in logs


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT current_setting('memory_limit') AS m",
        "SELECT current_setting('temp_directory') AS spill",
        "SELECT version() AS v",
    ],
)
def test_no_host_setting_answers_a_flight_sql_client(secure_cluster: Any, sql: str) -> None:
    with (
        adbc_connect(
            secure_cluster.flight_sql_url,
            username="alice",
            password="wonderland",
            **{ROOT: _ca(secure_cluster).decode()},
        ) as conn,
        conn.cursor() as cur,
    ):
        with pytest.raises(adbc_driver_manager.Error, match="answers about the cluster's hosts"):
            cur.execute(sql)
        cur.execute("SELECT count(*) AS n FROM nation")  # the connection goes on serving
        assert cur.fetchall() == [(25,)]


def test_plaintext_to_the_tls_endpoint_is_refused(secure_cluster: Any) -> None:
    plain = secure_cluster.flight_sql_url.replace("grpc+tls://", "grpc://")
    with pytest.raises(adbc_driver_manager.Error):
        adbc_connect(plain, username="alice", password="wonderland").adbc_get_table_types()
