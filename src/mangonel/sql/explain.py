"""Whether a statement is an EXPLAIN, from its text alone, without sqlglot.

The client asks this of every statement it sends (``Session.sql``); it used to ask the
planner, and the first query of a client process then imported the planner and sqlglot
for one regular expression (0.2 to 0.3 s, most of the gap between a fresh cluster's
first TPC-DS query through ``Session.sql`` and through ``Session.submit``).
"""

from __future__ import annotations

import re

EXPLAIN = re.compile(r"^\s*explain\b", re.IGNORECASE)
"""A leading ``EXPLAIN`` keyword (the front end strips it before parsing)."""


def is_explain(sql: str) -> bool:
    """True for ``EXPLAIN SELECT ...``: the caller shows the plan instead of running it.

    >>> is_explain("  explain SELECT 1"), is_explain("SELECT 'explain'")
    (True, False)
    """
    return bool(EXPLAIN.match(sql))
