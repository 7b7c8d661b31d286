"""The result comparator must catch what it claims to catch, and nothing more."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import (
    TPCH_ORDER_BY,
    TPCH_TABLES,
    assert_same_result,
    compare_results,
    explain_stage_count,
    tpch_query,
)


def table(**columns: list[object]) -> pa.Table:
    return pa.table(columns)


BASE = pa.table(
    {
        "k": pa.array([1, 2, 2, None], pa.int64()),
        "s": pa.array(["a", "ü", "b", None], pa.string()),
        "f": pa.array([1.5, 0.1 + 0.2, None, 3.0], pa.float64()),
        "d": pa.array(
            [Decimal("1.10"), None, Decimal("2.00"), Decimal("3.33")], pa.decimal128(15, 2)
        ),
        "day": pa.array([dt.date(2020, 1, 1), None, dt.date(1998, 12, 1), dt.date(2000, 2, 29)]),
    }
)


def reordered(t: pa.Table, order: list[int]) -> pa.Table:
    return t.take(pa.array(order))


def with_column(t: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return t.set_column(t.column_names.index(name), name, values)


def test_identical_tables_match_in_any_mode() -> None:
    assert_same_result(BASE, BASE, ordered=True)
    assert_same_result(BASE, BASE, ordered=False)
    assert_same_result(BASE, BASE, ordered=True, order_by=["k"])


def test_float_difference_beyond_tolerance_is_caught() -> None:
    changed = with_column(BASE, "f", pa.array([1.5, 0.3 + 1e-6, None, 3.0]))
    message = compare_results(changed, BASE, ordered=True)
    assert message is not None and "row 1" in message and "1 of 4 rows differ" in message
    with pytest.raises(AssertionError, match="rows differ"):
        assert_same_result(changed, BASE, ordered=False)


def test_float_difference_within_tolerance_matches() -> None:
    # 0.1 + 0.2 != 0.3 in binary floating point; summation order differs between engines.
    changed = with_column(BASE, "f", pa.array([1.5, 0.3, None, 3.0 * (1 + 1e-12)]))
    assert_same_result(changed, BASE, ordered=True)


def test_row_order_difference_is_caught_when_ordered() -> None:
    swapped = reordered(BASE, [1, 0, 2, 3])
    message = compare_results(swapped, BASE, ordered=True)
    assert message is not None and "row 0" in message and "row 1" in message
    # ... and accepted when the query has no ORDER BY.
    assert_same_result(swapped, BASE, ordered=False)


def test_null_versus_value_is_caught() -> None:
    changed = with_column(BASE, "s", pa.array(["a", "ü", "b", "x"]))
    with pytest.raises(AssertionError, match="row 3"):
        assert_same_result(changed, BASE, ordered=True)
    with pytest.raises(AssertionError, match="rows differ"):
        assert_same_result(changed, BASE, ordered=False)
    zero = with_column(BASE, "f", pa.array([1.5, 0.1 + 0.2, 0.0, 3.0]))
    with pytest.raises(AssertionError, match="row 2"):
        assert_same_result(zero, BASE, ordered=True)


def test_decimals_are_exact() -> None:
    changed = with_column(
        BASE,
        "d",
        pa.array([Decimal("1.11"), None, Decimal("2.00"), Decimal("3.33")], pa.decimal128(15, 2)),
    )
    with pytest.raises(AssertionError, match="row 0"):
        assert_same_result(changed, BASE, ordered=True)
    # Same values at another precision and scale are the same answer.
    wider = with_column(BASE, "d", BASE.column("d").cast(pa.decimal128(38, 4)))
    assert_same_result(wider, BASE, ordered=True)


def test_dates_and_strings_are_exact() -> None:
    changed = with_column(
        BASE,
        "day",
        pa.array([dt.date(2020, 1, 2), None, dt.date(1998, 12, 1), dt.date(2000, 2, 29)]),
    )
    with pytest.raises(AssertionError, match="row 0"):
        assert_same_result(changed, BASE, ordered=True)
    accent = with_column(BASE, "s", pa.array(["a", "u", "b", None]))
    with pytest.raises(AssertionError, match="row 1"):
        assert_same_result(accent, BASE, ordered=True)


def test_string_encodings_and_integer_widths_do_not_matter() -> None:
    other = with_column(BASE, "s", BASE.column("s").cast(pa.large_string()))
    other = with_column(other, "k", BASE.column("k").cast(pa.int32()))
    assert_same_result(other, BASE, ordered=True)
    view = with_column(BASE, "s", BASE.column("s").cast(pa.string_view()))
    assert_same_result(view, BASE, ordered=True)


def test_shape_names_and_type_kinds_are_checked() -> None:
    assert "row count" in (compare_results(BASE.slice(0, 3), BASE, ordered=False) or "")
    assert "column count" in (compare_results(BASE.drop_columns(["f"]), BASE, ordered=False) or "")
    renamed = BASE.rename_columns(["k", "s", "g", "d", "day"])
    assert "column names" in (compare_results(renamed, BASE, ordered=False) or "")
    assert_same_result(renamed, BASE, ordered=False, check_names=False)
    # COUNT(*) coming back as DECIMAL(38,0) (a SUM of partial counts) is a different answer type.
    as_decimal = with_column(BASE, "k", BASE.column("k").cast(pa.decimal128(38, 0)))
    assert "integer" in (compare_results(as_decimal, BASE, ordered=True) or "")
    as_float = with_column(BASE, "d", BASE.column("d").cast(pa.float64()))
    assert "decimal" in (compare_results(as_float, BASE, ordered=True) or "")


def test_multiset_comparison_counts_duplicates() -> None:
    t = table(x=[1, 1, 2])
    with pytest.raises(AssertionError):
        assert_same_result(table(x=[1, 2, 2]), t, ordered=False)
    assert_same_result(table(x=[2, 1, 1]), t, ordered=False)


def test_nulls_and_nans_sort_and_match_in_multisets() -> None:
    nan = float("nan")
    expected = table(x=[None, 1.0, nan, None], y=["a", None, "c", "d"])
    actual = table(x=[nan, None, None, 1.0], y=["c", "d", "a", None])
    assert_same_result(actual, expected, ordered=False)
    with pytest.raises(AssertionError):
        assert_same_result(
            table(x=[nan, None, None, 1.0], y=["c", "a", "a", None]), expected, ordered=False
        )


def test_ties_may_reorder_only_within_equal_sort_keys() -> None:
    expected = table(g=[3, 2, 2, 1], v=["a", "b", "c", "d"])
    tie_swapped = table(g=[3, 2, 2, 1], v=["a", "c", "b", "d"])
    assert_same_result(tie_swapped, expected, ordered=True, order_by=["g"])
    # Without the tie allowance, the same swap is a difference.
    with pytest.raises(AssertionError):
        assert_same_result(tie_swapped, expected, ordered=True)
    # Rows moved across different sort keys are caught, even with the same multiset of keys.
    across = table(g=[3, 2, 2, 1], v=["b", "a", "c", "d"])
    with pytest.raises(AssertionError, match="rows with equal keys"):
        assert_same_result(across, expected, ordered=True, order_by=["g"])
    # A wrong order of the sort keys themselves is caught.
    keys_wrong = table(g=[2, 3, 2, 1], v=["b", "a", "c", "d"])
    with pytest.raises(AssertionError, match="sort keys"):
        assert_same_result(keys_wrong, expected, ordered=True, order_by=["g"])


def test_empty_results_match() -> None:
    empty = BASE.slice(0, 0)
    assert_same_result(empty, empty, ordered=False)
    assert_same_result(empty, empty, ordered=True, order_by=["k"])


def test_unknown_order_by_column_is_a_test_bug() -> None:
    with pytest.raises(ValueError, match="not output columns"):
        compare_results(BASE, BASE, ordered=True, order_by=["nope"])


def test_tpch_queries_ship_as_package_data() -> None:
    for n in range(1, 23):
        text = tpch_query(n).lower()
        assert "select" in text and f"q{n}" in text.replace(" ", "").replace("tpc-hq", "q")
        for column in TPCH_ORDER_BY[n]:
            assert column in text, (n, column)


def test_tpch_fixture_writes_all_tables(tpch_dir: Path) -> None:
    for name in TPCH_TABLES:
        meta = pq.ParquetFile(tpch_dir / f"{name}.parquet").metadata
        assert meta.num_rows > 0
    assert pq.ParquetFile(tpch_dir / "lineitem.parquet").metadata.num_row_groups > 1


def test_explain_stage_count_reads_total_and_headers() -> None:
    text = (
        "Distributed plan: 2 stages; result columns: x\n\n"
        "Stage 1: scan\n  reads stage 1\n\nStage 2 (final): agg\n"
    )
    assert explain_stage_count(text) == 2
    assert explain_stage_count("Stage 1: scan\nStage 2: join\nStage 3: sort\n") == 3
    with pytest.raises(ValueError, match="states 3 stages"):
        explain_stage_count("Distributed plan: 3 stages\nStage 1: scan\n")
