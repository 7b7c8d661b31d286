"""Pure parts of writing data: the statements' parser, the commit's steps, the state machine.

* ``sql.writes.parse_write``: what each statement becomes, and what is refused.
* ``output.commit`` on a local directory: exactly the winners' files, idempotent
  after a crash at any step (a step that raises stands in for the crash).
* ``SchedulerState`` (driven by the harness of ``test_state_machine``): a write
  job names its winners once and commits; nothing but the commit's outcome ends it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from test_state_machine import E1, E2, J1, S1, S2, Harness, two_stage_plan

from mangonel.errors import DroppedLocationError, ForbiddenStatementError
from mangonel.executor.sink import copy_sql
from mangonel.ids import TaskAttemptId, TaskId
from mangonel.output import (
    INTENT,
    MANIFEST,
    STAGING,
    CommitMode,
    WriteConflictError,
    abort,
    attempt_staging,
    commit,
    delete_retired,
    drop,
    manifest_files,
    waiting_under,
)
from mangonel.plan.physical import DistributedPlan, Stage, StageInput, WriteTarget
from mangonel.proto.convert import task_spec_from_proto, task_spec_to_proto
from mangonel.scheduler.events import (
    AbortWrite,
    CancelRequested,
    CommitWrite,
    JobFailed,
    JobSucceeded,
    SchedulerRecovered,
    WriteCommitFailed,
    WriteCommitted,
)
from mangonel.scheduler.persist import decode, encode
from mangonel.scheduler.state_jobs import FinishedJob, JobRecord
from mangonel.sql.writes import WriteKind, parse_write
from mangonel.task import (
    InputMode,
    LaunchTask,
    OutputKind,
    OutputSpec,
    QueryError,
    SinkSpec,
    TaskSpec,
    WriteFormat,
)

# --------------------------------------------------------------------- statements


def test_write_statements_parse_into_what_they_write() -> None:
    copy = parse_write(
        "COPY (SELECT a FROM t) TO 's3://b/p/' (FORMAT csv, PARTITION_BY (a, b), OVERWRITE)"
    )
    assert copy is not None and copy.kind is WriteKind.COPY
    assert (copy.location, copy.format, copy.partition_by, copy.overwrite) == (
        "s3://b/p/",
        WriteFormat.CSV,
        ("a", "b"),
        True,
    )
    assert copy.query == "SELECT a FROM t"
    table = parse_write("COPY lineitem TO 'out' (FORMAT 'json')")
    assert table is not None and table.query == "SELECT * FROM lineitem"
    assert table.format is WriteFormat.JSON and not table.overwrite
    ctas = parse_write("CREATE OR REPLACE TABLE x AS SELECT 1 AS a")
    assert ctas is not None and (ctas.kind, ctas.table, ctas.overwrite) == (
        WriteKind.CREATE_TABLE,
        "x",
        True,
    )
    exists = parse_write("CREATE TABLE IF NOT EXISTS x AS (SELECT 1 AS a)")
    assert exists is not None and exists.if_not_exists
    insert = parse_write("INSERT INTO x SELECT * FROM y")
    assert insert is not None and (insert.kind, insert.table) == (WriteKind.INSERT, "x")
    drop = parse_write("-- gone\nDROP TABLE IF EXISTS x")
    assert drop is not None and (drop.kind, drop.if_not_exists) == (WriteKind.DROP_TABLE, True)
    assert parse_write("SELECT 1") is None
    assert parse_write("WITH c AS (SELECT 1) SELECT * FROM c") is None


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("COPY t FROM 'x'", "register"),
        ("COPY t TO 'x' (FORMAT xlsx)", "parquet, csv or json"),
        ("COPY t TO 'x' (FORCE_QUOTE *)", "COMPRESSION, ROW_GROUP_SIZE \\(Parquet\\), HEADER"),
        ("COPY t TO 'x' (FORMAT parquet, QUOTE '|')", "QUOTE applies to FORMAT csv"),
        ("COPY t TO 'x' (FORMAT csv, QUOTE '||')", "QUOTE takes one quoted character"),
        ("COPY t TO 'x' (FORMAT csv, ESCAPE 'é')", "ESCAPE takes one quoted character"),
        ("COPY t TO 'x' (FORMAT csv, NULL 1)", "NULLSTR takes one quoted text"),
        ("COPY t TO 'x' (FORMAT csv, DELIMITER '|', QUOTE '|')", "QUOTE '\\|' appears in DELIM"),
        ("COPY t TO 'x' (FORMAT csv, QUOTE '', NULL '\"')", "ESCAPE '\"' \\(DuckDB's default"),
        ("COPY t TO 'x' (FORMAT csv, DATEFORMAT '')", "DATEFORMAT '': .*Empty format"),
        ("COPY t TO 'x' (FORMAT csv, TIMESTAMP_FORMAT '%Q')", "TIMESTAMPFORMAT '%Q'"),
        ("COPY t TO 'x' (FORMAT csv, COMPRESSION snappy)", "uncompressed, gzip, zstd"),
        ("COPY t TO 'x' (FORMAT parquet, COMPRESSION lzma)", "snappy, gzip, zstd"),
        ("COPY t TO 'x' (FORMAT json, HEADER false)", "HEADER applies to FORMAT csv"),
        ("COPY t TO 'x' (FORMAT csv, ROW_GROUP_SIZE 100)", "applies to FORMAT parquet"),
        ("COPY t TO 'x' (ROW_GROUP_SIZE 'many')", "number of rows"),
        ("COPY t TO 'x' (FORMAT csv, DELIMITER '||')", "one quoted character"),
        ("COPY t TO 'x' (FORMAT csv, HEADER maybe)", "true or false"),
        ("CREATE TABLE x (a INT PRIMARY KEY)", "constraints and defaults"),
        ("CREATE TABLE x (a)", "a type for every column"),
        ("CREATE VIEW v AS SELECT 1", "AS SELECT"),
        ("INSERT INTO x DEFAULT VALUES", "rows of a query"),
        ("INSERT INTO x (a) BY NAME SELECT 1 AS a", "leave out the column list, or BY NAME"),
        ("DROP VIEW v", "DROP TABLE"),
    ],
)
def test_other_shapes_are_refused_saying_what_is_taken(sql: str, words: str) -> None:
    with pytest.raises(ForbiddenStatementError, match=words):
        parse_write(sql)


def test_copy_s_file_options_reach_duckdb_s_copy_as_it_spells_them() -> None:
    def sql(statement: str) -> str:
        parsed = parse_write(statement)
        assert parsed is not None
        sink = SinkSpec("/t", parsed.format, "/t/s", ("a",), options=parsed.options)
        return copy_sql(sink, "/t/s")

    csv = sql("COPY t TO 'x' (FORMAT csv, COMPRESSION gzip, HEADER false, DELIM '|')")
    assert "COMPRESSION gzip" in csv and "HEADER false" in csv and "DELIMITER '|'" in csv
    assert "HEADER true" in sql("COPY t TO 'x.csv'") and "DELIMITER ','" in sql("COPY t TO 'x.csv'")
    assert "COMPRESSION none" in sql("COPY t TO 'x' (FORMAT json, COMPRESSION none)")
    parquet = sql("COPY t TO 'x' (FORMAT parquet, CODEC 'ZSTD', ROW_GROUP_SIZE 10000)")
    assert "COMPRESSION zstd" in parquet and "ROW_GROUP_SIZE 10000" in parquet
    assert "COMPRESSION uncompressed" in sql("COPY t TO 'x' (COMPRESSION uncompressed)")
    quoted = sql(
        "COPY t TO 'x' (FORMAT csv, QUOTE '''', ESCAPE '\\', NULL 'NA', DATE_FORMAT '%d.%m.%Y', "
        "TIMESTAMPFORMAT '%H:%M')"
    )
    assert "QUOTE '''', ESCAPE '\\', NULLSTR 'NA', DATEFORMAT '%d.%m.%Y'" in quoted
    assert "TIMESTAMPFORMAT '%H:%M'" in quoted
    assert "QUOTE '', ESCAPE ''" in sql("COPY t TO 'x' (FORMAT csv, QUOTE '', ESCAPE '')")
    assert "QUOTE" not in sql("COPY t TO 'x.csv'") and "NULLSTR" not in sql("COPY t TO 'x.csv'")
    # The options reach the executor as given: unset and empty stay apart.
    parsed = parse_write("COPY t TO 'x' (FORMAT csv, QUOTE '', NULL 'NA', DATEFORMAT '%Y')")
    assert parsed is not None
    spec = TaskSpec(
        attempt=TaskAttemptId(TaskId(J1, S1, 0), 0),
        sql="SELECT 1",
        output=OutputSpec(OutputKind.SINGLE),
        columns=("a",),
        sink=SinkSpec("/t", parsed.format, "/t/s", ("a",), options=parsed.options),
    )
    back = task_spec_from_proto(task_spec_to_proto(spec)).sink
    assert back == spec.sink and back is not None
    assert (back.options.quote, back.options.escape, back.options.null) == ("", None, "NA")
    plain = sql("COPY t TO 'x'")
    assert "COMPRESSION" not in plain and "ROW_GROUP_SIZE" not in plain and "HEADER" not in plain


# ------------------------------------------------------------------------ commit


def stage_files(target: str, job: str, attempts: dict[int, list[int]]) -> None:
    """Each task's attempts, each with two files (one in a hive directory)."""
    for partition, numbers in attempts.items():
        for attempt in numbers:
            base = Path(attempt_staging(target, job, partition, attempt))
            (base / "k=1").mkdir(parents=True)
            (base / "data_0.parquet").write_text(f"p{partition} a{attempt}")
            (base / "k=1" / "data_0.parquet").write_text(f"p{partition} a{attempt} k1")


