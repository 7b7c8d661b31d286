"""DuckDB's own types across a shuffle, Arrow's own types in a query's result.

Arrow has no type for some of DuckDB's: a ``HUGEINT`` (what a SUM of integers
is) is exported as ``DECIMAL(38, 0)``, a ``UUID`` as a string. A stage's rows
read back in another task would then be of those types, not DuckDB's: the
final SUM over partial sums typed ``DECIMAL(38, 0)``, so ``sum(x) // 2`` a
DOUBLE where DuckDB's is a HUGEINT. Every slot's database therefore exports
losslessly (``arrow_lossless_conversion``, set by ``databases.lock_down``:
extension types such as ``arrow.opaque`` naming DuckDB's type, which DuckDB
reads back as that type), and a query's result, the one output a client reads,
goes once through a plain DuckDB that exports it as DuckDB does by default.
Only a result that holds such a type pays that pass (about 1 ms for a small
result; a BOOLEAN is one too, exported losslessly as ``arrow.bool8``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa

from mangonel.executor.databases import open_connection
from mangonel.executor.memory import SlotBudget

__all__ = ["PlainTypes"]

_BATCH_ROWS = 131_072


def _has_extension(t: pa.DataType) -> bool:
    if isinstance(t, pa.BaseExtensionType):
        return True
    return any(_has_extension(t.field(i).type) for i in range(t.num_fields))


class PlainTypes:
    """A slot's plain DuckDB, opened the first time a result needs it (about
    15 ms) and kept: one task at a time, as the slot runs them.

    Args:
        spill_dir: the slot's spill directory (the database spills nothing: it
            passes batches through).
        budget: the slot's budget, the database's memory limit.
    """

    def __init__(self, spill_dir: str, budget: SlotBudget | None) -> None:
        self._spill_dir = spill_dir
        self._budget = budget
        self._con: duckdb.DuckDBPyConnection | None = None

    @contextmanager
    def of(self, stream: pa.RecordBatchReader) -> Iterator[pa.RecordBatchReader]:
        """``stream`` with DuckDB's default Arrow types in place of its lossless
        ones (the same rows in the same order); ``stream`` itself when it holds none."""
        if not any(_has_extension(f.type) for f in stream.schema):
            yield stream
            return
        if self._con is None:
            # One thread keeps the rows' order (a result's ORDER BY); it reads
            # nothing but the stream and may change no setting.
            con = open_connection(self._spill_dir, self._budget, 1)
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            self._con = con
        with self._con.from_arrow(stream).to_arrow_reader(_BATCH_ROWS) as plain:
            yield plain

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
