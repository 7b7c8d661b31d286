"""``mangonel://`` URLs and Arrow type text: the pure parts under the ibis backend and the
SQLAlchemy dialect."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mangonel.client import arrow_types
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
