"""Write statements: ``COPY ... TO``, ``CREATE TABLE ... AS``, ``INSERT INTO``, ``DROP TABLE``.

``parse_write`` tells a write statement from a query by its first word, reads it
with sqlglot (DuckDB's syntax), and hands back what it writes (``WriteStatement``)
and the ``SELECT`` whose rows it writes, which the front end then checks like any
query (``frontend.parse``). Every other statement is left to the front end, which
refuses what is not a query. Who may write, and where, is the scheduler's
question (``scheduler.writes``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from mangonel.errors import ForbiddenStatementError, SqlSyntaxError
from mangonel.sql.frontend import _COMMENTS, _FIRST_WORD, to_duckdb
from mangonel.sqltext import identifier
from mangonel.task import WriteCompression, WriteFormat, WriteOptions
from mangonel.textfiles import strftime_problem

_WRITE_WORDS = frozenset({"copy", "create", "insert", "drop"})


class WriteKind(enum.Enum):
    COPY = "copy"
    CREATE_TABLE = "create table"
    INSERT = "insert"
    DROP_TABLE = "drop table"


@dataclass(frozen=True)
class WriteStatement:
    """One write statement, as parsed (nothing checked against the catalog yet)."""

    kind: WriteKind
    query: str = ""
    """The ``SELECT`` whose rows are written, as DuckDB SQL (empty for ``DROP``)."""
    location: str = ""
    """``COPY``'s target, as written."""
    format: WriteFormat = WriteFormat.PARQUET
    partition_by: tuple[str, ...] = ()
    overwrite: bool = False
    """``COPY ... (OVERWRITE)``, ``CREATE OR REPLACE TABLE``."""
    table: str = ""
    if_not_exists: bool = False
    """``CREATE TABLE IF NOT EXISTS``; for ``DROP``: ``IF EXISTS``."""
    options: WriteOptions = WriteOptions()
    """``COPY``'s file options: ``COMPRESSION``, ``ROW_GROUP_SIZE``, and CSV's
    ``HEADER``, ``DELIMITER``, ``QUOTE``, ``ESCAPE``, ``NULLSTR``, ``DATEFORMAT``,
    ``TIMESTAMPFORMAT``."""
    declared: bool = False
    """``CREATE TABLE t (columns)``: ``query`` is one of no rows; the statement
    answers no row (DuckDB's answer), not a count."""
    by_name: bool = False
    """``INSERT INTO t BY NAME SELECT``: the query's columns go into the table's
    columns of their names, not by position."""
    columns: tuple[str, ...] = ()
    """``INSERT INTO t (b, a) SELECT``: the table's columns the query's go into, in
    its order (the others NULL); empty: all of them, in the table's order."""


def is_write(sql: str) -> bool:
    """Whether the statement's first word is one of a write statement's."""
    body = sql[_COMMENTS.match(sql).end() :]  # type: ignore[union-attr]
    word = _FIRST_WORD.match(body)
    return word is not None and word.group(0).lower() in _WRITE_WORDS


def parse_write(sql: str, dialect: str | None = None) -> WriteStatement | None:
    """The write statement ``sql`` is, or ``None`` for anything else.

    Raises:
        SqlSyntaxError: it does not parse.
        ForbiddenStatementError: a ``CREATE`` or ``DROP`` of something other than a
            table from a query, or an option mangonel does not write.
    """
    if not is_write(sql):
        return None
    try:
        stmts = sqlglot.parse(sql, read=dialect or "duckdb")
    except ParseError as err:
        raise SqlSyntaxError(f"the statement does not parse: {err}") from err
    stmts = [s for s in stmts if s is not None]
    if len(stmts) != 1:
        raise ForbiddenStatementError("send one statement at a time")
    stmt = stmts[0]
    if isinstance(stmt, exp.Copy):
        return _copy(stmt)
    if isinstance(stmt, exp.Create):
        return _create(stmt)
    if isinstance(stmt, exp.Insert):
        return _insert(stmt)
    if isinstance(stmt, exp.Drop):
        return _drop(stmt)
    return None


def _query_sql(node: exp.Expr | None, what: str) -> str:
    if isinstance(node, exp.Subquery):
        node = node.this
    if isinstance(node, exp.Table):
        return f"SELECT * FROM {node.sql(dialect='duckdb')}"
    if not isinstance(node, exp.Query):
        raise ForbiddenStatementError(
            f"{what} writes the rows of a query: write {what} ... (SELECT ...) or name a table"
        )
    return to_duckdb(node)


def _table_name(node: exp.Expr | None, what: str) -> str:
    if isinstance(node, exp.Schema):
        raise ForbiddenStatementError(
            f"{what} with a column list is not supported: name the columns in the SELECT"
        )
    if not isinstance(node, exp.Table) or node.args.get("db") or node.args.get("catalog"):
        raise ForbiddenStatementError(f"{what} needs a plain table name")
    return node.name.lower()  # as the catalog keeps names (``catalog.load_table``)


