"""SQL text that mangonel writes for DuckDB: a name as an identifier, a string
as a literal. The quoting rules, once: an identifier in double quotes with each
double quote doubled, a literal in single quotes with each single quote doubled.
Whatever the name or the text holds, the result is one token: a table, column or
path never ends the statement it is put into."""

from __future__ import annotations

__all__ = ["identifier", "literal"]


def identifier(name: str) -> str:
    """``name`` as a DuckDB identifier (``a"b`` -> ``"a""b"``)."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """``text`` as a DuckDB string literal (``it's`` -> ``'it''s'``)."""
    return "'" + text.replace("'", "''") + "'"
