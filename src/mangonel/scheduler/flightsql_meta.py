"""What the Flight SQL metadata commands answer: reference schemas and their rows.

Flight SQL fixes the schema of every metadata result, nullability included,
and clients compare strictly (the ADBC driver refuses a stream whose schema
differs from the ``FlightInfo``'s); the schemas below follow the specification
(``FlightSql.proto``) field by field. The rows come from the catalog and from
what mangonel is: one catalog (``CATALOG``) holding one schema (``DB_SCHEMA``)
whose tables are the registered Parquet tables, all of type ``TABLE``; a
read-only SQL engine with DuckDB's SQL.

Nothing here does I/O: each function takes what it describes and returns an
Arrow table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata

import pyarrow as pa
from google.protobuf.message import Message

from mangonel.catalog import Table
from mangonel.proto import flightsql_pb2 as sql_pb
from mangonel.proto.results import result_schema
from mangonel.scheduler.flightsql_wire import opt, unsupported

CATALOG = "mangonel"
"""The one catalog GetCatalogs lists."""
DB_SCHEMA = "public"
"""The one schema of ``CATALOG``; every registered table is in it."""
TABLE_TYPE = "TABLE"

# --------------------------------------------------------------- reference schemas

_str = pa.string()

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", _str, nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema(
    [pa.field("catalog_name", _str), pa.field("db_schema_name", _str, nullable=False)]
)
TABLES_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", _str),
        pa.field("db_schema_name", _str),
        pa.field("table_name", _str, nullable=False),
        pa.field("table_type", _str, nullable=False),
    ]
)
TABLES_WITH_SCHEMA_SCHEMA = TABLES_SCHEMA.append(
    pa.field("table_schema", pa.binary(), nullable=False)
)
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", _str, nullable=False)])
PRIMARY_KEYS_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", _str),
        pa.field("db_schema_name", _str),
        pa.field("table_name", _str, nullable=False),
        pa.field("column_name", _str, nullable=False),
        pa.field("key_sequence", pa.int32(), nullable=False),
        pa.field("key_name", _str),
    ]
)
KEYS_SCHEMA = pa.schema(
    [
        pa.field("pk_catalog_name", _str),
        pa.field("pk_db_schema_name", _str),
        pa.field("pk_table_name", _str, nullable=False),
        pa.field("pk_column_name", _str, nullable=False),
        pa.field("fk_catalog_name", _str),
        pa.field("fk_db_schema_name", _str),
        pa.field("fk_table_name", _str, nullable=False),
        pa.field("fk_column_name", _str, nullable=False),
        pa.field("key_sequence", pa.int32(), nullable=False),
        pa.field("fk_key_name", _str),
        pa.field("pk_key_name", _str),
        pa.field("update_rule", pa.uint8(), nullable=False),
        pa.field("delete_rule", pa.uint8(), nullable=False),
    ]
)
"""GetExportedKeys / GetImportedKeys (mangonel has no keys: always empty)."""

_SQL_INFO_VALUE = pa.dense_union(
    [
        pa.field("string_value", _str, nullable=False),
        pa.field("bool_value", pa.bool_(), nullable=False),
        pa.field("bigint_value", pa.int64(), nullable=False),
        pa.field("int32_bitmask", pa.int32(), nullable=False),
        pa.field("string_list", pa.list_(pa.field("item", _str)), nullable=False),
        pa.field(
            "int32_to_int32_list_map",
            pa.map_(pa.int32(), pa.list_(pa.field("item", pa.int32()))),
            nullable=False,
        ),
    ],
    type_codes=[0, 1, 2, 3, 4, 5],
)
SQL_INFO_SCHEMA = pa.schema(
    [
        pa.field("info_name", pa.uint32(), nullable=False),
        pa.field("value", _SQL_INFO_VALUE, nullable=False),
    ]
)
XDBC_TYPE_INFO_SCHEMA = pa.schema(
    [
        pa.field("type_name", _str, nullable=False),
        pa.field("data_type", pa.int32(), nullable=False),
        pa.field("column_size", pa.int32()),
        pa.field("literal_prefix", _str),
        pa.field("literal_suffix", _str),
        pa.field("create_params", pa.list_(pa.field("item", _str, nullable=False))),
        pa.field("nullable", pa.int32(), nullable=False),
        pa.field("case_sensitive", pa.bool_(), nullable=False),
        pa.field("searchable", pa.int32(), nullable=False),
        pa.field("unsigned_attribute", pa.bool_()),
        pa.field("fixed_prec_scale", pa.bool_(), nullable=False),
        pa.field("auto_increment", pa.bool_()),
        pa.field("local_type_name", _str),
        pa.field("minimum_scale", pa.int32()),
        pa.field("maximum_scale", pa.int32()),
        pa.field("sql_data_type", pa.int32(), nullable=False),
        pa.field("datetime_subcode", pa.int32()),
        pa.field("num_prec_radix", pa.int32()),
        pa.field("interval_precision", pa.int32()),
    ]
)

# ------------------------------------------------------------------ catalog rows


def like(pattern: str | None) -> re.Pattern[str] | None:
    """A SQL LIKE pattern (``%``, ``_``, ``\\`` escapes) as a regex; ``None`` matches all.

    >>> like("line%").fullmatch("lineitem") is not None
    True
    >>> like("a\\\\_b").fullmatch("axb") is None
    True
    """
    if pattern is None:
        return None
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _matches(pattern: re.Pattern[str] | None, name: str) -> bool:
    return pattern is None or pattern.fullmatch(name) is not None


def catalogs() -> pa.Table:
    return pa.table([pa.array([CATALOG], _str)], schema=CATALOGS_SCHEMA)


def db_schemas(catalog: str | None, schema_pattern: str | None) -> pa.Table:
    """The one schema, if the filters let it through (an empty catalog name means
    "without a catalog", which no schema is)."""
    keep = catalog in (None, CATALOG) and _matches(like(schema_pattern), DB_SCHEMA)
    names = [DB_SCHEMA] if keep else []
    return pa.table(
        [pa.array([CATALOG] * len(names), _str), pa.array(names, _str)], schema=DB_SCHEMAS_SCHEMA
    )


def table_schema(table: Table) -> pa.Schema:
    """A table's columns as ``SELECT *`` gives them to a Flight SQL client: every
    field nullable, no metadata, views as plain strings (``proto.results``)."""
    return result_schema(table.schema, tuple(table.schema.names))


def tables(
    all_tables: Iterable[Table],
    catalog: str | None,
    schema_pattern: str | None,
    table_pattern: str | None,
    table_types: Sequence[str],
    include_schema: bool,
) -> pa.Table:
    """GetTables: the registered tables the filters let through, by name."""
    keep_schema = catalog in (None, CATALOG) and _matches(like(schema_pattern), DB_SCHEMA)
    keep_type = not table_types or TABLE_TYPE in table_types
    name_re = like(table_pattern)
    rows = (
        sorted((t for t in all_tables if _matches(name_re, t.name)), key=lambda t: t.name)
        if keep_schema and keep_type
        else []
    )
    columns = [
        pa.array([CATALOG] * len(rows), _str),
        pa.array([DB_SCHEMA] * len(rows), _str),
        pa.array([t.name for t in rows], _str),
        pa.array([TABLE_TYPE] * len(rows), _str),
    ]
    if not include_schema:
        return pa.table(columns, schema=TABLES_SCHEMA)
    schemas = [table_schema(t).serialize().to_pybytes() for t in rows]
    return pa.table([*columns, pa.array(schemas, pa.binary())], schema=TABLES_WITH_SCHEMA_SCHEMA)


def table_types() -> pa.Table:
    return pa.table([pa.array([TABLE_TYPE], _str)], schema=TABLE_TYPES_SCHEMA)


def empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


# -------------------------------------------------------------------- SqlInfo

# Codes of the SqlInfo enum (FlightSql.proto) that mangonel answers.
SERVER_NAME = 0
SERVER_VERSION = 1
SERVER_ARROW_VERSION = 2
SERVER_READ_ONLY = 3
SERVER_SQL = 4
SERVER_SUBSTRAIT = 5
SERVER_TRANSACTION = 8
SERVER_CANCEL = 9
SERVER_BULK_INGESTION = 10
SERVER_INGEST_TRANSACTIONS_SUPPORTED = 11
SERVER_STATEMENT_TIMEOUT = 100
SERVER_TRANSACTION_TIMEOUT = 101
SQL_DDL_CATALOG = 500
SQL_DDL_SCHEMA = 501
SQL_DDL_TABLE = 502
SQL_IDENTIFIER_CASE = 503
SQL_IDENTIFIER_QUOTE_CHAR = 504
SQL_QUOTED_IDENTIFIER_CASE = 505
SQL_ALL_TABLES_ARE_SELECTABLE = 506
SQL_NULL_ORDERING = 507
SQL_KEYWORDS = 508
SQL_SEARCH_STRING_ESCAPE = 513
SQL_SUPPORTS_COLUMN_ALIASING = 515
SQL_NULL_PLUS_NULL_IS_NULL = 516
SQL_SUPPORTS_TABLE_CORRELATION_NAMES = 518
SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY = 520
SQL_SUPPORTS_ORDER_BY_UNRELATED = 521
SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE = 523
SQL_OUTER_JOINS_SUPPORT_LEVEL = 528
SQL_SCHEMA_TERM = 529
SQL_CATALOG_TERM = 531
SQL_SELECT_FOR_UPDATE_SUPPORTED = 536
SQL_STORED_PROCEDURES_SUPPORTED = 537
SQL_CORRELATED_SUBQUERIES_SUPPORTED = 539
SQL_TRANSACTIONS_SUPPORTED = 563
SQL_BATCH_UPDATES_SUPPORTED = 572
SQL_SAVEPOINTS_SUPPORTED = 573
SQL_NAMED_PARAMETERS_SUPPORTED = 574

# Values of the enums some answers are ordinals of.
_TRANSACTION_NONE = 0  # SqlSupportedTransaction
_CASE_INSENSITIVE = 1  # SqlSupportedCaseSensitivity: unquoted names fold (DuckDB)
_CASE_SENSITIVE_UNKNOWN = 0
_NULLS_SORTED_AT_END = 3  # SqlNullOrdering: DuckDB sorts NULLS LAST both ways
_FULL_OUTER_JOINS = 2  # SqlOuterJoinsSupportLevel

_KEYWORDS = (
    "ANTI",
    "ASOF",
    "COLUMNS",
    "EXCLUDE",
    "GROUPING",
    "ILIKE",
    "LATERAL",
    "PIVOT",
    "POSITIONAL",
    "QUALIFY",
    "REPLACE",
    "SEMI",
    "UNPIVOT",
)
"""Words DuckDB's SQL reserves beyond SQL:2003's (JDBC's getSQLKeywords)."""


def mangonel_version() -> str:
    try:
        return metadata.version("mangonel")
    except metadata.PackageNotFoundError:
        return "unknown"


def _server_info() -> dict[int, object]:
    """SqlInfo code -> value; the value's Python type picks its union member
    (``str``, ``bool``, ``int`` as int64, ``_Int32`` as int32, a list of str)."""
    return {
        SERVER_NAME: "mangonel",
        SERVER_VERSION: mangonel_version(),
        SERVER_ARROW_VERSION: pa.__version__,
        # Not read-only: the write statements run as updates (``CommandStatementUpdate``).
        SERVER_READ_ONLY: False,
        SERVER_SQL: True,
        SERVER_SUBSTRAIT: False,
        SERVER_TRANSACTION: _Int32(_TRANSACTION_NONE),
        SERVER_CANCEL: True,
        SERVER_BULK_INGESTION: False,
        SERVER_INGEST_TRANSACTIONS_SUPPORTED: False,
        SERVER_STATEMENT_TIMEOUT: _Int32(0),
        SERVER_TRANSACTION_TIMEOUT: _Int32(0),
        SQL_DDL_CATALOG: False,
        SQL_DDL_SCHEMA: False,
        SQL_DDL_TABLE: False,
        SQL_IDENTIFIER_CASE: _Int32(_CASE_INSENSITIVE),
        SQL_IDENTIFIER_QUOTE_CHAR: '"',
        SQL_QUOTED_IDENTIFIER_CASE: _Int32(_CASE_SENSITIVE_UNKNOWN),
        SQL_ALL_TABLES_ARE_SELECTABLE: True,
        SQL_NULL_ORDERING: _Int32(_NULLS_SORTED_AT_END),
        SQL_KEYWORDS: list(_KEYWORDS),
        SQL_SEARCH_STRING_ESCAPE: "\\",
        SQL_SUPPORTS_COLUMN_ALIASING: True,
        SQL_NULL_PLUS_NULL_IS_NULL: True,
        SQL_SUPPORTS_TABLE_CORRELATION_NAMES: True,
        SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY: True,
        SQL_SUPPORTS_ORDER_BY_UNRELATED: True,
        SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE: True,
        SQL_OUTER_JOINS_SUPPORT_LEVEL: _Int32(_FULL_OUTER_JOINS),
        SQL_SCHEMA_TERM: "schema",
        SQL_CATALOG_TERM: "catalog",
        SQL_SELECT_FOR_UPDATE_SUPPORTED: False,
        SQL_STORED_PROCEDURES_SUPPORTED: False,
        SQL_CORRELATED_SUBQUERIES_SUPPORTED: True,
        SQL_TRANSACTIONS_SUPPORTED: False,
        SQL_BATCH_UPDATES_SUPPORTED: False,
        SQL_SAVEPOINTS_SUPPORTED: False,
        SQL_NAMED_PARAMETERS_SUPPORTED: False,
    }


@dataclass(frozen=True)
class _Int32:
    """An int32 answer (``int32_bitmask`` member), as opposed to an int64 one."""

    value: int


def sql_info(codes: Sequence[int]) -> pa.Table:
    """GetSqlInfo: the asked codes mangonel knows (all it knows when none is asked),
    in the order asked; unknown codes are left out, as the specification allows."""
    info = _server_info()
    wanted = [c for c in codes if c in info] if codes else sorted(info)
    type_ids: list[int] = []
    offsets: list[int] = []
    members: list[list[object]] = [[], [], [], [], [], []]
    for code in wanted:
        value = info[code]
        item: object
        if isinstance(value, str):
            member, item = 0, value
        elif isinstance(value, bool):
            member, item = 1, value
        elif isinstance(value, int):
            member, item = 2, value
        elif isinstance(value, _Int32):
            member, item = 3, value.value
        else:
            member, item = 4, value
        type_ids.append(member)
        offsets.append(len(members[member]))
        members[member].append(item)
    children = [pa.array(members[i], field.type) for i, field in enumerate(_SQL_INFO_VALUE)]
    union = pa.UnionArray.from_dense(
        pa.array(type_ids, pa.int8()),
        pa.array(offsets, pa.int32()),
        children,
        [f.name for f in _SQL_INFO_VALUE],
        list(_SQL_INFO_VALUE.type_codes),
    )
    return pa.table(
        [pa.array(wanted, pa.uint32()), union.view(_SQL_INFO_VALUE)], schema=SQL_INFO_SCHEMA
    )


# ------------------------------------------------------------- XDBC type info

# XdbcDataType codes (the JDBC / ODBC ones) and XdbcDatetimeSubcode values.
_BIT, _TINYINT, _BIGINT, _VARBINARY = -7, -6, -5, -3
_DECIMAL, _INTEGER, _SMALLINT, _REAL, _DOUBLE = 3, 4, 5, 7, 8
_DATETIME, _INTERVAL, _VARCHAR, _DATE, _TIME, _TIMESTAMP = 9, 10, 12, 91, 92, 93
_SUB_DATE, _SUB_TIME, _SUB_TIMESTAMP, _SUB_TIMESTAMP_TZ = 1, 2, 3, 5
_NULLABLE = 1  # Nullable.NULLABILITY_NULLABLE
_SEARCHABLE_BASIC, _SEARCHABLE_FULL = 2, 3


@dataclass(frozen=True)
class _XdbcType:
    name: str
    data_type: int
    column_size: int | None = None
    prefix: str | None = None
    suffix: str | None = None
    create_params: tuple[str, ...] | None = None
    case_sensitive: bool = False
    searchable: int = _SEARCHABLE_BASIC
    unsigned: bool | None = None
    fixed_prec_scale: bool = False
    min_scale: int | None = None
    max_scale: int | None = None
    sql_data_type: int | None = None
    subcode: int | None = None
    radix: int | None = None


# The DuckDB types a mangonel result can have, ordered by data_type then name.
_XDBC_TYPES = sorted(
    [
        _XdbcType("BOOLEAN", _BIT, 1),
        _XdbcType("TINYINT", _TINYINT, 3, unsigned=False, radix=10),
        _XdbcType("SMALLINT", _SMALLINT, 5, unsigned=False, radix=10),
        _XdbcType("INTEGER", _INTEGER, 10, unsigned=False, radix=10),
        _XdbcType("BIGINT", _BIGINT, 19, unsigned=False, radix=10),
        _XdbcType(
            "DECIMAL",
            _DECIMAL,
            38,
            create_params=("precision", "scale"),
            unsigned=False,
            fixed_prec_scale=True,
            min_scale=0,
            max_scale=38,
            radix=10,
        ),
        _XdbcType("FLOAT", _REAL, 24, unsigned=False, radix=2),
        _XdbcType("DOUBLE", _DOUBLE, 53, unsigned=False, radix=2),
        _XdbcType(
            "VARCHAR", _VARCHAR, None, "'", "'", case_sensitive=True, searchable=_SEARCHABLE_FULL
        ),
        _XdbcType("BLOB", _VARBINARY, None, "'", "'::BLOB"),
        _XdbcType("DATE", _DATE, 10, "DATE '", "'", sql_data_type=_DATETIME, subcode=_SUB_DATE),
        _XdbcType("TIME", _TIME, 15, "TIME '", "'", sql_data_type=_DATETIME, subcode=_SUB_TIME),
        _XdbcType(
            "TIMESTAMP",
            _TIMESTAMP,
            26,
            "TIMESTAMP '",
            "'",
            sql_data_type=_DATETIME,
            subcode=_SUB_TIMESTAMP,
        ),
        _XdbcType(
            "TIMESTAMP WITH TIME ZONE",
            _TIMESTAMP,
            32,
            "TIMESTAMPTZ '",
            "'",
            sql_data_type=_DATETIME,
            subcode=_SUB_TIMESTAMP_TZ,
        ),
        _XdbcType("INTERVAL", _INTERVAL, None, "INTERVAL '", "'", sql_data_type=_INTERVAL),
    ],
    key=lambda t: (t.data_type, t.name),
)


def xdbc_type_info(data_type: int | None) -> pa.Table:
    """GetXdbcTypeInfo: every type, or those of one XDBC ``data_type``."""
    rows = [t for t in _XDBC_TYPES if data_type is None or t.data_type == data_type]
    values: list[list[object]] = [
        [t.name for t in rows],
        [t.data_type for t in rows],
        [t.column_size for t in rows],
        [t.prefix for t in rows],
        [t.suffix for t in rows],
        [list(t.create_params) if t.create_params else None for t in rows],
        [_NULLABLE for _ in rows],
        [t.case_sensitive for t in rows],
        [t.searchable for t in rows],
        [t.unsigned for t in rows],
        [t.fixed_prec_scale for t in rows],
        [False if t.unsigned is not None else None for t in rows],
        [t.name for t in rows],
        [t.min_scale for t in rows],
        [t.max_scale for t in rows],
        [t.sql_data_type if t.sql_data_type is not None else t.data_type for t in rows],
        [t.subcode for t in rows],
        [t.radix for t in rows],
        [None for _ in rows],
    ]
    arrays = [pa.array(v, f.type) for v, f in zip(values, XDBC_TYPE_INFO_SCHEMA, strict=True)]
    return pa.table(arrays, schema=XDBC_TYPE_INFO_SCHEMA)


# ------------------------------------------------------------ answering


def answer(command: Message, known: Sequence[Table]) -> pa.Table:
    """A metadata command's rows (its ticket read back answers the same), over the
    catalog's tables ``known``.

    Raises:
        flight.FlightError: UNIMPLEMENTED: not a metadata command this server answers.
    """
    if isinstance(command, sql_pb.CommandGetSqlInfo):
        return sql_info(list(command.info))
    if isinstance(command, sql_pb.CommandGetCatalogs):
        return catalogs()
    if isinstance(command, sql_pb.CommandGetDbSchemas):
        return db_schemas(opt(command, "catalog"), opt(command, "db_schema_filter_pattern"))
    if isinstance(command, sql_pb.CommandGetTables):
        return tables(
            known,
            opt(command, "catalog"),
            opt(command, "db_schema_filter_pattern"),
            opt(command, "table_name_filter_pattern"),
            list(command.table_types),
            command.include_schema,
        )
    if isinstance(command, sql_pb.CommandGetTableTypes):
        return table_types()
    if isinstance(command, sql_pb.CommandGetXdbcTypeInfo):
        return xdbc_type_info(opt(command, "data_type"))
    if isinstance(command, sql_pb.CommandGetPrimaryKeys):
        return empty(PRIMARY_KEYS_SCHEMA)
    if isinstance(command, sql_pb.CommandGetExportedKeys | sql_pb.CommandGetImportedKeys):
        return empty(KEYS_SCHEMA)
    if isinstance(command, sql_pb.CommandStatementSubstraitPlan):
        raise unsupported("Substrait plans are not supported; send SQL")
    raise unsupported(f"{type(command).__name__} is not supported by this Flight SQL server")
