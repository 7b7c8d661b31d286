"""A job that fails while it runs keeps its error's type, and says what to do.

The type goes from the executor's classification (``executor.failures``) through
the task's failure and the state machine's ``JobFailed`` and job view (and the
store), to the name on the wire the client raises by (``errors.job_failure``).
Only the query's own error tells the user to fix the query. The processes are
tested end to end in ``tests/objectstore/test_s3_cluster.py`` and
``tests/integration/test_bad_input.py``.
"""

from __future__ import annotations

import pytest

from mangonel import errors
from mangonel.errors import (
    ErrorType,
    InternalError,
    JobCancelledError,
    JobFailedError,
    ObjectAccessError,
    ObjectChangedError,
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
    QueryError,
    job_failure,
)

FIX_IT = "fix it and submit it again"

# ------------------------------------------------------------------ the client


@pytest.mark.parametrize("error_type", list(ErrorType), ids=[t.name for t in ErrorType])
def test_a_failed_job_raises_its_error_type_and_a_job_failure(error_type: ErrorType) -> None:
    raised = job_failure(error_type.value, "the job's message")
    # Both: callers that catch the typed error and those that catch JobFailedError.
    assert isinstance(raised, getattr(errors, error_type.value))
    assert isinstance(raised, JobFailedError)
    assert str(raised) == "the job's message"
    assert ErrorType.of(raised) is error_type


def test_the_store_errors_of_a_job_are_each_their_own_class() -> None:
    assert isinstance(job_failure("ObjectChangedError", "m"), ObjectChangedError)
    assert isinstance(job_failure("ObjectAccessError", "m"), ObjectAccessError)
    assert isinstance(job_failure("ObjectNotFoundError", "m"), ObjectNotFoundError)
    unavailable = job_failure("ObjectStoreUnavailableError", "m")
    assert isinstance(unavailable, ObjectStoreUnavailableError)
    assert not isinstance(unavailable, ObjectChangedError | ObjectAccessError)
    assert not isinstance(job_failure("ObjectChangedError", "m"), QueryError)
    assert not isinstance(job_failure("QueryError", "m"), ObjectStoreError | InternalError)


@pytest.mark.parametrize("name", ["", "JobFailedError", "SomeErrorOfANewerScheduler", "Exit"])
def test_an_unknown_or_missing_type_is_a_plain_job_failure(name: str) -> None:
    assert type(job_failure(name, "m")) is JobFailedError


def test_a_cancelled_job_is_a_job_cancelled_error() -> None:
    assert type(job_failure("JobCancelledError", "cancelled by the user")) is JobCancelledError


def test_only_the_query_s_own_error_says_to_fix_the_query() -> None:
    for error_type in ErrorType:
        assert (FIX_IT in error_type.advice) is (error_type is ErrorType.QUERY), error_type
    assert "register the table again" in ErrorType.OBJECT_CHANGED.advice
    assert "once it is reachable" in ErrorType.OBJECT_STORE_UNAVAILABLE.advice
    assert "credentials" in ErrorType.OBJECT_ACCESS.advice
    assert "bug in mangonel" in ErrorType.INTERNAL.advice
