"""Query parameters: count the placeholders of a statement, bind values as literals.

Flight SQL prepared statements carry their parameters as Arrow rows. mangonel
plans only complete SQL, so a statement's placeholders (``?`` in order, or
``$1``, ``$2``, ... by number) are replaced by typed SQL literals built as
sqlglot expressions (never by pasting text), and the resulting SQL is planned
and run like any other query:

>>> bind_parameters("SELECT * FROM t WHERE a = ? AND b = ?", [1, "x"])
"SELECT * FROM t WHERE a = 1 AND b = 'x'"
>>> count_parameters("SELECT $2 + $1")
2
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Sequence

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType  # type: ignore[attr-defined]

from mangonel.errors import BindError, SqlSyntaxError
from mangonel.sql.frontend import DEFAULT_DIALECT, describe_parse_error


def numbered(sql: str, dialect: str | None = None) -> str:
    """``sql`` with its n-th ``?`` token written ``$n``: a parse tree keeps no
    positions, and its walk order is not the reading order (a ``WITH`` comes
    last), so the positional parameters are numbered on the tokens first. Only
    placeholder tokens are rewritten, into placeholders.

    sqlglot reads ``?::`` as one token, Databricks' try-cast; in any other dialect
    it is a placeholder cast (``?::VARCHAR``), which DuckDB takes."""
    name = (dialect or DEFAULT_DIALECT).lower()
    tokens = [
        t
        for t in Dialect.get_or_raise(name).tokenize(sql)
        if (t.token_type is TokenType.PLACEHOLDER and t.text == "?")
        or (t.token_type is TokenType.QDCOLON and name != "databricks")
    ]
    for n, token in reversed(list(enumerate(tokens, start=1))):
        sql = f"{sql[: token.start]}${n}{sql[token.start + 1 :]}"
    return sql


def _placeholders(sql: str, dialect: str | None) -> tuple[exp.Expr, list[exp.Placeholder]]:
    d = (dialect or DEFAULT_DIALECT).lower()
    try:
        if "$" in sql and "?" in sql:
            mixed = sqlglot.parse_one(sql, read=d).find_all(exp.Placeholder)
            if len({bool(_name(p)) for p in mixed}) > 1:
                raise BindError("a statement mixes ? and $N parameters; use one kind")
        tree = sqlglot.parse_one(numbered(sql, d), read=d)
    except TokenError as err:
        raise SqlSyntaxError(f"syntax error: {err}") from None
    except ParseError as err:
        raise SqlSyntaxError(describe_parse_error(_as_written(sql, d, err))) from None
    if tree is None:
        raise SqlSyntaxError("the query is empty; write a SELECT statement")
    found = list(tree.find_all(exp.Placeholder))
    named = [_name(p) for p in found if not _name(p).isdigit()]
    if named:
        raise BindError(f"named parameter ${named[0]} is not supported; use ? or $1, $2, ...")
    return tree, found


def _as_written(sql: str, dialect: str, numbered: ParseError) -> ParseError:
    """The parse error of ``sql`` itself: its line and column are the user's, not
    those of the text with ``?`` numbered."""
    try:
        sqlglot.parse_one(sql, read=dialect)
    except ParseError as err:
        return err
    except TokenError:
        pass
    return numbered


def _name(node: exp.Placeholder) -> str:
    """``"2"`` for ``$2``, ``"x"`` for ``$x``, ``""`` for ``?``."""
    return str(node.args.get("this") or "")


def count_parameters(sql: str, dialect: str | None = None) -> int:
    """How many values the statement takes (``?`` each one, ``$N`` up to the highest N).

    Raises:
        SqlSyntaxError: the statement does not parse.
        BindError: it uses named or mixed parameters.
    """
    _, found = _placeholders(sql, dialect)
    return max((int(_name(p)) for p in found), default=0)


def bind_parameters(sql: str, values: Sequence[object], dialect: str | None = None) -> str:
    """The statement with each placeholder replaced by its value as a literal.

    Args:
        sql: One statement with ``?`` or ``$N`` placeholders.
        values: One Python value per parameter (as ``pyarrow`` converts a row).
        dialect: sqlglot dialect of ``sql``; the result is in the same dialect.

    Raises:
        BindError: a wrong number of values, or a value of a type without a literal.
    """
    d = (dialect or DEFAULT_DIALECT).lower()
    tree, found = _placeholders(sql, d)
    wanted = count_parameters(sql, d)
    if len(values) != wanted:
        raise BindError(f"the statement takes {wanted} parameters, {len(values)} were bound")
    for node in found:
        node.replace(literal(values[int(_name(node)) - 1]))
    return tree.sql(dialect=d)


def literal(value: object) -> exp.Expr:
    """A SQL literal of a Python value, typed where the bare literal would be ambiguous.

    >>> literal(dt.date(2024, 1, 31)).sql("duckdb")
    "CAST('2024-01-31' AS DATE)"
    """
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return exp.Literal.number(repr(value))
        return exp.cast(exp.Literal.string(str(value)), exp.DataType.Type.DOUBLE)
    if isinstance(value, decimal.Decimal):
        _, digits, exponent = value.as_tuple()
        scale = max(0, -int(exponent))
        precision = min(38, max(len(digits), scale + 1))
        return exp.cast(exp.Literal.string(str(value)), f"DECIMAL({precision}, {scale})")
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, bytes):
        return exp.Unhex(this=exp.Literal.string(value.hex()))
    if isinstance(value, dt.datetime):
        kind = "TIMESTAMPTZ" if value.tzinfo is not None else "TIMESTAMP"
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), kind)
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), exp.DataType.Type.DATE)
    if isinstance(value, dt.time):
        return exp.cast(exp.Literal.string(value.isoformat()), exp.DataType.Type.TIME)
    raise BindError(
        f"a parameter of type {type(value).__name__} cannot be bound; bind a number, "
        "string, bytes, boolean, date, time, timestamp or NULL"
    )
