"""A one-way message (and a bulk batch) whose enqueue reached Redis but whose replies were lost
until the retry budget ran out: its sender is told it may have been queued and run
(`maybe_executed`), as a call is, because it may; and it is queued. (Found by the simulation: a
notify told `QueueUnavailable` with `maybe_executed=False` whose message then ran.)"""

from __future__ import annotations

import pytest

from prq import QueueSettings, QueueUnavailable, RedisSettings, Request
from prq.bulk import BulkClient
from prq.embedded import EmbeddedRedis
from prq.protocol.scripts.loading import ENQUEUE_MANY
from tests.fault.proxy import FaultProxy
from tests.queue_facades import QueueFactory

pytestmark = pytest.mark.integration

ENDPOINT = "poll://lost-replies"


async def test_a_message_whose_replies_are_lost_past_the_budget_may_have_run(
    own_redis: EmbeddedRedis, key_prefix: str, facade: str
) -> None:
    with FaultProxy(own_redis.port) as proxy:
        queues = QueueFactory(facade, proxy.url, key_prefix)
        try:
            # Given a sender whose enqueues reach Redis and whose replies to them are lost
            sender = queues(
                redis_settings=RedisSettings(url=proxy.url, socket_timeout_s=0.3),
                retry_budget_s=1.0,
            )
            await sender.start()
            proxy.drop_replies(True, to=ENQUEUE_MANY.sha.encode())
            # When it sends a one-way message
            with pytest.raises(QueueUnavailable) as caught:
                await sender.notify(ENDPOINT, "m", {"n": 1})
            # Then it is told the message may have been queued and run, and that sending it
            # again under the same id is safe
            assert caught.value.maybe_executed is True
            assert "same id is safe" in str(caught.value)
            # And it was queued: a receiver straight on Redis gets it
            receiver = queues(redis_settings=RedisSettings(url=own_redis.url))
            pending = await receiver.dequeue(ENDPOINT, timeout_s=5)
            assert pending is not None and pending.request.params == {"n": 1}
        finally:
            await queues.aclose()


def test_a_bulk_batch_whose_replies_are_lost_past_the_budget_may_have_run(
    own_redis: EmbeddedRedis,
) -> None:
    # Given a bulk client whose enqueues reach Redis and whose replies to them are lost (found
    # by the simulation, as the message's: the batch was told QueueUnavailable with
    # maybe_executed=False, and its requests ran)
    with FaultProxy(own_redis.port) as proxy:
        settings = QueueSettings(retry_budget_s=1.0)
        redis_settings = RedisSettings(url=proxy.url, socket_timeout_s=0.3)
        with BulkClient(redis_settings, prefix="bulk-lost", settings=settings) as bulk:
            # (connected, the layout checked and the scripts loaded before the replies go)
            bulk.depth(ENDPOINT)
            bulk._io.load_scripts()
            proxy.drop_replies(True, to=ENQUEUE_MANY.sha.encode())
            requests = [Request(endpoint=ENDPOINT, method="m", params=n) for n in range(3)]
            # When it enqueues a batch
            with pytest.raises(QueueUnavailable) as caught:
                bulk.enqueue_many(requests)
            # Then it is told the requests may have been queued and run, and that sending them
            # again is safe
            assert caught.value.maybe_executed is True
            assert "sending them again is safe" in str(caught.value)
    # And they were queued
    with BulkClient(RedisSettings(url=own_redis.url), prefix="bulk-lost") as direct:
        assert direct.depth(ENDPOINT) == 3
