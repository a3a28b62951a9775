"""Every Lua step is safe to replay: a client retry after a lost reply changes no outcome.

Each script call is built exactly as the queue builds it, sent once, then sent again with the
same arguments (what the retry policy does when a reply is lost), and the second run must
neither change the stored state nor hand out or enqueue anything again.
"""

from __future__ import annotations

import time
import uuid
from typing import TypeVar

import pytest
import redis

from prq import QueueFull, QueueSettings, Request
from prq.core.keys import KeySchema
from prq.protocol.dead import dead_letter_call, replay_dead_letter_flow
from prq.protocol.effects import Call, Exec, Flow, Reply
from prq.protocol.flows.context import Context
from prq.protocol.scripts.answer import apply_response_call, parse_apply_response
from prq.protocol.scripts.enqueue import (
    SHARED_HEAD_MIN,
    enqueue_call,
    enqueue_many_call,
    parse_enqueue,
    parse_enqueue_many,
)
from prq.protocol.scripts.liveness import presence_call
from prq.protocol.scripts.loading import ALL_SCRIPTS
from prq.protocol.scripts.merging import merge_answers, merge_enqueues
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.request_state import parse_withdraw, withdraw_call
from prq.protocol.scripts.take import TakeReply, parse_take, take_call
from tests.queued import level_ids, queue_depth, queued_ids
from tests.redis_servers import url_client

pytestmark = pytest.mark.integration
T = TypeVar("T")

ENDPOINT = "poll://replay"
TTL_MS = 60_000


@pytest.fixture
def client(redis_admin_url: str) -> redis.Redis:
    client = url_client(redis_admin_url)
    for script in ALL_SCRIPTS:
        client.script_load(script.source)
    return client


def send(client: redis.Redis, call: Call) -> Reply:
    reply: Reply = client.execute_command(*call.args)  # type: ignore[no-untyped-call]
    return reply


def drive(client: redis.Redis, flow: Flow[T]) -> T:
    """Run a protocol flow's round trips on a plain client (each Exec's calls in turn)."""
    replies: object = None
    while True:
        try:
            effect = flow.send(replies)
        except StopIteration as done:
            result: T = done.value
            return result
        assert isinstance(effect, Exec), effect
        replies = [send(client, call) for call in effect.calls]


def state(client: redis.Redis, keys: KeySchema, request_id: str) -> dict[bytes, bytes]:
    return client.hgetall(keys.endpoint(ENDPOINT).request(request_id))  # type: ignore[return-value]


def enqueue(keys: KeySchema, request: Request, now_ms: int) -> Call:
    """The call a node sends for `request` (its priority and producer too)."""
    return enqueue_call(
        keys.endpoint(ENDPOINT), request.id, request.model_dump_json().encode(), "sender-node",
        now_ms, TTL_MS, TTL_MS, TTL_MS, TTL_MS, TTL_MS, 2000, TTL_MS,
        priority=request.priority, producer=request.producer or "sender-node",
    )  # fmt: skip


def take(keys: KeySchema, token: str, now_ms: int) -> Call:
    return take_call(
        keys.endpoint(ENDPOINT),
        token,
        "receiver-node",
        2000,
        10,
        100,
        TTL_MS,
        TTL_MS,
        0,
        TTL_MS,
        TTL_MS,
        Redelivery.of(QueueSettings()),
    )


def server_clock_us(client: redis.Redis) -> int:
    """The server's clock, µs (sequence numbers are at least it: scripts/_sequence.lua)."""
    seconds, micros = client.time()
    return seconds * 1_000_000 + micros