def _copy(stmt: exp.Copy) -> WriteStatement:
    if stmt.args.get("kind"):
        raise ForbiddenStatementError(
            "COPY ... FROM is not supported: register the files as a table instead"
        )
    files = stmt.args.get("files") or []
    if len(files) != 1 or not isinstance(files[0], exp.Literal) or not files[0].is_string:
        raise ForbiddenStatementError(
            "COPY ... TO needs one quoted target: TO 'dir/' or 's3://...'"
        )
    location = files[0].this
    fmt: WriteFormat | None = None
    partition_by: tuple[str, ...] = ()
    overwrite = False
    given: dict[str, exp.Expr | None] = {}
    for param in stmt.args.get("params") or []:
        name = param.this.name.upper()
        value = param.expression
        if name == "FORMAT":
            text = (value.name if value is not None else "").lower()
            try:
                fmt = WriteFormat(text)
            except ValueError:
                raise ForbiddenStatementError(
                    f"COPY writes FORMAT parquet, csv or json, not {text!r}"
                ) from None
        elif name == "PARTITION_BY":
            if isinstance(value, exp.Paren):
                value = value.this
            cols = value.expressions if isinstance(value, exp.Tuple) else [value]
            if not all(isinstance(c, exp.Column) for c in cols):
                raise ForbiddenStatementError(
                    "PARTITION_BY takes column names: PARTITION_BY (a, b)"
                )
            partition_by = tuple(c.name for c in cols)
        elif name in ("OVERWRITE", "OVERWRITE_OR_IGNORE"):
            overwrite = not (isinstance(value, exp.Boolean) and not value.this)
        elif name in _FILE_OPTIONS or name in _FILE_OPTION_SYNONYMS:
            given[_FILE_OPTION_SYNONYMS.get(name, name)] = value
        else:
            raise ForbiddenStatementError(
                f"COPY option {name} is not supported; mangonel takes {_TAKEN}"
            )
    if fmt is None:
        fmt = WriteFormat.CSV if location.lower().endswith(".csv") else WriteFormat.PARQUET
        if location.lower().endswith(".json"):
            fmt = WriteFormat.JSON
    return WriteStatement(
        WriteKind.COPY,
        query=_query_sql(stmt.this, "COPY"),
        location=location,
        format=fmt,
        partition_by=partition_by,
        overwrite=overwrite,
        options=_file_options(given, fmt),
    )


_CSV = (WriteFormat.CSV,)
_FILE_OPTIONS = {
    "COMPRESSION": (WriteFormat.PARQUET, WriteFormat.CSV, WriteFormat.JSON),
    "ROW_GROUP_SIZE": (WriteFormat.PARQUET,),
    "HEADER": _CSV,
    "DELIMITER": _CSV,
    "QUOTE": _CSV,
    "ESCAPE": _CSV,
    "NULLSTR": _CSV,
    "DATEFORMAT": _CSV,
    "TIMESTAMPFORMAT": _CSV,
}
"""The options of DuckDB's ``COPY`` that say how files are written, and the
formats that take each."""
_FILE_OPTION_SYNONYMS = {
    "CODEC": "COMPRESSION",
    "DELIM": "DELIMITER",
    "SEP": "DELIMITER",
    "NULL": "NULLSTR",
    "DATE_FORMAT": "DATEFORMAT",
    "TIMESTAMP_FORMAT": "TIMESTAMPFORMAT",
}
_TAKEN = (
    "FORMAT, PARTITION_BY, OVERWRITE, COMPRESSION, ROW_GROUP_SIZE (Parquet), "
    "HEADER, DELIMITER, QUOTE, ESCAPE, NULLSTR (or NULL), DATEFORMAT and TIMESTAMPFORMAT (CSV)"
)
_TEXT_COMPRESSIONS = (WriteCompression.UNCOMPRESSED, WriteCompression.GZIP, WriteCompression.ZSTD)
_DUCKDB_QUOTE = '"'
"""DuckDB's CSV quote, and its escape when none is given."""


def _option_text(value: exp.Expr | None) -> str:
    if isinstance(value, exp.Literal | exp.Identifier | exp.Var | exp.Column):
        return str(value.name)
    return value.sql(dialect="duckdb") if value is not None else ""


def _quoted(given: dict[str, exp.Expr | None], name: str, takes: str) -> str:
    """The quoted text option ``name`` was given.

    Raises:
        ForbiddenStatementError: anything but one quoted text.
    """
    value = given[name]
    if not (isinstance(value, exp.Literal) and value.is_string):
        shown = value.sql(dialect="duckdb") if value is not None else "nothing"
        raise ForbiddenStatementError(f"{name} takes {takes}, not {shown}")
    return str(value.this)


