"""at_least_once delivery on real Redis: a request whose receiver goes silent is handed out again
(same delivery hash, next attempt), up to max_attempts, then dead-lettered; a receiver never runs
a redelivery of what it already ran; the first response wins."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from prq import (
    AsyncQueue,
    CallTimeout,
    CancelledAfterPickup,
    QueueSettings,
    ReceiverLost,
    Request,
    RequestState,
    Response,
    current_request,
)
from prq.bulk import BulkClient
from prq.core.errors import PrqError
from prq.core.keys import KeySchema
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import APPLY_RESPONSE
from tests.queue_facades import FAST_SETTINGS, AnyQueue, QueueFactory, wait_for_state
from tests.queued import queue_depth, silent_take
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: A sender that judges its receiver quickly (beats are fast too, as the settings demand).
QUICK: dict[str, Any] = {
    "receiver_timeout_s": 1.0,
    "heartbeat_interval_s": 0.3,
    "heartbeat_initial_delay_s": 0.2,
}


async def test_a_request_whose_receiver_dies_is_handed_out_again_with_the_same_hash(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an at_least_once call, taken by a receiver that then dies (never beats)
    sender = make_queue(pickup_timeout_s=30, **QUICK)
    endpoint = "poll://alo-redeliver"
    request = Request(endpoint=endpoint, method="m", params=7, delivery="at_least_once")
    call = asyncio.ensure_future(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    first = silent_take(redis_client, key_prefix, endpoint)
    assert [(i.request_id, i.attempt) for i in first] == [(request.id, 1)]

    # When its caller notices the silence, and a live receiver serves the endpoint (beating
    # soon: its caller judges receivers silent after 1 s)
    receiver = make_queue(**QUICK)
    pending = await receiver.dequeue(endpoint, timeout_s=10)

    # Then the live receiver gets the same request as attempt 2, with the same delivery hash
    assert pending is not None and pending.id == request.id
    assert pending.delivery.attempt == 2
    assert pending.delivery.delivery_hash == delivery_hash_of(request)
    # And its answer is the caller's result
    await receiver.apply_response(Response(id=request.id, result="second"))
    assert (await call).result == "second"
    # And sending the same id again returns the stored answer: nothing is queued or run again
    again = await asyncio.wait_for(sender.queue_and_wait(request), 5)
    assert again.result == "second"
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 0
    assert (
        redis_client.hget(KeySchema(key_prefix).endpoint(endpoint).request(request.id), "att")
        == b"2"
    )


def delivery_hash_of(request: Request) -> str:
    from prq.protocol.dedup import delivery_hash

    return delivery_hash(request.endpoint, request.id)


async def test_exhausted_attempts_are_dead_lettered_and_replay_as_at_least_once(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an at_least_once call with max_attempts 2 whose every receiver dies
    sender = make_queue(pickup_timeout_s=30, max_attempts=2, **QUICK)
    endpoint = "poll://alo-exhausted"
    request = Request(endpoint=endpoint, method="m", priority=3, delivery="at_least_once")
    call = asyncio.ensure_future(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    assert len(silent_take(redis_client, key_prefix, endpoint)) == 1

    async def taken_again() -> bool:
        return bool(silent_take(redis_client, key_prefix, endpoint))

    await async_wait_until(taken_again, 10, 0.05, "attempt 2 handed out")

    # When the second receiver is silent too, Then the caller gets ReceiverLost saying so
    with pytest.raises(ReceiverLost, match="used up its attempts"):
        await asyncio.wait_for(call, 10)
    # And the request is a dead letter with its reason and attempts
    letters = await sender.dead_letters(endpoint)
    assert [(d.id, d.reason, d.attempts) for d in letters] == [
        (request.id, "attempts_exhausted", 2)
    ]
    # And replaying it queues it again at its priority, as at_least_once, attempts reset
    assert await sender.replay_dead_letter(endpoint, request.id) == "replayed"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    stored = redis_client.hgetall(keys.request(request.id))
    assert (stored[b"pri"], stored[b"ma"], stored.get(b"att")) == (b"3", b"2", None)  # 0 tries
    receiver = make_queue()
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.delivery.attempt == 1


async def test_a_detached_request_is_handed_out_again_by_the_next_take(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str, redis_url: str
) -> None:
    # Given a bulk (detached) at_least_once request taken by a receiver that died; no caller
    # waits on it, so only receivers can notice
    endpoint = "poll://alo-detached"
    settings = QueueSettings(**{**FAST_SETTINGS, **QUICK, "pickup_timeout_s": 30})
    request = Request(endpoint=endpoint, method="m", id="job:1", delivery="at_least_once")
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as bulk:
        assert bulk.enqueue_many([request]).accepted == 1
        assert len(silent_take(redis_client, key_prefix, endpoint)) == 1

        # When a live receiver (judging receivers silent after 1 s) takes from the endpoint
        receiver = make_queue(**QUICK)
        pending = await receiver.dequeue(endpoint, timeout_s=10)

        # Then it gets the request again, attempt 2, and its answer is kept
        assert pending is not None and (pending.id, pending.delivery.attempt) == ("job:1", 2)
        await receiver.apply_response(Response(id="job:1", result="ok"))
        assert bulk.outcomes(endpoint, ["job:1"])["job:1"].state == "done"


async def test_an_at_most_once_request_is_never_handed_out_twice(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given the default delivery, a receiver that dies after taking
    sender = make_queue(pickup_timeout_s=30, **QUICK)
    endpoint = "poll://amo-lost"
    request = Request(endpoint=endpoint, method="m")
    call = asyncio.ensure_future(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    assert len(silent_take(redis_client, key_prefix, endpoint)) == 1

    # Then the caller gets ReceiverLost, and nothing is queued again
    with pytest.raises(ReceiverLost):
        await asyncio.wait_for(call, 10)
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 0


@pytest.mark.parametrize("slots", [2, 1], ids=["still-running", "answered-before"])
async def test_a_receiver_never_runs_a_redelivery_of_what_it_runs_or_ran(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str, slots: int
) -> None:
    # Given a receiver whose first beat comes late (4 s) and a caller that judges receivers
    # silent after 1 s: the caller hands the request out again while the receiver runs it
    sender = make_queue(pickup_timeout_s=30, **QUICK)
    receiver = make_queue(receiver_timeout_s=8, heartbeat_initial_delay_s=4, heartbeat_interval_s=2)
    endpoint = "poll://alo-same-node"
    runs: list[tuple[int, str]] = []
    release = threading.Event()

    def handler(request: Request) -> Any:
        pending = current_request()
        assert pending is not None
        runs.append((pending.delivery.attempt, pending.delivery.delivery_hash))
        release.wait(20)
        return f"ran {len(runs)} time(s)"

    make_queue.serve(receiver, endpoint, handler, concurrency=slots)
    request = Request(endpoint=endpoint, method="m", delivery="at_least_once")
    call = asyncio.ensure_future(sender.queue_and_wait(request))
    stored = KeySchema(key_prefix).endpoint(endpoint).request(request.id)

    # When the redelivery reaches the same receiver: with a free slot while the first run goes
    # on (it then answers under the new owner), or with its one slot busy, so that the first
    # run's answer comes too late (refused: the request was queued again) and the receiver
    # takes the redelivery after it
    wanted = [b"taken", b"2"] if slots == 2 else [b"queued", b"1"]

    def redelivered() -> bool:
        return redis_client.hmget(stored, ["st", "att"]) == wanted

    await async_wait_until(redelivered, 10, 0.02, f"redelivered: {wanted}")
    release.set()

    # Then the handler ran once, and its one answer is the caller's result
    assert (await asyncio.wait_for(call, 10)).result == "ran 1 time(s)"
    assert len(runs) == 1
    assert redis_client.hget(stored, "att") == b"2"


def answers(calls: Sequence[Call]) -> bool:
    return any(call.script is APPLY_RESPONSE for call in calls)


async def test_an_answer_refused_while_its_redelivery_is_adopted_goes_again_under_the_new_owner(
    make_queue: QueueFactory,
    redis_client: redis.Redis,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a receiver that holds an at_least_once request its caller has handed out again (the
    # receiver's first beat comes late; the caller judges receivers silent after 1 s)
    sender = make_queue(pickup_timeout_s=30, **QUICK)
    receiver = make_queue(receiver_timeout_s=8, heartbeat_initial_delay_s=4, heartbeat_interval_s=2)
    endpoint = "poll://alo-answer-races-adoption"
    request = Request(endpoint=endpoint, method="m", delivery="at_least_once")
    call = asyncio.ensure_future(sender.queue_and_wait(request))
    pending = await receiver.dequeue(endpoint, timeout_s=10)
    assert pending is not None and pending.delivery.attempt == 1
    stored = KeySchema(key_prefix).endpoint(endpoint).request(request.id)

    def requeued() -> bool:
        return redis_client.hmget(stored, ["st", "att"]) == [b"queued", b"1"]

    await async_wait_until(requeued, 10, 0.02, "handed out again")

    # When its answer reaches Redis too late (refused: queued again), and before the receiver
    # reads that refusal it takes the redelivery, which it adopts (it still runs the request:
    # the run now answers under the redelivery's owner token)
    taken_between: list[object] = []
    if isinstance(receiver, AsyncQueue):
        execute = receiver._io.execute

        async def answer_then_take(calls: Sequence[Call]) -> list[Reply]:
            replies = await execute(calls)
            if answers(calls) and not taken_between:
                taken_between.append(await receiver.dequeue(endpoint, timeout_s=0.2))
            return replies

        monkeypatch.setattr(receiver._io, "execute", answer_then_take)
    else:
        sync_receiver = receiver.raw
        execute_many = sync_receiver._io.execute_many

        def answer_then_take_sync(
            steps: Sequence[Sequence[Call]], *, express: bool = False
        ) -> list[list[Reply] | PrqError]:
            results = execute_many(steps, express=express)
            if any(answers(calls) for calls in steps) and not taken_between:
                taken_between.append(sync_receiver.dequeue(endpoint, timeout_s=0.2))
            return results

        monkeypatch.setattr(sync_receiver._io, "execute_many", answer_then_take_sync)
    await receiver.apply_response(Response(id=request.id, result="ran once"))

    # Then the answer went again under the new owner: the caller has it, after two hand-outs
    assert taken_between == [None]  # (the redelivery was adopted, not handed to the caller)
    assert (await asyncio.wait_for(call, 10)).result == "ran once"
    assert redis_client.hget(stored, "att") == b"2"


async def test_a_redelivery_nobody_picks_up_tells_its_caller_it_may_have_run(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an at_least_once call with a 1 s pickup window, taken by a receiver that then goes
    # silent (it may be running it: a take whose reply came late, a stalled process)
    sender = make_queue(**QUICK)
    endpoint = "poll://alo-redelivery-unpicked"
    request = Request(endpoint=endpoint, method="m", params=7, delivery="at_least_once")
    call = asyncio.ensure_future(sender.queue_and_wait(request, pickup_timeout_s=1.0))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    assert len(silent_take(redis_client, key_prefix, endpoint)) == 1

    # When its caller hands it out again, and no receiver picks it up within its window
    with pytest.raises(PrqError) as ended:
        await asyncio.wait_for(call, 20)

    # Then the caller is told it may have run (ReceiverLost), not that it never ran. (This
    # path already said so; the one that did not, a caller's withdrawal landing after a take
    # whose reply came late, was found by the simulation: tests/sim, withdraw.lua)
    assert isinstance(ended.value, ReceiverLost), ended.value
    assert ended.value.maybe_executed is True


async def handed_out_again(
    make_queue: QueueFactory,
    redis_client: redis.Redis,
    key_prefix: str,
    endpoint: str,
    timeout_s: float | None = None,
) -> tuple[AnyQueue, Request, asyncio.Future[Response]]:
    """An at_least_once call taken by a receiver that then went silent (it may be running it),
    and queued again by its caller: the caller, the request and the waiting call."""
    sender = make_queue(pickup_timeout_s=30, **QUICK)
    request = Request(endpoint=endpoint, method="m", params=7, delivery="at_least_once")
    call = asyncio.ensure_future(sender.queue_and_wait(request, timeout_s=timeout_s))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    await taken_silently_then_queued_again(redis_client, key_prefix, request)
    return sender, request, call


async def taken_silently_then_queued_again(
    redis_client: redis.Redis, key_prefix: str, request: Request
) -> None:
    """Take the queued `request` as a receiver that then goes silent, and wait until its
    caller has queued it again (attempt 1 counted)."""
    assert len(silent_take(redis_client, key_prefix, request.endpoint)) == 1
    stored = KeySchema(key_prefix).endpoint(request.endpoint).request(request.id)
    await async_wait_until(
        lambda: redis_client.hmget(stored, "st", "att") == [b"queued", b"1"],
        timeout_s=10,
        message="the silent receiver's request queued again",
    )


async def test_a_call_timeout_on_a_request_handed_out_before_says_it_may_have_run(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an at_least_once call with a 4 s call timeout whose first receiver went silent, so
    # that it waits in the queue again, with no receiver to take it
    _sender, _request, call = await handed_out_again(
        make_queue, redis_client, key_prefix, "poll://alo-timeout-after-redelivery", timeout_s=4.0
    )

    # When its call timeout passes before anyone picks it up again
    with pytest.raises(PrqError) as ended:
        await asyncio.wait_for(call, 20)

    # Then the caller is told it timed out and may have run (its first receiver may be running
    # it), not that it was withdrawn and will never run
    assert isinstance(ended.value, CallTimeout), ended.value
    assert ended.value.maybe_executed is True


async def test_a_cancel_of_a_request_handed_out_before_says_it_may_have_run(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an at_least_once call whose first receiver went silent, queued again
    sender, request, call = await handed_out_again(
        make_queue, redis_client, key_prefix, "poll://alo-cancel-after-redelivery"
    )

    # When a node cancels it
    assert await sender.cancel(request.id) is True

    # Then its caller hears it was cancelled after pickup (it may have run), and no receiver
    # is handed it again
    with pytest.raises(PrqError) as ended:
        await asyncio.wait_for(call, 10)
    assert isinstance(ended.value, CancelledAfterPickup), ended.value
    assert ended.value.maybe_executed is True
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(request.endpoint)) == 0
    assert silent_take(redis_client, key_prefix, request.endpoint) == []


async def test_a_send_handed_out_before_is_no_longer_withdrawn(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an at_least_once send whose first receiver went silent, queued again
    sender = make_queue(pickup_timeout_s=30, **QUICK)
    endpoint = "poll://alo-withdraw-after-redelivery"
    request = Request(endpoint=endpoint, method="m", params=7, delivery="at_least_once")
    outcomes: list[object] = []
    handle = await sender.send(request, on_response=outcomes.append, on_failure=outcomes.append)
    await taken_silently_then_queued_again(redis_client, key_prefix, request)

    # When its handle withdraws it
    withdrawn = await handle.withdraw()

    # Then that is refused (it was picked up once: "neither callback runs" cannot be promised
    # for a request that may have run), and a live receiver runs it, its answer the callback's
    assert withdrawn is False
    receiver = make_queue(**QUICK)
    pending = await receiver.dequeue(endpoint, timeout_s=10)
    assert pending is not None and pending.id == request.id
    await receiver.apply_response(Response(id=request.id, result="ran"))
    await async_wait_until(lambda: outcomes, timeout_s=10, message="the send's callback")
    assert [getattr(o, "result", o) for o in outcomes] == ["ran"]
