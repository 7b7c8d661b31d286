"""Flight SQL on a cluster with users: the scheduler's own authenticator, real processes.

The users file and the cluster secret are the ones ``mangonel users`` writes
(``LocalCluster(users=...)``); the ADBC driver logs in through the Flight SQL
handshake (Basic, answered with a bearer token), its jobs belong to its user,
and a wrong password is refused with the scheduler's message while the
endpoint keeps serving.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import adbc_driver_manager
import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from fsql_support import adbc_connect, statement
from helpers import ARTIFACTS_DIR, assert_same_result, tpch_query

from mangonel.errors import PermissionDeniedError
from mangonel.proto import flightsql_pb2 as sql_pb

USERS = {
    "root": ("r00t-pass", True),
    "alice": ("wonderland", False),
    "bob": ("bob-the-builder", False),
}


@pytest.fixture(scope="module")
def users_cluster(tpch_tables: dict[str, Path]) -> Iterator[Any]:
    import mangonel

    work_dir = ARTIFACTS_DIR / "flightsql" / "_module" / "users-cluster"
    shutil.rmtree(work_dir, ignore_errors=True)
    with mangonel.LocalCluster(executors=2, work_dir=str(work_dir), users=USERS) as cluster:
        with cluster.connect() as admin:
            for name, path in tpch_tables.items():
                admin.register_parquet(name, str(path))
        yield cluster


def test_a_user_logs_in_and_queries(
    users_cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = tpch_query(12)
    with (
        adbc_connect(users_cluster.flight_sql_url, username="alice", password="wonderland") as conn,
        conn.cursor() as cur,
    ):
        cur.execute(sql)
        actual = cur.fetch_arrow_table()
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert_same_result(actual, expected, ordered=True, order_by=["l_shipmode"])
    # The job is alice's: the admin sees it, bob neither sees nor cancels it.
    with users_cluster.connect() as admin:
        jobs = [j for j in admin.status().jobs if j.sql == sql]
    assert jobs and {j.owner for j in jobs} == {"alice"}
    with users_cluster.connect("bob", "bob-the-builder") as bob:
        assert not [j for j in bob.status().jobs if j.sql == sql]
        with pytest.raises(PermissionDeniedError):
            bob.cancel(jobs[0].job_id)


def test_a_wrong_password_is_refused_and_the_endpoint_keeps_serving(users_cluster: Any) -> None:
    url = users_cluster.flight_sql_url
    with pytest.raises(adbc_driver_manager.Error, match="wrong user name or password"):
        adbc_connect(url, username="alice", password="not-her-password")  # the handshake
    log = (users_cluster.log_dir / "scheduler.log").read_text()
    assert "alice" in log and "refused" in log.lower()
    with (
        adbc_connect(url, username="bob", password="bob-the-builder") as conn,
        conn.cursor() as cur,
    ):
        cur.execute("SELECT count(*) AS n FROM nation")
        assert cur.fetchall() == [(25,)]


def _cancel(client: flight.FlightClient, info: flight.FlightInfo, options: Any) -> int:
    request = sql_pb.CancelFlightInfoRequest(info=info.serialize())
    action = flight.Action("CancelFlightInfo", request.SerializeToString())
    [answer] = client.do_action(action, options)
    return int(sql_pb.CancelFlightInfoResult.FromString(answer.body.to_pybytes()).status)


def test_another_users_query_is_not_cancelled_even_once_its_result_was_released(
    users_cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = "SELECT n_name, n_regionkey FROM nation WHERE n_regionkey = 1"
    url = users_cluster.flight_sql_url
    with flight.connect(url) as alice, flight.connect(url) as bob:
        as_alice = flight.FlightCallOptions(
            headers=[alice.authenticate_basic_token("alice", "wonderland")]
        )
        as_bob = flight.FlightCallOptions(
            headers=[bob.authenticate_basic_token("bob", "bob-the-builder")]
        )
        info = alice.get_flight_info(statement(sql), as_alice)
        # Through the scheduler, which forwards alice's token to the executors.
        parts = [alice.do_get(e.ticket, as_alice).read_all() for e in info.endpoints]
        expected = duckdb_ref.sql(sql).to_arrow_table()
        assert_same_result(pa.concat_tables(parts), expected, ordered=False)
        with pytest.raises(flight.FlightUnauthorizedError, match="belongs to another user"):
            _cancel(bob, info, as_bob)
        # Alice releases it: the endpoint holds it no more, the scheduler still
        # knows whose job it is (``doors.job_of``).
        assert _cancel(alice, info, as_alice) == sql_pb.CANCEL_STATUS_CANCELLED
        with pytest.raises(flight.FlightUnauthorizedError, match="belongs to another user"):
            _cancel(bob, info, as_bob)
