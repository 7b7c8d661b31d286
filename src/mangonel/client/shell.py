"""Reading queries for ``mangonel sql``: from an argument, a file, stdin or a prompt."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

PROMPT = "mangonel> "
CONTINUATION = "     ...> "


def strip_statement(text: str) -> str:
    """The query without surrounding blanks and trailing semicolons."""
    return text.strip().rstrip(";").strip()


def read_statements(read_line: Callable[[str], str] = input) -> Iterator[str]:
    """Statements typed at a prompt: multi-line until a ``;``, ``\\q`` or EOF ends it.

    A statement ends at a line whose last character (ignoring blanks) is ``;``.
    """
    buffer: list[str] = []
    while True:
        try:
            line = read_line(CONTINUATION if buffer else PROMPT)
        except EOFError:
            print(file=sys.stderr)
            break
        except KeyboardInterrupt:
            # Ctrl-C drops the statement being typed, like psql.
            print(file=sys.stderr)
            buffer.clear()
            continue
        if not buffer and line.strip() in ("\\q", "quit", "exit"):
            return
        if not buffer and not line.strip():
            continue
        buffer.append(line)
        if line.rstrip().endswith(";"):
            statement = strip_statement("\n".join(buffer))
            buffer.clear()
            if statement:
                yield statement
    statement = strip_statement("\n".join(buffer))
    if statement:
        yield statement
