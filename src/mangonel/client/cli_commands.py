"""The client commands of ``mangonel``: sql, explain, register, tables, status, jobs,
cancel, certs, demo (``users``: ``security.users_cli``).

Each ``cmd_*`` takes the parsed arguments and returns the exit code; the entry
point (``client.cli``) turns a ``MangonelError`` into one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mangonel import defaults, textfiles
from mangonel.client import render
from mangonel.client.progress import ProgressBar
from mangonel.client.session import Result, Session
from mangonel.client.shell import read_statements, strip_statement
from mangonel.client.status import ExecutorState, ExecutorStatus, JobStatus
from mangonel.errors import MangonelError
from mangonel.security import options as security
from mangonel.task import FileFormat

if TYPE_CHECKING:
    import pyarrow as pa


class UsageError(MangonelError):
    """The command line is wrong."""


def one_line(exc: BaseException) -> str:
    """An error as ``mangonel`` prints it: ``error: MESSAGE`` on one line."""
    message = re.sub(r"\s*\n\s*", " ", str(exc)).strip() or type(exc).__name__
    return f"error: {message}"


# ---------------------------------------------------------------------- parsers


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the client commands' parsers to ``mangonel``'s subcommands."""
    _query_parsers(sub)
    _catalog_parsers(sub)
    _cluster_parsers(sub)
    _demo_parser(sub)
    _certs_parser(sub)


def _query_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sql`` and ``explain``."""
    p = sub.add_parser(
        "sql",
        help="run a query",
        description="Run one query and print "
        "its result. Without QUERY or -f, read stdin, or open an interactive "
        "shell on a terminal (end statements with ';', quit with \\q).",
    )
    p.add_argument("query", nargs="?", help="the SQL text")
    p.add_argument("-f", "--file", help="read the query from this file")
    p.add_argument("--dialect", help="sqlglot dialect of the query (default: duckdb)")
    p.add_argument("--max-rows", type=int, default=render.MAX_ROWS, help="rows to print")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="give up (and cancel the query) after this long, waits for a cut network "
        "included; default: wait as long as the query runs, and for a scheduler that "
        "stops answering, 60 s",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--stages",
        action="store_true",
        help="after the result, print what each stage ran (EXPLAIN ANALYZE-style): tasks "
        "done (and the planned count where adaptive execution ran fewer), rows and bytes "
        "out, time; and where its tasks' time went: launch, setup, fetch, execute, write, "
        "report back (summed over the tasks), the slowest task against the median, bytes "
        "fetched over the network",
    )

    p = sub.add_parser(
        "explain",
        help="show a query's distributed plan",
        description="Print the stages, exchanges and SQL fragments of a query.",
    )
    p.add_argument("query", nargs="?", help="the SQL text")
    p.add_argument("-f", "--file", help="read the query from this file")
    p.add_argument("--dialect", help="sqlglot dialect of the query (default: duckdb)")
    p.add_argument(
        "--picture",
        metavar="FILE",
        help="also draw the stage graph into FILE (.svg; .png needs Graphviz's dot)",
    )
    p.add_argument(
        "--web",
        metavar="URL",
        default=os.environ.get("MANGONEL_WEB"),
        help="the scheduler's web API, for --picture (default: $MANGONEL_WEB or "
        f"http://<scheduler host>:{defaults.WEB_PORT})",
    )


def _catalog_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``register`` and ``tables``."""
    p = sub.add_parser(
        "register",
        help="register a Parquet, CSV or JSON table",
        description="Register a file, directory, glob or s3:// location of Parquet, CSV or\n"
        "newline-delimited JSON files as a table. A CSV or JSON table's columns are\n"
        "declared with --column, or inferred once from the start of its first file."
        "\n\noptions of a CSV or JSON table (--option KEY=VALUE):\n"
        + "\n".join(f"  {k}: {v}" for k, v in textfiles.OPTIONS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", help="table name")
    p.add_argument("path", help="file, directory, glob or s3:// location (read by the cluster)")
    p.add_argument(
        "--format",
        choices=[f.value for f in FileFormat],
        default=FileFormat.PARQUET.value,
        help="how the files are written (default %(default)s)",
    )
    p.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of a CSV or JSON table, e.g. delimiter='|' or header=false (repeatable)",
    )
    p.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="NAME:TYPE",
        help="a declared column and its DuckDB type, in file order (repeatable), "
        "e.g. --column l_orderkey:BIGINT",
    )

    sub.add_parser("tables", help="list the tables", description="List the registered tables.")


