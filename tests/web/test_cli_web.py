"""The command line's views of the cluster: ``jobs``, ``sql --progress``, ``explain --picture``.

Run as real ``python -m mangonel`` subprocesses against this module's cluster.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import duckdb
import pytest
from helpers import tpch_query

from mangonel.client.cluster import LocalCluster

pytestmark = pytest.mark.timeout(120)

GROUPED = "SELECT l_returnflag, count(*) AS n FROM lineitem GROUP BY 1 ORDER BY 1"


def mangonel(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mangonel", "--scheduler", cluster.address, *args],
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
    )


def result_rows(stdout: str) -> list[list[str]]:
    """The cells of a printed result table (header and rule left out)."""
    lines = [line for line in stdout.splitlines() if "|" in line]
    return [[cell.strip() for cell in line.split("|")] for line in lines[1:]]


def test_sql_shows_progress_and_the_answer(
    cluster: LocalCluster, reference: duckdb.DuckDBPyConnection
) -> None:
    done = mangonel(cluster, "sql", "--progress", GROUPED)
    assert done.returncode == 0, done.stderr
    expected = [[str(v) for v in row] for row in reference.sql(GROUPED).fetchall()]
    assert result_rows(done.stdout) == expected
    # Not a terminal: one progress line per update, at least the first one.
    progress = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert progress, done.stderr
    assert all("stages " in line and "tasks " in line and " rows" in line for line in progress)

    quiet = mangonel(cluster, "sql", GROUPED)
    assert quiet.returncode == 0 and not any(
        line.startswith("[") for line in quiet.stderr.splitlines()
    ), quiet.stderr
    assert result_rows(quiet.stdout) == expected


def test_jobs_lists_the_jobs(cluster: LocalCluster, reference: duckdb.DuckDBPyConnection) -> None:
    with cluster.connect() as session:
        result = session.sql(GROUPED)
    assert [list(r.values()) for r in result.to_arrow().to_pylist()] == [
        list(r) for r in reference.sql(GROUPED).fetchall()
    ]
    done = mangonel(cluster, "jobs")
    assert done.returncode == 0, done.stderr
    line = next((x for x in done.stdout.splitlines() if result.job_id in x), None)
    assert line is not None, done.stdout
    total = sum(s.tasks_total for s in result.stages)
    assert "succeeded" in line and f"{total}/{total} tasks" in line, line
    assert "SELECT l_returnflag" in line


def test_explain_draws_the_stage_graph(cluster: LocalCluster, tmp_path: Path) -> None:
    q12 = tpch_query(12)
    svg_path, png_path = tmp_path / "q12.svg", tmp_path / "q12.png"
    done = mangonel(cluster, "explain", "--web", cluster.web_url, "--picture", str(svg_path), q12)
    assert done.returncode == 0, done.stderr
    stages = int(done.stdout.split("Distributed plan: ")[1].split(" stages")[0])
    svg = ET.parse(svg_path).getroot()
    boxes = [g for g in svg.iter("{http://www.w3.org/2000/svg}g") if "stage" in g.get("class", "")]
    assert len(boxes) == stages == 5
    texts = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert "hash exchange" in texts and "Stage 5 (result)" in texts

    done = mangonel(cluster, "explain", "--web", cluster.web_url, "--picture", str(png_path), q12)
    assert done.returncode == 0, done.stderr
    assert png_path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    bad = mangonel(cluster, "explain", "--web", cluster.web_url, "--picture", "q.pdf", q12)
    assert bad.returncode == 1 and "name it .svg or .png" in bad.stderr, bad.stderr
    away = mangonel(cluster, "explain", "--web", "http://127.0.0.1:9", "--picture", "q.svg", q12)
    assert away.returncode == 1 and "--web" in away.stderr, away.stderr
    wrong = mangonel(cluster, "explain", "--web", cluster.web_url, "--picture", "q.svg", "SELEC")
    assert wrong.returncode == 1 and "error:" in wrong.stderr, wrong.stderr


def test_progress_line_counts_stages_tasks_and_rows() -> None:
    import io

    from mangonel.client.progress import ProgressBar, progress_line
    from mangonel.client.status import JobState, JobStatus, StageStatus

    def stage(n: int, total: int, done: int, running: int, rows: int) -> StageStatus:
        return StageStatus(n, f"s{n}", total, done, running, rows, 0, 0.0, done + running)

    status = JobStatus(
        "j", JobState.RUNNING, "SELECT 1", ("x",),
        (stage(1, 4, 4, 0, 100), stage(2, 4, 1, 2, 0), stage(3, 2, 0, 0, 0)),
        0.0, 1.25, "", "", tasks_rerun=1,
    )  # fmt: skip
    line = progress_line(status)
    assert line.startswith("[" + "#" * 12 + "-" * 12 + "]")
    assert "stages 1/3" in line and "tasks 5/10 (2 running)" in line
    assert "0 rows" in line and "1.2 s" in line and "1 re-run, 0 recomputed" in line

    out = io.StringIO()  # not a terminal: whole lines, no carriage returns
    bar = ProgressBar(out)
    bar.update(status)
    bar.update(status)  # within the interval: not drawn again
    bar.clear()
    assert out.getvalue() == line + "\n"
