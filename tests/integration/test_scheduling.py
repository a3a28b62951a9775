"""Scheduling on real Redis (scripts/_queue.lua): a higher priority is taken first, lower
priorities keep a share, producers take turns within a priority, one producer's order is FIFO,
and the per-priority queues leave nothing behind."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from prq import (
    CancelledBeforePickup,
    InvalidRequest,
    PickupTimeout,
    QueueFull,
    QueueSettings,
    Request,
    RequestState,
    Response,
)
from prq.bulk import BatchRefused, BulkClient
from prq.core.models import MAX_PRIORITY, MAX_PRODUCER_LENGTH, MIN_PRIORITY
from prq.protocol.scripts.loading import HAND_BACK, TAKE
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.take import hand_back_call, parse_take, take_call
from tests.queue_facades import FAST_SETTINGS, AnyQueue, QueueFactory, wait_for_state
from tests.queued import level_ids, queue_depth, queued_ids, silent_take
from tests.redis_servers import async_wait_until, wait_until

pytestmark = pytest.mark.integration

#: Every SHARE-th take a level makes while a lower level holds work goes down (_queue.lua).
SHARE = 10


@pytest.fixture
def bulk(redis_url: str, key_prefix: str) -> Iterator[BulkClient]:
    settings = QueueSettings(**{**FAST_SETTINGS, "pickup_timeout_s": 60})
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as client:
        yield client


def batch(endpoint: str, producer: str, n: int, priority: int = 0, tag: str = "") -> list[Request]:
    """n requests of one producer at one priority, ids "<tag or producer>-<priority>:<i>"."""
    return [
        Request(
            endpoint=endpoint,
            method="m",
            params=i,
            id=f"{tag or producer}-{priority}:{i}",
            producer=producer,
            priority=priority,
        )
        for i in range(n)
    ]


async def take(receiver: AnyQueue, endpoint: str, n: int) -> list[Request]:
    """The next n requests the endpoint hands out, one take each."""
    taken: list[Request] = []
    for _ in range(n):
        pending = await receiver.dequeue(endpoint, timeout_s=5)
        assert pending is not None, f"nothing to take after {len(taken)}"
        taken.append(pending.request)
    return taken


async def test_a_higher_priority_is_taken_first_and_one_producer_stays_fifo(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given requests queued by callers waiting on them, at two priorities, in this order
    sender, receiver = make_queue(pickup_timeout_s=30), make_queue()
    endpoint = "poll://priorities"
    order = [(0, "a1"), (0, "a2"), (5, "b1"), (0, "a3"), (5, "b2"), (-3, "c1")]
    sent = {}
    calls = []
    for priority, name in order:
        request = Request(endpoint=endpoint, method=name, priority=priority, producer="one")
        sent[name] = request
        calls.append(asyncio.ensure_future(sender.queue_and_wait(request)))
        await wait_for_state(sender, request.id, RequestState.QUEUED)
    assert queue_depth(redis_client, sender.keys.endpoint(endpoint)) == 6

    # When a receiver takes them one by one
    taken = [r.method for r in await take(receiver, endpoint, len(order))]

    # Then the highest priority comes first, each priority in the order it was sent
    assert taken == ["b1", "b2", "a1", "a2", "a3", "c1"]
    for name in taken:
        await receiver.apply_response(Response(id=sent[name].id, result=name))
    assert [response.result for response in await asyncio.gather(*calls)] == [n for _, n in order]
    # And nothing of the priority queues is left behind
    keys = sender.keys.endpoint(endpoint)
    assert not redis_client.exists(keys.levels)
    assert not redis_client.keys(f"{keys.level_prefix}*")


async def test_producers_take_turns_within_a_priority(
    make_queue: QueueFactory, bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given two bulk producers with 500 requests each on one endpoint (awkward names on purpose)
    receiver = make_queue()
    endpoint = "poll://fair"
    first, second = "job{a}:*", "job{a}:*\n"
    assert bulk.enqueue_many(batch(endpoint, first, 500, tag="first")).accepted == 500
    assert bulk.enqueue_many(batch(endpoint, second, 500, tag="second")).accepted == 500

    # When 200 are taken
    taken = await take(receiver, endpoint, 200)

    # Then the two producers alternate: each pair of takes holds one of each, in FIFO order
    for i in range(0, 200, 2):
        assert {taken[i].producer, taken[i + 1].producer} == {first, second}, i
    for producer in (first, second):
        assert [r.params for r in taken if r.producer == producer] == list(range(100))

    # When an interactive caller sends one request while 800 are still queued
    sender = make_queue(pickup_timeout_s=30)
    call = asyncio.ensure_future(sender.call(endpoint, "interactive"))
    keys = bulk.keys.endpoint(endpoint)
    await async_wait_until(lambda: queue_depth(redis_client, keys) == 801, 10, 0.01, "queued")

    # Then it is among the next three taken (behind at most one request per other producer)
    after = await take(receiver, endpoint, 3)
    assert "interactive" in [r.method for r in after]
    interactive = next(r for r in after if r.method == "interactive")
    assert interactive.producer == sender.node_id
    await receiver.apply_response(Response(id=interactive.id, result="served"))
    assert await call == "served"


async def test_lower_priorities_keep_a_share_and_are_never_starved(
    make_queue: QueueFactory, bulk: BulkClient
) -> None:
    # Given 100 requests at each of three priorities
    receiver = make_queue()
    endpoint = "poll://shares"
    for priority in (9, 3, -7):
        assert bulk.enqueue_many(batch(endpoint, "p", 100, priority)).accepted == 100

    # When 100 are taken while all three levels hold work
    taken = await take(receiver, endpoint, 100)

    # Then the top level gets 9 of every 10 takes; every 10th goes to a lower level, in turn
    shares = Counter(r.priority for r in taken)
    assert shares == {9: 100 - 100 // SHARE, 3: 100 // SHARE // 2, -7: 100 // SHARE // 2}
    lower = [(i, r.priority) for i, r in enumerate(taken) if r.priority != 9]
    assert lower == [(i, 3 if (i // SHARE) % 2 == 0 else -7) for i in range(9, 100, SHARE)]
    # ... and each level still hands out its own requests in order
    for priority in (9, 3, -7):
        got = [r.params for r in taken if r.priority == priority]
        assert got == list(range(len(got)))


async def test_a_lower_priority_keeps_its_share_under_a_trickle_that_empties_the_higher_level(
    make_queue: QueueFactory, bulk: BulkClient, redis_client: redis.Redis
) -> None:
    """Slowed, never starved, even when the higher level runs empty at every take: the count that
    sends every SHARE-th take down is the endpoint's (_queue.lua, `prq:{e}:pri:s`), not the
    higher level's, so it survives that level's keys going."""
    receiver = make_queue()
    endpoint = "poll://steady"
    keys = bulk.keys.endpoint(endpoint)
    # Given one request waiting at a low priority
    assert bulk.enqueue_many(batch(endpoint, "low", 1, priority=0)).accepted == 1

    # When a steady stream at a higher priority brings one request before each take, so that
    # every take finds exactly one there and empties the level
    taken: list[Request] = []
    for i in range(3 * SHARE):
        assert bulk.enqueue_many(batch(endpoint, "high", 1, priority=5, tag=f"h{i}")).accepted
        assert level_ids(redis_client, keys, 5) == [f"h{i}-5:0"]
        taken += await take(receiver, endpoint, 1)
        if taken[-1].priority == 0:
            break
        assert level_ids(redis_client, keys, 5) == [], i

    # Then the low request is the SHARE-th take, the higher ones before it in the order sent
    assert [r.id for r in taken] == [f"h{i}-5:0" for i in range(SHARE - 1)] + ["low-0:0"]
    # ... and with no lower level left the count is gone; the trickle is taken as it comes
    assert not redis_client.exists(keys.share)
    assert [r.id for r in await take(receiver, endpoint, 1)] == [f"h{SHARE - 1}-5:0"]
    assert queue_depth(redis_client, keys) == 0


async def test_lower_priorities_take_turns_under_a_trickle_each_within_share_times_their_number(
    make_queue: QueueFactory, bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given three lower priorities waiting (two requests at the first, one at each other)
    receiver = make_queue()
    endpoint = "poll://steady-many"
    keys = bulk.keys.endpoint(endpoint)
    lower = {3: 2, 0: 1, -7: 1}
    for priority, n in lower.items():
        assert bulk.enqueue_many(batch(endpoint, "low", n, priority)).accepted == n

    # When a trickle at a higher priority brings one request whenever that level is empty, so
    # that every take finds exactly one there (and a take of it empties the level)
    taken: list[Request] = []
    sent = 0
    for _ in range(4 * SHARE):
        if not level_ids(redis_client, keys, 9):
            trickle = batch(endpoint, "high", 1, priority=9, tag=f"h{sent}")
            assert bulk.enqueue_many(trickle).accepted == 1
            sent += 1
        assert len(level_ids(redis_client, keys, 9)) == 1
        taken += await take(receiver, endpoint, 1)

    # Then every SHARE-th take went down, round the lower levels from the highest: each of the
    # n = 3 waited at most SHARE * n takes, and the first one's second request came next round
    turns = [(i, r.id) for i, r in enumerate(taken) if r.priority != 9]
    assert turns == [
        (SHARE - 1, "low-3:0"),
        (2 * SHARE - 1, "low-0:0"),
        (3 * SHARE - 1, "low--7:0"),
        (4 * SHARE - 1, "low-3:1"),
    ]
    assert [r.id for r in taken if r.priority == 9] == [f"h{i}-9:0" for i in range(4 * SHARE - 4)]
    # ... and once the lower levels ran empty the count went with them
    assert level_ids(redis_client, keys, 9) == [f"h{4 * SHARE - 4}-9:0"]
    assert not redis_client.exists(keys.share)


async def test_max_pending_counts_every_priority_and_withdrawals_leave_no_keys(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given an endpoint that may hold 3 queued requests, holding one at each of 3 priorities
    sender = make_queue(pickup_timeout_s=30)
    endpoint = "poll://capacity-levels"
    await sender.set_limits(endpoint, max_pending=3)
    waiting = [Request(endpoint=endpoint, method="m", priority=p) for p in (1, 2, 3)]
    calls = [asyncio.ensure_future(sender.queue_and_wait(r)) for r in waiting]
    for request in waiting:
        await wait_for_state(sender, request.id, RequestState.QUEUED)

    # When a fourth arrives at a fresh priority, Then it is refused
    with pytest.raises(QueueFull):
        await sender.queue_and_wait(Request(endpoint=endpoint, method="m", priority=9))

    # When they are cancelled before pickup, or time out waiting
    for request, call in zip(waiting, calls, strict=True):
        assert await sender.cancel(request.id) is True
        with pytest.raises(CancelledBeforePickup):
            await call
    short = make_queue(pickup_timeout_s=0.2)
    with pytest.raises(PickupTimeout):
        await short.queue_and_wait(Request(endpoint=endpoint, method="m", priority=-4))

    # Then every id left its level and the emptied levels left no key behind
    keys = sender.keys.endpoint(endpoint)
    await async_wait_until(
        lambda: queue_depth(redis_client, keys) == 0, 10, 0.02, "every level emptied"
    )
    assert queued_ids(redis_client, keys) == []
    assert not redis_client.exists(keys.levels)
    assert not redis_client.keys(f"{keys.level_prefix}*")


async def test_a_batch_of_mixed_priorities_queues_each_in_its_level(
    make_queue: QueueFactory, bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given one batch mixing priorities and producers
    endpoint = "poll://mixed-batch"
    requests = batch(endpoint, "x", 3, 0) + batch(endpoint, "y", 2, 4) + batch(endpoint, "x", 2, 4)
    result = bulk.enqueue_many(requests)
    assert result.accepted == 7

    # Then each request sits in its priority's queue, with the batch's order kept per producer
    keys = bulk.keys.endpoint(endpoint)
    assert level_ids(redis_client, keys, 0) == [f"x-0:{i}" for i in range(3)]
    top = level_ids(redis_client, keys, 4)
    assert sorted(top) == sorted(["y-4:0", "y-4:1", "x-4:0", "x-4:1"])
    assert [i for i in top if i.startswith("y")] == ["y-4:0", "y-4:1"]
    # And a receiver takes the higher level first
    receiver = make_queue()
    assert {r.priority for r in await take(receiver, endpoint, 4)} == {4}
    assert [r.params for r in await take(receiver, endpoint, 3)] == [0, 1, 2]


def test_priority_and_producer_are_validated_before_anything_is_sent() -> None:
    for priority in (MIN_PRIORITY, 0, MAX_PRIORITY):
        assert Request(endpoint="poll://v", method="m", priority=priority).priority == priority
    for priority in (MIN_PRIORITY - 1, MAX_PRIORITY + 1, 10**30):
        with pytest.raises(InvalidRequest, match="priority"):
            Request(endpoint="poll://v", method="m", priority=priority)
    Request(endpoint="poll://v", method="m", producer="p" * MAX_PRODUCER_LENGTH)
    with pytest.raises(InvalidRequest, match="producer"):
        Request(endpoint="poll://v", method="m", producer="p" * (MAX_PRODUCER_LENGTH + 1))


async def test_a_level_that_never_empties_keeps_no_trace_of_producers_it_served(
    make_queue: QueueFactory, bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given a level that always holds a steady producer's backlog
    receiver = make_queue()
    endpoint = "poll://many-producers"
    keys = bulk.keys.endpoint(endpoint)
    assert bulk.enqueue_many(batch(endpoint, "steady", 1000)).accepted == 1000

    # When 400 short-lived producers (as nodes restarted with their default producer) each
    # queue one request, and the receiver keeps up with them
    for n in range(400):
        assert bulk.enqueue_many(batch(endpoint, f"node-{n}", 1)).accepted == 1
        await take(receiver, endpoint, 2)

    # Then the level's clock holds its fixed fields only, whatever the producers it served
    fields: list[bytes] = redis_client.hkeys(keys.level(0))  # type: ignore[assignment]
    assert set(fields) <= {b"g", b"n", b"r", b"t", b"x"}, fields
    # ... its lanes are the producers with something queued, and the others left no key
    lanes: list[bytes] = redis_client.zrange(keys.level_lanes(0), 0, -1)  # type: ignore[assignment]
    assert lanes == [b"psteady"]
    assert not redis_client.exists(*(keys.producer_lane(0, f"node-{n}") for n in range(400)))
    assert queue_depth(redis_client, keys) == 600


def test_a_busy_level_renews_its_ttls_once_an_eighth_has_passed_and_a_new_lane_gets_one(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given a level just given its TTL by a push (list TTL 4 s: renewed at most every 0.5 s;
    # its requests' records live 2 s, so the queue's TTL is what the level's keys get)
    shorter = {"pickup_timeout_s": 1.0, "request_ttl_extra_s": 1.0, "list_ttl_s": 4.0}
    settings = QueueSettings(**{**FAST_SETTINGS, **shorter})
    endpoint = "poll://ttl-renewal"
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as client:
        keys = client.keys.endpoint(endpoint)
        level_keys = [keys.levels, keys.level(0), keys.level_lanes(0)]
        assert client.enqueue_many(batch(endpoint, "first", 10)).accepted == 10
        assert all(3_000 < redis_client.pttl(key) <= 4_000 for key in level_keys)

        # When another producer queues at once: its lane is new, and gets the TTL
        assert client.enqueue_many(batch(endpoint, "second", 10)).accepted == 10
        assert 3_000 < redis_client.pttl(keys.producer_lane(0, "second")) <= 4_000
        assert all(redis_client.pttl(key) > 0 for key in level_keys)

        # ...and a push after an eighth of the TTL renews every key of the level
        wait_until(
            lambda: redis_client.pttl(keys.level(0)) < 3_300, 5.0, 0.05, "0.7 s of the TTL gone"
        )
        assert client.enqueue_many(batch(endpoint, "first", 10, tag="later")).accepted == 10
        renewed = [*level_keys, keys.producer_lane(0, "first")]
        assert all(redis_client.pttl(key) > 3_500 for key in renewed), [
            redis_client.pttl(key) for key in renewed
        ]


async def test_an_id_removed_from_the_middle_of_a_long_list_is_skipped_and_depth_stays_exact(
    make_queue: QueueFactory, bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given one producer's 1,000 queued requests, and a second producer's 10
    endpoint = "poll://removed-middle"
    keys = bulk.keys.endpoint(endpoint)
    assert bulk.enqueue_many(batch(endpoint, "long", 1000)).accepted == 1000
    assert bulk.enqueue_many(batch(endpoint, "short", 10)).accepted == 10
    canceller = make_queue()

    # When three from the middle of the long list and one of the short are cancelled
    gone = ["long-0:10", "long-0:500", "long-0:501", "short-0:3"]
    for request_id in gone:
        assert await canceller.cancel(request_id) is True

    # Then the depth is exact at once, though the ids still sit in their lists
    assert queue_depth(redis_client, keys) == 1006
    assert redis_client.llen(keys.producer_lane(0, "long")) == 1000
    # ... and max_pending sees that depth: room for exactly one more
    await canceller.set_limits(endpoint, max_pending=1007)
    with pytest.raises(BatchRefused) as refused:
        bulk.enqueue_many(batch(endpoint, "late", 2))
    assert refused.value.partial.accepted == 1 and refused.value.refused == {endpoint: 1}
    assert queue_depth(redis_client, keys) == 1007

    # When everything is taken
    taken: list[str] = []
    for _ in range(200):
        got = silent_take(redis_client, bulk.keys.prefix, endpoint)
        if not got:
            break
        taken += [item.request_id for item in got]

    # Then every live request was handed out once, in each producer's order, and no removed one
    assert len(taken) == len(set(taken)) == 1007
    assert not set(gone) & set(taken)
    assert [i for i in taken if i.startswith("long")] == [
        f"long-0:{i}" for i in range(1000) if f"long-0:{i}" not in gone
    ]
    # ... and the level left nothing behind
    assert queue_depth(redis_client, keys) == 0
    assert not redis_client.exists(keys.levels)
    assert not redis_client.keys(f"{keys.level_prefix}*")


async def test_ten_thousand_producers_at_one_level_take_turns(
    bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given 10,000 producers with two requests each at one level, and a latecomer with one
    endpoint = "poll://crowd"
    keys = bulk.keys.endpoint(endpoint)
    crowd = [r for n in range(10_000) for r in batch(endpoint, f"c{n}", 2)]
    assert bulk.enqueue_many(crowd).accepted == 20_000
    assert queue_depth(redis_client, keys) == 20_000

    # When 5,000 are taken, then a latecomer queues one request, and the rest are taken
    def take_ids(n: int) -> list[str]:
        ids: list[str] = []
        while len(ids) < n:
            got = silent_take(redis_client, bulk.keys.prefix, endpoint)
            assert got, f"nothing to take after {len(ids)}"
            ids += [item.request_id for item in got]
        return ids

    first = take_ids(5_000)
    assert bulk.enqueue_many(batch(endpoint, "late", 1)).accepted == 1
    rest = take_ids(15_001)
    taken = first + rest

    # Then each round holds every producer once (equal turns in the lanes set's order)
    producers = [i.split("-")[0] for i in taken if not i.startswith("late")]
    everyone = {f"c{n}" for n in range(10_000)}
    assert len(set(producers[:10_000])) == 10_000 and set(producers[:10_000]) == everyone
    assert producers[10_000:] == producers[:10_000]
    assert all(i.endswith(":0") for i in taken[:5_000])
    # ... and the latecomer waited behind the rest of the round and at most one more request
    # per producer with work (its virtual time equals their next ones': ties go by name)
    assert taken.index("late-0:0") <= 5_000 + 5_000 + 10_000
    assert queue_depth(redis_client, keys) == 0


async def test_a_request_given_back_goes_to_the_front_of_its_level(
    make_queue: QueueFactory, bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given two producers' at_least_once requests at one level
    endpoint = "poll://front-lane"
    keys = bulk.keys.endpoint(endpoint)
    requests = [
        r.model_copy(update={"delivery": "at_least_once"})
        for r in batch(endpoint, "a", 3) + batch(endpoint, "b", 3)
    ]
    assert bulk.enqueue_many(requests).accepted == 6

    # When a receiver takes two (one of each producer) and shuts down holding them
    holder = make_queue()
    held = [r.id for r in await take(holder, endpoint, 2)]
    assert sorted(held) == ["a-0:0", "b-0:0"]
    await holder.aclose()

    # Then they are queued again ahead of everything else of their level, in the order given
    # back, and taken first
    order = level_ids(redis_client, keys, 0)
    assert sorted(order[:2]) == ["a-0:0", "b-0:0"]
    assert order[2:] == ["a-0:1", "b-0:1", "a-0:2", "b-0:2"]
    assert redis_client.llen(keys.front_lane(0)) == 2
    receiver = make_queue()
    assert [r.id for r in await take(receiver, endpoint, 6)] == order
    assert not redis_client.keys(f"{keys.level_prefix}*")


async def test_a_batch_take_hands_out_exactly_what_takes_of_one_would_in_the_same_order(
    make_queue: QueueFactory, bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given the same story on two endpoints, one drained one id per take and the other by takes
    # of random sizes (a take pops a run of one lane at once where the order allows it): a
    # producer alone, others joining, ids cancelled in the middle of a lane, a second priority
    # level arriving and leaving, and a lone producer again at the end
    rng = random.Random(19)
    canceller = make_queue()
    sides = {"one": "poll://order-one", "many": "poll://order-many"}
    taken: dict[str, list[str]] = {side: [] for side in sides}

    def fill(producer: str, n: int, priority: int = 0) -> None:
        for side, endpoint in sides.items():
            requests = batch(endpoint, producer, n, priority, tag=f"{side}.{producer}")
            assert bulk.enqueue_many(requests).accepted == n

    async def cancel(producer: str, priority: int, i: int) -> None:
        for side in sides:
            assert await canceller.cancel(f"{side}.{producer}-{priority}:{i}") is True

    def take(n: int) -> None:
        for side, endpoint in sides.items():
            got: list[str] = []
            while len(got) < n:
                want = 1 if side == "one" else rng.randint(1, min(40, n - len(got)))
                items = silent_take(redis_client, bulk.keys.prefix, endpoint, want)
                assert items, f"{side}: nothing to take after {len(got)} of {n}"
                assert len(items) <= want
                got += [item.request_id.removeprefix(f"{side}.") for item in items]
            taken[side] += got

    fill("a", 120)
    take(30)
    fill("b", 15)
    fill("c", 40)
    take(20)
    await cancel("a", 0, 60)
    await cancel("a", 0, 61)
    await cancel("c", 0, 30)
    take(25)
    fill("hi", 12, priority=3)
    take(30)
    fill("d", 50)
    remaining = {side: queue_depth(redis_client, bulk.keys.endpoint(sides[side])) for side in sides}
    assert remaining["one"] == remaining["many"] > 0
    take(remaining["one"])

    # Then both hand out the same ids in the same order, every live id once
    assert taken["one"] == taken["many"]
    assert len(set(taken["one"])) == len(taken["one"]) == 120 + 15 + 40 + 12 + 50 - 3
    for endpoint in sides.values():
        assert queue_depth(redis_client, bulk.keys.endpoint(endpoint)) == 0
        assert silent_take(redis_client, bulk.keys.prefix, endpoint, 5) == []


class ShareModel:
    """Which level each take serves, by the rule the README gives ("Priorities and fairness"):
    the highest level with work, but while a lower one holds work every SHARE-th take goes to
    the next lower level below the one the last lower turn went to (after the lowest: the
    highest lower level again). Only takes made while two or more levels hold work count; the
    count starts over when the levels below the highest run empty (or nothing is queued)."""

    def __init__(self) -> None:
        self.depth: Counter[int] = Counter()
        self.count = 0
        self.last: int | None = None
        #: What a story did: the lower turns, and how often each level ran empty.
        self.turns = 0
        self.emptied: Counter[int] = Counter()

    def levels(self) -> list[int]:
        return sorted((p for p, n in self.depth.items() if n > 0), reverse=True)

    def push(self, priority: int, n: int = 1) -> None:
        self.depth[priority] += n

    def take(self) -> int | None:
        levels = self.levels()
        if not levels:
            return None
        chosen = levels[0]
        if len(levels) > 1:
            self.count += 1
            if self.count >= SHARE:
                start = chosen if self.last is None else min(self.last, chosen)
                chosen = next((p for p in levels if p < start), levels[1])
                self.count, self.last = 0, chosen
                self.turns += 1
        self.remove(chosen)
        return chosen

    def remove(self, priority: int) -> None:
        self.depth[priority] -= 1
        if self.depth[priority] == 0:
            self.emptied[priority] += 1
            left = self.levels()
            if not left or (len(left) == 1 and left[0] > priority):
                self.count, self.last = 0, None


@pytest.mark.parametrize("seed", [5, 23, 61])
async def test_every_take_serves_the_level_the_share_rule_names_as_levels_empty_and_refill(
    seed: int, make_queue: QueueFactory, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given an endpoint that a seeded random story drives: short bursts at four priorities (the
    # highest one most often, so it runs empty and fills again), takes of 1 to 3, cancels of
    # queued requests, and requests a receiver gives back (to the front lane of their level)
    rng = random.Random(seed)
    settings = QueueSettings(**{**FAST_SETTINGS, "pickup_timeout_s": 120, "max_attempts": 100})
    endpoint = f"poll://share-model-{seed}"
    canceller = make_queue()
    model = ShareModel()
    redelivery = Redelivery.of(settings)
    queued: dict[str, int] = {}  # id -> priority
    held: dict[str, tuple[int, str]] = {}  # id -> (priority, the token that took it)
    client = redis_client
    for script in (TAKE, HAND_BACK):
        client.script_load(script.source)
    sent = 0

    def take_call_of(token: str, want: int) -> list[str]:
        call = take_call(
            keys, token, "model-node", 2000, want, 100, 600_000, 60_000, 0, 600_000, 600_000,
            redelivery,
        )  # fmt: skip
        reply = client.execute_command(*call.args)  # type: ignore[no-untyped-call]
        return [item.request_id for item in parse_take(reply).items]

    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as bulk:
        keys = bulk.keys.endpoint(endpoint)
        for step in range(400):
            roll = rng.random()
            # When the next step of the story runs
            if roll < 0.4:
                priority = rng.choices([9, 4, 0, -3], weights=[5, 2, 2, 1])[0]
                n = 1 if priority == 9 else rng.randint(1, 3)
                producer = rng.choice("ab")
                requests = [
                    Request(endpoint=endpoint, method="m", id=f"r{sent + i}", priority=priority,
                            producer=producer, delivery="at_least_once")
                    for i in range(n)
                ]  # fmt: skip
                sent += n
                assert bulk.enqueue_many(requests).accepted == n
                queued.update((r.id, priority) for r in requests)
                model.push(priority, n)
            elif roll < 0.85:
                want = rng.randint(1, 3)
                order = {p: level_ids(redis_client, keys, p) for p in model.levels()}
                expected: list[str] = []
                for _ in range(want):
                    level = model.take()
                    if level is None:
                        break
                    expected.append(order[level].pop(0))
                token = uuid.uuid4().hex
                # Then the take hands out, id by id, the head of the level the rule names
                assert take_call_of(token, want) == expected, step
                for request_id in expected:
                    held[request_id] = (queued.pop(request_id), token)
            elif roll < 0.93 and queued:
                request_id = rng.choice(sorted(queued))
                assert await canceller.cancel(request_id) is True
                model.remove(queued.pop(request_id))
            elif held:
                request_id = rng.choice(sorted(held))
                priority, token = held.pop(request_id)
                call = hand_back_call(keys, request_id, token, redelivery)
                assert client.execute_command(*call.args) == b"queued"  # type: ignore[no-untyped-call]
                queued[request_id] = priority
                model.push(priority)
            # ... the levels listed are those with work, and the share count is the model's
            listed: list[bytes] = redis_client.zrange(keys.levels, 0, -1, desc=True)  # type: ignore[assignment]
            assert [int(p) for p in listed] == model.levels(), step
            share: dict[bytes, bytes] = redis_client.hgetall(keys.share)  # type: ignore[assignment]
            if share:
                assert redis_client.pttl(keys.share) > 0
                last = int(share[b"c"]) if b"c" in share else None
                assert (int(share[b"s"]), last) == (model.count, model.last), step
            else:
                assert (model.count, model.last) == (0, None), step
    # And the story did what it is for: the highest level ran empty and filled again many
    # times, and lower turns came while it did
    assert model.emptied[9] >= 20 and model.turns >= 5, (model.emptied, model.turns)
