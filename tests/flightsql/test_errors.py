"""Bad input, cancels and sessions: clear Flight errors, and the cluster keeps serving.

Each refusal is checked by its message (what happened, what to do) and followed by a
query whose answer is compared with DuckDB's, so a refusal that broke the server
fails the test.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import adbc_driver_manager
import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_manager import AdbcStatusCode
from fsql_support import adbc_connect, pack, raw_status, read_endpoints, statement
from google.protobuf import any_pb2
from helpers import assert_same_result, wait_until

from mangonel.proto import flightsql_pb2 as sql_pb
from mangonel.proto.results import ResultView

CHECK = "SELECT r_regionkey, r_name FROM region"
NOT_FOUND = (pa.ArrowKeyError, AdbcStatusCode.NOT_FOUND)
# Minutes of work: lineitem joined with itself on a key of three values (~1e11 rows).
# (On l_suppkey, 1000 values, it took 1.2-1.4 s: near the cancels below, which it outran.)
SLOW = (
    "SELECT sum(a.l_quantity * b.l_quantity) AS s FROM lineitem a "
    "JOIN lineitem b ON a.l_returnflag = b.l_returnflag"
)


def _still_serves(client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    info = client.get_flight_info(statement(CHECK))
    actual = read_endpoints(info, client)
    assert_same_result(actual, duckdb_ref.sql(CHECK).to_arrow_table(), ordered=False)


def test_statements_other_than_select_are_refused(
    adbc: Any, flight_client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    invalid = (pa.ArrowInvalid, AdbcStatusCode.INVALID_ARGUMENT)
    for sql, words, (error, code) in [
        ("UPDATE region SET r_name = 'X'", "ForbiddenStatementError", invalid),
        ("COPY region TO '/tmp/x.csv'", "ForbiddenStatementError", invalid),
        ("SELECT * FROM read_csv('/etc/passwd')", "ForbiddenStatementError", invalid),
        ("SELECT * FROM no_such_table", "UnknownTableError", NOT_FOUND),
        ("SELECT no_such_column FROM region", "BindError", invalid),
        ("SELEC 1", "SqlSyntaxError", invalid),
    ]:
        with pytest.raises(adbc_driver_manager.Error, match=words) as caught, adbc.cursor() as cur:
            cur.execute(sql)
        assert caught.value.status_code == code
        with pytest.raises(error, match=f"message: {words}"):
            flight_client.get_flight_info(statement(sql))
    with pytest.raises(adbc_driver_manager.Error, match="ForbiddenStatementError"):
        adbc.cursor().adbc_prepare("DELETE FROM region")
    _still_serves(flight_client, duckdb_ref)


def test_errors_are_plain_text(adbc: Any, flight_client: flight.FlightClient) -> None:
    """sqlglot underlines the token it stopped at with terminal escape codes; a client
    gets the line and column instead, of the text as the user wrote it."""
    for sql, where in [
        ("SELECT * FROM region WHERE = 1", "line 1, column 30 near '1'"),
        ("SELECT * FROM region WHERE r_name = ? AND = 1", "line 1, column 45 near '1'"),
    ]:
        with pytest.raises(adbc_driver_manager.Error) as caught, adbc.cursor() as cur:
            cur.execute(sql)
        with pytest.raises(pa.ArrowInvalid) as direct:
            flight_client.get_flight_info(statement(sql))
        for message in (str(caught.value), str(direct.value)):
            assert f"SqlSyntaxError: syntax error at {where}" in message
            assert "\x1b" not in message


def test_each_failure_ends_with_its_status_code_and_its_words_alone(
    fsql_cluster: Any, flight_client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """What a client in any language gets: a gRPC status that says what happened, and
    the message alone (pyarrow's server alone would send UNKNOWN with " Detail: Failed"
    appended, or the code with its Python traceback pasted in)."""
    url = fsql_cluster.flight_sql_url

    def info(sql: str) -> tuple[Any, str]:
        return raw_status(url, "GetFlightInfo", statement(sql).serialize())

    def schema(sql: str) -> tuple[Any, str]:
        return raw_status(url, "GetSchema", statement(sql).serialize())

    def action(kind: str, body: bytes = b"") -> tuple[Any, str]:
        return raw_status(url, "DoAction", sql_pb.Action(type=kind, body=body).SerializeToString())

    unknown = "UnknownTableError: table 'nope' is not in the catalog (registered: "
    prepare = sql_pb.ActionCreatePreparedStatementRequest(query="SELECT * FROM nope")
    cases = [
        (info("SELEC 1"), "INVALID_ARGUMENT", "SqlSyntaxError: syntax error at line 1, column"),
        (info("SELECT * FROM nope"), "NOT_FOUND", unknown),
        (schema("SELECT * FROM nope"), "NOT_FOUND", unknown),
        (action("CreatePreparedStatement", pack(prepare)), "NOT_FOUND", unknown),
        (schema("SELECT 1 +"), "INVALID_ARGUMENT", "SqlSyntaxError: "),
        (action("BeginTransaction"), "UNIMPLEMENTED", "action 'BeginTransaction' is not "),
    ]
    for (code, message), expected_code, start in cases:
        assert (code.name, message[: len(start)]) == (expected_code, start)
        assert "Detail" not in message and "Traceback" not in message, message
    # A job cancelled while a client waits for its FlightInfo: CANCELLED.
    sql = SLOW + " WHERE a.l_orderkey > 11"
    answer: list[tuple[Any, str]] = []
    waiting = threading.Thread(target=lambda: answer.append(info(sql)))
    waiting.start()
    with fsql_cluster.connect() as session:
        wait_until(lambda: any(j.sql == sql for j in session.status().jobs), "the job started")
        [job] = [j for j in session.status().jobs if j.sql == sql]
        session.cancel(job.job_id)
    waiting.join(30)
    [(code, message)] = answer
    assert (code.name, message) == ("CANCELLED", "JobCancelledError: cancelled by the user")
    _still_serves(flight_client, duckdb_ref)


def test_a_query_that_fails_while_running_is_named_by_its_error(
    adbc: Any, flight_client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The query's own operations fail on the data: a QueryError (not a bare
    # JobFailedError), which alone tells the user to fix the query.
    sql = "SELECT CAST(o_comment AS INTEGER) AS x FROM orders"
    words = r"(?s)message: QueryError: task .*Conversion Error.*fix it and submit it again"
    with pytest.raises(pa.ArrowInvalid, match=words):
        flight_client.get_flight_info(statement(sql))
    with pytest.raises(adbc_driver_manager.Error, match="QueryError: task"), adbc.cursor() as cur:
        cur.execute(sql)
    _still_serves(flight_client, duckdb_ref)


def test_updates_other_than_the_write_statements_are_refused(
    flight_client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # The write statements are updates (tests/flightsql/test_updates.py); DELETE is not.
    descriptor = flight.FlightDescriptor.for_command(
        pack(sql_pb.CommandStatementUpdate(query="DELETE FROM region"))
    )
    writer, reader = flight_client.do_put(descriptor, pa.schema([]))
    with pytest.raises(pa.ArrowInvalid, match="ForbiddenStatementError: an update is one of"):
        writer.close()
    _still_serves(flight_client, duckdb_ref)


def test_malformed_and_unknown_commands(
    flight_client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    with pytest.raises(pa.ArrowInvalid, match="malformed command"):
        flight_client.get_flight_info(flight.FlightDescriptor.for_command(b"\xff\xff\x00garbage"))
    unknown = any_pb2.Any(type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandNope")
    with pytest.raises(pa.ArrowNotImplementedError, match="CommandNope is not supported"):
        flight_client.get_flight_info(
            flight.FlightDescriptor.for_command(unknown.SerializeToString())
        )
    other = any_pb2.Any(type_url="type.googleapis.com/some.other.Message", value=b"x")
    with pytest.raises(pa.ArrowNotImplementedError, match="not a Flight SQL command"):
        flight_client.get_flight_info(
            flight.FlightDescriptor.for_command(other.SerializeToString())
        )
    with pytest.raises(pa.ArrowInvalid, match="command descriptor"):
        flight_client.get_flight_info(flight.FlightDescriptor.for_path("lineitem"))
    with pytest.raises(pa.ArrowNotImplementedError, match="BeginTransaction"):
        list(flight_client.do_action(flight.Action("BeginTransaction", b"")))
    _still_serves(flight_client, duckdb_ref)


def test_stale_and_forged_tickets(
    fsql_cluster: Any, flight_client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    info = flight_client.get_flight_info(statement(CHECK))
    ticket = info.endpoints[0].ticket
    view = ResultView.decode(ticket.ticket)
    assert view is not None
    # A path the job did not write, in a well-formed view: refused here and at the executor.
    forged = ResultView(b"/etc/passwd", view.job, view.partition, view.schema).encode()
    with pytest.raises(pa.ArrowInvalid, match="forged ticket"):
        flight_client.do_get(flight.Ticket(forged)).read_all()
    executor = info.endpoints[0].locations[0].uri.decode()
    with (
        flight.connect(executor) as direct,
        pytest.raises(flight.FlightServerError, match="does not name an output"),
    ):
        direct.do_get(flight.Ticket(forged)).read_all()
    with pytest.raises(pa.ArrowInvalid, match="malformed result ticket"):
        flight_client.do_get(flight.Ticket(b"mangonel-result-view:{not json")).read_all()
    with pytest.raises(pa.ArrowInvalid, match="malformed ticket"):
        flight_client.do_get(flight.Ticket(b"\xff\xfe junk")).read_all()
    stale = pack(sql_pb.TicketStatementQuery(statement_handle=b"old"))
    with pytest.raises(pa.ArrowKeyError, match="stale or forged ticket"):
        flight_client.do_get(flight.Ticket(stale)).read_all()
    # Cancelling the FlightInfo releases its result: its tickets are stale from then on.
    request = sql_pb.CancelFlightInfoRequest(info=info.serialize())
    [answer] = flight_client.do_action(
        flight.Action("CancelFlightInfo", request.SerializeToString())
    )
    status = sql_pb.CancelFlightInfoResult.FromString(answer.body.to_pybytes()).status
    assert status == sql_pb.CANCEL_STATUS_CANCELLED
    with pytest.raises(pa.ArrowKeyError, match="stale or forged ticket"):
        flight_client.do_get(ticket).read_all()
    _still_serves(flight_client, duckdb_ref)


def test_cancelled_call_cancels_the_job(
    fsql_cluster: Any, flight_client: flight.FlightClient, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """A client whose GetFlightInfo gives up (its deadline, its cancel) cancels the job.

    0.3 s is past the job's submission and far inside ``SLOW``."""
    with pytest.raises(flight.FlightTimedOutError):
        flight_client.get_flight_info(statement(SLOW), flight.FlightCallOptions(timeout=0.3))
    with fsql_cluster.connect() as session:

        def cancelled() -> bool:
            jobs = [j for j in session.status().jobs if j.sql == SLOW]
            return bool(jobs) and all(j.state.value == "cancelled" for j in jobs)

        wait_until(cancelled, "the job of the abandoned call is cancelled", timeout=15)
    _still_serves(flight_client, duckdb_ref)