def _cluster_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``status``, ``jobs`` and ``cancel``."""
    sub.add_parser(
        "status",
        help="show executors and jobs",
        description="Show the executors (alive, draining, lost: since when and why) and the jobs.",
    )
    p = sub.add_parser(
        "jobs",
        help="list the jobs",
        description="List the jobs: state, progress, time, rows, re-runs and the query.",
    )
    p = sub.add_parser("cancel", help="cancel a job", description="Cancel a running job.")
    p.add_argument("job", help="job id (see `mangonel status`)")


def _demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="run TPC-H q12 on a fresh local cluster",
        description="Generate TPC-H SF 0.1 (cached), start a local cluster of "
        f"{defaults.LOCAL_EXECUTORS} executors, run TPC-H q12 and show how it ran.",
    )
    p.add_argument(
        "--kill",
        action="store_true",
        help="SIGKILL one executor half-way through q12 and show how the query recovers",
    )
    p.add_argument(
        "--cache-dir",
        default=os.path.expanduser("~/.cache/mangonel/tpch-sf0.1"),
        help="where the TPC-H data is generated (default: %(default)s)",
    )
    p.add_argument("--executors", type=int, default=defaults.LOCAL_EXECUTORS)
    p.add_argument(
        "--secure",
        action="store_true",
        help="run it on a secured cluster: TLS on every channel, signed tickets",
    )


def _certs_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "certs",
        help="make a secured cluster's CA, certificates and secret",
        description="Make the files that secure a cluster (`certs init DIR`): a new CA, "
        "the certificate of the scheduler(s) and executors and a cluster secret in "
        "DIR/cluster (copy it to the cluster's machines: --tls-dir DIR/cluster), and the "
        "CA's certificate in DIR/client (all a client needs: --tls-dir DIR/client). Keep "
        "DIR/ca-key.pem off every machine once done.",
    )
    certs_sub = p.add_subparsers(dest="certs_command", metavar="ACTION", required=True)
    c = certs_sub.add_parser(
        "init",
        help="make a new CA, the node certificate and a cluster secret in DIR",
        description="Make ca.pem and ca-key.pem in DIR; ca.pem, node.pem, node-key.pem and "
        "cluster-secret in DIR/cluster (the scheduler's and executors'); ca.pem in "
        "DIR/client (the clients'). Keys and secret have mode 0600.",
    )
    c.add_argument("dir", metavar="DIR", help="directory to write (created if missing)")
    c.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name or IP address the scheduler or an executor is reached at "
        "(repeatable); localhost, 127.0.0.1 and ::1 are always included. A peer refuses "
        "a certificate that does not name the host it dialled",
    )
    c.add_argument(
        "--days", type=float, default=365, help="validity of the certificates (default 365)"
    )
    c.add_argument("--force", action="store_true", help="overwrite a CA already in DIR")


# ---------------------------------------------------------------------- commands


def _query_text(args: argparse.Namespace) -> str | None:
    if args.query and args.file:
        raise UsageError("give the query as an argument or with -f, not both")
    if args.file:
        try:
            with open(args.file) as f:
                return f.read()
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    if args.query:
        return str(args.query)
    if not sys.stdin.isatty():
        return sys.stdin.read()
    return None


def _client_security(args: argparse.Namespace) -> security.SecurityOptions | None:
    """The TLS a client command speaks: the CA of ``--tls-ca``, else of ``--tls-dir``."""
    tls_ca = getattr(args, "tls_ca", None)
    if tls_ca:
        return security.SecurityOptions(tls_ca=tls_ca)
    tls_dir = getattr(args, "tls_dir", None)
    return security.SecurityOptions.from_tls_dir(tls_dir, "client") if tls_dir else None


def _session(args: argparse.Namespace) -> Session:
    """A session with ``--scheduler`` as ``--user`` (or with ``--token``), if given,
    over TLS under ``--tls-ca`` (or ``--tls-dir``'s CA), waiting ``--connect-wait`` for
    a scheduler that is not there yet (said once on stderr)."""
    given = _client_security(args)
    if args.user:
        password = os.environ.get("MANGONEL_PASSWORD")
        if password is None:
            if not sys.stdin.isatty():
                raise UsageError(
                    f"no password for user {args.user}: set $MANGONEL_PASSWORD, or run on a "
                    "terminal to be asked"
                )
            import getpass

            password = getpass.getpass(f"password for {args.user}: ")
    else:
        password = None
    return Session(
        args.scheduler,
        security=given,
        user=args.user or None,
        password=password,
        token=None if args.user else (args.token or None),
        connect_wait_s=args.connect_wait,
        on_wait=_tell_waiting,
    )


def _tell_waiting(line: str) -> None:
    # Said once, so that a wrong address is not a silent wait.
    print(f"mangonel: {line}; Ctrl-C to stop, --connect-wait to change", file=sys.stderr)


def _print_result(result: Result, max_rows: int, stages: bool = False) -> None:
    print(render.format_table(result.to_arrow(), max_rows))
    noun = "row" if result.num_rows == 1 else "rows"
    print(f"{result.num_rows} {noun} in {result.elapsed_s:.2f} s", file=sys.stderr)
    if stages and result.stages:
        print(render.format_stages(result.stages))
        if any(s.phases is not None for s in result.stages):
            print("\nwhere the tasks' time went (seconds, summed over each stage's tasks):")
            print(render.format_phases(result.stages))


def _run_query(session: Session, query: str, args: argparse.Namespace) -> Result:
    show = sys.stderr.isatty() if args.progress is None else args.progress
    if not show:
        return session.sql(query, args.dialect, timeout_s=args.timeout)
    bar = ProgressBar(sys.stderr)
    try:
        return session.sql(query, args.dialect, on_progress=bar.update, timeout_s=args.timeout)
    finally:
        bar.clear()


def cmd_sql(args: argparse.Namespace) -> int:
    text = _query_text(args)
    with _session(args) as session:
        if text is not None:
            query = strip_statement(text)
            if not query:
                raise UsageError("the query is empty")
            _print_result(_run_query(session, query, args), args.max_rows, args.stages)
            return 0
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
        print(
            f"connected to {args.scheduler}; end statements with ';', quit with \\q",
            file=sys.stderr,
        )
        for statement in read_statements():
            try:
                _print_result(_run_query(session, statement, args), args.max_rows, args.stages)
            except MangonelError as exc:
                print(one_line(exc), file=sys.stderr)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    text = _query_text(args)
    if text is None or not strip_statement(text):
        raise UsageError('give a query: mangonel explain "SELECT ..." or -f FILE')
    query = strip_statement(text)
    if args.picture:
        _draw_plan(query, args)
        print(f"stage graph written to {args.picture}", file=sys.stderr)
    with _session(args) as session:
        print(session.explain(query, args.dialect))
    return 0


def _web_url(args: argparse.Namespace) -> str:
    if args.web:
        return str(args.web).rstrip("/")
    host = str(args.scheduler).rsplit(":", 1)[0] or "127.0.0.1"
    scheme = "https" if _client_security(args) is not None else "http"
    return f"{scheme}://{host}:{defaults.WEB_PORT}"


def _draw_plan(query: str, args: argparse.Namespace) -> None:
    """Plan the query through the scheduler's REST API and draw its stages."""
    import json
    import urllib.error
    import urllib.request

    from mangonel.web.models import ExplainModel
    from mangonel.web.picture import render as draw

    url = f"{_web_url(args)}/api/explain"
    body = json.dumps({"sql": query, "dialect": args.dialect}).encode()
    headers = {"Content-Type": "application/json"}
    token = args.token
    if args.user:  # the web API takes the token a gRPC login gives
        with _session(args) as session:
            session.log_in()
            token = session.token
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    context = None
    given = _client_security(args)
    if given is not None:  # a secured cluster's web API: HTTPS under the cluster CA
        import ssl

        context = ssl.create_default_context(cafile=given.tls_ca)
    try:
        with urllib.request.urlopen(request, timeout=60, context=context) as response:
            plan = ExplainModel.model_validate_json(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError, KeyError, TypeError):
            detail = json.loads(detail)["detail"]
        raise MangonelError(str(detail)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise MangonelError(
            f"cannot reach the scheduler's web API at {url} ({exc}); --picture needs it: "
            "give its URL with --web or $MANGONEL_WEB"
        ) from None
    draw(plan.stages, args.picture)


def cmd_certs(args: argparse.Namespace) -> int:
    from mangonel.security.certs import CertsExistError, init_cluster

    try:
        written = init_cluster(args.dir, args.host, days=args.days, force=args.force)
    except CertsExistError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write {args.dir}: {exc.strerror}") from None
    print(f"wrote {len(written)} files to {args.dir}:")
    for path in written:
        print(f"  {path}")
    names = ", ".join(["localhost", "127.0.0.1", "::1", *args.host])
    cluster, client = os.path.join(args.dir, "cluster"), os.path.join(args.dir, "client")
    print(
        f"the node certificate names {names}.\n"
        f"  scheduler(s) and executors: copy {cluster} to them, start them with "
        f"--tls-dir {cluster}\n"
        f"  clients: copy {client} (the CA's certificate alone) to them: `mangonel "
        f"--tls-dir {client} --user NAME ...`; they log in with a password or token\n"
        f"  keep {os.path.join(args.dir, 'ca-key.pem')} off every machine: it signs "
        "certificates"
    )
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    with _session(args) as session:
        info = session.register(
            args.name,
            args.path,
            args.format,
            [_pair(c, ":", "--column", "NAME:TYPE") for c in args.column],
            **dict(_pair(o, "=", "--option", "KEY=VALUE") for o in args.option),
        )
    estimated = "" if info.format == FileFormat.PARQUET.value else "about "
    print(
        f"registered {info.name}: {estimated}{info.rows} rows, {len(info.columns)} columns, "
        f"{len(info.files)} files"
    )
    return 0


def _pair(text: str, sep: str, option: str, form: str) -> tuple[str, str]:
    key, found, value = text.partition(sep)
    if not found or not key.strip():
        raise UsageError(f"{option} takes {form}, got {text!r}")
    return key.strip(), value.strip()


def cmd_tables(args: argparse.Namespace) -> int:
    import pyarrow as pa

    with _session(args) as session:
        tables = session.tables()
        unreadable = session.unreadable_tables()
    for kept in unreadable:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(kept.since))
        print(
            f"{kept.name}: cannot be read now (since {since} UTC), at {kept.location}: "
            f"{kept.error}; the scheduler reads it again every few seconds",
            file=sys.stderr,
        )
    if not tables:
        if not unreadable:
            print("no tables; register one with `mangonel register NAME PATH`")
        return 0
    print(
        render.format_table(
            pa.table(
                {
                    "name": [t.name for t in tables],
                    "rows": [t.rows for t in tables],
                    "columns": [len(t.columns) for t in tables],
                    "files": [len(t.files) for t in tables],
                    "location": [t.location for t in tables],
                }
            ),
            max_rows=len(tables),
        )
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import pyarrow as pa

    with _session(args) as session:
        status = session.status()
    now = time.time()
    print(f"scheduler {status.scheduler_address or args.scheduler}")
    ex = status.executors
    print(
        render.format_table(
            pa.table(
                {
                    "executor": [e.id for e in ex],
                    "state": [e.state.value for e in ex],
                    "since": [f"{max(0.0, now - e.since):.0f} s ago" for e in ex],
                    "why": [_why(e) for e in ex],
                    "flight": [e.flight_address for e in ex],
                    "pid": [e.pid for e in ex],
                    "slots": [e.slots for e in ex],
                    "running": [e.running_tasks for e in ex],
                }
            ),
            max_rows=len(ex) or 1,
        )
    )
    jobs = status.jobs
    if jobs:
        print()
        print(
            render.format_table(
                pa.table(
                    {
                        "job": [j.job_id for j in jobs],
                        "state": [j.state.value for j in jobs],
                        "stages done": [
                            f"{sum(s.tasks_done >= s.tasks_total for s in j.stages)}"
                            f"/{len(j.stages)}"
                            for j in jobs
                        ],
                        "time": [f"{j.elapsed_s:.2f} s" for j in jobs],
                        "re-run": [j.tasks_rerun for j in jobs],
                        "recomputed": [j.outputs_recomputed for j in jobs],
                        "query": [" ".join(j.sql.split())[:60] for j in jobs],
                    }
                ),
                max_rows=len(jobs),
            )
        )
    return 0


def _why(e: ExecutorStatus) -> str:
    """Why an executor left (or, while it is alive, how long it has been silent
    or why it takes no task)."""
    if e.state in (ExecutorState.ALIVE, ExecutorState.DRAINING) and e.unhealthy:
        return f"unhealthy: {e.unhealthy}"
    if e.state in (ExecutorState.ALIVE, ExecutorState.DRAINING) and e.heartbeat_age_s >= 2:
        silent = f"silent for {e.heartbeat_age_s:.0f} s"
        return " - ".join(x for x in (silent, e.detail) if x)
    if e.state is ExecutorState.ALIVE and e.slow_link_since is not None:
        since = time.strftime("%H:%M:%S", time.localtime(e.slow_link_since))
        until = time.strftime("%H:%M:%S", time.localtime(e.slow_link_until or 0.0))
        mark = f"slow link since {since}: no new task until {until}"
        return " - ".join(x for x in (mark, e.slow_link) if x)
    if e.state is ExecutorState.ALIVE and e.lagging_since is not None:
        since = time.strftime("%H:%M:%S", time.localtime(e.lagging_since))
        return (
            f"lagging since {since}: its commands are held up (a cut link's retries?), "
            "no new task, its tasks copied"
        )
    return " - ".join(x for x in (e.reason, e.detail) if x)


def cmd_jobs(args: argparse.Namespace) -> int:
    with _session(args) as session:
        jobs = sorted(session.status().jobs, key=lambda j: j.submitted_at, reverse=True)
    if not jobs:
        print("no jobs; run one with `mangonel sql`")
        return 0
    print(render.format_table(jobs_table(jobs), max_rows=len(jobs)))
    return 0


def jobs_table(jobs: Sequence[JobStatus]) -> pa.Table:
    """The jobs as a table: id, state, progress, time, rows, re-runs, query."""
    import pyarrow as pa

    def progress(j: JobStatus) -> str:
        total = sum(s.tasks_total for s in j.stages)
        done = sum(min(s.tasks_done, s.tasks_total) for s in j.stages)
        return f"{done}/{total} tasks"

    return pa.table(
        {
            "job": [j.job_id for j in jobs],
            "state": [j.state.value for j in jobs],
            "submitted": [time.strftime("%H:%M:%S", time.localtime(j.submitted_at)) for j in jobs],
            "time": [f"{j.elapsed_s:.2f} s" for j in jobs],
            "progress": [progress(j) for j in jobs],
            "rows": [j.stages[-1].rows if j.stages else 0 for j in jobs],
            "re-run": [j.tasks_rerun for j in jobs],
            "recomputed": [j.outputs_recomputed for j in jobs],
            "query": [" ".join(j.sql.split())[:60] for j in jobs],
        }
    )


def cmd_cancel(args: argparse.Namespace) -> int:
    with _session(args) as session:
        cancelled = session.cancel(args.job)
    print(f"job {args.job} cancelled" if cancelled else f"job {args.job} had already finished")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from mangonel.client.demo import run_demo

    return run_demo(
        args.cache_dir, args.executors, args.log_level, kill=args.kill, secure=args.secure
    )
