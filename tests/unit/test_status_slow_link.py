"""An executor marked behind a slow link, as ``mangonel status`` shows it: the
state machine's view through the status message (``service_status``, the
proto) to the client's ``ExecutorStatus`` and the command's "why" column."""

from __future__ import annotations

import time

from mangonel.client.cli_commands import _why
from mangonel.client.status import ExecutorState, executor_from_proto
from mangonel.ids import ExecutorId
from mangonel.scheduler.registry import ExecutorListing
from mangonel.scheduler.service_status import executor_status
from mangonel.scheduler.state_views import ExecutorState as ViewState
from mangonel.scheduler.state_views import ExecutorView

SINCE = 1_700_000_000.0


def _view(**marks: object) -> ExecutorView:
    return ExecutorView(
        id=ExecutorId("e1"),
        host="h1",
        flight_address="h1:50051",
        slots=2,
        state=ViewState.ALIVE,
        since=SINCE - 60,
        reason=None,
        detail="",
        running=0,
        last_heartbeat=SINCE,
        **marks,  # type: ignore[arg-type]
    )


def test_status_says_slow_link_since_when_until_when_and_why() -> None:
    view = _view(
        slow_link_since=SINCE,
        slow_link_until=SINCE + 20,
        slow_link="its readers get 1.50 MB/s from it against 60.00 MB/s from the others",
    )
    status = executor_from_proto(executor_status(ExecutorListing(view, pid=7), now=SINCE + 1))
    assert status.state is ExecutorState.ALIVE
    assert (status.slow_link_since, status.slow_link_until) == (SINCE, SINCE + 20)
    since = time.strftime("%H:%M:%S", time.localtime(SINCE))
    until = time.strftime("%H:%M:%S", time.localtime(SINCE + 20))
    assert _why(status) == (
        f"slow link since {since}: no new task until {until} - its readers get 1.50 MB/s "
        "from it against 60.00 MB/s from the others"
    )


def test_an_executor_on_trial_or_trusted_is_not_said_to_be_marked() -> None:
    trial = _view(slow_link="its readers get 1.50 MB/s from it")  # on trial: no since
    for view in (trial, _view()):
        status = executor_from_proto(executor_status(ExecutorListing(view), now=SINCE + 1))
        assert status.slow_link_since is None
        assert "slow link" not in _why(status)
