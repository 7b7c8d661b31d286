from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OutputKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_KIND_UNSPECIFIED: _ClassVar[OutputKind]
    OUTPUT_KIND_HASH: _ClassVar[OutputKind]
    OUTPUT_KIND_SINGLE: _ClassVar[OutputKind]

class InputMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INPUT_MODE_UNSPECIFIED: _ClassVar[InputMode]
    INPUT_MODE_PARTITION: _ClassVar[InputMode]
    INPUT_MODE_ALL: _ClassVar[InputMode]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class ExecutorState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXECUTOR_STATE_UNSPECIFIED: _ClassVar[ExecutorState]
    EXECUTOR_STATE_ALIVE: _ClassVar[ExecutorState]
    EXECUTOR_STATE_DRAINING: _ClassVar[ExecutorState]
    EXECUTOR_STATE_LOST: _ClassVar[ExecutorState]
    EXECUTOR_STATE_CONNECTING: _ClassVar[ExecutorState]
OUTPUT_KIND_UNSPECIFIED: OutputKind
OUTPUT_KIND_HASH: OutputKind
OUTPUT_KIND_SINGLE: OutputKind
INPUT_MODE_UNSPECIFIED: InputMode
INPUT_MODE_PARTITION: InputMode
INPUT_MODE_ALL: InputMode
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
EXECUTOR_STATE_UNSPECIFIED: ExecutorState
EXECUTOR_STATE_ALIVE: ExecutorState
EXECUTOR_STATE_DRAINING: ExecutorState
EXECUTOR_STATE_LOST: ExecutorState
EXECUTOR_STATE_CONNECTING: ExecutorState

