"""What several commands share: options, exit codes, and how a command reports a failure.

Exit codes of every command:

    0    done
    1    failed (Redis refused us: a wrong password, a missing ACL permission, a database the
         server lacks; the service raised; a worker had to abandon requests, ...)
    2    usage error: a bad option, a MODULE:FUNCTION that does not import, PARAMS_JSON that is
         not JSON, no Redis URL for a command that needs the shared Redis, or one prq cannot
         use (a scheme it does not take, a port or database that is not a number)
    3    failed in a way that trying again may succeed (the error's `retryable`): Redis did not
         answer (QueueUnavailable) for every command that reaches it; for `call` also
         PickupTimeout, CallTimeout, ReceiverLost, QueueFull, DataLoss, or a service error
         marked retryable
    130  interrupted by Ctrl-C before it finished (`call`)

A failure that is not a usage error prints one line on stderr, `error: <Type>: message` (the
type is prq's: ConfigurationError, QueueUnavailable, ...), never a traceback: `shared_redis`
checks the URL before anything connects, `reporting` turns what a command raises into that line
and its exit code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import typer

from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import ConfigurationError, InvalidSettings, PrqError
from prq.core.keys import KeySchema
from prq.demo import DEFAULT_PREFIX
from prq.transport.topology import locate, redact_url

__all__ = [
    "DEFAULT_PREFIX",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RETRYABLE",
    "EXIT_USAGE",
    "EmbeddedUrlOption",
    "PrefixOption",
    "SharedUrlOption",
    "error_line",
    "exit_code_for",
    "fail",
    "queue_settings",
    "redact_url",
    "reporting",
    "require_url",
    "shared_redis",
]

#: The command did what it was asked.
EXIT_OK = 0
#: The command failed, and trying again as it is will not help.
EXIT_FAILED = 1
#: The command line (or the environment) is wrong; click uses 2 for its own usage errors too.
EXIT_USAGE = 2
#: The call failed, and trying the same call again may succeed.
EXIT_RETRYABLE = 3
#: Ctrl-C ended the command (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130

EmbeddedUrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="PRQ_REDIS_URL",
        show_envvar=True,
        help="Redis URL, e.g. redis://host:6379/0. Unset: start an embedded redis-server.",
    ),
]
SharedUrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="PRQ_REDIS_URL",
        show_envvar=True,
        show_default=False,
        help="URL of the Redis every node shares, e.g. redis://user:password@host:6379/0 "
        "(required).",
    ),
]


def _check_prefix(prefix: str) -> str:
    """A usage error naming --prefix for a key prefix prq refuses (braces, globs, spaces)."""
    try:
        KeySchema(prefix)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    return prefix


PrefixOption = Annotated[
    str,
    typer.Option(
        "--prefix",
        envvar="PRQ_PREFIX",
        show_envvar=True,
        callback=_check_prefix,
        help="Key prefix of the queue.",
    ),
]


def require_url(url: str | None, command: str) -> str:
    """The shared Redis URL, or a usage error: an embedded Redis would serve this process only,
    and guessing localhost would hide a missing setting behind connection retries."""
    if not url:
        raise typer.BadParameter(
            f"prq {command} needs the Redis that every node shares: pass --url or set "
            "PRQ_REDIS_URL (only demo and bench start a private Redis of their own)",
            param_hint="'--url' / PRQ_REDIS_URL",
        )
    return url


def shared_redis(url: str | None, command: str) -> RedisSettings:
    """The settings of the Redis every node shares, from `--url` / PRQ_REDIS_URL (and the
    PRQ_REDIS_* variables), checked before anything connects: a usage error without a URL;
    `error: ConfigurationError: ...` and exit 2 for one prq cannot use (a scheme it does not
    take, a bare host:port, a port or database that is not a number, TLS files without
    rediss://)."""
    redis_url = require_url(url, command)
    try:
        locate(redis_url)
        return RedisSettings.from_url(redis_url)
    except ConfigurationError as exc:  # (InvalidSettings is one)
        fail(exc, EXIT_USAGE)


def queue_settings() -> QueueSettings:
    """QueueSettings from the `PRQ_*` environment, or a usage error naming what is wrong."""
    try:
        return QueueSettings()
    except InvalidSettings as exc:
        problems = "; ".join(
            (f"PRQ_{'_'.join(str(p) for p in error['loc']).upper()}: " if error["loc"] else "")
            + error["msg"]
            for error in exc.errors()
        )
        raise typer.BadParameter(problems, param_hint="PRQ_* environment") from exc


def error_line(exc: BaseException) -> str:
    """How a command reports an error on stderr: `error: <Type>: message`."""
    return f"error: {type(exc).__name__}: {exc}"


def fail(exc: BaseException, code: int = EXIT_FAILED) -> NoReturn:
    """Print `error_line(exc)` to stderr and exit with `code`."""
    typer.echo(error_line(exc), err=True)
    raise typer.Exit(code)


def exit_code_for(exc: PrqError) -> int:
    """3 when trying the same command again may succeed (the error's `retryable`), else 1."""
    return EXIT_RETRYABLE if exc.retryable else EXIT_FAILED


@contextmanager
def reporting() -> Iterator[None]:
    """A PrqError raised inside (making the node, which on a cluster reads its layout already;
    connecting; what the command asked of Redis) becomes `error: <Type>: message` on stderr
    and the exit code `exit_code_for` gives it; refused settings (InvalidSettings) exit 2."""
    try:
        yield
    except InvalidSettings as exc:
        fail(exc, EXIT_USAGE)
    except PrqError as exc:
        fail(exc, exit_code_for(exc))
