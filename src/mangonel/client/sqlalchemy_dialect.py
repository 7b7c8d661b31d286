"""The SQLAlchemy dialect ``mangonel://``: pandas' ``read_sql`` and BI tools on a cluster.

>>> import sqlalchemy, pandas                                         # doctest: +SKIP
>>> engine = sqlalchemy.create_engine("mangonel://ann:s3cret@sched:50050?tls_ca=ca.pem")
>>> pandas.read_sql("SELECT n_name FROM nation", engine)
>>> sqlalchemy.inspect(engine).get_columns("lineitem")

SQLAlchemy finds it by its entry point (group ``sqlalchemy.dialects``, name
``mangonel``: ``pip install 'mangonel[sqlalchemy]'``). The URL is ``client.url``'s:
user and password, ``host:port`` of the scheduler, and the options ``tls_ca``,
``tls_dir``, ``token``, ``timeout_s`` and ``query_timeout_s`` in its query string.
The driver underneath is ``client.dbapi``; queries are compiled with SQLAlchemy's
generic compiler, whose SQL DuckDB's dialect (mangonel's) reads.

It runs on SQLAlchemy 1.4 as well as 2.x, so that it installs into a BI tool's own
environment (Superset 6 pins ``sqlalchemy<2``): see ``requirements-client.txt``.

Introspection shows one schema, ``main``, holding the registered tables (no views,
keys or indexes) with their columns' types mapped from Arrow's.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import pyarrow as pa
import sqlalchemy
import sqlalchemy.types as sqltypes
from sqlalchemy import exc
from sqlalchemy.engine import URL, Connection, default

from mangonel import defaults
from mangonel.client import arrow_types, dbapi
from mangonel.client.status import TableInfo
from mangonel.client.url import ConnectOptionError, ConnectOptions

SQLALCHEMY_1 = sqlalchemy.__version__.startswith("1.")
"""SQLAlchemy 1.4: no ``DOUBLE`` type, and the driver module comes from ``dbapi()``."""

# SQLAlchemy 1.4 has no DOUBLE; its FLOAT with a binary precision of 53 is one.
_DOUBLE: Any = sqltypes.FLOAT if SQLALCHEMY_1 else getattr(sqltypes, "DOUBLE")  # noqa: B009

SCHEMA = defaults.SCHEMA
"""The one schema mangonel's tables live in, as introspection shows it (queries may
name a table ``main.orders``, as BI tools write them)."""


def sqlalchemy_type(arrow_type: pa.DataType | None) -> sqltypes.TypeEngine[Any]:
    """The SQLAlchemy type of an Arrow column type (``NullType`` for one it has none of)."""
    t = arrow_type
    if t is None:
        return sqltypes.NullType()
    if pa.types.is_boolean(t):
        return sqltypes.BOOLEAN()
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return sqltypes.SMALLINT()
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return sqltypes.INTEGER()
    if pa.types.is_integer(t):
        return sqltypes.BIGINT()
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return sqltypes.REAL()
    if pa.types.is_float64(t):
        return _DOUBLE(precision=53) if SQLALCHEMY_1 else _DOUBLE()
    if pa.types.is_decimal(t):
        return sqltypes.NUMERIC(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return sqltypes.VARCHAR()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return sqltypes.BLOB()
    if pa.types.is_fixed_size_binary(t):
        return sqltypes.BLOB()
    if pa.types.is_date(t):
        return sqltypes.DATE()
    if pa.types.is_timestamp(t):
        return sqltypes.TIMESTAMP(timezone=t.tz is not None)
    if pa.types.is_time(t):
        return sqltypes.TIME()
    if pa.types.is_duration(t):
        return sqltypes.Interval()
    return sqltypes.NullType()


class MangonelDialect(default.DefaultDialect):
    """``mangonel://[user[:password]@]host:port[?tls_ca=FILE&...]``."""

    name = "mangonel"
    driver = "mangonel"
    supports_statement_cache = True
    default_paramstyle = "qmark"
    supports_native_boolean = True
    supports_native_decimal = True
    supports_alter = False
    supports_sequences = False
    supports_views = False
    supports_multivalues_insert = False
    supports_sane_rowcount = False
    postfetch_lastrowid = False
    requires_name_normalize = False
    default_schema_name = SCHEMA

    @classmethod
    def import_dbapi(cls) -> ModuleType:
        return dbapi

    if SQLALCHEMY_1:
        # 1.4 asks the class for its driver by this name (2.x warns when it is there).
        @classmethod
        def dbapi(cls) -> ModuleType:  # type: ignore[no-redef]
            return dbapi

    def create_connect_args(self, url: URL) -> tuple[list[Any], dict[str, Any]]:
        if url.database:
            raise exc.ArgumentError(
                f"mangonel has no databases: leave /{url.database} out of the URL "
                "(mangonel://[user[:password]@]host:port)"
            )
        default_host, _, default_port = defaults.SCHEDULER_ADDRESS.rpartition(":")
        address = f"{url.host or default_host}:{url.port or default_port}"
        given: dict[str, object] = {
            key: value if isinstance(value, str) else value[-1] for key, value in url.query.items()
        }
        given.update(user=url.username, password=url.password)
        try:
            options = ConnectOptions.from_mapping(address, given)
        except ConnectOptionError as err:
            raise exc.ArgumentError(f"in the mangonel URL: {err}") from None
        return [], dataclasses.asdict(options)

    # ------------------------------------------------------------ no transactions

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass

    def do_commit(self, dbapi_connection: Any) -> None:
        pass

    def get_isolation_level(self, dbapi_connection: Any) -> Any:
        return "AUTOCOMMIT"

    def get_default_isolation_level(self, dbapi_conn: Any) -> Any:
        return "AUTOCOMMIT"

    def _get_server_version_info(self, connection: Connection) -> Any:
        return None

    def _get_default_schema_name(self, connection: Connection) -> str:
        return SCHEMA

    def do_ping(self, dbapi_connection: Any) -> bool:
        dbapi_connection.tables()  # a cheap call that needs a working login
        return True

    # -------------------------------------------------------------- introspection

    def _tables(self, connection: Connection, schema: str | None) -> list[TableInfo]:
        if schema not in (None, SCHEMA):
            return []
        dbapi_connection = connection.connection.dbapi_connection
        assert isinstance(dbapi_connection, dbapi.Connection)
        return dbapi_connection.tables()

    def _table(self, connection: Connection, name: str, schema: str | None) -> TableInfo:
        for table in self._tables(connection, schema):
            if table.name == name:
                return table
        raise exc.NoSuchTableError(name)

    def get_schema_names(self, connection: Connection, **kw: Any) -> list[str]:
        return [SCHEMA]

    def get_table_names(
        self, connection: Connection, schema: str | None = None, **kw: Any
    ) -> list[str]:
        return sorted(t.name for t in self._tables(connection, schema))

    def get_view_names(
        self, connection: Connection, schema: str | None = None, **kw: Any
    ) -> list[str]:
        return []

    def has_table(
        self, connection: Connection, table_name: str, schema: str | None = None, **kw: Any
    ) -> bool:
        return any(t.name == table_name for t in self._tables(connection, schema))

    def get_columns(
        self, connection: Connection, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[Any]:
        table = self._table(connection, table_name, schema)
        return [
            {
                "name": name,
                "type": sqlalchemy_type(arrow_types.parse(type_text)),
                "nullable": True,
                "default": None,
            }
            for name, type_text in table.columns
        ]

    def get_pk_constraint(
        self, connection: Connection, table_name: str, schema: str | None = None, **kw: Any
    ) -> Any:
        self._table(connection, table_name, schema)
        return {"constrained_columns": [], "name": None}

    def get_foreign_keys(
        self, connection: Connection, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[Any]:
        return []

    def get_indexes(
        self, connection: Connection, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[Any]:
        return []

    def get_unique_constraints(
        self, connection: Connection, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[Any]:
        return []

    def get_check_constraints(
        self, connection: Connection, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[Any]:
        return []

    def get_table_comment(
        self, connection: Connection, table_name: str, schema: str | None = None, **kw: Any
    ) -> Any:
        table = self._table(connection, table_name, schema)
        return {"text": f"Parquet at {table.location}: {table.rows} rows"}