class TaskAttemptId(_message.Message):
    __slots__ = ("job", "stage", "partition", "attempt")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job: str
    stage: int
    partition: int
    attempt: int
    def __init__(self, job: _Optional[str] = ..., stage: _Optional[int] = ..., partition: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class OutputSpec(_message.Message):
    __slots__ = ("kind", "partitions", "keys")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    kind: OutputKind
    partitions: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[_Union[OutputKind, str]] = ..., partitions: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class FileSplit(_message.Message):
    __slots__ = ("path", "row_groups", "rows", "bytes", "object_size", "version", "start", "stop", "text")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROW_GROUPS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    OBJECT_SIZE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    path: str
    row_groups: _containers.RepeatedScalarFieldContainer[int]
    rows: int
    bytes: int
    object_size: int
    version: str
    start: int
    stop: int
    text: TextFormat
    def __init__(self, path: _Optional[str] = ..., row_groups: _Optional[_Iterable[int]] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., object_size: _Optional[int] = ..., version: _Optional[str] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ..., text: _Optional[_Union[TextFormat, _Mapping]] = ...) -> None: ...

class TextFormat(_message.Message):
    __slots__ = ("format", "columns", "header", "delimiter", "quote", "escape", "null", "compression", "ignore_errors", "multiline", "dateformat", "timestampformat")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DELIMITER_FIELD_NUMBER: _ClassVar[int]
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    ESCAPE_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    IGNORE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    MULTILINE_FIELD_NUMBER: _ClassVar[int]
    DATEFORMAT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPFORMAT_FIELD_NUMBER: _ClassVar[int]
    format: str
    columns: _containers.RepeatedCompositeFieldContainer[Column]
    header: bool
    delimiter: str
    quote: str
    escape: str
    null: str
    compression: str
    ignore_errors: bool
    multiline: bool
    dateformat: str
    timestampformat: str
    def __init__(self, format: _Optional[str] = ..., columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ..., header: _Optional[bool] = ..., delimiter: _Optional[str] = ..., quote: _Optional[str] = ..., escape: _Optional[str] = ..., null: _Optional[str] = ..., compression: _Optional[str] = ..., ignore_errors: _Optional[bool] = ..., multiline: _Optional[bool] = ..., dateformat: _Optional[str] = ..., timestampformat: _Optional[str] = ...) -> None: ...

class PartitionLocation(_message.Message):
    __slots__ = ("executor", "host", "flight_address", "stage", "map_partition", "partition", "path", "rows", "bytes", "checksum", "ticket", "data")
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MAP_PARTITION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    executor: str
    host: str
    flight_address: str
    stage: int
    map_partition: int
    partition: int
    path: str
    rows: int
    bytes: int
    checksum: str
    ticket: str
    data: bytes
    def __init__(self, executor: _Optional[str] = ..., host: _Optional[str] = ..., flight_address: _Optional[str] = ..., stage: _Optional[int] = ..., map_partition: _Optional[int] = ..., partition: _Optional[int] = ..., path: _Optional[str] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., checksum: _Optional[str] = ..., ticket: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class InputLocations(_message.Message):
    __slots__ = ("name", "stage", "mode", "locations", "columns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    name: str
    stage: int
    mode: InputMode
    locations: _containers.RepeatedCompositeFieldContainer[PartitionLocation]
    columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., stage: _Optional[int] = ..., mode: _Optional[_Union[InputMode, str]] = ..., locations: _Optional[_Iterable[_Union[PartitionLocation, _Mapping]]] = ..., columns: _Optional[_Iterable[str]] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("attempt", "sql", "output", "columns", "inputs", "scans", "job_files", "result", "sink", "whole_query")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    SCANS_FIELD_NUMBER: _ClassVar[int]
    JOB_FILES_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    SINK_FIELD_NUMBER: _ClassVar[int]
    WHOLE_QUERY_FIELD_NUMBER: _ClassVar[int]
    attempt: TaskAttemptId
    sql: str
    output: OutputSpec
    columns: _containers.RepeatedScalarFieldContainer[str]
    inputs: _containers.RepeatedCompositeFieldContainer[InputLocations]
    scans: _containers.RepeatedCompositeFieldContainer[ScanSpec]
    job_files: _containers.RepeatedScalarFieldContainer[str]
    result: bool
    sink: SinkSpec
    whole_query: bool
    def __init__(self, attempt: _Optional[_Union[TaskAttemptId, _Mapping]] = ..., sql: _Optional[str] = ..., output: _Optional[_Union[OutputSpec, _Mapping]] = ..., columns: _Optional[_Iterable[str]] = ..., inputs: _Optional[_Iterable[_Union[InputLocations, _Mapping]]] = ..., scans: _Optional[_Iterable[_Union[ScanSpec, _Mapping]]] = ..., job_files: _Optional[_Iterable[str]] = ..., result: _Optional[bool] = ..., sink: _Optional[_Union[SinkSpec, _Mapping]] = ..., whole_query: _Optional[bool] = ...) -> None: ...

class SinkSpec(_message.Message):
    __slots__ = ("target", "format", "staging", "partition_by", "columns", "compression", "row_group_size", "no_header", "delimiter", "quote", "escape", "null", "dateformat", "timestampformat")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    STAGING_FIELD_NUMBER: _ClassVar[int]
    PARTITION_BY_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    ROW_GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    NO_HEADER_FIELD_NUMBER: _ClassVar[int]
    DELIMITER_FIELD_NUMBER: _ClassVar[int]
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    ESCAPE_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELD_NUMBER: _ClassVar[int]
    DATEFORMAT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPFORMAT_FIELD_NUMBER: _ClassVar[int]
    target: str
    format: str
    staging: str
    partition_by: _containers.RepeatedScalarFieldContainer[str]
    columns: _containers.RepeatedScalarFieldContainer[str]
    compression: str
    row_group_size: int
    no_header: bool
    delimiter: str
    quote: str
    escape: str
    null: str
    dateformat: str
    timestampformat: str
    def __init__(self, target: _Optional[str] = ..., format: _Optional[str] = ..., staging: _Optional[str] = ..., partition_by: _Optional[_Iterable[str]] = ..., columns: _Optional[_Iterable[str]] = ..., compression: _Optional[str] = ..., row_group_size: _Optional[int] = ..., no_header: _Optional[bool] = ..., delimiter: _Optional[str] = ..., quote: _Optional[str] = ..., escape: _Optional[str] = ..., null: _Optional[str] = ..., dateformat: _Optional[str] = ..., timestampformat: _Optional[str] = ...) -> None: ...

class ScanSpec(_message.Message):
    __slots__ = ("name", "table", "columns", "splits")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    name: str
    table: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    splits: _containers.RepeatedCompositeFieldContainer[FileSplit]
    def __init__(self, name: _Optional[str] = ..., table: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., splits: _Optional[_Iterable[_Union[FileSplit, _Mapping]]] = ...) -> None: ...

class PartitionOutput(_message.Message):
    __slots__ = ("partition", "path", "rows", "bytes", "checksum", "data")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    partition: int
    path: str
    rows: int
    bytes: int
    checksum: str
    data: bytes
    def __init__(self, partition: _Optional[int] = ..., path: _Optional[str] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., checksum: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class TaskFailure(_message.Message):
    __slots__ = ("query", "execution", "fetch", "fragment")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    query: QueryFailure
    execution: ExecutionFailure
    fetch: FetchFailure
    fragment: FragmentFailure
    def __init__(self, query: _Optional[_Union[QueryFailure, _Mapping]] = ..., execution: _Optional[_Union[ExecutionFailure, _Mapping]] = ..., fetch: _Optional[_Union[FetchFailure, _Mapping]] = ..., fragment: _Optional[_Union[FragmentFailure, _Mapping]] = ...) -> None: ...

class FragmentFailure(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class QueryFailure(_message.Message):
    __slots__ = ("message", "error_type")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    message: str
    error_type: str
    def __init__(self, message: _Optional[str] = ..., error_type: _Optional[str] = ...) -> None: ...

class ExecutionFailure(_message.Message):
    __slots__ = ("message", "problem", "error_type")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    message: str
    problem: str
    error_type: str
    def __init__(self, message: _Optional[str] = ..., problem: _Optional[str] = ..., error_type: _Optional[str] = ...) -> None: ...

class FetchFailure(_message.Message):
    __slots__ = ("executor", "stage", "map_partition", "message", "output_lost")
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MAP_PARTITION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LOST_FIELD_NUMBER: _ClassVar[int]
    executor: str
    stage: int
    map_partition: int
    message: str
    output_lost: bool
    def __init__(self, executor: _Optional[str] = ..., stage: _Optional[int] = ..., map_partition: _Optional[int] = ..., message: _Optional[str] = ..., output_lost: _Optional[bool] = ...) -> None: ...

class RegisterExecutorRequest(_message.Message):
    __slots__ = ("host", "flight_address", "slots", "pid", "work_dir", "resume_executor_id", "held_paths", "held_jobs", "cores", "threads")
    HOST_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    WORK_DIR_FIELD_NUMBER: _ClassVar[int]
    RESUME_EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_PATHS_FIELD_NUMBER: _ClassVar[int]
    HELD_JOBS_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    host: str
    flight_address: str
    slots: int
    pid: int
    work_dir: str
    resume_executor_id: str
    held_paths: _containers.RepeatedScalarFieldContainer[str]
    held_jobs: _containers.RepeatedScalarFieldContainer[str]
    cores: int
    threads: int
    def __init__(self, host: _Optional[str] = ..., flight_address: _Optional[str] = ..., slots: _Optional[int] = ..., pid: _Optional[int] = ..., work_dir: _Optional[str] = ..., resume_executor_id: _Optional[str] = ..., held_paths: _Optional[_Iterable[str]] = ..., held_jobs: _Optional[_Iterable[str]] = ..., cores: _Optional[int] = ..., threads: _Optional[int] = ...) -> None: ...

class RegisterExecutorResponse(_message.Message):
    __slots__ = ("executor_id", "heartbeat_interval_s", "resumed")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    heartbeat_interval_s: float
    resumed: bool
    def __init__(self, executor_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., resumed: _Optional[bool] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ("executor_id", "reopen", "holding", "finished", "held_jobs")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    REOPEN_FIELD_NUMBER: _ClassVar[int]
    HOLDING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    HELD_JOBS_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    reopen: bool
    holding: _containers.RepeatedCompositeFieldContainer[TaskAttemptId]
    finished: _containers.RepeatedCompositeFieldContainer[TaskAttemptId]
    held_jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, executor_id: _Optional[str] = ..., reopen: _Optional[bool] = ..., holding: _Optional[_Iterable[_Union[TaskAttemptId, _Mapping]]] = ..., finished: _Optional[_Iterable[_Union[TaskAttemptId, _Mapping]]] = ..., held_jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class LaunchTask(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskSpec
    def __init__(self, task: _Optional[_Union[TaskSpec, _Mapping]] = ...) -> None: ...

class CancelTask(_message.Message):
    __slots__ = ("attempt",)
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    attempt: TaskAttemptId
    def __init__(self, attempt: _Optional[_Union[TaskAttemptId, _Mapping]] = ...) -> None: ...

class ReleaseOutputs(_message.Message):
    __slots__ = ("job", "stages", "all_stages")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    ALL_STAGES_FIELD_NUMBER: _ClassVar[int]
    job: str
    stages: _containers.RepeatedScalarFieldContainer[int]
    all_stages: bool
    def __init__(self, job: _Optional[str] = ..., stages: _Optional[_Iterable[int]] = ..., all_stages: _Optional[bool] = ...) -> None: ...

class ExecutorCommand(_message.Message):
    __slots__ = ("cause", "launch", "cancel", "release")
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    cause: int
    launch: LaunchTask
    cancel: CancelTask
    release: ReleaseOutputs
    def __init__(self, cause: _Optional[int] = ..., launch: _Optional[_Union[LaunchTask, _Mapping]] = ..., cancel: _Optional[_Union[CancelTask, _Mapping]] = ..., release: _Optional[_Union[ReleaseOutputs, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("executor_id", "running_tasks", "unhealthy", "links", "probes", "failed_beats")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    FAILED_BEATS_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    running_tasks: int
    unhealthy: str
    links: _containers.RepeatedCompositeFieldContainer[LinkSample]
    probes: _containers.RepeatedCompositeFieldContainer[LinkSample]
    failed_beats: int
    def __init__(self, executor_id: _Optional[str] = ..., running_tasks: _Optional[int] = ..., unhealthy: _Optional[str] = ..., links: _Optional[_Iterable[_Union[LinkSample, _Mapping]]] = ..., probes: _Optional[_Iterable[_Union[LinkSample, _Mapping]]] = ..., failed_beats: _Optional[int] = ...) -> None: ...

class LinkSample(_message.Message):
    __slots__ = ("peer", "bytes", "busy_s")
    PEER_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    peer: str
    bytes: int
    busy_s: float
    def __init__(self, peer: _Optional[str] = ..., bytes: _Optional[int] = ..., busy_s: _Optional[float] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("reregister", "probe")
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    reregister: bool
    probe: _containers.RepeatedCompositeFieldContainer[ProbeTarget]
    def __init__(self, reregister: _Optional[bool] = ..., probe: _Optional[_Iterable[_Union[ProbeTarget, _Mapping]]] = ...) -> None: ...

class ProbeTarget(_message.Message):
    __slots__ = ("executor_id", "flight_address")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    flight_address: str
    def __init__(self, executor_id: _Optional[str] = ..., flight_address: _Optional[str] = ...) -> None: ...

class TaskCompletedReport(_message.Message):
    __slots__ = ("outputs",)
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[PartitionOutput]
    def __init__(self, outputs: _Optional[_Iterable[_Union[PartitionOutput, _Mapping]]] = ...) -> None: ...

class TaskTimings(_message.Message):
    __slots__ = ("received_at", "started_at", "ended_at", "setup_s", "fetch_s", "execute_s", "write_s", "cleanup_s", "fetch_remote_s", "write_io_s", "fetched_local_bytes", "fetched_remote_bytes")
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    SETUP_S_FIELD_NUMBER: _ClassVar[int]
    FETCH_S_FIELD_NUMBER: _ClassVar[int]
    EXECUTE_S_FIELD_NUMBER: _ClassVar[int]
    WRITE_S_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_S_FIELD_NUMBER: _ClassVar[int]
    FETCH_REMOTE_S_FIELD_NUMBER: _ClassVar[int]
    WRITE_IO_S_FIELD_NUMBER: _ClassVar[int]
    FETCHED_LOCAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FETCHED_REMOTE_BYTES_FIELD_NUMBER: _ClassVar[int]
    received_at: float
    started_at: float
    ended_at: float
    setup_s: float
    fetch_s: float
    execute_s: float
    write_s: float
    cleanup_s: float
    fetch_remote_s: float
    write_io_s: float
    fetched_local_bytes: int
    fetched_remote_bytes: int
    def __init__(self, received_at: _Optional[float] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., setup_s: _Optional[float] = ..., fetch_s: _Optional[float] = ..., execute_s: _Optional[float] = ..., write_s: _Optional[float] = ..., cleanup_s: _Optional[float] = ..., fetch_remote_s: _Optional[float] = ..., write_io_s: _Optional[float] = ..., fetched_local_bytes: _Optional[int] = ..., fetched_remote_bytes: _Optional[int] = ...) -> None: ...

class ReportTaskRequest(_message.Message):
    __slots__ = ("attempt", "executor_id", "completed", "failed", "elapsed_s", "timings")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    attempt: TaskAttemptId
    executor_id: str
    completed: TaskCompletedReport
    failed: TaskFailure
    elapsed_s: float
    timings: TaskTimings
    def __init__(self, attempt: _Optional[_Union[TaskAttemptId, _Mapping]] = ..., executor_id: _Optional[str] = ..., completed: _Optional[_Union[TaskCompletedReport, _Mapping]] = ..., failed: _Optional[_Union[TaskFailure, _Mapping]] = ..., elapsed_s: _Optional[float] = ..., timings: _Optional[_Union[TaskTimings, _Mapping]] = ...) -> None: ...

class ReportTaskResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("executor_id",)
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    def __init__(self, executor_id: _Optional[str] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Column(_message.Message):
    __slots__ = ("name", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("name", "location", "columns", "rows", "bytes", "files", "format")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    name: str
    location: str
    columns: _containers.RepeatedCompositeFieldContainer[Column]
    rows: int
    bytes: int
    files: _containers.RepeatedScalarFieldContainer[str]
    format: str
    def __init__(self, name: _Optional[str] = ..., location: _Optional[str] = ..., columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., files: _Optional[_Iterable[str]] = ..., format: _Optional[str] = ...) -> None: ...

class RegisterTableRequest(_message.Message):
    __slots__ = ("name", "path", "format", "options", "columns")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    format: str
    options: _containers.ScalarMap[str, str]
    columns: _containers.RepeatedCompositeFieldContainer[Column]
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., format: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ...) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("tables", "unreadable")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableInfo]
    unreadable: _containers.RepeatedCompositeFieldContainer[UnreadableTable]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ..., unreadable: _Optional[_Iterable[_Union[UnreadableTable, _Mapping]]] = ...) -> None: ...

class UnreadableTable(_message.Message):
    __slots__ = ("name", "location", "error", "since")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    location: str
    error: str
    since: float
    def __init__(self, name: _Optional[str] = ..., location: _Optional[str] = ..., error: _Optional[str] = ..., since: _Optional[float] = ...) -> None: ...

class DropTableRequest(_message.Message):
    __slots__ = ("name", "request_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    request_id: str
    def __init__(self, name: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class DropTableResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("sql", "dialect")
    SQL_FIELD_NUMBER: _ClassVar[int]
    DIALECT_FIELD_NUMBER: _ClassVar[int]
    sql: str
    dialect: str
    def __init__(self, sql: _Optional[str] = ..., dialect: _Optional[str] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("sql", "dialect", "request_id")
    SQL_FIELD_NUMBER: _ClassVar[int]
    DIALECT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    sql: str
    dialect: str
    request_id: str
    def __init__(self, sql: _Optional[str] = ..., dialect: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("job_id", "columns")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id", "final_only")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FINAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    final_only: bool
    def __init__(self, job_id: _Optional[str] = ..., final_only: _Optional[bool] = ...) -> None: ...

class StageStatus(_message.Message):
    __slots__ = ("stage", "label", "tasks_total", "tasks_done", "tasks_running", "rows", "bytes", "elapsed_s", "attempts", "tasks_pending", "tasks_rerun", "outputs_recomputed", "tasks_planned", "phases")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    TASKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TASKS_DONE_FIELD_NUMBER: _ClassVar[int]
    TASKS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TASKS_PENDING_FIELD_NUMBER: _ClassVar[int]
    TASKS_RERUN_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_RECOMPUTED_FIELD_NUMBER: _ClassVar[int]
    TASKS_PLANNED_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    stage: int
    label: str
    tasks_total: int
    tasks_done: int
    tasks_running: int
    rows: int
    bytes: int
    elapsed_s: float
    attempts: int
    tasks_pending: int
    tasks_rerun: int
    outputs_recomputed: int
    tasks_planned: int
    phases: StagePhases
    def __init__(self, stage: _Optional[int] = ..., label: _Optional[str] = ..., tasks_total: _Optional[int] = ..., tasks_done: _Optional[int] = ..., tasks_running: _Optional[int] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., elapsed_s: _Optional[float] = ..., attempts: _Optional[int] = ..., tasks_pending: _Optional[int] = ..., tasks_rerun: _Optional[int] = ..., outputs_recomputed: _Optional[int] = ..., tasks_planned: _Optional[int] = ..., phases: _Optional[_Union[StagePhases, _Mapping]] = ...) -> None: ...

class StagePhases(_message.Message):
    __slots__ = ("tasks", "executors", "launch_s", "setup_s", "fetch_s", "execute_s", "write_s", "cleanup_s", "other_s", "report_s", "task_median_s", "task_max_s", "fetched_local_bytes", "fetched_remote_bytes", "fetch_remote_s", "write_io_s")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_S_FIELD_NUMBER: _ClassVar[int]
    SETUP_S_FIELD_NUMBER: _ClassVar[int]
    FETCH_S_FIELD_NUMBER: _ClassVar[int]
    EXECUTE_S_FIELD_NUMBER: _ClassVar[int]
    WRITE_S_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_S_FIELD_NUMBER: _ClassVar[int]
    OTHER_S_FIELD_NUMBER: _ClassVar[int]
    REPORT_S_FIELD_NUMBER: _ClassVar[int]
    TASK_MEDIAN_S_FIELD_NUMBER: _ClassVar[int]
    TASK_MAX_S_FIELD_NUMBER: _ClassVar[int]
    FETCHED_LOCAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FETCHED_REMOTE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FETCH_REMOTE_S_FIELD_NUMBER: _ClassVar[int]
    WRITE_IO_S_FIELD_NUMBER: _ClassVar[int]
    tasks: int
    executors: int
    launch_s: float
    setup_s: float
    fetch_s: float
    execute_s: float
    write_s: float
    cleanup_s: float
    other_s: float
    report_s: float
    task_median_s: float
    task_max_s: float
    fetched_local_bytes: int
    fetched_remote_bytes: int
    fetch_remote_s: float
    write_io_s: float
    def __init__(self, tasks: _Optional[int] = ..., executors: _Optional[int] = ..., launch_s: _Optional[float] = ..., setup_s: _Optional[float] = ..., fetch_s: _Optional[float] = ..., execute_s: _Optional[float] = ..., write_s: _Optional[float] = ..., cleanup_s: _Optional[float] = ..., other_s: _Optional[float] = ..., report_s: _Optional[float] = ..., task_median_s: _Optional[float] = ..., task_max_s: _Optional[float] = ..., fetched_local_bytes: _Optional[int] = ..., fetched_remote_bytes: _Optional[int] = ..., fetch_remote_s: _Optional[float] = ..., write_io_s: _Optional[float] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "state", "sql", "columns", "stages", "submitted_at", "elapsed_s", "error", "error_type", "result", "tasks_rerun", "outputs_recomputed", "owner", "took_effect")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TASKS_RERUN_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_RECOMPUTED_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TOOK_EFFECT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: JobState
    sql: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    stages: _containers.RepeatedCompositeFieldContainer[StageStatus]
    submitted_at: float
    elapsed_s: float
    error: str
    error_type: str
    result: _containers.RepeatedCompositeFieldContainer[PartitionLocation]
    tasks_rerun: int
    outputs_recomputed: int
    owner: str
    took_effect: bool
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., sql: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., stages: _Optional[_Iterable[_Union[StageStatus, _Mapping]]] = ..., submitted_at: _Optional[float] = ..., elapsed_s: _Optional[float] = ..., error: _Optional[str] = ..., error_type: _Optional[str] = ..., result: _Optional[_Iterable[_Union[PartitionLocation, _Mapping]]] = ..., tasks_rerun: _Optional[int] = ..., outputs_recomputed: _Optional[int] = ..., owner: _Optional[str] = ..., took_effect: _Optional[bool] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExecutorStatus(_message.Message):
    __slots__ = ("id", "host", "flight_address", "slots", "pid", "state", "since", "reason", "detail", "running_tasks", "heartbeat_age_s", "unhealthy", "slow_link_since", "slow_link_until", "slow_link", "lagging_since")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    SLOW_LINK_SINCE_FIELD_NUMBER: _ClassVar[int]
    SLOW_LINK_UNTIL_FIELD_NUMBER: _ClassVar[int]
    SLOW_LINK_FIELD_NUMBER: _ClassVar[int]
    LAGGING_SINCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    flight_address: str
    slots: int
    pid: int
    state: ExecutorState
    since: float
    reason: str
    detail: str
    running_tasks: int
    heartbeat_age_s: float
    unhealthy: str
    slow_link_since: float
    slow_link_until: float
    slow_link: str
    lagging_since: float
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., flight_address: _Optional[str] = ..., slots: _Optional[int] = ..., pid: _Optional[int] = ..., state: _Optional[_Union[ExecutorState, str]] = ..., since: _Optional[float] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., running_tasks: _Optional[int] = ..., heartbeat_age_s: _Optional[float] = ..., unhealthy: _Optional[str] = ..., slow_link_since: _Optional[float] = ..., slow_link_until: _Optional[float] = ..., slow_link: _Optional[str] = ..., lagging_since: _Optional[float] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("scheduler_address", "executors", "jobs")
    SCHEDULER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    scheduler_address: str
    executors: _containers.RepeatedCompositeFieldContainer[ExecutorStatus]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    def __init__(self, scheduler_address: _Optional[str] = ..., executors: _Optional[_Iterable[_Union[ExecutorStatus, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ...) -> None: ...

class ReleaseResultRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ReleaseResultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AuthenticateRequest(_message.Message):
    __slots__ = ("user", "password")
    USER_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    user: str
    password: str
    def __init__(self, user: _Optional[str] = ..., password: _Optional[str] = ...) -> None: ...

class AuthenticateResponse(_message.Message):
    __slots__ = ("token", "expires_at", "expires_in_s", "user", "admin")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    token: str
    expires_at: float
    expires_in_s: float
    user: str
    admin: bool
    def __init__(self, token: _Optional[str] = ..., expires_at: _Optional[float] = ..., expires_in_s: _Optional[float] = ..., user: _Optional[str] = ..., admin: _Optional[bool] = ...) -> None: ...
