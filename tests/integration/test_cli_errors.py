"""Every `prq` command that reaches Redis, given a Redis it cannot use, says why in one line,
`error: <Type>: message` on stderr, and exits with the code prq.cli.options documents: 2 for a
URL prq cannot use (a scheme it does not take, a port that is not a number), 1 for a Redis that
refuses the credentials, 3 for a Redis that does not answer. Never a traceback, never a table.

Each command runs as a real process (`python -m prq.cli`) against the suite's own Redis.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import pytest

from prq.cli.options import EXIT_FAILED, EXIT_RETRYABLE, EXIT_USAGE
from prq.embedded import free_port
from prq.ops.inspector import Inspector
from tests.integration.test_cli import PrqRunner

pytestmark = pytest.mark.integration

#: Every command that takes --url and reaches the shared Redis (api: see below).
COMMANDS: dict[str, tuple[str, ...]] = {
    "call": ("call", "poll://cli-errors", "echo", "1", "--pickup-timeout", "1"),
    "stats": ("stats",),
    "stats --watch": ("stats", "--watch", "0.2"),
    "limits": ("limits", "poll://cli-errors"),
    "dead-letters": ("dead-letters", "poll://cli-errors"),
    "endpoints forget": ("endpoints", "forget", "poll://cli-errors"),
    "worker (async)": ("worker", "prq.demo.handlers:handle", "-e", "poll://cli-errors"),
    "worker (sync)": ("worker", "prq.demo.handlers:handle_blocking", "-e", "poll://cli-errors"),
}


def api() -> dict[str, tuple[str, ...]]:
    """`prq api` on a free port. It listens while Redis does not answer (its /health says so:
    test_cli.py), so it is run only where the URL or the credentials are wrong."""
    return {"api": ("api", "--port", str(free_port()))}


#: How long one command may take (imports, at most one retry budget of PRQ_RETRY_BUDGET_S).
COMMAND_TIMEOUT_S = 60.0


def with_password(url: str, password: str) -> str:
    """`url` with its user's password replaced."""
    parts = urlsplit(url)
    user = parts.username or "default"
    where = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{where}"))


def run_all(
    prq: PrqRunner, url: str, commands: dict[str, tuple[str, ...]]
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each command with `--url url`, a few at a time (each is mostly Python's start-up)."""
    env = {"PRQ_RETRY_BUDGET_S": "1", "PRQ_API_ADMIN_TOKENS": "adm-" + "x" * 24}
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = {
            name: pool.submit(prq.run, *args, "--url", url, timeout_s=COMMAND_TIMEOUT_S, **env)
            for name, args in commands.items()
        }
        return {name: run.result() for name, run in runs.items()}


def assert_one_error_line(
    runs: dict[str, subprocess.CompletedProcess[str]], code: int, starts: str, *hidden: str
) -> None:
    wrong: list[str] = []
    for name, run in runs.items():
        said = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        ok = (
            run.returncode == code
            and len(said) == 1
            and said[0].startswith(starts)
            and "Traceback" not in run.stderr
            and run.stdout == ""
            and not any(secret in run.stderr + run.stdout for secret in hidden)
        )
        if not ok:
            wrong.append(
                f"prq {name}: exit {run.returncode} (want {code}), want one line {starts!r}..."
                f"\n--- stdout:\n{run.stdout[-2000:]}\n--- stderr:\n{run.stderr[-3000:]}"
            )
    assert not wrong, "\n\n".join(wrong)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:{port}/0", "is not a Redis URL"),
        ("redis://127.0.0.1:abc/0", "is malformed"),
    ],
    ids=["bad-scheme", "bad-port"],
)
def test_a_url_prq_cannot_use_is_one_error_line_and_a_usage_error(
    prq: PrqRunner, url: str, message: str
) -> None:
    # Given a URL that names no Redis prq can reach, for every command
    url = url.format(port=free_port())

    # When each command runs with it
    runs = run_all(prq, url, COMMANDS | api())

    # Then each says so in one line and exits 2, before it connects to anything
    assert_one_error_line(runs, EXIT_USAGE, "error: ConfigurationError: ")
    assert all(message in run.stderr for run in runs.values())


def test_refused_credentials_are_a_configuration_error_for_every_command(
    prq: PrqRunner, redis_url: str
) -> None:
    # Given the shared Redis's URL with a wrong password
    url = with_password(redis_url, "not-the-password-xyz")

    # When each command runs with it
    runs = run_all(prq, url, COMMANDS | api())

    # Then each says Redis refused the credentials, as prq's ConfigurationError, and exits 1
    # (`prq stats` too: it said "Redis does not answer: AuthenticationError" under a table)
    assert_one_error_line(
        runs,
        EXIT_FAILED,
        "error: ConfigurationError: Redis refused the credentials",
        "not-the-password-xyz",
    )


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:{port}/0", "redis+cluster://127.0.0.1:{port}"],
    ids=["server", "cluster"],
)
def test_a_redis_that_does_not_answer_is_one_error_line_and_retryable(
    prq: PrqRunner, url: str
) -> None:
    # Given a URL where no Redis listens (a cluster's seed node: the blocking client reads the
    # layout as it is made)
    url = url.format(port=free_port())

    # When each command runs with it (a retry budget of 1 s)
    runs = run_all(prq, url, COMMANDS)

    # Then each says Redis did not answer, and exits 3: trying again may succeed
    assert_one_error_line(runs, EXIT_RETRYABLE, "error: QueueUnavailable: ")


async def test_redis_health_names_prq_s_error_for_refused_credentials(
    redis_url: str, key_prefix: str
) -> None:
    # Given an inspector whose URL has a wrong password
    inspector = Inspector.from_url(with_password(redis_url, "wrong-pw-abc"), prefix=key_prefix)
    try:
        # When it reads Redis's health
        health = await inspector.redis_health()
    finally:
        await inspector.aclose()

    # Then the reason is the one every other read gives (and `prq stats --watch` shows)
    assert not health.ok
    assert health.error is not None
    assert health.error.startswith("ConfigurationError: Redis refused the credentials")
