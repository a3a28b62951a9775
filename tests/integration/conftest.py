"""Integration fixtures: every test runs once per facade ("async" and "sync").

- `facade`: "async" or "sync" (parametrised, so each scenario runs on both).
- `make_queue(**settings_overrides)`: a new node (queue) of that facade on the test's prefix,
  with `FAST_SETTINGS`; `make_queue.serve(queue, endpoint, handler, concurrency=...)` starts a
  serve loop. Everything is stopped and closed at teardown.
- `make_own_queue`: the same, on the test's own server (`own_redis`).
- `prq`: runs `prq` commands as processes (PrqRunner) against the test's Redis and prefix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from prq.embedded import EmbeddedRedis
from tests.integration.test_cli import PrqRunner
from tests.queue_facades import QueueFactory


@pytest.fixture(params=["async", "sync"])
def facade(request: pytest.FixtureRequest) -> str:
    """Which facade drives the test."""
    param: str = request.param
    return param


@pytest.fixture
async def make_queue(facade: str, redis_url: str, key_prefix: str) -> AsyncIterator[QueueFactory]:
    """Factory of queues on the shared server under the test's own key prefix."""
    factory = QueueFactory(facade, redis_url, key_prefix)
    try:
        yield factory
    finally:
        await factory.aclose()


@pytest.fixture
async def make_own_queue(
    facade: str, own_redis: EmbeddedRedis, key_prefix: str
) -> AsyncIterator[QueueFactory]:
    """Factory of queues on the test's own server (which the test may flush or stop)."""
    factory = QueueFactory(facade, own_redis.url, key_prefix)
    try:
        yield factory
    finally:
        await factory.aclose()


@pytest.fixture
def prq(redis_url: str, key_prefix: str) -> Iterator[PrqRunner]:
    """Runs `prq` commands as processes against the test's Redis and prefix; kills what it
    started at teardown."""
    runner = PrqRunner(redis_url, key_prefix)
    try:
        yield runner
    finally:
        runner.close()