def test_adbc_cancel_cancels_the_job(
    fsql_cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    sql = SLOW + " WHERE a.l_orderkey > 7"  # a job of its own (not the other test's text)
    with adbc_connect(fsql_cluster.flight_sql_url) as conn, conn.cursor() as cur:
        failure: list[BaseException] = []

        def run() -> None:
            try:
                cur.execute(sql)
                cur.fetch_arrow_table()
            except BaseException as exc:  # the cancel ends it: kept for the assert
                failure.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        with fsql_cluster.connect() as session:
            wait_until(lambda: any(j.sql == sql for j in session.status().jobs), "the job started")
            time.sleep(0.3)
            cur.adbc_cancel()
            thread.join(30)
            assert failure, "the cancelled query returned a result"

            def cancelled() -> bool:
                return all(
                    j.state.value == "cancelled" for j in session.status().jobs if j.sql == sql
                )

            wait_until(cancelled, "the job is cancelled", timeout=15)
        with conn.cursor() as again:
            again.execute(CHECK)
            assert_same_result(
                again.fetch_arrow_table(), duckdb_ref.sql(CHECK).to_arrow_table(), ordered=False
            )


def test_close_session_closes_prepared_statements(
    fsql_cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    with flight.connect(fsql_cluster.flight_sql_url) as client:
        # A login gives the client a session of its own, even on an open cluster.
        header = client.authenticate_basic_token("someone", "anything")
        options = flight.FlightCallOptions(headers=[header])
        request = sql_pb.ActionCreatePreparedStatementRequest(query=CHECK)
        [answer] = client.do_action(
            flight.Action("CreatePreparedStatement", pack(request)), options
        )
        result = any_pb2.Any.FromString(answer.body.to_pybytes())
        created = sql_pb.ActionCreatePreparedStatementResult()
        assert result.Unpack(created)
        handle = created.prepared_statement_handle
        assert pa.ipc.read_schema(pa.py_buffer(created.dataset_schema)).names == [
            "r_regionkey",
            "r_name",
        ]
        query = flight.FlightDescriptor.for_command(
            pack(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle))
        )
        info = client.get_flight_info(query, options)
        assert_same_result(
            read_endpoints(info, client), duckdb_ref.sql(CHECK).to_arrow_table(), ordered=False
        )
        # Another session (no login: the anonymous one) may not use the handle.
        with pytest.raises(flight.FlightUnauthorizedError, match="another session"):
            client.get_flight_info(query)
        [closed] = client.do_action(flight.Action("CloseSession", b""), options)
        status = sql_pb.CloseSessionResult.FromString(closed.body.to_pybytes()).status
        assert status == sql_pb.CloseSessionResult.Status.CLOSED
        with pytest.raises(pa.ArrowKeyError, match="unknown prepared statement"):
            client.get_flight_info(query, options)
        with pytest.raises(pa.ArrowKeyError, match="stale or forged ticket"):
            client.do_get(info.endpoints[0].ticket, options).read_all()


def test_results_through_the_scheduler(
    module_dir: Any, tpch_tables: dict[str, Any], duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """``--flight-sql-results scheduler``: endpoints name no executor; answers the same."""
    import mangonel

    with mangonel.LocalCluster(
        executors=1,
        work_dir=str(module_dir / "scheduler-results"),
        partitions=4,
        flight_sql_results="scheduler",
    ) as cluster:
        with cluster.connect() as session:
            for name in ("lineitem", "orders"):
                session.register_parquet(name, str(tpch_tables[name]))
        sql = (
            "SELECT o_orderpriority, count(*) AS n, sum(l_quantity) AS q FROM orders "
            "JOIN lineitem ON l_orderkey = o_orderkey GROUP BY o_orderpriority"
        )
        with flight.connect(cluster.flight_sql_url) as client:
            info = client.get_flight_info(statement(sql))
            assert info.endpoints and all(not e.locations for e in info.endpoints)
        with adbc_connect(cluster.flight_sql_url) as conn, conn.cursor() as cur:
            cur.execute(sql)
            actual = cur.fetch_arrow_table()
        assert_same_result(actual, duckdb_ref.sql(sql).to_arrow_table(), ordered=False)
