"""Data loss: a flush, a rollback or a restart empty fails the calls in flight that it took with
DataLoss at once and cancels what the node holds of them; what Redis still holds from before a
loss (ghosts) is not run again; and every call made after a loss runs, however many losses came
before, and whichever sign showed them (prq.node.data_loss). An endpoint idle past its list TTL
is no loss."""

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
#: Shrunk TTLs: a sequence-number key nobody enqueues on expires 2 s after its last enqueue.
SHORT_LIVED: dict[str, Any] = {"list_ttl_s": 2.0, "data_loss_check_interval_s": 0.2}


def raw_of(queue: AnyQueue) -> AsyncQueue | Queue:
    return queue.raw if isinstance(queue, SyncQueueAdapter) else queue


def events(queue: AnyQueue) -> int:
    return raw_of(queue).stats.data_loss_events


def known_floor(queue: AnyQueue, endpoint: str) -> int:
    """The highest sequence number the node read on `endpoint` (0: none)."""
    return raw_of(queue)._watch.data_loss.floor(endpoint, time.monotonic()).value


def armed(queue: AnyQueue, endpoint: str = "poll://flushed") -> bool:
    """The node knows its canary and a floor of `endpoint`: a loss shows at its next check."""
    watch = raw_of(queue)._watch.data_loss
    return bool(watch.canary) and known_floor(queue, endpoint) > 0


def fence(queue: AnyQueue, endpoint: str) -> int:
    return raw_of(queue)._watch.data_loss.fence_of(endpoint)


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


