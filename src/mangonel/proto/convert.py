"""Conversions between wire messages (``mangonel_pb2``) and domain dataclasses.

Generated code stays in ``mangonel.proto``: the scheduler and executor shells
call these functions at their gRPC boundary and work with the dataclasses of
``mangonel.scheduler.events`` and ``mangonel.plan.physical`` everywhere else.
Each ``*_to_proto`` has a matching ``*_from_proto``; a round trip is the identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from mangonel.errors import ErrorType
from mangonel.ids import ExecutorId, JobId, StageId, TaskAttemptId, TaskId
from mangonel.proto import mangonel_pb2 as pb
from mangonel.task import (
    CancelTask,
    Compression,
    ExecutionError,
    ExecutionProblem,
    FetchFailed,
    FetchProblem,
    FileFormat,
    FileSplit,
    FragmentRejected,
    InputLocations,
    InputMode,
    LaunchTask,
    LinkSample,
    OutputKind,
    OutputSpec,
    PartitionLocation,
    PartitionOutput,
    ProbeTarget,
    QueryError,
    ReleaseOutputs,
    ScanSpec,
    SinkSpec,
    TaskFailure,
    TaskSpec,
    TaskTimings,
    TextFormat,
    WriteCompression,
    WriteFormat,
    WriteOptions,
)

ExecutorCommandKind = LaunchTask | CancelTask | ReleaseOutputs
"""The commands the scheduler pushes on an executor's Connect stream."""

_OUTPUT_KIND = {OutputKind.HASH: pb.OUTPUT_KIND_HASH, OutputKind.SINGLE: pb.OUTPUT_KIND_SINGLE}
_OUTPUT_KIND_BACK = {v: k for k, v in _OUTPUT_KIND.items()}
_INPUT_MODE = {InputMode.PARTITION: pb.INPUT_MODE_PARTITION, InputMode.ALL: pb.INPUT_MODE_ALL}
_INPUT_MODE_BACK = {v: k for k, v in _INPUT_MODE.items()}


class ProtocolError(ValueError):
    """A message is missing a required field or holds an unknown enum value."""


# ----------------------------------------------------------------------------- ids


def attempt_to_proto(attempt: TaskAttemptId) -> pb.TaskAttemptId:
    t = attempt.task
    return pb.TaskAttemptId(
        job=t.job, stage=int(t.stage), partition=t.partition, attempt=attempt.attempt
    )


def attempt_from_proto(msg: pb.TaskAttemptId) -> TaskAttemptId:
    if not msg.job:
        raise ProtocolError("TaskAttemptId without a job id")
    task = TaskId(JobId(msg.job), StageId(msg.stage), msg.partition)
    return TaskAttemptId(task, msg.attempt)


# ---------------------------------------------------------------------- plan parts


def output_spec_to_proto(spec: OutputSpec) -> pb.OutputSpec:
    return pb.OutputSpec(
        kind=_OUTPUT_KIND[spec.kind], partitions=spec.partitions, keys=list(spec.keys)
    )


def output_spec_from_proto(msg: pb.OutputSpec) -> OutputSpec:
    try:
        kind = _OUTPUT_KIND_BACK[msg.kind]
    except KeyError:
        raise ProtocolError(f"unknown output kind {msg.kind}") from None
    return OutputSpec(kind=kind, partitions=msg.partitions, keys=tuple(msg.keys))


def file_split_to_proto(split: FileSplit) -> pb.FileSplit:
    msg = pb.FileSplit(
        path=split.path,
        row_groups=list(split.row_groups),
        rows=split.rows,
        bytes=split.bytes,
        object_size=split.object_size,
        version=split.version,
        start=split.start,
        stop=split.stop,
    )
    if split.text is not None:
        msg.text.CopyFrom(text_format_to_proto(split.text))
    return msg


def file_split_from_proto(msg: pb.FileSplit) -> FileSplit:
    return FileSplit(
        path=msg.path,
        row_groups=tuple(msg.row_groups),
        rows=msg.rows,
        bytes=msg.bytes,
        object_size=msg.object_size,
        version=msg.version,
        start=msg.start,
        stop=msg.stop,
        text=text_format_from_proto(msg.text) if msg.HasField("text") else None,
    )


