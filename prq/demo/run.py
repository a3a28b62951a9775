"""The run: Redis (given or embedded), the nodes, the senders and the screen, then a summary.

`run_demo` owns the lifecycle drawn in the package docstring and every bounded wait in it;
`_drive` runs in one event loop: senders, the live table (or headless status lines) and
Ctrl-C / SIGTERM, until the duration passes. With `--spark` (prq.demo.spark) a Spark session
starts beside the nodes, its bulk enqueue runs during the calls, the screen shows its progress
under the table, and the run lasts until the bulk is enqueued and drained as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import redis
from rich.console import Console, Group, RenderableType
from rich.live import Live

from prq.core.config import QueueSettings
from prq.core.errors import PrqError
from prq.demo.config import DemoConfig, NodeSpec
from prq.demo.nodes import ReceiverNodes
from prq.demo.senders import DEFAULT_PICKUP_TIMEOUT_S, Senders
from prq.demo.spark import SPARK_NODE, BulkProgress, SparkBulk, spark_unavailable
from prq.demo.stats import EndpointStats, percentile
from prq.demo.table import fmt_ms, render_table, status_line
from prq.facade.asyncio_queue import AsyncQueue
from prq.ops.inspector import Inspector
from prq.transport.topology import close_client, sync_client

__all__ = ["DemoResult", "run_demo"]

#: Table refresh period (twice a second).
DEFAULT_REFRESH_S = 0.5
#: Without a terminal, print one status line this often instead of a live table.
DEFAULT_HEADLESS_LINE_S = 2.0
#: How long the demo waits for a given Redis to answer its first PING.
DEFAULT_PING_TIMEOUT_S = 3.0
#: Columns assumed when printing without a terminal.
DEFAULT_HEADLESS_WIDTH = 120
#: What the table shows as the node of an endpoint that workers elsewhere serve.
EXTERNAL_NODE = "ext"


@dataclass(frozen=True, slots=True)
class DemoResult:
    calls: int
    errors: int
    failed: int
    elapsed_s: float
    p50_ms: float | None
    p99_ms: float | None
    #: With --spark: the bulk job's summary line, and whether it failed.
    spark_summary: str | None = None
    spark_failed: bool = False


@contextlib.contextmanager
def _stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> Iterator[None]:
    """Ctrl-C (or SIGTERM) ends the demo cleanly instead of tearing through it."""
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / Windows
            pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


@contextlib.asynccontextmanager
async def _bulk_progress(
    bulk: SparkBulk | None, url: str, prefix: str
) -> AsyncIterator[BulkProgress | None]:
    """The bulk job's progress (None without --spark); the job is stopped on the way out."""
    if bulk is None:
        yield None
        return
    async with Inspector.from_url(url, prefix=prefix) as inspector:
        progress = BulkProgress(bulk, inspector)
        try:
            await progress.begin()
            yield progress
        finally:
            await progress.finish()


def _screen(table: RenderableType, progress: BulkProgress | None) -> RenderableType:
    return table if progress is None else Group(table, "", progress.progress)


def _over(now: float, deadline: float | None, progress: BulkProgress | None) -> bool:
    """The duration passed (and the bulk, if any, is enqueued and drained)."""
    return deadline is not None and now >= deadline and (progress is None or progress.settled())


def _status_lines(
    stats: dict[str, EndpointStats], elapsed_s: float, progress: BulkProgress | None
) -> list[str]:
    lines = [status_line(stats, elapsed_s)]
    return lines if progress is None else [*lines, progress.status_line()]


async def _drive(
    config: DemoConfig,
    url: str,
    nodes: ReceiverNodes,
    console: Console,
    bulk: SparkBulk | None = None,
) -> DemoResult:
    stats = {
        endpoint: EndpointStats(
            endpoint, nodes.node_of(endpoint) if config.start_nodes else EXTERNAL_NODE
        )
        for spec in config.nodes
        for endpoint in spec.endpoints
    }
    stop = asyncio.Event()
    settings = QueueSettings(pickup_timeout_s=DEFAULT_PICKUP_TIMEOUT_S)
    async with (
        AsyncQueue.from_url(url, prefix=config.prefix, settings=settings) as queue,
        _bulk_progress(bulk, url, config.prefix) as progress,
    ):
        senders = Senders(queue, stats, config.concurrency, config.seed)
        started = time.monotonic()
        deadline = started + config.duration_s if config.duration_s > 0 else None
        until = f"{config.duration_s:g} s" if deadline is not None else "Ctrl-C"
        if progress is not None and deadline is not None:
            until += " and the bulk is drained"
        served_by = f"{len(config.nodes)} nodes" if config.start_nodes else "external workers"
        title = f"prq demo: {config.concurrency} senders, {served_by}, until {until}"
        with _stop_on_signals(asyncio.get_running_loop(), stop), contextlib.ExitStack() as screen:
            live: Live | None = None
            if console.is_terminal:
                live = screen.enter_context(Live(console=console, auto_refresh=False))
            senders.start()
            next_line = started + DEFAULT_HEADLESS_LINE_S
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), DEFAULT_REFRESH_S)
                now = time.monotonic()
                if _over(now, deadline, progress):
                    stop.set()
                if live is not None:
                    table = render_table(stats, now - started, title)
                    live.update(_screen(table, progress), refresh=True)
                elif now >= next_line:
                    for line in _status_lines(stats, now - started, progress):
                        console.print(line, highlight=False)
                    next_line = now + DEFAULT_HEADLESS_LINE_S
            await senders.stop()
            if progress is not None:
                await progress.finish()
            elapsed = time.monotonic() - started
            final = _screen(render_table(stats, elapsed, title), progress)
            if live is not None:
                live.update(final, refresh=True)
            else:
                console.print(final)
    values = sorted(senders.sample.values)
    return DemoResult(
        calls=sum(s.calls for s in stats.values()),
        errors=sum(s.errors for s in stats.values()),
        failed=sum(s.failed for s in stats.values()),
        elapsed_s=elapsed,
        p50_ms=percentile(values, 0.50),
        p99_ms=percentile(values, 0.99),
        spark_summary=progress.summary() if progress is not None else None,
        spark_failed=progress is not None and progress.failed,
    )


