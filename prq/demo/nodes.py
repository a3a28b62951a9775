"""The receiver node processes: what runs inside one (receiver_main) and how the demo drives them.

Each node is a spawned process serving its endpoints with one facade: AsyncQueue.serve tasks
(facade "async") or Queue.serve threads (facade "sync"). It reports to the main process over a
multiprocessing queue: ("ready", name, {}) once serving, ("done", name, handled per endpoint)
after a clean stop, ("failed", name, {}) if it crashed. `ReceiverNodes` is the main process's
side: start with a bounded wait for "ready", stop with a bounded join, then terminate, then kill.
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
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from pydantic import JsonValue

from prq.core.models import Request
from prq.demo.config import NodeSpec
from prq.demo.services import compute, sleep_ms
from prq.facade.asyncio_queue import AsyncQueue
from prq.facade.blocking_queue import Queue

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_NODE_START_TIMEOUT_S",
    "DEFAULT_NODE_STOP_TIMEOUT_S",
    "ReceiverNodes",
    "Report",
    "receiver_main",
]

#: How long a node may take to start (spawn imports, connect, subscribe).
DEFAULT_NODE_START_TIMEOUT_S = 30.0
#: How long a node may take to finish its held requests after being asked to stop.
DEFAULT_NODE_STOP_TIMEOUT_S = 5.0

#: Messages from a node to the main process: (kind, node name, handled per endpoint).
Report = tuple[str, str, dict[str, int]]
if TYPE_CHECKING:
    _Reports: TypeAlias = multiprocessing.queues.Queue[Report]


# -- inside a receiver node (the spawned process) ------------------------------------------------


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
        delay_ms = sleep_ms(request)
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        tally.add(request.endpoint)
        return compute(request)

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
        delay_ms = sleep_ms(request)
        if delay_ms:
            time.sleep(delay_ms / 1000)
        tally.add(request.endpoint)
        return compute(request)

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
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    logging.basicConfig(
        level=log_level, format=f"node {spec.name} %(levelname)s %(name)s: %(message)s"
    )
    # The demo's flaky services fail on purpose (the table counts their RemoteErrors): their
    # tracebacks would bury the table, so the receivers' handler-failure log stays quiet.
    logging.getLogger("prq.serve.handled").setLevel(logging.CRITICAL)
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
        # Spawned with SIGINT blocked: a Ctrl-C while a node still imports must not kill it
        # half-started (a running node ignores SIGINT and unblocks it, see receiver_main).
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for node in self.nodes:
                node.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
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
