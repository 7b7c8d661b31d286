"""The SQL front end: parse a statement and refuse what may not run.

Only one SELECT statement (optionally prefixed by EXPLAIN) over the catalog's
tables may run. Everything else — COPY, ATTACH, INSTALL, LOAD, SET, PRAGMA, DDL,
DML, table functions that read files (``read_csv``, ``read_parquet``, ``glob``),
quoted file paths used as tables — is refused here, before anything is planned.
The executors also run DuckDB with external access disabled, so this is the first
of two walls, not the only one. So are the functions that answer about the host
a query runs on rather than about the data (``current_setting('memory_limit')``,
``current_setting('temp_directory')``: an executor's spill path, with its pid;
``version()``; the text of the task's own SQL, DuckDB's catalog and session):
refused for every user, and every front door (gRPC, Flight SQL, the web UI)
plans through ``parse``.

The output is a sqlglot AST (``ParsedQuery``), which ``sql.optimize`` qualifies and
decorrelates and ``plan.bind`` turns into the logical plan. This package knows
nothing of the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from mangonel import defaults
from mangonel.errors import ForbiddenStatementError, SqlSyntaxError, UnknownTableError
from mangonel.sql.explain import EXPLAIN, is_explain

DEFAULT_DIALECT = "duckdb"

# Function names that read files, the environment or DuckDB's own state.
_FORBIDDEN_FUNCTION = re.compile(
    r"^(read_\w+|\w+_scan|glob|parquet_\w+|sniff_csv|getenv|query|query_table|"
    r"duckdb_\w+|pragma_\w+|iceberg_\w+|delta_\w+|sqlite_\w+|postgres_\w+|mysql_\w+|"
    r"which_secret|load_extension|install_extension)$",
    re.IGNORECASE,
)

# Function names (as written, or sqlglot's names of the ones it knows) that answer
# about the host a task runs on, not about the data: DuckDB's settings (memory,
# threads, the spill directory), its version, the SQL text and ids of the task's own
# query and connection, its catalog, session and role. ``pg_typeof`` and
# ``pg_size_pretty`` compute on their argument alone.
_HOST_FUNCTION = re.compile(
    r"^(current_(setting|version|query|query_id|connection_id|transaction_id|database|"
    r"catalog|schemas?|user|role)|version|session_user|user|txid_current|getvariable|"
    r"in_search_path|get_block_size|has_\w+_privilege|pg_(?!typeof$|size_pretty$)\w+)$",
    re.IGNORECASE,
)


# Statements refused by their first word, before parsing: some of them (EXPORT
# DATABASE, CALL, ...) are not even parsed by sqlglot, and the user should hear
# "not allowed", not "syntax error".
_COMMENTS = re.compile(r"^(\s*(--[^\n]*\n?|/\*.*?\*/))*\s*", re.DOTALL)
_FIRST_WORD = re.compile(r"[A-Za-z_]+")
_STATEMENT_WORDS = frozenset(
    {
        "alter",
        "analyze",
        "attach",
        "begin",
        "call",
        "checkpoint",
        "comment",
        "commit",
        "copy",
        "create",
        "deallocate",
        "delete",
        "describe",
        "detach",
        "drop",
        "execute",
        "export",
        "grant",
        "import",
        "insert",
        "install",
        "load",
        "merge",
        "pivot_wider",
        "prepare",
        "pragma",
        "replace",
        "reset",
        "revoke",
        "rollback",
        "set",
        "show",
        "summarize",
        "truncate",
        "unpivot",
        "update",
        "upsert",
        "use",
        "vacuum",
    }
)


@dataclass(frozen=True)
class ParsedQuery:
    """A statement that passed the front end's checks."""

    query: exp.Query
    dialect: str
    explain: bool
    tables: frozenset[str]
    """Catalog tables the query reads."""


