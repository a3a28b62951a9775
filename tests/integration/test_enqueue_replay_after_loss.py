"""An enqueue whose reply was lost, sent again by the retry after Redis lost its data: its first
run queued the request and a receiver took it and ran it, so queuing it afresh would run it
twice (`at_most_once` or not). The enqueue carries its node's stamp on the endpoint
(enqueue.lua), finds it gone, writes nothing, and the call fails with DataLoss. (Found by the
simulation: tests/sim/test_directed.py plays the same steps.)"""

from __future__ import annotations

import asyncio

import pytest
import redis

from prq import DataLoss, RedisSettings, Response
from prq.embedded import EmbeddedRedis
from prq.protocol.scripts.loading import ENQUEUE
from tests.fault.proxy import FaultProxy
from tests.queue_facades import QueueFactory

pytestmark = pytest.mark.integration

ENDPOINT = "poll://replayed-enqueue"


@pytest.mark.parametrize("loss", ["flush", "flush-then-other-enqueues"])
async def test_an_enqueue_sent_again_after_a_flush_does_not_queue_its_request_afresh(
    own_redis: EmbeddedRedis,
    own_redis_client: redis.Redis,
    key_prefix: str,
    facade: str,
    loss: str,
) -> None:
    with FaultProxy(own_redis.port) as proxy:
        queues = QueueFactory(facade, proxy.url, key_prefix)
        try:
            sender = queues(
                redis_settings=RedisSettings(url=proxy.url, socket_timeout_s=0.3),
                retry_budget_s=20.0,
                data_loss_check_interval_s=3600.0,
            )
            direct = RedisSettings(url=own_redis.url)
            receiver = queues(redis_settings=direct)
            other = queues(redis_settings=direct)
            await sender.start()
            # Given an at_most_once call whose enqueue runs on Redis and whose replies are lost
            proxy.drop_replies(True, to=ENQUEUE.sha.encode())
            call = asyncio.ensure_future(sender.call(ENDPOINT, "m", {"n": 1}, timeout_s=30))
            # and a receiver that took its request and runs it
            pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
            assert pending is not None and pending.request.params == {"n": 1}
            # When Redis loses its data (and, in the second case, other callers queue requests
            # there meanwhile, so the endpoint's numbers and keys are back), and the enqueue
            # is then sent again
            own_redis_client.flushall()
            if loss == "flush-then-other-enqueues":
                for n in range(3):
                    await other.notify(ENDPOINT, "other", {"n": n})
            proxy.drop_replies(False)
            # Then the call fails with DataLoss: the request may have run (it did)
            with pytest.raises(DataLoss) as caught:
                await asyncio.wait_for(call, 30)
            assert caught.value.maybe_executed is True
            # and nothing queued it again: a receiver gets only the other callers' messages
            taken = await other.dequeue_many(ENDPOINT, 10, timeout_s=0.5)
            assert [p.request.method for p in taken] == ["other"] * len(taken)
            assert all(p.request.id != pending.request.id for p in taken)
        finally:
            await queues.aclose()


async def test_a_call_whose_enqueue_reply_was_lost_without_a_loss_runs_once(
    own_redis: EmbeddedRedis, key_prefix: str, facade: str
) -> None:
    with FaultProxy(own_redis.port) as proxy:
        queues = QueueFactory(facade, proxy.url, key_prefix)
        try:
            sender = queues(
                redis_settings=RedisSettings(url=proxy.url, socket_timeout_s=0.3),
                retry_budget_s=20.0,
            )
            receiver = queues(redis_settings=RedisSettings(url=own_redis.url))
            await sender.start()
            # Given a call whose enqueue's first replies are lost (no data loss)
            proxy.drop_replies(True, to=ENQUEUE.sha.encode())
            call = asyncio.ensure_future(sender.call(ENDPOINT, "m", {"n": 2}, timeout_s=30))
            pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
            assert pending is not None
            # When the replies come through again and the receiver answers
            proxy.drop_replies(False)
            await receiver.apply_response(Response(id=pending.request.id, result={"ok": True}))
            # Then the caller gets the answer: the stamp judged the replay whole
            assert await asyncio.wait_for(call, 30) == {"ok": True}
        finally:
            await queues.aclose()
