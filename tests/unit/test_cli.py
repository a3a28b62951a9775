"""The `prq` command line without Redis: help, where options come from, and bad input.

Options are resolved by the real (typer) command: flag, else `PRQ_*` variable, else default.
Commands that would need Redis are stopped by their input checks before they connect.
"""

from __future__ import annotations

import functools
import io
import re
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from prq import PickupTimeout, RemoteError, ServerError
from prq.cli import app
from prq.cli.api import dashboard_url
from prq.cli.call import CallSummary, exit_code_for, parse_params, pickup_timeout_s
from prq.cli.options import EXIT_FAILED, EXIT_OK, EXIT_RETRYABLE, EXIT_USAGE, redact_url
from prq.cli.stats import Snapshot, format_age, render
from prq.cli.worker_handler import is_coroutine_handler, load_handler
from prq.core.config import QueueSettings
from prq.core.defaults import DEFAULT_PICKUP_TIMEOUT_S
from prq.core.errors import QueueUnavailable
from prq.ops.answers import EndpointInfo, RedisHealth

COMMANDS = ("worker", "call", "stats", "limits", "dead-letters", "api", "demo", "bench")
#: A URL nothing listens on: commands must refuse bad input before they connect.
NOWHERE = "redis://127.0.0.1:9/0"


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """A runner in an environment without PRQ_* variables."""
    import os

    for name in [n for n in os.environ if n.startswith("PRQ_")]:
        monkeypatch.delenv(name)
    return CliRunner()


