"""The simulation's own Redis server, shared by its tests in one process: every run flushes it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from prq.embedded import EmbeddedRedis


@pytest.fixture(scope="session")
def sim_redis() -> Iterator[redis.Redis]:
    server = EmbeddedRedis().start()
    client = redis.Redis.from_url(server.url, socket_timeout=30)
    try:
        yield client
    finally:
        client.close()
        server.cleanup()
