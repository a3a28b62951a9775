"""The inspector behind the admin service and `prq stats` serves concurrent reads: a dashboard
refresh asks for endpoints, queued requests, limits and dead letters at once, beside the
throughput sampler. Before, its pool held at most 4 connections and refused a fifth at once
("Too many connections"), which the admin service answered 503 queue_unavailable (seen as the
dashboard's "Could not refresh" on a loaded gate)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from prq.ops.inspector import Inspector

pytestmark = pytest.mark.integration

#: Reads at once: a dashboard refresh (four or five calls) from a few browser tabs.
CONCURRENT_READS = 24


async def test_many_reads_at_once_are_all_served(redis_url: str, key_prefix: str) -> None:
    # Given the inspector the admin service builds
    inspector = Inspector.from_url(redis_url, prefix=key_prefix)
    try:
        # When many reads go at once
        reads: list[Coroutine[Any, Any, object]] = [
            inspector.endpoints() for _ in range(CONCURRENT_READS // 2)
        ]
        reads += [inspector.queued("poll://busy-dashboard") for _ in range(CONCURRENT_READS // 2)]
        results = await asyncio.wait_for(asyncio.gather(*reads, return_exceptions=True), 30)
    finally:
        await inspector.aclose()

    # Then every one is answered, none refused for want of a connection
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == []
