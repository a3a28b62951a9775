"""The demo: two receiver nodes, senders driving calls, and a live table of what happens.

Processes:

    main process ─┬─ EmbeddedRedis (only when no URL is given)
                  ├─ senders: asyncio tasks on one AsyncQueue, `concurrency` calls in flight
                  ├─ node A (spawned): AsyncQueue.serve  poll://billing-1, poll://billing-2
                  └─ node B (spawned): Queue.serve        poll://search-1, poll://search-2

Lifecycle: start Redis → start the nodes (bounded wait for "ready") → drive calls until the
duration passes or Ctrl-C → let senders finish their calls (bounded, then cancel) → stop the
nodes (stop event, bounded join, terminate, kill) → stop Redis → one summary line.

Every wait is bounded; a node that dies or hangs is reported and killed, never waited on forever.
Run it as `prq demo`; `python -m prq.demo` does the same with default options.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.process
import multiprocessing.queues
import multiprocessing.synchronize
import queue as queue_module
import random
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

import redis
from pydantic import JsonValue
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from prq.config import QueueSettings
from prq.errors import PrqError, RemoteError
from prq.models import Request
from prq.queue import AsyncQueue
from prq.sync import Queue

logger = logging.getLogger(__name__)

__all__ = ["DemoConfig", "NodeSpec", "run_demo"]

#: How long the demo runs when not told otherwise (0 means until Ctrl-C).
DEFAULT_DURATION_S = 10.0
#: Sender calls in flight.
DEFAULT_CONCURRENCY = 32
#: Key prefix of the demo's queue.
DEFAULT_PREFIX = "prq"
#: Recent window over which calls/s, p50 and p99 are computed.
DEFAULT_WINDOW_S = 5.0
#: Table refresh period (twice a second).
DEFAULT_REFRESH_S = 0.5
#: Without a terminal, print one status line this often instead of a live table.
DEFAULT_HEADLESS_LINE_S = 2.0
#: How long the demo waits for a given Redis to answer its first PING.
DEFAULT_PING_TIMEOUT_S = 3.0
#: Columns assumed when printing without a terminal.
DEFAULT_HEADLESS_WIDTH = 120
#: How long a node may take to start (spawn imports, connect, subscribe).
DEFAULT_NODE_START_TIMEOUT_S = 30.0
#: How long a node may take to finish its held requests after being asked to stop.
DEFAULT_NODE_STOP_TIMEOUT_S = 5.0
#: How long senders may take to finish their current call once the demo stops.
DEFAULT_DRAIN_TIMEOUT_S = 5.0
#: Pickup timeout and call timeout of every demo call (bounds each sender's wait).
DEFAULT_PICKUP_TIMEOUT_S = 10.0
DEFAULT_CALL_TIMEOUT_S = 15.0
#: Share of `flaky` calls that raise, so errors show up in the table.
DEFAULT_FLAKY_FAILURE_RATE = 0.2
#: Latencies kept for the final percentiles (a uniform sample once more calls were made).
DEFAULT_RESERVOIR_SIZE = 100_000

Facade = Literal["async", "sync"]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One receiver node: a process serving `endpoints` with one facade."""

    name: str
    facade: Facade
    endpoints: tuple[str, ...]
    concurrency: int


#: The two receiver nodes of the demo.
NODES: tuple[NodeSpec, ...] = (
    NodeSpec("A", "async", ("poll://billing-1", "poll://billing-2"), concurrency=16),
    NodeSpec("B", "sync", ("poll://search-1", "poll://search-2"), concurrency=8),
)


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What `run_demo` needs; `url` None starts an embedded Redis."""

    url: str | None = None
    duration_s: float = DEFAULT_DURATION_S
    concurrency: int = DEFAULT_CONCURRENCY
    prefix: str = DEFAULT_PREFIX
    nodes: tuple[NodeSpec, ...] = NODES
    seed: int | None = None


#: Messages from a node to the main process: (kind, node name, handled per endpoint).
Report = tuple[str, str, dict[str, int]]
if TYPE_CHECKING:
    _Reports: TypeAlias = multiprocessing.queues.Queue[Report]


# -- the services (run inside the receiver nodes) ------------------------------------------------


class SimulatedFailure(Exception):
    """What the `flaky` method raises now and then."""


def _compute(request: Request) -> JsonValue:
    """The CPU part of every method (shared by the async and the threaded handler)."""
    params = request.params if isinstance(request.params, dict) else {}
    if request.method == "echo":
        return request.params
    if request.method == "sum":
        values = params.get("values")
        numbers = (
            [v for v in values if isinstance(v, int | float)] if isinstance(values, list) else []
        )
        return {"total": sum(numbers), "count": len(numbers)}
    if request.method == "sleep":
        return {"slept_ms": params.get("ms", 0)}
    if request.method == "flaky":
        if random.random() < DEFAULT_FLAKY_FAILURE_RATE:
            raise SimulatedFailure(f"simulated failure in {request.endpoint} (flaky on purpose)")
        return "ok"
    raise ValueError(f"unknown method {request.method!r}")


def _sleep_ms(request: Request) -> float:
    if request.method != "sleep" or not isinstance(request.params, dict):
        return 0.0
    ms = request.params.get("ms", 0)
    return float(ms) if isinstance(ms, int | float) else 0.0


class _Tally:
    """Requests handled per endpoint on one node (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def add(self, endpoint: str) -> None:
        with self._lock:
            self.counts[endpoint] += 1


async def _serve_async_node(
    url: str, prefix: str, spec: NodeSpec, stop: multiprocessing.synchronize.Event, ready: _Reports
) -> Counter[str]:
    tally = _Tally()

    async def handler(request: Request) -> JsonValue:
        delay_ms = _sleep_ms(request)
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        tally.add(request.endpoint)
        return _compute(request)

    async with AsyncQueue.from_url(url, prefix=prefix) as queue:
        stop_serving = asyncio.Event()
        servers = [
            asyncio.create_task(
                queue.serve(endpoint, handler, concurrency=spec.concurrency, stop=stop_serving)
            )
            for endpoint in spec.endpoints
        ]
        ready.put(("ready", spec.name, {}))
        # The stop event lives in another process: poll it (it is cheap) rather than block a
        # thread on it.
        while not stop.is_set() and not all(server.done() for server in servers):
            await asyncio.sleep(0.1)
        stop_serving.set()
        await asyncio.wait(servers, timeout=DEFAULT_NODE_STOP_TIMEOUT_S)
    return tally.counts


def _serve_sync_node(
    url: str, prefix: str, spec: NodeSpec, stop: multiprocessing.synchronize.Event, ready: _Reports
) -> Counter[str]:
    tally = _Tally()

    def handler(request: Request) -> JsonValue:
        delay_ms = _sleep_ms(request)
        if delay_ms:
            time.sleep(delay_ms / 1000)
        tally.add(request.endpoint)
        return _compute(request)

    with Queue.from_url(url, prefix=prefix) as queue:
        stop_serving = threading.Event()
        servers = [
            threading.Thread(
                target=queue.serve,
                args=(endpoint, handler),
                kwargs={"concurrency": spec.concurrency, "stop": stop_serving},
                name=f"serve-{endpoint}",
                daemon=True,
            )
            for endpoint in spec.endpoints
        ]
        for server in servers:
            server.start()
        ready.put(("ready", spec.name, {}))
        while not stop.wait(0.1) and any(server.is_alive() for server in servers):
            pass
        stop_serving.set()
        deadline = time.monotonic() + DEFAULT_NODE_STOP_TIMEOUT_S
        for server in servers:
            server.join(max(0.0, deadline - time.monotonic()))
    return tally.counts


def receiver_main(
    url: str,
    prefix: str,
    spec: NodeSpec,
    stop: multiprocessing.synchronize.Event,
    reports: _Reports,
    log_level: int = logging.WARNING,
) -> None:
    """Entry point of one receiver node process (spawned by the demo)."""
    # Ctrl-C reaches the whole process group; the main process decides when nodes stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=log_level, format=f"node {spec.name} %(levelname)s %(name)s: %(message)s"
    )
    try:
        if spec.facade == "async":
            counts = asyncio.run(_serve_async_node(url, prefix, spec, stop, reports))
        else:
            counts = _serve_sync_node(url, prefix, spec, stop, reports)
    except Exception as exc:
        logger.error("node %s failed error=%s", spec.name, exc, exc_info=True)
        reports.put(("failed", spec.name, {}))
        raise SystemExit(1) from exc
    reports.put(("done", spec.name, dict(counts)))


