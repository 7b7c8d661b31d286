"""The web UI of a scheduler with users, in a real headless Chromium.

The pages ask for a login; a wrong password is refused on the page (and in the
scheduler's log); the right one shows the user's own jobs and not another
user's; a pasted admin token shows every job; "log out" asks again. The
header says "insecure": this scheduler serves without TLS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import TPCH_ORDER_BY, TPCH_TABLES, assert_same_result, tpch_query, wait_until
from test_browser import browser, css, screenshot, wait_page  # noqa: F401  (the fixture)
from web_support import web_cluster

from mangonel.testing.cluster import TestCluster

pytestmark = pytest.mark.timeout(180)

USERS = {"alice": ("alice-secret", False), "bob": ("bob-secret!", False),
         "root": ("root-secret", True)}  # fmt: skip
Q12 = tpch_query(12)


@pytest.fixture(scope="module")
def cluster(module_dir: Path, web_data: Path) -> Iterator[TestCluster]:
    with web_cluster(module_dir / "cluster", users=USERS) as running:
        with running.connect() as root:
            for table in TPCH_TABLES:
                root.register_parquet(table, str(web_data / f"{table}.parquet"))
        yield running


def log_in(driver: Any, user: str = "", password: str = "", token: str = "") -> None:
    wait_page(driver, lambda: css(driver, "form#login"), "the login form")
    for field, value in (("login-user", user), ("login-password", password)):
        box = css(driver, f"#{field}")[0]
        box.clear()
        box.send_keys(value)
    box = css(driver, "#login-token")[0]
    box.clear()
    box.send_keys(token)
    css(driver, "#login-submit")[0].click()


def job_ids(driver: Any) -> set[str]:
    return {row.get_attribute("data-job") for row in css(driver, "#jobs tr.job")}


def test_login_shows_only_the_users_jobs(
    browser: Any,  # noqa: F811
    cluster: TestCluster,
    reference: duckdb.DuckDBPyConnection,
) -> None:
    with cluster.connect(user="alice", password=USERS["alice"][0]) as alice:
        result = alice.sql(Q12)
        alices = result.job_id
    assert_same_result(
        result.to_arrow(),
        reference.sql(Q12).to_arrow_table(),
        ordered=True,
        order_by=TPCH_ORDER_BY[12],
    )
    with cluster.connect(user="bob", password=USERS["bob"][0]) as bob:
        bobs = bob.sql("SELECT count(*) FROM nation").job_id

    browser.delete_all_cookies()
    browser.get(f"{cluster.web_url}/")
    wait_page(browser, lambda: css(browser, "form#login"), "the login form")
    assert css(browser, "header #insecure")[0].text.lower() == "insecure"
    assert not css(browser, "main")[0].is_displayed()
    screenshot(browser, "login.png")

    # A wrong password: refused on the page and in the scheduler's log.
    log_in(browser, "alice", "not-her-password")
    wait_page(
        browser,
        lambda: "wrong user name or password" in css(browser, "#login-error")[0].text,
        "the refusal",
    )
    log = Path(cluster.scheduler.log_path) if cluster.scheduler else None
    assert log is not None
    wait_until(
        lambda: "login refused for user 'alice': wrong password" in log.read_text(),
        "the scheduler logs the refusal",
    )

    # The right one: alice's jobs, not bob's.
    log_in(browser, "alice", USERS["alice"][0])
    wait_page(browser, lambda: alices in job_ids(browser), "alice's job")
    assert bobs not in job_ids(browser)
    assert "alice" in css(browser, "header #who")[0].text
    # The token lives in an HttpOnly cookie: the page's scripts cannot read it.
    assert "mangonel_token" not in browser.execute_script("return document.cookie")
    assert browser.get_cookie("mangonel_token")["httpOnly"] is True
    screenshot(browser, "logged-in-alice.png")

    # Log out: asked again.
    css(browser, "#logout")[0].click()
    wait_page(browser, lambda: css(browser, "form#login"), "the login form again")

    # An admin's token, pasted: every job.
    log_in(browser, token=cluster.token("root", admin=True))
    wait_page(browser, lambda: {alices, bobs} <= job_ids(browser), "every user's jobs")
    assert "root (admin)" in css(browser, "header #who")[0].text
    owner = f"#jobs tr[data-job='{bobs}'] td.owner"
    assert css(browser, owner)[0].text == "bob"
    screenshot(browser, "logged-in-admin.png")
