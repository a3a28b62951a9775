"""The queued form (prq.core.records, scripts/_body.lua): a request BulkClient queues is one string
until something changes it. Every way of reading or changing a request works on it, from any
node; what changes it first turns it into the hash form, keeping its TTL; damaged bytes in it
are dead-lettered, not lost; and a reused id meets either form without an error. Each test runs
on both shapes of the form: Q1 (deadline and sequence number inline, small batches) and Q2
(whole strings built by the enqueuer, the batch's deadline and numbers in a shared head)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from prq import QueueSettings, Request, RequestState, Response
from prq.bulk import BulkClient
from prq.core.records import queued_fields
from prq.protocol.scripts import enqueue as enqueue_steps
from tests.queue_facades import FAST_SETTINGS, QueueFactory
from tests.queued import queue_depth
from tests.redis_servers import async_wait_until
from tests.stored_bodies import read_body, record_fields

pytestmark = pytest.mark.integration

ENDPOINT = "poll://queued-form"


@pytest.fixture(autouse=True, params=["Q1", "Q2"])
def shape(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every batch goes in this shape of the queued form, whatever its size."""
    monkeypatch.setattr(enqueue_steps, "SHARED_HEAD_MIN", 10**9 if request.param == "Q1" else 1)
    return str(request.param)


def bulk_client(redis_url: str, key_prefix: str, **settings: object) -> BulkClient:
    merged = QueueSettings(**{**FAST_SETTINGS, "pickup_timeout_s": 60, **settings})
    return BulkClient.from_url(redis_url, prefix=key_prefix, settings=merged)


def head_token(client: redis.Redis, key: str) -> bytes | None:
    """The token of the shared head of the queued-form record at `key` (None: Q1, no head)."""
    raw = client.get(key)
    assert isinstance(raw, bytes)
    fields = queued_fields(raw)
    assert fields is not None
    return fields.get("bh")


def queue_three(redis_url: str, key_prefix: str, prefix: str) -> None:
    """Queue requests <prefix>0..2 (params 0..2) through BulkClient."""
    requests = [
        Request(endpoint=ENDPOINT, method="m", params=i, id=f"{prefix}{i}") for i in range(3)
    ]
    with bulk_client(redis_url, key_prefix) as bulk:
        assert bulk.enqueue_many(requests).accepted == 3


def test_a_bulk_request_waits_as_one_string_holding_what_its_record_says(
    redis_url: str, redis_client: redis.Redis, key_prefix: str, shape: str
) -> None:
    # Given requests queued by BulkClient: at the default priority and at_most_once, and at
    # another priority, at_least_once, from a named producer
    plain = Request(endpoint=ENDPOINT, method="m", params={"n": 1}, id="plain")
    rich = Request(
        endpoint=ENDPOINT, method="m", params={"n": 2}, id="rich", priority=-3,
        delivery="at_least_once", producer="etl|7",
    )  # fmt: skip
    seconds, micros = redis_client.time()
    started_us = seconds * 1_000_000 + micros
    with bulk_client(redis_url, key_prefix, max_attempts=4) as bulk:
        assert bulk.enqueue_many([plain]).accepted == 1
        assert bulk.enqueue_many([rich]).accepted == 1
        keys = bulk.keys.endpoint(ENDPOINT)

    # Then each is one string key with a TTL, in the shape asked for, whose fields say what the
    # hash would (Q2: with its batch's shared head)
    numbers = []
    for request in (plain, rich):
        key = keys.request(request.id)
        assert redis_client.type(key) == b"string"
        assert redis_client.pttl(key) > 0
        raw = redis_client.get(key)
        assert isinstance(raw, bytes) and raw.startswith(shape.encode())
        fields = record_fields(redis_client, key)
        assert fields[b"st"] == b"queued"
        numbers.append(int(fields[b"sq"]))
        assert int(fields[b"pd"]) > int(fields[b"ct"]) > 0
    assert numbers[1] > numbers[0] >= started_us  # (at least the server's clock, in µs)
    rich_fields = queued_fields(redis_client.get(keys.request("rich")))  # type: ignore[arg-type]
    assert rich_fields is not None
    assert (rich_fields["pri"], rich_fields["ma"], rich_fields["pro"]) == (b"-3", b"4", b"etl|7")
    plain_fields = queued_fields(redis_client.get(keys.request("plain")))  # type: ignore[arg-type]
    assert plain_fields is not None and not {"pri", "ma", "pro", "ow"} & set(plain_fields)


