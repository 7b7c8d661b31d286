"""Who may write where: the write roots, the warehouse, and the checks at submission.

The scheduler's shell (``scheduler.core``) asks these before it plans a write
statement (``sql.writes``); the commit itself is ``output.commit``, carried out
by the shell when the state machine says ``CommitWrite``.

* ``COPY ... TO`` writes only under a root the scheduler was given
  (``--write-root``, repeatable): the location's real path (symbolic links
  followed, ``..`` resolved) must lie under a root's real path; an ``s3://``
  location must start with an ``s3://`` root. No root: ``COPY`` is refused.
* ``CREATE TABLE AS`` and ``INSERT INTO`` write under the warehouse
  (``--warehouse``), one directory per table, which the scheduler owns.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pyarrow as pa

from mangonel import output, storage
from mangonel.errors import ForbiddenStatementError, PermissionDeniedError, QueryError

WRITER_HINT = (
    "only admins and writers may write (a users file's admin or writer role, or a cluster "
    "without users); ask an admin for the writer role (`mangonel users add NAME --writer`)"
)


def default_warehouse(state_url: str) -> str:
    """Beside a SQLite state file (``sqlite:///dir/x.db`` -> ``dir/warehouse``); else
    ``~/.local/state/mangonel/warehouse``."""
    if state_url.startswith("sqlite:///"):
        return os.path.join(os.path.dirname(state_url[len("sqlite://") :]), "warehouse")
    return os.path.expanduser("~/.local/state/mangonel/warehouse")


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def allowed_location(location: str, roots: Sequence[str]) -> str:
    """``location`` normalized (``output.normalize``) if it lies under one of ``roots``.

    Raises:
        ForbiddenStatementError: no root is given: this scheduler writes nowhere.
        PermissionDeniedError: the location is outside every root (after ``..``
            and symbolic links are resolved).
    """
    if not roots:
        raise ForbiddenStatementError(
            f"COPY to {location!r} is refused: this scheduler allows no write location; "
            "start it with --write-root DIR (or s3://bucket/prefix), repeatable"
        )
    if storage.is_remote(location):
        uri = storage.parse(location)
        if ".." in uri.key.split("/"):
            raise PermissionDeniedError(f"{location!r}: '..' is not allowed in a location")
        target = output.normalize(location)
        for root in roots:
            if storage.is_remote(root):
                base = root.rstrip("/")
                if target == base or target.startswith(base + "/"):
                    return target
    else:
        target = output.normalize(location)
        real = _real(target)
        for root in roots:
            if storage.is_remote(root):
                continue
            base = _real(root)
            if real == base or real.startswith(base.rstrip("/") + "/"):
                return target
    raise PermissionDeniedError(
        f"COPY to {location!r} is refused: it is outside every write root of this scheduler "
        f"({', '.join(roots)}); write under one of them"
    )


def table_location(warehouse: str, table: str) -> str:
    """Where the warehouse keeps a table's files."""
    return output.normalize(f"{warehouse.rstrip('/')}/{table}")


def insert_query(query: str, schema: pa.Schema, query_columns: Sequence[str], table: str) -> str:
    """``query`` with its columns renamed and cast to ``schema``'s, by position, as
    DuckDB's ``INSERT INTO t SELECT`` does (files of one table share one schema).

    Raises:
        QueryError: the query has another number of columns than the table.
    """
    if len(query_columns) != len(schema):
        raise QueryError(
            f"table {table} has {len(schema)} columns ({', '.join(schema.names)}) but the query "
            f"gives {len(query_columns)}; select one value per column, in the table's order"
        )
    import duckdb

    types = duckdb.from_arrow(schema.empty_table()).types
    q = [f'"q{i}"' for i in range(len(schema))]
    cols = ", ".join(
        f"CAST({q[i]} AS {types[i]}) AS " + '"' + name.replace('"', '""') + '"'
        for i, name in enumerate(schema.names)
    )
    return f"SELECT {cols} FROM ({query}) AS __insert({', '.join(q)})"
