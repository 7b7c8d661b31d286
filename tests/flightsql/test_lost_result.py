"""A result lost between the job's end and its ``FlightInfo``: the query runs again.

The window is milliseconds wide on a real cluster, so the server runs here on a stand-in
core whose first job's result sits on an executor that is gone (nothing listens at its
address) and whose second job's result sits on a stand-in executor's Flight server.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from fsql_support import statement

from mangonel.ids import ExecutorId, StageId
from mangonel.scheduler.flightsql import FlightSqlServer
from mangonel.scheduler.jobs import JobEnd
from mangonel.scheduler.state_views import JobState
from mangonel.task import PartitionLocation

PARTITION = pa.table({"c0": ["a", "b"], "c1": [1, 2], "__sort_key": [9, 8]})


class StandInExecutor(flight.FlightServerBase):  # type: ignore[misc]
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        assert ticket.ticket == b"/work/part-0"
        return flight.RecordBatchStream(PARTITION)


def _location(address: str) -> PartitionLocation:
    return PartitionLocation(
        ExecutorId("exec-1"), "h", address, StageId(2), 0, 0, "/work/part-0", 2, 100, "0"
    )


class FinishedJob(SimpleNamespace):
    """A stand-in job that succeeded, as the server's waits read one (``JobWatch``)."""

    def wait_finished(self, timeout: float) -> bool:
        return True

    def outcome(self) -> JobEnd:
        return JobEnd(JobState.SUCCEEDED, "", "")


class StandInCore:
    """Two finished jobs in turn: the first one's executor is gone."""

    def __init__(self, live_address: str) -> None:
        self.addresses = ["127.0.0.1:1", live_address]
        self.submitted: list[str] = []

    def submit(
        self,
        sql: str,
        dialect: str | None = None,
        request_id: str = "",
        owner: str = "anonymous",
        may_write: bool = True,
    ) -> Any:
        address = self.addresses[len(self.submitted)]
        self.submitted.append(sql)
        return FinishedJob(
            id=f"job{len(self.submitted)}",
            sql=sql,
            result=(_location(address),),
            plan=SimpleNamespace(columns=("name", "n")),
        )

    def executors(self) -> list[Any]:
        return []

    def job(self, job: str) -> Any:
        return None


@pytest.fixture
def servers() -> Iterator[tuple[FlightSqlServer, StandInCore]]:
    executor = StandInExecutor("grpc://127.0.0.1:0")
    core = StandInCore(f"127.0.0.1:{executor.port}")
    server = FlightSqlServer(core, results="scheduler")  # type: ignore[arg-type]
    yield server, core
    server.shutdown()
    executor.shutdown()


def test_a_result_lost_before_its_flight_info_runs_the_query_again(
    servers: tuple[FlightSqlServer, StandInCore],
) -> None:
    server, core = servers
    with flight.connect(server.url) as client:
        info = client.get_flight_info(statement("SELECT name, n FROM t"))
        assert core.submitted == ["SELECT name, n FROM t"] * 2
        assert [loc for e in info.endpoints for loc in e.locations] == []
        table = client.do_get(info.endpoints[0].ticket).read_all()
    # The second run's partition, as the result: user names, helper column dropped.
    assert table.schema == info.schema
    assert table.to_pylist() == [{"name": "a", "n": 1}, {"name": "b", "n": 2}]
