"""mangonel as an ibis backend: ibis expressions compiled to SQL, run on the cluster.

>>> import ibis                                                      # doctest: +SKIP
>>> con = ibis.mangonel.connect("127.0.0.1:50050")                   # or ibis.connect(
>>> t = con.table("lineitem")                                        #  "mangonel://host:port")
>>> t.group_by("l_returnflag").agg(n=t.count()).to_pandas()

ibis finds this module by its entry point (group ``ibis.backends``, name ``mangonel``:
``pip install 'mangonel[ibis]'``). ibis compiles an expression with its DuckDB compiler
(mangonel's front end reads DuckDB's SQL dialect through sqlglot, as ibis writes it);
the scheduler plans the query into stages and the executors run it, as any SQL query.
``con.last_result`` is the last query's ``mangonel.Result``: its job, stages and tasks.

Tables are the cluster's registered tables (``list_tables``, ``table``); a Parquet
file or directory the executors can read is registered with ``read_parquet``. What the
engine has no place for is refused with an error that says what to do instead:
in-memory tables (``ibis.memtable``), ``create_table`` from data, views.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import ParseResult

import ibis.backends.sql.compilers as sc
import ibis.common.exceptions as com
import ibis.expr.operations as ops
import ibis.expr.schema as sch
import ibis.expr.types as ir
import pyarrow as pa
import sqlglot as sg
import sqlglot.expressions as sge
from ibis.backends import NoExampleLoader
from ibis.backends.sql import SQLBackend

from mangonel.client import arrow_types
from mangonel.client.session import Result, Session
from mangonel.client.url import ConnectOptions, parse_url

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd


class Backend(SQLBackend, NoExampleLoader):  # type: ignore[misc]
    """The ibis backend ``mangonel``: ``ibis.mangonel.connect(address, ...)``."""

    name = "mangonel"
    compiler = sc.duckdb.compiler
    supports_temporary_tables = False
    supports_python_udfs = False

    # ------------------------------------------------------------------ connecting

    def do_connect(
        self,
        address: str | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_dir: str | None = None,
        timeout_s: float | None = None,
        query_timeout_s: float | None = None,
    ) -> None:
        """Connect to a mangonel cluster.

        Args:
            address: ``host:port`` of the scheduler (or several, comma-separated).
            user: Log in as this user (with ``password``) on a cluster with users.
            password: ``user``'s password.
            token: A bearer token instead of a user and password.
            tls_ca: The cluster CA's certificate (PEM file): speak TLS.
            tls_dir: The client files of ``mangonel certs init`` (instead of ``tls_ca``).
            timeout_s: The limit on each call to the scheduler (60 s).
            query_timeout_s: The most a query may take (no limit).

        >>> con = ibis.mangonel.connect("sched:50050", user="ann", password="s3cret")
        ... # doctest: +SKIP
        """
        given = {
            "user": user,
            "password": password,
            "token": token,
            "tls_ca": tls_ca,
            "tls_dir": tls_dir,
            "timeout_s": timeout_s,
            "query_timeout_s": query_timeout_s,
        }
        options = ConnectOptions.from_mapping(address or "", given)
        self._attach(options.connect())

    def _attach(self, session: Session) -> None:
        self.con = session
        self.last_result: Result | None = None
        """The last query's result: its job id, stages (tasks, rows) and timings."""

    @classmethod
    def from_connection(cls, con: Session, /, **kwargs: Any) -> Backend:
        """A backend over a ``mangonel.Session`` that is open already."""
        new_backend = cls()
        new_backend._can_reconnect = False
        new_backend._attach(con)
        return new_backend

    def _from_url(self, url: ParseResult, **kwargs: Any) -> Backend:
        # ``ibis.connect("mangonel://user:password@host:port?tls_ca=FILE")``; ibis
        # passes the query string's options as ``kwargs`` too.
        options = parse_url(url.geturl(), kwargs)
        backend = self.__class__()
        backend._can_reconnect = False
        backend._attach(options.connect())
        return backend

    def disconnect(self) -> None:
        self.con.close()

    @property
    def version(self) -> str:
        return importlib.metadata.version("mangonel")

    # ---------------------------------------------------------------------- tables

    def list_tables(self, *, like: str | None = None, database: Any = None) -> list[str]:
        """The cluster's registered tables, by name (``like``: a regex they match)."""
        self._no_database(database)
        return self._filter_with_like(sorted(t.name for t in self.con.tables()), like)

    def get_schema(
        self, name: str, *, catalog: str | None = None, database: str | None = None
    ) -> sch.Schema:
        self._no_database(database or catalog)
        table = next((t for t in self.con.tables() if t.name == name), None)
        if table is None:
            raise com.TableNotFound(name)
        schema = arrow_types.parse_schema(table.columns)
        if schema is None:  # a type not read from its text: the cluster says it
            return self._get_schema_using_query(f"SELECT * FROM {sg.to_identifier(name).sql()}")
        return sch.Schema.from_pyarrow(schema)

    def _get_schema_using_query(self, query: str) -> sch.Schema:
        result = self.con.sql(f"SELECT * FROM ({query}) AS _ibis_schema LIMIT 0")
        return sch.Schema.from_pyarrow(result.to_arrow().schema)

    def read_parquet(
        self, path: str | Path, /, *, table_name: str | None = None, **kwargs: Any
    ) -> ir.Table:
        """Register a Parquet file or directory (local to the executors, or ``s3://``)
        as ``table_name`` on the cluster, and return it."""
        if kwargs:
            raise com.UnsupportedArgumentError(
                f"mangonel registers Parquet as it is; it takes no options {sorted(kwargs)}"
            )
        name = table_name or util_name("read_parquet")
        self.con.register_parquet(name, str(path))
        return self.table(name)

    def drop_table(self, name: str, /, *, database: Any = None, force: bool = False) -> None:
        """Unregister a table (its files stay)."""
        self._no_database(database)
        if force and name not in self.list_tables():
            return
        self.con.drop_table(name)

    def create_table(
        self,
        name: str,
        /,
        obj: Any = None,
        *,
        schema: Any = None,
        database: Any = None,
        temp: bool = False,
        overwrite: bool = False,
    ) -> ir.Table:
        raise com.UnsupportedOperationError(
            "mangonel reads tables from Parquet files and does not store data: write the "
            f"data of {name!r} to Parquet where the executors can read it, then register "
            "it with con.read_parquet(path, table_name=...)"
        )

    def create_view(self, name: str, /, obj: ir.Table, **kwargs: Any) -> ir.Table:
        raise com.UnsupportedOperationError(
            "mangonel has no views: keep the expression in Python and build on it"
        )

    def _register_in_memory_table(self, op: ops.InMemoryTable) -> None:
        raise com.UnsupportedOperationError(
            f"mangonel cannot ship the in-memory table {op.name!r} to the cluster: write "
            "it to Parquet where the executors can read it and use con.read_parquet(...)"
        )

    def _no_database(self, database: Any) -> None:
        if database is not None:
            raise com.UnsupportedArgumentError(
                f"mangonel has one namespace of tables; leave out database={database!r}"
            )

    # ------------------------------------------------------------------- queries

    def raw_sql(self, query: str | sge.Expression, **_: Any) -> Result:
        """Run one SELECT (DuckDB's dialect) on the cluster; its ``mangonel.Result``."""
        if isinstance(query, sge.Expression):
            query = query.sql(dialect=self.dialect)
        result = self.con.sql(query)
        self.last_result = result
        return result

    def _run(
        self,
        expr: ir.Expr,
        params: Mapping[ir.Scalar, Any] | None,
        limit: int | str | None,
    ) -> pa.Table:
        """Run ``expr`` as a table; its rows with ibis's column names and types."""
        self._run_pre_execute_hooks(expr)
        table_expr = expr.as_table()
        schema = table_expr.schema()
        table = self.raw_sql(self.compile(table_expr, params=params, limit=limit)).to_arrow()
        # Names by position: mangonel names result columns as the query wrote them.
        table = table.rename_columns(list(schema.names))
        wanted = schema.to_pyarrow()
        try:
            return table.cast(wanted)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            got = ", ".join(
                f"{f.name}: {f.type} (ibis expects {w.type})"
                for f, w in zip(table.schema, wanted, strict=True)
                if f.type != w.type
            )
            raise com.IbisTypeError(
                f"the cluster's answer does not fit the types ibis gave the expression "
                f"({exc}): {got}. ibis types a product of decimals with the scale of its "
                "inputs; cast such columns to float64 (or a wider decimal) in the expression"
            ) from exc

    def execute(
        self,
        expr: ir.Expr,
        /,
        *,
        params: Mapping[ir.Scalar, Any] | None = None,
        limit: int | str | None = "default",
        **_: Any,
    ) -> pd.DataFrame | pd.Series | Any:
        from ibis.formats.pandas import PandasData

        table = self._run(expr, params, limit)
        df = PandasData.convert_table(table.to_pandas(), expr.as_table().schema())
        return expr.__pandas_result__(df)

    def to_pyarrow(
        self,
        expr: ir.Expr,
        /,
        *,
        params: Mapping[ir.Scalar, Any] | None = None,
        limit: int | str | None = None,
        **_: Any,
    ) -> pa.Table | pa.Array | pa.Scalar:
        return expr.__pyarrow_result__(self._run(expr, params, limit))

    def to_pyarrow_batches(
        self,
        expr: ir.Expr,
        /,
        *,
        params: Mapping[ir.Scalar, Any] | None = None,
        limit: int | str | None = None,
        chunk_size: int = 1_000_000,
        **_: Any,
    ) -> pa.ipc.RecordBatchReader:
        # The whole result is read from the executors first (a query's result is read
        # partition by partition once the job has finished), then handed out in batches.
        table = self._run(expr, params, limit)
        return pa.RecordBatchReader.from_batches(
            table.schema, table.to_batches(max_chunksize=chunk_size)
        )


def util_name(prefix: str) -> str:
    """A fresh table name, as ibis makes them for ``read_*`` without a name."""
    from ibis import util

    return util.gen_name(prefix)
