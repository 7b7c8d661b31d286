"""The lab store's ranged GETs (``mangonel.testing.netstore``), in process.

The store's WSGI layer answers a plain ranged GET from the key's buffer, reading
the range only; its answer must be moto's own, byte for byte and header for
header (but the request id), and what moto does not send as a range (several
ranges, unparsable or unsatisfiable ones) must still be moto's answer.
"""

from __future__ import annotations

import os

import pytest
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.s3.models import FakeKey
from werkzeug.test import Client

from mangonel.testing.netstore import _Counting

BUCKET = "netstore-ranges"
KEY = "dir/object.parquet"
SIZE = 3_000_001
SIGNED = {  # as pyarrow's S3 client (the AWS C++ SDK) asks, but for the signature
    "Host": "10.0.0.5:9000",
    "Authorization": "AWS4-HMAC-SHA256 Credential=mangonel-lab/20261201/us-east-1/s3/"
    "aws4_request, SignedHeaders=host, Signature=0",
    "x-amz-checksum-mode": "enabled",
    "x-amz-content-sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "x-amz-api-version": "2006-03-01",
}


def _whole_object(key: FakeKey) -> bytes:
    raise AssertionError(f"read all of {key.name}")


def _headers(response: object) -> dict[str, str]:
    return {
        k.lower(): v
        for k, v in response.headers.items()  # type: ignore[attr-defined]
        if k.lower() != "x-amzn-requestid"
    }


@pytest.fixture(scope="module")
def store() -> tuple[_Counting, Client, Client, bytes]:
    moto = DomainDispatcherApplication(create_backend_app)
    counting = _Counting(moto)
    client = Client(counting)
    body = os.urandom(SIZE)
    assert client.put(f"/{BUCKET}", headers=SIGNED).status_code == 200
    assert client.put(f"/{BUCKET}/{KEY}", data=body, headers=SIGNED).status_code == 200
    return counting, client, Client(moto), body


@pytest.mark.parametrize(
    ("header", "begin", "end"),
    [
        ("bytes=10-19", 10, 19),
        ("bytes=0-0", 0, 0),
        ("bytes=2999000-", 2_999_000, SIZE - 1),
        ("bytes=-100", SIZE - 100, SIZE - 1),
        ("bytes=-99999999", 0, SIZE - 1),
        ("bytes=5-99999999", 5, SIZE - 1),
    ],
)
def test_a_range_is_read_from_the_key_and_answered_as_moto_does(
    store: tuple[_Counting, Client, Client, bytes],
    header: str,
    begin: int,
    end: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, ours, moto, body = store
    with monkeypatch.context() as patch:
        # Not moto's path, which reads and copies the whole object for any range.
        patch.setattr(FakeKey, "value", property(_whole_object))
        got = ours.get(f"/{BUCKET}/{KEY}", headers={**SIGNED, "Range": header})
    assert got.status_code == 206
    assert got.data == body[begin : end + 1]
    assert got.headers["Content-Range"] == f"bytes {begin}-{end}/{SIZE}"
    assert got.headers["Content-Length"] == str(end - begin + 1)
    want = moto.get(f"/{BUCKET}/{KEY}", headers={**SIGNED, "Range": header})
    assert (want.status_code, want.data) == (got.status_code, got.data)
    assert _headers(got) == _headers(want)


@pytest.mark.parametrize(
    "header", ["bytes=3000001-", "bytes=-0", "bytes=1-2,5-6", "bytes=abc", "bytes=9-3"]
)
def test_other_ranges_are_moto_s(
    store: tuple[_Counting, Client, Client, bytes], header: str
) -> None:
    _, ours, moto, _ = store
    got = ours.get(f"/{BUCKET}/{KEY}", headers={**SIGNED, "Range": header})
    want = moto.get(f"/{BUCKET}/{KEY}", headers={**SIGNED, "Range": header})
    assert got.status_code == want.status_code
    if got.status_code < 400:  # error bodies name a request id of their own
        assert got.data == want.data


def test_the_counters_count_the_range(store: tuple[_Counting, Client, Client, bytes]) -> None:
    counting, ours, _, _ = store
    with counting.lock:
        before = {a: list(c) for a, c in counting.counts.items()}
    ours.get(f"/{BUCKET}/{KEY}", headers={**SIGNED, "Range": "bytes=1000-1999"})
    after = counting.counts
    (address,) = [a for a in after if after[a] != before.get(a)]
    was = before.get(address, [0, 0])
    assert [after[address][0] - was[0], after[address][1] - was[1]] == [1, 1000]
