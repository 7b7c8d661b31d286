"""A job that fails while it runs keeps its error's type, and says what to do.

The type goes from the executor's classification (``executor.failures``) through
the task's failure and the state machine's ``JobFailed`` and job view (and the
store), to the name on the wire the client raises by (``errors.job_failure``).
Only the query's own error tells the user to fix the query. The processes are
tested end to end in ``tests/objectstore/test_s3_cluster.py`` and
``tests/integration/test_bad_input.py``.
"""

from __future__ import annotations

import duckdb
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
from mangonel.executor.failures import classify
from mangonel.task import ExecutionError, FragmentRejected
from mangonel.task import QueryError as QueryFailure

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


# ------------------------------------------------------------------ the executor


def test_the_executor_names_the_store_s_error_on_the_task_s_failure() -> None:
    # Every attempt would meet the same object: failed at once, typed.
    for exc, error_type in [
        (ObjectChangedError("s3://b/k was overwritten"), ErrorType.OBJECT_CHANGED),
        (ObjectNotFoundError("s3://b/k"), ErrorType.OBJECT_NOT_FOUND),
        (ObjectAccessError("s3://b/k"), ErrorType.OBJECT_ACCESS),
        (ObjectStoreError("s3://b/k is not a readable Parquet file"), ErrorType.OBJECT_STORE),
    ]:
        assert classify(exc) == QueryFailure(str(exc), error_type)
    # The store did not answer: retried, and typed should no attempt succeed.
    away = classify(ObjectStoreUnavailableError("s3://b/k did not answer"))
    assert away == ExecutionError(
        "s3://b/k did not answer", error_type=ErrorType.OBJECT_STORE_UNAVAILABLE
    )


def test_duckdb_s_errors_keep_their_blame() -> None:
    conversion = classify(duckdb.ConversionException("Conversion Error: Could not convert 'a'"))
    assert conversion == QueryFailure("Conversion Error: Could not convert 'a'", ErrorType.QUERY)
    out_of_range = classify(duckdb.OutOfRangeException("Out of Range Error: Overflow"))
    assert isinstance(out_of_range, QueryFailure) and out_of_range.error_type is ErrorType.QUERY
    binder = classify(duckdb.BinderException("Binder Error: no column x"))
    assert isinstance(binder, FragmentRejected)  # the planner's SQL: an internal error
    io = classify(duckdb.IOException("IO Error: Cannot open file"))
    assert isinstance(io, ExecutionError) and io.error_type is ErrorType.JOB_FAILED
