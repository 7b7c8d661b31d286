"""Arrow types back from their text: the scheduler lists a table's columns as ``str(type)``.

``TableInfo.columns`` holds ``(name, "decimal128(15, 2)")`` pairs; the ibis backend and
the SQLAlchemy dialect need the types themselves. ``parse`` reads the flat types a
Parquet file's columns have and answers ``None`` for anything else (nested types), so
its caller can ask the cluster for the schema instead (a ``LIMIT 0`` query).

>>> parse("decimal128(15, 2)")
Decimal128Type(decimal128(15, 2))
>>> parse("timestamp[us, tz=UTC]")
TimestampType(timestamp[us, tz=UTC])
"""

from __future__ import annotations

import re

import pyarrow as pa

_SIMPLE: dict[str, pa.DataType] = {
    "null": pa.null(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "halffloat": pa.float16(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "large_string": pa.large_string(),
    "string_view": pa.string_view(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
    "binary_view": pa.binary_view(),
    "date32[day]": pa.date32(),
    "date64[ms]": pa.date64(),
    "time32[s]": pa.time32("s"),
    "time32[ms]": pa.time32("ms"),
    "time64[us]": pa.time64("us"),
    "time64[ns]": pa.time64("ns"),
}

_DECIMAL = re.compile(r"decimal(32|64|128|256)\((\d+), (-?\d+)\)")
_TIMESTAMP = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=(.+))?\]")
_DURATION = re.compile(r"duration\[(s|ms|us|ns)\]")
_FIXED_BINARY = re.compile(r"fixed_size_binary\[(\d+)\]")

# pyarrow 18 (what Superset's environment holds) has no decimal32 or decimal64: a column
# of those reads as ``None`` there, and its caller asks the cluster for the schema.
_DECIMALS = {
    bits: getattr(pa, f"decimal{bits}")
    for bits in ("32", "64", "128", "256")
    if hasattr(pa, f"decimal{bits}")
}


def parse(text: str) -> pa.DataType | None:
    """The Arrow type ``str(type)`` gave ``text``, or ``None`` for one not read here."""
    text = text.strip()
    if text in _SIMPLE:
        return _SIMPLE[text]
    if (m := _DECIMAL.fullmatch(text)) and m[1] in _DECIMALS:
        return _DECIMALS[m[1]](int(m[2]), int(m[3]))
    if m := _TIMESTAMP.fullmatch(text):
        return pa.timestamp(m[1], tz=m[2])
    if m := _DURATION.fullmatch(text):
        return pa.duration(m[1])
    if m := _FIXED_BINARY.fullmatch(text):
        return pa.binary(int(m[1]))
    return None


def parse_schema(columns: tuple[tuple[str, str], ...]) -> pa.Schema | None:
    """A schema from ``(name, type text)`` pairs; ``None`` if any type is not read here."""
    fields = []
    for name, text in columns:
        arrow_type = parse(text)
        if arrow_type is None:
            return None
        fields.append(pa.field(name, arrow_type))
    return pa.schema(fields)
