"""Retrying with the same request id: safe after a failure before pickup, never a second run
after a success."""

from __future__ import annotations

import asyncio

import pytest

from prq import PickupTimeout, Request
from tests.queue_facades import QueueFactory

pytestmark = pytest.mark.integration


async def test_a_pickup_timeout_can_be_retried_with_the_same_id(make_queue: QueueFactory) -> None:
    # Given a call that timed out before pickup (no receiver yet)
    sender = make_queue()
    request = Request(endpoint="poll://late", method="m", params=1)
    with pytest.raises(PickupTimeout):
        await asyncio.wait_for(sender.queue_and_wait(request, pickup_timeout_s=0.3), 10)

    # When a receiver comes up and the caller retries with the same request
    runs: list[str] = []

    def handler(req: Request) -> object:
        runs.append(req.id)
        return "ran"

    receiver = make_queue()
    make_queue.serve(receiver, "poll://late", handler)
    response = await asyncio.wait_for(sender.queue_and_wait(request, pickup_timeout_s=5), 10)

    # Then it runs, once
    assert response.result == "ran"
    assert runs == [request.id]
    # And a further retry of the finished request returns the stored response without a run
    again = await asyncio.wait_for(sender.queue_and_wait(request, pickup_timeout_s=5), 10)
    assert again.result == "ran"
    assert runs == [request.id]
