"""The pure parts under the ibis backend and the SQLAlchemy dialect: ``mangonel://`` URLs,
Arrow type text, and the DB-API driver's parameters written in as literals."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from mangonel.client import arrow_types
from mangonel.client.dbapi import NotSupportedError, ProgrammingError, bind, literal
from mangonel.client.url import ConnectOptionError, ConnectOptions, parse_url


def test_url_gives_address_credentials_and_options() -> None:
    options = parse_url(
        "mangonel://ann:s%40cret@Sched-A:50050,sched-b:50050?tls_ca=/etc/ca.pem&timeout_s=5"
    )
    assert options == ConnectOptions(
        address="Sched-A:50050,sched-b:50050",
        user="ann",
        password="s@cret",
        tls_ca="/etc/ca.pem",
        timeout_s=5.0,
    )
    assert options.security is not None and options.security.tls_ca == "/etc/ca.pem"


def test_keyword_arguments_win_over_the_url() -> None:
    options = parse_url("mangonel://ann:old@h:1?query_timeout_s=9", {"password": "new"})
    assert (options.user, options.password, options.query_timeout_s) == ("ann", "new", 9.0)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgres://h:1", "not a mangonel URL"),
        ("mangonel://h:1?tls=1", "unknown mangonel connect option"),
        ("mangonel://h:1?timeout_s=soon", "is not a number of seconds"),
        ("mangonel://h:1?tls_ca=a&tls_dir=b", "tls_ca or tls_dir, not both"),
    ],
)
def test_bad_urls_say_what_to_write(url: str, message: str) -> None:
    with pytest.raises(ConnectOptionError, match=message):
        parse_url(url)


@pytest.mark.parametrize(
    "arrow_type",
    [
        pa.int32(),
        pa.string_view(),
        pa.large_string(),
        pa.date32(),
        pa.decimal128(15, 2),
        pa.decimal256(40, 10),
        pa.timestamp("us"),
        pa.timestamp("ns", tz="Europe/Paris"),
        pa.time64("us"),
        pa.duration("ms"),
        pa.binary(16),
        pa.float16(),
    ],
    ids=str,
)
def test_arrow_type_text_reads_back(arrow_type: pa.DataType) -> None:
    assert arrow_types.parse(str(arrow_type)) == arrow_type


def test_a_nested_type_is_left_to_the_cluster() -> None:
    nested = pa.list_(pa.int64())
    assert arrow_types.parse(str(nested)) is None
    assert arrow_types.parse_schema((("a", "int64"), ("b", str(nested)))) is None
    assert arrow_types.parse_schema((("a", "int64"),)) == pa.schema([("a", pa.int64())])


def test_parameters_go_where_the_placeholders_are_outside_literals_and_comments() -> None:
    text = "SELECT '?' AS \"?\", x FROM t /* ? */ WHERE a = ? AND b IN ? -- ?\nAND c = ?"
    assert bind(text, ["it's", (1, 2.5), None]) == (
        "SELECT '?' AS \"?\", x FROM t /* ? */ WHERE a = 'it''s' AND b IN (1, 2.5) -- ?\n"
        "AND c = NULL"
    )
    # SQL written by hand goes through as written: a % is no placeholder.
    assert bind("SELECT 1 WHERE n LIKE '%A%'", {}) == "SELECT 1 WHERE n LIKE '%A%'"


@pytest.mark.parametrize(
    ("value", "sql"),
    [
        (True, "TRUE"),
        (7, "7"),
        (0.5, "0.5"),
        (float("nan"), "CAST('nan' AS DOUBLE)"),
        (decimal.Decimal("12.50"), "12.50"),
        (dt.date(1995, 3, 15), "DATE '1995-03-15'"),
        (dt.datetime(1995, 3, 15, 1, 2, 3), "TIMESTAMP '1995-03-15 01:02:03'"),
        (b"\x00\xff", "'\\x00\\xff'::BLOB"),
    ],
    ids=repr,
)
def test_literals(value: object, sql: str) -> None:
    assert literal(value) == sql


def test_parameters_that_do_not_fit_say_how_to_write_them() -> None:
    with pytest.raises(ProgrammingError, match="1 \\? placeholder\\(s\\) and 2 parameter"):
        bind("SELECT ?", [1, 2])
    with pytest.raises(ProgrammingError, match="qmark"):
        bind("SELECT ?", {"x": 1})
    with pytest.raises(NotSupportedError, match="no SQL literal"):
        literal(object())
