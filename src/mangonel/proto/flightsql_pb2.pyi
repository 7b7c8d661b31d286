from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CancelStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_STATUS_UNSPECIFIED: _ClassVar[CancelStatus]
    CANCEL_STATUS_CANCELLED: _ClassVar[CancelStatus]
    CANCEL_STATUS_CANCELLING: _ClassVar[CancelStatus]
    CANCEL_STATUS_NOT_CANCELLABLE: _ClassVar[CancelStatus]
CANCEL_STATUS_UNSPECIFIED: CancelStatus
CANCEL_STATUS_CANCELLED: CancelStatus
CANCEL_STATUS_CANCELLING: CancelStatus
CANCEL_STATUS_NOT_CANCELLABLE: CancelStatus

class CommandGetSqlInfo(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, info: _Optional[_Iterable[int]] = ...) -> None: ...

class CommandGetXdbcTypeInfo(_message.Message):
    __slots__ = ("data_type",)
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    data_type: int
    def __init__(self, data_type: _Optional[int] = ...) -> None: ...

class CommandGetCatalogs(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CommandGetDbSchemas(_message.Message):
    __slots__ = ("catalog", "db_schema_filter_pattern")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    DB_SCHEMA_FILTER_PATTERN_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    db_schema_filter_pattern: str
    def __init__(self, catalog: _Optional[str] = ..., db_schema_filter_pattern: _Optional[str] = ...) -> None: ...

class CommandGetTables(_message.Message):
    __slots__ = ("catalog", "db_schema_filter_pattern", "table_name_filter_pattern", "table_types", "include_schema")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    DB_SCHEMA_FILTER_PATTERN_FIELD_NUMBER: _ClassVar[int]
    TABLE_NAME_FILTER_PATTERN_FIELD_NUMBER: _ClassVar[int]
    TABLE_TYPES_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    db_schema_filter_pattern: str
    table_name_filter_pattern: str
    table_types: _containers.RepeatedScalarFieldContainer[str]
    include_schema: bool
    def __init__(self, catalog: _Optional[str] = ..., db_schema_filter_pattern: _Optional[str] = ..., table_name_filter_pattern: _Optional[str] = ..., table_types: _Optional[_Iterable[str]] = ..., include_schema: _Optional[bool] = ...) -> None: ...

class CommandGetTableTypes(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CommandGetPrimaryKeys(_message.Message):
    __slots__ = ("catalog", "db_schema", "table")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    DB_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    db_schema: str
    table: str
    def __init__(self, catalog: _Optional[str] = ..., db_schema: _Optional[str] = ..., table: _Optional[str] = ...) -> None: ...

class CommandGetExportedKeys(_message.Message):
    __slots__ = ("catalog", "db_schema", "table")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    DB_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    db_schema: str
    table: str
    def __init__(self, catalog: _Optional[str] = ..., db_schema: _Optional[str] = ..., table: _Optional[str] = ...) -> None: ...

class CommandGetImportedKeys(_message.Message):
    __slots__ = ("catalog", "db_schema", "table")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    DB_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    db_schema: str
    table: str
    def __init__(self, catalog: _Optional[str] = ..., db_schema: _Optional[str] = ..., table: _Optional[str] = ...) -> None: ...

class CommandStatementQuery(_message.Message):
    __slots__ = ("query", "transaction_id")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    query: str
    transaction_id: bytes
    def __init__(self, query: _Optional[str] = ..., transaction_id: _Optional[bytes] = ...) -> None: ...

class TicketStatementQuery(_message.Message):
    __slots__ = ("statement_handle",)
    STATEMENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    statement_handle: bytes
    def __init__(self, statement_handle: _Optional[bytes] = ...) -> None: ...

class CommandStatementUpdate(_message.Message):
    __slots__ = ("query", "transaction_id")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    query: str
    transaction_id: bytes
    def __init__(self, query: _Optional[str] = ..., transaction_id: _Optional[bytes] = ...) -> None: ...

class CommandStatementSubstraitPlan(_message.Message):
    __slots__ = ("plan", "transaction_id")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    plan: bytes
    transaction_id: bytes
    def __init__(self, plan: _Optional[bytes] = ..., transaction_id: _Optional[bytes] = ...) -> None: ...

class ActionCreatePreparedStatementRequest(_message.Message):
    __slots__ = ("query", "transaction_id")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    query: str
    transaction_id: bytes
    def __init__(self, query: _Optional[str] = ..., transaction_id: _Optional[bytes] = ...) -> None: ...

class ActionCreatePreparedStatementResult(_message.Message):
    __slots__ = ("prepared_statement_handle", "dataset_schema", "parameter_schema", "is_update")
    PREPARED_STATEMENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    DATASET_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    IS_UPDATE_FIELD_NUMBER: _ClassVar[int]
    prepared_statement_handle: bytes
    dataset_schema: bytes
    parameter_schema: bytes
    is_update: bool
    def __init__(self, prepared_statement_handle: _Optional[bytes] = ..., dataset_schema: _Optional[bytes] = ..., parameter_schema: _Optional[bytes] = ..., is_update: _Optional[bool] = ...) -> None: ...

class ActionClosePreparedStatementRequest(_message.Message):
    __slots__ = ("prepared_statement_handle",)
    PREPARED_STATEMENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    prepared_statement_handle: bytes
    def __init__(self, prepared_statement_handle: _Optional[bytes] = ...) -> None: ...

class CommandPreparedStatementQuery(_message.Message):
    __slots__ = ("prepared_statement_handle",)
    PREPARED_STATEMENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    prepared_statement_handle: bytes
    def __init__(self, prepared_statement_handle: _Optional[bytes] = ...) -> None: ...

class CommandPreparedStatementUpdate(_message.Message):
    __slots__ = ("prepared_statement_handle",)
    PREPARED_STATEMENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    prepared_statement_handle: bytes
    def __init__(self, prepared_statement_handle: _Optional[bytes] = ...) -> None: ...

class DoPutPreparedStatementResult(_message.Message):
    __slots__ = ("prepared_statement_handle",)
    PREPARED_STATEMENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    prepared_statement_handle: bytes
    def __init__(self, prepared_statement_handle: _Optional[bytes] = ...) -> None: ...

class DoPutUpdateResult(_message.Message):
    __slots__ = ("record_count",)
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    record_count: int
    def __init__(self, record_count: _Optional[int] = ...) -> None: ...

class ActionCancelQueryRequest(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: bytes
    def __init__(self, info: _Optional[bytes] = ...) -> None: ...

class ActionCancelQueryResult(_message.Message):
    __slots__ = ("result",)
    class CancelResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CANCEL_RESULT_UNSPECIFIED: _ClassVar[ActionCancelQueryResult.CancelResult]
        CANCEL_RESULT_CANCELLED: _ClassVar[ActionCancelQueryResult.CancelResult]
        CANCEL_RESULT_CANCELLING: _ClassVar[ActionCancelQueryResult.CancelResult]
        CANCEL_RESULT_NOT_CANCELLABLE: _ClassVar[ActionCancelQueryResult.CancelResult]
    CANCEL_RESULT_UNSPECIFIED: ActionCancelQueryResult.CancelResult
    CANCEL_RESULT_CANCELLED: ActionCancelQueryResult.CancelResult
    CANCEL_RESULT_CANCELLING: ActionCancelQueryResult.CancelResult
    CANCEL_RESULT_NOT_CANCELLABLE: ActionCancelQueryResult.CancelResult
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: ActionCancelQueryResult.CancelResult
    def __init__(self, result: _Optional[_Union[ActionCancelQueryResult.CancelResult, str]] = ...) -> None: ...

class CancelFlightInfoRequest(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: bytes
    def __init__(self, info: _Optional[bytes] = ...) -> None: ...

class CancelFlightInfoResult(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: CancelStatus
    def __init__(self, status: _Optional[_Union[CancelStatus, str]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseSessionResult(_message.Message):
    __slots__ = ("status",)
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNSPECIFIED: _ClassVar[CloseSessionResult.Status]
        CLOSED: _ClassVar[CloseSessionResult.Status]
        CLOSING: _ClassVar[CloseSessionResult.Status]
        NOT_CLOSEABLE: _ClassVar[CloseSessionResult.Status]
    UNSPECIFIED: CloseSessionResult.Status
    CLOSED: CloseSessionResult.Status
    CLOSING: CloseSessionResult.Status
    NOT_CLOSEABLE: CloseSessionResult.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: CloseSessionResult.Status
    def __init__(self, status: _Optional[_Union[CloseSessionResult.Status, str]] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("type", "body")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    type: str
    body: bytes
    def __init__(self, type: _Optional[str] = ..., body: _Optional[bytes] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("body",)
    BODY_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    def __init__(self, body: _Optional[bytes] = ...) -> None: ...

class PollInfo(_message.Message):
    __slots__ = ("info", "flight_descriptor", "progress")
    INFO_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    info: bytes
    flight_descriptor: bytes
    progress: float
    def __init__(self, info: _Optional[bytes] = ..., flight_descriptor: _Optional[bytes] = ..., progress: _Optional[float] = ...) -> None: ...