def text_format_to_proto(fmt: TextFormat) -> pb.TextFormat:
    return pb.TextFormat(
        format=fmt.format.value,
        columns=[pb.Column(name=n, type=t) for n, t in fmt.columns],
        header=fmt.header,
        delimiter=fmt.delimiter,
        quote=fmt.quote,
        escape=fmt.escape,
        null=fmt.null,
        compression=fmt.compression.value,
        ignore_errors=fmt.ignore_errors,
        multiline=fmt.multiline,
        dateformat=fmt.dateformat,
        timestampformat=fmt.timestampformat,
    )


def text_format_from_proto(msg: pb.TextFormat) -> TextFormat:
    try:
        kind, compression = FileFormat(msg.format), Compression(msg.compression)
    except ValueError:
        raise ProtocolError(f"unknown text format {msg.format!r} / {msg.compression!r}") from None
    return TextFormat(
        format=kind,
        columns=tuple((c.name, c.type) for c in msg.columns),
        header=msg.header,
        delimiter=msg.delimiter,
        quote=msg.quote,
        escape=msg.escape,
        null=msg.null,
        compression=compression,
        ignore_errors=msg.ignore_errors,
        multiline=msg.multiline,
        dateformat=msg.dateformat,
        timestampformat=msg.timestampformat,
    )


def input_mode_from_proto(value: int) -> InputMode:
    try:
        return _INPUT_MODE_BACK[value]  # type: ignore[index]
    except KeyError:
        raise ProtocolError(f"unknown input mode {value}") from None


# ---------------------------------------------------------------- shuffle outputs


def partition_output_to_proto(out: PartitionOutput) -> pb.PartitionOutput:
    return pb.PartitionOutput(
        partition=out.partition,
        path=out.path,
        rows=out.rows,
        bytes=out.bytes,
        checksum=out.checksum,
    )


def partition_output_from_proto(msg: pb.PartitionOutput) -> PartitionOutput:
    return PartitionOutput(
        partition=msg.partition,
        path=msg.path,
        rows=msg.rows,
        bytes=msg.bytes,
        checksum=msg.checksum,
    )


def partition_location_to_proto(loc: PartitionLocation) -> pb.PartitionLocation:
    return pb.PartitionLocation(
        executor=loc.executor,
        host=loc.host,
        flight_address=loc.flight_address,
        stage=int(loc.stage),
        map_partition=loc.map_partition,
        partition=loc.partition,
        path=loc.path,
        rows=loc.rows,
        bytes=loc.bytes,
        checksum=loc.checksum,
        ticket=loc.ticket,
    )


def partition_location_from_proto(msg: pb.PartitionLocation) -> PartitionLocation:
    return PartitionLocation(
        executor=ExecutorId(msg.executor),
        host=msg.host,
        flight_address=msg.flight_address,
        stage=StageId(msg.stage),
        map_partition=msg.map_partition,
        partition=msg.partition,
        path=msg.path,
        rows=msg.rows,
        bytes=msg.bytes,
        checksum=msg.checksum,
        ticket=msg.ticket,
    )


def input_locations_to_proto(inp: InputLocations) -> pb.InputLocations:
    return pb.InputLocations(
        name=inp.name,
        stage=int(inp.stage),
        mode=_INPUT_MODE[inp.mode],
        locations=[partition_location_to_proto(loc) for loc in inp.locations],
        columns=list(inp.columns),
    )


def input_locations_from_proto(msg: pb.InputLocations) -> InputLocations:
    return InputLocations(
        name=msg.name,
        stage=StageId(msg.stage),
        mode=input_mode_from_proto(msg.mode),
        locations=tuple(partition_location_from_proto(m) for m in msg.locations),
        columns=tuple(msg.columns),
    )


# --------------------------------------------------------------------------- tasks


def task_spec_to_proto(spec: TaskSpec) -> pb.TaskSpec:
    return pb.TaskSpec(
        attempt=attempt_to_proto(spec.attempt),
        sql=spec.sql,
        output=output_spec_to_proto(spec.output),
        columns=list(spec.columns),
        inputs=[input_locations_to_proto(i) for i in spec.inputs],
        scans=[
            pb.ScanSpec(
                name=s.name,
                table=s.table,
                columns=list(s.columns),
                splits=[file_split_to_proto(f) for f in s.splits],
            )
            for s in spec.scans
        ],
        job_files=list(spec.job_files),
        result=spec.result,
        sink=_sink_to_proto(spec.sink),
        whole_query=spec.whole_query,
    )


