"""The data a request keeps beside Redis (DataStreams, a large body) lives as long as the request
may need it, on real Redis and a real shared directory, both facades.

Timings are shrunk so that the data's first expiry comes within seconds, and every node sweeps
the store every 0.2 s. A test waits for a sweep to pass that expiry by storing a canary with the
same expiry and waiting until a sweep removed it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from prq import ReceiverLost, Request, RequestState
from prq.datastreams import DataStream, FileSystemStore
from tests.queue_facades import QueueFactory, wait_for_state
from tests.queued import silent_take
from tests.redis_servers import async_wait_until, wait_until

pytestmark = pytest.mark.integration

ENDPOINT = "poll://data-lifetime"
#: Short lives: a request queued for 1.5 s at most, in flight 2.5 s with a silent holder, a dead
#: letter kept 2 s; bodies over 4 KiB go to the store; every node sweeps it every 0.2 s.
SHORT: dict[str, Any] = {
    "pickup_timeout_s": 1.0,
    "request_ttl_extra_s": 0.5,
    "response_ttl_s": 1.0,
    "receiver_timeout_s": 2.0,
    "heartbeat_interval_s": 0.5,
    "heartbeat_initial_delay_s": 0.3,
    "dead_letter_ttl_s": 2.0,
    "data_loss_check_interval_s": 0.2,
    "inline_limit_bytes": 4096,
}


def stored(store: FileSystemStore) -> list[str]:
    return sorted(name for name in os.listdir(store.directory) if not name.startswith("."))


def canary(store: FileSystemStore, expires_at_ms: int) -> str:
    """A piece of data that expires at `expires_at_ms`: once a sweep removed it, a sweep ran
    past that expiry."""
    return store.store("c" * 32, [b"canary"], expires_at_ms)


async def test_a_long_handler_still_finds_its_stream_after_its_first_expiry(
    make_queue: QueueFactory, tmp_path: Path
) -> None:
    # Given a request with a stream, and a handler that opens it only after a sweep passed the
    # expiry the stream was stored with
    store = FileSystemStore(tmp_path / "store")
    caller = make_queue(datastreams=store, **SHORT)
    receiver = make_queue(datastreams=store, **SHORT)
    data = os.urandom(50_000)
    request = Request(endpoint=ENDPOINT, method="m", streams={"late": DataStream.from_bytes(data)})

    def handler(request: Request) -> int:
        stream = request.streams["late"]
        assert stream.reference is not None
        first_expiry = canary(store, int(stream.reference.split("-")[0]))
        wait_until(lambda: first_expiry not in stored(store), 30, 0.05, "a sweep past it")
        return len(stream.read())

    # When it is called
    make_queue.serve(receiver, ENDPOINT, handler)
    response = await caller.queue_and_wait(request, timeout_s=40)

    # Then the receiver, which held the request all along, kept its stream: it read it whole
    assert (response.error, response.result) == (None, len(data))
    # And the stream goes once the answer was accepted
    await async_wait_until(lambda: stored(store) == [], 10, 0.02, "the stream deleted")


async def test_a_dead_letter_replayed_later_still_finds_its_body(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    # Given an at_least_once request with a large body, dead-lettered once its only attempt's
    # receiver died, with dead letters kept 10 s
    store = FileSystemStore(tmp_path / "store")
    settings = SHORT | {
        "pickup_timeout_s": 3.0,
        "max_attempts": 1,
        "dead_letter_ttl_s": 10.0,
        "receiver_timeout_s": 1.0,
        "heartbeat_interval_s": 0.3,
        "heartbeat_initial_delay_s": 0.2,
    }
    sender = make_queue(datastreams=store, **settings)
    receiver = make_queue(datastreams=store, **settings)
    await receiver.start()
    request = Request(endpoint=ENDPOINT, method="m", params="q" * 10_000, delivery="at_least_once")
    call = asyncio.ensure_future(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    stored_by_ms = int(time.time() * 1000)
    assert len(silent_take(redis_client, key_prefix, ENDPOINT)) == 1
    with pytest.raises(ReceiverLost, match="used up its attempts"):
        await asyncio.wait_for(call, 10)

    # When a sweep passed the time its request's life once ended (queued, in flight, answer
    # kept: the expiry its body was stored with before), and then the dead letter is replayed
    settled = sender.settings.locator_ttl_s(sender.settings.pickup_timeout_s)
    first_expiry = canary(store, stored_by_ms + int(settled * 1000))
    await async_wait_until(lambda: first_expiry not in stored(store), 30, 0.05, "a sweep past it")
    assert await sender.replay_dead_letter(ENDPOINT, request.id) == "replayed"

    # Then its body is still there: the replay runs it whole
    pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
    assert pending is not None and pending.request.params == request.params