def test_enqueue_replay_enqueues_nothing_twice(client: redis.Redis, key_prefix: str) -> None:
    # Given a request enqueued once
    keys = KeySchema(key_prefix)
    request = Request(endpoint=ENDPOINT, method="m")
    now_ms = int(time.time() * 1000)
    clock = server_clock_us(client)
    first = parse_enqueue(send(client, enqueue(keys, request, now_ms)))
    assert first.counter is not None and first.counter >= clock and first.before == 0
    # When the same call is replayed
    again = parse_enqueue(send(client, enqueue(keys, request, now_ms)))
    # Then it is reported as known, and the list holds the id once
    assert again.known is not None and again.known.state == "queued"
    assert queued_ids(client, keys.endpoint(ENDPOINT)) == [request.id.encode()]
    assert client.get(keys.endpoint(ENDPOINT).sequence) == b"1"  # (one enqueued)
    assert client.get(keys.endpoint(ENDPOINT).numbers) == str(first.counter).encode()


def test_take_replay_returns_the_same_requests_and_takes_no_more(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given two queued requests and a take of one of them
    keys = KeySchema(key_prefix)
    now_ms = int(time.time() * 1000)
    requests = [Request(endpoint=ENDPOINT, method="m") for _ in range(2)]
    for request in requests:
        send(client, enqueue(keys, request, now_ms))
    token = uuid.uuid4().hex
    call = take_call(
        keys.endpoint(ENDPOINT),
        token,
        "receiver-node",
        2000,
        1,
        100,
        TTL_MS,
        TTL_MS,
        0,
        TTL_MS,
        TTL_MS,
        Redelivery.of(QueueSettings()),
    )
    first = parse_take(send(client, call)).items
    # When the take is replayed
    again = parse_take(send(client, call)).items
    # Then it hands out the same request, and the second one is still queued
    assert [i.request_id for i in again] == [i.request_id for i in first] == [requests[0].id]
    assert state(client, keys, requests[1].id)[b"st"] == b"queued"
    assert state(client, keys, requests[0].id)[b"att"] == b"1"


def test_a_replayed_take_moves_the_share_of_lower_priorities_once(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given 10 requests at priority 5 and two at 0, and 9 takes of one (the share count at 9)
    keys = KeySchema(key_prefix)
    endpoint = keys.endpoint(ENDPOINT)
    now_ms = int(time.time() * 1000)
    high = [Request(endpoint=ENDPOINT, method="m", priority=5) for _ in range(10)]
    low = [Request(endpoint=ENDPOINT, method="m", priority=0) for _ in range(2)]
    for request in [*high, *low]:
        send(client, enqueue(keys, request, now_ms))

    def take_one(token: str) -> list[str]:
        call = take_call(
            endpoint, token, "receiver-node", 2000, 1, 100, TTL_MS, TTL_MS, 0, TTL_MS, TTL_MS,
            Redelivery.of(QueueSettings()),
        )  # fmt: skip
        return [item.request_id for item in parse_take(send(client, call)).items]

    for i in range(9):
        assert take_one(uuid.uuid4().hex) == [high[i].id]
    assert client.hget(endpoint.share, "s") == b"9"

    # When the 10th take (it goes down) is sent, then sent again as after a lost reply
    token = uuid.uuid4().hex
    first = take_one(token)
    after_once = client.hgetall(endpoint.share), queued_ids(client, endpoint)
    again = take_one(token)

    # Then both hand out the first low request, and the count (started over, its turn at
    # level 0) and the queue are as after one take
    assert again == first == [low[0].id]
    assert (client.hgetall(endpoint.share), queued_ids(client, endpoint)) == after_once
    assert after_once[0] == {b"s": b"0", b"c": b"0"}
    assert after_once[1] == [high[9].id.encode(), low[1].id.encode()]


def test_apply_response_replay_is_reported_and_changes_nothing(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given a taken request answered once by its owner
    keys = KeySchema(key_prefix)
    now_ms = int(time.time() * 1000)
    request = Request(endpoint=ENDPOINT, method="m")
    send(client, enqueue(keys, request, now_ms))
    token = uuid.uuid4().hex
    send(client, take(keys, token, now_ms))

    def answer(body: bytes, owner: str) -> str:
        call = apply_response_call(
            keys.endpoint(ENDPOINT), request.id, owner, body, TTL_MS, now_ms, 16384
        )
        return parse_apply_response(send(client, call))

    first_body = b'{"id": "%s", "result": 1}' % request.id.encode()
    assert answer(first_body, token) == "ok"
    # When the call is replayed, or another receiver answers
    assert answer(first_body, token) == "replay"
    assert answer(b'{"id": "%s", "result": 2}' % request.id.encode(), "other") == "duplicate"
    # Then the first response stands
    assert state(client, keys, request.id)[b"rsp"] == first_body


def test_answers_merged_into_one_call_are_each_judged_alone_and_replay_safely(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given three requests taken by one receiver
    keys = KeySchema(key_prefix)
    endpoint = keys.endpoint(ENDPOINT)
    now_ms = int(time.time() * 1000)
    requests = [Request(endpoint=ENDPOINT, method="m", params=i) for i in range(3)]
    for request in requests:
        send(client, enqueue(keys, request, now_ms))
    token = uuid.uuid4().hex
    assert len(parse_take(send(client, take(keys, token, now_ms))).items) == 3
    first, second, third = (request.id for request in requests)

    def body(request_id: str) -> bytes:
        return b'{"id": "%s", "result": 1}' % request_id.encode()

    answers = [
        (first, token),  # its owner: stored
        (second, "another-receiver"),  # not its owner: fenced
        (first, token),  # the same answer again in the same call: a replay
        ("never-queued", token),  # nothing stored under the id
        (third, token),
    ]
    calls = [
        apply_response_call(endpoint, rid, owner, body(rid), TTL_MS, now_ms, 16384)
        for rid, owner in answers
    ]

    # When they go out as one merged call, and that call is sent again (a lost reply)
    (merged,), spread = merge_answers(calls)
    replies = spread([send(client, merged)])
    again = spread([send(client, merged)])

    # Then each answer got its own status, in order, and the replay changed nothing
    assert [parse_apply_response(reply) for reply in replies] == [
        "ok", "fenced", "replay", "unknown", "ok",
    ]  # fmt: skip
    assert [parse_apply_response(reply) for reply in again] == [
        "replay", "fenced", "replay", "unknown", "replay",
    ]  # fmt: skip
    assert state(client, keys, first)[b"rsp"] == body(first)
    assert state(client, keys, second)[b"st"] == b"taken"
    # ... and only the answered ones left the in-flight set
    running = {str(member, "utf-8") for member in client.zrange(endpoint.running, 0, -1)}  # type: ignore[arg-type]
    assert running == {second}


def test_enqueues_merged_into_one_call_are_each_judged_in_order_and_replay_safely(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given an endpoint limited to 3 queued requests that holds 1, and a receiver parked on it
    keys = KeySchema(key_prefix)
    endpoint = keys.endpoint(ENDPOINT)
    now_ms = int(time.time() * 1000)
    client.hset(endpoint.limits, "mp", 4)
    waiting = Request(endpoint=ENDPOINT, method="m")
    one = parse_enqueue(send(client, enqueue(keys, waiting, now_ms))).counter
    assert one is not None
    a, b, c = (Request(endpoint=ENDPOINT, method="m", params=i) for i in range(3))
    batch = [a, a, b, c, Request(endpoint=ENDPOINT, method="m", params=4)]

    # When five enqueues go as one merged call (the second a duplicate of the first), and that
    # call is sent again (a lost reply)
    (merged,), spread = merge_enqueues([enqueue(keys, r, now_ms) for r in batch])
    outcomes = [parse_enqueue_or_full(reply) for reply in spread([send(client, merged)])]
    again = [parse_enqueue_or_full(reply) for reply in spread([send(client, merged)])]

    # Then each was judged as if it came alone, in order: new ones numbered in turn, the
    # duplicate known, and the one past max_pending refused
    first = outcomes[0][1]
    assert isinstance(first, int) and first > one
    assert outcomes == [
        ("new", first),
        ("known", "queued"),
        ("new", first + 1),
        ("new", first + 2),
        ("full", 4),
    ]
    # And the replay enqueued nothing more
    assert again == [("known", "queued")] * 4 + [("full", 4)]
    assert queue_depth(client, endpoint) == 4
    assert queued_ids(client, endpoint) == [r.id.encode() for r in (waiting, a, b, c)]


def test_merged_enqueues_queue_as_the_same_enqueues_sent_one_by_one(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given the same requests of two producers at two priorities, interleaved
    keys = KeySchema(key_prefix)
    now_ms = int(time.time() * 1000)
    shape = [("a", 0), ("a", 0), ("b", 0), ("a", 1), ("a", 0), ("b", 1), ("b", 0), ("a", 0)]

    def requests(endpoint: str) -> list[Request]:
        return [
            Request(endpoint=endpoint, method="m", params=i, producer=producer, priority=priority)
            for i, (producer, priority) in enumerate(shape)
        ]

    def call(request: Request) -> Call:
        return enqueue_call(
            keys.endpoint(request.endpoint), request.id, request.model_dump_json().encode(),
            "sender-node", now_ms, TTL_MS, TTL_MS, TTL_MS, TTL_MS, TTL_MS, 2000, TTL_MS,
            priority=request.priority, producer=request.producer or "",
        )  # fmt: skip

    # When they are sent one by one to one endpoint, and as one merged call to another
    for request in requests("poll://alone"):
        send(client, call(request))
    (merged,), _ = merge_enqueues([call(request) for request in requests("poll://merged")])
    send(client, merged)

    # Then a receiver takes them from both in the same order
    def taken(endpoint: str) -> list[object]:
        out: list[object] = []
        for n in range(len(shape)):
            take = take_call(
                keys.endpoint(endpoint), f"tok-{n}", "receiver-node", 2000, 1, 100, TTL_MS,
                TTL_MS, 0, TTL_MS, TTL_MS, Redelivery.of(QueueSettings()),
            )  # fmt: skip
            (item,) = parse_take(send(client, take)).items
            out.append(Request.model_validate_json(item.body).params)
        return out

    alone = taken("poll://alone")
    assert alone == taken("poll://merged")
    assert sorted(int(str(i)) for i in alone) == list(range(len(shape)))


def parse_enqueue_or_full(reply: Reply) -> tuple[str, object]:
    """An enqueue reply as (what happened, its counter or state or depth)."""
    try:
        outcome = parse_enqueue(reply)
    except QueueFull:
        assert isinstance(reply, list)
        return ("full", reply[1])
    if outcome.known is not None:
        return ("known", outcome.known.state)
    return ("handed" if outcome.handed else "new", outcome.counter)


def test_merged_enqueues_go_to_parked_receivers_first_then_queue(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given two receivers parked on an empty endpoint
    keys = KeySchema(key_prefix)
    endpoint = keys.endpoint(ENDPOINT)
    now_ms = int(time.time() * 1000)
    for token in ("park-1", "park-2"):
        parked = take_call(
            endpoint, token, "receiver-node", 2000, 10, 100, TTL_MS, TTL_MS, 30_000, TTL_MS,
            TTL_MS, Redelivery.of(QueueSettings()),
        )  # fmt: skip
        assert parse_take(send(client, parked)).items == []

    # When three enqueues go as one merged call
    requests = [Request(endpoint=ENDPOINT, method="m", params=i) for i in range(3)]
    (merged,), spread = merge_enqueues([enqueue(keys, r, now_ms) for r in requests])
    outcomes = [parse_enqueue_or_full(reply) for reply in spread([send(client, merged)])]

    # Then the first two were handed to the parked receivers, in order, and the third queued
    first = outcomes[0][1]
    assert isinstance(first, int)
    assert outcomes == [("handed", first), ("handed", first + 1), ("new", first + 2)]
    assert queued_ids(client, endpoint) == [requests[2].id.encode()]


def test_withdraw_replay_is_still_this_calls_withdrawal(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given a queued request withdrawn once
    keys = KeySchema(key_prefix)
    now_ms = int(time.time() * 1000)
    request = Request(endpoint=ENDPOINT, method="m")
    send(client, enqueue(keys, request, now_ms))

    def withdraw(nonce: str) -> tuple[str, bool]:
        call = withdraw_call(
            keys.endpoint(ENDPOINT), request.id, "cancelled", TTL_MS, now_ms, nonce
        )
        snapshot, mine = parse_withdraw(send(client, call))
        return snapshot.state, mine

    assert withdraw("n1") == ("withdrawn", True)
    # When the same call is replayed, and another cancel comes
    assert withdraw("n1") == ("withdrawn", True)
    assert withdraw("n2") == ("withdrawn", False)
    # Then a take hands nothing out
    items = parse_take(send(client, take(keys, uuid.uuid4().hex, now_ms))).items
    assert items == []
    # And the withdrawn id left the list: its length is the queue's depth
    assert queue_depth(client, keys.endpoint(ENDPOINT)) == 0


def test_presence_replay_only_moves_the_node_forward(client: redis.Redis, key_prefix: str) -> None:
    # Given a node that reported serving the endpoint, and a node dead for two hours
    keys = KeySchema(key_prefix).endpoint(ENDPOINT)
    server_ms = int(client.time()[0]) * 1000
    client.zadd(keys.receivers, {"dead-node": server_ms - 2 * 3600 * 1000})
    call = presence_call(keys, "live-node", 3600 * 1000, TTL_MS)
    first = send(client, call)
    # When the report is replayed
    again = send(client, call)
    # Then the node is listed once, on Redis's clock, the dead one dropped, the set has a TTL
    assert isinstance(first, int) and isinstance(again, int) and again >= first >= server_ms
    members = client.zrange(keys.receivers, 0, -1, withscores=True)
    assert members == [(b"live-node", float(again))]
    assert 0 < client.pttl(keys.receivers) <= TTL_MS


def test_a_replayed_dead_letter_keeps_its_priority_and_producer(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given two dead letters: one whose details name a priority and producer, one with
    # details someone garbled (a priority that is no integer, JSON that does not parse)
    keys = KeySchema(key_prefix)
    ctx = Context(keys, QueueSettings(), node_id="n")
    endpoint = keys.endpoint(ENDPOINT)
    named = Request(endpoint=ENDPOINT, method="m", priority=6, producer="nightly")
    garbled = Request(endpoint=ENDPOINT, method="m", priority=6)
    body = named.model_dump_json().encode()
    send(client, dead_letter_call(ctx, ENDPOINT, named.id, body, "attempts_exhausted", 3,
                                  priority=6, producer="nightly"))  # fmt: skip
    send(client, dead_letter_call(ctx, ENDPOINT, garbled.id, b"{}", "undecodable", 1))
    client.hset(endpoint.dead[1], garbled.id, '{"priority": 1.5, "producer": 7')

    # When both are replayed
    for request in (named, garbled):
        assert drive(client, replay_dead_letter_flow(ctx, ENDPOINT, request.id)) == "replayed"

    # Then the first is queued at its priority, the other at 0; each hash says where
    assert level_ids(client, endpoint, 6) == [named.id]
    assert level_ids(client, endpoint, 0) == [garbled.id]
    assert state(client, keys, named.id)[b"pri"] == b"6"
    assert b"pri" not in state(client, keys, garbled.id)  # (absent: priority 0)
    # And a take hands out the higher priority first
    now_ms = int(time.time() * 1000)
    items = parse_take(send(client, take(keys, "t-1", now_ms))).items
    assert [i.request_id for i in items] == [named.id, garbled.id]
    assert queued_ids(client, endpoint) == []
    assert not client.exists(endpoint.levels)


def test_an_enqueue_replayed_after_another_node_withdrew_it_stays_withdrawn(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given a request enqueued once (its reply lost), then cancelled by another node, which is
    # told it was withdrawn and will never run
    keys = KeySchema(key_prefix)
    request = Request(endpoint=ENDPOINT, method="m")
    now_ms = int(time.time() * 1000)
    send(client, enqueue(keys, request, now_ms))
    cancelled = withdraw_call(keys.endpoint(ENDPOINT), request.id, "cancelled", TTL_MS, now_ms, "n")
    snapshot, mine = parse_withdraw(send(client, cancelled))
    assert (snapshot.state, mine) == ("withdrawn", True)

    # When the enqueue is sent again as it was (the sender's retry of the lost reply)
    again = parse_enqueue(send(client, enqueue(keys, request, now_ms)))

    # Then it is told the request was withdrawn, and nothing is queued: nothing runs it
    assert again.known is not None
    assert (again.known.state, again.known.reason) == ("withdrawn", "cancelled")
    assert queue_depth(client, keys.endpoint(ENDPOINT)) == 0
    assert parse_take(send(client, take(keys, uuid.uuid4().hex, now_ms))).items == []

    # And the same id sent afresh (a new enqueue: its own creation time) is a new request
    fresh = parse_enqueue(send(client, enqueue(keys, request, now_ms + 1)))
    assert fresh.known is None
    assert queued_ids(client, keys.endpoint(ENDPOINT)) == [request.id.encode()]


@pytest.mark.parametrize("count", [2, SHARED_HEAD_MIN])  # each shape of the queued form
def test_a_bulk_batch_replayed_after_a_node_withdrew_one_leaves_it_withdrawn(
    client: redis.Redis, key_prefix: str, count: int
) -> None:
    # Given a bulk batch written once (its reply lost), and one of its requests withdrawn since
    keys = KeySchema(key_prefix).endpoint(ENDPOINT)
    ids = [f"b{i}-{uuid.uuid4().hex[:6]}" for i in range(count)]
    now_ms = int(time.time() * 1000)
    call = enqueue_many_call(
        keys, f"nonce-{uuid.uuid4().hex}", [(i, b'{"m":"m"}') for i in ids], now_ms, 60_000,
        TTL_MS, TTL_MS,
    )  # fmt: skip
    assert parse_enqueue_many(send(client, call), count).accepted == count
    withdrawn = withdraw_call(keys, ids[0], "cancelled", TTL_MS, now_ms, "n")
    assert parse_withdraw(send(client, withdrawn))[1] is True

    # When the batch is sent again as it was
    again = parse_enqueue_many(send(client, call), count)

    # Then it counts as the same batch (nothing duplicated), and the withdrawn request stays
    # withdrawn: a take hands out only the others
    assert again.accepted == count and again.duplicate_ids == []
    assert client.hget(keys.request(ids[0]), "st") == b"withdrawn"
    items = parse_take(send(client, take(KeySchema(key_prefix), uuid.uuid4().hex, now_ms))).items
    assert sorted(item.request_id for item in items) == sorted(ids[1:])


def test_takes_on_their_way_after_a_rollback_each_find_the_stamp_low_and_take_nothing(
    client: redis.Redis, key_prefix: str
) -> None:
    # Given a receiver's take that wrote its stamp, a request queued then, and Redis gone back
    # to before that take (its stamp as it was: gone)
    keys = KeySchema(key_prefix)
    endpoint = keys.endpoint(ENDPOINT)

    def take_knowing(known: int) -> TakeReply:
        call = take_call(
            endpoint, uuid.uuid4().hex, "receiver-node", 2000, 1, 100, TTL_MS, TTL_MS, 0,
            TTL_MS, TTL_MS, Redelivery.of(QueueSettings()), known,
        )  # fmt: skip
        return parse_take(send(client, call))

    known = take_knowing(0).stamp
    assert known > 0
    send(client, enqueue(keys, Request(endpoint=ENDPOINT, method="m"), int(time.time() * 1000)))
    client.delete(endpoint.stamp("receiver-node"))
    # When two takes the receiver sent with that stamp reach Redis one after the other (two
    # serve slots)
    first, second = take_knowing(known), take_knowing(known)
    # Then each finds it gone and takes nothing: the first left it as it found it
    assert (first.went_back, first.items) == (0, [])
    assert (second.went_back, second.items) == (0, [])
    assert client.get(endpoint.stamp("receiver-node")) is None
    # And a take that sends none (the receiver forgot its stamp) writes one afresh, and takes
    fresh = take_knowing(0)
    assert fresh.went_back is None and len(fresh.items) == 1 and fresh.stamp > 0
