"""Data loss: a flush, a canary rolled back, or an enqueue counter gone back fails every call in
flight with DataLoss at once, cancels what the node holds, and new calls work again; an enqueue
counter that expired in its own time (an idle endpoint) is none."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from prq import AsyncQueue, DataLoss, Queue, Request, RequestState, Response
from prq.embedded import EmbeddedRedis
from tests.queue_facades import AnyQueue, QueueFactory, SyncQueueAdapter, wait_for_state
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

CHECK_S = 0.5
#: Detection bound: one check interval, plus a second of slack.
DETECTED_WITHIN_S = CHECK_S + 1.0
#: Long polls, so that only the data-loss watch (not a poll) can notice in the rollback tests.
WATCHED: dict[str, Any] = {
    "data_loss_check_interval_s": CHECK_S,
    "poll_interval_s": 30.0,
    "pickup_timeout_s": 60,
}
#: Shrunk TTLs: an enqueue counter nobody refreshes expires 2 s after its last refresh.
SHORT_LIVED: dict[str, Any] = {"list_ttl_s": 2.0, "data_loss_check_interval_s": 0.2}


def events(queue: AnyQueue) -> int:
    raw = queue.raw if isinstance(queue, SyncQueueAdapter) else queue
    return raw.stats.data_loss_events


def armed(queue: AnyQueue) -> bool:
    """The node knows its canary, and vouches for poll://flushed's counter: a flush shows."""
    raw = queue.raw if isinstance(queue, SyncQueueAdapter) else queue
    watch = raw._watch.data_loss
    return watch.canary is not None and known_floor(raw, "poll://flushed") is not None


def known_floor(raw: AsyncQueue | Queue, endpoint: str) -> int | None:
    """The enqueue counter a node compares the next reading with (None: not vouched for)."""
    floor = raw._watch.data_loss.floor(endpoint, time.monotonic())
    return None if floor is None else floor.value


