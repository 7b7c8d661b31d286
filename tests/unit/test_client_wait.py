"""How a session waits for a scheduler: what it tries again, for how long, how often.

The pure parts (``client.retry``: the backoff, which failures mean "no scheduler
there yet", a stretch of trying) directly; then ``Session._call`` over a stub
that answers from a script, on a fake clock: no network, no sleeping.
"""

from __future__ import annotations

import doctest
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from mangonel.client import retry
from mangonel.client import session as session_module
from mangonel.client.session import Session, _Deadline
from mangonel.errors import ClusterError, QueryTimeoutError, SqlSyntaxError
from mangonel.proto import mangonel_pb2 as pb

# What gRPC 1.85 says, as measured on loopback.
REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
    "Failed to connect to remote host: Connection refused"
)
NO_NAME = (
    "errors resolving no-such-host.invalid:50050: [field:hostname lookup error:address "
    "lookup failed for no-such-host.invalid:50050: Domain name not found]"
)
# A plaintext client at a TLS port; a client of another CA.
SOCKET_CLOSED = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:x: Socket closed"
# A frozen scheduler; one killed with the connection waiting in its backlog.
FROZEN = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:28639: "
    "connection attempt timed out before receiving SETTINGS frame"
)
RESET = (
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:30118: "
    "recvmsg:Connection reset by peer (104)"
)
HANDSHAKE = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:38467: Tls "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED"
)


def test_the_module_examples_hold() -> None:
    assert doctest.testmod(retry).failed == 0


# ------------------------------------------------------------------- backoff


def test_pauses_double_up_to_the_cap() -> None:
    backoff = retry.Backoff(first_s=0.1, max_s=1.0, jitter=0.0)
    assert [round(backoff.next(), 3) for _ in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_jitter_shortens_a_pause_by_at_most_its_share() -> None:
    draws = iter([0.0, 0.999999, 0.5])
    backoff = retry.Backoff(first_s=1.0, max_s=1.0, jitter=0.5, rand=lambda: next(draws))
    assert backoff.next() == 1.0
    assert backoff.next() == pytest.approx(0.5, abs=1e-5)
    assert backoff.next() == pytest.approx(0.75)


def test_the_default_backoff_stays_within_its_bounds() -> None:
    backoff = retry.Backoff()
    pauses = [backoff.next() for _ in range(50)]
    assert all(retry.FIRST_PAUSE_S / 2 <= p <= retry.MAX_PAUSE_S for p in pauses)
    assert max(pauses[10:]) > retry.MAX_PAUSE_S / 2  # grew to the cap's range


# --------------------------------------------------------- what is waited for


@pytest.mark.parametrize(
    ("details", "reason"),
    [
        (REFUSED, "connection refused"),
        (NO_NAME, "the name does not resolve"),
        ("... DNS resolution failed for s1:50050 ...", "the name does not resolve"),
        ("... connect: No route to host (113)", "no route to it"),
        ("... Network is unreachable", "no route to it"),
        (FROZEN, "it takes connections but does not answer"),
        (RESET, None),
        (SOCKET_CLOSED, None),
        (HANDSHAKE, None),
        ("GOAWAY received", None),
        ("", None),
    ],
)
def test_only_failures_that_say_no_scheduler_is_there_are_absences(
    details: str, reason: str | None
) -> None:
    assert retry.absent_reason(details) == reason


def test_other_failures_in_a_row_end_the_stretch_once_they_went_on_for_a_while() -> None:
    trying = retry.Trying(started=0.0, until=30.0)
    trying.note(None, 1.0)  # a scheduler that died under the call, perhaps
    trying.note(None, 1.1)  # the channel repeats that until its backoff ends
    assert trying.until == 30.0
    trying.note("connection refused", 2.0)  # it did die: now it refuses
    trying.note(None, 3.0)
    trying.note(None, 3.0 + retry.SETUP_ERROR_S - 0.1)
    assert trying.until == 30.0 and trying.absent is None
    trying.note(None, 3.0 + retry.SETUP_ERROR_S)  # still: something else answers there
    assert trying.until == 3.0 + retry.SETUP_ERROR_S


def test_the_setup_error_outlasts_the_channels_backoff() -> None:
    # Only a failure after the channel tried to connect again says something new.
    assert retry.SETUP_ERROR_S > 2 * retry.MAX_PAUSE_S


def test_a_pause_never_runs_past_the_end_of_the_stretch() -> None:
    trying = retry.Trying(
        started=0.0, until=10.0, backoff=retry.Backoff(first_s=4.0, max_s=4.0, jitter=0.0)
    )
    assert trying.pause(now=1.0) == 4.0
    assert trying.pause(now=9.5) == 0.5
    assert trying.pause(now=11.0) == 0.0


def test_the_final_error_says_what_was_tried_how_long_and_what_to_check() -> None:
    one = retry.gave_up_message(["s1:50050"], "connection refused", 30.04)
    assert one.startswith("cannot reach the scheduler at s1:50050 (connection refused)")
    assert "tried for 30 s" in one
    assert "mangonel standalone" in one and "--scheduler" in one and "--connect-wait" in one
    two = retry.gave_up_message(["a:1", "b:1"], "connection refused", 2.5)
    assert two.startswith("cannot reach any scheduler of a:1, b:1") and "tried for 2.5 s" in two


# ------------------------------------------------------- a session's calls


class FakeRpcError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A failed call as gRPC raises it: a code, details, trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str, error: str = "") -> None:
        self._code, self._details = code, details
        self._trailing = (("mangonel-error", error),) if error else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailing

    def initial_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


