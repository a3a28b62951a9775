"""What the senders saw: per-endpoint totals and recent latencies, and a sample of all latencies.

`EndpointStats` keeps a sliding window (the last `DEFAULT_WINDOW_S` seconds) for the live
calls/s, p50 and p99; `LatencySample` keeps a bounded uniform sample for the final percentiles.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_RESERVOIR_SIZE",
    "DEFAULT_WINDOW_S",
    "EndpointStats",
    "LatencySample",
    "percentile",
]

#: Recent window over which calls/s, p50 and p99 are computed.
DEFAULT_WINDOW_S = 5.0
#: Latencies kept for the final percentiles (a uniform sample once more calls were made).
DEFAULT_RESERVOIR_SIZE = 100_000


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q` quantile of already sorted values; None when there are none."""
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
        self._rng = random.Random(seed)  # noqa: S311 (a sample, not a secret)

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.size:
            self.values[slot] = value