def parse(sql: str, tables: frozenset[str] | set[str], dialect: str | None = None) -> ParsedQuery:
    """Parse one statement and check that it may run.

    Raises:
        SqlSyntaxError: the text does not parse; the message gives line and column.
        ForbiddenStatementError: not a single SELECT, or it uses a file/table function.
        UnknownTableError: it names a table the catalog does not hold.
    """
    dialect = (dialect or DEFAULT_DIALECT).lower()
    explain = is_explain(sql)
    text = EXPLAIN.sub("", sql, count=1) if explain else sql
    first = _FIRST_WORD.match(text[_COMMENTS.match(text).end() :])  # type: ignore[union-attr]
    if first and first.group(0).lower() in _STATEMENT_WORDS:
        raise ForbiddenStatementError(
            f"{first.group(0).upper()} statements are not allowed: {_WHAT_RUNS}"
        )
    try:
        statements = [s for s in sqlglot.parse(text, read=dialect) if s is not None]
    except ParseError as err:
        raise SqlSyntaxError(describe_parse_error(err)) from None
    except TokenError as err:
        raise SqlSyntaxError(f"syntax error: {err}") from None
    except ValueError as err:  # unknown dialect name
        raise SqlSyntaxError(f"{err}; use a dialect sqlglot knows, e.g. duckdb, postgres") from None
    if not statements:
        raise SqlSyntaxError("the query is empty; write a SELECT statement")
    if len(statements) > 1:
        raise ForbiddenStatementError(
            f"got {len(statements)} statements; send one SELECT statement at a time"
        )
    stmt = statements[0]
    if not isinstance(stmt, exp.Query):
        kind = stmt.key.upper() if not isinstance(stmt, exp.Command) else str(stmt.this).upper()
        raise ForbiddenStatementError(f"{kind} statements are not allowed: {_WHAT_RUNS}")
    used = _check_sources(stmt, {t.lower() for t in tables})
    _forget_positions(stmt)
    _mark_aggregates(stmt)
    _expand_grouping_ordinals(stmt)
    return ParsedQuery(stmt, dialect, explain, frozenset(used))


_WHAT_RUNS = (
    "mangonel runs queries (SELECT, EXPLAIN SELECT) and writes (CREATE TABLE ... AS, "
    "INSERT INTO, COPY ... TO, DROP TABLE) over registered tables; register data with "
    "`mangonel register` or register_parquet"
)


def _duckdb_aggregates() -> frozenset[str]:
    """The names of DuckDB's aggregate functions, lower case."""
    import duckdb  # asked once, by the first query calling a function sqlglot does not know

    with duckdb.connect() as con:
        rows = con.execute(
            "SELECT DISTINCT function_name FROM duckdb_functions() "
            "WHERE function_type = 'aggregate'"
        ).fetchall()
    return frozenset(name.lower() for (name,) in rows)


_AGGREGATES: frozenset[str] | None = None


def _mark_aggregates(stmt: exp.Expr) -> None:
    """Make each call of a DuckDB aggregate that sqlglot does not know
    (``histogram``, ``kurtosis_pop``, ``product``, ``mad``, ...; it parses them
    as ``Anonymous`` functions) an ``AnonymousAggFunc``, so that sqlglot's rules
    and the binder see it as the aggregate it is: otherwise a filter could be
    pushed below it, an ``EXISTS`` over it taken for a semi join, or its
    arguments' columns computed after the GROUP BY that drops them."""
    global _AGGREGATES
    calls = [node for node in stmt.find_all(exp.Anonymous) if isinstance(node.this, str)]
    if not calls:
        return
    if _AGGREGATES is None:
        _AGGREGATES = _duckdb_aggregates()
    for node in calls:
        if node.this.lower() in _AGGREGATES:
            node.replace(exp.AnonymousAggFunc(this=node.this, expressions=node.expressions))


def _expand_grouping_ordinals(stmt: exp.Expr) -> None:
    """Write a number in ``ROLLUP``, ``CUBE`` or ``GROUPING SETS`` as the SELECT
    expression it stands for, as DuckDB reads it (``GROUP BY ROLLUP (1, 2)``);
    sqlglot's qualification expands those of a plain GROUP BY only."""
    for select in stmt.find_all(exp.Select):
        group = select.args.get("group")
        if group is None:
            continue
        items = select.expressions
        for grouping in group.find_all(exp.Rollup, exp.Cube, exp.GroupingSets):
            for element in list(grouping.expressions):
                members = (
                    element.expressions
                    if isinstance(element, exp.Tuple)
                    else [element.this]
                    if isinstance(element, exp.Paren)
                    else [element]
                )
                for member in list(members):
                    if isinstance(member, exp.Literal) and member.is_int:
                        position = int(member.this)
                        if 1 <= position <= len(items):
                            member.replace(items[position - 1].unalias().copy())