def refused() -> FakeRpcError:
    return FakeRpcError(grpc.StatusCode.UNAVAILABLE, REFUSED)


class Clock:
    """``time`` for the session module: ``sleep`` moves ``monotonic`` on at once."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedStub:
    """Answers each call from a script: an exception is raised, anything else returned.
    Every call takes ``call_s`` of the clock's time; ``requests`` keeps what came."""

    def __init__(self, clock: Clock, script: list[Any], call_s: float = 0.001) -> None:
        self.clock, self.script, self.call_s = clock, script, call_s
        self.requests: list[Any] = []

    def _answer(self, request: Any, timeout: float | None = None) -> Any:
        self.requests.append(request)
        self.clock.now += self.call_s
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, BaseException):
            raise step
        return step

    def __getattr__(self, method: str) -> Any:
        return self._answer


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(session_module, "time", fake)
    return fake


Made = tuple[Session, list[ScriptedStub], list[str]]


@pytest.fixture
def scripted(clock: Clock) -> Iterator[Callable[..., Made]]:
    """``scripted(script, addresses=1, **options)``: a session whose every address
    answers from ``script``, the stubs, and the lines it told (``on_wait``)."""
    made: list[Session] = []

    def make(script: list[Any], addresses: int = 1, **options: Any) -> Made:
        told: list[str] = []
        address = ",".join(f"127.0.0.1:{i + 1}" for i in range(addresses))
        session = Session(address, on_wait=told.append, **options)
        made.append(session)
        stubs = [ScriptedStub(clock, list(script)) for _ in range(addresses)]
        session._stubs = stubs  # type: ignore[assignment]
        return session, stubs, told

    yield make
    for session in made:
        session.close()


TABLES = pb.ListTablesResponse()


def test_a_submission_to_a_scheduler_not_there_yet_waits_and_keeps_its_request_id(
    clock: Clock, scripted: Callable[..., Made]
) -> None:
    session, (stub,), told = scripted([refused()] * 12 + [pb.SubmitResponse(job_id="j1")])
    assert session.submit("SELECT 1") == "j1"
    assert len(stub.requests) == 13
    assert len({r.request_id for r in stub.requests}) == 1  # the same id on every try
    assert told == ["waiting up to 30 s for the scheduler at 127.0.0.1:1 (connection refused)"]
    # Pauses grow, with jitter, to the cap: not a fixed beat.
    assert clock.sleeps[0] <= retry.FIRST_PAUSE_S < max(clock.sleeps) <= retry.MAX_PAUSE_S


def test_a_scheduler_never_there_is_given_up_after_connect_wait_s(
    clock: Clock, scripted: Callable[..., Made]
) -> None:
    session, (stub,), told = scripted([refused()], connect_wait_s=5.0)
    started = clock.now
    with pytest.raises(ClusterError, match=r"\(connection refused\), tried for 5 s"):
        session.tables()
    assert clock.now - started == pytest.approx(5.0, abs=0.01)
    assert len(told) == 1 and len(stub.requests) > 5


def test_connect_wait_zero_is_an_error_at_once(clock: Clock, scripted: Callable[..., Made]) -> None:
    session, (stub,), told = scripted([refused()], connect_wait_s=0.0)
    with pytest.raises(ClusterError, match="cannot reach the scheduler at 127.0.0.1:1"):
        session.tables()
    assert len(stub.requests) == 1 and clock.sleeps == [] and told == []


def test_an_error_answer_is_never_tried_again(scripted: Callable[..., Made]) -> None:
    answer = FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "syntax error", "SqlSyntaxError")
    session, (stub,), _ = scripted([refused(), refused(), answer, TABLES])
    with pytest.raises(SqlSyntaxError, match="syntax error"):
        session.submit("SELEC 1")
    assert len(stub.requests) == 3  # two refusals waited out, the answer taken as given


def test_a_tls_mismatch_is_an_error_within_seconds_not_a_wait(
    clock: Clock, scripted: Callable[..., Made]
) -> None:
    session, (stub,), told = scripted([FakeRpcError(grpc.StatusCode.UNAVAILABLE, SOCKET_CLOSED)])
    started = clock.now
    with pytest.raises(ClusterError, match="--tls-dir"):
        session.tables()
    assert len(stub.requests) > 2 and told == []
    took = clock.now - started
    assert retry.SETUP_ERROR_S <= took <= retry.SETUP_ERROR_S + retry.MAX_PAUSE_S + 0.1