def contents(target: Path) -> list[str]:
    return sorted(Path(f).read_text() for f in manifest_files(str(target)) or ())


def test_commit_makes_exactly_the_winners_visible(tmp_path: Path) -> None:
    target = str(tmp_path / "out")
    stage_files(target, "j1", {0: [0, 1], 1: [0]})
    done = commit(target, "j1", {0: 1, 1: 0}, "parquet", CommitMode.CREATE)
    assert contents(tmp_path / "out") == ["p0 a1", "p0 a1 k1", "p1 a0", "p1 a0 k1"]
    assert "k=1/part-j1-p00000-data_0.parquet" in done.files
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        MANIFEST,
        "k=1",
        "part-j1-p00000-data_0.parquet",
        "part-j1-p00001-data_0.parquet",
    ]
    # Again: nothing changes (a restarted scheduler commits again).
    assert commit(target, "j1", {0: 1, 1: 0}, "parquet", CommitMode.CREATE).files == done.files


class Crash(Exception):
    pass


def test_a_commit_crashed_after_its_intent_finishes_with_the_same_files(tmp_path: Path) -> None:
    target = str(tmp_path / "out")
    stage_files(target, "j1", {0: [0, 1], 1: [0]})

    def crash() -> None:
        raise Crash

    with pytest.raises(Crash):
        commit(target, "j1", {0: 1, 1: 0}, "parquet", CommitMode.CREATE, after_intent=crash)
    assert not (tmp_path / "out" / MANIFEST).exists()
    assert (tmp_path / "out" / STAGING / "j1" / INTENT).exists()
    # Half the moves done, as if the crash came in the middle of them.
    intent = json.loads((tmp_path / "out" / STAGING / "j1" / INTENT).read_text())
    staged, final = intent["moves"][0]
    (tmp_path / "out" / STAGING / "j1" / staged).rename(tmp_path / "out" / final)
    commit(target, "j1", {0: 0, 1: 0}, "parquet", CommitMode.CREATE)  # winners from the intent
    assert contents(tmp_path / "out") == ["p0 a1", "p0 a1 k1", "p1 a0", "p1 a0 k1"]
    assert not (tmp_path / "out" / STAGING).exists()


