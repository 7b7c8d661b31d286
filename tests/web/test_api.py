"""The REST API and /metrics against a real cluster (scheduler and executor processes).

Every answer is checked against DuckDB; what the API says about a job is checked
against what the client saw of the same job (stages, rows, re-runs) and against
itself (tasks done = attempts that succeeded, one graph box per stage).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from helpers import (
    TPCH_ORDER_BY,
    TPCH_TABLES,
    assert_same_result,
    ensure_tpch,
    explain_fallback,
    is_stopped,
    tpch_query,
)
from prometheus_client.parser import text_string_to_metric_families
from web_support import (
    ROW_GROUP_ROWS,
    SCALE,
    get,
    get_json,
    post_json,
    wait_until,
    web_cluster,
)

import mangonel
from mangonel.client import render
from mangonel.testing.cluster import TestCluster

Q12 = tpch_query(12)
JOIN_STAGE = 3
"""q12 with hash joins only: scan orders, scan lineitem, join + partial agg, final agg, sort."""

pytestmark = pytest.mark.timeout(120)


def check_q12(result: mangonel.Result, reference: duckdb.DuckDBPyConnection) -> None:
    expected = reference.sql(Q12).to_arrow_table()
    assert_same_result(result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[12])


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``(sample name, sorted labels) -> value`` of every sample at ``/metrics``."""
    status, content_type, body = get(f"{url}/metrics")
    assert status == 200 and content_type.startswith("text/plain"), (status, content_type)
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_openapi_describes_every_endpoint(cluster: TestCluster) -> None:
    spec = get_json(f"{cluster.web_url}/api/openapi.json")
    assert spec["openapi"].startswith("3.")
    paths = spec["paths"]
    for path, method in [
        ("/api/cluster", "get"),
        ("/api/executors", "get"),
        ("/api/jobs", "get"),
        ("/api/jobs/{job_id}", "get"),
        ("/api/jobs/{job_id}/graph.svg", "get"),
        ("/api/jobs/{job_id}/cancel", "post"),
        ("/api/explain", "post"),
    ]:
        assert method in paths.get(path, {}), f"{method.upper()} {path} is not described"
    executor = spec["components"]["schemas"]["ExecutorModel"]["properties"]
    assert {"state", "since", "reason", "slots", "running_tasks", "shuffle_bytes_held"} <= set(
        executor
    )
    attempt = spec["components"]["schemas"]["AttemptModel"]["properties"]
    assert {"executor", "elapsed_s", "reason", "kind", "state"} <= set(attempt)


