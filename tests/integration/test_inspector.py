"""The operator's view (prq.ops.inspector.Inspector) against what nodes really do in Redis.

Depth, in flight, oldest age and live receivers must follow a request through its life: queued,
taken, answered, cancelled, withdrawn by a pickup timeout, orphaned by a dead receiver.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from prq import (
    CancelledBeforePickup,
    InvalidEndpoint,
    PendingRequest,
    PickupTimeout,
    QueueSettings,
    QueueShutdown,
    Request,
    RequestState,
    Response,
)
from prq.bulk import BulkClient
from prq.core.keys import KeySchema, encode_endpoint
from prq.embedded import EmbeddedRedis
from prq.ops.answers import EndpointInfo
from prq.ops.inspector import Inspector
from prq.protocol.dead import dead_letter_call, purge_dead_letters_flow
from prq.protocol.flows.context import Context
from tests.queue_facades import FAST_SETTINGS, QueueFactory, wait_for_state
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: Nodes report their endpoints at each data-loss check; short so the view follows quickly.
CHECK_S = 0.2


@pytest.fixture
async def inspector(redis_url: str, key_prefix: str) -> AsyncIterator[Inspector]:
    settings = QueueSettings(**{**FAST_SETTINGS, "data_loss_check_interval_s": CHECK_S})
    async with Inspector.from_url(redis_url, prefix=key_prefix, settings=settings) as view:
        yield view


async def info_of(view: Inspector, endpoint: str) -> EndpointInfo | None:
    return next((i for i in await view.endpoints() if i.endpoint == endpoint), None)


async def wait_for_info(view: Inspector, endpoint: str, what: str, **expected: object) -> None:
    async def matches() -> bool:
        info = await info_of(view, endpoint)
        return info is not None and all(getattr(info, k) == v for k, v in expected.items())

    await async_wait_until(matches, 10.0, 0.05, f"{endpoint}: {what} {expected}")


async def test_a_request_is_followed_from_queued_to_answered(
    make_queue: QueueFactory, inspector: Inspector
) -> None:
    # Given a sender with two calls queued on an endpoint nobody serves yet
    sender = make_queue(pickup_timeout_s=30, data_loss_check_interval_s=CHECK_S)
    receiver = make_queue(data_loss_check_interval_s=CHECK_S)
    endpoint = 'poll://inspect/<b>&"x"'
    first, second = (Request(endpoint=endpoint, method="m", params=i) for i in range(2))
    calls = [asyncio.create_task(sender.queue_and_wait(first))]
    await wait_for_state(sender, first.id, RequestState.QUEUED)  # (two tasks have no order)
    calls.append(asyncio.create_task(sender.queue_and_wait(second)))
    await wait_for_state(sender, second.id, RequestState.QUEUED)

    # Then the view lists the endpoint (reported by the sender) with both queued, oldest first
    await wait_for_info(inspector, endpoint, "queued", depth=2, in_flight=0, receivers=0)
    info = await inspector.endpoint(endpoint)
    assert info.enqueued_total == 2 and info.oldest_age_s is not None
    assert info.last_seen_ms > 0
    page = await inspector.queued(endpoint)
    assert [item.id for item in page.items] == [first.id, second.id]
    assert page.total == 2 and page.items[0].method == "m"
    assert page.items[0].producer == sender.node_id and page.items[0].body_bytes > 0

    # When a receiver takes one, it is in flight and the receiver counts as live
    taken = await receiver.dequeue(endpoint, timeout_s=5)
    assert taken is not None and taken.id == first.id
    await wait_for_info(inspector, endpoint, "taken", depth=1, in_flight=1, receivers=1)

    # When it is answered, nothing is in flight; the other is withdrawn by cancel
    await receiver.apply_response(Response(id=first.id, result="ok"))
    assert (await asyncio.wait_for(calls[0], 10)).result == "ok"
    assert await sender.cancel(second.id) is True
    with pytest.raises(CancelledBeforePickup):
        await asyncio.wait_for(calls[1], 10)
    info = await inspector.endpoint(endpoint)
    assert (info.depth, info.in_flight, info.oldest_age_s) == (0, 0, None)
    assert (await inspector.queued(endpoint)).items == []


async def test_cancel_after_pickup_and_a_lost_receiver_leave_no_request_in_flight(
    make_queue: QueueFactory, inspector: Inspector
) -> None:
    # Given two requests picked up by a receiver
    sender = make_queue(
        pickup_timeout_s=30, receiver_timeout_s=1.5, heartbeat_interval_s=0.3,
        heartbeat_initial_delay_s=0.2,
    )  # fmt: skip
    receiver = make_queue(
        receiver_timeout_s=1.5, heartbeat_interval_s=0.3, heartbeat_initial_delay_s=0.2
    )
    endpoint = "poll://inspect-lost"
    cancelled, orphaned = (Request(endpoint=endpoint, method="m") for _ in range(2))
    calls = [asyncio.create_task(sender.queue_and_wait(r)) for r in (cancelled, orphaned)]
    held: list[PendingRequest] = []
    for _ in range(10):  # the two enqueues race the takes: collect until both are held
        held += await receiver.dequeue_many(endpoint, 2, timeout_s=5)
        if len(held) == 2:
            break
    assert {p.id for p in held} == {cancelled.id, orphaned.id}
    assert (await inspector.endpoint(endpoint)).in_flight == 2

    # When one is cancelled after pickup, it leaves the in-flight count at once
    assert await sender.cancel(cancelled.id) is True
    assert (await inspector.endpoint(endpoint)).in_flight == 1

    # When the receiver dies (it stops beating), its caller declares it lost: nothing in flight
    await receiver.aclose()
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 15)
    assert [type(r).__name__ for r in results] == ["CancelledAfterPickup", "ReceiverLost"]
    assert (await inspector.endpoint(endpoint)).in_flight == 0


async def test_a_pickup_timeout_takes_the_request_off_the_queue(
    make_queue: QueueFactory, inspector: Inspector
) -> None:
    # Given a call that nobody picks up
    sender = make_queue()
    endpoint = "poll://inspect-timeout"
    with pytest.raises(PickupTimeout):
        await sender.queue_and_wait(Request(endpoint=endpoint, method="m"), pickup_timeout_s=0.3)
    # Then the queue is empty again: the withdrawn id left the list (depth counts live requests)
    assert (await inspector.endpoint(endpoint)).depth == 0


async def test_queued_pages_through_the_list(
    make_queue: QueueFactory, inspector: Inspector
) -> None:
    sender = make_queue(pickup_timeout_s=30)
    endpoint = "poll://inspect-pages"
    requests = [Request(endpoint=endpoint, method=f"m{i}") for i in range(7)]
    calls = [asyncio.create_task(sender.queue_and_wait(r)) for r in requests]
    await wait_for_state(sender, requests[-1].id, RequestState.QUEUED)
    for request in requests[:-1]:
        await wait_for_state(sender, request.id, RequestState.QUEUED)

    pages = [await inspector.queued(endpoint, offset, 3) for offset in (0, 3, 6)]
    assert [p.total for p in pages] == [7, 7, 7]
    listed = [item.id for page in pages for item in page.items]
    # One producer: the order is the enqueue order (the calls raced, so compare as a set too)
    assert sorted(listed) == sorted(r.id for r in requests) and len(listed) == 7
    with pytest.raises(ValueError):
        await inspector.queued(endpoint, 0, 0)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)


async def test_priorities_are_counted_listed_in_take_order_and_paged_across_levels(
    make_queue: QueueFactory, inspector: Inspector, redis_url: str, key_prefix: str
) -> None:
    # Given 7 requests on three priorities, two producers at priority 0, sent in this order
    endpoint = "poll://inspect-priorities"
    sent = [(0, "a"), (0, "a"), (0, "b"), (5, "a"), (-2, "a"), (5, "b"), (0, "a")]
    requests = [
        Request(endpoint=endpoint, method=f"m{i}", id=f"r{i}", priority=p, producer=who)
        for i, (p, who) in enumerate(sent)
    ]
    settings = QueueSettings(**{**FAST_SETTINGS, "pickup_timeout_s": 60})
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as bulk:
        assert bulk.enqueue_many(requests).accepted == 7

    # When the endpoint is described and its queue paged through 3 at a time
    info = await inspector.endpoint(endpoint)
    pages = [await inspector.queued(endpoint, offset, 3) for offset in (0, 3, 6)]

    # Then the depth is counted per priority, highest first
    assert info.depth == 7
    assert [(d.priority, d.depth) for d in info.priorities] == [(5, 2), (0, 4), (-2, 1)]
    assert info.oldest_age_s is not None
    # And the pages list the take order: priority 5, then 0 with "a" and "b" taking turns
    # (a turn tie is listed by id), then -2
    listed = [item.id for page in pages for item in page.items]
    assert listed == ["r3", "r5", "r0", "r2", "r1", "r6", "r4"]
    assert [item.priority for page in pages for item in page.items] == [5, 5, 0, 0, 0, 0, -2]
    assert {page.total for page in pages} == {7}
    # And a receiver takes them in that order (no 10th take here to go to a lower level)
    receiver = make_queue()
    taken = []
    for _ in range(7):
        pending = await receiver.dequeue(endpoint, timeout_s=5)
        assert pending is not None
        taken.append(pending.id)
    assert taken == listed
    assert (await inspector.endpoint(endpoint)).priorities == []


async def test_the_registry_is_safe_from_hostile_names_and_foreign_entries(
    make_queue: QueueFactory, inspector: Inspector, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given endpoints with glob characters, braces, colons and unicode
    sender = make_queue(data_loss_check_interval_s=CHECK_S)
    names = ["poll://a*b?[c]", "poll://{tag}:x", "poll://ünï/código", "poll://a b"]
    for name in names:
        with pytest.raises(PickupTimeout):
            await sender.queue_and_wait(Request(endpoint=name, method="m"), pickup_timeout_s=0.05)
    # And garbage written into the registry by someone else
    registry = f"{key_prefix}:endpoints"
    redis_client.zadd(registry, {"%ZZnot-encoded": 1, "\r\nbad": 2, "": 3})

    # Then the view lists exactly the real endpoints, decoded, and ignores the rest
    async def all_listed() -> bool:
        return {i.endpoint for i in await inspector.endpoints()} == set(names)

    await async_wait_until(all_listed, 10.0, 0.05, "hostile endpoints listed")
    stored: list[bytes] = redis_client.zrange(registry, 0, -1)  # type: ignore[assignment]
    members = {m.decode() for m in stored}
    assert {encode_endpoint(n) for n in names} <= members
    # And a bad name asked for directly is refused, not looked up
    with pytest.raises(InvalidEndpoint):
        await inspector.endpoint("poll://bad\nname")


async def test_receivers_count_live_serving_nodes_only(
    make_queue: QueueFactory, inspector: Inspector
) -> None:
    # Given two nodes serving one endpoint
    endpoint = "poll://inspect-receivers"
    nodes = [make_queue(data_loss_check_interval_s=CHECK_S) for _ in range(2)]
    servings = [make_queue.serve(node, endpoint, lambda r: r.params) for node in nodes]
    await wait_for_info(inspector, endpoint, "two receivers", receivers=2)

    # When one stops serving and closes, it drops out within a few check intervals
    await servings[0].stop()
    await nodes[0].aclose()
    started = time.monotonic()
    await wait_for_info(inspector, endpoint, "one receiver", receivers=1)
    assert time.monotonic() - started < 10 * CHECK_S + 2.0


async def test_health_reports_eviction_and_persistence(own_redis: EmbeddedRedis) -> None:
    client = redis.Redis.from_url(own_redis.url)
    try:
        async with Inspector.from_url(own_redis.url) as view:
            # A server configured as prq wants it: no warnings
            health = await view.redis_health()
            assert health.ok and health.warnings == [] and health.persistence == []
            assert health.maxmemory_policy == "noeviction" and health.version

            # When it evicts and persists, both are reported
            client.config_set("maxmemory", "100mb")
            client.config_set("maxmemory-policy", "allkeys-lru")
            client.config_set("appendonly", "yes")
            client.config_set("save", "3600 1")
            client.save()  # INFO shows snapshots once one was taken
            health = await view.redis_health()
            assert health.persistence == ["aof", "rdb snapshots"]
            assert len(health.warnings) == 2
            assert "allkeys-lru" in health.warnings[0] and "aof" in health.warnings[1]

        # And a stopped server is reported as down, not raised
        view = Inspector.from_url(own_redis.url)
        own_redis.kill()
        health = await view.redis_health()
        assert not health.ok and health.error
        await view.aclose()
    finally:
        client.close()


async def test_a_node_warns_loudly_at_start_about_an_evicting_redis(
    make_own_queue: QueueFactory,
    own_redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    own_redis_client.config_set("maxmemory", "100mb")
    own_redis_client.config_set("maxmemory-policy", "volatile-lru")
    queue = make_own_queue()
    with caplog.at_level(logging.WARNING, logger="prq"):
        await queue.start()
    warned = [r for r in caplog.records if "defeats prq's guarantees" in r.getMessage()]
    assert len(warned) == 1 and "volatile-lru" in warned[0].getMessage()
    assert queue.redis_warnings == [warned[0].getMessage().split(": ", 1)[1]]


async def test_a_silent_sender_leaves_no_request_in_flight(
    make_queue: QueueFactory, inspector: Inspector
) -> None:
    # Given a request picked up by a receiver, from a sender that then goes silent
    timings: dict[str, Any] = {
        "sender_timeout_s": 1.0, "heartbeat_interval_s": 0.2, "heartbeat_initial_delay_s": 0.1,
    }  # fmt: skip
    sender, receiver = make_queue(pickup_timeout_s=30, **timings), make_queue(**timings)
    endpoint = "poll://inspect-sender-lost"
    call = asyncio.create_task(sender.queue_and_wait(Request(endpoint=endpoint, method="m")))
    held = await receiver.dequeue(endpoint, timeout_s=5)
    assert held is not None
    assert (await inspector.endpoint(endpoint)).in_flight == 1
    await sender.aclose()  # its beats stop; its caller is told the queue closed
    with pytest.raises(QueueShutdown):
        await asyncio.wait_for(call, 10)

    # When the receiver's beats judge the sender lost, the request is cancelled under it
    assert await asyncio.to_thread(held.wait_cancelled, 10.0)
    assert held.cancel_reason == "sender_lost"
    # Then it is no longer in flight
    assert (await inspector.endpoint(endpoint)).in_flight == 0


async def test_endpoints_unused_for_a_day_leave_the_registry(
    make_queue: QueueFactory,
    inspector: Inspector,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given a registry entry nobody refreshed for two days
    registry = f"{key_prefix}:endpoints"
    stale = encode_endpoint("poll://long-gone")
    redis_client.zadd(registry, {stale: int((time.time() - 2 * 86400) * 1000)})
    assert "poll://long-gone" in {i.endpoint for i in await inspector.endpoints()}

    # When a node reports its own endpoints
    sender = make_queue(data_loss_check_interval_s=CHECK_S)
    with pytest.raises(PickupTimeout):
        await sender.queue_and_wait(
            Request(endpoint="poll://in-use", method="m"), pickup_timeout_s=0.05
        )

    # Then the stale entry is dropped and the live one listed
    async def trimmed() -> bool:
        return {i.endpoint for i in await inspector.endpoints()} == {"poll://in-use"}

    await async_wait_until(trimmed, 10.0, 0.05, "stale endpoint trimmed")
    # And the sampler's cheap read agrees with the full one
    assert await inspector.enqueued_totals() == {"poll://in-use": 1}


async def test_a_running_node_warns_when_redis_starts_persisting(
    make_own_queue: QueueFactory,
    own_redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a node running against a Redis configured as prq wants it
    queue = make_own_queue(data_loss_check_interval_s=0.1)
    with caplog.at_level(logging.WARNING, logger="prq"):
        await queue.start()
        assert queue.redis_warnings == []

        # When someone turns AOF on, Then the node notices at its next check, and says it once
        own_redis_client.config_set("appendonly", "yes")
        await async_wait_until(
            lambda: len(queue.redis_warnings) == 1, 10.0, 0.05, "persistence noticed"
        )
        # (and stays quiet through a few more checks)
        watch = queue._watch
        later = watch.data_loss.next_check + 3 * 0.1
        await async_wait_until(
            lambda: watch.data_loss.next_check > later, 10.0, 0.05, "three more checks"
        )
    warned = [r for r in caplog.records if "defeats prq's guarantees" in r.getMessage()]
    assert len(warned) == 1 and "aof" in warned[0].getMessage()


async def test_limits_show_in_the_same_round_trips_and_malformed_ones_as_none(
    make_queue: QueueFactory,
    inspector: Inspector,
    redis_client: redis.Redis,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given three reported endpoints: one with both limits, one with max_pending only, and
    # one whose limits hash someone else wrote with a value that is no positive integer
    node = make_queue(data_loss_check_interval_s=CHECK_S)
    both, pending_only, garbled = (f"poll://inspect-limits-{i}" for i in range(3))
    for endpoint in (both, pending_only, garbled):
        with pytest.raises(PickupTimeout):
            await node.queue_and_wait(Request(endpoint=endpoint, method="m"), pickup_timeout_s=0.05)
    await node.set_limits(both, max_in_flight=2, max_pending=40)
    await node.set_limits(pending_only, max_pending=7)
    limits_key = KeySchema(key_prefix).endpoint(garbled).limits
    redis_client.hset(limits_key, mapping={"mif": "lots", "mp": "0"})

    async def all_listed() -> dict[str, EndpointInfo] | None:
        found = {i.endpoint: i for i in await inspector.endpoints()}
        return found if {both, pending_only, garbled} <= set(found) else None

    listed = await async_wait_until(all_listed, 10.0, 0.05, "the three endpoints listed")

    # When the endpoints are listed, counting the round trips to Redis
    round_trips = 0
    original = inspector.client.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = original(*args, **kwargs)
        execute = pipe.execute

        async def counted(*a: Any, **k: Any) -> Any:
            nonlocal round_trips
            round_trips += 1
            return await execute(*a, **k)

        pipe.execute = counted  # type: ignore[method-assign]
        return pipe

    inspector.client.pipeline = counting_pipeline  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="prq.ops.endpoint_view")
    try:
        listed = {i.endpoint: i for i in await inspector.endpoints()}
    finally:
        del inspector.client.pipeline

    # Then each shows its limits (None: no limit), read in the pipelines already made: the
    # registry, the figures, and nothing more (no request is queued, so no head is read)
    assert round_trips == 2
    assert (listed[both].max_in_flight, listed[both].max_pending) == (2, 40)
    assert (listed[pending_only].max_in_flight, listed[pending_only].max_pending) == (None, 7)
    # ... and the garbled values show as None, with a warning naming the endpoint and field
    assert (listed[garbled].max_in_flight, listed[garbled].max_pending) == (None, None)
    warned = [r.getMessage() for r in caplog.records if "malformed stored limit" in r.msg]
    assert any(garbled in w and "max_in_flight" in w for w in warned)
    assert any(garbled in w and "max_pending" in w for w in warned)
    # And the one-endpoint view and the limits read agree
    one = await inspector.endpoint(both)
    assert (one.max_in_flight, one.max_pending) == (2, 40)
    assert (await inspector.limits(pending_only)).max_pending == 7
    assert (await inspector.limits(garbled)).model_dump() == {
        "endpoint": garbled, "max_in_flight": None, "max_pending": None,
    }  # fmt: skip
    with pytest.raises(InvalidEndpoint):
        await inspector.limits("poll://bad\nname")


async def test_dead_letters_are_listed_and_counted_with_reads_only(
    make_queue: QueueFactory,
    inspector: Inspector,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given a reported endpoint with three dead letters, and a hostile-named one with none
    node = make_queue(data_loss_check_interval_s=CHECK_S)
    endpoint, clean = "poll://inspect-dead", "poll://inspect-dead/<b>{x}*"
    for name in (endpoint, clean):
        with pytest.raises(PickupTimeout):
            await node.queue_and_wait(Request(endpoint=name, method="m"), pickup_timeout_s=0.05)
    await node.start()
    requests = [Request(endpoint=endpoint, method="m", params=i) for i in range(3)]
    for request in requests:
        body = request.model_dump_json().encode()
        call = dead_letter_call(node.ctx, endpoint, request.id, body, "attempts_exhausted", 2)
        redis_client.execute_command(*call.args)  # type: ignore[no-untyped-call]

    # When the Inspector lists them, Then it sees what the queue's own listing sees
    listed = await inspector.dead_letters(endpoint)
    assert listed == await node.dead_letters(endpoint)
    assert [d.id for d in listed] == [r.id for r in reversed(requests)]
    assert [d.id for d in await inspector.dead_letters(endpoint, offset=1, limit=1)] == [
        requests[1].id
    ]
    assert await inspector.dead_letters(clean) == []
    # And the endpoint listing counts them (in the pipelines it already makes)
    await wait_for_info(inspector, endpoint, "dead letters counted", dead_letters=3)
    await wait_for_info(inspector, clean, "no dead letters", dead_letters=0)
    assert (await inspector.endpoint(endpoint)).dead_letters == 3

    # And bad names and pages are refused before Redis is asked
    with pytest.raises(InvalidEndpoint):
        await inspector.dead_letters("poll://bad\nname")
    for offset, limit in ((-1, 10), (0, 0), (0, 1001)):
        with pytest.raises(ValueError):
            await inspector.dead_letters(endpoint, offset=offset, limit=limit)

    # And a flow that would write is refused before anything is sent
    ctx = Context(KeySchema(key_prefix), inspector.settings, node_id="inspector")
    with pytest.raises(RuntimeError, match="only reads"):
        await inspector._read_flows([purge_dead_letters_flow(ctx, endpoint)])
    assert len(await node.dead_letters(endpoint)) == 3