def _sink_to_proto(sink: SinkSpec | None) -> pb.SinkSpec | None:
    if sink is None:
        return None
    return pb.SinkSpec(
        target=sink.target,
        format=sink.format.value,
        staging=sink.staging,
        partition_by=list(sink.partition_by),
        columns=list(sink.columns),
        compression=sink.options.compression.value if sink.options.compression else "",
        row_group_size=sink.options.row_group_size or 0,
        no_header=not sink.options.header,
        delimiter=sink.options.delimiter,
        quote=sink.options.quote,
        escape=sink.options.escape,
        null=sink.options.null,
        dateformat=sink.options.dateformat or "",
        timestampformat=sink.options.timestampformat or "",
    )


def _sink_from_proto(msg: pb.TaskSpec) -> SinkSpec | None:
    if not msg.HasField("sink"):
        return None
    try:
        fmt = WriteFormat(msg.sink.format)
    except ValueError as err:
        raise ProtocolError(f"unknown write format {msg.sink.format!r}") from err
    try:
        compression = WriteCompression(msg.sink.compression) if msg.sink.compression else None
    except ValueError as err:
        raise ProtocolError(f"unknown compression {msg.sink.compression!r}") from err
    sink = msg.sink
    options = WriteOptions(
        compression,
        sink.row_group_size or None,
        not sink.no_header,
        sink.delimiter or ",",
        quote=sink.quote if sink.HasField("quote") else None,
        escape=sink.escape if sink.HasField("escape") else None,
        null=sink.null if sink.HasField("null") else None,
        dateformat=sink.dateformat or None,
        timestampformat=sink.timestampformat or None,
    )
    return SinkSpec(
        msg.sink.target,
        fmt,
        msg.sink.staging,
        tuple(msg.sink.columns),
        tuple(msg.sink.partition_by),
        options,
    )


def task_spec_from_proto(msg: pb.TaskSpec) -> TaskSpec:
    if not msg.HasField("attempt") or not msg.HasField("output"):
        raise ProtocolError("TaskSpec without attempt or output")
    return TaskSpec(
        attempt=attempt_from_proto(msg.attempt),
        sql=msg.sql,
        output=output_spec_from_proto(msg.output),
        columns=tuple(msg.columns),
        scans=tuple(
            ScanSpec(
                s.name,
                s.table,
                tuple(s.columns),
                tuple(file_split_from_proto(f) for f in s.splits),
            )
            for s in msg.scans
        ),
        inputs=tuple(input_locations_from_proto(i) for i in msg.inputs),
        job_files=tuple(msg.job_files),
        result=msg.result,
        sink=_sink_from_proto(msg),
        whole_query=msg.whole_query,
    )


def failure_to_proto(failure: TaskFailure) -> pb.TaskFailure:
    if isinstance(failure, QueryError):
        error_type = "" if failure.error_type is ErrorType.QUERY else failure.error_type.value
        return pb.TaskFailure(query=pb.QueryFailure(message=failure.message, error_type=error_type))
    if isinstance(failure, FragmentRejected):
        return pb.TaskFailure(fragment=pb.FragmentFailure(message=failure.message))
    if isinstance(failure, ExecutionError):
        problem = "" if failure.problem is ExecutionProblem.OTHER else failure.problem.value
        error_type = "" if failure.error_type is ErrorType.JOB_FAILED else failure.error_type.value
        return pb.TaskFailure(
            execution=pb.ExecutionFailure(
                message=failure.message, problem=problem, error_type=error_type
            )
        )
    return pb.TaskFailure(
        fetch=pb.FetchFailure(
            executor=failure.executor,
            stage=int(failure.stage),
            map_partition=failure.map_partition,
            message=failure.message,
            output_lost=failure.problem is FetchProblem.OUTPUT_LOST,
        )
    )


def _error_type(value: str, default: ErrorType) -> ErrorType:
    """An ``ErrorType`` off the wire: ``default`` when unset (an older executor) or
    unknown (a type a newer one knows; the failure is still acted on by its kind)."""
    try:
        return ErrorType(value) if value else default
    except ValueError:
        return default