def test_append_replace_conflict_and_abort(tmp_path: Path) -> None:
    target = str(tmp_path / "out")
    stage_files(target, "j1", {0: [0]})
    commit(target, "j1", {0: 0}, "parquet", CommitMode.CREATE)
    stage_files(target, "j2", {0: [0]})
    stage_files(target, "j3", {0: [2]})
    with pytest.raises(WriteConflictError, match="j1"):
        commit(target, "j2", {0: 0}, "parquet", CommitMode.CREATE)
    abort(target, "j2")
    commit(target, "j3", {0: 2}, "parquet", CommitMode.APPEND)
    assert contents(tmp_path / "out") == ["p0 a0", "p0 a0 k1", "p0 a2", "p0 a2 k1"]
    # j1's commit run again after j3 appended: it was done, nothing changes.
    commit(target, "j1", {0: 0}, "parquet", CommitMode.CREATE)
    assert len(contents(tmp_path / "out")) == 4
    stage_files(target, "j4", {0: [0]})
    done = commit(target, "j4", {0: 0}, "parquet", CommitMode.REPLACE)
    assert contents(tmp_path / "out") == ["p0 a0", "p0 a0 k1"]
    # The replaced files stay, out of the manifest, until their readers are done.
    assert len(done.retired) == 4 and all("part-j1-" in f or "part-j3-" in f for f in done.retired)
    assert all((tmp_path / "out" / f).exists() for f in done.retired)
    assert delete_retired(target, "j3") == 0  # not the manifest's job: not its to delete
    assert delete_retired(target, "j4") == 4
    assert delete_retired(target, "j4") == 0  # done once
    assert contents(tmp_path / "out") == ["p0 a0", "p0 a0 k1"]
    left = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.*"))
    assert left == [MANIFEST, "k=1/part-j4-p00000-data_0.parquet", "part-j4-p00000-data_0.parquet"]


