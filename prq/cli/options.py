"""What several commands share: options, exit codes, and how a command reports a failure.

Exit codes of every command:

    0    done
    1    failed (Redis refused us, the service raised, a worker had to abandon requests, ...)
    2    usage error: a bad option, a MODULE:FUNCTION that does not import, PARAMS_JSON that is
         not JSON, no Redis URL for a command that needs the shared Redis
    3    `call` failed in a way that trying again may succeed (the error's `retryable`:
         PickupTimeout, CallTimeout, ReceiverLost, QueueUnavailable, QueueFull, DataLoss, or a
         service error marked retryable)
    130  interrupted by Ctrl-C before it finished (`call`)
"""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer

from prq.core.config import QueueSettings
from prq.core.errors import InvalidSettings
from prq.demo import DEFAULT_PREFIX
from prq.transport.topology import redact_url

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
    "fail",
    "queue_settings",
    "redact_url",
    "require_url",
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
PrefixOption = Annotated[
    str,
    typer.Option(
        "--prefix", envvar="PRQ_PREFIX", show_envvar=True, help="Key prefix of the queue."
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
    if "://" not in url:
        raise typer.BadParameter(
            f"{redact_url(url)!r} is not a Redis URL; write redis://[user:password@]host:port/db",
            param_hint="'--url' / PRQ_REDIS_URL",
        )
    return url


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
