"""Round trips between domain dataclasses and wire messages (mangonel.proto.convert)."""

from __future__ import annotations

import pytest

from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.proto import convert
from mangonel.proto import mangonel_pb2 as pb
from mangonel.task import (
    CancelTask,
    Compression,
    ExecutionError,
    FetchFailed,
    FetchProblem,
    FileFormat,
    FileSplit,
    FragmentRejected,
    InputLocations,
    InputMode,
    LaunchTask,
    OutputKind,
    OutputSpec,
    PartitionLocation,
    PartitionOutput,
    QueryError,
    ReleaseOutputs,
    ScanSpec,
    TaskFailure,
    TaskSpec,
    TaskTimings,
    TextFormat,
)

ATTEMPT = TaskAttemptId(TaskId(JobId("ab12"), StageId(3), 2), 1)
LOC = PartitionLocation(
    executor=ExecutorId("e1"),
    host="h",
    flight_address="127.0.0.1:1234",
    stage=StageId(1),
    map_partition=0,
    partition=2,
    path="/w/e1/ab12/s1/m0/p2.arrow",
    rows=10,
    bytes=100,
    checksum="c0ffee",
)


def _spec(**overrides: object) -> TaskSpec:
    base: dict[str, object] = dict(
        attempt=ATTEMPT,
        sql="SELECT * FROM t",
        output=OutputSpec(OutputKind.HASH, 4, ("k",)),
        columns=("a", "b"),
        scans=(
            ScanSpec(
                "t",
                "lineitem",
                ("a", "b"),
                (FileSplit("/d/x.parquet", (0, 2), 5, 50), FileSplit("/d/y.parquet")),
            ),
        ),
        inputs=(InputLocations("s1", StageId(1), InputMode.ALL, (LOC,), ("k", "v")),),
    )
    base.update(overrides)
    return TaskSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec",
    [
        _spec(),
        _spec(scans=()),
        _spec(job_files=("/d/x.parquet", "/d/y.parquet", "/d/z.parquet")),
        _spec(result=True),
        _spec(scans=(ScanSpec("", "", (), ()),), output=OutputSpec(OutputKind.SINGLE), inputs=()),
        _spec(
            scans=(
                ScanSpec("t", "lineitem", ("a",), (FileSplit("/d/x.parquet", (0,), 5, 50),)),
                ScanSpec(
                    "__scan1", "nation", ("n_nationkey", "n_name"), (FileSplit("/d/n.parquet"),)
                ),
                ScanSpec(
                    "__scan2", "region", ("r_regionkey",), (FileSplit("/d/r.parquet", (1,), 5, 9),)
                ),
            )
        ),
        _spec(
            scans=(ScanSpec("__scan1", "supplier", ("s_suppkey",), (FileSplit("/d/s.parquet"),)),),
        ),
        _spec(
            scans=(
                ScanSpec(
                    "__scan",
                    "events",
                    ("k",),
                    (
                        FileSplit(
                            "s3://b/e.json.gz",
                            (3, 4),
                            10,
                            99,
                            object_size=7,
                            version="etag",
                            start=100,
                            stop=300,
                            text=TextFormat(
                                FileFormat.JSON,
                                (("k", "BIGINT"), ("d", "DECIMAL(15,2)")),
                                header=False,
                                delimiter="|",
                                null="NA",
                                compression=Compression.GZIP,
                                ignore_errors=True,
                                multiline=True,
                            ),
                        ),
                    ),
                ),
            ),
        ),
    ],
)
def test_task_spec_round_trip(spec: TaskSpec) -> None:
    wire = convert.task_spec_to_proto(spec).SerializeToString()
    assert convert.task_spec_from_proto(pb.TaskSpec.FromString(wire)) == spec


@pytest.mark.parametrize(
    "failure",
    [
        QueryError("bad"),
        QueryError("s3://b/k was overwritten", ErrorType.OBJECT_CHANGED),
        FragmentRejected("Binder Error: no column x"),
        ExecutionError("oom"),
        ExecutionError("no answer", error_type=ErrorType.OBJECT_STORE_UNAVAILABLE),
        FetchFailed(ExecutorId("e2"), StageId(1), 3, "refused"),
        FetchFailed(ExecutorId("e2"), StageId(1), 3, "checksum", FetchProblem.OUTPUT_LOST),
    ],
)
def test_failure_round_trip(failure: TaskFailure) -> None:
    assert convert.failure_from_proto(convert.failure_to_proto(failure)) == failure


def test_a_failure_from_an_older_or_newer_executor_keeps_its_kind() -> None:
    # No error type (an older executor), or one this scheduler does not know (a
    # newer one): the failure's kind still decides what is done, typed by default.
    for error_type in ("", "SomeNewError"):
        query = pb.TaskFailure(query=pb.QueryFailure(message="m", error_type=error_type))
        assert convert.failure_from_proto(query) == QueryError("m", ErrorType.QUERY)
        run = pb.TaskFailure(execution=pb.ExecutionFailure(message="m", error_type=error_type))
        assert convert.failure_from_proto(run) == ExecutionError("m")


def test_outputs_and_locations_round_trip() -> None:
    out = PartitionOutput(1, "/p", 3, 30, "x")
    assert convert.partition_output_from_proto(convert.partition_output_to_proto(out)) == out
    assert convert.partition_location_from_proto(convert.partition_location_to_proto(LOC)) == LOC


def test_timings_round_trip_and_an_old_executors_report_has_none() -> None:
    timings = TaskTimings(10.0, 10.5, 12.0, 0.1, 0.2, 0.9, 0.15, 0.01, 0.05, 0.02, 300, 400)
    msg = pb.ReportTaskRequest(timings=convert.timings_to_proto(timings))
    msg = pb.ReportTaskRequest.FromString(msg.SerializeToString())
    assert convert.timings_from_proto(msg) == timings
    assert convert.timings_from_proto(pb.ReportTaskRequest()) is None
    assert convert.timings_to_proto(None) is None


@pytest.mark.parametrize(
    "cmd",
    [
        LaunchTask(7, ExecutorId("e1"), _spec()),
        CancelTask(8, ExecutorId("e1"), ATTEMPT),
        ReleaseOutputs(9, ExecutorId("e1"), JobId("ab12"), None),
        ReleaseOutputs(9, ExecutorId("e1"), JobId("ab12"), (StageId(1), StageId(2))),
        ReleaseOutputs(9, ExecutorId("e1"), JobId("ab12"), ()),
    ],
)
def test_command_round_trip(cmd: LaunchTask | CancelTask | ReleaseOutputs) -> None:
    msg = pb.ExecutorCommand.FromString(convert.command_to_proto(cmd).SerializeToString())
    assert convert.command_from_proto(msg, ExecutorId("e1")) == cmd


def test_missing_fields_raise_protocol_error() -> None:
    with pytest.raises(convert.ProtocolError):
        convert.failure_from_proto(pb.TaskFailure())
    with pytest.raises(convert.ProtocolError):
        convert.task_spec_from_proto(pb.TaskSpec())
    with pytest.raises(convert.ProtocolError):
        convert.command_from_proto(pb.ExecutorCommand(), ExecutorId("e1"))
