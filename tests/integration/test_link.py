"""The asyncio node's command link pipelines its round trips on one connection: each reads its
own replies, in the order they were written, and a round trip that fails or is cancelled after
writing fails the ones written after it (unread) without leaving any reply for a later one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis
import redis.asyncio

from prq.core.errors import QueueShutdown
from prq.embedded import EmbeddedRedis
from prq.protocol.effects import Call
from prq.transport.links import AsyncLink, SyncLink
from tests.fault.proxy import FaultProxy
from tests.redis_servers import async_wait_until, wait_until

pytestmark = pytest.mark.integration

#: How long the first round trip's BLPOP may wait (the test releases it long before).
BLOCK_S = 10


@pytest_asyncio.fixture
async def link(own_redis: EmbeddedRedis) -> AsyncIterator[AsyncLink]:
    pool = redis.asyncio.ConnectionPool.from_url(own_redis.url, protocol=3, socket_timeout=20)
    link = AsyncLink(pool)
    try:
        yield link
    finally:
        await link.close()
        await pool.aclose()


def blocked_with_a_query_behind(client: redis.Redis) -> bool:
    """Whether a client waits in BLPOP with further commands already in its query buffer."""
    return any(c["cmd"] == "blpop" and int(c["qbuf"]) > 0 for c in client.client_list())


async def test_a_round_trip_is_written_while_the_one_before_waits_and_each_reads_its_own(
    link: AsyncLink, own_redis_client: redis.Redis
) -> None:
    # Given a round trip waiting for its reply (a BLPOP on an empty list)
    first = asyncio.ensure_future(link.round_trip([Call(("BLPOP", "lst", BLOCK_S))]))
    await async_wait_until(lambda: own_redis_client.client_list(), 5)

    # When two more are sent on the link meanwhile
    second = asyncio.ensure_future(link.round_trip([Call(("ECHO", "two")), Call(("INCR", "n"))]))
    third = asyncio.ensure_future(link.round_trip([Call(("ECHO", "three"))]))

    # Then their commands reach Redis at once, behind the waiting one on the same connection
    await async_wait_until(
        lambda: blocked_with_a_query_behind(own_redis_client), 5, 0.01, "pipelined"
    )
    assert not second.done() and not third.done()
    # And once the first is answered, each reads its own replies, in order
    own_redis_client.rpush("lst", "x")
    replies = await asyncio.wait_for(asyncio.gather(first, second, third), 10)
    assert list(replies) == [[[b"lst", b"x"]], [b"two", 1], [b"three"]]


async def test_a_round_trip_cancelled_after_writing_fails_the_ones_behind_it_unread(
    link: AsyncLink, own_redis_client: redis.Redis
) -> None:
    # Given a round trip waiting for its reply, and another written behind it
    first = asyncio.ensure_future(link.round_trip([Call(("BLPOP", "lst", BLOCK_S))]))
    second = asyncio.ensure_future(link.round_trip([Call(("ECHO", "two"))]))
    await async_wait_until(
        lambda: blocked_with_a_query_behind(own_redis_client), 5, 0.01, "pipelined"
    )

    # When the first is cancelled, and a value then pushed (it would answer the BLPOP)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first

    # Then the one behind fails without reading a reply that is not its own
    with pytest.raises(redis.ConnectionError):
        await asyncio.wait_for(second, 10)
    # (the value goes in once the server has let go of the dropped connection's BLPOP: it
    # would be handed to that BLPOP, into a closed socket, while the server has not yet seen
    # the connection close)
    await async_wait_until(
        lambda: not any(c["cmd"] == "blpop" for c in own_redis_client.client_list()),
        5, 0.01, "the dropped BLPOP gone from the server",
    )  # fmt: skip
    own_redis_client.rpush("lst", "x")
    # And the next round trip, on a new connection, reads exactly its own replies
    assert await asyncio.wait_for(link.round_trip([Call(("ECHO", "three"))]), 10) == [b"three"]
    assert own_redis_client.lrange("lst", 0, -1) == [b"x"]


async def test_a_connection_killed_under_two_round_trips_fails_both_and_the_next_is_clean(
    link: AsyncLink, own_redis_client: redis.Redis
) -> None:
    # Given two round trips in flight on the link
    first = asyncio.ensure_future(link.round_trip([Call(("BLPOP", "lst", BLOCK_S))]))
    second = asyncio.ensure_future(link.round_trip([Call(("ECHO", "two"))]))
    await async_wait_until(
        lambda: blocked_with_a_query_behind(own_redis_client), 5, 0.01, "pipelined"
    )

    # When Redis drops the connection
    (blocked,) = [c for c in own_redis_client.client_list() if c["cmd"] == "blpop"]
    own_redis_client.client_kill_filter(_id=blocked["id"])

    # Then both fail as transport errors, and the next round trip reconnects and reads its own
    for task in (first, second):
        with pytest.raises(redis.ConnectionError):
            await asyncio.wait_for(task, 10)
    assert await asyncio.wait_for(link.round_trip([Call(("ECHO", "three"))]), 10) == [b"three"]


async def test_a_round_trip_cancelled_behind_a_reading_one_lets_that_one_read_its_own(
    link: AsyncLink, own_redis_client: redis.Redis
) -> None:
    # Given a round trip reading (waiting in BLPOP), and a second one written behind it
    first = asyncio.ensure_future(link.round_trip([Call(("BLPOP", "lst", BLOCK_S))]))
    second = asyncio.ensure_future(link.round_trip([Call(("ECHO", "two"))]))
    await async_wait_until(
        lambda: blocked_with_a_query_behind(own_redis_client), 5, 0.01, "pipelined"
    )

    # When the second is cancelled while it waits for its turn, and a third is sent
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    third = asyncio.ensure_future(link.round_trip([Call(("ECHO", "three"))]))

    # Then the third does not replace the connection under the first, which still reads
    for _ in range(20):
        await asyncio.sleep(0)  # (loop turns for the third to go as far as it may)
    assert not first.done() and not third.done()
    # And once the first is answered, it reads its own reply, and the third (on a new
    # connection: the second's reply is never read) reads its own
    own_redis_client.rpush("lst", "x")
    assert await asyncio.wait_for(first, 10) == [[b"lst", b"x"]]
    assert await asyncio.wait_for(third, 10) == [b"three"]


async def test_round_trips_sent_while_the_link_connects_wait_for_the_handshake(
    link: AsyncLink,
) -> None:
    # Given a link not yet connected
    # When round trips are sent one per loop turn from then on (redis-py counts a connection
    # connected while it still reads the handshake's replies)
    sent = []
    for i in range(200):
        sent.append(asyncio.ensure_future(link.round_trip([Call(("ECHO", f"m{i}"))])))
        await asyncio.sleep(0)
    replies = await asyncio.wait_for(asyncio.gather(*sent), 10)

    # Then each reads its own reply, none the handshake's
    assert replies == [[f"m{i}".encode()] for i in range(200)]


async def test_a_round_trip_cancelled_during_the_handshake_leaves_no_greeting_unread(
    own_redis: EmbeddedRedis,
) -> None:
    # Given a link that reaches Redis through a proxy that holds every byte for now
    with FaultProxy(own_redis.port) as proxy:
        pool = redis.asyncio.ConnectionPool.from_url(proxy.url, protocol=3, socket_timeout=20)
        link = AsyncLink(pool)
        try:
            proxy.blackhole()
            # When its first round trip is cancelled while it waits for the greeting's replies
            first = asyncio.ensure_future(link.round_trip([Call(("ECHO", "one"))]))
            await async_wait_until(
                lambda: link._conn is not None and link._conn.is_connected, 5, 0.01, "greeting"
            )
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            # and the held greeting then reaches Redis, and its replies come back
            proxy.restore()

            # Then the next round trip reads its own reply, not the greeting's
            assert await asyncio.wait_for(link.round_trip([Call(("ECHO", "two"))]), 10) == [b"two"]
        finally:
            await link.close()
            await pool.aclose()


def test_a_closed_blocking_link_connects_no_more(own_redis: EmbeddedRedis) -> None:
    # Given a blocking link that has talked to Redis, and is then closed (its queue closing
    # while a thread still sends: a retry of a round trip the close cut must not reconnect)
    pool = redis.ConnectionPool.from_url(own_redis.url, protocol=3, socket_timeout=20)
    client = redis.Redis.from_url(own_redis.url)
    try:
        link = SyncLink(pool)
        assert link.round_trip([Call(("ECHO", "one"))]) == [b"one"]
        link.close()
        # When a round trip is sent on it, Then it fails as a shutdown, and no connection opens
        with pytest.raises(QueueShutdown):
            link.round_trip([Call(("ECHO", "two"))])
        wait_until(lambda: len(client.client_list()) == 1, 5, 0.01, "only the test's own")
    finally:
        client.close()
        pool.disconnect()
