"""The `prq` command line: one typer app, one module per command.

    prq demo     two receiver nodes and senders, with a live table          (demo.py)
    prq bench    prq against a raw redis-py list RPC on the same Redis       (demo.py)
    prq worker   serve endpoints with a handler named MODULE:FUNCTION        (worker.py)
    prq api      the admin service and dashboard under uvicorn              (api.py)
    prq call     send one call (or --count N) and print the result as JSON  (call.py)
    prq stats    a table of the endpoints, and Redis health warnings         (stats.py)
    prq limits   an endpoint's capacity limits: print or change them         (manage.py)
    prq dead-letters  an endpoint's dead letters: list, replay or purge      (manage.py)
    prq endpoints forget  remove an endpoint from the registry              (manage.py)

Every option is read from its flag, else from its `PRQ_*` environment variable, else from its
default (the variable is named in `--help`). worker, call, stats, limits, dead-letters,
endpoints and api need the Redis every node shares (`--url` or `PRQ_REDIS_URL`) and refuse to
start without one; demo and bench start a private redis-server when none is given. Help is
plain text wrapped to the terminal (no table that would cut an environment variable's name).
Exit codes are listed in options.py (0 done, 1 failed, 2 usage error, 3 retryable failure,
130 Ctrl-C), the same for every command; a failure is one line on stderr, `error: <Type>:
message`, never a traceback. Logging goes to stderr at WARNING (INFO with `--verbose`); the
library itself never configures logging.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

import prq
from prq.cli import api, call, demo, manage, stats, worker

__all__ = ["app", "configure_logging", "main"]

app = typer.Typer(
    name="prq",
    help=(
        "prq: a Redis-backed distributed pending-request queue.\n\n"
        "Serve endpoints (worker), call them (call), watch them (stats), manage their "
        "limits and dead letters (limits, dead-letters), forget one (endpoints forget), run "
        "the admin service and dashboard (api), or try it all out (demo, bench).\n\n"
        "Options come from flags, else from PRQ_* environment variables, else defaults. "
        "worker, call, stats, limits, dead-letters, endpoints and api need the shared Redis "
        "(--url or PRQ_REDIS_URL); "
        "without one, demo and bench start a private redis-server.\n\n"
        "A failure prints one line on stderr, error: <Type>: message. Exit codes: 0 done; "
        "1 failed (Redis refused the credentials, the service raised, ...); 2 usage error "
        "(a Redis URL prq cannot use, too); 3 failed, and trying again may succeed (Redis "
        "did not answer, a call's timeouts, ...); 130 Ctrl-C."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def configure_logging(verbose: bool) -> None:
    """WARNING by default, INFO with --verbose; records go to stderr through rich."""
    handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        handlers=[handler],
        force=True,
    )


def _print_version(value: bool) -> None:
    """`--version`: print prq's version (`prq.__version__`, the one place it is written), exit 0."""
    if value:
        typer.echo(f"prq {prq.__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            envvar="PRQ_VERBOSE",
            show_envvar=True,
            help="Log lifecycle events (INFO) instead of warnings only.",
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print prq's version and exit.",
        ),
    ] = False,
) -> None:
    """Operate prq: serve, call and watch endpoints, run the admin service, or the demo."""
    configure_logging(verbose)


app.command("worker")(worker.worker)
app.command("call")(call.call)
app.command("stats")(stats.stats)
app.command("limits")(manage.limits)
app.command("dead-letters")(manage.dead_letters)
app.add_typer(manage.endpoints)
app.command("api")(api.api)
app.command("demo")(demo.demo)
app.command("bench")(demo.bench)


def main() -> None:
    """Entry point of the `prq` console script."""
    app()


if __name__ == "__main__":
    main()
