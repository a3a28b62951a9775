"""`prq stats`: the endpoints of one key prefix as Redis sees them, and Redis's health.

Reads through `prq.ops.inspector.Inspector`, which never writes: it runs as the read-only ACL user
(`prq-admin` in redis-conf/users.acl). A table on stdout (`--json`: one JSON document, or one
per line with `--watch`), then Redis health warnings (eviction, persistence) below it.

A Redis that cannot be read at the first reading (it does not answer, or refuses the
credentials) is `error: <Type>: message` on stderr, as for every command (prq.cli.options); one
that stops answering while `--watch` runs is shown in the table's last line until it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from typing import Annotated

import typer
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from prq.cli.options import (
    DEFAULT_PREFIX,
    EXIT_FAILED,
    EXIT_OK,
    PrefixOption,
    SharedUrlOption,
    exit_code_for,
    fail,
    queue_settings,
    redact_url,
    reporting,
    shared_redis,
)
from prq.core.errors import PrqError
from prq.ops.answers import EndpointInfo, RedisHealth
from prq.ops.inspector import Inspector

__all__ = ["Snapshot", "format_age", "render", "stats"]


def stats(
    watch: Annotated[
        float | None,
        typer.Option(
            "--watch",
            "-w",
            envvar="PRQ_STATS_WATCH_S",
            show_envvar=True,
            min=0.1,
            show_default=False,
            help="Refresh every SECONDS until Ctrl-C (with --json: one JSON line each time).",
            metavar="SECONDS",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            envvar="PRQ_STATS_JSON",
            show_envvar=True,
            help="Print JSON: {prefix, endpoints: [...], redis: {...}}.",
        ),
    ] = False,
    url: SharedUrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Show every endpoint's depth, requests in flight, oldest queued age, live receivers and
    enqueue count, and warn when Redis evicts or persists data.

    Endpoints are those nodes reported using lately. Read-only: run it as the prq-admin user
    of redis-conf/users.acl.
    """
    redis_settings = shared_redis(url, "stats")
    settings = queue_settings()
    with reporting():
        inspector = Inspector.from_url(
            prefix=prefix, settings=settings, redis_settings=redis_settings
        )
    code = asyncio.run(_run(inspector, redis_settings.url, prefix, watch, as_json))
    raise typer.Exit(code)


class Snapshot:
    """One reading: the endpoints and Redis's health."""

    def __init__(self, prefix: str, endpoints: list[EndpointInfo], redis: RedisHealth) -> None:
        self.prefix = prefix
        self.endpoints = endpoints
        self.redis = redis

    def to_json(self) -> dict[str, object]:
        return {
            "prefix": self.prefix,
            "endpoints": [info.model_dump(mode="json") for info in self.endpoints],
            "redis": self.redis.model_dump(mode="json"),
        }


async def _read(inspector: Inspector, prefix: str, *, first: bool) -> Snapshot:
    """One reading. Redis not healthy: at the `first` reading, the error of reading the
    endpoints is raised (ConfigurationError for refused credentials, QueueUnavailable for a
    Redis that does not answer, as any other command says it); later, the health line says
    why."""
    health = await inspector.redis_health()
    try:
        endpoints = await inspector.endpoints()
    except PrqError:
        if health.ok or first:
            raise
        endpoints = []  # the health line says why
    return Snapshot(prefix, endpoints, health)


async def _run(
    inspector: Inspector, url: str, prefix: str, watch_s: float | None, as_json: bool
) -> int:
    console = Console()
    try:
        if watch_s is None:
            snapshot = await _read(inspector, prefix, first=True)
            if as_json:
                typer.echo(json.dumps(snapshot.to_json(), indent=2))
            else:
                console.print(render(snapshot, redact_url(url)))
            return EXIT_OK if snapshot.redis.ok else EXIT_FAILED
        await _watch(inspector, url, prefix, watch_s, as_json, console)
        return EXIT_OK
    except PrqError as exc:
        fail(exc, exit_code_for(exc))
    finally:
        await inspector.aclose()


async def _watch(
    inspector: Inspector, url: str, prefix: str, watch_s: float, as_json: bool, console: Console
) -> None:
    """Read, show, wait `watch_s` (or less, on Ctrl-C/SIGTERM), until a signal."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.ExitStack() as screen:
        snapshot = await _read(inspector, prefix, first=True)  # (before the screen is taken)
        live: Live | None = None
        if not as_json:
            live = screen.enter_context(Live(console=console, auto_refresh=False))
        while True:
            if live is not None:
                live.update(render(snapshot, redact_url(url), watch_s), refresh=True)
            else:
                typer.echo(json.dumps(snapshot.to_json()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), watch_s)
            if stop.is_set():
                return
            snapshot = await _read(inspector, prefix, first=False)


def format_age(seconds: float | None) -> str:
    """12.3 s, 4m 05s, 2h 03m; "-" for nothing queued."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def render(snapshot: Snapshot, where: str, watch_s: float | None = None) -> RenderableType:
    """The endpoints table, followed by Redis's health."""
    refresh = f" · every {watch_s:g} s" if watch_s is not None else ""
    table = Table(
        title=f"prq endpoints · prefix {snapshot.prefix} · {where}{refresh}",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    table.add_column("endpoint", no_wrap=True)
    for header in ("depth", "in flight", "oldest age", "receivers", "enqueued"):
        table.add_column(header, justify="right", no_wrap=True)
    for info in snapshot.endpoints:
        table.add_row(
            info.endpoint,
            str(info.depth),
            str(info.in_flight),
            format_age(info.oldest_age_s),
            str(info.receivers) if info.receivers else "[red]0[/red]",
            str(info.enqueued_total),
            style="bold" if info.depth and not info.receivers else None,
        )
    parts: list[RenderableType] = [table]
    if not snapshot.endpoints and snapshot.redis.ok:
        parts.append(
            Text(
                f"no endpoints under prefix {snapshot.prefix!r} yet: nodes report the endpoints "
                "they use at each data-loss check"
            )
        )
    parts.extend(_health_lines(snapshot.redis))
    return Group(*parts)


def _health_lines(health: RedisHealth) -> list[RenderableType]:
    if not health.ok:
        return [Text(f"error: {health.error}", style="bold red")]
    persistence = ", ".join(health.persistence) or "none"
    lines: list[RenderableType] = [
        Text(
            f"redis {health.version or '?'} · maxmemory-policy {health.maxmemory_policy or '?'} "
            f"· persistence {persistence}",
            style="dim",
        )
    ]
    lines += [Text(f"warning: {warning}", style="bold yellow") for warning in health.warnings]
    return lines
