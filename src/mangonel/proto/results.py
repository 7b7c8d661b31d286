"""Tickets of result partitions, and the view a Flight SQL client reads them through.

The Python client reads a job's result partitions from the executors' Flight
servers with the ticket ``partition_ticket`` makes (the file's path today; the
executor checks it names a file it wrote). A Flight SQL client reads the same
files, but it needs them as the query's result: the user's column names, no
helper columns after them (a sort key the query does not select), one schema
for every partition with every field nullable (the ADBC driver compares each
endpoint's schema with the ``FlightInfo``'s, nullability included). A
``ResultView`` wraps the partition's ticket with that schema; the executor
(``executor.flight``) and the scheduler's Flight SQL server (which serves the
same view when the client cannot reach the executor) apply it to the file's
batches with ``ResultView.apply``.

A view ticket is ``MAGIC`` followed by JSON. The partition ticket inside is
checked exactly as if it came alone, so a view grants nothing the plain
ticket would not; the schema only renames, drops trailing columns and casts.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import pyarrow as pa

from mangonel.task import PartitionLocation

MAGIC = b"mangonel-result-view:"


def carried_file(data: bytes, rows: int) -> pa.Table | None:
    """A small result file that came along (with a job's last status, or in the
    scheduler's memory: ``JobWatch.result_files``) as a table, or ``None`` when it
    is damaged or holds other than its ``rows``: read it over Flight then. Test it
    with ``is None``: a table of no row is falsy."""
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError):
        return None  # damaged on the way: the executor still has the file
    return table if table.num_rows == rows else None


def partition_ticket(loc: PartitionLocation) -> bytes:
    """The ticket that reads result partition ``loc`` from its executor's Flight server.

    The one place a result ticket is read: the signed ticket when the scheduler
    signed the location (``scheduler.tickets``), else the file's path.
    """
    return (loc.ticket or loc.path).encode()


@dataclass(frozen=True)
class ResultView:
    """One result partition as the query's result, for a Flight SQL client.

    Attributes:
        ticket: The partition's own ticket (``partition_ticket``).
        job: The job the partition belongs to.
        partition: Its index in the job's result.
        schema: What the client receives: the user's column names, every field
            nullable, no metadata.
    """

    ticket: bytes
    job: str
    partition: int
    schema: pa.Schema

    def encode(self) -> bytes:
        body = {
            "ticket": base64.b64encode(self.ticket).decode(),
            "job": self.job,
            "partition": self.partition,
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
        }
        return MAGIC + json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ResultView | None:
        """The view a ticket holds; ``None`` when it is not a view ticket.

        Raises:
            ValueError: it starts like a view ticket but is not a valid one.
        """
        if not raw.startswith(MAGIC):
            return None
        try:
            body = json.loads(raw[len(MAGIC) :])
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(body["schema"])))
            return cls(
                ticket=base64.b64decode(body["ticket"]),
                job=str(body["job"]),
                partition=int(body["partition"]),
                schema=schema,
            )
        except (ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            raise ValueError(f"malformed result ticket: {exc}") from None

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` as the view's schema: its first columns, renamed, cast where the
        types differ (a partition written as ``string_view`` read as ``string``)."""
        if batch.num_columns < len(self.schema):
            raise ValueError(
                f"result partition {self.partition} of job {self.job} has "
                f"{batch.num_columns} columns, the result {len(self.schema)}"
            )
        columns = [
            col if col.type == field.type else col.cast(field.type)
            for col, field in zip(batch.columns, self.schema, strict=False)
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def result_schema(file_schema: pa.Schema, columns: tuple[str, ...]) -> pa.Schema:
    """The schema a client gets for a result whose partition files have ``file_schema``:
    the first ``len(columns)`` fields under the user's names, nullable, views as
    plain strings and binaries (what every Flight SQL client reads)."""
    fields = []
    for name, field in zip(columns, file_schema, strict=False):
        kind = field.type
        if pa.types.is_string_view(kind) or pa.types.is_large_string(kind):
            kind = pa.string()
        elif pa.types.is_binary_view(kind) or pa.types.is_large_binary(kind):
            kind = pa.binary()
        fields.append(pa.field(name, kind, nullable=True))
    return pa.schema(fields)
