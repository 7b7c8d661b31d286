"""What every front door does with a caller's jobs, written once.

The gRPC query service (``service``), Flight SQL (``flightsql``) and the web API
(``web.app``) each speak their own protocol, but a caller's job goes through the
same three steps at each: it is submitted as the caller (their user owns it,
their right to write decides a write statement), it is found only for a caller
who may see it (``Principal.check_sees``), and a door that answers once the job
ended waits here, cancelling the job when its caller goes away. Each door turns
the errors these raise into its own refusals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mangonel.ids import JobId
from mangonel.scheduler.core import SchedulerCore
from mangonel.scheduler.jobs import JobEnd, JobWatch
from mangonel.security.auth import Principal

log = logging.getLogger(__name__)

WAIT_POLL_S = 0.1
"""How often a waiting door looks whether its caller went away."""


def submit(
    core: SchedulerCore,
    caller: Principal,
    sql: str,
    dialect: str | None = None,
    request_id: str = "",
) -> JobWatch:
    """Plan and start ``sql`` as ``caller``'s job (``SchedulerCore.submit``).

    Raises:
        QueryError: (a subclass) the query cannot run as written, or the
            caller may not write and it is a write statement.
        InternalError: the planner failed on a valid query.
    """
    return core.submit(sql, dialect, request_id, owner=caller.user, may_write=caller.may_write)


def job_of(core: SchedulerCore, caller: Principal, job: str) -> JobWatch:
    """The job ``job``, if ``caller`` may see it: the ownership check of every door.

    Raises:
        JobNotFoundError: no such job (or it was forgotten).
        PermissionDeniedError: another user's job, and the caller is no admin.
    """
    record = core.job(JobId(job))
    caller.check_sees(job, record.owner)
    return record


def wait_end(
    core: SchedulerCore,
    record: JobWatch,
    gone: Callable[[], bool],
    reason: str,
    poll_s: float = WAIT_POLL_S,
) -> JobEnd | None:
    """Wait for a job to end and say how; ``None`` when its caller went away
    first (``gone``), after cancelling the job for ``reason``."""
    while not record.wait_finished(poll_s):
        if gone():
            log.info("job %s: its caller went away; cancelling it", record.id)
            core.cancel(record.id, reason)
            return None
    return record.outcome()
