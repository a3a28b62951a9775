"""A take's reply that reaches its node after the reply of a later take of the same node, which
got the same request again (its receiver went silent meanwhile: two connections, or a reply held
on a slow link): Redis handed it out in that order, so the late reply's token has lost the
request. Before, the node took the late, earlier attempt for a rolled-back Redis handing out
again what it already held: it declared a data loss and cancelled the request under its live
run, whose caller got DataLoss (found by the simulation, tests/sim, seed 17). Now the late
reply's item is dropped: the later take's run answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from prq import Request, RequestState, Response
from prq.core.keys import KeySchema
from prq.node.base import QueueBase
from prq.protocol.effects import Effect, Exec, Flow
from prq.protocol.scripts.loading import ALL_SCRIPTS
from tests.queue_facades import QueueFactory, SyncQueueAdapter, wait_for_state
from tests.redis_servers import async_wait_until, url_client

pytestmark = pytest.mark.integration

#: A caller that judges its receiver quickly, with beats to match.
QUICK: dict[str, Any] = {
    "receiver_timeout_s": 1.0,
    "heartbeat_interval_s": 0.3,
    "heartbeat_initial_delay_s": 0.2,
}


def run_until_take(client: redis.Redis, flow: Flow[Any]) -> Exec:
    """Run a receive flow's round trips on a plain client until it sends its take; that take
    (not sent yet)."""
    replies: Any = None
    for _ in range(20):
        effect: Effect = flow.send(replies)
        assert isinstance(effect, Exec), effect
        if any(call.script is not None and call.script.name == "take" for call in effect.calls):
            return effect
        replies = [client.execute_command(*call.args) for call in effect.calls]  # type: ignore[no-untyped-call]
    raise AssertionError("the flow sent no take")


async def test_a_take_reply_that_comes_after_a_later_take_got_the_request_again_is_dropped(
    make_queue: QueueFactory, redis_admin_url: str, key_prefix: str
) -> None:
    client = url_client(redis_admin_url)
    for script in ALL_SCRIPTS:
        client.script_load(script.source)
    # Given an at_least_once call, and a receiver node whose take got it (in Redis) but whose
    # reply is held, so the node never beats for it
    sender = make_queue(pickup_timeout_s=30, **QUICK)
    receiver = make_queue(**QUICK)
    node: QueueBase = receiver.raw if isinstance(receiver, SyncQueueAdapter) else receiver
    endpoint = "poll://late-take-reply"
    stored = KeySchema(key_prefix).endpoint(endpoint).request
    request = Request(endpoint=endpoint, method="m", params=1, delivery="at_least_once")
    call = asyncio.ensure_future(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    channel = node.keys.endpoint(endpoint).pulse_channel
    late = node._receive_flow(endpoint, channel, 10, 0.0, None, [])
    take = run_until_take(client, late)
    held = [client.execute_command(*c.args) for c in take.calls]  # type: ignore[no-untyped-call]
    assert client.hmget(stored(request.id), "st", "att") == [b"taken", b"1"]

    # When its caller hands it out again (the receiver was silent), the same node takes it
    # with a later take, and only then the first take's reply reaches the node
    await async_wait_until(
        lambda: client.hget(stored(request.id), "st") == b"queued", 10, 0.05, "handed out again"
    )
    again = await receiver.dequeue(endpoint, timeout_s=5)
    assert again is not None and again.id == request.id and again.delivery.attempt == 2
    after = late.send(held)

    # Then the late reply gives nothing to run (its flow, with nothing to hand over, takes
    # again), nothing is cancelled, no data loss is declared, and the request is still the
    # later take's: its answer is the caller's
    assert isinstance(after, Exec)
    assert [c.script.name if c.script else c.args[0] for c in after.calls] == ["take"]
    late.close()
    assert not node._watch.data_loss.fence_of(endpoint)  # (0: no loss declared)
    assert client.hget(stored(request.id), "st") == b"taken"
    await receiver.apply_response(Response(id=request.id, result="ran once"))
    assert (await asyncio.wait_for(call, 10)).result == "ran once"
