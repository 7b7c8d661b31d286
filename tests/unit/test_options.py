"""The option table (``mangonel.options``): every parser, config and ``LocalCluster``
command line is built from it, so each option is declared once.

No processes but ``mangonel --help`` itself: parsers and configs are built in memory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

import pytest

from mangonel import options
from mangonel.client.cli import build_parser
from mangonel.executor import main as executor_main
from mangonel.executor.config import ExecutorConfig
from mangonel.options import OPTIONS, TEST_HOOKS_ENV, Group, Takes
from mangonel.plan.planner import PlannerConfig
from mangonel.scheduler.core import CoreConfig
from mangonel.scheduler.events import Limits
from mangonel.scheduler.main import SchedulerConfig

SERVERS = (Takes.SCHEDULER, Takes.EXECUTOR, Takes.STANDALONE)


@pytest.fixture()
def no_option_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment variables that give options defaults, unset."""
    for o in OPTIONS:
        if o.env is not None:
            monkeypatch.delenv(o.env, raising=False)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def _parsers() -> list[tuple[str, Takes, argparse.ArgumentParser]]:
    """Every parser built from the table, and the process it is of."""
    cli = build_parser()
    return [
        ("mangonel", Takes.CLIENT, cli),
        ("mangonel scheduler", Takes.SCHEDULER, _subparser(cli, "scheduler")),
        ("mangonel executor", Takes.EXECUTOR, _subparser(cli, "executor")),
        ("mangonel standalone", Takes.STANDALONE, _subparser(cli, "standalone")),
        ("python -m mangonel.executor.main", Takes.EXECUTOR, executor_main.build_parser()),
    ]


@pytest.mark.usefixtures("no_option_env")
def test_every_option_is_in_each_parser_of_its_processes_with_its_default() -> None:
    assert os.environ.get(TEST_HOOKS_ENV) == "1"  # conftest: the test-only ones too
    checked = set()
    for name, process, parser in _parsers():
        actions = parser._option_string_actions
        for o in options.options_of(process):
            if name == "mangonel executor" and o.dest == "scheduler":
                continue  # the global --scheduler, repeated after the command below
            assert o.flag in actions, f"{name} lacks {o.flag}"
            action = actions[o.flag]
            assert action.dest == o.dest, (name, o.flag)
            expected = [] if o.repeat else o.default_for(process)
            if o.keep_earlier:
                expected = argparse.SUPPRESS
            assert action.default == expected, (name, o.flag, action.default, expected)
            for alias in o.aliases:
                assert actions[alias] is action
            checked.add(o)
    assert checked == set(OPTIONS)


def test_a_flag_means_one_thing_in_each_process() -> None:
    for process in Takes:
        taken = options.options_of(process)
        flags = [f for o in taken for f in (o.flag, *o.aliases)]
        assert len(flags) == len(set(flags)), process
        dests = [o.dest for o in taken]
        assert len(dests) == len(set(dests)), process
    # The executor's --host is the interface it listens on, as the scheduler's is;
    # the host it reports is --host-id.
    assert options.option(Takes.EXECUTOR, "bind_host").flag == "--host"
    assert options.option(Takes.SCHEDULER, "host").flag == "--host"
    assert options.option(Takes.EXECUTOR, "host_id").flag == "--host-id"


def _fields(cls: Any) -> dict[str, Any]:
    import dataclasses

    found = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            found[f.name] = f.default
    return found


def test_the_configs_defaults_are_the_tables() -> None:
    scheduler = _fields(SchedulerConfig)
    groups = {
        Group.PLANNER: _fields(PlannerConfig),
        Group.LIMITS: _fields(Limits),
        Group.CORE: _fields(CoreConfig),
    }
    compared = 0
    for o in options.options_of(Takes.SCHEDULER):
        if o.resolved or o.repeat:
            continue
        assert o.dest in scheduler, f"SchedulerConfig has no field {o.dest} ({o.flag})"
        assert scheduler[o.dest] == o.default, o.flag
        if o.group is not Group.SERVER:
            assert groups[o.group][o.dest] == o.default, (o.group, o.flag)
        compared += 1
    executor = _fields(ExecutorConfig)
    for o in options.options_of(Takes.EXECUTOR):
        if o.dest == "scheduler" or o.default is None:
            continue  # scheduler_address; or a default the config computes (cores, hostname)
        assert executor[o.dest] == o.default, o.flag
        compared += 1
    assert compared > 40


