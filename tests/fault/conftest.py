"""Fault-bed fixtures: a Redis of the test's own, proxies per node link, node processes.

The shrunk timings (FAULT_TIMINGS, FAULT_REDIS_SETTINGS) live in tests/fault/timings.py.

- `fault_redis`: a private `EmbeddedRedis` (the test may kill, pause, flush or roll it back);
  `fault_client` a plain client on it. `fault_cluster`: a private Redis Cluster (ClusterSet).
- `make_proxy(port=None, **kw)`: a `FaultProxy` to `fault_redis` (or `port`); closed at teardown.
- `fault_dir`: the test's directory for ledgers, histories, ready and barrier files, logs.
- `fault_facade` ("async" / "sync", parametrised) and `fault_queues`: in-process queues (nodes
  inside the test process) of that facade on `fault_redis` with FAULT_TIMINGS;
  `fault_queues(url=proxy.url)` is a node behind a proxy, `fault_queues()` one straight to Redis,
  `fault_queues.serve(queue, endpoint, handler)` a serve loop; all closed at teardown.
- `nodes`: a `NodeFactory` on `fault_redis` with the test's prefix and FAULT_TIMINGS; every node
  still alive at teardown is killed (SIGKILL, by pid).

A test module that defines `soak_timeout_s(minutes)` (the operations soak) gets its timeout
from it, for the length `--soak-minutes` asks for (None: its CI length).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from prq.embedded import EmbeddedRedis
from tests.cluster_servers import ClusterSet
from tests.fault.nodes import NodeFactory
from tests.fault.proxy import FaultProxy
from tests.fault.timings import FAULT_REDIS_SETTINGS, FAULT_TIMINGS, FaultQueueFactory
from tests.redis_servers import new_prefix


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    minutes = config.getoption("--soak-minutes")
    for item in items:
        timeout_for = getattr(getattr(item, "module", None), "soak_timeout_s", None)
        if timeout_for is not None:
            item.add_marker(pytest.mark.timeout(timeout_for(minutes)))


@pytest.fixture
def fault_redis() -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own, on a free loopback port."""
    server = EmbeddedRedis().start()
    try:
        yield server
    finally:
        server.resume()
        server.cleanup()


@pytest.fixture
def fault_cluster() -> Iterator[ClusterSet]:
    """A Redis Cluster of this test's own: 3 masters, a replica each (it may kill or reshard)."""
    servers = ClusterSet()
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture
def fault_client(fault_redis: EmbeddedRedis) -> Iterator[redis.Redis]:
    """A plain client straight to `fault_redis` (no proxy)."""
    client = redis.Redis.from_url(fault_redis.url, socket_timeout=10)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def fault_prefix() -> str:
    """The test's key prefix (the server is the test's own, so nothing to clean)."""
    return new_prefix()


@pytest.fixture
def fault_dir(tmp_path: Path) -> Path:
    """Where the test's ledgers, histories, barrier files and node logs go."""
    path = tmp_path / "fault"
    path.mkdir()
    return path


@pytest.fixture
def make_proxy(fault_redis: EmbeddedRedis) -> Iterator[Callable[..., FaultProxy]]:
    """Factory of proxies to `fault_redis` (or to `port`); all closed at teardown."""
    proxies: list[FaultProxy] = []

    def make(port: int | None = None, **kwargs: Any) -> FaultProxy:
        proxy = FaultProxy(port or fault_redis.port, **kwargs)
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.close()


@pytest.fixture
def nodes(fault_redis: EmbeddedRedis, fault_prefix: str, fault_dir: Path) -> Iterator[NodeFactory]:
    """Node processes on `fault_redis` (pass `redis_url=proxy.url` per node to go through one)."""
    factory = NodeFactory(
        fault_dir,
        redis_url=fault_redis.url,
        prefix=fault_prefix,
        queue_settings=dict(FAULT_TIMINGS),
        redis_settings=dict(FAULT_REDIS_SETTINGS),
    )
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture(params=["async", "sync"])
def fault_facade(request: pytest.FixtureRequest) -> str:
    """Which facade the in-process queues of the test use."""
    param: str = request.param
    return param


@pytest.fixture
async def fault_queues(
    fault_facade: str, fault_redis: EmbeddedRedis, fault_prefix: str
) -> AsyncIterator[FaultQueueFactory]:
    """In-process queues (nodes) on `fault_redis`, directly or through a proxy's URL."""
    factory = FaultQueueFactory(fault_facade, fault_redis.url, fault_prefix)
    try:
        yield factory
    finally:
        await factory.aclose()
