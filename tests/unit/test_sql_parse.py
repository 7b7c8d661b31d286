"""The front end's parse: what it keeps of sqlglot's tree for the planner."""

from __future__ import annotations

import pytest
from sqlglot import exp

from mangonel.errors import ForbiddenStatementError, UnknownTableError
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


HOST_QUERIES = [
    "SELECT current_setting('memory_limit')",
    "SELECT current_setting('temp_directory') AS spill FROM t",
    "SELECT CURRENT_SETTING('threads')",
    "SELECT 'memory_limit'.current_setting()",  # DuckDB's method-call syntax
    "SELECT version()",
    'SELECT "version"()',
    "SELECT system.main.version()",
    "SELECT current_query()",
    "SELECT current_database(), current_schema()",
    "SELECT current_user",
    "SELECT session_user",
    "SELECT current_catalog",
    "SELECT current_schemas(true)",
    "SELECT current_connection_id()",
    "SELECT txid_current()",
    "SELECT getvariable('x')",
    "SELECT pg_postmaster_start_time()",
    "SELECT has_table_privilege('t', 'select')",
    "SELECT x FROM t WHERE x > (SELECT length(version()))",
    "WITH s AS (SELECT current_setting('memory_limit') AS m) SELECT m FROM s",
]


@pytest.mark.parametrize("sql", HOST_QUERIES)
def test_functions_that_answer_about_the_host_are_refused(sql: str) -> None:
    with pytest.raises(ForbiddenStatementError, match="answers about the cluster's hosts"):
        parse(sql, {"t"})
    with pytest.raises(ForbiddenStatementError, match="answers about the cluster's hosts"):
        parse(sql, {"t"}, "postgres")


def test_what_computes_on_the_data_alone_still_runs() -> None:
    for sql in (
        "SELECT now(), current_date, pg_typeof(x), pg_size_pretty(x) FROM t",
        "SELECT x AS version, x AS current_setting FROM t",
        "SELECT v.version FROM (SELECT x AS version FROM t) AS v",
    ):
        parse(sql, {"t"})


def test_a_table_qualified_by_the_default_schema_is_the_table() -> None:
    # BI tools (Superset) write every name as schema.table, with the one schema the
    # SQLAlchemy dialect lists.
    parsed = parse('SELECT o.x FROM main.t AS o JOIN "MAIN".u ON o.x = u.x', {"t", "u"})
    assert parsed.tables == {"t", "u"}
    assert [table.sql() for table in parsed.query.find_all(exp.Table)] == ["t AS o", "u"]


@pytest.mark.parametrize("sql", ["SELECT x FROM other.t", "SELECT x FROM memory.main.t"])
def test_a_table_in_another_schema_or_catalog_is_unknown(sql: str) -> None:
    with pytest.raises(UnknownTableError, match="refer to registered tables by their plain name"):
        parse(sql, {"t"})
