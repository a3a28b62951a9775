"""The load generators: `concurrency` asyncio tasks calling random endpoints and methods.

Each sender makes one call at a time (echo, sum, sleep or flaky, weighted), records the
outcome in its endpoint's `EndpointStats` and, unless prq failed the call, the latency in
the run's `LatencySample`. Stopping lets each finish its call (bounded), then cancels.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from pydantic import JsonValue

from prq.core.errors import PrqError, RemoteError
from prq.demo.stats import EndpointStats, LatencySample
from prq.facade.asyncio_queue import AsyncQueue

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "DEFAULT_DRAIN_TIMEOUT_S",
    "DEFAULT_PICKUP_TIMEOUT_S",
    "Senders",
]

#: How long senders may take to finish their current call once the demo stops.
DEFAULT_DRAIN_TIMEOUT_S = 5.0
#: Pickup timeout and call timeout of every demo call (bounds each sender's wait).
DEFAULT_PICKUP_TIMEOUT_S = 10.0
DEFAULT_CALL_TIMEOUT_S = 15.0


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
        self._rng = random.Random(seed)  # noqa: S311 (the demo's load, not a secret)
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
