"""`prq limits` and `prq dead-letters`: an endpoint's capacity limits and dead letters, from a
shell or a deploy script.

Both print JSON on stdout. Without an action they only read; with one they change Redis (run
them as the application user, not the read-only prq-admin).

    prq limits poll://billing-7                                  # print the limits
    prq limits poll://billing-7 --max-in-flight 8                # change one, keep the other
    prq limits poll://billing-7 --max-pending none               # remove one
    prq limits poll://billing-7 --clear                          # remove both
    prq dead-letters poll://billing-7 [--limit 100]              # list, newest first
    prq dead-letters poll://billing-7 --replay ID [--replay ID]  # queue them again, once
    prq dead-letters poll://billing-7 --purge ID | --purge-all   # drop them
    prq endpoints forget poll://biling-7 [--force]               # remove it from the list
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from pydantic import ValidationError

from prq.cli.options import (
    DEFAULT_PREFIX,
    EXIT_FAILED,
    EXIT_USAGE,
    PrefixOption,
    SharedUrlOption,
    fail,
    queue_settings,
    reporting,
    shared_redis,
)
from prq.core.errors import InvalidEndpoint
from prq.core.names import readable_endpoint, validate_endpoint
from prq.facade.blocking_queue import Queue

__all__ = ["dead_letters", "endpoints", "limits"]

EndpointArgument = Annotated[str, typer.Argument(help="The endpoint, e.g. poll://billing-7.")]


@contextmanager
def _queue(
    url: str | None, prefix: str, command: str, endpoint: str, *, new_work: bool = True
) -> Iterator[Queue]:
    """A queue node for one command; errors become the command's exit codes (prq.cli.options).
    `new_work`: the name must be one new work may go to (else any name an earlier version
    took)."""
    redis_settings = shared_redis(url, command)
    try:
        (validate_endpoint if new_work else readable_endpoint)(endpoint)
    except InvalidEndpoint as exc:
        fail(exc, EXIT_USAGE)
    settings = queue_settings()
    with reporting():  # (on a cluster, making the node reads its layout already)
        queue = Queue(redis_settings, prefix=prefix, settings=settings)
    try:
        with reporting(), queue:  # connecting failed (credentials, permissions, Redis down)
            yield queue
    except ValidationError as exc:  # (what the command was given)
        fail(exc, EXIT_USAGE)


def _limit(text: str | None, option: str) -> tuple[bool, int | None]:
    """(given, value): `none` removes the limit; anything else must be a positive integer."""
    if text is None:
        return False, None
    if text.strip().lower() == "none":
        return True, None
    if not text.strip().isdigit() or int(text) < 1:
        raise typer.BadParameter("a positive integer, or none", param_hint=option)
    return True, int(text)


def limits(
    endpoint: EndpointArgument,
    max_in_flight: Annotated[
        str | None,
        typer.Option(
            "--max-in-flight",
            metavar="N|none",
            help="Most requests picked up and unanswered at once, across receivers.",
        ),
    ] = None,
    max_pending: Annotated[
        str | None,
        typer.Option(
            "--max-pending",
            metavar="N|none",
            help="Most requests queued at once; enqueues beyond it fail with QueueFull.",
        ),
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove both limits.")] = False,
    url: SharedUrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Print an endpoint's capacity limits as JSON, or change them (a limit not named keeps
    its value; `none` removes it). Every node applies them from its next enqueue or take on.
    """
    set_flight, flight = _limit(max_in_flight, "'--max-in-flight'")
    set_pending, pending = _limit(max_pending, "'--max-pending'")
    if clear and (set_flight or set_pending):
        raise typer.BadParameter("--clear removes both limits: name no limit with it")
    with _queue(url, prefix, "limits", endpoint) as queue:
        found = queue.limits(endpoint)
        if clear or set_flight or set_pending:
            found = queue.set_limits(
                endpoint,
                max_in_flight=None if clear else (flight if set_flight else found.max_in_flight),
                max_pending=None if clear else (pending if set_pending else found.max_pending),
            )
        typer.echo(found.model_dump_json())


def dead_letters(
    endpoint: EndpointArgument,
    replay: Annotated[
        list[str] | None,
        typer.Option("--replay", metavar="ID", help="Queue this dead letter again (repeatable)."),
    ] = None,
    purge: Annotated[
        list[str] | None,
        typer.Option("--purge", metavar="ID", help="Drop this dead letter (repeatable)."),
    ] = None,
    purge_all: Annotated[
        bool, typer.Option("--purge-all", help="Drop every dead letter of the endpoint.")
    ] = False,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1000, help="Most dead letters listed.")
    ] = 100,
    url: SharedUrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """List an endpoint's dead letters as JSON lines (newest first), or replay or purge some.

    --replay prints {"id", "outcome"} per id: replayed, live (queued or in flight already) or
    missing. --purge/--purge-all print {"purged": n}.
    """
    actions = sum((bool(replay), bool(purge), purge_all))
    if actions > 1:
        raise typer.BadParameter("use one of --replay, --purge and --purge-all at a time")
    with _queue(url, prefix, "dead-letters", endpoint) as queue:
        if replay:
            for request_id in replay:
                outcome = queue.replay_dead_letter(endpoint, request_id)
                typer.echo(json.dumps({"id": request_id, "outcome": outcome}))
        elif purge or purge_all:
            purged = queue.purge_dead_letters(endpoint, None if purge_all else list(purge or ()))
            typer.echo(json.dumps({"purged": purged}))
        else:
            for letter in queue.dead_letters(endpoint, limit=limit):
                typer.echo(letter.model_dump_json())


endpoints = typer.Typer(
    name="endpoints",
    help="Manage the list of endpoints the admin views show (the registry).",
    no_args_is_help=True,
)


@endpoints.command("forget")
def forget(
    endpoint: EndpointArgument,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Forget it even while it holds work or has a live receiver (nothing queued "
            "is removed).",
        ),
    ] = False,
    url: SharedUrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Remove an endpoint from the list the admin views show (e.g. one made by a typo).

    Prints what was found as JSON. Never removes a request. Exits 1, changing nothing, when
    the endpoint is not listed, or holds queued or in-flight requests or has a live receiver
    (unless --force). A receiver still serving it, or a node that used it lately, lists it
    again within seconds.
    """
    with _queue(url, prefix, "endpoints forget", endpoint, new_work=False) as queue:
        outcome = queue.forget_endpoint(endpoint, force=force)
    typer.echo(outcome.model_dump_json())
    if not outcome.registered:
        fail_message(f"endpoint {endpoint!r} is not listed; nothing to forget")
    if not outcome.forgotten:
        fail_message(
            f"endpoint {endpoint!r} has {outcome.depth} queued, {outcome.in_flight} in flight "
            f"and {outcome.receivers} live receivers; not forgotten (--force forgets it "
            "anyway, removing no request)"
        )


def fail_message(message: str) -> None:
    """Say why on stderr and exit 1."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_FAILED)
