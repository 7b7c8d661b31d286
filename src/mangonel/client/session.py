"""The Python API: ``mangonel.connect(address) -> Session``.

>>> with mangonel.connect("127.0.0.1:50050") as session:          # doctest: +SKIP
...     session.register_parquet("lineitem", "/data/lineitem.parquet")
...     session.sql("SELECT count(*) AS n FROM lineitem").to_pandas()

A query is planned on the scheduler, run by the executors, and its result read
straight from the executors' Flight servers, then released on the scheduler.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import grpc
import pyarrow as pa

from mangonel import defaults
from mangonel.client.fetch import FlightPool, ResultUnavailableError, read_result
from mangonel.client.rpc import open_channel, translate, unreachable
from mangonel.client.status import (
    ClusterStatus,
    JobState,
    JobStatus,
    StageStatus,
    TableInfo,
    cluster_from_proto,
    job_from_proto,
    table_from_proto,
)
from mangonel.errors import ClusterError, JobCancelledError, JobFailedError
from mangonel.proto import convert
from mangonel.proto import mangonel_pb2 as pb
from mangonel.proto import mangonel_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = defaults.SCHEDULER_ADDRESS

# When the executor holding a finished result dies before the client reads it,
# the query runs again; this bounds how often.
_RESULT_RETRIES = 2

# How long closing a session waits for result releases still on their way.
_RELEASE_WAIT_S = 5.0


@dataclass(frozen=True)
class Result:
    """A query's answer with a few numbers about how it ran.

    Attributes:
        job_id: The job on the scheduler.
        columns: The result's column names as written in the query (may repeat).
        stages: Per-stage progress at the end: tasks, rows and bytes out, time.
        elapsed_s: Submit to last byte read, seen from the client.
        scheduler_elapsed_s: Submit to job end, seen from the scheduler.
        tasks_rerun: Task attempts that made no output (failed, lost with their
            executor, could not fetch their input) and were run again.
        outputs_recomputed: Finished outputs that were lost (with their
            executor, or their file went missing or bad) and were made again.
    """

    job_id: str
    columns: tuple[str, ...]
    table: pa.Table
    stages: tuple[StageStatus, ...]
    elapsed_s: float
    scheduler_elapsed_s: float
    tasks_rerun: int = 0
    outputs_recomputed: int = 0

    def to_arrow(self) -> pa.Table:
        return self.table

    def to_pandas(self) -> pd.DataFrame:
        return self.table.to_pandas()

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)


class Session:
    """A connection to a scheduler. Use ``mangonel.connect`` to make one.

    Args:
        address: ``host:port`` of the scheduler, or of every scheduler of a
            highly available group, comma-separated (only the leader answers).
        timeout_s: Limit on each unary call (not on a query's run time).
        reconnect_s: Once a scheduler answered, how long to keep trying when
            none does (it restarts, or the standby takes over): a waiting
            query watches its job again on the scheduler that answers. A
            scheduler never reached at all is an error at once.
    """

    def __init__(
        self, address: str = DEFAULT_ADDRESS, timeout_s: float = 60.0, reconnect_s: float = 60.0
    ) -> None:
        self.addresses = [a.strip() for a in address.split(",") if a.strip()] or [DEFAULT_ADDRESS]
        self._timeout_s = timeout_s
        self._reconnect_s = reconnect_s
        self._channels = [open_channel(a) for a in self.addresses]
        self._stubs = [pb_grpc.QueryServiceStub(c) for c in self._channels]  # type: ignore[no-untyped-call]
        self._current = 0
        self._answered = False
        self._flight = FlightPool()
        self._releases: list[grpc.Future] = []
        """ReleaseResult calls on their way: a query returns without waiting for them."""

    @property
    def address(self) -> str:
        """The scheduler this session talks to now."""
        return self.addresses[self._current]

    @property
    def _stub(self) -> pb_grpc.QueryServiceStub:
        return self._stubs[self._current]

    # ------------------------------------------------------------------ plumbing

    def _call(self, method: str, request: object) -> object:
        deadline: float | None = None
        while True:
            try:
                reply = getattr(self._stub, method)(request, timeout=self._timeout_s)
                self._answered = True
                return reply
            except grpc.RpcError as err:
                deadline = self._next_scheduler(err, deadline)

    def _next_scheduler(
        self, err: grpc.RpcError, deadline: float | None, gone: tuple[grpc.StatusCode, ...] = ()
    ) -> float:
        """After ``err``, move to the next scheduler and return the deadline to give up at.

        Raises the error itself unless it says the scheduler is unreachable (or
        its code is in ``gone``), and ``ClusterError`` once no scheduler
        answered for ``reconnect_s`` (at once when none ever answered this
        session).
        """
        code = err.code() if isinstance(err, grpc.Call) else None
        if code is not grpc.StatusCode.UNAVAILABLE and code not in gone:
            raise translate(err, self.address) from None
        now = time.monotonic()
        if deadline is None:
            deadline = now + (self._reconnect_s if self._answered else 0.0)
        failed = self.address
        self._current = (self._current + 1) % len(self.addresses)
        if self._current == 0 and now >= deadline:
            if len(self.addresses) == 1:
                raise translate(err, failed) from None
            raise ClusterError(
                f"cannot reach any scheduler of {', '.join(self.addresses)}; are they running?"
            ) from None
        if self._current == 0:
            time.sleep(0.2)  # a full round failed: the leader may be restarting
        return deadline

    def close(self) -> None:
        self._flight.close()
        deadline = time.monotonic() + _RELEASE_WAIT_S
        for future in self._releases:
            # Closing the channel would cancel a release still on its way, and the
            # result's files would wait for their time-to-live.
            # A failure was logged by its callback; the files expire on their own.
            with contextlib.suppress(
                grpc.RpcError, grpc.FutureTimeoutError, grpc.FutureCancelledError
            ):
                future.result(timeout=max(0.0, deadline - time.monotonic()))
        self._releases.clear()
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------- catalog

    def register_parquet(self, name: str, path: str) -> TableInfo:
        """Register Parquet data (a file, a directory or a glob) as table ``name``.

        The path is read by the scheduler and the executors, not by this process.

        Raises:
            CatalogError: the path is missing or not Parquet, or the name is invalid.
        """
        msg = self._call("RegisterTable", pb.RegisterTableRequest(name=name, path=path))
        assert isinstance(msg, pb.TableInfo)
        return table_from_proto(msg)

    def drop_table(self, name: str) -> None:
        self._call("DropTable", pb.DropTableRequest(name=name))

    def tables(self) -> list[TableInfo]:
        msg = self._call("ListTables", pb.ListTablesRequest())
        assert isinstance(msg, pb.ListTablesResponse)
        return [table_from_proto(t) for t in msg.tables]

    # ------------------------------------------------------------------- queries

    def explain(self, text: str, dialect: str | None = None) -> str:
        """The distributed plan of a query, as text."""
        msg = self._call("Explain", pb.ExplainRequest(sql=text, dialect=dialect or ""))
        assert isinstance(msg, pb.ExplainResponse)
        return str(msg.text)

    def submit(self, text: str, dialect: str | None = None) -> str:
        """Start a query and return its job id at once (see ``wait``).

        Raises:
            QueryError: (a subclass) the query cannot run as written.
        """
        # One id for every retry of this submission (``_call`` retries when the
        # scheduler restarts or fails over): it never starts the query twice.
        request = pb.SubmitRequest(sql=text, dialect=dialect or "", request_id=secrets.token_hex(8))
        msg = self._call("Submit", request)
        assert isinstance(msg, pb.SubmitResponse)
        return str(msg.job_id)

    def sql(
        self,
        text: str,
        dialect: str | None = None,
        on_progress: Callable[[JobStatus], None] | None = None,
    ) -> Result:
        """Run a query and return its whole result.

        Args:
            text: One SELECT statement.
            dialect: A sqlglot dialect name; DuckDB's when ``None``.
            on_progress: Called with each progress update of the job.

        Raises:
            QueryError: (a subclass) the query cannot run as written.
            JobFailedError: it failed while running; ``JobCancelledError`` if cancelled.
            ClusterError: the scheduler or the executors cannot be reached.
        """
        start = time.monotonic()
        # Imported here: the planner pulls in sqlglot, and every process that
        # imports ``mangonel`` (executors too) would pay for it at start.
        from mangonel.plan.planner import is_explain

        if is_explain(text):
            # EXPLAIN SELECT ...: the plan as a one-column result, one row per line.
            lines = self.explain(text, dialect).splitlines()
            table = pa.table({"explain": pa.array(lines, pa.string())})
            return Result("", ("explain",), table, (), time.monotonic() - start, 0.0)
        for attempt in range(_RESULT_RETRIES + 1):
            job_id = self.submit(text, dialect)
            try:
                return self.wait(job_id, on_progress, started=start)
            except ResultUnavailableError as exc:
                if attempt == _RESULT_RETRIES:
                    raise ClusterError(
                        f"the result of job {job_id} was lost before it could be read "
                        f"({exc}); run the query again"
                    ) from exc
                log.warning("result of job %s lost (%s); running the query again", job_id, exc)
        raise AssertionError("unreachable")

    def wait(
        self,
        job_id: str,
        on_progress: Callable[[JobStatus], None] | None = None,
        started: float | None = None,
    ) -> Result:
        """Wait for a submitted job and read its result.

        Raises:
            JobFailedError: it failed; ``JobCancelledError`` if it was cancelled.
            ResultUnavailableError: the executor holding the result is gone.
        """
        start = time.monotonic() if started is None else started
        final = self._watch(job_id, on_progress)
        status = job_from_proto(final)
        if status.state is JobState.CANCELLED:
            raise JobCancelledError(status.error or f"job {job_id} was cancelled")
        if status.state is not JobState.SUCCEEDED:
            raise JobFailedError(status.error or f"job {job_id} failed")
        locations = tuple(convert.partition_location_from_proto(m) for m in final.result)
        table = read_result(self._flight, locations, status.columns)
        self._release(job_id)
        return Result(
            job_id=job_id,
            columns=status.columns,
            table=table,
            stages=status.stages,
            elapsed_s=time.monotonic() - start,
            scheduler_elapsed_s=status.elapsed_s,
            tasks_rerun=status.tasks_rerun,
            outputs_recomputed=status.outputs_recomputed,
        )

    def _release(self, job_id: str) -> None:
        """Tell the scheduler the result was read, without waiting for its answer (a
        round trip of 1 to 2 ms a query): its files go; a lost call only leaves them
        to expire after the scheduler's ``--result-ttl``."""
        self._releases = [f for f in self._releases if not f.done()]
        try:
            future = self._stub.ReleaseResult.future(
                pb.ReleaseResultRequest(job_id=job_id), timeout=self._timeout_s
            )
        except grpc.RpcError:
            log.warning("could not release the result of job %s; it expires on its own", job_id)
            return

        def done(f: grpc.Future) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.warning(
                    "could not release the result of job %s (%s); it expires on its own",
                    job_id,
                    f.exception(),
                )

        future.add_done_callback(done)
        self._releases.append(future)

    def _watch(self, job_id: str, on_progress: Callable[[JobStatus], None] | None) -> pb.JobStatus:
        """Follow the job to its end; across a scheduler restart or failover too."""
        deadline: float | None = None
        while True:
            final: pb.JobStatus | None = None
            try:
                for msg in self._stub.WatchJob(pb.WatchJobRequest(job_id=job_id)):
                    self._answered, deadline = True, None
                    if on_progress is not None:
                        on_progress(job_from_proto(msg))
                    if msg.state not in (pb.JOB_STATE_RUNNING, pb.JOB_STATE_UNSPECIFIED):
                        final = msg
            except grpc.RpcError as err:
                if final is not None:
                    return final
                # A scheduler that stops cancels its streams: it went away too.
                deadline = self._next_scheduler(err, deadline, (grpc.StatusCode.CANCELLED,))
                log.info("watching job %s again on the scheduler at %s", job_id, self.address)
                continue
            if final is None:
                # The stream ended without an end state: the scheduler stopped.
                if deadline is None:
                    deadline = time.monotonic() + self._reconnect_s
                if time.monotonic() >= deadline:
                    raise unreachable(self.address)
                time.sleep(0.2)
                continue
            return final

    def cancel(self, job_id: str) -> bool:
        """Cancel a job; False when it had finished already."""
        msg = self._call("CancelJob", pb.CancelJobRequest(job_id=job_id))
        assert isinstance(msg, pb.CancelJobResponse)
        return bool(msg.cancelled)

    def status(self) -> ClusterStatus:
        """Executors (alive, draining, lost: since when and why) and jobs."""
        msg = self._call("ClusterStatus", pb.ClusterStatusRequest())
        assert isinstance(msg, pb.ClusterStatusResponse)
        return cluster_from_proto(msg)


def connect(
    address: str = DEFAULT_ADDRESS, timeout_s: float = 60.0, reconnect_s: float = 60.0
) -> Session:
    """A session with the scheduler at ``address`` (``host:port``, or several comma-separated).

    The connection opens on the first call; an unreachable scheduler raises
    ``ClusterError`` there. Later, a scheduler that restarts or fails over is
    waited for up to ``reconnect_s``: a running query just takes longer.
    """
    return Session(address, timeout_s, reconnect_s)
