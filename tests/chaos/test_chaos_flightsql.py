"""The seed scenario through Flight SQL: executors die, the ADBC client gets DuckDB's answer.

* mid-query: the first executor to start a task of the first reduce stage is
  SIGKILLed there while the ADBC driver waits on ``GetFlightInfo``; the job re-runs
  the task elsewhere and the client reads the correct answer (``FlightInfo`` comes
  only once the job is done, so the client never sees the loss);
* after the ``FlightInfo``: the executor holding a result partition is killed
  before the client read it. Its ``DoGet`` fails with ``UNAVAILABLE`` at the executor
  and at the scheduler (the fallback location) with a message that says to execute
  the statement again, and executing it again runs the query again: correct answer.
"""

from __future__ import annotations

import signal
from typing import Any

import pyarrow.flight as flight
import pytest
from chaos_support import (
    ChaosCluster,
    FirstToReach,
    freeze_rule,
    kill,
    wait_exit,
)
from google.protobuf import any_pb2
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query

from mangonel.proto import flightsql_pb2 as sql_pb

pytestmark = pytest.mark.timeout(120)

QUERIES = (3, 9, 18)


def _adbc(chaos: ChaosCluster) -> Any:
    import adbc_driver_flightsql.dbapi

    return adbc_driver_flightsql.dbapi.connect(chaos.cluster.flight_sql_url, autocommit=True)


def _adbc_answer(chaos: ChaosCluster, number: int) -> Any:
    with _adbc(chaos) as conn, conn.cursor() as cur:
        cur.execute(tpch_query(number))
        return cur.fetch_arrow_table()


def _check(chaos: ChaosCluster, number: int, actual: Any) -> None:
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(actual, chaos.expected(number), ordered=bool(order_by), order_by=order_by)


def _statement(sql: str) -> flight.FlightDescriptor:
    packed = any_pb2.Any()
    packed.Pack(sql_pb.CommandStatementQuery(query=sql), type_url_prefix="type.googleapis.com/")
    return flight.FlightDescriptor.for_command(packed.SerializeToString())


@pytest.mark.parametrize("number", QUERIES, ids=[f"q{n:02d}" for n in QUERIES])
def test_adbc_query_survives_executor_killed_mid_query(number: int, healthy: ChaosCluster) -> None:
    chaos = healthy
    reducer = chaos.points(number).first_reader
    before = {j.job_id for j in chaos.session.status().jobs}

    with FirstToReach(chaos, freeze_rule("task_started", stage=reducer), kill) as point:
        actual = _adbc_answer(chaos, number)

    _check(chaos, number, actual)
    hit = point.require_hit()
    wait_exit(hit.handle, timeout=5)
    assert hit.handle.process.returncode == -signal.SIGKILL
    assert hit.executor_id is not None
    chaos.wait_lost(hit.executor_id)
    jobs = [j for j in chaos.session.status().jobs if j.job_id not in before]
    assert len(jobs) == 1, jobs  # recovered inside the job: no re-run of the query
    # The task the victim had started ran again elsewhere.
    assert sum(s.tasks_rerun for s in jobs[0].stages if s.stage == reducer) > 0, jobs[0].stages


def test_result_lost_before_it_was_read(healthy: ChaosCluster) -> None:
    chaos = healthy
    number = 18
    sql = tpch_query(number)
    with flight.connect(chaos.cluster.flight_sql_url) as scheduler:
        info = scheduler.get_flight_info(_statement(sql))
        endpoint = info.endpoints[0]
        executor_url = endpoint.locations[0].uri.decode()
        address = executor_url.removeprefix("grpc://")
        victim = next(e for e in chaos.registered() if e.flight_address == address)
        handle = chaos.handle_of(victim.pid)
        handle.signal(signal.SIGKILL)
        wait_exit(handle, timeout=5)
        chaos.wait_lost(victim.id)
        chaos.spent.add(handle.pid)

        with flight.connect(executor_url) as direct, pytest.raises(flight.FlightUnavailableError):
            direct.do_get(endpoint.ticket).read_all()
        with pytest.raises(flight.FlightUnavailableError) as refused:
            scheduler.do_get(endpoint.ticket).read_all()
        message = str(refused.value)
        assert "was lost before it was read" in message, message
        assert "execute the statement again" in message, message

    # Executing the statement again runs the query again, on the executors left.
    _check(chaos, number, _adbc_answer(chaos, number))
