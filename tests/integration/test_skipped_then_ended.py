"""A request a take skips (popped past its pickup deadline) is out of the queue, and its record
says so: a cancel, a bulk outcomes read or its caller's withdraw that comes later does not take
it out of its level a second time. Before, the record stayed "queued" in no lane; the second
removal lowered the level's depth below its live ids, the level was forgotten while they were
still in its lanes, and they were never handed out (issue 40, item 1)."""

from __future__ import annotations

import pytest
import redis

from prq import RequestState, Response
from prq.bulk import BulkClient
from tests.queue_facades import QueueFactory
from tests.queued import queue_depth, queued_ids
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize("ended_by", ["cancel", "outcomes"])
async def test_a_request_skipped_past_its_deadline_then_ended_leaves_the_others_handed_out(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, ended_by: str
) -> None:
    # Given A queued with a short pickup window, then B, C and D with a long one
    sender, receiver = make_queue(), make_queue()
    endpoint = f"poll://skipped-then-{ended_by}"
    keys = sender.keys.endpoint(endpoint)
    a = await sender.notify(endpoint, "m", "a", pickup_timeout_s=0.3)
    deadline = _server_ms(redis_client) + 300  # (A's, by Redis's clock, is no later)
    others = [await sender.notify(endpoint, "m", n, pickup_timeout_s=60) for n in "bcd"]
    await async_wait_until(
        lambda: _server_ms(redis_client) > deadline, 5, 0.02, "A's deadline passed"
    )

    # When a take skips A (past its deadline) and hands out B, which is answered
    (taken,) = await receiver.dequeue_many(endpoint, 1, timeout_s=5)
    assert taken.id == others[0]
    await receiver.apply_response(Response(id=taken.id, result="done"))

    # And A is ended after that: cancelled, or withdrawn by a bulk outcomes read
    if ended_by == "cancel":
        assert await sender.cancel(a) is False  # (nothing left to cancel: withdrawn)
    else:
        with BulkClient.from_url(redis_url, prefix=sender.keys.prefix) as bulk:
            (snapshot,) = bulk.outcomes(endpoint, [a]).values()
        assert (snapshot.state, snapshot.reason) == ("withdrawn", "pickup_timeout")

    # Then A is withdrawn for its pickup timeout, the level's depth counts what is queued,
    # and C and D are handed out, in order
    status = await sender.status(a)
    assert (status.state, status.reason) == (RequestState.WITHDRAWN, "pickup_timeout")
    assert queue_depth(redis_client, keys) == len(queued_ids(redis_client, keys)) == 2
    for expected in others[1:]:
        (pending,) = await receiver.dequeue_many(endpoint, 1, timeout_s=5)
        assert pending.id == expected
        await receiver.apply_response(Response(id=pending.id, result="done"))
    assert queue_depth(redis_client, keys) == len(queued_ids(redis_client, keys)) == 0
