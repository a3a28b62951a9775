"""Redis going away: a short outage is ridden out by the retry budget (a network cut goes
unnoticed; a restart, which loses the data of a Redis without persistence as prq wants it, fails
a call at most with a retryable DataLoss); a hung Redis cannot hold a caller past the budget
(plus one socket timeout)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from prq import DataLoss, QueueUnavailable, RedisSettings, Request
from prq.embedded import EmbeddedRedis
from tests.fault.proxy import FaultProxy
from tests.queue_facades import QueueFactory

pytestmark = pytest.mark.integration

BUDGET_S = 1.0
SOCKET_TIMEOUT_S = 0.5
#: The documented bound for giving up: budget + one socket timeout + 1 s (plus test slack).
GIVE_UP_BOUND_S = BUDGET_S + SOCKET_TIMEOUT_S + 1.0 + 1.0


def echo(request: Request) -> object:
    return request.params


async def test_a_hung_redis_fails_the_call_within_the_budget(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis
) -> None:
    # Given a started node with a short retry budget and socket timeout
    redis_settings = RedisSettings(url=own_redis.url, socket_timeout_s=SOCKET_TIMEOUT_S)
    sender = make_own_queue(retry_budget_s=BUDGET_S, redis_settings=redis_settings)
    await sender.start()
    # When Redis hangs (SIGSTOP) and a call is made
    own_redis.pause()
    try:
        started = time.monotonic()
        with pytest.raises(QueueUnavailable) as raised:
            await asyncio.wait_for(sender.call("poll://hung", "m"), GIVE_UP_BOUND_S + 5)
        elapsed = time.monotonic() - started
    finally:
        own_redis.resume()
    # Then it fails with a retryable QueueUnavailable, within the bound
    print(f"QueueUnavailable after {elapsed:.2f} s (bound {GIVE_UP_BOUND_S:.1f} s)")
    assert elapsed < GIVE_UP_BOUND_S
    assert raised.value.retryable


async def test_a_short_outage_is_ridden_out(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis
) -> None:
    # Given a sender and a serving receiver that reach Redis through one network link, with a
    # retry budget of several seconds
    link = FaultProxy(own_redis.port, name="outage")
    try:
        through_link = RedisSettings(url=link.url)
        sender = make_own_queue(retry_budget_s=10, redis_settings=through_link)
        receiver = make_own_queue(
            retry_budget_s=10, dequeue_timeout_s=2, redis_settings=through_link
        )
        make_own_queue.serve(receiver, "poll://blip", echo)
        assert await asyncio.wait_for(sender.call("poll://blip", "m", "before"), 10) == "before"

        # When the link is cut (every connection reset, new ones refused), a call starts
        # while it is down, and the link is back half a second later
        link.cut()
        restore = threading.Timer(0.5, link.restore)
        restore.start()
        try:
            result = await asyncio.wait_for(sender.call("poll://blip", "m", "during"), 20)
        finally:
            restore.join(10)

        # Then the call completes, and later calls work as before
        assert result == "during"
        assert await asyncio.wait_for(sender.call("poll://blip", "m", "after"), 10) == "after"
    finally:
        await make_own_queue.aclose()
        link.close()


async def test_a_restart_that_lost_the_data_fails_a_call_at_most_with_a_retryable_data_loss(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis
) -> None:
    # Given a sender and a serving receiver with a retry budget of several seconds
    sender = make_own_queue(retry_budget_s=10)
    receiver = make_own_queue(retry_budget_s=10, dequeue_timeout_s=2)
    make_own_queue.serve(receiver, "poll://blip", echo)
    assert await asyncio.wait_for(sender.call("poll://blip", "m", "before"), 10) == "before"

    # When Redis dies, a call starts while it is down, and Redis is back, empty, half a second
    # later
    own_redis.kill()
    restart = threading.Timer(0.5, own_redis.start)
    restart.start()
    try:
        result = await asyncio.wait_for(sender.call("poll://blip", "m", "during"), 20)
    except DataLoss as exc:
        # Then the call either completes, or (if a node noticed the loss while the call was
        # on its way: README "Redis loses data") fails with a retryable DataLoss
        assert exc.retryable
        result = "during"
    finally:
        restart.join(10)
    assert result == "during"

    # And once the nodes have noticed the loss, calls work as before
    for attempt in range(3):
        try:
            result = await asyncio.wait_for(sender.call("poll://blip", "m", "after"), 10)
            break
        except DataLoss:
            assert attempt < 2, "three calls in a row failed with DataLoss"
    assert result == "after"
