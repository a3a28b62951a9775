"""Round trips: across OS processes, 5,000 at once, and responses that are not the caller's."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from prq import Request, RequestState, Response
from tests.queue_facades import QueueFactory, run_all, wait_for_state
from tests.redis_servers import async_stays_false, async_wait_until, publish

pytestmark = pytest.mark.integration

#: The receiver script run as a separate OS process.
CHILD_RECEIVER = Path(__file__).with_name("receiver_child.py")
#: Repository root (the child runs from there).
ROOT = Path(__file__).resolve().parents[2]
#: How many calls the concurrency test makes at once.
ROUND_TRIPS = 5_000
#: Most blocking calls in flight at once on the sync facade (one thread each).
SYNC_CALLERS = 200


async def test_a_request_is_answered_by_another_os_process(
    make_queue: QueueFactory, facade: str, redis_url: str, key_prefix: str
) -> None:
    # Given a sender node in this process and a receiver node in a child process
    sender = make_queue(pickup_timeout_s=30)
    endpoint = "poll://child-receiver"
    request_id = uuid.uuid4().hex
    command = [sys.executable, str(CHILD_RECEIVER), redis_url, key_prefix, endpoint, facade, "25"]
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            # When the sender calls the endpoint
            result = await asyncio.wait_for(
                sender.call(endpoint, "whoami", {"n": 7}, request_id=request_id), 40
            )
            out, err = await asyncio.to_thread(child.communicate, timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate(timeout=10)

    # Then the child dequeued exactly this request and its answer came back
    assert child.returncode == 0, err
    assert out.split() == [request_id]
    assert result == {"pid": child.pid, "params": {"n": 7}}
    assert child.pid != os.getpid()


async def test_5000_concurrent_round_trips_each_get_their_own_response(
    make_queue: QueueFactory, facade: str
) -> None:
    # Given one sender node and one receiver node serving an echo handler
    sender = make_queue(poll_interval_s=5, pickup_timeout_s=60)
    receiver = make_queue(poll_interval_s=5)
    endpoint = "poll://echo"
    if facade == "async":

        async def echo(request: Request) -> object:
            return {"id": request.id, "params": request.params}

        make_queue.serve(receiver, endpoint, echo, concurrency=64)
    else:

        def echo_sync(request: Request) -> object:
            return {"id": request.id, "params": request.params}

        make_queue.serve(receiver, endpoint, echo_sync, concurrency=32)
    await sender.start()  # a running node: the 5,000 calls below really start at once
    limit = asyncio.Semaphore(ROUND_TRIPS if facade == "async" else SYNC_CALLERS)
    ids = [uuid.uuid4().hex for _ in range(ROUND_TRIPS)]

    async def one(i: int) -> object:
        async with limit:
            return await sender.call(endpoint, "echo", {"i": i}, request_id=ids[i])

    # When 5,000 calls are made at once
    results = await run_all((one(i) for i in range(ROUND_TRIPS)), 60)

    # Then every call got the response to its own request
    assert results == [{"id": ids[i], "params": {"i": i}} for i in range(ROUND_TRIPS)]
    # And no Redis step was retried: retries are for Redis faults, and a burst of calls larger
    # than the connection pool is not one (a call should wait for a free connection)
    assert sender.stats.redis_retries == 0
    assert receiver.stats.redis_retries == 0


async def test_a_response_for_a_request_the_receiver_does_not_hold_is_ignored(
    make_queue: QueueFactory,
) -> None:
    # Given a caller waiting on a request that a receiver has picked up
    sender, receiver, bystander = make_queue(), make_queue(), make_queue()
    endpoint = "poll://svc"
    request = Request(endpoint=endpoint, method="m", params=1)
    waiting = asyncio.create_task(sender.queue_and_wait(request))
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.id == request.id

    # When responses are applied for an id nobody holds, and by a node that does not hold it
    await receiver.apply_response(Response(id=uuid.uuid4().hex, result="stray"))
    await bystander.apply_response(Response(id=request.id, result="not-the-owner"))

    # Then the caller keeps waiting (over two poll intervals) and the request stays taken
    await async_stays_false(waiting.done, 1.2, message="caller completed by a stray response")
    assert (await sender.status(request.id)).state == RequestState.TAKEN

    # When the owner answers, the caller gets exactly that answer
    await receiver.apply_response(Response(id=request.id, result="own"))
    response = await asyncio.wait_for(waiting, 10)
    assert response == Response(id=request.id, result="own")


async def test_forged_pulses_on_the_sender_channel_do_not_complete_a_wait(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given a caller waiting on a picked-up request
    sender, receiver = make_queue(), make_queue()
    endpoint = "poll://svc"
    request = Request(endpoint=endpoint, method="m")
    waiting = asyncio.create_task(sender.queue_and_wait(request))
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None
    await wait_for_state(sender, request.id, RequestState.TAKEN)
    channel = sender.keys.endpoint(endpoint).node_channel(sender.node_id)
    other_id = uuid.uuid4().hex
    forged = Response(id=other_id, result="forged").model_dump_json()
    before = sender.stats.pulses_received

    # When pulses are forged: another id's response, another id's response under this id,
    # and a bare "read your response" hint
    assert publish(redis_client, channel, f"r|{other_id}|{forged}") == 1
    assert publish(redis_client, channel, f"r|{request.id}|{forged}") == 1
    assert publish(redis_client, channel, f"r|{request.id}|") == 1
    await async_wait_until(lambda: sender.stats.pulses_received >= before + 3, 5)

    # Then the caller keeps waiting
    await async_stays_false(waiting.done, 1.2, message="caller completed by a forged pulse")

    # And gets its own response once the owner answers
    await receiver.apply_response(Response(id=request.id, result="real"))
    assert (await asyncio.wait_for(waiting, 10)).result == "real"


async def test_a_malformed_pulse_costs_latency_not_the_call(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given a caller waiting on a picked-up request
    sender, receiver = make_queue(), make_queue()
    endpoint = "poll://svc"
    request = Request(endpoint=endpoint, method="m")
    waiting = asyncio.create_task(sender.queue_and_wait(request))
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None
    await wait_for_state(sender, request.id, RequestState.TAKEN)
    before = sender.stats.pulses_received

    # When a pulse for its id arrives with a payload that is not a response (a pulse is only a
    # hint: the truth is the request hash in Redis, which the caller polls)
    channel = sender.keys.endpoint(endpoint).node_channel(sender.node_id)
    assert publish(redis_client, channel, f"r|{request.id}|not json") == 1
    await async_wait_until(lambda: sender.stats.pulses_received > before, 5)

    # Then the caller keeps waiting, and gets its own response once the owner answers
    await async_stays_false(waiting.done, 1.0, message="caller failed on a malformed pulse")
    await receiver.apply_response(Response(id=request.id, result="real"))
    assert (await asyncio.wait_for(waiting, 10)).result == "real"
