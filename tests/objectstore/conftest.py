"""Tables in object storage: a real S3 server (moto's) per test module.

* ``s3``: an ``S3TestServer`` on a free port of 127.0.0.1 that checks
  credentials; this process's environment holds the allowed ones
  (``AWS_ACCESS_KEY_ID``, ...) for the module, so the cluster processes a test
  starts inherit them. The endpoint is not in the environment: tests give it as
  an option (``StorageOptions(endpoint_url=...)``, ``--s3-endpoint-url``).
* ``s3_tpch``: TPC-H SF 0.1 uploaded to ``s3://tpch/sf0.1/``: one object per
  table, except ``lineitem``, three objects under ``lineitem/`` (a prefix).
* ``s3_tpch_layouts``: TPC-H SF 0.1 in ``s3://tpch-layouts/`` registered three
  ways, each table the same way: ``object`` (one object per table), ``prefix``
  and ``glob`` (each table's row groups split over up to three objects under a
  prefix of its own, which the glob matches).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from s3server import S3TestServer

from mangonel.storage import StorageOptions

BUCKET = "tpch"
PREFIX = "sf0.1"
LINEITEM_PARTS = 3


@pytest.fixture(scope="module")
def s3() -> Iterator[S3TestServer]:
    server = S3TestServer().start()
    try:
        server.reset()
        server.enable_auth()
        with pytest.MonkeyPatch.context() as mp:
            for key, value in server.env().items():
                mp.setenv(key, value)
            for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
                mp.delenv(key, raising=False)
            yield server
    finally:
        server.resume()
        server.reset()
        server.stop()


@pytest.fixture(scope="module")
def s3_options(s3: S3TestServer) -> StorageOptions:
    """Short timeouts and quick retries: a test of a store that is away ends soon."""
    return StorageOptions(
        endpoint_url=s3.url,
        connect_timeout_s=1.0,
        request_timeout_s=2.0,
        attempts=4,
        backoff_s=0.2,
    )


def split_parquet(source: Path, target_dir: Path, parts: int) -> list[Path]:
    """``source`` as ``parts`` files, each some of its consecutive row groups (a key
    range, as tpchgen writes them), row groups kept whole."""
    target_dir.mkdir(parents=True, exist_ok=True)
    parquet = pq.ParquetFile(source)
    groups = list(range(parquet.metadata.num_row_groups))
    if len(groups) < parts:
        raise ValueError(f"{source} has {len(groups)} row groups, fewer than {parts} parts")
    size = -(-len(groups) // parts)
    out = []
    for i in range(0, len(groups), size):
        path = target_dir / f"part-{i // size}.parquet"
        table = parquet.read_row_groups(groups[i : i + size])
        pq.write_table(table, path, row_group_size=parquet.metadata.row_group(i).num_rows)
        out.append(path)
    return out


@pytest.fixture(scope="module")
def s3_tpch(s3: S3TestServer, tpch_dir: Path, module_dir: Path) -> dict[str, str]:
    """TPC-H table name -> the s3:// location it is registered from."""
    client = s3.client()
    client.create_bucket(Bucket=BUCKET)
    locations: dict[str, str] = {}
    for source in sorted(tpch_dir.glob("*.parquet")):
        name = source.stem
        if name == "lineitem":
            for part in split_parquet(source, module_dir / "lineitem", LINEITEM_PARTS):
                client.upload_file(str(part), BUCKET, f"{PREFIX}/lineitem/{part.name}")
            locations[name] = f"s3://{BUCKET}/{PREFIX}/lineitem/"
        else:
            client.upload_file(str(source), BUCKET, f"{PREFIX}/{source.name}")
            locations[name] = f"s3://{BUCKET}/{PREFIX}/{source.name}"
    # One more way in: a glob that matches the customer table alone.
    locations["customer"] = f"s3://{BUCKET}/{PREFIX}/cust*.parquet"
    return locations


LAYOUTS_BUCKET = "tpch-layouts"


@pytest.fixture(scope="module")
def s3_tpch_layouts(
    s3: S3TestServer, tpch_dir: Path, module_dir: Path
) -> dict[str, dict[str, str]]:
    """Layout (``object``, ``prefix``, ``glob``) -> TPC-H table name -> its s3:// location."""
    client = s3.client()
    client.create_bucket(Bucket=LAYOUTS_BUCKET)
    layouts: dict[str, dict[str, str]] = {"object": {}, "prefix": {}, "glob": {}}
    for source in sorted(tpch_dir.glob("*.parquet")):
        name = source.stem
        client.upload_file(str(source), LAYOUTS_BUCKET, f"object/{source.name}")
        groups = pq.ParquetFile(source).metadata.num_row_groups
        for part in split_parquet(source, module_dir / "layouts" / name, min(groups, 3)):
            client.upload_file(str(part), LAYOUTS_BUCKET, f"parts/{name}/{part.name}")
        layouts["object"][name] = f"s3://{LAYOUTS_BUCKET}/object/{source.name}"
        layouts["prefix"][name] = f"s3://{LAYOUTS_BUCKET}/parts/{name}/"
        layouts["glob"][name] = f"s3://{LAYOUTS_BUCKET}/parts/{name}/part-*.parquet"
    return layouts
