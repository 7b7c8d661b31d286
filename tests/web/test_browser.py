"""The web UI in a real headless Chromium, against a real cluster.

Debian's ``chromium`` and ``chromium-driver`` (``scripts/install-system-deps.sh``)
are used as installed: nothing is downloaded at test time. Each test saves
full-page screenshots under ``test-artifacts/web/`` for people to look at.

A query is held mid-way by a fault rule that makes each executor stop itself
(SIGSTOP) as it starts its first join task; the long heartbeat timeout of the
cluster (60 s) keeps the stopped executors from being written off meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import (
    ARTIFACTS_DIR,
    TPCH_ORDER_BY,
    assert_same_result,
    headless_chromium,
    is_stopped,
    tpch_query,
)
from web_support import get_json, wait_until

import mangonel
from mangonel.client.cluster import ExecutorHandle
from mangonel.testing.cluster import TestCluster

SCREENSHOTS = ARTIFACTS_DIR / "web"
Q12 = tpch_query(12)
JOIN_STAGE = 3
STAGES = 5

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with headless_chromium(page_load_timeout_s=30) as driver:
        yield driver


def screenshot(driver: Any, name: str) -> Path:
    """Save the whole page (the window grown to the page's height) as ``name``."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(900, int(height) + 20))
    driver.execute_script("window.scrollTo(0, 0)")
    path = SCREENSHOTS / name
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 900)
    return path


def wait_page(driver: Any, condition: Any, what: str, timeout: float = 30.0) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException

    def check() -> Any:
        try:
            return condition()
        except StaleElementReferenceException:  # the page redrew under us
            return None

    return wait_until(check, f"the page shows {what}", timeout)


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def hold_at_join(cluster: TestCluster) -> None:
    """Every executor stops itself (SIGSTOP) as it starts its first join task."""
    cluster.set_faults_all([{"action": "freeze", "when": "task_started", "stage": JOIN_STAGE}])


def frozen_mid_join(cluster: TestCluster, job_id: str) -> list[ExecutorHandle]:
    def check() -> list[ExecutorHandle] | None:
        frozen = [e for e in cluster.executors if e.alive() and is_stopped(e.pid)]
        join = get_json(f"{cluster.web_url}/api/jobs/{job_id}")["stages"][JOIN_STAGE - 1]
        return frozen if frozen and join["running"] >= 1 else None

    frozen: list[ExecutorHandle] = wait_until(check, "an executor froze in the join stage")
    return frozen


def release(cluster: TestCluster) -> None:
    cluster.set_faults_all([])
    for handle in cluster.executors:
        if handle.alive():
            cluster.thaw_executor(handle.index)


def test_cancel_button_cancels_a_running_job(browser: Any, own_cluster: TestCluster) -> None:
    cluster = own_cluster
    hold_at_join(cluster)
    try:
        with cluster.connect() as session:
            job_id = session.submit(Q12)
            frozen_mid_join(cluster, job_id)
            browser.get(f"{cluster.web_url}/jobs/{job_id}")
            button = wait_page(
                browser,
                lambda: next((b for b in css(browser, "#cancel") if b.is_enabled()), None),
                "an enabled cancel button",
            )
            button.click()
            browser.switch_to.alert.accept()
            wait_page(
                browser,
                lambda: "cancelled" in css(browser, "#job-state")[0].text,
                "the job as cancelled",
            )
            assert not css(browser, "#cancel")[0].is_enabled()
            with pytest.raises(mangonel.JobCancelledError):
                session.wait(job_id)
            screenshot(browser, "job-cancelled.png")
    finally:
        release(cluster)
    assert get_json(f"{cluster.web_url}/api/jobs/{job_id}")["state"] == "cancelled"


def test_running_graph_then_lost_executor_and_reruns(
    browser: Any, own_cluster: TestCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    cluster = own_cluster
    url = cluster.web_url
    hold_at_join(cluster)
    try:
        with cluster.connect() as session:
            job_id = session.submit(Q12)
            frozen = frozen_mid_join(cluster, job_id)

            # The job page draws the stage graph of the running query.
            browser.get(f"{url}/jobs/{job_id}")
            wait_page(
                browser,
                lambda: len(css(browser, "#graph svg g.stage")) == STAGES,
                "the stage graph",
            )
            assert css(browser, "#job-state")[0].text == "running"
            done = css(browser, "#graph svg g.stage-done")
            running = css(browser, "#graph svg g.stage-running")
            assert {g.get_attribute("data-stage") for g in done} == {"1", "2"}
            assert str(JOIN_STAGE) in {g.get_attribute("data-stage") for g in running}
            assert "Stage 3" in css(browser, "#graph svg")[0].text
            assert len(css(browser, "#stages tbody tr.stage")) == STAGES
            assert css(browser, "#attempts tbody tr.attempt[data-state='running']")
            screenshot(browser, "job-running.png")

            # Kill a stopped executor mid-join; the others go on and the query finishes.
            victim = frozen[0]
            victim_id = victim.id
            cluster.set_faults_all([])
            cluster.kill_executor(victim.index)
            release(cluster)
            result = session.wait(job_id)
        expected = reference.sql(Q12).to_arrow_table()
        assert_same_result(result.to_arrow(), expected, ordered=True, order_by=TPCH_ORDER_BY[12])
        assert result.tasks_rerun >= 1, result.stages

        # The cluster page lists the killed executor as lost, with why.
        browser.get(f"{url}/")
        row = f"#executors tr[data-executor='{victim_id}']"
        wait_page(
            browser,
            lambda: css(browser, row) and "lost" in css(browser, f"{row} td.state")[0].text,
            f"executor {victim_id} as lost",
        )
        assert "connection lost" in css(browser, f"{row} td.why")[0].text
        alive = css(browser, "#executors tr.state-alive")
        assert len(alive) == sum(1 for e in cluster.executors if e.alive())
        assert css(browser, f"#jobs tr[data-job='{job_id}']")
        screenshot(browser, "cluster-lost-executor.png")

        # The job page shows the lost attempt and its re-run on another executor.
        browser.get(f"{url}/jobs/{job_id}")
        wait_page(
            browser,
            lambda: (
                "succeeded" in css(browser, "#job-state")[0].text
                and css(browser, "#attempts tr.attempt[data-kind='re-run']")
            ),
            "the finished job with its re-run attempts",
        )
        lost = css(browser, "#attempts tr.attempt[data-state='lost']")
        assert lost and all(victim_id in r.text and "connection lost" in r.text for r in lost)
        reruns = css(browser, "#attempts tr.attempt[data-kind='re-run']")
        assert all(victim_id not in r.text for r in reruns)
        assert len(css(browser, "#graph svg g.stage-done")) == STAGES
        assert css(browser, "#graph svg rect.badge"), "no re-run badge on the graph"
        # Where the time went: a row per stage, and the lost attempts' time as wasted.
        assert len(css(browser, "#phases tbody tr.phase")) == STAGES
        assert css(browser, "#breakdown .stack .seg[data-part='wasted']")
        assert css(browser, "#breakdown .stack .seg[data-part='execute']")
        screenshot(browser, "job-rerun.png")
        css(browser, "#only-problems")[0].click()
        wait_page(
            browser,
            lambda: all(
                r.get_attribute("data-kind") != "first"
                or r.get_attribute("data-state") in ("failed", "lost")
                or r.get_attribute("data-output-lost") == "true"
                for r in css(browser, "#attempts tr.attempt")
            ),
            "only the attempts with a problem",
        )
        screenshot(browser, "job-rerun-problems-only.png")
    finally:
        release(cluster)
