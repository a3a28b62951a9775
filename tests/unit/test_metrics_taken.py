"""A take's requests are counted, and each one's wait for pickup observed."""

from __future__ import annotations

import time

from prometheus_client import REGISTRY

from prq.observe import metrics


def _sample(name: str, endpoint: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, {"endpoint": endpoint, **labels})
    return 0.0 if value is None else value


def test_a_take_counts_its_requests_and_observes_each_wait() -> None:
    endpoint = "poll://metrics-taken"
    now_ms = int(time.time() * 1000)
    # a hand-off (no wait), one queued 30 s ago and one queued a minute ago, and a clock
    # behind the sender's (a creation time in the future reads as no wait)
    metrics.taken(endpoint, [0, now_ms - 30_000, now_ms - 60_000, now_ms + 5_000])
    assert _sample("prq_taken_total", endpoint) == 4
    assert _sample("prq_pickup_wait_seconds_count", endpoint) == 4
    waited = _sample("prq_pickup_wait_seconds_sum", endpoint)
    assert 90.0 <= waited < 95.0
    assert _sample("prq_pickup_wait_seconds_bucket", endpoint, le="0.001") == 2
    metrics.taken(endpoint, [])
    assert _sample("prq_taken_total", endpoint) == 4
