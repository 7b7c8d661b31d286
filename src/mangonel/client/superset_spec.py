"""Superset's engine spec for ``mangonel://`` databases: its name, time grains, literals.

Superset loads it by its entry point (group ``superset.db_engine_specs``), so it is
imported only inside a Superset installation, never by mangonel itself. Without it
Superset would still connect through the SQLAlchemy dialect, with its generic spec:
no time grains for time-series charts and no name in the "connect a database" list.

mangonel reads DuckDB's SQL, so a time grain is DuckDB's ``DATE_TRUNC`` and a
datetime literal DuckDB's ``DATE '...'`` / ``TIMESTAMP '...'``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import types
from superset.constants import TimeGrain
from superset.db_engine_specs.base import BaseEngineSpec


class MangonelEngineSpec(BaseEngineSpec):  # type: ignore[misc]
    """A mangonel cluster, reached with ``mangonel://[user[:password]@]host:port``."""

    engine = "mangonel"
    engine_name = "mangonel"
    default_driver = "mangonel"
    sqlalchemy_uri_placeholder = "mangonel://user:password@host:50050"
    # Tables are registered files (``mangonel register``): Superset cannot create one
    # from an uploaded CSV through a connection that runs only queries.
    supports_file_upload = False

    _time_grain_expressions = {
        None: "{col}",
        TimeGrain.SECOND: "DATE_TRUNC('second', {col})",
        TimeGrain.MINUTE: "DATE_TRUNC('minute', {col})",
        TimeGrain.HOUR: "DATE_TRUNC('hour', {col})",
        TimeGrain.DAY: "DATE_TRUNC('day', {col})",
        TimeGrain.WEEK: "DATE_TRUNC('week', {col})",
        TimeGrain.MONTH: "DATE_TRUNC('month', {col})",
        TimeGrain.QUARTER: "DATE_TRUNC('quarter', {col})",
        TimeGrain.YEAR: "DATE_TRUNC('year', {col})",
    }

    @classmethod
    def epoch_to_dttm(cls) -> str:
        return "to_timestamp({col})"

    @classmethod
    def convert_dttm(
        cls, target_type: str, dttm: datetime, db_extra: dict[str, Any] | None = None
    ) -> str | None:
        sqla_type = cls.get_sqla_column_type(target_type)
        if isinstance(sqla_type, types.Date) and not isinstance(sqla_type, types.DateTime):
            return f"DATE '{dttm.date().isoformat()}'"
        if isinstance(sqla_type, types.DateTime):
            return f"TIMESTAMP '{dttm.isoformat(sep=' ', timespec='microseconds')}'"
        return None
