"""The ``mangonel`` command line, run as real subprocesses against ``mangonel standalone``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

COMMANDS = [
    "scheduler", "executor", "standalone", "sql", "explain", "register",
    "tables", "status", "cancel", "demo",
]  # fmt: skip


def mangonel(
    *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mangonel", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_of_every_command() -> None:
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "mangonel", *([name] if name else []), "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name in ["", *COMMANDS]
    }
    outputs = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"`mangonel {name} --help` failed: {err}"
        assert out.startswith(f"usage: mangonel {name}".rstrip()), out
        assert len(out.splitlines()) > 3
        outputs[name] = out
    assert all(name in outputs[""] for name in COMMANDS)
    assert "--scheduler" in outputs["executor"] and "--slots" in outputs["executor"]


@pytest.fixture(scope="module")
def standalone(module_dir: Path) -> Iterator[str]:
    """``mangonel standalone`` on a free port; yields the scheduler address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mangonel", "standalone", "--port", "0", "--executors", "2",
         "--work-dir", str(module_dir / "standalone"), "--write-root", str(module_dir / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"mangonel standalone did not start: {line}{err}")
        address = line.split("listening on ")[1].split()[0]
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


def test_register_and_query(standalone: str, tpch_tables: dict[str, Path]) -> None:
    done = mangonel("--scheduler", standalone, "register", "nation", str(tpch_tables["nation"]))
    assert done.returncode == 0, done.stderr
    assert "registered nation: 25 rows" in done.stdout

    done = mangonel("tables", "--scheduler", standalone)
    assert done.returncode == 0 and "nation" in done.stdout

    done = mangonel(
        "--scheduler", standalone, "sql",
        "SELECT n_regionkey, count(*) AS nations FROM nation GROUP BY 1 ORDER BY 1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["n_regionkey", "|", "nations"]
    assert [line.split() for line in lines[2:]] == [[str(r), "|", "5"] for r in range(5)]
    assert "5 rows in" in done.stderr


def test_write_statements(
    standalone: str, tpch_tables: dict[str, Path], module_dir: Path, duckdb_ref: Any
) -> None:
    mangonel("--scheduler", standalone, "register", "nation", str(tpch_tables["nation"]))
    target = module_dir / "out" / "nations"
    query = "SELECT n_nationkey, n_name FROM nation WHERE n_regionkey < 3"
    expected = duckdb_ref.sql(f"SELECT count(*) FROM ({query})").fetchall()[0][0]
    done = mangonel("--scheduler", standalone, "sql", f"COPY ({query}) TO '{target}' (FORMAT csv)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].strip() == str(expected)
    copied = duckdb_ref.sql(f"SELECT count(*) FROM read_csv('{target}/part-*.csv')").fetchall()
    assert copied[0][0] == expected
    done = mangonel("--scheduler", standalone, "sql", f"CREATE TABLE few AS {query}")
    assert done.returncode == 0, done.stderr
    done = mangonel("--scheduler", standalone, "sql", "SELECT count(*) AS n FROM few")
    assert done.stdout.splitlines()[-1].strip() == str(expected)
    done = mangonel("--scheduler", standalone, "sql", "COPY nation TO '/tmp/x' (FORMAT csv)")
    assert done.returncode == 1 and "write root" in done.stderr


def test_query_from_stdin_and_file(
    standalone: str, tpch_tables: dict[str, Path], tmp_path: Path
) -> None:
    mangonel("--scheduler", standalone, "register", "region", str(tpch_tables["region"]))
    done = mangonel("--scheduler", standalone, "sql", stdin="SELECT count(*) AS n FROM region;\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].strip() == "5"
    query = tmp_path / "q.sql"
    query.write_text("SELECT r_name FROM region\nWHERE r_regionkey = 2;\n")
    done = mangonel("--scheduler", standalone, "sql", "-f", str(query))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].strip() == "ASIA"
    done = mangonel("--scheduler", standalone, "explain", "-f", str(query))
    assert done.returncode == 0 and "region" in done.stdout


def test_errors_are_one_line_with_exit_code_1(standalone: str, tmp_path: Path) -> None:
    for args in (
        ["sql", "SELEC r_name FROM region"],
        ["sql", "SELECT * FROM no_such_table"],
        ["register", "ghost", str(tmp_path / "missing.parquet")],
        ["cancel", "0000dead"],
    ):
        done = mangonel("--scheduler", standalone, *args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("error: ")
        assert "Traceback" not in done.stderr


def test_status_lists_executors(standalone: str) -> None:
    done = mangonel("--scheduler", standalone, "status")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(" alive ") == 2


def test_unreachable_scheduler_is_waited_for_saying_so_then_says_how_to_start_one() -> None:
    started = time.monotonic()
    done = mangonel("--scheduler", "127.0.0.1:1", "tables", "--connect-wait", "1.5")
    took = time.monotonic() - started
    assert done.returncode == 1
    told, error = done.stderr.strip().splitlines()  # one line of each, nothing else
    assert told.startswith("mangonel: waiting up to 1.5 s for the scheduler at 127.0.0.1:1")
    assert "(connection refused)" in told and "--connect-wait" in told
    assert error.startswith("error: cannot reach the scheduler at 127.0.0.1:1")
    assert "tried for 1.5 s" in error and "mangonel standalone" in error
    assert took >= 1.5  # it waited, and then gave up (in well under the default 30 s)


@pytest.mark.timeout(120)
def test_a_query_sent_before_the_cluster_starts_waits_for_it(work_dir: Path) -> None:
    """`mangonel sql` started before its scheduler and executors (as in a compose
    file that starts them all at once): it says once that it waits, then answers."""
    from mangonel import LocalCluster

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mangonel", "--scheduler", address, "sql",
         "SELECT sum(x) AS n FROM (VALUES (20), (22)) t(x)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        told = proc.stderr.readline()  # blocks until the client waits (or exits)
        assert told.startswith(f"mangonel: waiting up to 30 s for the scheduler at {address}")
        assert "(connection refused)" in told
        with LocalCluster(executors=1, scheduler_port=port, work_dir=work_dir / "c"):
            out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "42" in out.split(), out
    assert "waiting" not in err  # said once


def test_standalone_stops_its_processes(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mangonel", "standalone", "--port", "0", "--executors", "1",
         "--work-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line
    address = line.split("listening on ")[1].split()[0]
    status = mangonel("--scheduler", address, "status").stdout
    pids = [int(p) for p in _column(status, "pid")]
    assert len(pids) == 1
    proc.send_signal(signal.SIGINT)
    proc.wait(20)
    assert proc.returncode == 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _column(table: str, name: str) -> list[str]:
    lines = [line for line in table.splitlines() if "|" in line]
    header = [c.strip() for c in lines[0].split("|")]
    index = header.index(name)
    return [line.split("|")[index].strip() for line in lines[1:] if not line.startswith("-")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_status_shows_lost_executors_and_cancel_stops_a_job(
    tmp_path: Path, tpch_tables: dict[str, Path]
) -> None:
    from mangonel import JobCancelledError, LocalCluster
    from mangonel.client.status import JobState

    with (
        LocalCluster(executors=2, work_dir=tmp_path / "c") as cluster,
        cluster.connect() as session,
    ):
        session.register_parquet("lineitem", str(tpch_tables["lineitem"]))
        cluster.kill_executor(1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = mangonel("--scheduler", cluster.address, "status").stdout
            if " lost " in status:
                break
            time.sleep(0.1)
        assert _column(status, "state").count("lost") == 1, status
        assert "connection lost" in status
        job = session.submit(
            "SELECT count(*) AS n FROM lineitem a "
            "JOIN lineitem b ON a.l_returnflag = b.l_returnflag"
        )
        done = mangonel("--scheduler", cluster.address, "cancel", job)
        assert done.returncode == 0 and f"job {job} cancelled" in done.stdout, done
        with pytest.raises(JobCancelledError):
            session.wait(job)
        listed = session.status().job(job)
        assert listed is not None and listed.state is JobState.CANCELLED
        status = mangonel("--scheduler", cluster.address, "status").stdout
        jobs_table = status.split("\n\n")[-1]  # after the executors' table
        assert _column(jobs_table, "state") == ["cancelled"], status
        assert _column(jobs_table, "re-run") == ["0"], status
