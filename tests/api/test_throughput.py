"""The throughput sampler's arithmetic: rates between samples, counter resets, bounded memory.
(No Redis: samples are recorded directly with chosen times.)"""

from __future__ import annotations

import asyncio

import pytest

from api.throughput import MAX_SERIES, ThroughputSampler
from tests.redis_servers import async_wait_until


async def no_totals() -> dict[str, int]:
    return {}


def sampler(window_s: float = 60.0, interval_s: float = 1.0) -> ThroughputSampler:
    return ThroughputSampler(
        no_totals,
        interval_s=interval_s,
        window_s=window_s,
        max_samples=int(window_s / interval_s) + 1,
        timeout_s=1.0,
    )


def points(s: ThroughputSampler, endpoint: str) -> list[tuple[int, float]]:
    return next(series.points for series in s.snapshot().series if series.endpoint == endpoint)


def test_rates_are_increases_over_elapsed_time() -> None:
    s = sampler()
    s.record(1_000, {"poll://a": 10})
    s.record(2_000, {"poll://a": 30})
    s.record(4_000, {"poll://a": 30})
    assert points(s, "poll://a") == [(2_000, 20.0), (4_000, 0.0)]


def test_a_counter_that_went_down_counts_its_new_value() -> None:
    # Redis lost its data: the counter starts again from zero
    s = sampler()
    s.record(1_000, {"poll://a": 500})
    s.record(2_000, {"poll://a": 7})
    assert points(s, "poll://a") == [(2_000, 7.0)]


def test_old_samples_leave_the_window_and_silent_endpoints_are_dropped() -> None:
    s = sampler(window_s=10.0)
    s.record(0, {"poll://a": 1, "poll://gone": 1})
    s.record(5_000, {"poll://a": 2})
    s.record(12_000, {"poll://a": 3})
    snapshot = s.snapshot()
    assert [series.endpoint for series in snapshot.series] == ["poll://a"]
    assert points(s, "poll://a") == [(12_000, 1 / 7)]
    assert (snapshot.window_s, snapshot.interval_s) == (10.0, 1.0)


def test_memory_is_bounded() -> None:
    s = sampler(window_s=1e9, interval_s=1.0)
    s = ThroughputSampler(no_totals, interval_s=1, window_s=1e9, max_samples=5, timeout_s=1)
    for t in range(100):
        s.record(t * 1000, {f"poll://{i}": t for i in range(MAX_SERIES + 10)})
    series = s.snapshot().series
    assert len(series) == MAX_SERIES
    assert all(len(one.points) == 4 for one in series)


@pytest.mark.parametrize("failure", [RuntimeError("boom"), TimeoutError()])
async def test_a_failed_sample_is_skipped(failure: Exception) -> None:
    async def failing() -> dict[str, int]:
        raise failure

    s = ThroughputSampler(failing, interval_s=1, window_s=10, max_samples=11, timeout_s=1)
    await s.sample_once()
    assert s.snapshot().series == []


async def test_the_sampler_stops_promptly() -> None:
    calls = 0

    async def count() -> dict[str, int]:
        nonlocal calls
        calls += 1
        return {"poll://a": calls}

    s = ThroughputSampler(count, interval_s=3600, window_s=7200, max_samples=3, timeout_s=1)
    s.start()
    await async_wait_until(lambda: calls >= 1, 5, 0.01, "the first sample was taken")
    await asyncio.wait_for(s.aclose(), 5)  # does not wait out the hour-long interval
    assert calls == 1