async def test_a_flush_fails_calls_in_flight_and_cancels_held_requests(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given a caller waiting for an unserved request, and a receiver holding another one
    sender = make_own_queue(**WATCHED)
    receiver = make_own_queue(**WATCHED)
    waiting = asyncio.create_task(sender.call("poll://nobody", "m"))
    held_call = asyncio.create_task(sender.call("poll://held", "m"))
    pending = await receiver.dequeue("poll://held", timeout_s=5)
    assert pending is not None
    await async_wait_until(lambda: events(sender) == 0 and not waiting.done(), 1, 0.05, "set")
    started = time.monotonic()

    # When Redis loses everything
    own_redis_client.flushall()

    # Then both calls fail with DataLoss, within a check interval + 1 s
    for call in (waiting, held_call):
        with pytest.raises(DataLoss) as raised:
            await asyncio.wait_for(call, DETECTED_WITHIN_S + 2)
        assert raised.value.retryable
    elapsed = time.monotonic() - started
    print(f"DataLoss after {elapsed:.2f} s (check interval {CHECK_S} s)")
    assert elapsed < DETECTED_WITHIN_S
    # And the held request is cancelled with reason data_loss
    await async_wait_until(lambda: pending.cancelled, DETECTED_WITHIN_S, 0.02, "cancelled")
    assert pending.cancel_reason == "data_loss"
    # And new calls work again, without a restart
    make_own_queue.serve(receiver, "poll://after", lambda request: request.params)
    assert await asyncio.wait_for(sender.call("poll://after", "m", 7), 10) == 7


async def test_a_call_made_the_moment_a_flush_is_declared_runs(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given a receiver serving an endpoint its caller has called (both watch its counter)
    sender = make_own_queue(data_loss_check_interval_s=CHECK_S)
    receiver = make_own_queue(data_loss_check_interval_s=CHECK_S)
    make_own_queue.serve(receiver, "poll://flushed", lambda request: request.params)
    assert await asyncio.wait_for(sender.call("poll://flushed", "m", 0), 10) == 0
    for round_ in range(1, 4):
        # (once both know their canary and the counter again, so that each sees the flush)
        await async_wait_until(lambda: all(map(armed, (sender, receiver))), 5, 0.02, "armed")
        # When Redis is flushed, and a call goes out the moment both nodes declared the loss
        # (before the receiver's next reading of the counter: one server reads it behind the
        # canary in the check that saw the flush, so that reading bounds the ghosts at once)
        own_redis_client.flushall()
        await async_wait_until(
            lambda: events(sender) >= round_ and events(receiver) >= round_,  # noqa: B023
            DETECTED_WITHIN_S + 2,
            0.0005,
            "both nodes declared the flush",
        )
        # Then that call runs: it was queued after the loss, so it is no ghost
        assert await asyncio.wait_for(sender.call("poll://flushed", "m", round_), 10) == round_
    assert (events(sender), events(receiver)) == (3, 3)


@pytest.mark.parametrize("sign", ["canary rolled back", "counter went back"])
async def test_a_rollback_that_leaves_the_canary_in_place_is_noticed(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis, sign: str
) -> None:
    # Given a node that has checked its canary a few times and enqueued on an endpoint
    sender = make_own_queue(**WATCHED)
    await sender.start()
    raw = sender.raw if isinstance(sender, SyncQueueAdapter) else sender
    canary = raw.keys.canary(raw.node_id)
    await async_wait_until(
        lambda: int(own_redis_client.get(canary) or 0) >= 3, 5, 0.05, "canary checked"
    )
    for _ in range(3):
        with pytest.raises(Exception):  # noqa: B017 - no receiver; only the enqueue matters
            await asyncio.wait_for(
                sender.queue_and_wait(
                    Request(endpoint="poll://rb", method="m"), pickup_timeout_s=0.05
                ),
                5,
            )
    waiting = asyncio.create_task(sender.call("poll://rb", "m"))
    sequence = raw.keys.endpoint("poll://rb").sequence
    await async_wait_until(lambda: own_redis_client.get(sequence) == b"4", 5, 0.02, "queued")
    await async_wait_until(lambda: known_floor(raw, "poll://rb") == 4, 5, 0.02, "vouched for")

    # When Redis "goes back in time" with the canary still there (old snapshot, stale replica)
    if sign == "canary rolled back":
        own_redis_client.set(canary, 1)
    else:
        own_redis_client.set(sequence, 1)
    started = time.monotonic()

    # Then the waiting call fails with DataLoss, within a check interval + 1 s
    with pytest.raises(DataLoss):
        await asyncio.wait_for(waiting, DETECTED_WITHIN_S + 2)
    assert time.monotonic() - started < DETECTED_WITHIN_S
    assert events(sender) == 1


async def test_a_restart_empty_is_detected_and_calls_work_again(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis
) -> None:
    # Given a caller waiting for an unserved request
    sender = make_own_queue(**WATCHED)
    request = Request(endpoint="poll://restart", method="m")
    waiting = asyncio.create_task(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)

    # When Redis is killed and comes back empty
    own_redis.restart()
    started = time.monotonic()

    # Then the call fails with DataLoss promptly, and the node works again afterwards
    with pytest.raises(DataLoss):
        await asyncio.wait_for(waiting, DETECTED_WITHIN_S + 6)
    print(f"DataLoss after {time.monotonic() - started:.2f} s")
    receiver = make_own_queue(**WATCHED)
    make_own_queue.serve(receiver, "poll://restart", lambda request: request.params)
    assert await asyncio.wait_for(sender.call("poll://restart", "m", 1), 15) == 1


async def test_an_endpoint_left_idle_past_its_list_ttl_is_no_data_loss(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given a receiver serving an endpoint a sender called once, and calls going on on another
    sender = make_queue(**SHORT_LIVED)
    receiver = make_queue(**SHORT_LIVED)
    idle = make_queue.serve(receiver, "poll://idle", lambda request: request.params)
    assert await asyncio.wait_for(sender.call("poll://idle", "m", 0), 10) == 0
    make_queue.serve(receiver, "poll://busy", lambda request: request.params)
    stop = asyncio.Event()

    async def steady_calls() -> int:
        done = 0
        while not stop.is_set():
            assert await asyncio.wait_for(sender.call("poll://busy", "m", done), 10) == done
            done += 1
        return done

    calls = asyncio.create_task(steady_calls())
    raws = [
        queue.raw if isinstance(queue, SyncQueueAdapter) else queue for queue in (sender, receiver)
    ]
    counter = raws[0].keys.endpoint("poll://idle").sequence
    canaries = [raw.keys.canary(raw.node_id) for raw in raws]

    def checks() -> list[int]:
        """How many data-loss checks each node made (each steps its canary)."""
        return [int(redis_client.get(canary) or 0) for canary in canaries]

    def checked(since: list[int], more: int) -> bool:
        return calls.done() or all(n >= s + more for n, s in zip(checks(), since, strict=True))

    # When no request comes for two list TTLs (20 checks 0.2 s apart), the receiver serving on
    since = checks()
    await async_wait_until(lambda: checked(since, 20), 15, 0.05, "two list TTLs of checks")
    # Then nobody declared data loss, and the endpoint's counter lives on (the receiver compares
    # against it)
    assert events(sender) == events(receiver) == 0
    assert redis_client.exists(counter)

    # When nobody uses the endpoint any more, and its counter expires
    await idle.stop()
    await async_wait_until(
        lambda: calls.done() or not redis_client.exists(counter), 20, 0.05, "counter expired"
    )
    since = checks()
    await async_wait_until(lambda: checked(since, 3), 10, 0.05, "three more checks")
    stop.set()

    # Then no node declared data loss, and every call on the busy endpoint was answered
    assert await asyncio.wait_for(calls, 10) > 0
    assert events(sender) == events(receiver) == 0


def snapshot(client: redis.Redis) -> list[tuple[bytes, bytes, int]]:
    """Every key of the server as DUMP has it, with its remaining TTL (ms; 0: none)."""
    taken = []
    for key in client.scan_iter(count=1000):
        dumped = client.dump(key)
        if dumped is not None:
            taken.append((key, dumped, max(0, client.pttl(key))))
    return taken


def roll_back(client: redis.Redis, taken: list[tuple[bytes, bytes, int]]) -> None:
    """The server goes back to `taken`, as after a failover to a replica that missed every
    write since (or a restore from that snapshot)."""
    client.flushall()
    for key, value, ttl_ms in taken:
        client.restore(key, ttl_ms, value)


async def test_a_request_that_ran_before_a_rollback_is_not_run_again_by_another_receiver(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given two receivers that both took from an endpoint, and a request queued there
    sender = make_own_queue(**WATCHED)
    first, second = make_own_queue(**WATCHED), make_own_queue(**WATCHED)
    endpoint = "poll://ghosts"
    for receiver in (second, first):
        call = asyncio.create_task(sender.call(endpoint, "m"))
        pending = await receiver.dequeue(endpoint, timeout_s=5)
        assert pending is not None
        await receiver.apply_response(Response(id=pending.id, result="warm-up"))
        assert await asyncio.wait_for(call, 5) == "warm-up"
    request = Request(endpoint=endpoint, method="m")
    ran = asyncio.create_task(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    raws = [q.raw if isinstance(q, SyncQueueAdapter) else q for q in (sender, first, second)]
    await async_wait_until(
        lambda: all(known_floor(raw, endpoint) == 3 for raw in raws[1:]), 5, 0.02, "vouched for"
    )
    before = snapshot(own_redis_client)
    # ... and that one receiver ran and answered, and the other checked its canary since
    pending = await first.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.id == request.id
    await first.apply_response(Response(id=request.id, result="ran once"))
    assert (await asyncio.wait_for(ran, 5)).result == "ran once"
    canary = raws[2].keys.canary(raws[2].node_id)
    stepped = int(own_redis_client.get(canary) or 0) + 1
    await async_wait_until(
        lambda: int(own_redis_client.get(canary) or 0) > stepped, 5, 0.02, "checked since"
    )

    # When Redis goes back to before that request was taken (its canaries with it), and the
    # other receiver has noticed
    roll_back(own_redis_client, before)
    await async_wait_until(lambda: events(second) == 1, DETECTED_WITHIN_S + 2, 0.02, "declared")

    # Then that receiver does not run the request the rolled-back Redis hands out again: it is
    # cancelled, for the data loss
    assert await second.dequeue(endpoint, timeout_s=0.5) is None
    assert (await second.status(request.id)).reason == "data_loss"
    # And a request queued after that runs
    after = asyncio.create_task(sender.call(endpoint, "m", 1))
    pending = await second.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.request.params == 1
    await second.apply_response(Response(id=pending.id, result="after"))
    assert await asyncio.wait_for(after, 5) == "after"
