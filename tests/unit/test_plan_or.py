"""``binder.factor_or``: common factors out of an OR, implied one-alias filters added."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from mangonel.plan.bind import factor_or


def _factored(where: str) -> list[str]:
    cond = sqlglot.parse_one(f"SELECT 1 FROM a, b WHERE {where}", read="duckdb").args["where"].this
    return [c.sql(dialect="duckdb") for c in factor_or(cond)]


def test_common_factors_leave_the_or() -> None:
    assert _factored("(a.k = b.k AND a.x = 1) OR (a.k = b.k AND b.y = 2)") == [
        "a.k = b.k",
        "(a.x = 1) OR (b.y = 2)",
    ]


def test_a_branch_of_common_factors_only_makes_the_or_true() -> None:
    assert _factored("(a.k = b.k AND a.x = 1) OR (a.k = b.k)") == ["a.k = b.k"]


def test_implied_filters_of_each_alias_every_branch_filters() -> None:
    out = _factored(
        "(a.k = b.k AND a.x = 1 AND b.y < 5) OR (a.k = b.k AND a.x = 2 AND b.y > 7 AND b.z = 1)"
    )
    assert out == [
        "a.k = b.k",
        "(a.x = 1 AND b.y < 5) OR (a.x = 2 AND b.y > 7 AND b.z = 1)",
        "(a.x = 1) OR (a.x = 2)",
        "(b.y < 5) OR (b.y > 7 AND b.z = 1)",
    ]


def test_no_implied_filter_for_an_alias_some_branch_does_not_filter() -> None:
    # the second branch says nothing of b alone: no filter on b is implied
    assert _factored("(a.x = 1 AND b.y = 2) OR (a.x = 3 AND a.k = b.k)") == [
        "(a.x = 1 AND b.y = 2) OR (a.x = 3 AND a.k = b.k)",
        "(a.x = 1) OR (a.x = 3)",
    ]


def test_one_alias_or_is_left_whole() -> None:
    assert _factored("a.x = 1 OR (a.x = 2 AND a.y = 3)") == ["a.x = 1 OR (a.x = 2 AND a.y = 3)"]


def test_volatile_and_subquery_conditions_are_left_alone() -> None:
    for where in (
        "(a.k = b.k AND random() < 0.5) OR (a.k = b.k AND b.y = 1)",
        "(a.k = b.k AND a.x IN (SELECT 1)) OR (a.k = b.k AND b.y = 1)",
    ):
        cond = sqlglot.parse_one(f"SELECT 1 FROM a, b WHERE {where}").args["where"].this
        assert factor_or(cond) == [cond]


def test_not_an_or() -> None:
    cond = sqlglot.parse_one("SELECT 1 FROM a WHERE a.x = 1").args["where"].this
    assert factor_or(cond) == [cond]
    assert isinstance(cond, exp.EQ)