# -- the receiver processes, seen from the main process ------------------------------------------


@dataclass
class _Node:
    spec: NodeSpec
    process: multiprocessing.process.BaseProcess
    handled: dict[str, int] | None = None


class ReceiverNodes:
    """The demo's receiver processes: start (bounded wait for ready) and stop (bounded)."""

    def __init__(self, url: str, prefix: str, specs: Sequence[NodeSpec]) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._stop = self._ctx.Event()
        self._reports: _Reports = self._ctx.Queue()
        self._stopped = False
        # Nodes log like this process does (WARNING, or INFO with --verbose).
        log_level = logging.getLogger().getEffectiveLevel()
        self.nodes = [
            _Node(
                spec,
                self._ctx.Process(
                    target=receiver_main,
                    args=(url, prefix, spec, self._stop, self._reports, log_level),
                    name=f"prq-demo-node-{spec.name}",
                    daemon=True,
                ),
            )
            for spec in specs
        ]

    def start(self, timeout_s: float = DEFAULT_NODE_START_TIMEOUT_S) -> None:
        """Start every node and wait until each said it serves; RuntimeError if one did not."""
        for node in self.nodes:
            node.process.start()
        waiting = {node.spec.name for node in self.nodes}
        deadline = time.monotonic() + timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise RuntimeError(f"receiver node(s) {sorted(waiting)} not ready in {timeout_s} s")
            dead = [n.spec.name for n in self.nodes if n.process.exitcode is not None]
            if dead:
                raise RuntimeError(f"receiver node(s) {dead} exited during start-up")
            with contextlib.suppress(queue_module.Empty):
                kind, name, _ = self._reports.get(timeout=0.2)
                if kind == "ready":
                    waiting.discard(name)
                elif kind == "failed":
                    raise RuntimeError(f"receiver node {name} failed during start-up")
        logger.info("receiver nodes ready nodes=%s", [n.spec.name for n in self.nodes])

    def stop(self, timeout_s: float = DEFAULT_NODE_STOP_TIMEOUT_S) -> None:
        """Ask every node to stop, collect what it handled, then join, terminate, kill."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        by_name = {node.spec.name: node for node in self.nodes}
        started = [n for n in self.nodes if n.process.pid is not None]
        # Read reports before joining: a child with unread queue data cannot exit.
        while any(n.handled is None and n.process.is_alive() for n in started):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with contextlib.suppress(queue_module.Empty):
                kind, name, counts = self._reports.get(timeout=min(0.2, remaining))
                if kind == "done" and name in by_name:
                    by_name[name].handled = counts
        for node in started:
            process = node.process
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                logger.warning("node did not stop in time; terminating node=%s", node.spec.name)
                process.terminate()
                process.join(2.0)
            if process.is_alive():
                process.kill()
                process.join(2.0)
        with contextlib.suppress(queue_module.Empty, OSError, ValueError):
            while True:
                kind, name, counts = self._reports.get_nowait()
                if kind == "done" and name in by_name:
                    by_name[name].handled = counts
        self._reports.close()
        self._reports.join_thread()

    def node_of(self, endpoint: str) -> str:
        return next((n.spec.name for n in self.nodes if endpoint in n.spec.endpoints), "?")


# -- the senders and their statistics ------------------------------------------------------------


def _percentile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


@dataclass
class EndpointStats:
    """What the senders saw for one endpoint: totals and a recent window of latencies."""

    endpoint: str
    node: str
    window_s: float = DEFAULT_WINDOW_S
    calls: int = 0
    errors: int = 0
    failed: int = 0
    in_flight: int = 0
    recent: deque[tuple[float, float]] = field(default_factory=deque)

    def record(self, done_at: float, latency_ms: float, outcome: str) -> None:
        if outcome == "failed":
            self.failed += 1
            return
        self.calls += 1
        if outcome == "error":
            self.errors += 1
        self.recent.append((done_at, latency_ms))

    def trim(self, now: float) -> None:
        horizon = now - self.window_s
        while self.recent and self.recent[0][0] < horizon:
            self.recent.popleft()


class LatencySample:
    """A bounded uniform sample of every latency (reservoir), for the final percentiles."""

    def __init__(self, size: int = DEFAULT_RESERVOIR_SIZE, seed: int | None = None) -> None:
        self.size = size
        self.seen = 0
        self.values: list[float] = []
        self._rng = random.Random(seed)

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.size:
            self.values[slot] = value


#: (method, weight) of the calls the senders make.
_METHOD_WEIGHTS: tuple[tuple[str, int], ...] = (("echo", 4), ("sum", 3), ("sleep", 2), ("flaky", 1))


def _make_call(rng: random.Random) -> tuple[str, JsonValue]:
    methods = [m for m, _ in _METHOD_WEIGHTS]
    weights = [w for _, w in _METHOD_WEIGHTS]
    method = rng.choices(methods, weights)[0]
    params: JsonValue
    if method == "sum":
        params = {"values": [rng.randint(1, 500) for _ in range(rng.randint(1, 20))]}
    elif method == "sleep":
        params = {"ms": rng.randint(2, 8)}
    elif method == "echo":
        params = {"text": "hello", "n": rng.randint(0, 1_000_000)}
    else:
        params = None
    return method, params


class Senders:
    """`concurrency` asyncio tasks calling random endpoints on one AsyncQueue."""

    def __init__(
        self,
        queue: AsyncQueue,
        stats: dict[str, EndpointStats],
        concurrency: int,
        seed: int | None,
    ) -> None:
        self.queue = queue
        self.stats = stats
        self.concurrency = concurrency
        self.sample = LatencySample(seed=seed)
        self._rng = random.Random(seed)
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name=f"prq-demo-sender-{i}")
            for i in range(self.concurrency)
        ]

    async def _run(self) -> None:
        endpoints = sorted(self.stats)
        while not self._stopping:
            endpoint = self._rng.choice(endpoints)
            method, params = _make_call(self._rng)
            stats = self.stats[endpoint]
            stats.in_flight += 1
            started = time.perf_counter()
            try:
                await self.queue.call(
                    endpoint,
                    method,
                    params,
                    pickup_timeout_s=DEFAULT_PICKUP_TIMEOUT_S,
                    timeout_s=DEFAULT_CALL_TIMEOUT_S,
                )
                outcome = "ok"
            except RemoteError:
                outcome = "error"
            except PrqError as exc:
                outcome = "failed"
                logger.warning("call failed endpoint=%r method=%s error=%s", endpoint, method, exc)
            finally:
                stats.in_flight -= 1
            done_at = time.perf_counter()
            latency_ms = (done_at - started) * 1000
            stats.record(time.monotonic(), latency_ms, outcome)
            if outcome == "failed":
                await asyncio.sleep(0.1)  # do not spin while Redis or a node is down
            else:
                self.sample.add(latency_ms)

    async def stop(self, timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> None:
        """Let each sender finish its current call (bounded), then cancel the stragglers."""
        self._stopping = True
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=2.0)
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                logger.error("sender crashed", exc_info=task.exception())


# -- rendering -----------------------------------------------------------------------------------


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


@dataclass(frozen=True, slots=True)
class _Row:
    endpoint: str
    node: str
    calls: int
    rate: float
    p50: float | None
    p99: float | None
    in_flight: int
    errors: int
    failed: int


def _rows(stats: dict[str, EndpointStats], elapsed_s: float) -> tuple[list[_Row], _Row]:
    now = time.monotonic()
    span = max(1e-3, min(DEFAULT_WINDOW_S, elapsed_s))
    rows: list[_Row] = []
    everything: list[float] = []
    for name in sorted(stats):
        s = stats[name]
        s.trim(now)
        latencies = sorted(latency for _, latency in s.recent)
        everything.extend(latencies)
        rows.append(
            _Row(
                name,
                s.node,
                s.calls,
                len(latencies) / span,
                _percentile(latencies, 0.50),
                _percentile(latencies, 0.99),
                s.in_flight,
                s.errors,
                s.failed,
            )
        )
    everything.sort()
    total = _Row(
        "total",
        "",
        sum(r.calls for r in rows),
        sum(r.rate for r in rows),
        _percentile(everything, 0.50),
        _percentile(everything, 0.99),
        sum(r.in_flight for r in rows),
        sum(r.errors for r in rows),
        sum(r.failed for r in rows),
    )
    return rows, total


def render_table(stats: dict[str, EndpointStats], elapsed_s: float, title: str) -> Table:
    """The live table: one row per endpoint and a total row."""
    rows, total = _rows(stats, elapsed_s)
    table = Table(
        title=title,
        caption=(
            f"calls/s, p50, p99: last {DEFAULT_WINDOW_S:g} s · errors: the service raised "
            "(flaky on purpose) · failed: prq could not complete the call"
        ),
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    table.add_column("endpoint (node)", no_wrap=True)
    for header in ("calls", "calls/s", "p50\nms", "p99\nms", "in\nflight", "errors", "failed"):
        table.add_column(header, justify="right", no_wrap=True)
    for row in [*rows, total]:
        table.add_row(
            f"{row.endpoint} ({row.node})" if row.node else row.endpoint,
            str(row.calls),
            f"{row.rate:.0f}",
            _fmt_ms(row.p50),
            _fmt_ms(row.p99),
            str(row.in_flight),
            str(row.errors),
            f"[red]{row.failed}[/red]" if row.failed else "0",
            style="bold" if row is total else None,
            end_section=row is rows[-1] if rows else False,
        )
    return table


def _status_line(stats: dict[str, EndpointStats], elapsed_s: float) -> str:
    _, total = _rows(stats, elapsed_s)
    return (
        f"t={elapsed_s:5.1f}s calls={total.calls} calls/s={total.rate:.0f} "
        f"p50={_fmt_ms(total.p50)}ms p99={_fmt_ms(total.p99)}ms in_flight={total.in_flight} "
        f"errors={total.errors} failed={total.failed}"
    )


# -- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoResult:
    calls: int
    errors: int
    failed: int
    elapsed_s: float
    p50_ms: float | None
    p99_ms: float | None


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


async def _drive(
    config: DemoConfig, url: str, nodes: ReceiverNodes, console: Console
) -> DemoResult:
    stats = {
        endpoint: EndpointStats(endpoint, nodes.node_of(endpoint))
        for spec in config.nodes
        for endpoint in spec.endpoints
    }
    stop = asyncio.Event()
    settings = QueueSettings(pickup_timeout_s=DEFAULT_PICKUP_TIMEOUT_S)
    async with AsyncQueue.from_url(url, prefix=config.prefix, settings=settings) as queue:
        senders = Senders(queue, stats, config.concurrency, config.seed)
        started = time.monotonic()
        deadline = started + config.duration_s if config.duration_s > 0 else None
        until = f"{config.duration_s:g} s" if deadline is not None else "Ctrl-C"
        title = f"prq demo: {config.concurrency} senders, 2 nodes, until {until}"
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
                if deadline is not None and now >= deadline:
                    stop.set()
                if live is not None:
                    live.update(render_table(stats, now - started, title), refresh=True)
                elif now >= next_line:
                    console.print(_status_line(stats, now - started), highlight=False)
                    next_line = now + DEFAULT_HEADLESS_LINE_S
            await senders.stop()
            elapsed = time.monotonic() - started
            final = render_table(stats, elapsed, title)
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
        p50_ms=_percentile(values, 0.50),
        p99_ms=_percentile(values, 0.99),
    )


def _summary(result: DemoResult, nodes: ReceiverNodes) -> str:
    rate = result.calls / result.elapsed_s if result.elapsed_s > 0 else 0.0
    handled = ", ".join(
        f"{n.spec.name}={sum(n.handled.values()) if n.handled is not None else '?'}"
        for n in nodes.nodes
    )
    return (
        f"prq demo: {result.calls} calls in {result.elapsed_s:.1f} s ({rate:.0f} calls/s), "
        f"p50 {_fmt_ms(result.p50_ms)} ms, p99 {_fmt_ms(result.p99_ms)} ms, "
        f"{result.errors} errors raised by the service, {result.failed} failed; "
        f"handled by node {handled}"
    )


def run_demo(config: DemoConfig, console: Console | None = None) -> int:
    """Run the demo (see the module docstring); returns the process exit code."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            # A pipe or a log file has no width; rich would assume 80 columns and squeeze.
            console = Console(width=max(console.width, DEFAULT_HEADLESS_WIDTH))
    with contextlib.ExitStack() as stack:
        url = config.url
        if url is None:
            from prq.embedded import EmbeddedRedis

            server = EmbeddedRedis().start()
            stack.callback(server.cleanup)
            url = server.url
            console.print(f"embedded redis-server on {url} (set PRQ_REDIS_URL to use yours)")
        else:
            problem = _unreachable(url)
            if problem is not None:
                console.print(f"[red]cannot reach Redis at {url}: {problem}[/red]")
                return 1
            console.print(f"using Redis at {url}")
        nodes = ReceiverNodes(url, config.prefix, config.nodes)
        stack.callback(nodes.stop)
        console.print("starting receiver nodes " + ", ".join(_describe(s) for s in config.nodes))
        try:
            nodes.start()
        except RuntimeError as exc:
            console.print(f"[red]demo could not start: {exc}[/red]")
            return 1
        try:
            result = asyncio.run(_drive(config, url, nodes, console))
        except PrqError as exc:
            console.print(f"[red]demo stopped: {type(exc).__name__}: {exc}[/red]")
            return 1
        nodes.stop()
        console.print(_summary(result, nodes), highlight=False, soft_wrap=True)
        return 0 if result.calls > 0 else 1
    return 1  # pragma: no cover  (ExitStack does not swallow exceptions)


def _unreachable(url: str) -> str | None:
    """Why Redis at `url` cannot be used, or None; fails fast instead of after retry budgets."""
    try:
        client = redis.Redis.from_url(
            url,
            socket_timeout=DEFAULT_PING_TIMEOUT_S,
            socket_connect_timeout=DEFAULT_PING_TIMEOUT_S,
        )
    except ValueError as exc:
        return str(exc)
    try:
        client.ping()
    except redis.RedisError as exc:
        return str(exc) or type(exc).__name__
    finally:
        client.close()
    return None


def _describe(spec: NodeSpec) -> str:
    return f"{spec.name} ({spec.facade}: {', '.join(spec.endpoints)})"


if __name__ == "__main__":
    raise SystemExit(run_demo(DemoConfig()))