def _file_options(given: dict[str, exp.Expr | None], fmt: WriteFormat) -> WriteOptions:
    """``COPY``'s file options for ``fmt``, checked as DuckDB checks them.

    Raises:
        ForbiddenStatementError: an option the format does not take, or a value
            it cannot have (the message says which are taken).
    """
    for name in given:
        if fmt not in _FILE_OPTIONS[name]:
            takes = " and ".join(f.value for f in _FILE_OPTIONS[name])
            raise ForbiddenStatementError(
                f"COPY option {name} applies to FORMAT {takes}, not {fmt.value}"
            )
    options = WriteOptions()
    if "COMPRESSION" in given:
        text = _option_text(given["COMPRESSION"]).lower()
        text = "uncompressed" if text == "none" else text
        allowed = list(WriteCompression) if fmt is WriteFormat.PARQUET else _TEXT_COMPRESSIONS
        if text not in [c.value for c in allowed]:
            raise ForbiddenStatementError(
                f"COMPRESSION {text!r} is not one mangonel writes {fmt.value} with; take one of "
                + ", ".join(c.value for c in allowed)
            )
        options = replace(options, compression=WriteCompression(text))
    if "ROW_GROUP_SIZE" in given:
        text = _option_text(given["ROW_GROUP_SIZE"])
        if not text.isdigit() or int(text) < 1:
            raise ForbiddenStatementError(
                f"ROW_GROUP_SIZE takes a number of rows (at least 1), not {text!r}"
            )
        options = replace(options, row_group_size=int(text))
    if "HEADER" in given:
        value = given["HEADER"]
        text = "true" if value is None else _option_text(value).lower()
        if text not in ("true", "false", "1", "0"):
            raise ForbiddenStatementError(f"HEADER takes true or false, not {text!r}")
        options = replace(options, header=text in ("true", "1"))
    if fmt is WriteFormat.CSV:
        options = _csv_options(given, options)
    return options


def _csv_options(given: dict[str, exp.Expr | None], options: WriteOptions) -> WriteOptions:
    """CSV's DELIMITER, QUOTE, ESCAPE, NULLSTR and date formats, checked as DuckDB's
    ``COPY`` binds them, so that a bad one is refused before any task runs.

    Raises:
        ForbiddenStatementError: a value DuckDB would refuse, naming the option and
            what it takes.
    """
    if "DELIMITER" in given:
        text = _quoted(given, "DELIMITER", "one quoted character, e.g. DELIMITER '|'")
        if len(text) != 1 or text in ("\n", "\r"):
            raise ForbiddenStatementError(
                "DELIMITER takes one quoted character other than a line break, "
                f"e.g. DELIMITER '|', not {text!r}"
            )
        options = replace(options, delimiter=text)
    for name, field in (("QUOTE", "quote"), ("ESCAPE", "escape")):
        if name in given:
            takes = f"one quoted character, or '' for none (e.g. {name} '''')"
            text = _quoted(given, name, takes)
            if len(text.encode()) > 1:
                raise ForbiddenStatementError(f"{name} takes {takes}, not {text!r}")
            options = replace(options, **{field: text})
    if "NULLSTR" in given:
        takes = "one quoted text that NULL is written as, e.g. NULLSTR 'NA'"
        options = replace(options, null=_quoted(given, "NULLSTR", takes))
    for name, field in (("DATEFORMAT", "dateformat"), ("TIMESTAMPFORMAT", "timestampformat")):
        if name in given:
            takes = f"a quoted strftime format, e.g. {name} '%d/%m/%Y'"
            text = _quoted(given, name, takes)
            _check_format(name, text, takes)
            options = replace(options, **{field: text})
    _check_csv_characters(options)
    return options


def _check_csv_characters(options: WriteOptions) -> None:
    """DuckDB's rule between the CSV characters: none appears in another's text.

    Raises:
        ForbiddenStatementError: the two that clash, and what to change.
    """
    quote = _DUCKDB_QUOTE if options.quote is None else options.quote
    escape = _DUCKDB_QUOTE if options.escape is None else options.escape
    null = options.null or ""
    default = {"QUOTE": options.quote is None, "ESCAPE": options.escape is None}
    clashes = (
        ("QUOTE", quote, "DELIMITER", options.delimiter),
        ("ESCAPE", escape, "DELIMITER", options.delimiter),
        ("DELIMITER", options.delimiter, "NULLSTR", null),
        ("QUOTE", quote, "NULLSTR", null),
        ("ESCAPE", escape, "NULLSTR", null),
    )
    for name, char, other, text in clashes:
        if char and char in text:
            which = " (DuckDB's default)" if default.get(name) else ""
            raise ForbiddenStatementError(
                f"{name} {char!r}{which} appears in {other} {text!r}, so a reader could not "
                f"tell them apart: change {name} or {other}"
            )