def test_the_scheduler_config_of_a_command_line_reaches_the_planner_and_limits() -> None:
    args = build_parser().parse_args(
        ["scheduler", "--split-rows", "1000", "--max-task-attempts", "7", "--plan-cache", "3"]
        + ["--no-adaptive", "--grace", "12", "--write-root", "/a", "--write-root", "/b"]
    )
    config = SchedulerConfig(**options.values(args, Takes.SCHEDULER))
    core = config.core_config()
    assert core.planner.split_rows == 1000
    assert core.limits.max_task_attempts == 7
    assert core.limits.adaptive is False
    assert core.limits.no_executor_grace_s == 12.0
    assert core.plan_cache == 3
    assert config.write_roots == ("/a", "/b")


def test_to_argv_gives_back_what_values_read() -> None:
    settings = {
        "heartbeat_timeout_s": 2.5,
        "speculation": False,
        "split_rows": 500,
        "write_roots": ("/x", "/y"),
        "crash_file": "/tmp/crash.json",
    }
    argv = options.to_argv(Takes.SCHEDULER, settings)
    args = build_parser().parse_args(["scheduler", *argv])
    assert {k: v for k, v in options.values(args, Takes.SCHEDULER).items() if k in settings} == (
        settings
    )
    with pytest.raises(KeyError, match="no option of EXECUTOR fills 'split_rows'"):
        options.to_argv(Takes.EXECUTOR, {"split_rows": 1})


def test_both_executor_entry_points_make_the_same_config() -> None:
    argv = ["--scheduler", "10.0.0.1:50052", "--host", "0.0.0.0", "--advertise-host", "e1"]
    argv += ["--port", "7000", "--host-id", "rack-1", "--slots", "3", "--work-dir", "/w"]
    argv += ["--fetch-timeout", "4.5", "--s3-region", "eu-west-1"]
    via_main = executor_main.parse_args(argv)
    via_cli = ExecutorConfig.from_args(build_parser().parse_args(["executor", *argv]))
    assert via_main == via_cli
    assert (via_cli.bind_host, via_cli.flight_port, via_cli.host_id) == ("0.0.0.0", 7000, "rack-1")
    assert via_cli.scheduler_address == "10.0.0.1:50052"
    assert via_cli.fetch_timeout_s == 4.5 and via_cli.storage.region == "eu-west-1"
    # The global --scheduler, before the command, reaches the executor too.
    args = build_parser().parse_args(["--scheduler", "s:1", "executor"])
    assert ExecutorConfig.from_args(args).scheduler_address == "s:1"


def _help(*command: str, hooks: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != TEST_HOOKS_ENV}
    if hooks:
        env[TEST_HOOKS_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-m", "mangonel", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_help_shows_no_test_hook_and_production_refuses_them() -> None:
    hooks = {o.flag for o in OPTIONS if o.test_only}
    assert hooks == {"--faults-file", "--crash-file"}
    for command in ("scheduler", "executor", "standalone"):
        shown = _help(command, "--help", hooks=False)
        assert shown.returncode == 0, shown.stderr
        assert "--work-dir" in shown.stdout or command == "scheduler"
        for flag in hooks:
            assert flag not in shown.stdout, (command, flag)
        # Taken with the hooks on (the test clusters), still not shown.
        text = _subparser(build_parser(), command).format_help()
        assert "--port" in text
        assert not any(flag in text for flag in hooks), command
    refused = _help("executor", "--faults-file", "/tmp/rules.json", hooks=False)
    assert refused.returncode == 2
    assert "unrecognized arguments: --faults-file" in refused.stderr
    # With the hooks on (as in the test clusters), the same command line parses.
    args = build_parser().parse_args(["executor", "--faults-file", "/tmp/rules.json"])
    assert ExecutorConfig.from_args(args).faults_file == "/tmp/rules.json"