def test_files_a_replace_retired_and_nobody_deleted_go_with_the_next_release(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "out")
    stage_files(target, "j1", {0: [0]})
    commit(target, "j1", {0: 0}, "parquet", CommitMode.CREATE)
    stage_files(target, "j2", {0: [0]})
    first = commit(target, "j2", {0: 0}, "parquet", CommitMode.REPLACE)
    stage_files(target, "j3", {0: [0]})
    # j2's release never ran (its scheduler restarted): j3 takes j1's files over.
    second = commit(target, "j3", {0: 0}, "parquet", CommitMode.REPLACE)
    assert set(first.retired) < set(second.retired) and len(second.retired) == 4
    assert [location for location, _ in waiting_under(str(tmp_path))] == [target]
    assert delete_retired(target, "j2") == 0
    assert delete_retired(target, "j3") == 4
    assert waiting_under(str(tmp_path)) == []
    assert contents(tmp_path / "out") == ["p0 a0", "p0 a0 k1"]
    assert len([p for p in (tmp_path / "out").rglob("*.parquet")]) == 2


def test_a_drop_keeps_the_files_for_their_readers_then_removes_the_location(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "t")
    stage_files(target, "j1", {0: [0], 1: [0]})
    commit(target, "j1", {0: 0, 1: 0}, "parquet", CommitMode.REPLACE)
    files = sorted(str(p) for p in (tmp_path / "t").rglob("part-*"))
    dropped = drop(target, "drop-1")
    assert dropped is not None and dropped.dropped and len(dropped.retired) == 4
    # In one step the location holds no table; the files stay for their readers.
    with pytest.raises(DroppedLocationError, match="was dropped"):
        manifest_files(target)
    assert all(Path(f).exists() for f in files)
    assert drop(target, "drop-2") == dropped  # dropped once: the first drop's
    assert waiting_under(str(tmp_path)) == [(target, dropped)]
    assert delete_retired(target, "drop-1") == 4
    assert not (tmp_path / "t").exists()  # the manifest and the hive directory too
    assert delete_retired(target, "drop-1") == 0
    assert waiting_under(str(tmp_path)) == []


def test_a_drop_keeps_what_a_table_made_again_under_the_name_stages(tmp_path: Path) -> None:
    target = str(tmp_path / "t")
    stage_files(target, "j1", {0: [0]})
    commit(target, "j1", {0: 0}, "parquet", CommitMode.REPLACE)
    stage_files(target, "j2", {0: [0]})  # CREATE TABLE t again, running meanwhile
    drop(target, "drop-1")
    assert delete_retired(target, "drop-1") == 2
    assert Path(attempt_staging(target, "j2", 0, 0), "data_0.parquet").exists()
    commit(target, "j2", {0: 0}, "parquet", CommitMode.REPLACE)
    assert contents(tmp_path / "t") == ["p0 a0", "p0 a0 k1"]
    assert not (tmp_path / "t" / STAGING).exists()


def test_a_drop_s_files_waiting_are_carried_over_by_the_next_table_there(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "t")
    stage_files(target, "j1", {0: [0]})
    commit(target, "j1", {0: 0}, "parquet", CommitMode.REPLACE)
    drop(target, "drop-1")
    stage_files(target, "j2", {0: [0]})
    done = commit(target, "j2", {0: 0}, "parquet", CommitMode.REPLACE)
    assert len(done.retired) == 2 and all("part-j1-" in f for f in done.retired)
    assert delete_retired(target, "drop-1") == 0  # j2's release deletes them
    assert delete_retired(target, "j2") == 2
    assert contents(tmp_path / "t") == ["p0 a0", "p0 a0 k1"]


