"""Throughput over the last minutes: a background sampler of every endpoint's enqueue counter.

Every `interval_s` the sampler reads each endpoint's `enqueued_total` (one Redis read for all
endpoints) and keeps `(t_ms, enqueued_total)` in a ring buffer per endpoint, long enough to
cover `window_s`. A rate is the counter's increase between two neighbouring samples over their
time apart; a counter that went down (Redis lost its data and started again) counts its new
value as the increase, the way Prometheus treats a counter reset. Memory is bounded: at most
`max_samples` points per endpoint and `MAX_SERIES` endpoints; an endpoint that stopped being
reported is dropped once its last sample leaves the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping

from pydantic import BaseModel

__all__ = ["MAX_SERIES", "ReadTotals", "Throughput", "ThroughputSampler", "ThroughputSeries"]

logger = logging.getLogger(__name__)

#: Most endpoints tracked at once; further endpoints are left out of the chart (logged once).
MAX_SERIES = 1000
#: How long shutdown waits for a sample in progress before giving up on it.
STOP_TIMEOUT_S = 5.0

#: Reads every endpoint's enqueue counter: endpoint → enqueued_total.
ReadTotals = Callable[[], Awaitable[Mapping[str, int]]]


class ThroughputSeries(BaseModel):
    """One endpoint's enqueue rate: `[t_ms, requests per second]`, oldest first."""

    endpoint: str
    points: list[tuple[int, float]]


class Throughput(BaseModel):
    """Every endpoint's enqueue rate over the last `window_s`, one point per `interval_s`."""

    interval_s: float
    window_s: float
    series: list[ThroughputSeries]


def _rates(samples: deque[tuple[int, int]]) -> list[tuple[int, float]]:
    points: list[tuple[int, float]] = []
    previous: tuple[int, int] | None = None
    for t_ms, total in samples:
        if previous is not None:
            elapsed_s = (t_ms - previous[0]) / 1000
            increase = total - previous[1] if total >= previous[1] else total
            points.append((t_ms, increase / elapsed_s if elapsed_s > 0 else 0.0))
        previous = (t_ms, total)
    return points


class ThroughputSampler:
    """Samples enqueue counters in the background; `snapshot()` turns them into rates."""

    def __init__(
        self,
        read_totals: ReadTotals,
        *,
        interval_s: float,
        window_s: float,
        max_samples: int,
        timeout_s: float,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self._read_totals = read_totals
        self.interval_s = interval_s
        self.window_s = window_s
        self._max_samples = max_samples
        self._timeout_s = timeout_s
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._samples: dict[str, deque[tuple[int, int]]] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._warned_full = False

    # -- pure part ----------------------------------------------------------------------------

    def record(self, t_ms: int, totals: Mapping[str, int]) -> None:
        """Add one sample of every endpoint's counter, taken at `t_ms`."""
        for endpoint, total in totals.items():
            samples = self._samples.get(endpoint)
            if samples is None:
                if len(self._samples) >= MAX_SERIES:
                    if not self._warned_full:
                        logger.warning("throughput chart full max_series=%d", MAX_SERIES)
                        self._warned_full = True
                    continue
                samples = self._samples[endpoint] = deque(maxlen=self._max_samples)
            samples.append((t_ms, total))
        horizon_ms = t_ms - int(self.window_s * 1000)
        for endpoint in list(self._samples):
            samples = self._samples[endpoint]
            while samples and samples[0][0] < horizon_ms:
                samples.popleft()
            if not samples:
                del self._samples[endpoint]

    def snapshot(self) -> Throughput:
        """The rates between neighbouring samples, per endpoint (sorted by name)."""
        return Throughput(
            interval_s=self.interval_s,
            window_s=self.window_s,
            series=[
                ThroughputSeries(endpoint=endpoint, points=_rates(self._samples[endpoint]))
                for endpoint in sorted(self._samples)
            ],
        )

    # -- background task ----------------------------------------------------------------------

    def start(self) -> None:
        """Start sampling (first sample at once)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="prq-api-throughput")

    async def aclose(self) -> None:
        """Stop sampling; waits (bounded) for a sample in progress."""
        self._stop.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await task
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def sample_once(self) -> None:
        """Read the counters once and record them (errors are logged, never raised)."""
        try:
            async with asyncio.timeout(self._timeout_s):
                totals = await self._read_totals()
        except Exception as exc:
            logger.debug("throughput sample failed error=%r", exc)
            return
        self.record(self._clock_ms(), totals)

    async def _run(self) -> None:
        while not self._stop.is_set():
            await self.sample_once()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._stop.wait()
