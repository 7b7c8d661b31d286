"""The front end's parse: what it keeps of sqlglot's tree for the planner."""

from __future__ import annotations

from mangonel.sql.frontend import parse


def test_parse_forgets_text_positions() -> None:
    # Every copy of the tree would copy them; nothing after parsing reads them.
    parsed = parse("SELECT a.x, sum(b) AS s FROM t AS a WHERE c = 1 GROUP BY 1", {"t"})
    with_positions = [
        n for n in parsed.query.walk() if n._meta and {"line", "col"} & n._meta.keys()
    ]
    assert with_positions == []


def test_parse_keeps_other_metadata() -> None:
    # A ``/* sqlglot.meta */`` comment is an instruction to sqlglot's rules, not a
    # position: it stays.
    parsed = parse("SELECT x /* sqlglot.meta nonnull */ FROM t", {"t"})
    kept = [n._meta for n in parsed.query.walk() if n._meta]
    assert kept == [{"nonnull": True}]
