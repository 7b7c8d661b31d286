"""The Python API: ``mangonel.connect(address) -> Session``.

Over 600 lines because a ``Session`` is one conversation with the scheduler
whose every call shares the same retry, deadline and login machinery; what
stands alone lives beside it (``retry``, ``status``, ``dbapi``, the CLI).

>>> with mangonel.connect("127.0.0.1:50050") as session:          # doctest: +SKIP
...     session.register_parquet("lineitem", "/data/lineitem.parquet")
...     session.sql("SELECT count(*) AS n FROM lineitem").to_pandas()

A query is planned on the scheduler, run by the executors, and its result read
straight from the executors' Flight servers, then released on the scheduler.

A query in flight outlives a broken or silently cut network, the client's own
link included. Its submission carries a request id, so a resubmission finds
the same job; the job's watch reconnects and picks the job up where it is; a
result partition whose executor cannot be reached is read again while the
scheduler still counts that executor alive (the result waits for the client
until ``--result-ttl``). Pings under every call (``keepalive_s``) turn a silent
link into an error within seconds. How long all this goes on is the caller's
choice: the query's ``timeout_s`` (then ``QueryTimeoutError``), else
``reconnect_s`` without an answer (then ``ClusterError``).

A scheduler never reached yet that refuses connections (it is starting or
restarting, its standby is taking over) or does not answer them is waited for
up to ``connect_wait_s``, with growing pauses (``client.retry``); a submission
made meanwhile keeps its request id, so it runs once.

On a scheduler with users, a session logs in once (``user`` and ``password``:
the ``Authenticate`` call) or holds a ``token``, and sends the token with every
call (``authorization: Bearer``). A session with the password logs in again
shortly before its token expires, and at once when the scheduler refuses the
token (a restarted scheduler with a new secret); one with a token alone gets
``AuthenticationError`` once it expires.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import grpc
import pyarrow as pa

from mangonel import defaults
from mangonel.client import retry
from mangonel.client.fetch import (
    FlightPool,
    ResultUnavailableError,
    assemble_result,
    carried_partition,
)
from mangonel.client.rpc import (
    DEFAULT_KEEPALIVE_S,
    BearerToken,
    error_name,
    keepalive_options,
    open_channel,
    translate,
    unreachable,
)
from mangonel.client.status import (
    ClusterStatus,
    JobState,
    JobStatus,
    StageStatus,
    TableInfo,
    UnreadableTableInfo,
    cluster_from_proto,
    job_from_proto,
    table_from_proto,
)
from mangonel.errors import (
    ClusterError,
    JobCancelledError,
    MangonelError,
    QueryTimeoutError,
    job_failure,
)
from mangonel.proto import convert
from mangonel.proto import mangonel_pb2 as pb
from mangonel.proto import mangonel_pb2_grpc as pb_grpc
from mangonel.security.options import SecurityOptions
from mangonel.security.tls import TlsMaterial
from mangonel.sql.explain import is_explain
from mangonel.task import PartitionLocation

if TYPE_CHECKING:
    import pandas as pd

    from mangonel.sql.ddl import CreateExternalTable

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = defaults.SCHEDULER_ADDRESS

# How long closing a session waits for result releases still on their way.
_RELEASE_WAIT_S = 5.0

# After a result partition could not be read: the first pause before reading it
# again, doubled up to the last. A cut link heals in seconds or not soon.
_FETCH_RETRY_FIRST_S = 0.2
_FETCH_RETRY_MAX_S = 2.0

# Asking the scheduler whether an unreachable executor is lost: a scheduler that
# cannot say within this is unreachable too (the client's own link is cut), and
# the read is tried again.
_STATUS_CHECK_S = 5.0
# Cancelling a job whose deadline passed: best effort, the caller waits no longer.
_CANCEL_WAIT_S = 2.0


# A token is renewed (with the password) once this share of its lifetime is over.
_RENEW_AT = 0.9

_LOGIN_METHOD = "/mangonel.v1.QueryService/Authenticate"


class _Login:
    """A session's credentials and its current token (thread-safe enough: a token is
    replaced whole, and two threads that both log in again get two valid tokens)."""

    def __init__(self, user: str | None, password: str | None, token: str | None) -> None:
        if password is not None and not user:
            raise ValueError("a password needs a user name (user=...)")
        if user and password is None and token is None:
            raise ValueError(f"user {user!r} needs a password (password=...) or a token")
        self.user = user
        self.password = password
        self.token = token or None
        self.renew_at: float | None = None
        """``time.monotonic()`` after which the token is renewed before a call."""
        self.logged_in = False

    @property
    def can_log_in(self) -> bool:
        return bool(self.user) and self.password is not None

    def due(self) -> bool:
        """Whether a login is due before the next call."""
        if not self.can_log_in:
            return False
        # An unsecured scheduler answers a login with no token: logged in all the same.
        return not self.logged_in or (
            self.renew_at is not None and time.monotonic() >= self.renew_at
        )

    def token_for(self, method: str) -> str | None:
        return None if method == _LOGIN_METHOD else self.token


def _why(err: grpc.RpcError) -> str:
    if not isinstance(err, grpc.Call):
        return str(err)
    return f"{err.code().name}: {err.details()}"


class _Deadline:
    """When a query must be done by (``time.monotonic``), or never (``at is None``)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.at = None if timeout_s is None else time.monotonic() + timeout_s

    def left(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def cap(self, seconds: float) -> float:
        left = self.left()
        return seconds if left is None else min(seconds, left)

    def check(self, where: str) -> None:
        """Raise ``QueryTimeoutError`` (saying ``where`` the query stood) once passed."""
        if self.at is not None and time.monotonic() >= self.at:
            raise QueryTimeoutError(
                f"the query did not finish within its timeout of {self.timeout_s:g} s: {where}"
            )


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
        answer_lost: A statement that took effect (a write committed, a table
            dropped) whose answer could not be read afterwards (the executor
            holding it was lost, and a restarted scheduler no longer had a copy):
            its rows are NULL (a write's count is unknown, as Flight SQL's -1
            says), and the statement was not run again.
    """

    job_id: str
    columns: tuple[str, ...]
    table: pa.Table
    stages: tuple[StageStatus, ...]
    elapsed_s: float
    scheduler_elapsed_s: float
    tasks_rerun: int = 0
    outputs_recomputed: int = 0
    answer_lost: bool = False

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
        timeout_s: Limit on each unary call and each result partition's read
            (not on a query's run time).
        reconnect_s: Once a scheduler answered, how long to keep trying when
            none does (it restarts, the standby takes over, or the network
            between is cut): a waiting query watches its job again on the
            scheduler that answers. A query with a timeout keeps trying until
            its timeout instead.
        query_timeout_s: The default ``timeout_s`` of ``sql``: the most a query
            may take, from submission to its last byte read; ``None``: no limit.
        keepalive_s: Ping the scheduler and executors this often during a call
            (a ping unanswered for half as long fails it): how soon a silently
            cut link is noticed and the call tried again.
        security: A secured cluster's CA, all a client holds
            (``SecurityOptions(tls_ca=FILE)``, or ``SecurityOptions.from_tls_dir(DIR,
            "client")`` for ``DIR/client`` of ``mangonel certs init DIR``); ``None``:
            plaintext. A client proves who it is with ``user`` and ``password`` or
            ``token``, never with a certificate.
        user: Log in as this user (with ``password``) on a scheduler with users.
        password: ``user``'s password; kept to log in again when the token expires.
        token: A bearer token (``mangonel users token``, or another session's)
            instead of a user name and password.
        connect_wait_s: Before any scheduler answered this session, how long
            to keep trying one that refuses connections, whose name does not
            resolve yet (it is starting, restarting, or its standby is taking
            over), or that takes connections but does not answer (frozen); 0:
            an error at once. A failure waiting does not mend (a TLS mismatch)
            is an error once it has gone on for ``retry.SETUP_ERROR_S``, and an answer (a
            ``QueryError``, a refused login) is never tried again. A query's
            timeout bounds the wait too.
        on_wait: Called once with a line to show (whom the session waits for,
            how long, and why) when it starts such a wait; ``None``: logged.

    Raises:
        ValueError: a password without a user, or a user without a password or token.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        timeout_s: float = 60.0,
        reconnect_s: float = defaults.RECONNECT_S,
        query_timeout_s: float | None = None,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        security: SecurityOptions | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        connect_wait_s: float = defaults.CONNECT_WAIT_S,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.addresses = [a.strip() for a in address.split(",") if a.strip()] or [DEFAULT_ADDRESS]
        self._timeout_s = timeout_s
        self._reconnect_s = reconnect_s
        self._connect_wait_s = connect_wait_s
        self._on_wait = on_wait
        self._query_timeout_s = query_timeout_s
        tls_material = TlsMaterial.load(security)
        self._tls = tls_material is not None
        self._login = _Login(user, password, token)
        self.user: str | None = user
        """Whom the scheduler took this session for (after the first login)."""
        self.admin = False
        self._channels = [open_channel(a, keepalive_s, tls_material) for a in self.addresses]
        bearer = BearerToken(self._login.token_for)
        self._stubs = [
            pb_grpc.QueryServiceStub(grpc.intercept_channel(c, bearer))  # type: ignore[no-untyped-call]
            for c in self._channels
        ]
        self._current = 0
        self._answered = False
        self._session_key = secrets.token_urlsafe(24)
        """Proves to executors that a result is this session's (``security.tickets``):
        it heads each submission's request id, and goes with each result read."""
        self._flight = FlightPool(
            timeout_s, keepalive_options(keepalive_s), tls_material, self._session_key
        )
        self._releases: list[grpc.Future] = []
        """ReleaseResult calls on their way: a query returns without waiting for them."""

    @property
    def token(self) -> str | None:
        """The bearer token this session sends (``None`` before a login, or without
        users); the web API (``Authorization: Bearer``) takes it too."""
        return self._login.token

    @property
    def address(self) -> str:
        """The scheduler this session talks to now."""
        return self.addresses[self._current]

    @property
    def _stub(self) -> pb_grpc.QueryServiceStub:
        return self._stubs[self._current]

    # ------------------------------------------------------------------ plumbing

    def _call(self, method: str, request: object, deadline: _Deadline | None = None) -> object:
        """One unary call, tried again on the next scheduler while none answers.

        With ``deadline`` (a query's calls, all idempotent) a call that timed out
        is tried again too, and trying ends at the deadline. A session with a
        password logs in first when due, and again once if the token is refused.
        """
        trying: retry.Trying | None = None
        logged_in_again = False
        if method != "Authenticate" and self._login.due():
            self.log_in()
        while True:
            timeout = self._timeout_s if deadline is None else deadline.cap(self._timeout_s)
            try:
                reply = getattr(self._stub, method)(request, timeout=max(0.001, timeout))
                self._answered = True
                return reply
            except grpc.RpcError as err:
                if method != "Authenticate" and not logged_in_again and self._refused(err):
                    logged_in_again = True
                    continue
                trying = self._next_scheduler(err, trying, deadline=deadline)

    def _refused(self, err: grpc.RpcError) -> bool:
        """Whether ``err`` refused our token and a new login got another (try again)."""
        code = err.code() if isinstance(err, grpc.Call) else None
        if code is not grpc.StatusCode.UNAUTHENTICATED or not self._login.can_log_in:
            return False
        log.info("the scheduler refused the token (%s); logging in again", _why(err))
        self.log_in()
        return True

    def log_in(self) -> None:
        """Log in with the session's user name and password for a new token.

        Called on the first call that needs it; call it to check credentials early.

        Raises:
            AuthenticationError: the scheduler refused the user name or password.
            ValueError: the session has no password to log in with.
        """
        if not self._login.can_log_in:
            raise ValueError("this session has no user name and password to log in with")
        request = pb.AuthenticateRequest(user=self._login.user, password=self._login.password)
        msg = self._call("Authenticate", request)
        assert isinstance(msg, pb.AuthenticateResponse)
        self._login.token = msg.token or None
        self._login.logged_in = True
        self._login.renew_at = (
            time.monotonic() + _RENEW_AT * msg.expires_in_s if msg.expires_in_s > 0 else None
        )
        self.user, self.admin = msg.user, msg.admin

    def _next_scheduler(
        self,
        err: grpc.RpcError,
        trying: retry.Trying | None,
        gone: tuple[grpc.StatusCode, ...] = (),
        deadline: _Deadline | None = None,
    ) -> retry.Trying:
        """After ``err``, move to the next scheduler (pausing after a full round of
        them) and return the stretch of trying that ``err`` is part of.

        Raises the error itself unless it says the scheduler is unavailable (or
        its code is in ``gone``, or it timed out under a query's ``deadline``);
        ``ClusterError`` once no scheduler answered for ``reconnect_s``, or,
        before any answered this session, once they refused connections for
        ``connect_wait_s`` (after ``retry.SETUP_ERROR_S`` of failures that
        waiting does not mend: ``retry.Trying.note``);
        ``QueryTimeoutError`` once the query's deadline passed.
        """
        code = err.code() if isinstance(err, grpc.Call) else None
        unavailable = code is grpc.StatusCode.UNAVAILABLE
        if unavailable and error_name(err):
            # A scheduler said it is unavailable (it lost its state store and stops):
            # it answered, so the session waits for it, or the leader, as for a restart.
            self._answered = True
        again = unavailable or code in gone
        if deadline is not None and code is grpc.StatusCode.DEADLINE_EXCEEDED:
            again = True  # a silent link, or the query's deadline: see below
        if not again:
            raise translate(err, self.address, self._tls) from None
        if deadline is not None:
            deadline.check(f"the scheduler at {self.address} did not answer")
        now = time.monotonic()
        if trying is None:
            trying = retry.Trying(now, self._give_up_at(now, deadline))
        if not self._answered:
            details = (err.details() if isinstance(err, grpc.Call) else None) or ""
            trying.note(retry.absent_reason(details) if unavailable else None, now)
        failed = self.address
        self._current = (self._current + 1) % len(self.addresses)
        if self._current != 0:
            return trying  # the next address, at once
        if now >= trying.until:
            raise self._gave_up(err, failed, trying, now) from None
        if trying.absent is not None and not trying.told:
            trying.told = True
            wait_s = trying.until - trying.started
            line = retry.waiting_message(self.addresses, trying.absent, wait_s)
            if self._on_wait is not None:
                self._on_wait(line)
            else:
                log.warning("%s", line)
        # A full round failed: the leader may be restarting, or not there yet.
        pause = trying.pause(now)
        time.sleep(pause if deadline is None else deadline.cap(pause))
        return trying

    def _give_up_at(self, now: float, deadline: _Deadline | None) -> float:
        """When a stretch of trying that begins ``now`` ends (``time.monotonic()``)."""
        at = None if deadline is None else deadline.at
        span = self._reconnect_s if self._answered else self._connect_wait_s
        if self._answered and at is not None:
            return at  # a query with a timeout tries until then
        return now + span if at is None else min(at, now + span)

    def _gave_up(
        self, err: grpc.RpcError, failed: str, trying: retry.Trying, now: float
    ) -> MangonelError:
        """The error once ``trying`` ended without an answer (``failed``: the last tried)."""
        if trying.absent is not None:
            return ClusterError(
                retry.gave_up_message(self.addresses, trying.absent, now - trying.started)
            )
        if len(self.addresses) == 1:
            return translate(err, failed, self._tls)
        return ClusterError(
            f"cannot reach any scheduler of {', '.join(self.addresses)}; are they running?"
        )

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
        return self.register(name, path)

    def register(
        self,
        name: str,
        path: str,
        format: str = "parquet",
        columns: Sequence[tuple[str, str]] | Mapping[str, str] = (),
        **options: str | int | bool,
    ) -> TableInfo:
        """Register data (a file, a directory, a glob or an ``s3://`` location) as table
        ``name``: Parquet, CSV or newline-delimited JSON.

        >>> session.register("orders", "/data/orders/", format="csv", delimiter="|")
        ... # doctest: +SKIP

        The path is read by the scheduler and the executors, not by this process.

        Args:
            format: ``parquet``, ``csv`` or ``json``.
            columns: A CSV or JSON table's columns and their DuckDB types, in file
                order; none: inferred once from the start of the first file.
            options: A CSV or JSON table's options (``mangonel.textfiles.OPTIONS``):
                ``header``, ``delimiter``, ``quote``, ``escape``, ``null``,
                ``dateformat``, ``timestampformat``, ``compression``, ``ignore_errors``,
                ``multiline``, ``split_size``.

        Raises:
            CatalogError: the path is missing or unreadable, or a name, option or
                column is invalid.
        """
        pairs = list(columns.items()) if isinstance(columns, Mapping) else list(columns)
        request = pb.RegisterTableRequest(
            name=name,
            path=path,
            format=format,
            options={k: _option_text(v) for k, v in options.items()},
            columns=[pb.Column(name=n, type=t) for n, t in pairs],
        )
        msg = self._call("RegisterTable", request)
        assert isinstance(msg, pb.TableInfo)
        return table_from_proto(msg)

    def drop_table(self, name: str) -> None:
        """Forget table ``name``; a table the warehouse made loses its files too.

        Once: a call sent again after its answer was lost (a failover, a cut
        link) is answered as done when the first one dropped the table.

        Raises:
            CatalogError: there is no such table.
            PermissionDeniedError: the user is not an admin.
        """
        request_id = f"{self._session_key}.{secrets.token_hex(8)}"
        self._call("DropTable", pb.DropTableRequest(name=name, request_id=request_id))

    def tables(self) -> list[TableInfo]:
        """The tables queries may read."""
        return self._list_tables()[0]

    def unreadable_tables(self) -> list[UnreadableTableInfo]:
        """The tables kept whose files cannot be read now (a store away, a mount not
        there): queries naming them fail until the scheduler reads them again."""
        return self._list_tables()[1]

    def _list_tables(self) -> tuple[list[TableInfo], list[UnreadableTableInfo]]:
        msg = self._call("ListTables", pb.ListTablesRequest())
        assert isinstance(msg, pb.ListTablesResponse)
        unreadable = [
            UnreadableTableInfo(u.name, u.location, u.error, u.since) for u in msg.unreadable
        ]
        return [table_from_proto(t) for t in msg.tables], unreadable

    # ------------------------------------------------------------------- queries

    def explain(self, text: str, dialect: str | None = None) -> str:
        """The distributed plan of a query, as text."""
        msg = self._call("Explain", pb.ExplainRequest(sql=text, dialect=dialect or ""))
        assert isinstance(msg, pb.ExplainResponse)
        return str(msg.text)

    def submit(self, text: str, dialect: str | None = None, timeout_s: float | None = None) -> str:
        """Start a query and return its job id at once (see ``wait``).

        Args:
            text: One SELECT statement.
            dialect: A sqlglot dialect name; DuckDB's when ``None``.
            timeout_s: How long to keep trying to reach the scheduler (else
                ``reconnect_s``).

        Raises:
            QueryError: (a subclass) the query cannot run as written.
        """
        return self._submit(text, dialect, _Deadline(timeout_s))

    def _submit(self, text: str, dialect: str | None, deadline: _Deadline) -> str:
        # One id for every retry of this submission (``_call`` retries when the
        # scheduler restarts, fails over or is cut off, even after a timeout):
        # it never starts the query twice.
        # Its front part is the session's key: a secured cluster binds the result's
        # tickets to it (``security.tickets.session_key_of``).
        request_id = f"{self._session_key}.{secrets.token_hex(8)}"
        request = pb.SubmitRequest(sql=text, dialect=dialect or "", request_id=request_id)
        msg = self._call("Submit", request, deadline)
        assert isinstance(msg, pb.SubmitResponse)
        return str(msg.job_id)

    def sql(
        self,
        text: str,
        dialect: str | None = None,
        on_progress: Callable[[JobStatus], None] | None = None,
        timeout_s: float | None = None,
    ) -> Result:
        """Run a query (or a write statement) and return its whole result.

        A query whose result is lost before it is read (the executor holding it
        died) runs again, up to ``RESULT_RETRIES`` times. A statement that took
        effect (a write committed, a table dropped) never does: its answer, lost
        then, is NULL (``Result.answer_lost``).

        Args:
            text: One statement: a SELECT, or a write (``INSERT``, ``CREATE TABLE``,
                ``COPY ... TO``, ``DROP TABLE``...).
            dialect: A sqlglot dialect name; DuckDB's when ``None``.
            on_progress: Called with each progress update of the job.
            timeout_s: The most the query may take, from submission to its last
                byte read, network cuts included (the session's
                ``query_timeout_s`` when ``None``); then it is cancelled, if the
                scheduler can be reached.

        Raises:
            QueryError: (a subclass) the query cannot run as written.
            JobFailedError: it failed while running; ``JobCancelledError`` if
                cancelled. A subclass that is also the error it is blamed on where
                the scheduler knows it (``errors.ErrorType``): ``ObjectChangedError``,
                ``ObjectAccessError``, ``ObjectStoreUnavailableError``, a
                ``QueryError`` (the query's own operations failed on the data),
                an ``InternalError``.
            QueryTimeoutError: it outlasted ``timeout_s``.
            ClusterError: the scheduler or the executors cannot be reached.
        """
        start = time.monotonic()
        if "EXTERNAL" in text[:4096].upper():
            # Imported here: sqlglot's tokenizer is the only part of the front end a
            # client needs, and only for this statement (``tests/unit/test_sql_explain``).
            from mangonel.sql.ddl import parse_ddl

            ddl = parse_ddl(text)
            if ddl is not None:
                return self._register_external(ddl, start)
        if is_explain(text):
            # EXPLAIN SELECT ...: the plan as a one-column result, one row per line.
            lines = self.explain(text, dialect).splitlines()
            table = pa.table({"explain": pa.array(lines, pa.string())})
            return Result("", ("explain",), table, (), time.monotonic() - start, 0.0)
        deadline = _Deadline(self._query_timeout_s if timeout_s is None else timeout_s)
        for attempt in range(defaults.RESULT_RETRIES + 1):
            job_id = self._submit(text, dialect, deadline)
            try:
                return self._wait(job_id, on_progress, start, deadline)
            except ResultUnavailableError as exc:
                if attempt == defaults.RESULT_RETRIES:
                    raise ClusterError(
                        f"the result of job {job_id} was lost before it could be read "
                        f"({exc}); run the query again"
                    ) from exc
                log.warning("result of job %s lost (%s); running the query again", job_id, exc)
            except QueryTimeoutError as exc:
                raise QueryTimeoutError(
                    f"job {job_id}: {exc}; {self._cancel_late(job_id)}"
                ) from exc
        raise AssertionError("unreachable")

    def _register_external(self, ddl: CreateExternalTable, start: float) -> Result:
        """``CREATE EXTERNAL TABLE`` as ``register``; the result is one row that says
        what was done. (``DROP TABLE`` is the scheduler's, as the write statements
        are: it also removes the files of a table the warehouse owns.)"""
        if ddl.if_not_exists and any(t.name == ddl.name for t in self.tables()):
            done = f"table {ddl.name} exists"
        else:
            info = self.register(
                ddl.name, ddl.location, ddl.format, ddl.columns, **dict(ddl.options)
            )
            done = f"registered {info.name}: {len(info.columns)} columns, "
            done += f"{len(info.files)} files"
        table = pa.table({"status": pa.array([done], pa.string())})
        return Result("", ("status",), table, (), time.monotonic() - start, 0.0)

    def _cancel_late(self, job_id: str) -> str:
        """Cancel a job whose deadline passed, without waiting long; say what came of it."""
        try:
            reply = self._stub.CancelJob(
                pb.CancelJobRequest(job_id=job_id), timeout=min(self._timeout_s, _CANCEL_WAIT_S)
            )
        except grpc.RpcError:
            return (
                "it could not be cancelled (the scheduler did not answer): it may still "
                "run, and its result is deleted after the scheduler's --result-ttl"
            )
        return "it was cancelled" if reply.cancelled else "it had finished; its result is released"

    def wait(
        self,
        job_id: str,
        on_progress: Callable[[JobStatus], None] | None = None,
        started: float | None = None,
        timeout_s: float | None = None,
    ) -> Result:
        """Wait for a submitted job and read its result.

        Args:
            job_id: What ``submit`` returned.
            on_progress: Called with each progress update of the job.
            started: ``time.monotonic()`` at submission, for ``Result.elapsed_s``.
            timeout_s: The most to wait, reading the result included (else
                until ``reconnect_s`` passes without an answer).

        Raises:
            JobFailedError: it failed (typed as in ``sql``); ``JobCancelledError``
                if it was cancelled.
            QueryTimeoutError: ``timeout_s`` passed first (the job runs on).
            ResultUnavailableError: the executor holding the result is gone (a
                statement that took effect answers NULL instead:
                ``Result.answer_lost``).
        """
        start = time.monotonic() if started is None else started
        return self._wait(job_id, on_progress, start, _Deadline(timeout_s))

    def _wait(
        self,
        job_id: str,
        on_progress: Callable[[JobStatus], None] | None,
        start: float,
        deadline: _Deadline,
    ) -> Result:
        final = self._watch(job_id, on_progress, deadline)
        status = job_from_proto(final)
        if status.state is JobState.CANCELLED:
            raise JobCancelledError(status.error or f"job {job_id} was cancelled")
        if status.state is not JobState.SUCCEEDED:
            # Typed as the scheduler blamed it (an object changed, a store away, the
            # query's own error), and a JobFailedError all the same.
            raise job_failure(status.error_type, status.error or f"job {job_id} failed")
        answer_lost = False
        try:
            tables = [self._partition(job_id, m, deadline) for m in final.result]
            table = assemble_result(tables, status.columns)
        except ResultUnavailableError as exc:
            if not status.took_effect:
                raise  # a query: ``sql`` runs it again
            # Its write is committed, or its table dropped: running it again would
            # do that twice. Its answer (a count) is unknown, as Flight SQL's -1 says.
            log.warning(
                "job %s took effect, but its answer was lost (%s): it is not run again, "
                "and its answer is NULL",
                job_id,
                exc,
            )
            rows = sum(m.rows for m in final.result)
            table = pa.Table.from_arrays(
                [pa.nulls(rows)] * len(status.columns), names=list(status.columns)
            )
            answer_lost = True
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
            answer_lost=answer_lost,
        )

    def _partition(self, job_id: str, msg: pb.PartitionLocation, deadline: _Deadline) -> pa.Table:
        """One result partition: the file the final status carried, else read over Flight."""
        carried = carried_partition(msg)
        if carried is not None:  # not ``or``: a table of no row is falsy
            return carried
        return self._read_partition(job_id, convert.partition_location_from_proto(msg), deadline)

    def _read_partition(self, job_id: str, loc: PartitionLocation, deadline: _Deadline) -> pa.Table:
        """Read one result partition, again and again while its executor is alive.

        An executor that refused the ticket, or that the scheduler counts lost,
        no longer has the file: ``ResultUnavailableError`` at once (the query
        runs again). One that is merely unreachable (a cut link, a busy
        network) is read again with a growing pause, until the deadline or,
        without one, for ``reconnect_s``: the scheduler keeps an unread result
        for its ``--result-ttl``.
        """
        pause = _FETCH_RETRY_FIRST_S
        give_up = time.monotonic() + self._reconnect_s
        while True:
            try:
                return self._flight.read(loc, deadline.left())
            except ResultUnavailableError as exc:
                deadline.check(f"its result could not be read: {exc}")
                if exc.refused or self._executor_lost(loc.executor, deadline):
                    raise
                if deadline.at is None and time.monotonic() + pause >= give_up:
                    raise
                log.info("job %s: %s; reading it again in %.1f s", job_id, exc, pause)
                time.sleep(deadline.cap(pause))
                pause = min(2 * pause, _FETCH_RETRY_MAX_S)

    def _executor_lost(self, executor: str, deadline: _Deadline) -> bool:
        """Whether the scheduler counts ``executor`` lost (or forgot it); False when
        no scheduler can be asked, since then our own link is the likely cut.

        Each scheduler of the session is asked in turn, the one it uses first, and
        the first that answers leads now (a standby does not listen) and is used
        from then on. Asking only the one in use, a session whose scheduler had
        failed over asked a dead address for as long as it stayed dead: a write's
        lost answer came back after 38 s instead of at once (``scripts/soak.py
        --schedulers 2``, 2026-12-07).
        """
        for step in range(len(self.addresses)):
            index = (self._current + step) % len(self.addresses)
            try:
                reply = self._stubs[index].ClusterStatus(
                    pb.ClusterStatusRequest(),
                    timeout=max(0.001, deadline.cap(min(self._timeout_s, _STATUS_CHECK_S))),
                )
            except grpc.RpcError:
                continue
            self._current = index
            for entry in reply.executors:
                if entry.id == executor:
                    return bool(entry.state == pb.EXECUTOR_STATE_LOST)
            return True
        return False

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

    def _watch(
        self,
        job_id: str,
        on_progress: Callable[[JobStatus], None] | None,
        deadline: _Deadline,
    ) -> pb.JobStatus:
        """Follow the job to its end: across a scheduler restart or failover, and a
        cut link (noticed by keepalive pings), watching it again where it stands."""
        trying: retry.Trying | None = None
        broken: float | None = None  # since when the watch is down
        logged_in_again = False
        while True:
            final: pb.JobStatus | None = None
            if self._login.due():
                self.log_in()
            try:
                call = self._stub.WatchJob(
                    pb.WatchJobRequest(job_id=job_id, final_only=on_progress is None),
                    timeout=deadline.left(),
                )
                for msg in call:
                    self._answered, trying = True, None
                    if broken is not None:
                        log.info(
                            "watching job %s again on the scheduler at %s, %.1f s after "
                            "the watch broke",
                            job_id,
                            self.address,
                            time.monotonic() - broken,
                        )
                        broken = None
                    if on_progress is not None:
                        on_progress(job_from_proto(msg))
                    if msg.state not in (pb.JOB_STATE_RUNNING, pb.JOB_STATE_UNSPECIFIED):
                        # The last message the scheduler sends: the result is read now,
                        # not after the stream's end comes in behind it.
                        final = msg
                        call.cancel()
                        break
            except grpc.RpcError as err:
                if final is not None:
                    return final
                if not logged_in_again and self._refused(err):
                    logged_in_again = True
                    continue
                if broken is None:
                    broken = time.monotonic()
                    log.info("the watch of job %s broke (%s); trying again", job_id, _why(err))
                # A scheduler that stops cancels its streams: it went away too.
                trying = self._next_scheduler(err, trying, (grpc.StatusCode.CANCELLED,), deadline)
                continue
            if final is None:
                # The stream ended without an end state: the scheduler stopped.
                deadline.check(f"the scheduler at {self.address} stopped")
                now = time.monotonic()
                if trying is None:
                    trying = retry.Trying(now, self._give_up_at(now, deadline))
                if now >= trying.until:
                    raise unreachable(self.address)
                time.sleep(deadline.cap(trying.pause(now)))
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
    address: str = DEFAULT_ADDRESS,
    timeout_s: float = 60.0,
    reconnect_s: float = defaults.RECONNECT_S,
    query_timeout_s: float | None = None,
    keepalive_s: float = DEFAULT_KEEPALIVE_S,
    security: SecurityOptions | None = None,
    *,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    connect_wait_s: float = defaults.CONNECT_WAIT_S,
    on_wait: Callable[[str], None] | None = None,
) -> Session:
    """A session with the scheduler at ``address`` (``host:port``, or several comma-separated).

    The connection opens on the first call: a scheduler that refuses it (not
    started yet, restarting, its standby taking over) is waited for up to
    ``connect_wait_s`` (30 s), then ``ClusterError``. Later, a scheduler that
    restarts or fails over is waited for up to ``reconnect_s``: a running query
    just takes longer. On a scheduler with users give ``user`` and ``password``
    (a login on the first call; a wrong one raises ``AuthenticationError``), or
    a ``token``. See ``Session`` for the other arguments.
    """
    return Session(
        address,
        timeout_s,
        reconnect_s,
        query_timeout_s,
        keepalive_s,
        security,
        user=user,
        password=password,
        token=token,
        connect_wait_s=connect_wait_s,
        on_wait=on_wait,
    )


def _option_text(value: str | int | bool) -> str:
    """An option's value as the wire carries it (``True`` as ``true``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