@pytest.mark.parametrize("first", [SOCKET_CLOSED, RESET], ids=["closed", "reset"])
def test_a_scheduler_that_died_under_the_first_call_is_waited_for(
    scripted: Callable[..., Made], first: str
) -> None:
    # The channel repeats the dying connection's error a few times, then it refuses.
    died = FakeRpcError(grpc.StatusCode.UNAVAILABLE, first)
    session, (stub,), told = scripted([died, died, died, refused(), refused(), TABLES])
    assert session.tables() == []
    assert len(stub.requests) == 6 and len(told) == 1


def test_a_frozen_scheduler_is_waited_for_and_named_so(
    clock: Clock, scripted: Callable[..., Made]
) -> None:
    frozen = FakeRpcError(grpc.StatusCode.UNAVAILABLE, FROZEN)
    session, (stub,), told = scripted([frozen], connect_wait_s=5.0)
    with pytest.raises(ClusterError, match=r"does not answer\), tried for 5 s"):
        session.tables()
    assert told == [
        "waiting up to 5 s for the scheduler at 127.0.0.1:1 "
        "(it takes connections but does not answer)"
    ]


def test_a_query_timeout_shorter_than_the_wait_ends_it(scripted: Callable[..., Made]) -> None:
    session, _, _ = scripted([refused()])
    with pytest.raises(QueryTimeoutError, match="within its timeout of 2 s"):
        session.submit("SELECT 1", timeout_s=2.0)


def test_every_address_of_a_group_is_tried_before_a_pause(
    clock: Clock, scripted: Callable[..., Made]
) -> None:
    session, (standby, leader), told = scripted([TABLES], addresses=2)
    standby.script = [refused()]  # a standby listens only once it leads
    assert session.tables() == []
    assert session.address == "127.0.0.1:2"
    assert len(standby.requests) == 1 and len(leader.requests) == 1
    assert clock.sleeps == [] and told == []


def test_a_group_never_there_is_named_whole(scripted: Callable[..., Made]) -> None:
    session, _, told = scripted([refused()], addresses=2, connect_wait_s=3.0)
    with pytest.raises(ClusterError, match="any scheduler of 127.0.0.1:1, 127.0.0.1:2"):
        session.tables()
    assert told == [
        "waiting up to 3 s for any scheduler of 127.0.0.1:1, 127.0.0.1:2 (connection refused)"
    ]


def test_once_a_scheduler_answered_reconnect_s_bounds_the_trying(
    clock: Clock, scripted: Callable[..., Made]
) -> None:
    script = [TABLES] + [refused()] * 30 + [TABLES]
    session, (stub,), told = scripted(script, connect_wait_s=1.0, reconnect_s=60.0)
    session.tables()
    started = clock.now
    assert session.tables() == []  # a restart: longer than connect_wait_s
    assert clock.now - started > 1.0
    assert told == []  # only a first contact is announced
    assert len(stub.requests) == 32


def test_a_scheduler_that_lost_its_store_under_the_first_calls_is_waited_for(
    clock: Clock, scripted: Callable[..., Made]
) -> None:
    """Deposed, a scheduler answers UNAVAILABLE naming the store's error until its
    server stops; then its address refuses until its supervisor starts it again.
    Those answers are a scheduler's, not a TLS mismatch: they are waited out."""
    fenced = FakeRpcError(
        grpc.StatusCode.UNAVAILABLE,
        "this scheduler no longer leads the state store etcd://etcd:2379/mangonel/",
        "StoreFencedError",
    )
    session, (stub,), _ = scripted([fenced, fenced, fenced] + [refused()] * 20 + [TABLES])
    assert session.tables() == []
    assert len(stub.requests) == 24
    assert clock.now - 1000.0 > 10.0  # past what a TLS mismatch gets: a restart's wait


def test_whether_a_result_s_executor_is_lost_is_asked_of_the_scheduler_that_answers(
    scripted: Callable[..., Made],
) -> None:
    # The session's scheduler failed over: the address it used is dead, the other
    # leads and counts the executor that held a result lost. Asked of the dead one
    # alone, the answer was "cannot tell" until that address came back.
    lost = pb.ClusterStatusResponse(
        executors=[pb.ExecutorStatus(id="exec-1", state=pb.EXECUTOR_STATE_LOST)]
    )
    session, stubs, _ = scripted([refused()], addresses=2)
    stubs[1].script = [lost]
    assert session._executor_lost("exec-1", _Deadline(None))
    assert session.address == "127.0.0.1:2"  # the one that answered, from now on
    alive = pb.ClusterStatusResponse(
        executors=[pb.ExecutorStatus(id="exec-1", state=pb.EXECUTOR_STATE_ALIVE)]
    )
    stubs[1].script = [alive]
    assert not session._executor_lost("exec-1", _Deadline(None))
    stubs[1].script = [pb.ClusterStatusResponse()]
    assert session._executor_lost("exec-1", _Deadline(None))  # forgotten
    stubs[1].script = [refused()]
    assert not session._executor_lost("exec-1", _Deadline(None))  # nobody to ask