def test_abort_of_a_committed_job_keeps_its_files_and_removes_what_was_staged_after(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "out")
    stage_files(target, "j1", {0: [0], 1: [0]})
    commit(target, "j1", {0: 0, 1: 0}, "parquet", CommitMode.CREATE)
    stage_files(target, "j1", {0: [3]})  # a copy that finished after the commit
    abort(target, "j1")
    assert contents(tmp_path / "out") == ["p0 a0", "p0 a0 k1", "p1 a0", "p1 a0 k1"]
    assert not (tmp_path / "out" / STAGING).exists()


def test_abort_removes_files_a_failed_commit_moved(tmp_path: Path) -> None:
    target = str(tmp_path / "out")
    stage_files(target, "j1", {0: [0]})

    def crash() -> None:
        raise Crash

    with pytest.raises(Crash):
        commit(target, "j1", {0: 0}, "parquet", CommitMode.CREATE, after_intent=crash)
    intent = json.loads((tmp_path / "out" / STAGING / "j1" / INTENT).read_text())
    staged, final = intent["moves"][0]
    (tmp_path / "out" / STAGING / "j1" / staged).rename(tmp_path / "out" / final)
    abort(target, "j1")
    assert [p for p in (tmp_path / "out").rglob("*") if p.is_file()] == []


def crash_after_intent(target: str, job: str, winners: dict[int, int], mode: CommitMode) -> None:
    def crash() -> None:
        raise Crash

    with pytest.raises(Crash):
        commit(target, job, winners, "parquet", mode, after_intent=crash)


def test_a_replace_of_no_file_crashed_after_its_intent_still_replaces(tmp_path: Path) -> None:
    # A PARTITION_BY write of no rows stages no file: its intent moves nothing, and
    # only the manifest can say the commit took effect (whole-cluster simulation,
    # seed 3200004: the statement succeeded and the old rows stayed).
    target = str(tmp_path / "out")
    stage_files(target, "j1", {0: [0]})
    commit(target, "j1", {0: 0}, "parquet", CommitMode.CREATE)
    (Path(attempt_staging(target, "j2", 0, 0))).mkdir(parents=True)
    crash_after_intent(target, "j2", {0: 0}, CommitMode.REPLACE)
    assert contents(tmp_path / "out") == ["p0 a0", "p0 a0 k1"]  # not yet
    done = commit(target, "j2", {0: 0}, "parquet", CommitMode.REPLACE)
    assert done.files == () and len(done.retired) == 2
    assert contents(tmp_path / "out") == []
    # Run again: it took effect, and it stays so.
    assert commit(target, "j2", {0: 0}, "parquet", CommitMode.REPLACE).added == ()
    assert contents(tmp_path / "out") == []


def test_a_replace_run_again_after_a_later_commit_changes_nothing(tmp_path: Path) -> None:
    # A restarted scheduler commits its waiting jobs in its own order: j2's commit
    # took effect, its answer was lost, and j3's came first after the restart.
    # Seen again, j2 must not replace j3's rows (simulation seed 3200365: a replace
    # of no file wiped the rows of one that had succeeded).
    target = str(tmp_path / "out")
    for job, mode in (("j1", CommitMode.CREATE), ("j2", CommitMode.REPLACE)):
        stage_files(target, job, {0: [0]})
        commit(target, job, {0: 0}, "parquet", mode)
    stage_files(target, "j3", {0: [1]})
    commit(target, "j3", {0: 1}, "parquet", CommitMode.REPLACE)
    again = commit(target, "j2", {0: 0}, "parquet", CommitMode.REPLACE)
    assert again.added == ()
    assert contents(tmp_path / "out") == ["p0 a1", "p0 a1 k1"]
    assert manifest_files(target) == tuple(
        f"{target}/{f}"
        for f in ("k=1/part-j3-p00000-data_0.parquet", "part-j3-p00000-data_0.parquet")
    )
    assert delete_retired(target, "j3") == 4  # j1's and j2's, j3's history kept
    assert commit(target, "j2", {0: 0}, "parquet", CommitMode.REPLACE).added == ()
    assert commit(target, "j1", {0: 0}, "parquet", CommitMode.CREATE).added == ()
    assert contents(tmp_path / "out") == ["p0 a1", "p0 a1 k1"]


