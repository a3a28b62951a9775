"""A request whose pickup window outlives the queue's TTL (`list_ttl_s`) stays in a queue that
hands it out. Before, a push gave the level's keys (the levels set, the level's clock, its lanes
set) the queue's TTL only, and a take refreshed nothing but the lane it popped: a backlog
queued in a burst and drained for longer than `list_ttl_s` lost its levels set mid-drain, and
every request still in a lane waited out its pickup window unseen (found by the cancel-wave
test on a loaded cluster: 500 calls with a 30 s window on a 2 s queue TTL)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from prq import InvalidRequest, Request
from prq.bulk import BulkClient
from tests.queue_facades import QueueFactory
from tests.queued import level_ids, queue_depth
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

LIST_TTL_S = 0.5


@pytest.mark.parametrize("priorities", [(0,), (0, 3)], ids=["one-level", "two-levels"])
async def test_a_backlog_outliving_the_queue_ttl_is_handed_out_whole(
    make_queue: QueueFactory, redis_client: redis.Redis, priorities: tuple[int, ...]
) -> None:
    # Given a queue TTL of 0.5 s and requests queued with a 10 s pickup window, no receiver
    sender = make_queue(list_ttl_s=LIST_TTL_S)
    receiver = make_queue(list_ttl_s=LIST_TTL_S)
    endpoint = f"poll://long-window-{len(priorities)}"
    keys = sender.keys.endpoint(endpoint)
    ids = [
        await sender.notify(
            endpoint, "m", n, pickup_timeout_s=10, priority=priorities[n % len(priorities)]
        )
        for n in range(6)
    ]
    # (a later push at the lowest level, with the queue's own short window, must not shorten
    # what the levels set has left)
    short = await sender.notify(endpoint, "m", "short", pickup_timeout_s=0.1)

    # Then every key that lists them lives as long as their records
    record_ms = min(redis_client.pttl(keys.request(i)) for i in ids)
    listing = [keys.levels, *(keys.level(p) for p in priorities)]
    listing += [keys.level_lanes(p) for p in priorities]
    assert min(redis_client.pttl(k) for k in listing) >= record_ms

    # When the queue's TTL passes with nothing taken
    since = time.monotonic()
    await async_wait_until(
        lambda: time.monotonic() - since > 3 * LIST_TTL_S, 5, 0.05, "the queue TTL passed"
    )

    # Then each request is still listed, and a receiver takes all of them (the short one is past
    # its window: skipped and withdrawn)
    assert sorted(i for p in priorities for i in level_ids(redis_client, keys, p)) == sorted(
        [*ids, short]
    )
    taken: list[str] = []
    for _ in range(len(ids)):
        taken += [p.id for p in await receiver.dequeue_many(endpoint, len(ids), timeout_s=2)]
        if len(taken) >= len(ids):
            break
    assert sorted(taken) == sorted(ids)
    assert await receiver.dequeue_many(endpoint, 1, timeout_s=0.2) == []  # (skips the short one)
    assert queue_depth(redis_client, keys) == 0
    # (read from its record: status() finds a notify's endpoint through the endpoint registry,
    # whose entry, kept for the queue's 0.5 s TTL here, may be gone by now)
    assert redis_client.hmget(keys.request(short), "st", "why") == [b"withdrawn", b"pickup_timeout"]


@pytest.mark.parametrize("window", [float("inf"), float("nan"), -1.0, 0.0, 1e12, "5"])
async def test_a_pickup_window_no_setting_could_hold_is_refused_before_anything_is_written(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, window: Any
) -> None:
    # Given a node and a bulk client, and an endpoint with nothing queued
    sender = make_queue()
    endpoint = "poll://bad-window"
    keys = sender.keys.endpoint(endpoint)

    # When a call, a notify or a bulk enqueue is given a window no QueueSettings would take
    # Then each is refused as an InvalidRequest naming it (before: a raw OverflowError or
    # ValueError for inf and nan, a request withdrawn at once for 0 or less)
    with pytest.raises(InvalidRequest, match="pickup_timeout_s"):
        await sender.queue_and_wait(Request(endpoint=endpoint, method="m"), pickup_timeout_s=window)
    with pytest.raises(InvalidRequest, match="pickup_timeout_s"):
        await sender.notify(endpoint, "m", pickup_timeout_s=window)
    with (
        BulkClient.from_url(redis_url, prefix=sender.keys.prefix) as bulk,
        pytest.raises(InvalidRequest, match="pickup_timeout_s"),
    ):
        bulk.enqueue_many([Request(endpoint=endpoint, method="m")], pickup_timeout_s=window)
    # And nothing was queued
    assert queue_depth(redis_client, keys) == 0
    assert not redis_client.keys(f"{keys.tag}:r:*")


async def test_a_lane_made_between_refreshes_outlives_every_request_pushed_to_it(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given a level whose keys a push with a 10 s window refreshed, and a second producer whose
    # first message (a 0.3 s window) made its lane between refreshes (found by the simulation,
    # seed 30519: that lane got the queue's TTL only, 0.5 s here)
    first, second = make_queue(list_ttl_s=LIST_TTL_S), make_queue(list_ttl_s=LIST_TTL_S)
    endpoint = "poll://lane-between-refreshes"
    keys = first.keys.endpoint(endpoint)
    await first.notify(endpoint, "m", 0, pickup_timeout_s=10)
    await second.notify(endpoint, "m", 1, pickup_timeout_s=0.3)
    # When that producer then queues a request with a longer window (8 s: its record outlives
    # the queue's TTL, not the level's keys, so the push refreshes nothing)
    later = await second.notify(endpoint, "m", 2, pickup_timeout_s=8)
    # Then its lane lives at least as long as the request's record: it is not lost with it
    lane = keys.level_lane("0", f"p{second.node_id}")
    assert later.encode() in redis_client.lrange(lane, 0, -1)
    assert redis_client.pttl(lane) >= redis_client.pttl(keys.request(later)) > 8000
    # (and as long as the level's keys, within the millisecond Redis's expiry clock may lag)
    assert redis_client.pttl(lane) >= redis_client.pttl(keys.level("0")) - 5