def failure_from_proto(msg: pb.TaskFailure) -> TaskFailure:
    kind = msg.WhichOneof("kind")
    if kind == "query":
        return QueryError(msg.query.message, _error_type(msg.query.error_type, ErrorType.QUERY))
    if kind == "fragment":
        return FragmentRejected(msg.fragment.message)
    if kind == "execution":
        try:
            kind = ExecutionProblem(msg.execution.problem or ExecutionProblem.OTHER.value)
        except ValueError:  # a kind a newer executor knows: still a retryable failure
            kind = ExecutionProblem.OTHER
        error_type = _error_type(msg.execution.error_type, ErrorType.JOB_FAILED)
        return ExecutionError(msg.execution.message, kind, error_type)
    if kind == "fetch":
        f = msg.fetch
        problem = FetchProblem.OUTPUT_LOST if f.output_lost else FetchProblem.UNREACHABLE
        return FetchFailed(
            ExecutorId(f.executor), StageId(f.stage), f.map_partition, f.message, problem
        )
    raise ProtocolError("TaskFailure without a kind")


_TIMING_FIELDS = tuple(f.name for f in fields(TaskTimings))


def timings_to_proto(timings: TaskTimings | None) -> pb.TaskTimings | None:
    """The message of an attempt's timings; ``None`` leaves the field unset."""
    if timings is None:
        return None
    return pb.TaskTimings(**{name: getattr(timings, name) for name in _TIMING_FIELDS})


def links_to_proto(samples: Sequence[LinkSample]) -> list[pb.LinkSample]:
    """A heartbeat's link samples on the wire."""
    return [pb.LinkSample(peer=s.peer, bytes=s.bytes, busy_s=s.busy_s) for s in samples]


def links_from_proto(msg: pb.HeartbeatRequest) -> tuple[LinkSample, ...]:
    """The link samples a heartbeat carries (none from an older executor)."""
    return tuple(LinkSample(ExecutorId(s.peer), s.bytes, s.busy_s) for s in msg.links)


def probes_from_proto(msg: pb.HeartbeatRequest) -> tuple[LinkSample, ...]:
    """The link probes a heartbeat carries, one sample each (none from an older executor)."""
    return tuple(LinkSample(ExecutorId(s.peer), s.bytes, s.busy_s) for s in msg.probes)


def probe_targets_to_proto(targets: Sequence[ProbeTarget]) -> list[pb.ProbeTarget]:
    """The peers a heartbeat's answer asks the executor to probe."""
    return [
        pb.ProbeTarget(executor_id=t.executor, flight_address=t.flight_address) for t in targets
    ]


def probe_targets_from_proto(msg: pb.HeartbeatResponse) -> tuple[ProbeTarget, ...]:
    """The peers to probe (none from an older scheduler)."""
    return tuple(ProbeTarget(ExecutorId(t.executor_id), t.flight_address) for t in msg.probe)


def timings_from_proto(msg: pb.ReportTaskRequest) -> TaskTimings | None:
    """The timings a report carries; ``None`` from an executor that sent none."""
    if not msg.HasField("timings"):
        return None
    return TaskTimings(**{name: getattr(msg.timings, name) for name in _TIMING_FIELDS})


# ------------------------------------------------------------------------ commands


def command_to_proto(cmd: ExecutorCommandKind) -> pb.ExecutorCommand:
    """The message pushed on the executor's Connect stream for ``cmd``."""
    if isinstance(cmd, LaunchTask):
        return pb.ExecutorCommand(
            cause=cmd.cause, launch=pb.LaunchTask(task=task_spec_to_proto(cmd.task))
        )
    if isinstance(cmd, CancelTask):
        return pb.ExecutorCommand(
            cause=cmd.cause, cancel=pb.CancelTask(attempt=attempt_to_proto(cmd.attempt))
        )
    stages = [] if cmd.stages is None else [int(s) for s in cmd.stages]
    return pb.ExecutorCommand(
        cause=cmd.cause,
        release=pb.ReleaseOutputs(job=cmd.job, stages=stages, all_stages=cmd.stages is None),
    )


def command_from_proto(msg: pb.ExecutorCommand, executor: ExecutorId) -> ExecutorCommandKind:
    """The domain command behind a Connect-stream message, addressed to ``executor``."""
    kind = msg.WhichOneof("command")
    if kind == "launch":
        return LaunchTask(msg.cause, executor, task_spec_from_proto(msg.launch.task))
    if kind == "cancel":
        return CancelTask(msg.cause, executor, attempt_from_proto(msg.cancel.attempt))
    if kind == "release":
        r = msg.release
        stages = None if r.all_stages else tuple(StageId(s) for s in r.stages)
        return ReleaseOutputs(msg.cause, executor, JobId(r.job), stages)
    raise ProtocolError("ExecutorCommand without a command")
