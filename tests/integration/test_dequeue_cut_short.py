"""A dequeue cut short after its take returned, in the steps that follow it (here: reading a
body kept beside Redis, off the event loop): what the take got never ran, so it goes back to
the queue with the take's token, and the node neither holds it nor beats for it. Before, the
take's token was forgotten once the take returned: the request stayed held and beaten for on
a node that would never run it, and its caller waited until its own timeout (issue 40,
item 3)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from prq import Request, Response
from prq.datastreams import FileSystemStore
from tests.queue_facades import QueueFactory, SyncQueueAdapter
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

SETTINGS: dict[str, Any] = {"inline_limit_bytes": 4096, "max_body_bytes": 4 * 1024 * 1024}


class _GatedStore(FileSystemStore):
    """A store whose reads wait until the test lets them go."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.entered = threading.Event()
        self.release = threading.Event()

    def rehydrate(self, reference: str) -> BinaryIO:
        self.entered.set()
        self.release.wait(10)
        return super().rehydrate(reference)


async def test_a_dequeue_cancelled_while_it_reads_a_body_gives_the_request_back(
    make_queue: QueueFactory, tmp_path: Path
) -> None:
    if make_queue.facade != "async":
        pytest.skip("a task cancelled amid a dequeue is an asyncio matter")
    # Given a request whose body is kept beside Redis, and a receiver whose reads of such
    # bodies wait
    endpoint = "poll://cut-short"
    gated = _GatedStore(tmp_path / "store")
    caller = make_queue(datastreams=FileSystemStore(tmp_path / "store"), **SETTINGS)
    receiver = make_queue(datastreams=gated, **SETTINGS)
    request = Request(endpoint=endpoint, method="m", params={"text": "x" * 100_000})
    call = asyncio.ensure_future(caller.queue_and_wait(request, timeout_s=30))

    # When its dequeue is cancelled while it reads the body (the take returned)
    dequeue = asyncio.ensure_future(receiver.dequeue(endpoint, timeout_s=10))
    await async_wait_until(gated.entered.is_set, 10, 0.01, "the body read began")
    dequeue.cancel()
    gated.release.set()
    with pytest.raises(asyncio.CancelledError) as cancelled:
        await dequeue

    # Then the node holds nothing, and the request is taken again and answered, once; the
    # node let go of it when the cancel came, not when its flow was collected (the error,
    # kept here, keeps the frames it passed alive: before, the flow's clean-up waited for them)
    raw = receiver.raw if isinstance(receiver, SyncQueueAdapter) else receiver
    assert request.id not in raw._held
    assert cancelled.tb is not None
    pending = await receiver.dequeue(endpoint, timeout_s=10)
    assert pending is not None and pending.id == request.id
    await receiver.apply_response(Response(id=pending.id, result="once"))
    response = await asyncio.wait_for(call, 30)
    assert response.result == "once"
