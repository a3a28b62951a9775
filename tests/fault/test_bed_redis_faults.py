"""Self-tests of the Redis-side faults: each really does what a scenario relies on."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from prq.embedded import EmbeddedRedis
from tests.fault.proxy import FaultProxy
from tests.fault.redis_faults import (
    StaleReplica,
    TtlAuditor,
    client_for,
    crash,
    fail_over,
    flushall,
    paused,
    restart_empty,
    rollback_to_snapshot,
    snapshot,
)

pytestmark = pytest.mark.fault

MakeProxy = Callable[..., FaultProxy]


def test_restart_empty_and_flushall(fault_redis: EmbeddedRedis, fault_client: redis.Redis) -> None:
    port = fault_redis.port
    fault_client.set("k", "v")
    snapshot(fault_redis)  # even a snapshot on disk must not come back
    pid = fault_redis.pid
    crash(fault_redis)
    restart_empty(fault_redis)
    assert fault_redis.port == port and fault_redis.pid != pid
    assert fault_client.get("k") is None
    fault_client.set("k", "v")
    flushall(fault_redis)
    assert fault_client.dbsize() == 0


def test_paused_server_times_out_then_answers(fault_redis: EmbeddedRedis) -> None:
    client = redis.Redis(port=fault_redis.port, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    try:
        with paused(fault_redis), pytest.raises(redis.TimeoutError):
            client.ping()
        assert client.ping()
    finally:
        client.close()


@pytest.mark.parametrize("background", [False, True])
def test_rollback_to_snapshot_brings_back_old_data(
    fault_redis: EmbeddedRedis, fault_client: redis.Redis, background: bool
) -> None:
    # Given a snapshot taken while k=old and a counter at 1
    fault_client.set("k", "old")
    fault_client.incr("counter")
    snapshot(fault_redis, background=background)
    # And more writes after it
    fault_client.set("k", "new")
    fault_client.set("later", "1")
    fault_client.incr("counter")
    # When Redis crashes and restarts from that snapshot
    rollback_to_snapshot(fault_redis)
    # Then it is back in time: the old value, the lower counter, the later key gone
    assert fault_client.get("k") == b"old"
    assert fault_client.get("counter") == b"1"
    assert fault_client.get("later") is None


def test_stale_replica_promoted_misses_recent_writes(
    fault_redis: EmbeddedRedis, make_proxy: MakeProxy
) -> None:
    node_link = make_proxy()
    node = redis.Redis.from_url(node_link.url, socket_timeout=2)
    try:
        # Given a replica in sync with the primary
        node.set("before", "1")
        node.incr("counter")
        with StaleReplica(fault_redis) as stale, client_for(stale.replica) as replica:
            assert replica.get("before") == b"1"
            # When replication silently stops and the primary takes more writes
            stale.freeze()
            node.set("after", "1")
            node.incr("counter")
            assert node.get("after") == b"1"
            # And the primary dies and the stale replica is promoted; the node's link follows
            promoted = stale.promote()
            fail_over([node_link], promoted)
            # Then "the primary" the node reaches has the old state
            assert node.get("before") == b"1"
            assert node.get("after") is None
            assert node.get("counter") == b"1"
            assert replica.info("replication")["role"] == "master"
            node.set("writable", "1")  # and it takes writes
    finally:
        node.close()


def test_ttl_auditor_sees_keys_without_ttl(
    fault_redis: EmbeddedRedis, fault_client: redis.Redis
) -> None:
    fault_client.set("p:with", "1", ex=60)
    fault_client.set("p:without", "1")
    fault_client.set("other:without", "1")
    with TtlAuditor(fault_redis, "p", interval_s=0.05) as auditor:
        auditor.sample()
    assert auditor.no_ttl == {"p:without"}
    assert auditor.samples >= 1