def test_finished_query_is_described_by_the_api(
    cluster: TestCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    with cluster.connect() as session:
        result = session.sql(Q12)
    check_q12(result, reference)
    url = cluster.web_url

    listed = {j["id"]: j for j in get_json(f"{url}/api/jobs")}
    assert result.job_id in listed
    summary = listed[result.job_id]
    assert summary["state"] == "succeeded"
    assert summary["rows"] == result.num_rows
    assert summary["tasks_done"] == summary["tasks_total"] > 0
    assert summary["progress"] == 1.0

    job = get_json(f"{url}/api/jobs/{result.job_id}")
    assert [s["id"] for s in job["stages"]] == [s.stage for s in result.stages]
    assert len(job["stages"]) == 5, [s["label"] for s in job["stages"]]
    for stage, seen in zip(job["stages"], result.stages, strict=True):
        assert (stage["num_tasks"], stage["done"], stage["rows"]) == (
            seen.tasks_total,
            seen.tasks_done,
            seen.rows,
        )
        assert stage["sql"].strip().upper().startswith(("SELECT", "WITH", "(")), stage["sql"]
    assert job["stages"][0]["scan_table"] in ("orders", "lineitem")
    join = job["stages"][JOIN_STAGE - 1]
    assert {i["stage"] for i in join["inputs"]} == {1, 2}
    assert all(i["mode"] == "partition" for i in join["inputs"])
    assert job["stages"][-1]["final"]

    # One attempt per task (nothing failed), each on an executor the cluster lists.
    executors = {e["id"] for e in get_json(f"{url}/api/executors")}
    attempts = job["attempts"]
    assert len(attempts) == summary["tasks_total"]
    assert {a["state"] for a in attempts} == {"succeeded"}
    assert {a["kind"] for a in attempts} == {"first"}
    assert {a["executor"] for a in attempts} <= executors
    assert all(a["elapsed_s"] is not None and a["elapsed_s"] >= 0 for a in attempts)
    for stage in job["stages"]:
        mine = [a for a in attempts if a["stage"] == stage["id"]]
        assert sorted(a["partition"] for a in mine) == list(range(stage["num_tasks"]))
        assert sum(a["rows"] for a in mine) == stage["rows"]

    status, content_type, body = get(f"{url}/api/jobs/{result.job_id}/graph.svg")
    assert status == 200 and content_type.startswith("image/svg+xml")
    svg = ET.fromstring(body)
    boxes = [g for g in svg.iter("{http://www.w3.org/2000/svg}g") if "stage" in g.get("class", "")]
    assert sorted(int(g.get("data-stage", "0")) for g in boxes) == [1, 2, 3, 4, 5]
    assert all("stage-done" in g.get("class", "") for g in boxes)


def test_each_tasks_time_is_told_phase_by_phase_and_every_slot_second_is_accounted_for(
    cluster: TestCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    with cluster.connect() as session:
        result = session.sql(Q12)
    check_q12(result, reference)
    # The client's final status says where each stage's time went (`sql --stages`).
    assert all(s.phases is not None and s.phases.tasks == s.tasks_done for s in result.stages)
    table = render.format_phases(result.stages)
    assert len(table.splitlines()) == 2 + len(result.stages), table

    job = get_json(f"{cluster.web_url}/api/jobs/{result.job_id}")
    attempts, stages = job["attempts"], {s["id"]: s for s in job["stages"]}
    assert len(stages) == 5 and all(a["phases"] is not None for a in attempts)
    on_slot = ("setup_s", "fetch_s", "execute_s", "write_s", "cleanup_s")
    for a in attempts:
        p = a["phases"]
        assert all(v >= 0 for v in p.values()), p
        # The phases run one after the other within the executor's own time of the task.
        assert sum(p[k] for k in on_slot) <= a["elapsed_s"] + 1e-6, (p, a["elapsed_s"])
        assert p["execute_s"] > 0 and p["write_s"] > 0
    for stage in stages.values():
        p = stage["phases"]
        mine = [a["phases"] for a in attempts if a["stage"] == stage["id"]]
        assert p["tasks"] == stage["num_tasks"] == len(mine)
        assert p["execute_s"] == pytest.approx(sum(m["execute_s"] for m in mine))
        assert p["task_max_s"] >= p["task_median_s"] > 0 and p["skew"] >= 1
        # What the stage's tasks read is what the stages it reads wrote: each hash
        # partition once, a gathered stage once per reading task.
        expected = sum(
            stages[i["stage"]]["bytes"] * (stage["num_tasks"] if i["mode"] == "all" else 1)
            for i in stage["inputs"]
        )
        assert p["fetched_local_bytes"] + p["fetched_remote_bytes"] == expected > 0 or (
            not stage["inputs"] and p["fetch_s"] == 0
        )
        assert p["fetched_remote_bytes"] == 0  # the executors share one host: files are mapped

    # Every slot's time over the job's window: the phases, idling and nothing else.
    b = job["breakdown"]
    assert b["slots"] == 2 * 2 and len(b["executors"]) == 2
    # The window is taken between Unix times (so that the slots' seconds add up to
    # it exactly), whose floats step by 2**-22 s (0.24 us) in this century: it
    # matches the job's durations to a microsecond, not to a millionth of 77 ms
    # (CI, 2026-12-06: 0.07697034 against 0.07697044).
    assert b["window_s"] == pytest.approx(job["elapsed_s"] + job["planning_s"], abs=1e-6)
    assert sum(b["seconds"].values()) == pytest.approx(b["capacity_s"], rel=1e-6)
    assert b["seconds"]["wasted"] == 0 and b["seconds"]["execute"] > 0
    assert b["seconds"]["execute"] == pytest.approx(sum(a["phases"]["execute_s"] for a in attempts))
    for e in b["executors"]:
        assert e["busy_s"] + sum(v for k, v in e.items() if k.startswith("idle_")) == (
            pytest.approx(e["slots"] * b["window_s"], rel=1e-6)
        )


def test_running_query_shows_progress_and_cancels_through_the_api(
    own_cluster: TestCluster,
) -> None:
    cluster = own_cluster
    # Each executor stops itself (SIGSTOP) as it starts its first join task: the
    # query holds still, mid-way, for as long as the test looks at it.
    cluster.set_faults_all([{"action": "freeze", "when": "task_started", "stage": JOIN_STAGE}])
    url = cluster.web_url
    try:
        with cluster.connect() as session:
            job_id = session.submit(Q12)

            def joining() -> dict[str, object] | None:
                job = get_json(f"{url}/api/jobs/{job_id}")
                join = job["stages"][JOIN_STAGE - 1]
                frozen = [e for e in cluster.executors if is_stopped(e.pid)]
                return job if frozen and join["running"] >= 1 else None

            job = wait_until(joining, "an executor froze in the join stage")
            assert job["state"] == "running"
            assert 0 < job["progress"] < 1
            assert job["stages"][0]["done"] == job["stages"][0]["num_tasks"]
            assert any(a["state"] == "running" for a in job["attempts"])
            gauges = metrics(url)
            assert gauges[("mangonel_tasks", (("state", "running"),))] >= 1

            status, answer = post_json(f"{url}/api/jobs/{job_id}/cancel")
            assert (status, answer) == (200, {"cancelled": True})
            with pytest.raises(mangonel.JobCancelledError):
                session.wait(job_id)
            assert get_json(f"{url}/api/jobs/{job_id}")["state"] == "cancelled"
            status, answer = post_json(f"{url}/api/jobs/{job_id}/cancel")
            assert (status, answer) == (200, {"cancelled": False})
    finally:
        cluster.set_faults_all([])
        for handle in cluster.executors:
            cluster.thaw_executor(handle.index)
    attempts = get_json(f"{url}/api/jobs/{job_id}")["attempts"]
    assert not any(a["state"] == "running" for a in attempts), attempts


def test_metrics_count_what_a_query_did(
    cluster: TestCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    url = cluster.web_url
    before = metrics(url)
    with cluster.connect() as session:
        result = session.sql(Q12)
        registered = len(session.tables())
    check_q12(result, reference)
    after = metrics(url)
    job = get_json(f"{url}/api/jobs/{result.job_id}")

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("mangonel_task_attempts_launched_total") == len(job["attempts"])
    assert delta("mangonel_task_attempts_ended_total", outcome="succeeded") == len(job["attempts"])
    assert delta("mangonel_task_retries_total") == 0
    assert delta("mangonel_outputs_recomputed_total") == 0
    # Every stage's files were reported; the four stages after the scans read theirs.
    written = sum(s["bytes"] for s in job["stages"])
    assert delta("mangonel_shuffle_bytes_written_total") == written > 0
    read_by_later = sum(s["bytes"] for s in job["stages"][:-1])
    assert delta("mangonel_shuffle_bytes_fetched_total") == read_by_later
    assert delta("mangonel_job_duration_seconds_count", outcome="succeeded") == 1
    assert delta("mangonel_job_duration_seconds_sum", outcome="succeeded") > 0
    assert after[("mangonel_executors", (("state", "alive"),))] == 2
    assert after[("mangonel_tables", (("state", "readable"),))] == registered > 0
    assert after[("mangonel_tables", (("state", "unreadable"),))] == 0
    assert after[("mangonel_retirements_waiting", ())] == 0
    for reason in ("connection lost", "heartbeat timeout", "fetch failures", "drained"):
        assert ("mangonel_executors_lost_total", (("reason", reason),)) in after


def test_a_query_the_planner_runs_whole_is_counted_and_says_why(
    cluster: TestCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    """The planner's fallback (the binder does not split ``DISTINCT ON``: the whole
    query runs in one task) shows in EXPLAIN, on the job and in /metrics; a query it
    splits does not move the count."""
    url = cluster.web_url
    whole = (
        "SELECT DISTINCT ON (l_returnflag) l_returnflag, l_linenumber FROM lineitem "
        "ORDER BY l_returnflag, l_linenumber"
    )

    def fallbacks() -> float:
        return metrics(url)[("mangonel_plan_fallbacks_total", ())]

    with cluster.connect() as session:
        before = fallbacks()
        result = session.sql(whole)
        assert_same_result(
            result.to_arrow(),
            reference.sql(whole).to_arrow_table(),
            ordered=True,
            order_by=("l_returnflag",),
        )
        assert explain_fallback(session.explain(whole)) == "DISTINCT ON"
        assert get_json(f"{url}/api/jobs/{result.job_id}")["fallback"] == "DISTINCT ON"
        assert fallbacks() == before + 1
        split = session.sql(Q12)
        check_q12(split, reference)
        assert explain_fallback(session.explain(Q12)) is None
        assert get_json(f"{url}/api/jobs/{split.job_id}")["fallback"] is None
        assert fallbacks() == before + 1


def test_the_same_query_again_reuses_its_plan_until_a_table_changes(
    cluster: TestCluster, web_data: Path, reference: duckdb.DuckDBPyConnection
) -> None:
    url = cluster.web_url
    sql = "SELECT l_returnflag, count(*) AS n FROM lineitem WHERE l_quantity < 17 GROUP BY 1"
    expected = reference.sql(sql).to_arrow_table()

    def planned(how: str) -> float:
        return metrics(url)[("mangonel_plans_total", (("cache", how),))]

    with cluster.connect() as session:
        counts = []
        for again in (False, True, False):
            if not again:
                # The same file registered again is a new table: its plans are stale.
                session.register_parquet("lineitem", str(web_data / "lineitem.parquet"))
            before = planned("hit"), planned("miss")
            result = session.sql(sql)
            assert_same_result(result.to_arrow(), expected, ordered=False)
            counts.append((planned("hit") - before[0], planned("miss") - before[1]))
    assert counts == [(0, 1), (1, 0), (0, 1)]


def test_unknown_job_is_404(cluster: TestCluster) -> None:
    status, content_type, body = get(f"{cluster.web_url}/api/jobs/nosuchjob")
    assert status == 404 and "nosuchjob" in body.decode()
    status, answer = post_json(f"{cluster.web_url}/api/jobs/nosuchjob/cancel")
    assert status == 404, answer


def test_explain_plans_without_running(cluster: TestCluster) -> None:
    url = cluster.web_url
    jobs_before = len(get_json(f"{url}/api/jobs"))
    status, plan = post_json(f"{url}/api/explain", {"sql": Q12})
    assert status == 200, plan
    with cluster.connect() as session:
        assert plan["text"] == session.explain(Q12)
    assert [s["id"] for s in plan["stages"]] == [1, 2, 3, 4, 5]
    assert all(s["done"] == 0 and s["pending"] == s["num_tasks"] for s in plan["stages"])
    assert len(get_json(f"{url}/api/jobs")) == jobs_before

    status, error = post_json(f"{url}/api/explain", {"sql": "SELEC 1"})
    assert status == 400 and "line 1" in error["detail"].lower(), error
    status, error = post_json(f"{url}/api/explain", {"sql": "SELECT * FROM nosuchtable"})
    assert status == 400 and "nosuchtable" in error["detail"], error


def test_explain_plans_through_the_schedulers_plan_cache(cluster: TestCluster) -> None:
    """The web API's EXPLAIN shares the plan cache of ``mangonel explain`` and of queries."""
    url = cluster.web_url
    sql = "SELECT o_orderstatus, max(o_totalprice) AS top FROM orders GROUP BY 1"  # only here

    def planned() -> tuple[float, float]:
        samples = metrics(url)
        return (
            samples[("mangonel_plans_total", (("cache", "hit"),))],
            samples[("mangonel_plans_total", (("cache", "miss"),))],
        )

    texts = []
    counts = []
    with cluster.connect() as session:
        for ask in ("web", "web", "grpc"):
            before = planned()
            if ask == "web":
                status, plan = post_json(f"{url}/api/explain", {"sql": sql})
                assert status == 200, plan
                assert len(plan["stages"]) > 1, plan  # a distributed plan, not one task
                texts.append(plan["text"])
            else:
                texts.append(session.explain(sql))
            after = planned()
            counts.append((after[0] - before[0], after[1] - before[1]))
    # Planned once by the first web request; the second and the client's reuse it.
    assert counts == [(0, 1), (1, 0), (1, 0)]
    assert texts[0] == texts[1] == texts[2]


def test_pages_and_static_files_are_served(cluster: TestCluster) -> None:
    for path, kind in [
        ("/", "text/html"),
        ("/jobs/anything", "text/html"),
        ("/static/cluster.js", "javascript"),
        ("/static/job.js", "javascript"),
        ("/static/style.css", "text/css"),
    ]:
        status, content_type, _ = get(f"{cluster.web_url}{path}")
        assert status == 200 and kind in content_type, (path, status, content_type)


def test_stages_name_the_small_tables_they_read_whole(work_dir: Path, web_data: Path) -> None:
    # With broadcast joins (the default), q5's region and nation are scanned by the
    # tasks that join them; the API and EXPLAIN both say which.
    with web_cluster(work_dir / "bcast", broadcast_bytes=None) as cluster:
        with cluster.connect() as session:
            for table in TPCH_TABLES:
                session.register_parquet(table, str(web_data / f"{table}.parquet"))
            text = session.explain(tpch_query(5))
        status, plan = post_json(f"{cluster.web_url}/api/explain", {"sql": tpch_query(5)})
    assert status == 200, plan
    sides = {t for s in plan["stages"] for t in s["side_tables"]}
    assert {"region", "nation"} <= sides, plan["stages"]
    for table in sides:
        assert f"reads  table {table} (" in text


def test_stages_name_the_tables_their_tasks_read_by_key_range(
    work_dir: Path, web_data: Path
) -> None:
    # q12's lineitem tasks each scan the orders row groups their order keys may
    # meet; the API lists orders apart from the tables read whole. (q5's lineitem
    # now meets the year's orders joined with one region's customers first, and
    # ranges no table: ``join_order._order``.)
    # Its own cluster: orders in key order (the suite's copy is shuffled).
    ordered = work_dir / "orders.parquet"
    pq.write_table(
        pq.read_table(ensure_tpch(SCALE) / "orders.parquet"), ordered, row_group_size=ROW_GROUP_ROWS
    )
    with web_cluster(work_dir / "ranged") as cluster:
        with cluster.connect() as session:
            for table in TPCH_TABLES:
                path = ordered if table == "orders" else web_data / f"{table}.parquet"
                session.register_parquet(table, str(path))
            text = session.explain(tpch_query(12))
        status, plan = post_json(f"{cluster.web_url}/api/explain", {"sql": tpch_query(12)})
    assert status == 200, plan
    (stage,) = [s for s in plan["stages"] if s["ranged_tables"]]
    assert stage["scan_table"] == "lineitem" and stage["ranged_tables"] == ["orders"]
    assert "orders" not in stage["side_tables"]
    assert "reads  table orders (" in text and "by join key range" in text


def test_every_tpch_plan_is_drawn(cluster: TestCluster) -> None:
    """Each of the 22 plans as SVG: well-formed, one box per stage, no two boxes overlap."""
    from mangonel.web.models import StageModel
    from mangonel.web.picture import svg

    ns = "{http://www.w3.org/2000/svg}"
    for number in range(1, 23):
        status, plan = post_json(f"{cluster.web_url}/api/explain", {"sql": tpch_query(number)})
        assert status == 200, (number, plan)
        stages = [StageModel.model_validate(s) for s in plan["stages"]]
        root = ET.fromstring(svg(stages, live=False))
        boxes = []
        for group in root.iter(f"{ns}g"):
            rect = group.find(f"{ns}rect")
            assert rect is not None
            x, y = float(rect.get("x", "0")), float(rect.get("y", "0"))
            w, h = float(rect.get("width", "0")), float(rect.get("height", "0"))
            boxes.append((x, y, x + w, y + h))
        assert len(boxes) == len(stages), number
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
                assert apart, f"q{number}: stage boxes {a} and {b} overlap"
