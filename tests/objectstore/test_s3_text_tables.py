"""CSV and JSON tables in object storage (moto's S3 server) on a real 2-executor cluster,
every answer checked against single-process DuckDB reading the same files locally.

``lineitem`` is two CSV objects under a prefix, each cut by byte ranges into chunks
that several tasks read with ranged GETs; ``orders`` one JSON object; ``customer`` a
gzip CSV object, read whole. A bad row names the object and its line.
"""

from __future__ import annotations

import gzip
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, assert_same_result, tpch_query
from s3server import S3TestServer

from mangonel.errors import JobFailedError, QueryError
from mangonel.storage import StorageOptions

BUCKET = "text"
SPLIT_SIZE = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def files(s3: S3TestServer, tpch_tables: dict[str, Path], module_dir: Path) -> dict[str, Path]:
    """The local copies of what is uploaded: lineitem as two CSV parts, orders as
    JSON, customer as gzip CSV."""
    out = module_dir / "data"
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    lineitem = str(tpch_tables["lineitem"])
    for part, where in enumerate(("l_orderkey % 2 = 0", "l_orderkey % 2 = 1")):
        con.execute(
            f"COPY (SELECT * FROM read_parquet('{lineitem}') WHERE {where}) "
            f"TO '{out}/lineitem-{part}.csv' (FORMAT csv, HEADER)"
        )
    con.execute(
        f"COPY (SELECT * FROM read_parquet('{tpch_tables['orders']}')) "
        f"TO '{out}/orders.json' (FORMAT json)"
    )
    con.execute(
        f"COPY (SELECT * FROM read_parquet('{tpch_tables['customer']}')) "
        f"TO '{out}/customer.csv' (FORMAT csv, HEADER)"
    )
    con.close()
    with open(out / "customer.csv", "rb") as src, gzip.open(out / "customer.csv.gz", "wb") as gz:
        gz.write(src.read())
    client = s3.client()
    client.create_bucket(Bucket=BUCKET)
    for name in ("lineitem-0.csv", "lineitem-1.csv"):
        client.upload_file(str(out / name), BUCKET, f"lineitem/{name}")
    client.upload_file(str(out / "orders.json"), BUCKET, "orders.json")
    client.upload_file(str(out / "customer.csv.gz"), BUCKET, "customer.csv.gz")
    return {"lineitem": out / "lineitem-*.csv", "orders": out / "orders.json", "dir": out}


@pytest.fixture(scope="module")
def reference(files: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    con.execute(f"CREATE VIEW lineitem AS SELECT * FROM read_csv('{files['lineitem']}')")
    con.execute(
        f"CREATE VIEW orders AS SELECT * FROM read_json('{files['orders']}', "
        "format='newline_delimited')"
    )
    con.execute(f"CREATE VIEW customer AS SELECT * FROM read_csv('{files['dir']}/customer.csv')")
    yield con
    con.close()


@pytest.fixture(scope="module")
def cluster(module_dir: Path, s3: S3TestServer) -> Iterator[Any]:
    import mangonel

    options = StorageOptions(
        endpoint_url=s3.url, connect_timeout_s=1.0, request_timeout_s=5.0, attempts=3
    )
    with mangonel.LocalCluster(
        executors=2,
        work_dir=str(module_dir / "cluster"),
        partitions=4,
        scheduler_args=("--split-rows", "100000"),
        storage=options,
        web_port=0,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def session(cluster: Any, files: dict[str, Path]) -> Iterator[Any]:
    client = cluster.connect()
    client.register("lineitem", f"s3://{BUCKET}/lineitem/", "csv", split_size=SPLIT_SIZE)
    client.sql(
        f"CREATE EXTERNAL TABLE orders STORED AS JSON LOCATION 's3://{BUCKET}/orders.json' "
        f"OPTIONS ('split_size' '{SPLIT_SIZE}')"
    )
    client.register("customer", f"s3://{BUCKET}/customer.csv.gz", "csv")
    yield client
    client.close()


def _stage_executors(cluster: Any, job_id: str, table: str) -> tuple[int, set[str]]:
    with urllib.request.urlopen(f"{cluster.web_url}/api/jobs/{job_id}", timeout=10) as answer:
        detail = json.loads(answer.read())
    stage = max((s for s in detail["stages"] if table in s["label"]), key=lambda s: s["num_tasks"])
    return stage["num_tasks"], {
        a["executor"] for a in detail["attempts"] if a["stage"] == stage["id"]
    }


@pytest.mark.parametrize("number", [3, 12])
def test_tpch_over_s3_csv_and_json_matches_duckdb(
    number: int,
    cluster: Any,
    session: Any,
    s3: S3TestServer,
    reference: duckdb.DuckDBPyConnection,
) -> None:
    sql = tpch_query(number)
    expected = reference.sql(sql).to_arrow_table()
    assert expected.num_rows > 0
    start = len(s3.requests)
    result = session.sql(sql)
    order_by = TPCH_ORDER_BY[number]
    assert_same_result(result.to_arrow(), expected, ordered=bool(order_by), order_by=order_by)
    tasks, executors = _stage_executors(cluster, result.job_id, "lineitem")
    assert tasks >= 5 and len(executors) == 2, (tasks, executors)
    gets = [r for r in s3.requests[start:] if r.method == "GET" and "/lineitem/" in r.path]
    assert gets and all(r.range for r in gets), "every read of lineitem is a ranged GET"


def test_bad_row_in_an_object_names_it_and_its_line(
    session: Any, s3: S3TestServer, reference: duckdb.DuckDBPyConnection
) -> None:
    lines = ["k,v"] + [f"{i},{i}" for i in range(2, 5000)]
    lines[4000 - 1] = "x,1"  # line 4000 of the object
    s3.client().put_object(Bucket=BUCKET, Key="bad/bad.csv", Body="\n".join(lines).encode())
    session.register(
        "bad", f"s3://{BUCKET}/bad/bad.csv", "csv", columns=[("k", "BIGINT"), ("v", "BIGINT")]
    )
    with pytest.raises(JobFailedError) as failed:
        session.sql("SELECT sum(k) AS s FROM bad")
    assert isinstance(failed.value, QueryError)
    assert f"s3://{BUCKET}/bad/bad.csv, line 4000" in str(failed.value), str(failed.value)
    sql = "SELECT count(*) AS n FROM lineitem"
    assert_same_result(session.sql(sql).to_arrow(), reference.sql(sql).to_arrow_table(), False)
