"""A job that fails while it runs keeps its error's type, and says what to do.

The type goes from the executor's classification (``executor.failures``) through
the task's failure and the state machine's ``JobFailed`` and job view (and the
store), to the name on the wire the client raises by (``errors.job_failure``).
Only the query's own error tells the user to fix the query. The processes are
tested end to end in ``tests/objectstore/test_s3_cluster.py`` and
``tests/integration/test_bad_input.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import duckdb
import pytest
from test_state_machine import E1, E2, J1, J2, Harness, att, three_stage_plan
from test_state_restart import restarted

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
from mangonel.executor.failures import classify, write_target_full
from mangonel.ids import TaskId
from mangonel.plan.physical import DistributedPlan
from mangonel.scheduler.events import JobFailed, Limits
from mangonel.scheduler.persist import decode, encode
from mangonel.scheduler.state import JobState
from mangonel.scheduler.state_jobs import FinishedJob
from mangonel.scheduler.state_stages import TaskRecord
from mangonel.task import ExecutionError, ExecutionProblem, FragmentRejected
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


def test_a_full_write_target_is_blamed_on_the_target_only_when_it_is_the_target(
    tmp_path: Path,
) -> None:
    target, work = tmp_path / "out" / "t", tmp_path / "work"
    work.mkdir()
    named = duckdb.IOException(
        f'IO Error: Could not write file "{target}/_mangonel_staging/j/p0-a0/data_0.parquet": '
        "No space left on device"
    )
    failure = write_target_full(str(target), str(work), named)
    assert isinstance(failure, QueryFailure) and failure.error_type is ErrorType.WRITE_TARGET_FULL
    assert f"the write target {target} ran out of space" in failure.message
    assert "mounted at /" in failure.message and "No space left" in failure.message
    # The same disk as the work directory, the target not named: the executor's own
    # disk is full (classify's DISK_FULL), not the target's.
    spill = duckdb.IOException(
        f'IO Error: Could not write file "{work}/x.tmp": No space left on device'
    )
    assert write_target_full(str(target), str(work), spill) is None
    assert classify(spill).problem is ExecutionProblem.DISK_FULL  # type: ignore[union-attr]
    # Not a full disk at all.
    other = duckdb.IOException(f'IO Error: Could not write file "{target}/x": Permission denied')
    assert write_target_full(str(target), str(work), other) is None


# ------------------------------------------------------------------ the scheduler


def _one_job_failed(cmds: list[object]) -> JobFailed:
    failed = [c for c in cmds if isinstance(c, JobFailed)]
    assert len(failed) == 1, cmds
    return failed[0]


def test_an_object_changed_fails_the_job_at_once_without_blaming_the_query() -> None:
    h = Harness()
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=2, reducers=1))
    message = "s3://b/k was overwritten after its table was registered; register the table again"
    failed = _one_job_failed(h.fail(att(1, 0), E1, QueryFailure(message, ErrorType.OBJECT_CHANGED)))
    assert failed.error_type is ErrorType.OBJECT_CHANGED
    assert message in failed.message and "task j1/s1/p0/a0" in failed.message
    assert ErrorType.OBJECT_CHANGED.advice in failed.message
    assert FIX_IT not in failed.message and "cannot run as written" not in failed.message
    view = h.state.job(J1)
    assert view is not None and view.error_type is ErrorType.OBJECT_CHANGED
    assert view.stages[0].attempts_launched == 2  # not retried: p0 and p1 once each


def test_the_query_s_own_error_fails_the_job_telling_to_fix_it() -> None:
    h = Harness()
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=2, reducers=1))
    error = "Conversion Error: Could not convert string 'x' to INT32"
    failed = _one_job_failed(h.fail(att(1, 1), E1, QueryFailure(error)))
    assert failed.error_type is ErrorType.QUERY
    assert failed.message.endswith(f"{error}. The query cannot run as written; {FIX_IT}.")


def test_a_rejected_fragment_and_a_bad_plan_are_internal_errors() -> None:
    h = Harness()
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=1, reducers=1))
    rejected = _one_job_failed(h.fail(att(1, 0), E1, FragmentRejected("Binder Error: no x")))
    assert rejected.error_type is ErrorType.INTERNAL and FIX_IT not in rejected.message
    good = three_stage_plan(maps=2)
    broken = dataclasses.replace(good.stages[0], num_tasks=3)  # but two groups of splits
    bad = _one_job_failed(h.submit(DistributedPlan((broken, *good.stages[1:]), good.columns), J2))
    assert bad.error_type is ErrorType.INTERNAL
    assert "cannot run" in bad.message and "bug in mangonel" in bad.message
    assert f"job {J2}" in bad.message and FIX_IT not in bad.message


def test_a_store_that_stays_away_fails_the_job_as_unavailable_after_its_attempts() -> None:
    h = Harness(Limits(max_task_attempts=2, exclusion_failures=0))
    h.register(E1, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    away = ExecutionError(
        "object storage at http://s3 did not answer for s3://b/k after 3 tries",
        error_type=ErrorType.OBJECT_STORE_UNAVAILABLE,
    )
    assert not [c for c in h.fail(att(1, 0), E1, away) if isinstance(c, JobFailed)]  # retried
    failed = _one_job_failed(h.fail(att(1, 0, 1), E1, away))
    assert failed.error_type is ErrorType.OBJECT_STORE_UNAVAILABLE
    assert "failed 2 attempts" in failed.message and away.message in failed.message
    assert ErrorType.OBJECT_STORE_UNAVAILABLE.advice in failed.message
    assert FIX_IT not in failed.message


def test_a_store_that_stays_away_is_charged_to_the_job_once_not_to_each_task() -> None:
    # Three attempts of the job's tasks in a row found the store away (p0 twice,
    # p1 once, side by side): the job fails then, not after each task's three.
    h = Harness(Limits(max_task_attempts=3, exclusion_failures=0))
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=3, reducers=1))
    away = ExecutionError("s3://b/k did not answer", error_type=ErrorType.OBJECT_STORE_UNAVAILABLE)
    assert not [c for c in h.fail(att(1, 0), E1, away) if isinstance(c, JobFailed)]
    assert not [c for c in h.fail(att(1, 1), E1, away) if isinstance(c, JobFailed)]
    failed = _one_job_failed(h.fail(att(1, 0, 1), E1, away))
    assert failed.error_type is ErrorType.OBJECT_STORE_UNAVAILABLE
    assert "did not answer 3 attempts in a row" in failed.message
    assert ErrorType.OBJECT_STORE_UNAVAILABLE.advice in failed.message


def test_an_attempt_that_finishes_shows_the_store_answers_again() -> None:
    h = Harness(Limits(max_task_attempts=3, exclusion_failures=0))
    h.register(E1, 3)
    h.submit(three_stage_plan(maps=3, reducers=1))
    away = ExecutionError("s3://b/k did not answer", error_type=ErrorType.OBJECT_STORE_UNAVAILABLE)
    h.fail(att(1, 0), E1, away)
    h.fail(att(1, 1), E1, away)
    h.complete(att(1, 2), E1)  # the store answered this one
    assert not [c for c in h.fail(att(1, 0, 1), E1, away) if isinstance(c, JobFailed)]
    assert not [c for c in h.fail(att(1, 1, 1), E1, away) if isinstance(c, JobFailed)]
    view = h.state.job(J1)
    assert view is not None and not view.state.finished


def test_the_last_attempt_s_error_types_the_job() -> None:
    # The store came back, then the task ran out of memory: not the store's fault.
    h = Harness(Limits(max_task_attempts=2, exclusion_failures=0))
    h.register(E1, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.fail(att(1, 0), E1, ExecutionError("away", error_type=ErrorType.OBJECT_STORE_UNAVAILABLE))
    oom = ExecutionError("out of memory", ExecutionProblem.OUT_OF_MEMORY)
    failed = _one_job_failed(h.fail(att(1, 0, 1), E1, oom))
    assert failed.error_type is ErrorType.JOB_FAILED
    assert "raise max_task_attempts" in failed.message


def test_executors_all_excluded_by_a_store_that_is_away_fail_the_job_as_unavailable() -> None:
    # One failure excludes an executor here: both are, after one store failure each.
    h = Harness(Limits(exclusion_failures=1))
    h.register(E1, 1)
    h.register(E2, 1)
    h.submit(three_stage_plan(maps=2, reducers=1))
    away = ExecutionError("did not answer", error_type=ErrorType.OBJECT_STORE_UNAVAILABLE)
    assert not [c for c in h.fail(att(1, 0), E1, away) if isinstance(c, JobFailed)]
    failed = _one_job_failed(h.fail(att(1, 1), E2, away))
    assert "every executor is excluded" in failed.message
    assert failed.error_type is ErrorType.OBJECT_STORE_UNAVAILABLE
    assert ErrorType.OBJECT_STORE_UNAVAILABLE.advice in failed.message


def test_a_lost_executor_s_attempts_used_up_are_a_plain_job_failure() -> None:
    h = Harness(Limits(max_task_attempts=1))
    h.register(E1, 1)
    h.register(E2, 1)
    h.submit(three_stage_plan(maps=1, reducers=1))
    failed = _one_job_failed(h.lose(E1))
    assert failed.error_type is ErrorType.JOB_FAILED


# ------------------------------------------------------------------ the store


def test_the_store_keeps_a_failed_job_s_error_type_across_a_restart() -> None:
    h = Harness()
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.fail(att(1, 0), E1, QueryFailure("s3://b/k was deleted", ErrorType.OBJECT_CHANGED))
    view = restarted(h).state.job(J1)
    assert view is not None and view.error_type is ErrorType.OBJECT_CHANGED


def test_documents_written_before_error_types_still_read() -> None:
    h = Harness()
    h.register(E1, 2)
    h.submit(three_stage_plan(maps=1, reducers=1))
    h.fail(att(1, 0), E1, QueryFailure("Conversion Error: x"))
    stored = json.loads(encode(h.state.export_finished(J1)))
    assert stored["view"].pop("error_type") == "QueryError"
    old = decode(json.dumps(stored), FinishedJob)
    assert old.view.error_type is None and old.view.state is JobState.FAILED
    task = json.loads(encode(TaskRecord.fresh(TaskId(J1, att(1, 0).task.stage, 0))))
    del task["last_error_type"]
    assert decode(json.dumps(task), TaskRecord).last_error_type is ErrorType.JOB_FAILED


def test_error_text_leaves_as_plain_text() -> None:
    """What every door (gRPC, Flight SQL, web) sends: no terminal escape sequences."""
    underlined = (
        "syntax error near '\x1b[4m=\x1b[0m'\n\tSELECT \x1b]8;;http://x\x07link\x1b]8;;\x07\r\x00"
    )
    assert errors.plain_text(underlined) == "syntax error near '='\n\tSELECT link"
    assert errors.plain_text('Binder Error: column "x" not found') == (
        'Binder Error: column "x" not found'
    )