async def test_a_rollback_behind_the_canary_fails_the_call_it_took_and_calls_run_after(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given a node that checked its canary since a snapshot of Redis was taken, and a call
    # waiting for a request queued after that snapshot
    sender = make_own_queue(**WATCHED)
    await sender.start()
    raw = raw_of(sender)
    canary = raw.keys.canary(raw.node_id)
    await async_wait_until(lambda: bool(raw._watch.data_loss.canary), 5, 0.02, "canary known")
    before = snapshot(own_redis_client)
    stepped = own_redis_client.get(canary)
    await async_wait_until(lambda: own_redis_client.get(canary) != stepped, 5, 0.02, "checked")
    waiting = asyncio.create_task(sender.call("poll://rb", "m"))
    await async_wait_until(lambda: known_floor(sender, "poll://rb") > 0, 5, 0.02, "queued")

    # When Redis goes back to that snapshot (a restore, a stale replica promoted)
    roll_back(own_redis_client, before)
    started = time.monotonic()

    # Then the call fails with DataLoss within a check interval (and a second), once declared
    with pytest.raises(DataLoss):
        await asyncio.wait_for(waiting, DETECTED_WITHIN_S + 2)
    assert time.monotonic() - started < DETECTED_WITHIN_S
    assert events(sender) == 1
    # And a call made now runs
    receiver = make_own_queue(**WATCHED)
    make_own_queue.serve(receiver, "poll://rb", lambda request: request.params)
    assert await asyncio.wait_for(sender.call("poll://rb", "m", 5), 10) == 5
    assert events(sender) == 1


async def test_numbers_that_went_back_fail_the_calls_queued_before_and_not_those_after(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given a call waiting for a request queued on an endpoint
    sender = make_own_queue(**WATCHED)
    waiting = asyncio.create_task(sender.call("poll://rb", "m"))
    await async_wait_until(lambda: known_floor(sender, "poll://rb") > 0, 5, 0.02, "queued")
    numbers = raw_of(sender).keys.endpoint("poll://rb").numbers
    given = int(own_redis_client.get(numbers) or 0)

    # When the endpoint's numbers go back (a rollback the canary does not show: the snapshot
    # was taken after its last step)
    own_redis_client.set(numbers, given - 1_000_000)

    # Then the check that reads them declares the loss and the call fails with DataLoss, its
    # request at or below the fence (the highest number the node had read)
    with pytest.raises(DataLoss):
        await asyncio.wait_for(waiting, DETECTED_WITHIN_S + 2)
    assert events(sender) == 1 and fence(sender, "poll://rb") >= given
    # And a call queued now is numbered above the fence, and runs
    receiver = make_own_queue(**WATCHED)
    make_own_queue.serve(receiver, "poll://rb", lambda request: request.params)
    assert await asyncio.wait_for(sender.call("poll://rb", "m", 6), 10) == 6
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
    counter = raws[0].keys.endpoint("poll://idle").numbers
    canaries = [raw.keys.canary(raw.node_id) for raw in raws]

    def checks() -> list[int]:
        """How many data-loss checks each node made (each steps its canary)."""
        return [int(redis_client.get(canary) or 0) for canary in canaries]

    def checked(since: list[int], more: int) -> bool:
        return calls.done() or all(n >= s + more for n, s in zip(checks(), since, strict=True))

    # When no request comes for two list TTLs (20 checks 0.2 s apart), the receiver serving on,
    # and the endpoint's numbers expire meanwhile
    since = checks()
    await async_wait_until(lambda: checked(since, 20), 15, 0.05, "two list TTLs of checks")
    assert not redis_client.exists(counter)
    # Then nobody declared data loss, and the idle endpoint serves a call again
    assert events(sender) == events(receiver) == 0
    assert await asyncio.wait_for(sender.call("poll://idle", "m", 1), 10) == 1
    await idle.stop()
    since = checks()
    await async_wait_until(lambda: checked(since, 3), 10, 0.05, "three more checks")
    stop.set()

    # And no node declared data loss, and every call on the busy endpoint was answered
    assert await asyncio.wait_for(calls, 10) > 0
    assert events(sender) == events(receiver) == 0


async def a_call_after_runs(sender: AnyQueue, receiver: AnyQueue, endpoint: str) -> None:
    """A call made now on `endpoint` is taken by `receiver` and answered."""
    after = asyncio.create_task(sender.call(endpoint, "m", 1))
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.request.params == 1
    await receiver.apply_response(Response(id=pending.id, result="after"))
    assert await asyncio.wait_for(after, 5) == "after"


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
    for key, value, ttl_ms in taken:  # (REPLACE: a node may write a key again meanwhile)
        client.restore(key, ttl_ms, value, replace=True)


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
    raws = [raw_of(q) for q in (sender, first, second)]
    await async_wait_until(
        lambda: all(known_floor(q, endpoint) > 0 for q in (first, second)), 5, 0.02, "read"
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
    await a_call_after_runs(sender, second, endpoint)


async def test_a_rollback_behind_a_receivers_last_take_shows_at_its_next_take_before_any_check(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given receivers that check for data loss only once an hour, a request queued there and
    # a snapshot of Redis then
    quiet = {**WATCHED, "data_loss_check_interval_s": 3600.0}
    sender = make_own_queue(**quiet)
    first, second = make_own_queue(**quiet), make_own_queue(**quiet)
    endpoint = "poll://stamped"
    assert await second.dequeue(endpoint, timeout_s=0) is None  # (its stamp: in the snapshot)
    request = Request(endpoint=endpoint, method="m")
    ran = asyncio.create_task(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    before = snapshot(own_redis_client)
    # ... which one receiver then ran and answered, and the other took from the endpoint since
    # (nothing there: what it read of the endpoint's numbers is what the snapshot holds)
    pending = await first.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.id == request.id
    await first.apply_response(Response(id=request.id, result="ran once"))
    assert (await asyncio.wait_for(ran, 5)).result == "ran once"
    assert await second.dequeue(endpoint, timeout_s=0) is None

    # When Redis goes back to the snapshot (no restart: no link of the nodes breaks), so that
    # the request is queued again and neither a canary nor the numbers have shown it yet
    roll_back(own_redis_client, before)
    assert events(second) == 0

    # Then the other receiver's next take, in the same step, sees that Redis went back: the
    # loss is declared there and then, and the request that ran is cancelled, not run again
    assert await second.dequeue(endpoint, timeout_s=0.5) is None
    assert events(second) == 1
    assert (await second.status(request.id)).reason == "data_loss"
    # And a request queued after that runs
    await a_call_after_runs(sender, second, endpoint)