def _summary(result: DemoResult, nodes: ReceiverNodes) -> str:
    rate = result.calls / result.elapsed_s if result.elapsed_s > 0 else 0.0
    handled = ", ".join(
        f"{n.spec.name}={sum(n.handled.values()) if n.handled is not None else '?'}"
        for n in nodes.nodes
    )
    return (
        f"prq demo: {result.calls} calls in {result.elapsed_s:.1f} s ({rate:.0f} calls/s), "
        f"p50 {fmt_ms(result.p50_ms)} ms, p99 {fmt_ms(result.p99_ms)} ms, "
        f"{result.errors} errors raised by the service, {result.failed} failed; "
        + (f"handled by node {handled}" if handled else "served by external workers")
    )


def run_demo(config: DemoConfig, console: Console | None = None) -> int:
    """Run the demo (see the module docstring); returns the process exit code."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            # A pipe or a log file has no width; rich would assume 80 columns and squeeze.
            console = Console(width=max(console.width, DEFAULT_HEADLESS_WIDTH))
    if config.spark:
        problem = spark_unavailable()
        if problem is not None:
            console.print(problem, style="red", markup=False, highlight=False, soft_wrap=True)
            return 2
    with contextlib.ExitStack() as stack:
        url = _redis_for(config, console, stack)
        if url is None:
            return 1
        specs = (*config.nodes, SPARK_NODE) if config.spark else config.nodes
        nodes = ReceiverNodes(url, config.prefix, specs if config.start_nodes else ())
        stack.callback(nodes.stop)
        if config.start_nodes:
            console.print("starting receiver nodes " + ", ".join(_describe(s) for s in specs))
        else:
            endpoints = ", ".join(e for spec in specs for e in spec.endpoints)
            console.print(f"no receiver nodes: calling {endpoints} for workers elsewhere")
        bulk = _start_spark(config, url, console, stack) if config.spark else None
        try:
            nodes.start()
            if bulk is not None:
                _wait_for_spark(bulk)
        except RuntimeError as exc:
            console.print(f"[red]demo could not start: {exc}[/red]")
            return 1
        try:
            result = asyncio.run(_drive(config, url, nodes, console, bulk))
        except PrqError as exc:
            console.print(f"[red]demo stopped: {type(exc).__name__}: {exc}[/red]")
            return 1
        nodes.stop()
        console.print(_summary(result, nodes), highlight=False, soft_wrap=True)
        if result.spark_summary is not None:
            console.print(result.spark_summary, highlight=False, soft_wrap=True)
        return 0 if result.calls > 0 and not result.spark_failed else 1
    return 1  # pragma: no cover  (ExitStack does not swallow exceptions)


def _start_spark(
    config: DemoConfig, url: str, console: Console, stack: contextlib.ExitStack
) -> SparkBulk:
    """Start the Spark session in its thread (it starts while the nodes do); stopped on exit."""
    bulk = SparkBulk(url, config.prefix, config.spark_rows)
    stack.callback(bulk.stop)
    console.print(
        f"starting a local Spark session (local[2]) to enqueue {config.spark_rows} rows "
        f"to {SPARK_NODE.endpoints[0]} (request ids {bulk.namespace}:<row>)"
    )
    bulk.start()
    return bulk


def _wait_for_spark(bulk: SparkBulk) -> None:
    """Bounded wait for the Spark session; RuntimeError when it does not start."""
    problem = bulk.wait_ready()
    if problem is not None:
        raise RuntimeError(f"no Spark session: {problem}")


def _redis_for(config: DemoConfig, console: Console, stack: contextlib.ExitStack) -> str | None:
    """The URL the demo runs on: the one given (None if it cannot be reached, said on the
    console), else an embedded server or cluster started for the run."""
    if config.url is None and config.cluster:
        from prq.embedded.cluster import EmbeddedCluster

        cluster = EmbeddedCluster(masters=3).start()
        stack.callback(cluster.cleanup)
        console.print(f"embedded Redis Cluster of 3 masters on {cluster.url}")
        return cluster.url
    if config.url is None:
        from prq.embedded import EmbeddedRedis

        server = EmbeddedRedis().start()
        stack.callback(server.cleanup)
        console.print(f"embedded redis-server on {server.url} (set PRQ_REDIS_URL to use yours)")
        return server.url
    problem = _unreachable(config.url)
    if problem is not None:
        console.print(f"[red]cannot reach Redis at {config.url}: {problem}[/red]")
        return None
    console.print(f"using Redis at {config.url}")
    return config.url


def _unreachable(url: str) -> str | None:
    """Why Redis at `url` cannot be used, or None; fails fast instead of after retry budgets."""
    timeouts = {
        "socket_timeout": DEFAULT_PING_TIMEOUT_S,
        "socket_connect_timeout": DEFAULT_PING_TIMEOUT_S,
    }
    try:
        client = sync_client(url, timeouts)
    except (ValueError, PrqError) as exc:
        return str(exc)
    try:
        client.ping()
    except redis.RedisError as exc:
        return str(exc) or type(exc).__name__
    finally:
        close_client(client)
    return None


def _describe(spec: NodeSpec) -> str:
    return f"{spec.name} ({spec.facade}: {', '.join(spec.endpoints)})"