def flat(output: str) -> str:
    """Output with rich's box drawing removed and whitespace collapsed (messages wrap)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", output).split())


def params(monkeypatch: pytest.MonkeyPatch, command: str, args: list[str], **env: str) -> Any:
    """The parameters `prq <command> <args>` resolves, with `env` set (nothing else PRQ_*)."""
    import os

    for name in [n for n in os.environ if n.startswith("PRQ_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    group = get_command(app)
    ctx = group.commands[command].make_context(command, list(args))  # type: ignore[attr-defined]
    return ctx.params


# -- help -----------------------------------------------------------------------------------------


def test_prq_help_lists_every_command(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in COMMANDS:
        assert command in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_naming_its_environment_variables(
    runner: CliRunner, command: str
) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: prq " + command in result.output
    if command != "bench":
        assert "PRQ_REDIS_URL" in result.output
    assert "env var" in result.output


@pytest.mark.parametrize("command", [*COMMANDS, "endpoints forget"])
def test_help_at_80_columns_names_every_environment_variable_whole(
    runner: CliRunner, command: str
) -> None:
    # Given a terminal 80 columns wide, when a command's help is shown
    words = command.split()
    result = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "80"})
    # Then every environment variable its options read is printed whole (not cut by a table)
    found: Any = get_command(app)
    for word in words:
        found = found.commands[word]
    names = [
        name
        for param in found.params
        for name in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or [])
    ]
    assert names, command
    shown = set(re.findall(r"PRQ_[A-Z0-9_]+", result.output))
    assert set(names) <= shown, sorted(set(names) - shown)
    assert "…" not in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80


def test_no_arguments_shows_help(runner: CliRunner) -> None:
    result = runner.invoke(app, [])
    assert "Usage: prq" in result.output


# -- flag, else environment, else default ---------------------------------------------------------

PRECEDENCE = [
    ("worker", ["m:f"], "--concurrency", "PRQ_WORKER_CONCURRENCY", "concurrency", 1, "3", "5"),
    ("worker", ["m:f"], "--shutdown-timeout", "PRQ_WORKER_SHUTDOWN_TIMEOUT_S",
     "shutdown_timeout", 10.0, "2.5", "4"),
    ("worker", ["m:f"], "--prefix", "PRQ_PREFIX", "prefix", "prq", "env-p", "flag-p"),
    ("worker", ["m:f"], "--url", "PRQ_REDIS_URL", "url", None, "redis://env:1/0",
     "redis://flag:2/0"),
    ("call", ["e", "m"], "--timeout", "PRQ_CALL_TIMEOUT_S", "timeout", 60.0, "7", "9"),
    ("call", ["e", "m"], "--pickup-timeout", "PRQ_PICKUP_TIMEOUT_S", "pickup_timeout",
     None, "1.5", "2.5"),
    ("call", ["e", "m"], "--count", "PRQ_CALL_COUNT", "count", 1, "10", "20"),
    ("stats", [], "--watch", "PRQ_STATS_WATCH_S", "watch", None, "2.0", "3.0"),
    ("api", [], "--port", "PRQ_API_PORT", "port", 8080, "8081", "8082"),
    ("api", [], "--host", "PRQ_API_HOST", "host", "127.0.0.1", "0.0.0.0", "::1"),
    ("demo", [], "--duration", "PRQ_DEMO_DURATION_S", "duration", 10.0, "3", "4"),
    ("demo", [], "--spark-rows", "PRQ_DEMO_SPARK_ROWS", "spark_rows", 200_000, "30", "40"),
    ("bench", [], "--calls", "PRQ_BENCH_CALLS", "calls", 10_000, "50", "60"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "args", "flag", "env", "name", "default", "from_env", "from_flag"),
    PRECEDENCE,
    ids=[f"{row[0]} {row[2]}" for row in PRECEDENCE],
)
def test_a_flag_beats_the_environment_which_beats_the_default(
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    args: list[str],
    flag: str,
    env: str,
    name: str,
    default: object,
    from_env: str,
    from_flag: str,
) -> None:
    kind: Any = type(default) if default is not None else (str if name == "url" else float)
    assert params(monkeypatch, command, args)[name] == default
    assert params(monkeypatch, command, args, **{env: from_env})[name] == kind(from_env)
    flagged = params(monkeypatch, command, [*args, flag, from_flag], **{env: from_env})
    assert flagged[name] == kind(from_flag)


def test_call_waits_for_pickup_as_long_as_the_queue_settings_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given only PRQ_PICKUP_TIMEOUT_S (the library's own setting), Then `prq call` uses it
    flag = params(monkeypatch, "call", ["e", "m"], PRQ_PICKUP_TIMEOUT_S="0.75")["pickup_timeout"]
    assert pickup_timeout_s(flag, QueueSettings()) == 0.75
    # Given the flag as well, Then the flag wins
    flag = params(
        monkeypatch, "call", ["e", "m", "--pickup-timeout", "4"], PRQ_PICKUP_TIMEOUT_S="0.75"
    )["pickup_timeout"]
    assert pickup_timeout_s(flag, QueueSettings()) == 4.0
    # Given neither, Then the queue settings' value applies (no default of the CLI's own)
    flag = params(monkeypatch, "call", ["e", "m"])["pickup_timeout"]
    assert flag is None
    assert pickup_timeout_s(flag, QueueSettings()) == DEFAULT_PICKUP_TIMEOUT_S
    assert pickup_timeout_s(flag, QueueSettings(pickup_timeout_s=9)) == 9.0
    # And the CLI-only name it once had is not read
    stale = params(monkeypatch, "call", ["e", "m"], PRQ_CALL_PICKUP_TIMEOUT_S="0.75")
    assert stale["pickup_timeout"] is None


def test_worker_endpoints_and_facade_come_from_flags_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not params(monkeypatch, "worker", ["m:f"])["endpoint"]
    from_env = params(monkeypatch, "worker", ["m:f"], PRQ_WORKER_ENDPOINTS="poll://a poll://b")
    assert list(from_env["endpoint"]) == ["poll://a", "poll://b"]
    flagged = params(
        monkeypatch, "worker", ["m:f", "-e", "poll://c"], PRQ_WORKER_ENDPOINTS="poll://a"
    )
    assert list(flagged["endpoint"]) == ["poll://c"]
    assert params(monkeypatch, "worker", ["m:f"])["sync"] is None
    assert params(monkeypatch, "worker", ["m:f"], PRQ_WORKER_SYNC="1")["sync"] is True
    assert params(monkeypatch, "worker", ["m:f", "--async"], PRQ_WORKER_SYNC="1")["sync"] is False
    handler = params(monkeypatch, "worker", [], PRQ_WORKER_HANDLER="pkg.mod:fn")["handler"]
    assert handler == "pkg.mod:fn"


def test_verbose_comes_from_the_flag_or_the_environment(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = get_command(app)
    assert group.make_context("prq", ["stats"]).params["verbose"] is False
    monkeypatch.setenv("PRQ_VERBOSE", "1")
    assert group.make_context("prq", ["stats"]).params["verbose"] is True


# -- commands that need the shared Redis ----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "prq.demo.handlers:handle", "-e", "poll://a"],
        ["call", "poll://a", "echo"],
        ["stats"],
        ["api"],
    ],
    ids=["worker", "call", "stats", "api"],
)
def test_commands_on_the_shared_redis_refuse_to_run_without_a_url(
    runner: CliRunner, argv: list[str]
) -> None:
    result = runner.invoke(app, argv)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "PRQ_REDIS_URL" in result.output
    assert "needs the Redis that every node shares" in flat(result.output)


def test_a_url_that_is_no_url_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["stats", "--url", "localhost:6379"])
    assert result.exit_code == EXIT_USAGE
    assert "is not a Redis URL" in flat(result.output)


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nocolon", "is not MODULE:FUNCTION"),
        (":handle", "is not MODULE:FUNCTION"),
        ("prq.demo.handlers:", "is not MODULE:FUNCTION"),
        ("prq_no_such_module:handle", "no module named 'prq_no_such_module'"),
        ("prq.demo.handlers:no_such_function", "no attribute 'no_such_function'"),
        ("prq.demo.handlers:MAX_SLEEP_MS", "is a float, not a function"),
        ("prq.demo.stats:percentile", "must take one argument"),
    ],
)
def test_a_handler_that_does_not_import_is_a_usage_error(
    runner: CliRunner, spec: str, message: str
) -> None:
    result = runner.invoke(app, ["worker", spec, "-e", "poll://a", "--url", NOWHERE])
    assert result.exit_code == EXIT_USAGE, result.output
    assert message in flat(result.output)


def test_a_handler_module_that_fails_to_import_says_why(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a module in the current directory that raises when imported
    (tmp_path / "prq_cli_broken_handlers.py").write_text("raise RuntimeError('no config')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = runner.invoke(
        app, ["worker", "prq_cli_broken_handlers:handle", "-e", "poll://a", "--url", NOWHERE]
    )
    assert result.exit_code == EXIT_USAGE
    assert "RuntimeError: no config" in flat(result.output)


def test_a_module_in_the_current_directory_can_be_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "prq_cli_local_handlers.py").write_text("def handle(request):\n    return 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p != str(tmp_path)])
    handler = load_handler("prq_cli_local_handlers:handle")
    assert handler(None) == 1  # type: ignore[arg-type]


def test_a_worker_needs_an_endpoint_and_a_valid_one(runner: CliRunner) -> None:
    base = ["worker", "prq.demo.handlers:handle", "--url", NOWHERE]
    result = runner.invoke(app, base)
    assert result.exit_code == EXIT_USAGE and "at least one endpoint" in flat(result.output)
    result = runner.invoke(app, [*base, "-e", "bad\x00endpoint"])
    assert result.exit_code == EXIT_USAGE and "non-printable" in flat(result.output)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{bad", "not valid JSON"),
        ("{'a': 1}", "not valid JSON"),
        ("NaN", "NaN is not JSON"),
        ("[1, 2", "not valid JSON"),
    ],
)
def test_params_that_are_not_json_are_a_usage_error(
    runner: CliRunner, text: str, message: str
) -> None:
    result = runner.invoke(app, ["call", "poll://a", "echo", text, "--url", NOWHERE])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "PARAMS_JSON" in result.output and message in flat(result.output)


def test_an_invalid_endpoint_for_call_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["call", "", "echo", "--url", NOWHERE])
    assert result.exit_code == EXIT_USAGE and "ENDPOINT" in result.output


def test_params_parse_as_json_or_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_params(None) is None
    assert parse_params('{"values": [1, 2]}') == {"values": [1, 2]}
    assert parse_params('"text"') == "text"
    monkeypatch.setattr("sys.stdin", io.StringIO("[3, 4]"))
    assert parse_params("-") == [3, 4]


# -- how results and failures are reported --------------------------------------------------------


def test_exit_codes_say_whether_trying_again_may_help() -> None:
    timeout = PickupTimeout("nobody", request_id="r", endpoint="e")
    assert exit_code_for(timeout) == EXIT_RETRYABLE
    assert exit_code_for(QueueUnavailable("down")) == EXIT_RETRYABLE
    raised = RemoteError(ServerError(type="ValueError", message="no"), request_id="r", endpoint="e")
    assert exit_code_for(raised) == EXIT_FAILED
    busy = RemoteError(
        ServerError(type="Busy", message="later", retryable=True), request_id="r", endpoint="e"
    )
    assert exit_code_for(busy) == EXIT_RETRYABLE


def test_a_summary_of_many_calls() -> None:
    summary = CallSummary()
    for latency in (1.0, 2.0, 3.0):
        summary.record(latency, None)
    summary.elapsed_s = 1.5
    assert summary.exit_code() == EXIT_OK
    summary.record(9.0, PickupTimeout("nobody", request_id="r", endpoint="e"))
    assert summary.exit_code() == EXIT_RETRYABLE
    raised = RemoteError(ServerError(type="ValueError", message="no"), request_id="r", endpoint="e")
    summary.record(1.0, raised)
    assert summary.exit_code() == EXIT_FAILED
    report = summary.to_json()
    assert report["calls"] == 5 and report["ok"] == 3 and report["failed"] == 2
    assert report["errors"] == {"PickupTimeout": 1, "RemoteError": 1}
    assert report["p50_ms"] == 2.0 and report["max_ms"] == 3.0
    assert str(report["first_error"]).startswith("error: PickupTimeout: ")


def test_the_facade_follows_the_handler() -> None:
    async def coroutine_function(request: object) -> object:
        return request

    def plain_function(request: object) -> object:
        return request

    class AsyncCallable:
        async def __call__(self, request: object) -> object:
            return request

    assert is_coroutine_handler(coroutine_function)
    assert is_coroutine_handler(functools.partial(coroutine_function))
    assert is_coroutine_handler(AsyncCallable())
    assert not is_coroutine_handler(plain_function)
    assert not is_coroutine_handler(print)


def test_passwords_stay_out_of_messages() -> None:
    assert redact_url("redis://prq:secret@redis:6379/0") == "redis://prq:***@redis:6379/0"
    assert redact_url("redis://:secret@redis/0") == "redis://:***@redis/0"
    assert redact_url("redis://redis:6379/0") == "redis://redis:6379/0"


def test_the_dashboard_url_carries_the_token_in_its_fragment() -> None:
    assert dashboard_url("127.0.0.1", 8080, "tok") == "http://127.0.0.1:8080/dashboard#token=tok"
    assert dashboard_url("::1", 8080) == "http://[::1]:8080/dashboard"


def test_the_stats_table_shows_endpoints_and_warnings() -> None:
    from rich.console import Console

    snapshot = Snapshot(
        "prq",
        [
            EndpointInfo(
                endpoint="poll://a", depth=3, in_flight=2, oldest_age_s=75.0, receivers=0,
                enqueued_total=41, last_seen_ms=1,
            )
        ],
        RedisHealth(
            ok=True, version="7.4.1", maxmemory_policy="allkeys-lru", warnings=["Redis evicts"]
        ),
    )  # fmt: skip
    console = Console(record=True, width=120)
    console.print(render(snapshot, "redis://r:6379/0"))
    text = console.export_text()
    for expected in ("poll://a", "depth", "in flight", "1m 15s", "41", "warning: Redis evicts"):
        assert expected in text
    assert snapshot.to_json()["endpoints"] == [snapshot.endpoints[0].model_dump(mode="json")]


def test_a_redis_that_stops_answering_is_shown_as_the_error_every_command_prints() -> None:
    from rich.console import Console

    snapshot = Snapshot(
        "prq", [], RedisHealth(ok=False, error="QueueUnavailable: Redis did not answer: refused")
    )
    console = Console(record=True, width=120)
    console.print(render(snapshot, "redis://r:6379/0", 2.0))
    text = console.export_text()
    assert "error: QueueUnavailable: Redis did not answer: refused" in text
    assert "no endpoints under prefix" not in text


def test_ages_read_like_ages() -> None:
    assert [format_age(s) for s in (None, 1.25, 65, 3 * 3600 + 120)] == [
        "-",
        "1.2 s",
        "1m 05s",
        "3h 02m",
    ]