async def test_any_node_reads_cancels_and_withdraws_a_request_in_the_queued_form(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given three bulk requests waiting as strings, and a node that did not send them
    queue_three(redis_url, key_prefix, "q")
    node = make_queue()
    keys = node.keys.endpoint(ENDPOINT)
    before = redis_client.pttl(keys.request("q0"))

    # Then it reads their state by id alone
    for request_id in ("q0", "q1", "q2"):
        status = await node.status(request_id)
        assert (status.state, status.endpoint) == (RequestState.QUEUED, ENDPOINT)
        assert status.created_ms is not None

    # When it cancels one (withdrawn: it was not picked up), and a sender sends another id again
    # (a duplicate: the sender watches it)
    assert await node.cancel("q1")
    assert redis_client.type(keys.request("q1")) == b"hash"
    assert (await node.status("q1")).state == RequestState.WITHDRAWN  # (never picked up)
    again = asyncio.create_task(
        node.queue_and_wait(Request(endpoint=ENDPOINT, method="m", params=0, id="q0"))
    )

    # Then the duplicate turned the first into a hash with the TTL it had, and nothing else
    await async_wait_until(lambda: redis_client.type(keys.request("q0")) == b"hash", 10, 0.01)
    assert before - 10_000 < redis_client.pttl(keys.request("q0")) <= before
    assert redis_client.type(keys.request("q2")) == b"string"
    assert queue_depth(redis_client, keys) == 2

    # And a receiver answers both live ones; the duplicate's caller gets the answer
    receiver = make_queue()
    for _ in range(2):
        pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
        assert pending is not None and pending.id in {"q0", "q2"}
        await receiver.apply_response(Response(id=pending.id, result=pending.request.params))
    answer = await asyncio.wait_for(again, 10)
    assert answer.result == 0
    assert (await node.status("q2")).state == RequestState.DONE


async def test_a_damaged_queued_record_is_dead_lettered_not_lost(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given bulk requests whose stored strings were damaged: a bad body in a good record, and
    # bytes that are not a record at all
    queue_three(redis_url, key_prefix, "d")
    node = make_queue()
    keys = node.keys.endpoint(ENDPOINT)
    good_head = redis_client.get(keys.request("d0"))
    assert isinstance(good_head, bytes)
    head = good_head[: len(good_head) - len(read_body(redis_client, keys.request("d0")) or b"")]
    redis_client.set(keys.request("d0"), head + b"\xff{not json", keepttl=True)
    redis_client.set(keys.request("d1"), b"\x00garbage", keepttl=True)

    # Then status still reads them as queued
    assert (await node.status("d1")).state == RequestState.QUEUED

    # When a receiver serves the endpoint
    served: list[object] = []
    make_queue.serve(make_queue(), ENDPOINT, lambda r: served.append(r.params), concurrency=1)

    # Then the good one runs, and each damaged one is a dead letter holding its exact bytes
    async def both_dead() -> bool:
        return {d.id for d in await node.dead_letters(ENDPOINT)} == {"d0", "d1"}

    await async_wait_until(both_dead, 20, 0.05, "d0 and d1 are dead letters")
    letters = {d.id: d for d in await node.dead_letters(ENDPOINT)}
    assert letters["d0"].body_bytes == len(b"\xff{not json")
    assert letters["d1"].body_bytes == len(b"\x00garbage")
    assert all(d.reason.startswith("undecodable:") for d in letters.values())
    await async_wait_until(lambda: served == [2], 10, 0.01)


async def test_a_reused_id_meets_either_form_without_an_error(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an at_least_once id a receiver took (its record a hash, its id in the lease set)
    # and whose record then expired, queued again by BulkClient (a string now) while the lease
    # set still names it, long silent
    receiver = make_queue()
    keys = receiver.keys.endpoint(ENDPOINT)
    with bulk_client(redis_url, key_prefix) as bulk:
        first = Request(endpoint=ENDPOINT, method="m", id="r1", delivery="at_least_once")
        assert bulk.enqueue_many([first]).accepted == 1
        pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
        assert pending is not None and pending.id == "r1"
        assert redis_client.type(keys.request("r1")) == b"hash"
        assert redis_client.zscore(keys.lease, "r1") is not None
        redis_client.delete(keys.request("r1"))  # (as its TTL would)
        again = Request(endpoint=ENDPOINT, method="m", params="again", id="r1")
        assert bulk.enqueue_many([again]).accepted == 1
    assert redis_client.type(keys.request("r1")) == b"string"
    redis_client.zadd(keys.lease, {"r1": 0})  # (silent since long ago)

    # When another receiver takes (a take first looks at the silent leases)
    other = make_queue()
    taken = await other.dequeue(ENDPOINT, timeout_s=10)

    # Then the new request is handed out, neither lost nor taken for the old one's lease
    assert taken is not None and (taken.id, taken.request.params) == ("r1", "again")
    assert redis_client.zscore(keys.lease, "r1") is None
    await other.apply_response(Response(id="r1", result="fresh"))
    assert (await other.status("r1")).state == RequestState.DONE


def ignore(*_: object) -> None:
    """An outcome callback that keeps nothing."""


async def test_one_take_hands_out_a_lane_whose_records_change_form_along_it(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given one producer's lane holding, in this order, two requests in the queued form
    # (BulkClient), one in the hash form (send), three times over; and a record of each form
    # gone meanwhile (as their TTL would take them)
    sender = make_queue()
    keys = sender.keys.endpoint(ENDPOINT)
    order: list[str] = []
    with bulk_client(redis_url, key_prefix) as bulk:
        for turn in range(3):
            batch = [
                Request(endpoint=ENDPOINT, method="m", params=f"b{turn}{i}", producer="p")
                for i in range(2)
            ]
            assert bulk.enqueue_many(batch).accepted == 2
            sent = Request(endpoint=ENDPOINT, method="m", params=f"s{turn}", producer="p")
            await sender.send(sent, on_response=ignore, on_failure=ignore)
            order += [batch[0].id, batch[1].id, sent.id]
    forms = [redis_client.type(keys.request(request_id)) for request_id in order]
    assert forms == [b"string", b"string", b"hash"] * 3
    gone = {order[4], order[5]}  # a string after a string, a hash after a string
    redis_client.delete(*(keys.request(request_id) for request_id in gone))

    # When a receiver takes them all in one take
    receiver = make_queue()
    taken = await receiver.dequeue_many(ENDPOINT, len(order), timeout_s=10)

    # Then it gets each live request whole, in the lane's order, whichever form it was in
    live = [request_id for request_id in order if request_id not in gone]
    assert [pending.id for pending in taken] == live
    params = [pending.request.params for pending in taken]
    assert params == ["b00", "b01", "s0", "b10", "b20", "b21", "s2"]
    for pending in taken:
        assert redis_client.type(keys.request(pending.id)) == b"hash"
        await receiver.apply_response(Response(id=pending.id, result=None))


def test_a_bulk_enqueue_replaces_a_record_without_a_state(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an id whose record is a damaged hash (no state), and one that was withdrawn
    with bulk_client(redis_url, key_prefix) as bulk:
        keys = bulk.keys.endpoint(ENDPOINT)
        redis_client.hset(keys.request("stateless"), mapping={"b": b"junk"})
        redis_client.hset(keys.request("withdrawn"), mapping={"st": b"withdrawn"})

        # When BulkClient queues both ids
        result = bulk.enqueue_many(
            [Request(endpoint=ENDPOINT, method="m", id=i) for i in ("stateless", "withdrawn")]
        )

    # Then both are queued afresh (not refused, not taken for known ids), in the queued form
    assert (result.accepted, result.duplicates, result.rejected) == (2, 0, [])
    for request_id in ("stateless", "withdrawn"):
        assert redis_client.type(keys.request(request_id)) == b"string"
    assert queue_depth(redis_client, keys) == 2


def test_a_batch_sent_whole_shares_one_head_that_outlives_its_requests(
    redis_url: str, redis_client: redis.Redis, key_prefix: str, shape: str
) -> None:
    # Given an endpoint with room for 5, and a batch of 8 (Q2: sent whole)
    requests = [Request(endpoint=ENDPOINT, method="m", params=i, id=f"h{i}") for i in range(8)]
    with bulk_client(redis_url, key_prefix) as bulk:
        keys = bulk.keys.endpoint(ENDPOINT)
        redis_client.hset(keys.limits, "mp", 5)  # (max_pending 5, as a node sets it)
        # When it is sent, refused in part, and its call is run again as it was (same nonce:
        # a reply that was lost) once there is room
        call = enqueue_steps.enqueue_many_call(
            keys, "nonce-h", [(r.id, b'{"m":"m"}') for r in requests], 1_000, 60_000,
            600_000, 600_000,
        )  # fmt: skip
        first = enqueue_steps.parse_enqueue_many(bulk._io.execute([call])[0], 8)
        redis_client.hdel(keys.limits, "mp")
        again = enqueue_steps.parse_enqueue_many(bulk._io.execute([call])[0], 8)

    # Then the first run queued 5 and refused 3; the rerun queued those 3 and counted the 5
    assert (first.accepted, first.refused_ids) == (5, ["h5", "h6", "h7"])
    assert (again.accepted, again.refused_ids, again.duplicate_ids) == (8, [], [])
    # And each request has its own sequence number, in batch order; in the Q2 shape its place in
    # the batch, taken once (the rerun took none), in Q1 new ones for what the rerun wrote
    numbers = [int(record_fields(redis_client, keys.request(r.id))[b"sq"]) for r in requests]
    assert numbers == sorted(set(numbers))
    if shape == "Q2":
        assert numbers == list(range(numbers[0], numbers[0] + 8))
    assert int(redis_client.get(keys.numbers) or 0) == numbers[-1]
    assert int(redis_client.get(keys.sequence) or 0) == 8 == again.counter
    # And in the Q2 shape the batch's head (the only key beside the records, the same for both
    # runs) outlives them
    heads = list(redis_client.scan_iter(keys.batch_head("*")))
    tokens = {head_token(redis_client, keys.request(r.id)) for r in requests}
    if shape == "Q2":
        assert heads == [keys.batch_head(t.decode()).encode() for t in tokens if t]
        records = [redis_client.pexpiretime(keys.request(r.id)) for r in requests]
        assert redis_client.pexpiretime(heads[0]) >= max(records) > 0
    else:
        assert heads == [] and tokens == {None}


async def test_a_request_whose_shared_head_is_gone_is_still_handed_out(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, key_prefix: str,
    shape: str,
) -> None:  # fmt: skip
    # Given bulk requests whose batch's shared head was lost (evicted, say)
    queue_three(redis_url, key_prefix, "g")
    node = make_queue()
    keys = node.keys.endpoint(ENDPOINT)
    token = head_token(redis_client, keys.request("g0"))
    assert (token is not None) == (shape == "Q2")
    if token is not None:
        assert redis_client.delete(keys.batch_head(token.decode())) == 1

    # When a receiver takes them
    taken = [await node.dequeue(ENDPOINT, timeout_s=10) for _ in range(3)]

    # Then each is handed out, in order, without a deadline to judge nor (Q2) a sequence number
    assert [t.id if t else None for t in taken] == ["g0", "g1", "g2"]
    hashed = record_fields(redis_client, keys.request("g0"))
    assert (b"sq" in hashed) == (shape == "Q1")
