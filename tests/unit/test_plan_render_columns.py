"""The columns a fragment's expressions are rewritten to (``fragment._Columns``)."""

from __future__ import annotations

from sqlglot import exp

from mangonel.plan.fragment import _Columns, rewrite, sql
from mangonel.plan.logical import Scan


def test_a_ref_becomes_a_column_of_the_derived_table_that_outputs_it() -> None:
    left, right = Scan("a", "a", ["x", "k"]), Scan("b", "b", ["y", "k"])
    cols = _Columns((left, "l"), (right, "r"))
    assert sql(cols[("a", "x")]) == '"l"."a.x"'
    assert sql(cols[("b", "y")]) == '"r"."b.y"'
    assert cols.get(("c", "z")) is None
    assert ("a", "k") in cols and ("c", "z") not in cols
    assert len(cols) == 4 and set(cols) == {("a", "x"), ("a", "k"), ("b", "y"), ("b", "k")}


def test_a_ref_both_children_output_is_the_last_ones_as_a_merged_dict_gives() -> None:
    # A semi join's right side may output a ref its left side outputs too.
    left, right = Scan("a", "a", ["k"]), Scan("a", "a", ["k", "v"])
    cols = _Columns((left, "l"), (right, "r"))
    merged = {
        **{r: exp.column(f"{r[0]}.{r[1]}", table="l", quoted=True) for r in left.outputs()},
        **{r: exp.column(f"{r[0]}.{r[1]}", table="r", quoted=True) for r in right.outputs()},
    }
    assert sql(cols[("a", "k")]) == sql(merged[("a", "k")]) == '"r"."a.k"'
    assert len(cols) == len(merged) == 2


def test_rewrite_replaces_only_the_columns_the_mapping_holds() -> None:
    e = exp.and_(
        exp.column("x", table="a").eq(exp.column("y", table="b")),
        exp.column("z", table="c").eq(1),
    )
    cols = _Columns((Scan("a", "a", ["x"]), "l"), (Scan("b", "b", ["y"]), "r"))
    assert sql(rewrite(e, cols)) == '"l"."a.x" = "r"."b.y" AND c.z = 1'
    assert sql(e) == "a.x = b.y AND c.z = 1"  # the original is left as it was
