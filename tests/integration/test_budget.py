"""Costs per request: Redis commands and round trips per call, and pub/sub subscriptions.

How commands are counted on the server (measured on Redis 7.0): `INFO commandstats` and
`total_commands_processed` both include the commands a Lua script runs (50 fast calls raised
total_commands_processed by ~1,200 while the clients sent 200 commands), so neither measures
what a client sends. MONITOR marks script-run commands with `[0 lua]`; `CommandMonitor` counts
the others, which is what the client side (`queue.stats`) counts too. `cmdstat_evalsha` is a
second, independent check: a script cannot call EVALSHA, so its delta is client-sent only.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from prq import Request, Response
from prq.embedded import EmbeddedRedis
from tests.queue_facades import AnyQueue, QueueFactory, run_all
from tests.redis_servers import CommandMonitor, async_wait_until

pytestmark = pytest.mark.integration

#: A sender spends the enqueue script per call (no locator: requests are found by id through
#: the registry, which the node's first call to the endpoint filled, in the warm-up)...
SENDER_COMMANDS_PER_CALL = 1
#: ...in one round trip; the response arrives inside the pulse (no read).
SENDER_ROUND_TRIPS_PER_CALL = 1
#: A receiver serving sequential calls spends a take that confirms the request handed to it
#: (scripts/_handoff.lua: nothing runs on the strength of a pulse alone, so a hand-off to a
#: receiver that died while parked goes to another one), the apply_response script, and one
#: take that parks it again so that the next request is handed to it directly.
RECEIVER_COMMANDS_PER_CALL = 3
#: Now and then a pulse crosses the take that parks the receiver (the request went to the list
#: a moment before); the receiver then takes once more, to be safe. A few such takes per run.
RECEIVER_SPARE_TAKES = 3
#: Sequential calls measured (after a warm-up that loads scripts and subscribes).
BUDGET_CALLS = 50
WARM_UP_CALLS = 3
#: Calls made at once in the subscription test.
SUBSCRIPTION_CALLS = 500
#: Pub/sub link upkeep, not per-request cost: left out of the server-side count.
PUBSUB_UPKEEP = frozenset({"PING", "SUBSCRIBE", "PSUBSCRIBE", "UNSUBSCRIBE"})
#: What this test itself sends while the monitor runs (to see the receiver parked again).
TEST_PROBES = frozenset({"HLEN"})


def echo(request: Request) -> object:
    return request.params


async def settled(*queues: AnyQueue, quiet_s: float = 0.3, timeout_s: float = 5.0) -> None:
    """Wait (bounded) until the nodes have sent nothing for `quiet_s` (e.g. a receiver's next
    take has gone out), so a measuring window starts and ends between steps, not inside one."""
    last: list[int] = []
    since = time.monotonic()

    def quiet() -> bool:
        nonlocal last, since
        now = [queue.stats.redis_commands for queue in queues]
        if now != last:
            last, since = now, time.monotonic()
        return time.monotonic() - since >= quiet_s

    await async_wait_until(quiet, timeout_s, 0.02, "nodes went quiet")


async def test_a_fast_round_trip_stays_within_its_command_budget(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis, own_redis_client: redis.Redis
) -> None:
    # Given one sender and one receiver serving sequentially, warmed up, on a server of our own
    # (long poll interval, long-poll and data-loss check interval, so that no node upkeep
    # falls into the measured window)
    upkeep: dict[str, Any] = {
        "poll_interval_s": 30,
        "dequeue_timeout_s": 30,
        "data_loss_check_interval_s": 3600,
    }
    sender = make_own_queue(**upkeep)
    receiver = make_own_queue(**upkeep)
    endpoint = "poll://budget"
    make_own_queue.serve(receiver, endpoint, echo, concurrency=1)
    for i in range(WARM_UP_CALLS):
        assert await asyncio.wait_for(sender.call(endpoint, "m", i), 10) == i
    await settled(sender, receiver)
    sender_0, receiver_0 = sender.stats, receiver.stats
    evalsha_0 = own_redis_client.info("commandstats")["cmdstat_evalsha"]["calls"]

    # When 50 calls are made one after another
    parks = sender.keys.endpoint(endpoint).parks
    with CommandMonitor(own_redis.url) as monitor:
        for i in range(BUDGET_CALLS):
            assert await asyncio.wait_for(sender.call(endpoint, "m", i), 10) == i
        # (and the receiver's last take, which parks it for the next call, has landed)
        await async_wait_until(lambda: own_redis_client.hlen(parks) == 1, 5)
        await settled(sender, receiver)

    # Then, as the nodes count them, each call stays within the budget
    sender_1, receiver_1 = sender.stats, receiver.stats
    sender_commands = sender_1.redis_commands - sender_0.redis_commands
    sender_round_trips = sender_1.round_trips - sender_0.round_trips
    receiver_commands = receiver_1.redis_commands - receiver_0.redis_commands
    assert sender_commands <= SENDER_COMMANDS_PER_CALL * BUDGET_CALLS
    assert sender_round_trips <= SENDER_ROUND_TRIPS_PER_CALL * BUDGET_CALLS
    assert receiver_commands <= RECEIVER_COMMANDS_PER_CALL * BUDGET_CALLS + RECEIVER_SPARE_TAKES
    # And the server saw exactly what the nodes say they sent (scripts' own commands aside)
    sent = {
        name: n
        for name, n in monitor.client.items()
        if name not in PUBSUB_UPKEEP and name not in TEST_PROBES
    }
    assert sum(sent.values()) == sender_commands + receiver_commands, sent
    budget = (SENDER_COMMANDS_PER_CALL + RECEIVER_COMMANDS_PER_CALL) * BUDGET_CALLS
    assert sum(sent.values()) <= budget + RECEIVER_SPARE_TAKES, sent
    assert monitor.lua, "MONITOR should have reported the scripts' own commands apart"
    evalsha_1 = own_redis_client.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert evalsha_1 - evalsha_0 == sent.get("EVALSHA", 0)


#: Calls made at once in the merged-enqueue test.
MERGED_CALLS = 64


async def test_calls_made_at_once_share_enqueue_script_calls(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given a sender and a receiver, warmed up, and a receiver that holds its answers until
    # every call is queued (so that the sender's enqueues meet in its round trips)
    sender = make_own_queue()
    receiver = make_own_queue()
    endpoint = "poll://merged"
    make_own_queue.serve(receiver, endpoint, echo, concurrency=8)
    assert await asyncio.wait_for(sender.call(endpoint, "m", -1), 10) == -1
    await settled(sender)
    evalsha_0 = own_redis_client.info("commandstats")["cmdstat_evalsha"]["calls"]
    sender_0 = sender.stats.redis_commands

    # When 64 calls are made at once
    results = await run_all((sender.call(endpoint, "m", i) for i in range(MERGED_CALLS)), 30)

    # Then each caller got its own answer
    assert results == list(range(MERGED_CALLS))
    # And the sender sent fewer script calls than it made calls: enqueues to one endpoint that
    # went out together were one script call (prq.protocol.scripts.merging.merge_enqueues)
    sent = sender.stats.redis_commands - sender_0
    assert sent < MERGED_CALLS, sent
    assert own_redis_client.info("commandstats")["cmdstat_evalsha"]["calls"] > evalsha_0


#: Redis commands per call, those Lua scripts run included, for calls queued together and
#: served together (issue target: at most 12). What one request costs: its enqueue (read the
#: id, write the record, its TTL), its take (read, write, TTL) and its answer (read, write,
#: TTL); the rest (the sequence number, queue upkeep, the pulse) is shared by a batch.
BATCH_COMMANDS_PER_CALL = 12


async def test_calls_queued_and_served_together_stay_within_the_batch_budget(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis, facade: str
) -> None:
    if facade == "sync":
        # (how far a blocking node's enqueues merge depends on its callers' threads meeting in
        # one round trip, which this harness does not arrange: bench/rpc.py measures prq-sync
        # with 64 calling threads)
        pytest.skip("batching of the blocking facade is measured by bench/rpc.py")
    # Given a sender and a receiver node that used the endpoint before (scripts loaded, the
    # endpoint registered, its layout checked, the sender's stamp there written), with no node
    # upkeep due during the test
    upkeep: dict[str, Any] = {
        "poll_interval_s": 30,
        "dequeue_timeout_s": 30,
        "data_loss_check_interval_s": 3600,
    }
    sender = make_own_queue(**upkeep)
    receiver = make_own_queue(**upkeep)
    endpoint = "poll://batched"
    warming = asyncio.ensure_future(sender.call(endpoint, "m", None))
    warm = await receiver.dequeue(endpoint, timeout_s=10)
    assert warm is not None
    await receiver.apply_response(Response(id=warm.id, result=None))
    assert await asyncio.wait_for(warming, 10) is None
    await settled(sender, receiver)
    sent_0 = sender.stats.redis_commands

    with CommandMonitor(own_redis.url) as monitor:
        # When 64 calls are made at once while nobody serves their endpoint, and then a
        # receiver serves it with room for all of them
        calls = asyncio.ensure_future(
            run_all((sender.call(endpoint, "m", i) for i in range(MERGED_CALLS)), 30)
        )
        await async_wait_until(lambda: sender.stats.redis_commands > sent_0, 10)
        await settled(sender)  # (every call's enqueue has gone out)
        make_own_queue.serve(receiver, endpoint, echo, concurrency=MERGED_CALLS)
        assert await calls == list(range(MERGED_CALLS))
        await settled(sender, receiver)

    # Then Redis ran at most the budget of commands per call, scripts' own commands included
    sent = sum(n for name, n in monitor.client.items() if name not in PUBSUB_UPKEEP)
    ran = sent + sum(monitor.lua.values())
    assert ran <= BATCH_COMMANDS_PER_CALL * MERGED_CALLS, (monitor.client, monitor.lua)


def ignore(*_: object) -> None:
    """An outcome callback that keeps nothing."""


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def pubsub_clients(client: redis.Redis) -> int:
    """Connections subscribed to at least one channel or pattern."""
    return sum(1 for c in client.client_list() if int(c["sub"]) + int(c["psub"]) > 0)


async def test_subscriptions_do_not_grow_with_the_number_of_requests(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis, facade: str, key_prefix: str
) -> None:
    # Given one sender node and one receiver node serving one endpoint
    sender = make_own_queue(pickup_timeout_s=30)
    receiver = make_own_queue()
    endpoint = "poll://many"
    make_own_queue.serve(receiver, endpoint, echo, concurrency=16)
    limit = asyncio.Semaphore(200 if facade == "sync" else SUBSCRIPTION_CALLS)
    peak_channels = 0
    sampling = True

    async def sample() -> None:
        nonlocal peak_channels
        while sampling:
            channels = own_redis_client.pubsub_channels(f"{key_prefix}:*")
            peak_channels = max(peak_channels, len(channels))
            await asyncio.sleep(0.02)  # a sampling interval, not a synchronisation

    async def one(i: int) -> object:
        async with limit:
            return await sender.call(endpoint, "m", i)

    # When 500 calls are made at once (while the server's channels are sampled)
    sampler = asyncio.create_task(sample())
    try:
        results = await run_all((one(i) for i in range(SUBSCRIPTION_CALLS)), 60)
    finally:
        sampling = False
        await asyncio.wait_for(sampler, 5)
    assert results == list(range(SUBSCRIPTION_CALLS))

    # Then the sender holds 1 subscription (its node channel) and the receiver 2 (its node
    # channel and the endpoint's pulse channel), on one pub/sub connection each
    assert (sender.stats.subscriptions, receiver.stats.subscriptions) == (1, 2)
    expected = {
        sender.keys.node_channel(sender.node_id),
        receiver.keys.node_channel(receiver.node_id),
        receiver.keys.endpoint(endpoint).pulse_channel,
    }
    channels = {text(c) for c in own_redis_client.pubsub_channels(f"{key_prefix}:*")}
    assert channels == expected
    assert {text(c): n for c, n in own_redis_client.pubsub_numsub(*expected)} == dict.fromkeys(
        expected, 1
    )
    assert own_redis_client.pubsub_numpat() == 0
    assert pubsub_clients(own_redis_client) == 2
    # And at no moment during the calls were there more channels than that
    assert peak_channels == len(expected)


async def test_requests_queued_behind_work_pulse_only_while_a_receiver_is_parked(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given an endpoint nobody serves, and a watcher of its pulse channel
    sender = make_own_queue(pickup_timeout_s=30)
    endpoint = "poll://quiet-pulses"
    keys = sender.keys.endpoint(endpoint)
    watcher = own_redis_client.pubsub()  # type: ignore[no-untyped-call, unused-ignore]
    watcher.subscribe(keys.pulse_channel)
    confirmed = watcher.get_message(timeout=5)
    assert confirmed is not None and confirmed["type"] == "subscribe"

    # When ten requests are sent (no receiver is parked: they are queued)
    for i in range(10):
        await sender.send(
            Request(endpoint=endpoint, method="m", params=i), on_response=ignore, on_failure=ignore
        )
    await async_wait_until(lambda: own_redis_client.zcard(keys.levels) == 1, 5)

    # Then no pulse went out for them: a receiver that is not parked takes before it parks
    assert watcher.get_message(timeout=0.5) is None

    # When a receiver parks its take (a stale park left on the list stands in for it: the
    # parked list is what the enqueue looks at), and one more request is queued
    own_redis_client.rpush(keys.parked, "token-of-a-parked-take")
    await sender.send(
        Request(endpoint=endpoint, method="m", params=10), on_response=ignore, on_failure=ignore
    )

    # Then that one pulses the endpoint
    message = watcher.get_message(timeout=5)
    assert message is not None and message["type"] == "message"
    watcher.close()
