"""PollFlightInfo: a long query's progress while it runs, its result once done, a cancel.

The ADBC driver polls when its statement executes incrementally
(``adbc.statement.exec.incremental``); a plain gRPC client shows the protocol itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import duckdb
import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_manager import StatementOptions
from fsql_support import adbc_connect, own_channel, raw_status, read_endpoints, statement
from helpers import assert_same_result, wait_until

from mangonel.proto import flightsql_pb2 as sql_pb

# Minutes of work (lineitem joined with itself on a key of three values): it is
# still running whenever the test looks, until the test cancels it.
SLOW = (
    "SELECT sum(a.l_quantity * b.l_quantity) AS s FROM lineitem a "
    "JOIN lineitem b ON a.l_returnflag = b.l_returnflag WHERE a.l_orderkey > 13"
)
JOIN = (
    "SELECT o_orderpriority, count(*) AS n, sum(l_quantity) AS q FROM orders "
    "JOIN lineitem ON l_orderkey = o_orderkey GROUP BY o_orderpriority"
)


@pytest.fixture
def channel(fsql_cluster: Any) -> Iterator[grpc.Channel]:
    """One connection: a client that never logged in has it for its session."""
    with own_channel(fsql_cluster.flight_sql_url) as chan:
        yield chan


def _poll(channel: grpc.Channel, descriptor: flight.FlightDescriptor) -> sql_pb.PollInfo:
    path = "/arrow.flight.protocol.FlightService/PollFlightInfo"
    return sql_pb.PollInfo.FromString(channel.unary_unary(path)(descriptor.serialize()))


def test_a_running_query_is_polled_to_its_result(
    channel: grpc.Channel,
    flight_client: flight.FlightClient,
    duckdb_ref: duckdb.DuckDBPyConnection,
) -> None:
    first = _poll(channel, statement(JOIN))
    answers = [first]
    while answers[-1].flight_descriptor:
        again = flight.FlightDescriptor.deserialize(answers[-1].flight_descriptor)
        answers.append(_poll(channel, again))
    # The first answer comes before the job is done: no endpoint yet, where to poll next.
    assert first.flight_descriptor
    assert flight.FlightInfo.deserialize(first.info).endpoints == []
    progress = [a.progress for a in answers]
    assert all(0.0 <= p < 1.0 for p in progress[:-1]) and progress[-1] == 1.0
    assert progress == sorted(progress)
    info = flight.FlightInfo.deserialize(answers[-1].info)
    assert info.descriptor == statement(JOIN)
    actual = read_endpoints(info, flight_client)
    assert_same_result(actual, duckdb_ref.sql(JOIN).to_arrow_table(), ordered=False)


def test_cancelling_a_polled_query_cancels_its_job(
    fsql_cluster: Any, channel: grpc.Channel
) -> None:
    answer = _poll(channel, statement(SLOW))
    try:
        _cancel_while_polled(fsql_cluster, channel, answer)
    finally:  # it would keep the executors busy for minutes
        with fsql_cluster.connect() as session:
            for job in session.status().jobs:
                if job.sql == SLOW:
                    session.cancel(job.job_id)  # a finished job stays as it is


def _cancel_while_polled(fsql_cluster: Any, channel: grpc.Channel, answer: Any) -> None:
    assert answer.flight_descriptor and 0.0 <= answer.progress < 1.0
    again = flight.FlightDescriptor.deserialize(answer.flight_descriptor)
    assert _poll(channel, again).flight_descriptor  # minutes from done
    # Another session may neither poll it nor cancel it.
    code, _ = raw_status(fsql_cluster.flight_sql_url, "PollFlightInfo", answer.flight_descriptor)
    assert code.name == "PERMISSION_DENIED"
    request = sql_pb.CancelFlightInfoRequest(info=answer.info)
    cancel = channel.unary_stream("/arrow.flight.protocol.FlightService/DoAction")
    action = sql_pb.Action(type="CancelFlightInfo", body=request.SerializeToString())
    [result] = cancel(action.SerializeToString())
    outcome = sql_pb.CancelFlightInfoResult.FromString(sql_pb.Result.FromString(result).body)
    assert outcome.status == sql_pb.CANCEL_STATUS_CANCELLED
    with fsql_cluster.connect() as session:

        def cancelled() -> bool:
            jobs = [j for j in session.status().jobs if j.sql == SLOW]
            return bool(jobs) and all(j.state.value == "cancelled" for j in jobs)

        wait_until(cancelled, "the polled job is cancelled", timeout=15)
    with pytest.raises(grpc.RpcError) as gone:
        _poll(channel, again)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert gone.value.details().startswith("unknown query to poll")  # type: ignore[attr-defined]


def test_adbc_executes_incrementally(
    fsql_cluster: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    """The driver polls until the result is there, and reports the progress it read."""
    with adbc_connect(fsql_cluster.flight_sql_url) as conn, conn.cursor() as cur:
        cur.adbc_statement.set_options(**{StatementOptions.INCREMENTAL.value: "true"})
        seen: list[float] = []
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.02):
                seen.append(cur.adbc_statement.get_option_float(StatementOptions.PROGRESS.value))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            partitions, schema = cur.adbc_execute_partitions(JOIN)
            last, _ = cur.adbc_execute_partitions(JOIN)  # none: the query is complete
        finally:
            done.set()
            watcher.join()
        assert partitions and last == []
        assert schema.names == ["o_orderpriority", "n", "q"]
        tables = []
        for partition in partitions:
            cur.adbc_read_partition(partition)
            tables.append(cur.fetch_arrow_table())
    assert all(0.0 <= p <= 1.0 for p in seen)
    actual = pa.concat_tables(tables)
    assert_same_result(actual, duckdb_ref.sql(JOIN).to_arrow_table(), ordered=False)
