"""A Sentinel-managed primary (redis+sentinel://), on a primary, a replica and a sentinel the
test starts: calls, bulk enqueue and outcomes go through it, and follow a failover within the
retry budget."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from prq import DataLoss, QueueSettings, Request
from prq.bulk import BulkClient
from prq.embedded import find_server_binary, free_port
from tests.integration.test_cli import PrqRunner
from tests.queue_facades import FAST_SETTINGS, QueueFactory, call_after_loss
from tests.redis_servers import PRQ_USER, acl_password, async_wait_until, wait_until
from tests.sentinel_servers import SentinelSet

pytestmark = pytest.mark.integration

ENDPOINT = "poll://through-sentinel"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    """A Sentinel set-up on the shipped users.acl (its replica and sentinels log in as the
    prq-replica and prq-sentinel users)."""
    servers = SentinelSet(acl_folder=tmp_path / "acl")
    try:
        yield servers
    finally:
        servers.close()


def app_url(servers: SentinelSet) -> str:
    """The set-up's redis+sentinel:// URL as the shipped ACL's application user."""
    return servers.url_for(PRQ_USER, acl_password(PRQ_USER))


@pytest.fixture
async def make_sentinel_queue(
    facade: str, sentinel_set: SentinelSet, key_prefix: str
) -> AsyncIterator[QueueFactory]:
    factory = QueueFactory(facade, app_url(sentinel_set), key_prefix)
    try:
        yield factory
    finally:
        await factory.aclose()


async def test_calls_go_through_the_sentinels_primary_and_follow_a_failover(
    sentinel_set: SentinelSet, make_sentinel_queue: QueueFactory
) -> None:
    # Given a caller and a receiver that know Redis only by its sentinel
    caller, receiver = make_sentinel_queue(), make_sentinel_queue()
    make_sentinel_queue.serve(receiver, ENDPOINT, lambda request: request.params)
    assert await asyncio.wait_for(caller.call(ENDPOINT, "echo", 1), 20) == 1

    # When the sentinel fails the primary over to the replica
    old = sentinel_set.primary_port()
    new = sentinel_set.fail_over()

    # Then calls go on, to the new primary, within the retry budget
    assert new != old
    for n in range(2, 6):
        assert await asyncio.wait_for(caller.call(ENDPOINT, "echo", n), 30) == n


async def test_bulk_enqueue_and_outcomes_go_through_the_sentinel(
    sentinel_set: SentinelSet, make_sentinel_queue: QueueFactory, key_prefix: str
) -> None:
    # Given a receiver, and a bulk client that knows Redis only by its sentinel
    make_sentinel_queue.serve(make_sentinel_queue(), ENDPOINT, lambda request: request.params)
    settings = QueueSettings(**FAST_SETTINGS)
    requests = [Request(endpoint=ENDPOINT, method="m", params=i, id=f"bulk:{i}") for i in range(20)]
    with BulkClient.from_url(app_url(sentinel_set), prefix=key_prefix, settings=settings) as bulk:
        # When it enqueues requests and reads their outcomes
        assert bulk.enqueue_many(requests).accepted == 20

        # Then every one is answered
        def answered() -> bool:
            found = bulk.outcomes(ENDPOINT, [r.id for r in requests])
            return all(s.state == "done" for s in found.values())

        await async_wait_until(answered, 20, 0.05, "all answered")


def test_the_command_line_finds_redis_through_the_sentinel(
    sentinel_set: SentinelSet, key_prefix: str
) -> None:
    # Given requests queued through the sentinel
    requests = [Request(endpoint=ENDPOINT, method="m", id=f"cli:{i}") for i in range(3)]
    with BulkClient.from_url(app_url(sentinel_set), prefix=key_prefix) as bulk:
        bulk.enqueue_many(requests)
    # When `prq stats` is given only the sentinel URL (as the read-only operator)
    runner = PrqRunner(sentinel_set.url_for("prq-admin", acl_password("prq-admin")), key_prefix)
    try:
        done = runner.run("stats", "--json")
    finally:
        runner.close()
    # Then it reads the endpoint and its queued requests from the primary
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    (info,) = [e for e in report["endpoints"] if e["endpoint"] == ENDPOINT]
    assert info["depth"] == 3 and report["redis"]["ok"] is True


async def test_a_failover_to_a_replica_that_missed_writes_fails_calls_in_flight_with_data_loss(
    facade: str, key_prefix: str, tmp_path: Path
) -> None:
    # Given a caller waiting on a request a receiver holds, written after replication to the
    # replica stopped (the replica missed it)
    servers = SentinelSet(acl_folder=tmp_path / "acl", freezable=True)
    factory = QueueFactory(facade, app_url(servers), key_prefix)
    try:
        watched: dict[str, Any] = {"data_loss_check_interval_s": 0.5, "retry_budget_s": 20.0}
        caller, receiver = factory(**watched), factory(**watched)
        factory.serve(receiver, "poll://warm", lambda request: request.params)
        assert await asyncio.wait_for(caller.call("poll://warm", "echo", 1), 20) == 1
        servers.freeze()
        call = asyncio.create_task(caller.call("poll://held", "m"))
        pending = await receiver.dequeue("poll://held", timeout_s=10)
        assert pending is not None

        # When the primary dies and the sentinels promote the stale replica
        servers.crash_primary()

        # Then the call fails with DataLoss (retryable, may have run), and the receiver's
        # held request is cancelled for data loss
        with pytest.raises(DataLoss) as raised:
            await asyncio.wait_for(call, 40)
        assert raised.value.retryable and raised.value.maybe_executed
        await async_wait_until(lambda: pending.cancelled, 20, 0.05, "the held one cancelled")
        assert pending.cancel_reason == "data_loss"
        # And calls work again on the new primary
        assert await call_after_loss(caller, "poll://warm", "echo", 2, 30) == 2
    finally:
        await factory.aclose()
        servers.close()


def test_the_shipped_sentinel_conf_is_one_redis_sentinel_accepts(tmp_path: Path) -> None:
    # Given redis-conf/sentinel.conf, watching a primary here instead of the compose service
    port = free_port()
    shipped = (ROOT / "redis-conf" / "sentinel.conf").read_text()
    config = tmp_path / "sentinel.conf"
    config.write_text(
        shipped.replace("port 26379", f"port {port}").replace(" redis 6379 ", " 127.0.0.1 6399 ")
    )
    # When a sentinel starts from it
    process = subprocess.Popen(
        [find_server_binary(), str(config), "--sentinel", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with redis.Redis(port=port, socket_timeout=2, decode_responses=True) as sentinel:

            def watching() -> dict[str, Any] | None:
                try:
                    return sentinel.sentinel_master("prq")  # type: ignore[no-any-return]
                except redis.RedisError:
                    return None

            wait_until(watching, 10, 0.05, "the sentinel answering")
            # Then it watches the primary named prq, with a quorum of 2
            master = watching()
            assert master is not None and (master["port"], master["quorum"]) == (6399, 2)
    finally:
        process.terminate()
        process.wait(10)