def _check_format(name: str, text: str, takes: str) -> None:
    """Refuse a date format DuckDB's ``strftime`` cannot write with (its ``COPY``
    would refuse the same format on every executor).

    Raises:
        ForbiddenStatementError: DuckDB's reason, and what the option takes.
    """
    problem = strftime_problem(text)
    if problem is not None:
        raise ForbiddenStatementError(f"{name} {text!r}: {problem}; {name} takes {takes}")


def _create(stmt: exp.Create) -> WriteStatement:
    kind = str(stmt.args.get("kind") or "").upper()
    schema = stmt.this if stmt.expression is None else None
    if kind != "TABLE" or (stmt.expression is None and not isinstance(schema, exp.Schema)):
        raise ForbiddenStatementError(
            "only CREATE TABLE name AS SELECT ... and CREATE TABLE name (column type, ...) "
            "are supported (to read files, register them)"
        )
    if stmt.args.get("replace") and stmt.args.get("exists"):
        raise ForbiddenStatementError("CREATE OR REPLACE and IF NOT EXISTS do not go together")
    if isinstance(schema, exp.Schema):
        query, name = _empty_query(schema), _table_name(schema.this, "CREATE TABLE")
    else:
        query = _query_sql(stmt.expression, "CREATE TABLE AS")
        name = _table_name(stmt.this, "CREATE TABLE")
    return WriteStatement(
        WriteKind.CREATE_TABLE,
        query=query,
        declared=isinstance(schema, exp.Schema),
        table=name,
        overwrite=bool(stmt.args.get("replace")),
        if_not_exists=bool(stmt.args.get("exists")),
    )


def _empty_query(schema: exp.Schema) -> str:
    """The query of no rows whose columns are ``CREATE TABLE t (columns)``'s: the
    table is then created as by ``CREATE TABLE t AS`` that query.

    Raises:
        ForbiddenStatementError: a column without a type, or with a constraint or
            default (a Parquet table keeps neither).
    """
    columns = []
    for column in schema.expressions:
        if not isinstance(column, exp.ColumnDef) or column.args.get("kind") is None:
            raise ForbiddenStatementError(
                "CREATE TABLE name (column type, ...) needs a type for every column"
            )
        if column.args.get("constraints"):
            raise ForbiddenStatementError(
                f"column {column.name}: constraints and defaults are not kept (the table is "
                "Parquet files); declare the column with its type only"
            )
        kind = column.args["kind"].sql(dialect="duckdb")
        columns.append(f"CAST(NULL AS {kind}) AS {identifier(column.name)}")
    if not columns:
        raise ForbiddenStatementError("CREATE TABLE name (...) needs at least one column")
    return f"SELECT {', '.join(columns)} WHERE false"


def _insert(stmt: exp.Insert) -> WriteStatement:
    if stmt.args.get("overwrite") or stmt.args.get("conflict") or stmt.args.get("returning"):
        raise ForbiddenStatementError(
            "only INSERT INTO name SELECT ... and INSERT INTO name VALUES (...) are supported"
        )
    rows = stmt.expression
    if isinstance(rows, exp.Values):
        # DuckDB reads a VALUES list as a query of its own: its columns are the
        # table's by position, as INSERT ... SELECT's are.
        query = f"SELECT * FROM ({rows.sql(dialect='duckdb')})"
    else:
        query = _query_sql(rows, "INSERT INTO")
    target, columns = stmt.this, ()
    if isinstance(target, exp.Schema):
        # INSERT INTO t (b, a) ...: the query's columns go into those, by position.
        target, columns = target.this, tuple(c.name for c in target.expressions)
        if stmt.args.get("by_name"):
            raise ForbiddenStatementError(
                "INSERT INTO ... BY NAME takes the columns by the query's names: "
                "leave out the column list, or BY NAME"
            )
    return WriteStatement(
        WriteKind.INSERT,
        query=query,
        table=_table_name(target, "INSERT INTO"),
        by_name=bool(stmt.args.get("by_name")),
        columns=columns,
    )


def _drop(stmt: exp.Drop) -> WriteStatement:
    tables = stmt.args.get("tables") or [stmt.this]
    if str(stmt.args.get("kind") or "").upper() != "TABLE" or len(tables) != 1:
        raise ForbiddenStatementError("only DROP TABLE name is supported")
    return WriteStatement(
        WriteKind.DROP_TABLE,
        table=_table_name(tables[0], "DROP TABLE"),
        if_not_exists=bool(stmt.args.get("exists")),
    )