def test_an_append_run_from_its_intent_after_another_append_keeps_both(tmp_path: Path) -> None:
    # j2's intent was written before the crash; j3 committed first after it. j2's
    # manifest is built on j3's, not on the one j2's intent saw.
    target = str(tmp_path / "out")
    stage_files(target, "j1", {0: [0]})
    commit(target, "j1", {0: 0}, "parquet", CommitMode.CREATE)
    stage_files(target, "j2", {0: [0]})
    crash_after_intent(target, "j2", {0: 0}, CommitMode.APPEND)
    stage_files(target, "j3", {0: [1]})
    commit(target, "j3", {0: 1}, "parquet", CommitMode.APPEND, running={"j2"})
    commit(target, "j2", {0: 0}, "parquet", CommitMode.APPEND)
    assert contents(tmp_path / "out") == [
        "p0 a0",
        "p0 a0",
        "p0 a0 k1",
        "p0 a0 k1",
        "p0 a1",
        "p0 a1 k1",
    ]


def test_a_create_run_from_its_intent_after_another_create_conflicts(tmp_path: Path) -> None:
    target = str(tmp_path / "out")
    stage_files(target, "j1", {0: [0]})
    crash_after_intent(target, "j1", {0: 0}, CommitMode.CREATE)
    # Half its moves done before the crash.
    intent = json.loads((tmp_path / "out" / STAGING / "j1" / INTENT).read_text())
    staged, final = intent["moves"][0]
    (tmp_path / "out" / STAGING / "j1" / staged).rename(tmp_path / "out" / final)
    stage_files(target, "j2", {0: [1]})
    commit(target, "j2", {0: 1}, "parquet", CommitMode.CREATE, running={"j1"})
    with pytest.raises(WriteConflictError, match="j2"):
        commit(target, "j1", {0: 0}, "parquet", CommitMode.CREATE)
    abort(target, "j1")
    assert contents(tmp_path / "out") == ["p0 a1", "p0 a1 k1"]
    left = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.*"))
    assert left == [MANIFEST, "k=1/part-j2-p00000-data_0.parquet", "part-j2-p00000-data_0.parquet"]


# ------------------------------------------------------------------ state machine

TARGET = WriteTarget("/out/x", WriteFormat.PARQUET, S1, ("k", "v"), CommitMode.CREATE)


def write_plan(maps: int = 3) -> DistributedPlan:
    """Stage 1 writes (``maps`` tasks), stage 2 counts."""
    plan = two_stage_plan(maps, 1, InputMode.ALL)
    writing = dataclasses.replace(plan.stages[0], output=OutputSpec(OutputKind.SINGLE))
    count = Stage(
        id=S2,
        sql="SELECT sum(rows) AS Count FROM s1",
        output=OutputSpec(OutputKind.SINGLE),
        num_tasks=1,
        columns=("Count",),
        inputs=(StageInput("s1", S1, InputMode.ALL),),
    )
    return DistributedPlan((writing, count), ("Count",), write=TARGET)


def run_to_commit(h: Harness) -> list[object]:
    h.register(E1, 2)
    h.register(E2, 2)
    cmds = h.submit(write_plan())
    specs = {c.task.attempt: c for c in cmds if isinstance(c, LaunchTask)}
    assert all(c.task.sink is not None for c in specs.values())
    assert {c.task.sink.staging for c in specs.values() if c.task.sink} == {
        attempt_staging("/out/x", "j1", p, 0) for p in range(3)
    }
    out: list[object] = []
    for attempt, c in specs.items():
        out += h.complete(attempt, c.executor)
    launched = [c for c in out if isinstance(c, LaunchTask)]
    assert [c.task.sink for c in launched] == [None]  # the count
    return h.complete(launched[0].task.attempt, launched[0].executor)  # type: ignore[return-value]


def test_a_write_job_commits_its_winners_then_succeeds() -> None:
    h = Harness()
    cmds = run_to_commit(h)
    commits = [c for c in cmds if isinstance(c, CommitWrite)]
    assert commits == [CommitWrite(h.last_id, J1, TARGET, ((0, 0), (1, 0), (2, 0)))]
    assert not [c for c in cmds if isinstance(c, JobSucceeded)]
    # Committing: a cancel, or the loss of an executor, ends nothing.
    assert not [c for c in h.send(CancelRequested, J1, "cancelled") if isinstance(c, JobFailed)]
    lost = h.lose(E1)
    assert not [c for c in lost if isinstance(c, LaunchTask | JobFailed)]
    done = h.send(WriteCommitted, J1)
    assert [type(c) for c in done if isinstance(c, JobSucceeded)] == [JobSucceeded]
    # Its answer (the rows written) still names where it was made, lost or not:
    # the status carries it (the simulation's seed 2000053 succeeded without one).
    (succeeded,) = [c for c in done if isinstance(c, JobSucceeded)]
    assert len(succeeded.result) == 1 and succeeded.result[0].stage == S2
    assert h.send(WriteCommitted, J1) == []  # a late duplicate changes nothing


