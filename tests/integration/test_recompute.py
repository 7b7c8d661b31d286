"""Cheap one-task producers computed again by each task that reads them, on a real cluster.

``PlannerConfig.recompute_bytes`` (``--recompute-bytes``): a producer of one task
that reads only tables is computed by each task that reads it instead of once in a
stage of its own, where the copies beyond the first scan little: a side
broadcast into the several tasks of a scan that reads no other stage (q17's
filtered ``part``), and a shared node of one task that scans no table (q15's
``revenue``, the final aggregate of the partial sums). q20's filtered ``part``,
which its line items' tasks computed with a copy of ``partsupp``, now filters them
by itself, from a stage of its own that the final task reads too: a subquery that
filters a scan of several tasks is not computed again. A cluster of two executors
runs each query, with scans of at most 250 000 rows (``lineitem`` is three tasks
at SF 0.1), exchanges sized from the data as by default (one partition here:
the four of the other modules would make q15's ``revenue`` four tasks, which no
reader computes again), and no table scanned by each task for its size alone
(``--inline-scan-bytes 0``: at SF 0.1 every side here would be, whatever this
rule says; with ``--recompute-bytes 0`` the q17 and q15 tests fail). EXPLAIN shows
the shape (several tasks that scan the producer's tables themselves, no stage of
the producer) and every answer is checked against single-process DuckDB. A
producer that draws random values is not computed again: each copy would draw
its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, explain_stage_count, tpch_query

import mangonel


@pytest.fixture(scope="module")
def cluster(module_dir: Path) -> Iterator[Any]:
    """Two executors, scans of 250 000 rows, exchanges sized from the estimates,
    no table scanned inline for its size alone."""
    with mangonel.LocalCluster(
        executors=2,
        work_dir=str(module_dir / "cluster"),
        # Small tables are not scanned by each task for their size alone
        # (``--inline-scan-bytes``): at SF 0.1 they all would be.
        scheduler_args=("--split-rows", "250000", "--inline-scan-bytes", "0"),
    ) as running:
        yield running


_STAGE = re.compile(r"^Stage \d+.*?(?=^Stage \d+|\Z)", re.M | re.S)


def _stages(text: str) -> list[str]:
    """The EXPLAIN text of each stage, its header first."""
    return _STAGE.findall(text)


def _tasks(stage: str) -> int:
    found = re.search(r"— (\d+) task\(s\)", stage.splitlines()[0])
    assert found is not None, stage
    return int(found.group(1))


def _lineitem_stage(text: str, label: str) -> str:
    """The one stage that scans lineitem (its own scan) and whose header has ``label``."""
    (stage,) = [
        s for s in _stages(text) if "reads  table lineitem (" in s and label in s.splitlines()[0]
    ]
    return stage


def _answer(number: int, session: Any, duckdb_ref: duckdb.DuckDBPyConnection) -> None:
    sql = tpch_query(number)
    expected = duckdb_ref.sql(sql).to_arrow_table()
    assert expected.num_rows > 0  # an empty reference would prove nothing
    order_by = TPCH_ORDER_BY[number]
    actual = session.sql(sql).to_arrow()
    assert_same_result(actual, expected, ordered=bool(order_by), order_by=order_by)


def test_q20_filters_each_lineitem_task_by_the_parts_stage_the_final_task_reads_too(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    text = session.explain(tpch_query(20))
    # The line items are reduced by the parts of one name pattern (the subquery)
    # on their part key, with no copy of partsupp (``reductions._key_in``): the
    # subquery's one stage, which the final task reads too, then lineitem's tasks,
    # then the final task.
    lineitem = _lineitem_stage(text, "scan lineitem (filtered) → partial aggregate")
    assert _tasks(lineitem) > 1, text
    assert "table partsupp (" not in lineitem and "table part (" not in lineitem, text
    (subquery,) = [s for s in _stages(text) if "subquery —" in s.splitlines()[0]]
    assert "reads  stage" not in subquery, text
    number = subquery.split()[1].rstrip(":")
    for reader in (lineitem, _stages(text)[-1]):
        assert f"reads  stage {number} as __sq" in reader, text
    assert explain_stage_count(text) == 3, text
    _answer(20, session, duckdb_ref)


def test_q17_scans_the_filtered_parts_in_each_lineitem_task(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    text = session.explain(tpch_query(17))
    # Both reads of the filtered parts (the reduction of the aggregate's input and
    # the join) are in the lineitem tasks: no stage scans part alone. The reduced
    # line items (a thousandth) are aggregated in one task, whose few rows the
    # join's lineitem tasks read whole: the only stage either lineitem stage reads.
    assert not [s for s in _stages(text) if "reads  table part (" in s.splitlines()[1]], text
    lineitems = [s for s in _stages(text) if "reads  table lineitem (" in s]
    assert len(lineitems) == 2, text
    for stage in lineitems:
        assert _tasks(stage) > 1 and "table part (" in stage, stage
    assert "reads  stage" not in lineitems[0], text
    (aggregate,) = [s for s in _stages(text) if s.splitlines()[0].endswith("aggregate — 1 task(s)")]
    assert "reads  table" not in aggregate, text
    read = [line for line in lineitems[1].splitlines() if "reads  stage" in line]
    assert len(read) == 1, text
    assert aggregate.startswith(f"Stage {read[0].split()[2]}: "), text
    _answer(17, session, duckdb_ref)


def test_q15_final_task_computes_revenue_for_the_join_and_its_maximum(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    text = session.explain(tpch_query(15))
    # The partial aggregate of lineitem (several tasks), then the final task,
    # which reads its partial sums and aggregates them for both readers.
    stages = _stages(text)
    assert len(stages) == 2 and explain_stage_count(text) == 2, text
    assert "reads  table lineitem (" in stages[0] and _tasks(stages[0]) > 1, text
    assert "(final)" in stages[1] and "reads  stage 1 " in stages[1], text
    _answer(15, session, duckdb_ref)


def test_a_random_sample_is_drawn_once_not_by_each_reader(
    session: Any, duckdb_ref: duckdb.DuckDBPyConnection
) -> None:
    # Cheap to compute again, but each copy would draw its own ten parts: the
    # sample is a stage of its own, which every lineitem task reads.
    sql = (
        "SELECT l_orderkey, l_linenumber, l_partkey FROM lineitem JOIN (SELECT p_partkey "
        "FROM part WHERE p_size = 3 ORDER BY random() LIMIT 10) p ON l_partkey = p.p_partkey"
    )
    text = session.explain(sql)
    lineitem = _lineitem_stage(text, "inner join")
    assert _tasks(lineitem) > 1 and "table part (" not in lineitem, text
    assert "reads  stage" in lineitem, text
    for _ in range(3):
        actual = session.sql(sql).to_arrow()
        keys = sorted(set(actual.column("l_partkey").to_pylist()))
        assert 0 < len(keys) <= 10, keys
        # Every line item of the parts drawn, each once.
        expected = duckdb_ref.sql(
            "SELECT l_orderkey, l_linenumber, l_partkey FROM lineitem "
            f"WHERE l_partkey IN {(*keys, -1)} "
            "AND l_partkey IN (SELECT p_partkey FROM part WHERE p_size = 3)"
        ).to_arrow_table()
        assert_same_result(actual, expected, ordered=False)