_POSITIONS = ("line", "col", "start", "end")


def _forget_positions(stmt: exp.Expr) -> None:
    """Drop where each node stood in the text, once the text is known to be valid.

    sqlglot's parser records a line, column and offsets on every identifier, literal
    and function; nothing after parsing reads them, but every copy of a tree copies
    them with ``copy.deepcopy`` (a dict per node). The planner copies trees often:
    keeping them made up about a quarter of planning TPC-DS's 99 queries. Other
    metadata (a dialect's quoting marks, ``/* sqlglot.meta */`` comments) is kept.
    """
    for node in stmt.walk():
        meta = node._meta
        if meta is None:
            continue
        for key in _POSITIONS:
            meta.pop(key, None)
        if not meta:
            node._meta = None


def describe_parse_error(err: ParseError) -> str:
    """sqlglot's parse error in plain words: where, near which token, what.

    Not ``str(err)``: that quotes the statement with the token underlined by
    terminal escape codes.
    """
    if err.errors:
        first = err.errors[0]
        desc = str(first.get("description") or "syntax error")
        line, col = first.get("line"), first.get("col")
        near = (first.get("highlight") or "").strip()
        where = f" at line {line}, column {col}" if line is not None else ""
        near_txt = f" near {near!r}" if near else ""
        return f"syntax error{where}{near_txt}: {desc}"
    return f"syntax error: {err}"


def _in_default_schema(table: exp.Table) -> bool:
    """Whether ``table`` is qualified by the schema the tables live in (``main.orders``)."""
    db = table.args.get("db")
    return (
        isinstance(db, exp.Identifier)
        and db.name.lower() == defaults.SCHEMA
        and not table.args.get("catalog")
    )


def _check_sources(stmt: exp.Query, catalog: set[str]) -> set[str]:
    """Refuse table functions that read (all but ``range`` and ``generate_series``)
    and unknown tables, and drop the default schema from names qualified by it;
    return the catalog tables used."""
    cte_names = {cte.alias_or_name.lower() for cte in stmt.find_all(exp.CTE)}
    used: set[str] = set()
    for node in stmt.walk():
        if isinstance(node, exp.Func):
            name = node.sql_name() if not isinstance(node, exp.Anonymous) else str(node.this)
            if _FORBIDDEN_FUNCTION.match(name):
                raise ForbiddenStatementError(
                    f"function {name.lower()}() is not allowed: queries may read only "
                    "registered tables; register the file with register_parquet first"
                )
            if _HOST_FUNCTION.match(name):
                if not isinstance(node, exp.Anonymous):  # as DuckDB spells it: version()
                    name = node.sql(dialect=DEFAULT_DIALECT).partition("(")[0]
                raise ForbiddenStatementError(
                    f"function {name.lower()}() is not allowed: it answers about the "
                    "cluster's hosts (settings, versions, paths, sessions), not about the "
                    "data; queries may compute only on registered tables"
                )
        if not isinstance(node, exp.Table):
            continue
        if isinstance(node.this, exp.GenerateSeries):
            continue  # range() / generate_series(): rows computed, no file read
        if not isinstance(node.this, exp.Identifier):
            raise ForbiddenStatementError(
                f"table function {node.this.sql(dialect=DEFAULT_DIALECT)} is not allowed: "
                "queries may read only registered tables"
            )
        if _in_default_schema(node):
            node.set("db", None)  # main.orders is orders (BI tools qualify every name)
        if node.args.get("db") or node.args.get("catalog"):
            raise UnknownTableError(
                f"table {node.sql(dialect=DEFAULT_DIALECT)} is not in the catalog; "
                "refer to registered tables by their plain name"
            )
        name = node.name.lower()
        if name in cte_names:
            continue
        if name not in catalog:
            known = ", ".join(sorted(catalog)) or "none yet"
            raise UnknownTableError(
                f"table {node.name!r} is not in the catalog (registered: {known}); "
                "register it with register_parquet(name, path) or `mangonel register`",
                table=name,
            )
        used.add(name)
    return used


def to_duckdb(query: exp.Expr) -> str:
    return query.sql(dialect=DEFAULT_DIALECT)