def test_a_commit_that_fails_fails_the_job_and_aborts() -> None:
    h = Harness()
    run_to_commit(h)
    cmds = h.send(WriteCommitFailed, J1, "disk full")
    assert [type(c) for c in cmds if isinstance(c, JobFailed | AbortWrite)] == [
        AbortWrite,
        JobFailed,
    ]


def test_a_failed_write_job_aborts_and_a_restart_commits_again() -> None:
    h = Harness()
    h.register(E1, 4)
    cmds = h.submit(write_plan())
    first = next(c for c in cmds if isinstance(c, LaunchTask))
    failed = h.fail(first.task.attempt, E1, QueryError("bad row"))
    assert [type(c) for c in failed if isinstance(c, AbortWrite | JobFailed)] == [
        AbortWrite,
        JobFailed,
    ]
    # A job restored while committing sends its commit again, with the same winners.
    h2 = Harness()
    run_to_commit(h2)
    progress = h2.state.export_job_head(J1)
    assert progress is not None and progress.commit == {0: 0, 1: 0, 2: 0}
    restored = JobRecord.restore(write_plan(), copy.deepcopy(h2.state._jobs[J1].progress()))
    assert restored.commit == {0: 0, 1: 0, 2: 0}
    again = h2.send(SchedulerRecovered)
    assert [c for c in again if isinstance(c, CommitWrite)] == [
        CommitWrite(h2.last_id, J1, TARGET, ((0, 0), (1, 0), (2, 0)))
    ]


def test_a_writing_attempt_that_ends_after_the_abort_has_its_files_removed() -> None:
    # Three writing attempts run; one fails the job. Another had finished before
    # its stop reached it, and staged its files after the abort: its report,
    # stale, removes them (the same AbortWrite again); other stale reports do not.
    h = Harness()
    h.register(E1, 4)
    launched = [c for c in h.submit(write_plan()) if isinstance(c, LaunchTask)]
    assert len(launched) == 3
    first, late = launched[0].task.attempt, launched[1].task.attempt
    failed = h.fail(first, E1, QueryError("bad row"))
    assert [c for c in failed if isinstance(c, AbortWrite)] == [AbortWrite(h.last_id, J1, TARGET)]
    again = h.complete(late, E1)
    assert [c for c in again if isinstance(c, AbortWrite)] == [AbortWrite(h.last_id, J1, TARGET)]
    # Not for an attempt of another stage, nor of a job that succeeded.
    other = TaskAttemptId(TaskId(J1, S2, 0), 0)
    assert not [c for c in h.complete(other, E1) if isinstance(c, AbortWrite)]
    # The store keeps where (a restarted scheduler removes a late attempt's files too).
    done = h.state.export_finished(J1)
    assert done is not None and done.write == TARGET
    assert decode(encode(done), FinishedJob) == done
    # A restart sends the abort again: the crash may have come between the
    # job's end, stored, and the abort (the simulation's seed 2000233).
    again = h.send(SchedulerRecovered)
    assert [c for c in again if isinstance(c, AbortWrite)] == [AbortWrite(h.last_id, J1, TARGET)]


def test_a_late_report_of_a_write_that_committed_removes_what_it_staged() -> None:
    # A copy that lost the race (or one a frozen executor finished) staged its
    # files after the commit removed the job's staging directory: its stale
    # report removes them (``output.abort`` keeps the committed files).
    h = Harness()
    run_to_commit(h)
    h.send(WriteCommitted, J1)
    done = h.state.export_finished(J1)
    assert done is not None and done.write == TARGET
    stale = TaskAttemptId(TaskId(J1, S1, 0), 1)
    assert [c for c in h.complete(stale, E1) if isinstance(c, AbortWrite)] == [
        AbortWrite(h.last_id, J1, TARGET)
    ]
    # A succeeded statement is not aborted again at a restart: its commit
    # removed its staging directory.
    assert not [c for c in h.send(SchedulerRecovered) if isinstance(c, AbortWrite)]
