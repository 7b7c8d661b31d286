"""``CREATE EXTERNAL TABLE``: the SQL spelling of register (``DROP TABLE`` is the
scheduler's, with the write statements: ``sql.writes``).

Ballista's (and DataFusion's) DDL::

    CREATE EXTERNAL TABLE [IF NOT EXISTS] name [(column type, ...)]
        STORED AS PARQUET | CSV | JSON | NDJSON
        LOCATION 'path, directory, glob or s3:// location'
        [OPTIONS ('key' 'value', ...)]

sqlglot 30 reads the statement without a column list or ``OPTIONS`` and falls
back to an opaque command with them, so this module parses the one statement
itself, over sqlglot's tokens (quoting, comments and literals as DuckDB's).
``OPTIONS`` pairs may also be written ``'key' = 'value'``; keys and values are
those of ``mangonel.textfiles.OPTIONS`` (a Parquet table takes none).

``parse_ddl`` returns ``None`` for any other statement: it goes to the planner.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot.errors import TokenError
from sqlglot.tokens import Token, Tokenizer, TokenType

from mangonel.errors import SqlSyntaxError


@dataclass(frozen=True)
class CreateExternalTable:
    name: str
    location: str
    format: str
    columns: tuple[tuple[str, str], ...] = ()
    """Declared (name, DuckDB type); empty: inferred (CSV, JSON) or the files' (Parquet)."""
    options: tuple[tuple[str, str], ...] = ()
    if_not_exists: bool = False


_FORMATS = ("PARQUET", "CSV", "JSON", "NDJSON")


def parse_ddl(sql: str) -> CreateExternalTable | None:
    """The statement, when ``sql`` is a ``CREATE EXTERNAL TABLE``.

    >>> parse_ddl("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION 't.csv'").format
    'csv'
    >>> parse_ddl("SELECT 1") is None
    True

    Raises:
        SqlSyntaxError: it is one, written wrong (the message says where).
    """
    head = sql[:4096].upper()
    if "EXTERNAL" not in head:
        return None  # a query: not worth tokenizing here
    try:
        tokens = [t for t in Tokenizer().tokenize(sql) if t.token_type != TokenType.SEMICOLON]
    except TokenError:
        return None  # not ours: the planner's parser reports it
    words = [t.text.upper() for t in tokens[:3]]
    if words[:3] == ["CREATE", "EXTERNAL", "TABLE"]:
        return _Parser(tokens[3:], sql).create()
    return None


class _Parser:
    def __init__(self, tokens: list[Token], sql: str) -> None:
        self.tokens = tokens
        self.at = 0
        self.sql = sql

    def create(self) -> CreateExternalTable:
        exists = self._words("IF", "NOT", "EXISTS")
        name = self._name("the table's name")
        columns: list[tuple[str, str]] = []
        if self._take(TokenType.L_PAREN):
            while True:
                column = self._name("a column name")
                columns.append((column, self._type()))
                if self._take(TokenType.R_PAREN):
                    break
                self._expect(TokenType.COMMA, "',' or ')' after a column")
        kind = ""
        location = ""
        options: list[tuple[str, str]] = []
        while self.at < len(self.tokens):
            if self._words("STORED", "AS"):
                kind = self._word("PARQUET, CSV or JSON").upper()
                if kind not in _FORMATS:
                    self._fail(f"STORED AS {kind}: use PARQUET, CSV or JSON")
            elif self._words("LOCATION"):
                location = self._string("the location, quoted")
            elif self._words("OPTIONS"):
                options += self._options()
            else:
                self._fail("expected STORED AS, LOCATION or OPTIONS")
        if not kind:
            self._fail("missing STORED AS PARQUET | CSV | JSON")
        if not location:
            self._fail("missing LOCATION '...'")
        return CreateExternalTable(
            name, location, kind.lower(), tuple(columns), tuple(options), exists
        )

    def _options(self) -> list[tuple[str, str]]:
        self._expect(TokenType.L_PAREN, "'(' after OPTIONS")
        out: list[tuple[str, str]] = []
        while not self._take(TokenType.R_PAREN):
            if out:
                self._expect(TokenType.COMMA, "',' between options")
            key = self._string("an option's name, quoted")
            self._take(TokenType.EQ)
            out.append((key, self._value()))
        return out

    def _type(self) -> str:
        """A column type, as written: words and a parenthesised list (``DECIMAL(15, 2)``)."""
        parts: list[str] = []
        depth = 0
        while self.at < len(self.tokens):
            token = self.tokens[self.at]
            if depth == 0 and token.token_type in (TokenType.COMMA, TokenType.R_PAREN):
                break
            if token.token_type == TokenType.L_PAREN:
                depth += 1
            elif token.token_type == TokenType.R_PAREN:
                depth -= 1
            parts.append(token.text)
            self.at += 1
        if not parts:
            self._fail("a column needs a type")
        text = " ".join(parts)
        return text.replace(" ( ", "(").replace(" )", ")").replace("( ", "(").replace(" ,", ",")

    def _value(self) -> str:
        token = self._next("an option's value")
        if token.token_type in (TokenType.STRING, TokenType.NUMBER):
            return token.text
        if token.token_type in (TokenType.TRUE, TokenType.FALSE):
            return token.text.lower()
        self._fail(f"an option's value must be quoted, got {token.text!r}")
        raise AssertionError("unreachable")

    def _name(self, what: str) -> str:
        token = self._next(what)
        if token.token_type in (TokenType.STRING, TokenType.NUMBER) or not token.text:
            self._fail(f"expected {what}, got {token.text!r}")
        return token.text

    def _word(self, what: str) -> str:
        return self._next(what).text

    def _string(self, what: str) -> str:
        token = self._next(what)
        if token.token_type != TokenType.STRING:
            self._fail(f"expected {what}, got {token.text!r}")
        return token.text

    def _words(self, *words: str) -> bool:
        ahead = self.tokens[self.at : self.at + len(words)]
        if len(ahead) == len(words) and all(
            t.text.upper() == w and t.token_type != TokenType.STRING
            for t, w in zip(ahead, words, strict=True)
        ):
            self.at += len(words)
            return True
        return False

    def _take(self, kind: TokenType) -> bool:
        if self.at < len(self.tokens) and self.tokens[self.at].token_type == kind:
            self.at += 1
            return True
        return False

    def _expect(self, kind: TokenType, what: str) -> None:
        if not self._take(kind):
            self._fail(f"expected {what}")

    def _next(self, what: str) -> Token:
        if self.at >= len(self.tokens):
            self._fail(f"expected {what} at the end")
        token = self.tokens[self.at]
        self.at += 1
        return token

    def _fail(self, problem: str) -> None:
        where = ""
        if self.at < len(self.tokens):
            token = self.tokens[self.at]
            where = f" (line {token.line}, column {token.col})"
        raise SqlSyntaxError(
            f"{problem}{where}; write CREATE EXTERNAL TABLE name [(column type, ...)] "
            "STORED AS PARQUET|CSV|JSON LOCATION '...' [OPTIONS ('key' 'value', ...)]"
        )
