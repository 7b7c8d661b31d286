"""Columns nobody reads, dropped from scans and projections of the bound plan.

The front end qualifies each table as a derived table of all of its columns and
sqlglot's ``pushdown_projections`` trims them only where it sees every reader. It
does not see into the subqueries the front end hides from it (they run as stages
of their own), so a CTE read only by such subqueries kept every column: TPC-DS
q95's ``ws_wh`` read all 34 columns of ``web_sales`` twice to use two, and q14 read
all of ``store_sales``, ``catalog_sales``, ``web_sales``, ``item`` and ``date_dim``.
Scans read only the columns the plan above them uses (estimates, splits and
broadcasts count the bytes of those), and projections compute only those.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from mangonel.plan.logical import Node, Project, Ref, Scan, required_columns

__all__ = ["prune_columns"]


def prune_columns(root: Node, subqueries: Mapping[str, Node]) -> None:
    """Drop the unread columns under ``root`` and the subqueries, in place.

    A root keeps all of its outputs (the query's result, a subquery's rows). A node
    read by several parents keeps what any of them reads.
    """
    needs: dict[Node, set[Ref]] = {}
    for tree in [root, *subqueries.values()]:
        for node, cols in required_columns(tree).items():
            needs[node] = needs.get(node, set()) | cols
    for node, need in needs.items():
        if isinstance(node, Scan):
            used = {name for q, name in need if q == node.alias}
            if node.filter is not None:
                used |= {c.name for c in node.filter.find_all(exp.Column)}
            # one column at least: a scan of no column has no rows to count
            node.columns = [c for c in node.columns if c in used] or node.columns[:1]
        elif isinstance(node, Project):
            kept = [(n, e) for n, e in node.items if (node.qualifier, n) in need]
            node.items = kept or node.items[:1]
